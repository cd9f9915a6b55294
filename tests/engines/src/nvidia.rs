//! NVIDIA's container toolkit in CDI mode, with cuslice registered as an operator registers it:
//! a spec shaped like `nvidia-ctk cdi generate`'s output (kind `nvidia.com/gpu`, a device per
//! GPU UUID with its `/dev/nvidiaN` node; for every container the control nodes, the driver's
//! libraries mounted under their versioned names, and `nvidia-cdi-hook` createContainer hooks
//! that make the symlinks and run ldconfig; `NVIDIA_VISIBLE_DEVICES=void`), written as YAML
//! where the engine reads specs. The GPU is simgpu: its libraries are the "driver's"
//! (`libcuda.so.580.159.04`, `libnvidia-ml.so.580.159.04`: the version the hardware runs used),
//! its device nodes stand-ins (character devices 1:3 made with mknod), and `nvidia-cdi-hook` the
//! stand-in in tests/tools, which does what NVIDIA's does for these two commands. No program
//! finds `libcuda.so.1` unless that hook's ldconfig made the link.
//!
//! Podman applies the spec itself (`--device nvidia.com/gpu=GPU-...`) and runs cuslice's hook
//! from hooks.d; containerd 1.6, which has no CDI, gets the device from a `cdi.k8s.io/*`
//! annotation, which cuslice-runtime applies before adding its hook.

use std::path::{Path, PathBuf};

use cuslice_test_harness::{GIB, MIB, Sim, bin_dir};
use serde_json::Value;

use super::cdi::CdiEngine;
use super::{Spec, held_by, lines_until, name, slice_dir, wait_for};

/// The driver version the libraries are named for.
pub const DRIVER: &str = "580.159.04";
const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";

/// The spec file, removed when dropped, and its stand-in device nodes.
pub struct NvidiaSpec {
    file: PathBuf,
    /// The device's CDI id, `nvidia.com/gpu=GPU-<uuid>`.
    pub id: String,
    /// Where the stand-in hook logs its calls.
    pub hook_log: PathBuf,
    _nodes: tempfile::TempDir,
}

impl NvidiaSpec {
    /// The spec for simulated GPU 0 of `sim`, in `dir`.
    pub fn new(dir: &Path, sim: &Sim) -> NvidiaSpec {
        let uuid = sim.device(0)["uuid"].as_str().unwrap().to_string();
        let nodes = tempfile::tempdir().unwrap();
        let node = |n: &str| {
            let host = nodes.path().join(n);
            nix::sys::stat::mknod(
                &host,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                nix::sys::stat::makedev(1, 3),
            )
            .unwrap_or_else(|e| panic!("mknod {}: {e}", host.display()));
            host.display().to_string()
        };
        let hook = bin_dir().join("../../tests/tools/nvidia-cdi-hook");
        let hook = hook.canonicalize().unwrap().display().to_string();
        let hook_log = nodes.path().join("hook.log");
        let lib = |host: &str, name: &str| {
            format!(
                "  - hostPath: {}\n    containerPath: {LIB_DIR}/{name}.{DRIVER}\n    \
                 options: [ro, nosuid, nodev, bind]\n",
                bin_dir().join(host).display()
            )
        };
        let hook_entry = |args: &str| {
            format!(
                "  - hookName: createContainer\n    path: {hook}\n    args: [nvidia-cdi-hook, \
                 {args}]\n    env: [NVIDIA_CDI_HOOK_LOG={}]\n",
                hook_log.display()
            )
        };
        let text = format!(
            "---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n\
             - name: {uuid}\n  containerEdits:\n    deviceNodes:\n    \
             - path: /dev/nvidia0\n      hostPath: {gpu}\n\
             containerEdits:\n  env:\n  - NVIDIA_VISIBLE_DEVICES=void\n  deviceNodes:\n\
             {control}  hooks:\n{symlinks}{ldcache}  mounts:\n{cuda}{nvml}",
            gpu = node("nvidia0"),
            control = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
                .iter()
                .map(|n| format!("  - path: /dev/{n}\n    hostPath: {}\n", node(n)))
                .collect::<String>(),
            symlinks = hook_entry(&format!(
                "create-symlinks, --link, 'libcuda.so.1::{LIB_DIR}/libcuda.so'"
            )),
            ldcache = hook_entry(&format!("update-ldcache, --folder, {LIB_DIR}")),
            cuda = lib("libsimgpu_cuda.so", "libcuda.so"),
            nvml = lib("libsimgpu_nvml.so", "libnvidia-ml.so"),
        );
        std::fs::create_dir_all(dir).unwrap();
        let file = dir.join(format!("nvidia-{}.yaml", name("spec")));
        std::fs::write(&file, text).unwrap();
        NvidiaSpec {
            file,
            id: format!("nvidia.com/gpu={uuid}"),
            hook_log,
            _nodes: nodes,
        }
    }
}

impl Drop for NvidiaSpec {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

/// What the container's script prints before its workload: the device node and the library
/// links NVIDIA's hooks made.
const LOOK: &str = "ls -l /dev/nvidia0 /usr/lib/x86_64-linux-gnu/libcuda.so.1 \
                    /usr/lib/x86_64-linux-gnu/libcuda.so 2>&1; \
                    cat /etc/ld.so.preload 2>&1; ";

/// With the toolkit's spec for GPU 0:
/// - a container with `CUSLICE_MEMORY_LIMIT=1GiB` sees a 1 GiB device and holds no more by the
///   simulator's count, through the `libcuda.so.1` link NVIDIA's hook made; its config.json
///   holds NVIDIA's two hooks and cuslice's, once each;
/// - a container without cuslice settings gets the GPU untouched: the whole 8 GiB, no
///   `/etc/ld.so.preload`, no slice state, NVIDIA's hooks still run;
/// - `CUSLICE_MEMORY_LIMIT_1` on this one-GPU container is refused at start, naming the device
///   the container has.
pub fn toolkit_spec_with_cuslice(engine: &dyn CdiEngine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let spec = NvidiaSpec::new(&engine.spec_dir(), &sim);
    let ids = [spec.id.clone()];

    let n = name("nvidia-capped");
    let script = format!("{LOOK}exec cuda-workload fill --family mem --chunk 64MiB --hold 60");
    let mut c = engine.spawn_registered(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &["sh", "-c", &script],
            read_only: false,
        },
        &ids,
    );
    let (said, start) = lines_until(c.as_mut(), "start");
    assert_eq!(
        start["total"], GIB,
        "the device as the container sees it: {start} {said:?}"
    );
    let linked = format!("libcuda.so.1 -> libcuda.so.{DRIVER}");
    for want in ["/dev/nvidia0", &linked, "libcuda.so -> libcuda.so.1"] {
        assert!(
            said.iter().any(|l| l.contains(want)),
            "no {want:?} in the container: {said:?}"
        );
    }
    wait_for(c.as_mut(), "holding");
    let (used, peak) = held_by(&sim, c.host_pid());
    assert!(
        peak <= GIB && used >= GIB - 128 * MIB,
        "cap 1 GiB: held {used}, peak {peak}"
    );
    let config = engine.bundle_config(c.as_ref());
    let hooks = |config: &Value, pick: &dyn Fn(&Value) -> bool| -> usize {
        config["hooks"]
            .as_object()
            .into_iter()
            .flatten()
            .flat_map(|(_, list)| list.as_array().into_iter().flatten())
            .filter(|h| pick(h))
            .count()
    };
    let nvidia = |h: &Value| h["args"][0] == "nvidia-cdi-hook";
    assert_eq!(hooks(&config, &nvidia), 2, "{}", config["hooks"]);
    let cuslice = |h: &Value| cuslice_cdi::is_cuslice_hook(h);
    assert!(hooks(&config, &cuslice) >= 1, "{}", config["hooks"]);
    let id = c.id();
    c.remove();
    assert!(!slice_dir(&id).exists(), "state of {id} left");

    let n = name("nvidia-plain");
    let script = format!("{LOOK}exec cuda-workload info");
    let mut c = engine.spawn_registered(
        &sim,
        &Spec {
            name: &n,
            env: &[],
            cmd: &["sh", "-c", &script],
            read_only: false,
        },
        &ids,
    );
    let (said, info) = lines_until(c.as_mut(), "info");
    assert_eq!(
        info["mem_get_info"]["total"],
        8 * GIB,
        "the whole device: {info}"
    );
    assert!(
        said.iter().any(|l| l.contains(&linked)),
        "NVIDIA's hooks did not run: {said:?}"
    );
    assert!(
        said.iter()
            .any(|l| l.contains("/etc/ld.so.preload") && l.contains("No such file")),
        "a preload file in an untouched container: {said:?}"
    );
    let id = c.id();
    assert!(
        !slice_dir(&id).exists(),
        "an untouched container has a slice"
    );
    c.remove();
    let calls = std::fs::read_to_string(&spec.hook_log).unwrap_or_default();
    assert_eq!(
        calls
            .lines()
            .filter(|l| l.starts_with("update-ldcache"))
            .count(),
        2,
        "NVIDIA's hook, once per container: {calls}"
    );

    let n = name("nvidia-index");
    let out = engine.run_registered(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT_1=1GiB"],
            cmd: &["echo", "STARTED"],
            read_only: false,
        },
        &ids,
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .replace("\\\"", "\"");
    assert!(!out.status.success() && !all.contains("STARTED"), "{all}");
    let says = "CUSLICE_MEMORY_LIMIT_1=\"1GiB\" names device 1, but the container has 1 CUDA \
                device (device 0), so it would apply to none; write e.g. \
                CUSLICE_MEMORY_LIMIT_0=1GiB (device 0) or CUSLICE_MEMORY_LIMIT=1GiB";
    assert!(all.contains(says), "{all}");
}
