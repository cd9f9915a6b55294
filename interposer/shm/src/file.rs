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
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
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
