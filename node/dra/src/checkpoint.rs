//! The claims this plugin has prepared, kept in a file so that they survive a restart of the
//! plugin: the kubelet may call NodeUnprepareResources (or NodePrepareResources again) for a
//! claim prepared by an earlier run. Written atomically (a temporary file in the same directory,
//! synced, renamed over the old one, the directory synced), so a crash leaves the old file or
//! the new one, never a mix. A file that cannot be read is never overwritten: the plugin stops
//! and says which file and why.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::claim::{Allotted, ClaimRef};

pub const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prepared {
    pub claim: ClaimRef,
    pub devices: Vec<PreparedDevice>,
    /// The claim's entries in the container index.
    #[serde(default)]
    pub index_files: Vec<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreparedDevice {
    pub allotted: Allotted,
    pub pool: String,
    /// Fully qualified CDI device ids the kubelet was given.
    pub cdi_ids: Vec<String>,
    /// The CDI spec file, and what it holds (written again if it went missing).
    pub spec_file: PathBuf,
    pub spec: cuslice_hook::cdi::Spec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub version: u32,
    /// By claim uid.
    pub claims: BTreeMap<String, Prepared>,
}

/// Reads the checkpoint; a missing file is an empty one.
pub fn load(path: &Path) -> Result<Checkpoint, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Checkpoint {
                version: VERSION,
                ..Default::default()
            });
        }
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let c: Checkpoint = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}: not a checkpoint this plugin can read ({e}); it lists the claims prepared on this \
             node: move it aside to start afresh (claims prepared before are then prepared again \
             when the kubelet asks)",
            path.display()
        )
    })?;
    if c.version != VERSION {
        return Err(format!(
            "{}: checkpoint version {} is not {VERSION}, the one this plugin writes; move it aside \
             to start afresh",
            path.display(),
            c.version
        ));
    }
    Ok(c)
}

/// Writes the checkpoint atomically (see `cuslice_hook::cdi::write_atomic`), readable by root only.
pub fn save(path: &Path, c: &Checkpoint) -> Result<(), String> {
    let mut text = serde_json::to_string_pretty(c).expect("a checkpoint is JSON");
    text.push('\n');
    cuslice_hook::cdi::write_atomic(path, text.as_bytes(), 0o600)
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        let mut c = Checkpoint {
            version: VERSION,
            ..Default::default()
        };
        c.claims.insert(
            "u1".into(),
            Prepared {
                claim: ClaimRef {
                    namespace: "ns".into(),
                    name: "c".into(),
                    uid: "u1".into(),
                },
                devices: vec![PreparedDevice {
                    allotted: Allotted {
                        request: "gpu".into(),
                        device: "gpu-0".into(),
                        uuid: "GPU-0".into(),
                        memory: 1 << 30,
                        core_request: 30,
                        core_limit: 30,
                        priority: None,
                    },
                    pool: "node-a".into(),
                    cdi_ids: vec!["gpu.cuslice.io/claim=u1-gpu-0".into()],
                    spec_file: "/var/run/cdi/gpu.cuslice.io-u1.json".into(),
                    spec: cuslice_hook::cdi::claim_spec(&[], "/h", "/l"),
                }],
                index_files: vec!["/idx/default_p_main_u1.json".into()],
            },
        );
        c
    }

    #[test]
    fn round_trips_and_replaces_atomically() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("checkpoint.json");
        assert_eq!(load(&p).unwrap().claims.len(), 0);
        save(&p, &sample()).unwrap();
        assert_eq!(load(&p).unwrap(), sample());
        let empty = Checkpoint {
            version: VERSION,
            ..Default::default()
        };
        save(&p, &empty).unwrap();
        assert_eq!(load(&p).unwrap().claims.len(), 0);
        // Nothing but the file itself is left in the directory.
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("checkpoint.json")]);
    }

    #[test]
    fn a_corrupt_file_is_named_and_kept() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("checkpoint.json");
        std::fs::write(&p, "{\"version\": 1, \"claims\": {\"u1\": ").unwrap();
        let e = load(&p).unwrap_err();
        assert!(e.starts_with(&p.display().to_string()), "{e}");
        assert!(e.contains("move it aside"), "{e}");
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "{\"version\": 1, \"claims\": {\"u1\": "
        );
        std::fs::write(&p, "{\"version\": 9, \"claims\": {}}").unwrap();
        assert!(load(&p).unwrap_err().contains("version 9"));
    }
}
