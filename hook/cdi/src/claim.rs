//! The CDI shape of a prepared DRA claim's spec: its kind, its file and device names, and
//! [`claim_spec`], which the DRA plugin (cuslice-dra) builds its specs with and the hook's tests
//! build theirs with. What goes into a claim's devices (which GPU, which settings) is the DRA
//! plugin's.

use std::collections::BTreeMap;

use crate::hooks::stage_hooks;
use crate::spec::{CDI_VERSION, ContainerEdits, Device, DeviceNode, Mount, Spec};

/// The defining literal of the claim specs' vendor, for `concat!`.
macro_rules! vendor {
    () => {
        "gpu.cuslice.io"
    };
}
pub(crate) use vendor;

/// The vendor of the claim specs. By the DRA convention it is the DRA driver's name too
/// (cuslice-dra's `DRIVER`): defined here because the hook side needs it (the container
/// index's default path), and the hook does not depend on the DRA plugin.
pub const CLAIM_VENDOR: &str = vendor!();
/// The kind of the per-claim specs the DRA plugin writes.
pub const CLAIM_KIND: &str = concat!(vendor!(), "/claim");

/// The spec file of a prepared claim: `gpu.cuslice.io-<claim uid>.json`.
pub fn claim_spec_file(claim_uid: &str) -> String {
    format!("{CLAIM_VENDOR}-{claim_uid}.json")
}

/// The CDI device name of one device of a prepared claim: `<claim uid>-<device name>`.
pub fn claim_device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// One device of a prepared claim, as the DRA plugin sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimDevice {
    /// The CDI device name ([`claim_device_name`]).
    pub name: String,
    /// (name, value), e.g. `("CUSLICE_MEMORY_LIMIT", "8589934592")`.
    pub env: Vec<(String, String)>,
    /// (container path, host path), e.g. `("/dev/nvidia0", "/dev/nvidia0")`.
    pub device_nodes: Vec<(String, String)>,
    /// (host path, container path) of the driver's user-space libraries, mounted read-only.
    pub library_mounts: Vec<(String, String)>,
}

/// The spec of one prepared claim: kind [`CLAIM_KIND`], one CDI device per claim device with
/// its env, device nodes and library mounts, and cuslice-hook (`hook`, `--library library`,
/// the stages `cuslice install --engine cdi` writes) once, as spec-level edits: every
/// container that gets any of the claim's devices runs the hook once per stage.
pub fn claim_spec(devices: &[ClaimDevice], hook: &str, library: &str) -> Spec {
    Spec {
        cdi_version: CDI_VERSION.to_owned(),
        kind: CLAIM_KIND.to_owned(),
        annotations: BTreeMap::new(),
        devices: devices
            .iter()
            .map(|d| Device {
                name: d.name.clone(),
                annotations: BTreeMap::new(),
                container_edits: ContainerEdits {
                    env: d.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                    device_nodes: d
                        .device_nodes
                        .iter()
                        .map(|(path, host)| DeviceNode {
                            path: path.clone(),
                            host_path: Some(host.clone()),
                            ..DeviceNode::default()
                        })
                        .collect(),
                    mounts: d
                        .library_mounts
                        .iter()
                        .map(|(host, path)| Mount {
                            host_path: host.clone(),
                            container_path: path.clone(),
                            kind: Some("bind".into()),
                            options: ["ro", "nosuid", "nodev", "bind"].map(String::from).to_vec(),
                        })
                        .collect(),
                    ..ContainerEdits::default()
                },
            })
            .collect(),
        container_edits: ContainerEdits {
            hooks: stage_hooks(hook, library),
            ..ContainerEdits::default()
        },
    }
}

/// A claim spec with one device, for tests.
#[cfg(test)]
pub(crate) fn example() -> Spec {
    claim_spec(
        &[ClaimDevice {
            name: "5d1f-gpu-0".into(),
            env: vec![
                ("CUSLICE_MEMORY_LIMIT".into(), "1073741824".into()),
                ("CUSLICE_CORE_REQUEST".into(), "30".into()),
                ("CUSLICE_CORE_LIMIT".into(), "60".into()),
            ],
            device_nodes: vec![
                ("/dev/nvidia0".into(), "/dev/nvidia0".into()),
                ("/dev/nvidiactl".into(), "/dev/nvidiactl".into()),
            ],
            library_mounts: vec![(
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
            )],
        }],
        "/usr/local/bin/cuslice-hook",
        "/usr/local/lib/cuslice/libcuslice.so",
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::*;
    use crate::spec::parse_spec;

    fn claim() -> Spec {
        example()
    }

    #[test]
    fn the_claim_spec() {
        let spec = claim();
        spec.validate().unwrap();
        let v: Value = serde_json::from_str(&spec.to_json()).unwrap();
        assert_eq!(
            v,
            json!({
                "cdiVersion": "0.5.0",
                "kind": "gpu.cuslice.io/claim",
                "devices": [{
                    "name": "5d1f-gpu-0",
                    "containerEdits": {
                        "env": [
                            "CUSLICE_MEMORY_LIMIT=1073741824",
                            "CUSLICE_CORE_REQUEST=30",
                            "CUSLICE_CORE_LIMIT=60"
                        ],
                        "deviceNodes": [
                            {"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"},
                            {"path": "/dev/nvidiactl", "hostPath": "/dev/nvidiactl"}
                        ],
                        "mounts": [{
                            "hostPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                            "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                            "type": "bind",
                            "options": ["ro", "nosuid", "nodev", "bind"]
                        }]
                    }
                }],
                "containerEdits": {
                    "hooks": [
                        {
                            "hookName": "createRuntime",
                            "path": "/usr/local/bin/cuslice-hook",
                            "args": ["cuslice-hook", "createRuntime", "--library",
                                     "/usr/local/lib/cuslice/libcuslice.so"]
                        },
                        {
                            "hookName": "poststop",
                            "path": "/usr/local/bin/cuslice-hook",
                            "args": ["cuslice-hook", "poststop", "--library",
                                     "/usr/local/lib/cuslice/libcuslice.so"]
                        }
                    ]
                }
            })
        );
        assert_eq!(
            spec.qualified("5d1f-gpu-0"),
            "gpu.cuslice.io/claim=5d1f-gpu-0"
        );
        assert_eq!(claim_spec_file("5d1f"), "gpu.cuslice.io-5d1f.json");
        assert_eq!(claim_device_name("5d1f", "gpu-0"), "5d1f-gpu-0");
        // It reads back as it was written.
        assert_eq!(
            parse_spec(Path::new("x.json"), &spec.to_json()).unwrap(),
            spec
        );
    }
}
