//! The CDI spec of a prepared claim: one device, `gpu.cuslice.io/claim=<claim uid>-<device>`.

use serde_json::{Value, json};

use crate::claim::{Allotted, ClaimRef, settings};
use crate::discover::{self, Roots};
use crate::slice::{DRIVER, Gpu};

pub const KIND: &str = "gpu.cuslice.io/claim";

/// The spec file of a claim, in the CDI directory.
pub fn file_name(claim: &ClaimRef) -> String {
    format!("{DRIVER}-{}.json", claim.uid)
}

pub fn device_name(claim: &ClaimRef, a: &Allotted) -> String {
    format!("{}-{}", claim.uid, a.device)
}

/// The fully qualified CDI id the kubelet passes on.
pub fn id(claim: &ClaimRef, a: &Allotted) -> String {
    format!("{KIND}={}", device_name(claim, a))
}

/// The spec: the GPU's device nodes and driver libraries, the slice's settings, the hooks.
pub fn spec(
    claim: &ClaimRef,
    a: &Allotted,
    gpu: &Gpu,
    roots: &Roots,
    hook: &str,
    library: &str,
) -> Value {
    let env: Vec<String> = settings(a)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let nodes: Vec<Value> = discover::device_nodes(roots, gpu.description.minor)
        .into_iter()
        .map(|(path, host)| json!({"path": path, "hostPath": host}))
        .collect();
    let mounts: Vec<Value> = discover::libraries(roots)
        .into_iter()
        .map(|(host, path)| {
            json!({"hostPath": host, "containerPath": path, "options": ["ro", "nosuid", "nodev", "bind"]})
        })
        .collect();
    let hooks: Vec<Value> = ["createRuntime", "poststop"]
        .iter()
        .map(|s| json!({"hookName": s, "path": hook, "args": ["cuslice-hook", s, "--library", library]}))
        .collect();
    json!({
        "cdiVersion": "0.5.0",
        "kind": KIND,
        "devices": [{
            "name": device_name(claim, a),
            "containerEdits": {"env": env, "deviceNodes": nodes, "mounts": mounts, "hooks": hooks},
        }],
    })
}
