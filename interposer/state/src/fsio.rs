//! Atomic file writes, the one implementation every cuslice program uses: a temporary file in the
//! same directory, written whole, renamed over the target. A reader sees the old file or the new
//! one, never a part. How durable the result is (which fsyncs are made) is the caller's choice:
//! a CDI spec or an installed configuration file must survive a power loss, per-boot state under
//! /run need not. And one read: of files under /proc ([`read_proc`]).

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// Which fsyncs [`write_atomic`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// The file before the rename and its directory after: the new bytes, and the name pointing
    /// at them, survive a crash. For files that outlive a reboot (CDI specs, checkpoints, the
    /// engines' configuration).
    Full,
    /// The file before the rename, not the directory: after a crash the name holds the old bytes
    /// or the new ones, each complete.
    File,
    /// None: for per-boot runtime state under /run (tmpfs on a usual host, where fsync does
    /// nothing; on a host whose /run is a disk file system an fsync per file cost about a
    /// millisecond of every container's creation, to keep files a reboot makes meaningless).
    None,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Writes `bytes` to `path` atomically with permission bits `mode` (exactly, whatever the
/// umask), fsynced as `durability` says. The temporary file is named after the target, this
/// process and a counter (`.NAME.PID.N.tmp`), so two writers never share one. A file it replaces
/// keeps its owner and group where this process may give them (root); the parent directory must
/// exist.
pub fn write_atomic(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    durability: Durability,
) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("the path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    // A leftover of a writer that died with this pid would keep its own mode: start afresh.
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if let Ok(old) = fs::metadata(path)
            && (old.uid(), old.gid()) != own_ids()
        {
            // Best effort: only root may give a file away; the mode below still applies.
            let _ = std::os::unix::fs::fchown(&f, Some(old.uid()), Some(old.gid()));
        }
        // After fchown, which clears set-id bits.
        if umask() & mode != 0 || mode & 0o7000 != 0 {
            f.set_permissions(Permissions::from_mode(mode))?;
        }
        if durability != Durability::None {
            f.sync_all()?;
        }
        drop(f);
        fs::rename(&tmp, path)?;
        if durability == Durability::Full {
            sync_dir(dir)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Removes `path` and fsyncs its directory. `Ok(false)`: it was not there.
pub fn remove_synced(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    }
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => sync_dir(d)?,
        _ => sync_dir(Path::new("."))?,
    }
    Ok(true)
}

/// fsync of a directory: its entries (a rename, a removal) reach the disk.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Makes the new file `path` holding `bytes`, with `mode` (exactly, whatever the umask). No
/// fsync. Fails if `path` exists.
pub fn write_new(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    f.write_all(bytes)?;
    fix_mode(path, mode)
}

/// Makes the directory `path` (its parent must exist) with `mode` (exactly, whatever the umask).
pub fn make_dir(path: &Path, mode: u32) -> io::Result<()> {
    fs::DirBuilder::new().mode(mode).create(path)?;
    fix_mode(path, mode)
}

/// Sets `path`'s mode to `mode` where the umask narrowed it at creation. Under the usual umask
/// (022) the paths the hook makes come out right at once, and every chmod saved is one
/// metadata update fewer on a container's creation path.
fn fix_mode(path: &Path, mode: u32) -> io::Result<()> {
    if umask() & mode != 0 {
        fs::set_permissions(path, Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// This process's umask, read once (from /proc/self/status, which reports it without changing
/// it; the umask(2) call would set it, process-wide). Unknown reads as "narrows everything".
pub fn umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                let line = s.lines().find_map(|l| l.strip_prefix("Umask:"))?;
                u32::from_str_radix(line.trim(), 8).ok()
            })
            .unwrap_or(0o777)
    })
}

/// This process's effective uid and gid.
fn own_ids() -> (u32, u32) {
    // SAFETY: geteuid and getegid take no arguments, cannot fail and touch no memory.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// The whole of a file under /proc (whose size reads as 0): read in one `read` where it fits in
/// 4 KiB, where `fs::read` would ask its size first and then read in small steps. `None` if it
/// cannot be opened or read (the process is gone).
pub fn read_proc(path: &str) -> Option<Vec<u8>> {
    let mut f = File::open(path).ok()?;
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    buf.truncate(n);
    Some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_of(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn replaces_whole_with_the_mode_asked_for_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.json");
        for (durability, mode, text) in [
            (Durability::Full, 0o640, "one"),
            (Durability::File, 0o755, "two"),
            (Durability::None, 0o600, "three"),
        ] {
            write_atomic(&p, text.as_bytes(), mode, durability).unwrap();
            assert_eq!(fs::read_to_string(&p).unwrap(), text);
            assert_eq!(mode_of(&p), mode, "{durability:?}");
        }
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["f.json"]);
        // A missing directory is an error, and leaves nothing.
        let e = write_atomic(&dir.path().join("no/f"), b"x", 0o644, Durability::Full);
        assert_eq!(e.unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn remove_says_whether_it_was_there() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        write_new(&p, b"x", 0o600).unwrap();
        assert_eq!(mode_of(&p), 0o600);
        assert!(write_new(&p, b"y", 0o600).is_err());
        assert!(remove_synced(&p).unwrap());
        assert!(!remove_synced(&p).unwrap());
        make_dir(&dir.path().join("d"), 0o711).unwrap();
        assert_eq!(mode_of(&dir.path().join("d")), 0o711);
    }
}
