//! What this node has: the GPUs NVML describes, and the files a container needs to use one (the
//! device nodes and the driver's user-space libraries). Two roots place the files: the driver
//! root is where the driver is installed on the host (`/`, or e.g. `/run/nvidia/driver` where
//! NVIDIA's GPU operator runs the driver in a container); the host root is where this plugin
//! sees the host's `/` (`/host` in the DaemonSet). CDI specs name host paths (driver root +
//! path), because the container runtime applies them on the host; the container sees each file
//! at its path without the driver root.

use std::path::PathBuf;

use cuslice_node::nvml::Nvml;

use crate::resource_slice::Gpu;

/// The GPUs NVML lists now, and those it cannot describe (a GPU that fell off the bus), each
/// with the reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gpus {
    pub usable: Vec<Gpu>,
    pub unusable: Vec<(u32, String)>,
}

/// Asks NVML afresh (initialised and shut down again, so a reloaded driver is seen); each GPU is
/// published with the node's memory `oversubscription` (percent).
pub fn gpus(oversubscription: u32) -> Result<Gpus, String> {
    let nvml = Nvml::open()?;
    let driver_version = nvml.driver_version()?;
    let mut out = Gpus::default();
    for d in nvml.devices()? {
        match nvml.describe(d) {
            Ok(description) => out.usable.push(Gpu {
                description,
                driver_version: driver_version.clone(),
                oversubscription,
            }),
            Err(e) => out.unusable.push((d.0, e)),
        }
    }
    Ok(out)
}

/// Where the driver's files are: on the host, and as this plugin sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roots {
    pub host: PathBuf,
    pub driver: PathBuf,
}

impl Roots {
    /// The host's path of a driver file (`/dev/nvidia0`, `/usr/lib64/libcuda.so.1`).
    pub fn on_host(&self, path: &str) -> String {
        self.driver
            .join(path.trim_start_matches('/'))
            .to_string_lossy()
            .into_owned()
    }

    /// Where this plugin finds it.
    fn seen(&self, path: &str) -> PathBuf {
        self.host.join(self.on_host(path).trim_start_matches('/'))
    }
}

/// The device nodes a container needs for the GPU with minor number `minor`: /dev/nvidiaN and
/// the control and unified-memory nodes, those that exist. (container path, host path)
pub fn device_nodes(roots: &Roots, minor: Option<u32>) -> Vec<(String, String)> {
    let mut names = Vec::new();
    if let Some(m) = minor {
        names.push(format!("/dev/nvidia{m}"));
    }
    for n in ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] {
        names.push(n.to_owned());
    }
    names
        .into_iter()
        .filter(|n| roots.seen(n).exists())
        .map(|n| (n.clone(), roots.on_host(&n)))
        .collect()
}

/// The driver's user-space libraries a CUDA program loads, by soname.
pub const LIBRARIES: [&str; 4] = [
    "libcuda.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so.4",
];

/// Where distributions put them.
pub const LIBRARY_DIRS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib",
];

/// The driver libraries found: (host path, container path); the first directory holding a
/// soname wins.
pub fn libraries(roots: &Roots) -> Vec<(String, String)> {
    LIBRARIES
        .iter()
        .filter_map(|lib| {
            LIBRARY_DIRS
                .iter()
                .map(|d| format!("{d}/{lib}"))
                .find(|p| roots.seen(p).exists())
        })
        .map(|p| (roots.on_host(&p), p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_exists_under_the_root_and_names_host_paths() {
        let d = tempfile::tempdir().unwrap();
        // The plugin sees the host at d/host; the driver is at /drv on the host.
        let roots = Roots {
            host: d.path().join("host"),
            driver: "/drv".into(),
        };
        let r = &d.path().join("host/drv");
        std::fs::create_dir_all(r.join("dev")).unwrap();
        std::fs::create_dir_all(r.join("usr/lib64")).unwrap();
        for f in ["dev/nvidia1", "dev/nvidiactl", "usr/lib64/libcuda.so.1"] {
            std::fs::write(r.join(f), "").unwrap();
        }
        assert_eq!(
            device_nodes(&roots, Some(1)),
            vec![
                ("/dev/nvidia1".to_owned(), "/drv/dev/nvidia1".to_owned()),
                ("/dev/nvidiactl".to_owned(), "/drv/dev/nvidiactl".to_owned())
            ]
        );
        assert_eq!(device_nodes(&roots, Some(0)).len(), 1);
        assert_eq!(
            libraries(&roots),
            vec![(
                "/drv/usr/lib64/libcuda.so.1".to_owned(),
                "/usr/lib64/libcuda.so.1".to_owned()
            )]
        );
    }
}
