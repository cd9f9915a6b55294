//! The file-system side: paths under `--root`, reads, and atomic writes (temp file in the same
//! directory, fsync, rename, fsync of the directory), so no file is ever left half-written.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A target-system path (absolute, as written into configuration) under `root`.
pub fn host(root: &Path, target: &str) -> PathBuf {
    root.join(target.trim_start_matches('/'))
}

/// `target` under `root`, following symbolic links at the last component the way the target
/// system would (an absolute link target is taken under `root` too), so an edit replaces the file
/// the link points to rather than the link.
pub fn resolve(root: &Path, target: &str) -> PathBuf {
    let mut p = host(root, target);
    for _ in 0..40 {
        let Ok(meta) = fs::symlink_metadata(&p) else {
            break;
        };
        if !meta.file_type().is_symlink() {
            break;
        }
        let Ok(link) = fs::read_link(&p) else { break };
        p = if link.is_absolute() {
            root.join(link.strip_prefix("/").unwrap_or(&link))
        } else {
            match p.parent() {
                Some(dir) => dir.join(link),
                None => link,
            }
        };
    }
    p
}

/// A file's bytes and permission bits, or None when it does not exist.
pub fn read(path: &Path) -> io::Result<Option<(Vec<u8>, u32)>> {
    match fs::read(path) {
        Ok(bytes) => {
            let mode = fs::metadata(path)?.permissions().mode() & 0o7777;
            Ok(Some((bytes, mode)))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Writes `data` to `path` atomically with permission bits `mode`, keeping the owner of a file
/// it replaces (where allowed). Creates missing parent directories.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("the path has no file name"))?;
    let owner = fs::metadata(path).ok().map(|m| (m.uid(), m.gid()));
    let tmp = dir.join(format!(
        ".{}.cuslice-{}-{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(data)?;
        if let Some((uid, gid)) = owner {
            // Best effort: only root may give a file away; the mode below still applies.
            let _ = std::os::unix::fs::fchown(&f, Some(uid), Some(gid));
        }
        f.set_permissions(Permissions::from_mode(mode))?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Removes `path` (gone already is fine) and syncs its directory.
pub fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_paths_stay_under_root() {
        assert_eq!(
            host(Path::new("/host"), "/etc/docker/daemon.json"),
            PathBuf::from("/host/etc/docker/daemon.json")
        );
        assert_eq!(host(Path::new("/"), "/etc/x"), PathBuf::from("/etc/x"));
    }

    #[test]
    fn atomic_write_keeps_mode_and_leaves_no_temp() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("sub/f.json");
        write_atomic(&p, b"one", 0o640).expect("write");
        assert_eq!(fs::read(&p).expect("read"), b"one");
        assert_eq!(read(&p).expect("read").map(|(_, m)| m), Some(0o640));
        write_atomic(&p, b"two", 0o755).expect("write");
        assert_eq!(read(&p).expect("read"), Some((b"two".to_vec(), 0o755)));
        let names: Vec<_> = fs::read_dir(p.parent().expect("dir"))
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["f.json"]);
        remove(&p).expect("remove");
        remove(&p).expect("remove twice");
        assert_eq!(read(&p).expect("read"), None);
    }

    #[test]
    fn links_resolve_under_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        fs::create_dir_all(root.join("etc/docker")).expect("mkdir");
        fs::create_dir_all(root.join("srv")).expect("mkdir");
        fs::write(root.join("srv/daemon.json"), "{}").expect("write");
        std::os::unix::fs::symlink("/srv/daemon.json", root.join("etc/docker/daemon.json"))
            .expect("link");
        assert_eq!(
            resolve(root, "/etc/docker/daemon.json"),
            root.join("srv/daemon.json")
        );
        assert_eq!(resolve(root, "/etc/none"), root.join("etc/none"));
    }
}
