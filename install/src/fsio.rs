//! The file-system side: paths under `--root`, reads, and removals. Writes are atomic and
//! durable (`cuslice_state::fsio::write_atomic` with `Durability::Full`: temp file in the same
//! directory, fsync, rename, fsync of the directory), so no file is ever left half-written.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

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

/// Makes the missing parent directories of `path`, for a file written with
/// `cuslice_state::fsio::write_atomic` (which install calls with `Durability::Full`).
pub fn make_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => fs::create_dir_all(d),
        _ => Ok(()),
    }
}

/// Removes `path` (gone already is fine) and syncs its directory.
pub fn remove(path: &Path) -> io::Result<()> {
    cuslice_state::fsio::remove_synced(path).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuslice_state::fsio::{Durability, write_atomic};

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
        make_parent(&p).expect("mkdir");
        write_atomic(&p, b"one", 0o640, Durability::Full).expect("write");
        assert_eq!(fs::read(&p).expect("read"), b"one");
        assert_eq!(read(&p).expect("read").map(|(_, m)| m), Some(0o640));
        write_atomic(&p, b"two", 0o755, Durability::Full).expect("write");
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
