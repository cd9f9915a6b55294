//! Writing and removing spec files: atomically and durably (a temporary file in the same
//! directory, fsync, rename, fsync of the directory), so a runtime never reads half a spec and a
//! prepared claim's spec survives a crash.

use std::path::{Path, PathBuf};

use cuslice_state::fsio::{self, Durability};

use crate::claim::claim_spec_file;
use crate::spec::Spec;

/// Writes `spec` (validated first) to `dir/file_name` atomically: a temporary file in `dir`,
/// written and fsynced, renamed over the target, then `dir` fsynced. `dir` is made if missing.
/// The file is mode 0644.
pub fn write_spec(dir: &Path, file_name: &str, spec: &Spec) -> Result<PathBuf, String> {
    let named = file_name.ends_with(".json")
        && !file_name.starts_with('.')
        && !file_name.contains('/')
        && file_name.len() > ".json".len();
    if !named {
        return Err(format!(
            "CDI spec file name {file_name:?} is not NAME.json (e.g. {})",
            claim_spec_file("5d1f0c1e")
        ));
    }
    spec.validate()
        .map_err(|e| format!("CDI spec {file_name} not written: {e}"))?;
    let path = dir.join(file_name);
    std::fs::create_dir_all(dir).map_err(|e| {
        format!(
            "cannot write CDI spec {} (making its directory: {e})",
            path.display()
        )
    })?;
    fsio::write_atomic(&path, spec.to_json().as_bytes(), 0o644, Durability::Full)
        .map_err(|e| format!("cannot write CDI spec {} ({e})", path.display()))?;
    Ok(path)
}

/// Removes `dir/file_name` if it is there (then fsyncs `dir`). `Ok(false)`: it was not there.
pub fn remove_spec(dir: &Path, file_name: &str) -> Result<bool, String> {
    let path = dir.join(file_name);
    fsio::remove_synced(&path)
        .map_err(|e| format!("cannot remove CDI spec {} ({e})", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::example as claim;

    #[test]
    fn atomic_write_and_remove() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("cdi");
        let path = write_spec(&sub, "gpu.cuslice.io-5d1f.json", &claim()).unwrap();
        assert_eq!(path, sub.join("gpu.cuslice.io-5d1f.json"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), claim().to_json());
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o644);
        }
        // Overwritten whole; no temporary file left.
        let mut other = claim();
        other.devices[0].container_edits.env = vec!["A=1".into()];
        write_spec(&sub, "gpu.cuslice.io-5d1f.json", &other).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), other.to_json());
        let names: Vec<_> = std::fs::read_dir(&sub)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["gpu.cuslice.io-5d1f.json"]);
        for bad in ["", ".json", "x.yaml", "a/b.json", ".x.json"] {
            assert!(write_spec(&sub, bad, &claim()).is_err(), "{bad:?}");
        }
        let mut invalid = claim();
        invalid.kind = "x".into();
        let e = write_spec(&sub, "bad.json", &invalid).unwrap_err();
        assert!(e.contains("not written"), "{e}");
        assert!(!sub.join("bad.json").exists());
        assert_eq!(remove_spec(&sub, "gpu.cuslice.io-5d1f.json"), Ok(true));
        assert_eq!(remove_spec(&sub, "gpu.cuslice.io-5d1f.json"), Ok(false));
        assert!(!path.exists());
    }
}
