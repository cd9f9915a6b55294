//! The claims this plugin has prepared, kept in a file so that they survive a restart of the
//! plugin: the kubelet may call NodeUnprepareResources (or NodePrepareResources again) for a
//! claim prepared by an earlier run. Written atomically (a temporary file in the same directory,
//! synced, renamed over the old one, the directory synced), so a crash leaves the old file or
//! the new one, never a mix. A file that cannot be read is never overwritten: the plugin stops
//! and says which file and why.
//!
//! **Versions.** The file carries `version`. Version 1 is `claims` by uid, each with its devices
//! (allotment, pool, CDI ids, spec file and spec) and its container index entries (a file
//! written before the container index lacks them: none). A file with no `version` (the same
//! shape, unversioned) is read as version 1 and written as version 1 the next time the
//! checkpoint is saved. A version this build does not know (one a newer plugin wrote) is
//! refused, naming the file and the versions this build reads: the plugin does not run on a
//! checkpoint it would misread or, on its next write, lose what a newer format added.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cuslice_state::fsio::Durability;
use serde::{Deserialize, Serialize};

use crate::claim::{Allotted, ClaimRef};

/// The version this build writes.
pub const VERSION: u32 = 1;

/// The versions this build reads (a file with no `version` too, as version 1).
pub const READS: [u32; 1] = [1];

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
    pub spec: cuslice_cdi::Spec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// Absent in an unversioned file: read as version 1.
    #[serde(default = "unversioned")]
    pub version: u32,
    /// By claim uid.
    pub claims: BTreeMap<String, Prepared>,
}

/// The version of a file with no `version`: the same shape as version 1.
fn unversioned() -> u32 {
    1
}

/// Only the version, read before the rest so that a newer format is refused as such, not as
/// unreadable.
#[derive(Deserialize)]
struct Head {
    #[serde(default = "unversioned")]
    version: u32,
}

/// Reads the checkpoint; a missing file is an empty one. What is read is at [`VERSION`], ready
/// to be written.
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
    let unreadable = |e: serde_json::Error| {
        format!(
            "{}: not a checkpoint this plugin can read ({e}); it lists the claims prepared on this \
             node: move it aside to start afresh (claims prepared before are then prepared again \
             when the kubelet asks)",
            path.display()
        )
    };
    let head: Head = serde_json::from_str(&text).map_err(unreadable)?;
    if !READS.contains(&head.version) {
        let reads: Vec<String> = READS.iter().map(u32::to_string).collect();
        return Err(format!(
            "{}: checkpoint version {}, which this plugin cannot read (it reads version {}, and \
             an unversioned file); a newer plugin wrote it: run that plugin again, or move the \
             file aside to start afresh",
            path.display(),
            head.version,
            reads.join(", ")
        ));
    }
    let mut c: Checkpoint = serde_json::from_str(&text).map_err(unreadable)?;
    // Version 1 and an unversioned file have the same shape: nothing to migrate but the number.
    c.version = VERSION;
    Ok(c)
}

/// Writes the checkpoint atomically and durably (`cuslice_state::fsio`), readable by root only.
pub fn save(path: &Path, c: &Checkpoint) -> Result<(), String> {
    let mut text = serde_json::to_string_pretty(c).expect("a checkpoint is JSON");
    text.push('\n');
    cuslice_state::fsio::write_atomic(path, text.as_bytes(), 0o600, Durability::Full)
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
                        memory_wait: None,
                        memory_spill: None,
                        memory_freeze_idle: None,
                    },
                    pool: "node-a".into(),
                    cdi_ids: vec!["gpu.cuslice.io/claim=u1-gpu-0".into()],
                    spec_file: "/var/run/cdi/gpu.cuslice.io-u1.json".into(),
                    spec: cuslice_cdi::claim_spec(&[], "/h", "/l"),
                }],
                index_files: vec!["/idx/default_p_main_u1.json".into()],
            },
        );
        c
    }

    #[test]
    fn the_version_cuslice_version_names_is_the_one_written() {
        assert_eq!(cuslice_state::formats::DRA_CHECKPOINT, VERSION);
    }

    /// Across an upgrade and back (docs/upgrades.md): the previous release wrote no
    /// `memory_wait` or `memory_spill`; its file reads here, and a claim without them is written
    /// here as it wrote it, so its plugin reads this one's after a rollback.
    #[test]
    fn a_claim_without_wait_or_spill_is_written_as_the_previous_release_wrote_it() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("checkpoint.json");
        save(&p, &sample()).unwrap();
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let allotted = written["claims"]["u1"]["devices"][0]["allotted"]
            .as_object()
            .unwrap();
        let mut keys: Vec<&str> = allotted.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "core_limit",
                "core_request",
                "device",
                "memory",
                "request",
                "uuid"
            ],
            "the previous release's fields, no more"
        );
        assert_eq!(load(&p).unwrap(), sample());
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
    }

    #[test]
    fn an_unversioned_file_is_read_and_written_back_versioned() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("checkpoint.json");
        // The current shape without `version`, and a claim prepared before the container index
        // (no `index_files`).
        let mut v = serde_json::to_value(sample()).unwrap();
        v.as_object_mut().unwrap().remove("version");
        v["claims"]["u1"]
            .as_object_mut()
            .unwrap()
            .remove("index_files");
        std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
        let c = load(&p).unwrap();
        assert_eq!(c.version, VERSION);
        let mut want = sample();
        want.claims.get_mut("u1").unwrap().index_files.clear();
        assert_eq!(c, want);
        // The next write is versioned.
        save(&p, &c).unwrap();
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(written["version"], VERSION);
        assert_eq!(load(&p).unwrap(), want);
    }

    #[test]
    fn a_newer_version_is_refused_in_one_line_naming_the_file_and_the_versions_read() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("checkpoint.json");
        // A newer format: another shape, which is not read as this one.
        let text = "{\"version\": 2, \"claims\": {\"u1\": {\"new\": true}}, \"more\": []}";
        std::fs::write(&p, text).unwrap();
        let e = load(&p).unwrap_err();
        assert_eq!(
            e,
            format!(
                "{}: checkpoint version 2, which this plugin cannot read (it reads version 1, \
                 and an unversioned file); a newer plugin wrote it: run that plugin again, or \
                 move the file aside to start afresh",
                p.display()
            )
        );
        assert!(!e.contains('\n'), "{e}");
        // Kept as it was.
        assert_eq!(std::fs::read_to_string(&p).unwrap(), text);
        std::fs::write(&p, "{\"version\": 0, \"claims\": {}}").unwrap();
        assert!(load(&p).unwrap_err().contains("version 0, which"));
        std::fs::write(&p, "{\"version\": \"one\", \"claims\": {}}").unwrap();
        assert!(
            load(&p)
                .unwrap_err()
                .contains("not a checkpoint this plugin can read")
        );
    }
}
