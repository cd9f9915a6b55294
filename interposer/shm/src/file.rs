//! Making a shared state file that racing first processes agree on: the file is sized and
//! formatted under a temporary name and hard-linked into place, so nobody ever opens it half
//! made; a process that loses the race opens the winner's file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Opens `dir/name` read-write, or makes it: a new file of `len` bytes with permissions `mode`,
/// which `format` fills in (through `tmp`, its temporary path) before it is linked into place.
pub fn open_or_create(
    dir: &Path,
    name: &str,
    len: u64,
    mode: u32,
    format: impl Fn(&File, &Path) -> io::Result<()>,
) -> io::Result<File> {
    let path = dir.join(name);
    loop {
        match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => return Ok(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        // The pid alone does not make the name unique: the first processes of two containers
        // sharing the directory are both pid 1 in their own pid namespaces, and threads share
        // a pid. So the name also carries the time, and a name already taken is never reused.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let tmp = dir.join(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
        let f = match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        let made = (|| {
            // The umask may have narrowed `mode`.
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            f.set_len(len)?;
            format(&f, &tmp)?;
            std::fs::hard_link(&tmp, &path)
        })();
        let _ = std::fs::remove_file(&tmp);
        match made {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makers racing in one directory under the same pid (threads here; the first processes of
    /// two containers, each pid 1, on a node) all end with the one file, and none fails.
    #[test]
    fn racing_makers_with_one_pid_all_open_the_same_file() {
        for round in 0..20 {
            let dir = std::env::temp_dir()
                .join(format!("cuslice-shm-race-{}-{round}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let barrier = std::sync::Barrier::new(8);
            std::thread::scope(|s| {
                for _ in 0..8 {
                    s.spawn(|| {
                        barrier.wait();
                        open_or_create(&dir, "region", 4096, 0o600, |f, _| {
                            std::thread::sleep(std::time::Duration::from_millis(2));
                            use std::io::Write;
                            (&mut &*f).write_all(b"made")
                        })
                        .unwrap_or_else(|e| panic!("round {round}: {e}"));
                    });
                }
            });
            let left: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert_eq!(left, vec!["region".to_owned()], "round {round}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
