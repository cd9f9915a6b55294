//! The DRA plugin's container index: the format both sides share. A kubelet since 1.31 passes a
//! DRA claim's devices to the runtime only in the CRI's `CDIDevices` field, which containerd 1.6
//! ignores; so the DRA plugin (cuslice-dra, the writer) writes an [`IndexEntry`] per container
//! that uses a claim it prepares, and cuslice-runtime and cuslice-hook (the readers) find a
//! container's entries from its CRI annotations ([`indexed_devices`], [`indexed_claims`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::claim::vendor;
use crate::id::parse_qualified;

/// The DRA plugin's own directory by default (its socket and checkpoint).
pub const DEFAULT_PLUGIN_DIR: &str = concat!("/var/lib/kubelet/plugins/", vendor!());
/// Where the DRA plugin keeps its container index by default.
pub const DEFAULT_CONTAINER_INDEX: &str =
    concat!("/var/lib/kubelet/plugins/", vendor!(), "/containers");

/// The annotations containerd's CRI puts on every container of a pod (containerd 1.6 and later).
pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
pub const CRI_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
pub const CRI_POD: &str = "io.kubernetes.cri.sandbox-name";
pub const CRI_POD_UID: &str = "io.kubernetes.cri.sandbox-uid";
pub const CRI_CONTAINER: &str = "io.kubernetes.cri.container-name";

/// One entry of the container index: the CDI devices of one prepared claim for one container of
/// one pod. A kubelet since 1.31 passes a DRA claim's devices to the runtime only in the CRI's
/// `CDIDevices` field, which containerd 1.6 ignores; so the DRA plugin writes, for each container
/// that uses a claim it prepares, a file `NAMESPACE_POD_CONTAINER_CLAIMUID.json` (Kubernetes
/// names hold no `_`) that cuslice-runtime finds from the CRI annotations of the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IndexEntry {
    /// The pod's uid: an entry of another pod of the same name (deleted and made again) is not
    /// this container's.
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    pub cdi_devices: Vec<String>,
    /// The claim's name (its namespace is the pod's), which the hook records for the node
    /// tools' `claim` label; absent in entries of plugins that did not write it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
}

fn index_part(what: &str, s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && s != "."
        && s != "..";
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} {s:?} is not a Kubernetes name (lower-case letters, digits, '-', '.')"
        ))
    }
}

/// The index file of (namespace, pod, container, claim uid).
pub fn index_file(
    namespace: &str,
    pod: &str,
    container: &str,
    claim_uid: &str,
) -> Result<String, String> {
    index_part("namespace", namespace)?;
    index_part("pod", pod)?;
    index_part("container", container)?;
    index_part("claim uid", claim_uid)?;
    Ok(format!("{namespace}_{pod}_{container}_{claim_uid}.json"))
}

/// The CDI device ids the container index gives the container a config.json describes, from its
/// CRI annotations: (where it came from, id). Nothing for a config without them, for a pod's
/// sandbox, or where `dir` does not exist. An entry of another pod uid is skipped (a stale entry
/// of a pod of the same name); an entry that cannot be read is an error naming the file.
pub fn indexed_devices(dir: &Path, config: &Value) -> Result<Vec<(String, String)>, String> {
    let a = |k: &str| {
        config
            .get("annotations")
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
    };
    if a(CRI_CONTAINER_TYPE) == Some("sandbox") {
        return Ok(Vec::new());
    }
    let (Some(ns), Some(pod), Some(container)) = (a(CRI_NAMESPACE), a(CRI_POD), a(CRI_CONTAINER))
    else {
        return Ok(Vec::new());
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(format!(
                "the DRA plugin's container index {}: {e}",
                dir.display()
            ));
        }
    };
    let prefix = format!("{ns}_{pod}_{container}_");
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".json"))
        })
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = match std::fs::read_to_string(&f) {
            Ok(t) => t,
            // Unprepared meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", f.display())),
        };
        let entry: IndexEntry = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{}: not an entry of the DRA plugin's container index ({e})",
                f.display()
            )
        })?;
        if a(CRI_POD_UID).is_some_and(|uid| !entry.pod_uid.is_empty() && entry.pod_uid != uid) {
            continue;
        }
        let source = format!("container {ns}/{pod}/{container} in {}", f.display());
        for id in entry.cdi_devices {
            parse_qualified(&id).map_err(|e| format!("{source}: {e}"))?;
            out.push((source.clone(), id));
        }
    }
    Ok(out)
}

/// The names of the claims the container index gives container `container` of pod
/// `namespace`/`pod` (uid `pod_uid` where known), sorted: what the hook records for the node
/// tools. Only for labels, so it never fails: a missing index, an entry of another pod uid, an
/// entry that cannot be read or names no claim are all left out.
pub fn indexed_claims(
    dir: &Path,
    namespace: &str,
    pod: &str,
    container: &str,
    pod_uid: Option<&str>,
) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let prefix = format!("{namespace}_{pod}_{container}_");
    let mut claims: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".json"))
        })
        .filter_map(|e| {
            // An entry is a few hundred bytes; a bigger file is not one.
            let text = std::fs::read(e.path())
                .ok()
                .filter(|t| t.len() <= 64 << 10)?;
            let entry: IndexEntry = serde_json::from_slice(&text).ok()?;
            if pod_uid.is_some_and(|uid| !entry.pod_uid.is_empty() && entry.pod_uid != uid) {
                return None;
            }
            entry.claim
        })
        .collect();
    claims.sort();
    claims.dedup();
    claims
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn container_index_gives_a_pods_container_its_devices() {
        let d = tempfile::tempdir().unwrap();
        let write = |name: &str, uid: &str, ids: &[&str]| {
            let e = IndexEntry {
                pod_uid: uid.into(),
                cdi_devices: ids.iter().map(|s| s.to_string()).collect(),
                claim: None,
            };
            std::fs::write(d.path().join(name), serde_json::to_string(&e).unwrap()).unwrap();
        };
        let f = index_file("default", "inference", "main", "u1").unwrap();
        assert_eq!(f, "default_inference_main_u1.json");
        write(&f, "p1", &["gpu.cuslice.io/claim=u1-gpu-0"]);
        write(
            &index_file("default", "inference", "sidecar", "u1").unwrap(),
            "p1",
            &["gpu.cuslice.io/claim=u1-gpu-9"],
        );
        write(
            &index_file("default", "inference", "main", "u0").unwrap(),
            "p0",
            &["gpu.cuslice.io/claim=u0-gpu-0"],
        );
        let config = |kind: &str, uid: Option<&str>| {
            let mut a = json!({CRI_CONTAINER_TYPE: kind, CRI_NAMESPACE: "default",
                               CRI_POD: "inference", CRI_CONTAINER: "main"});
            if let Some(u) = uid {
                a[CRI_POD_UID] = json!(u);
            }
            json!({ "annotations": a })
        };
        let ids = |v: Vec<(String, String)>| v.into_iter().map(|(_, id)| id).collect::<Vec<_>>();
        // The pod of uid p1: its main container's entry, not the sidecar's, not p0's.
        assert_eq!(
            ids(indexed_devices(d.path(), &config("container", Some("p1"))).unwrap()),
            ["gpu.cuslice.io/claim=u1-gpu-0"]
        );
        // Without a uid annotation: every entry of that name.
        assert_eq!(
            indexed_devices(d.path(), &config("container", None))
                .unwrap()
                .len(),
            2
        );
        assert!(
            indexed_devices(d.path(), &config("sandbox", Some("p1")))
                .unwrap()
                .is_empty()
        );
        assert!(indexed_devices(d.path(), &json!({})).unwrap().is_empty());
        assert!(
            indexed_devices(&d.path().join("none"), &config("container", None))
                .unwrap()
                .is_empty()
        );
        std::fs::write(d.path().join("default_inference_main_u2.json"), "{").unwrap();
        let e = indexed_devices(d.path(), &config("container", Some("p1"))).unwrap_err();
        assert!(
            e.contains("default_inference_main_u2.json: not an entry"),
            "{e}"
        );
        for bad in ["Default", "a_b", "", "..", "a/b"] {
            assert!(index_file(bad, "p", "c", "u").is_err(), "{bad}");
        }
    }
}
