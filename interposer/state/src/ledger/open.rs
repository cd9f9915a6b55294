//! Opening a ledger: an anonymous one for a process that is a slice of its own, the slice's file
//! (made by the hook, or here), mapped after its header, its version and its size are checked.

use super::*;

impl Ledger {
    /// A ledger only this process uses (no CUSLICE_STATE_DIR): same code, anonymous memory.
    pub fn private() -> Result<Ledger, LedgerError> {
        let path = PathBuf::from("(private)");
        // SAFETY: a fresh anonymous shared mapping of the header's size.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(LedgerError::Io {
                path,
                err: io::Error::last_os_error(),
            });
        }
        let l = Ledger {
            map: p.cast(),
            len: size(),
            file: None,
            path,
            me: AtomicU32::new(u32::MAX),
            token: AtomicU32::new(UNKNOWN_OWNER),
            table: ByteLock::new(TABLE_LOCK_BYTE),
        };
        // SAFETY: the mapping is new and ours alone.
        unsafe { l.format() }.map_err(|err| LedgerError::Io {
            path: l.path.clone(),
            err,
        })?;
        Ok(l)
    }

    /// Opens `dir/ledger`, creating the directory and the file if needed. Racing creators agree:
    /// the file is formatted under a temporary name and linked into place atomically.
    pub fn open_dir(dir: &Path) -> Result<Ledger, LedgerError> {
        let path = dir.join(FILE_NAME);
        let io = |err| LedgerError::Io {
            path: path.clone(),
            err,
        };
        std::fs::create_dir_all(dir).map_err(|err| LedgerError::Io {
            path: dir.to_path_buf(),
            err,
        })?;
        let f =
            cuslice_shm::file::open_or_create(dir, FILE_NAME, size() as u64, 0o600, |f, tmp| {
                let l = Ledger::map_file(f, tmp)?;
                // SAFETY: the file is new, under a name no other process opens.
                unsafe { l.format() }
            })
            .map_err(io)?;
        Ledger::attach(f, path)
    }

    /// Makes the new ledger file `path` (it must not exist), formatted, with `mode`: for the hook,
    /// which makes each slice's ledger before any process of the slice can open it, so no racing
    /// maker needs the temporary name and link of `open_dir`. The header is formatted in memory
    /// and written with one `write`; the process table after it stays a hole in the file (zero
    /// until a process takes a slot). Writing through a shared mapping of the file instead made
    /// the file system handle a page fault per page.
    /// Returns the new slice's id.
    pub fn create_file(path: &Path, mode: u32) -> Result<u64, LedgerError> {
        use std::io::Write;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let io = |err| LedgerError::Io {
            path: path.to_path_buf(),
            err,
        };
        let image = Ledger::private()?;
        // The header and the device records: everything `format` writes.
        let used = std::mem::offset_of!(Header, procs);
        // SAFETY: the private mapping is `size()` bytes, ours alone (no other thread or process
        // has it), formatted, and outlives the slice, which is read before `image` is dropped.
        let bytes = unsafe { std::slice::from_raw_parts(image.map.cast::<u8>(), used) };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .map_err(io)?;
        let written = f
            .write_all(bytes)
            .and_then(|()| f.set_len(size() as u64))
            // The umask may have narrowed `mode`.
            .and_then(|()| f.set_permissions(std::fs::Permissions::from_mode(mode)));
        if let Err(err) = written {
            let _ = std::fs::remove_file(path);
            return Err(io(err));
        }
        Ok(image.slice_id())
    }

    /// A snapshot of the ledger at `path`, read without joining the slice or changing the file
    /// (a copy, see `ReadOnly`). For the node tools.
    pub fn read(path: &Path) -> Result<Snapshot, LedgerError> {
        Ok(ReadOnly::open(path)?.snapshot())
    }

    fn map_file(f: &File, path: &Path) -> io::Result<Ledger> {
        Ledger::map_prot(f, path, libc::PROT_READ | libc::PROT_WRITE)
    }

    /// Maps the file; with `prot` PROT_READ alone, only reading methods may be used
    /// (`snapshot`), which `read` guarantees by never handing the `Ledger` out.
    fn map_prot(f: &File, path: &Path, prot: libc::c_int) -> io::Result<Ledger> {
        // SAFETY: maps the whole (already sized) file shared; checked for failure.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size(),
                prot,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Ledger {
            map: p.cast(),
            len: size(),
            file: Some(f.try_clone()?),
            path: path.to_path_buf(),
            me: AtomicU32::new(u32::MAX),
            token: AtomicU32::new(UNKNOWN_OWNER),
            table: ByteLock::new(TABLE_LOCK_BYTE),
        })
    }

    fn attach(f: File, path: PathBuf) -> Result<Ledger, LedgerError> {
        Ledger::check(f, path, libc::PROT_READ | libc::PROT_WRITE)
    }

    /// Validates the header of an opened ledger file and maps it with `prot`.
    fn check(f: File, path: PathBuf, prot: libc::c_int) -> Result<Ledger, LedgerError> {
        validate(&f, &path, false)?;
        Ledger::map_prot(&f, &path, prot).map_err(|err| LedgerError::Io { path, err })
    }
}

/// Checks that `f` (opened from `path`) is a whole ledger of this version, or with `previous`
/// of the previous one too: its header, and its size as the header says. Returns its version.
pub(super) fn validate(f: &File, path: &Path, previous: bool) -> Result<u32, LedgerError> {
    let path = path.to_path_buf();
    let io = |err| LedgerError::Io {
        path: path.clone(),
        err,
    };
    let found = f.metadata().map_err(io)?.len();
    let mut head = [0u8; 24];
    let n = f.read_at(&mut head, 0).map_err(io)?;
    if n < 8 || head[..8] != MAGIC {
        return Err(LedgerError::Foreign { path });
    }
    let version = u32::from_ne_bytes([head[8], head[9], head[10], head[11]]);
    let known = version == VERSION || (previous && version == PREVIOUS);
    if n < 24 || !known {
        return Err(if previous {
            LedgerError::Unreadable {
                path,
                found: version,
            }
        } else {
            LedgerError::Version {
                path,
                found: version,
            }
        });
    }
    let header_size = u32::from_ne_bytes([head[12], head[13], head[14], head[15]]);
    let expected = u64::from_ne_bytes([
        head[16], head[17], head[18], head[19], head[20], head[21], head[22], head[23],
    ]);
    let want = file_size_of(version).unwrap_or(0);
    let damaged = || LedgerError::Damaged {
        path: path.clone(),
        found,
        expected,
    };
    if expected != want || header_size as u64 != want {
        return Err(damaged());
    }
    if found < expected && version == VERSION && found >= slots_end(f) {
        // Cut short past the process slots ever taken: what an agent of an earlier release does
        // to a ledger larger than its own format (docs/upgrades.md, downgrade). Nothing in use
        // was lost; a process of the slice grows it back (zeros: free slots), a reader reads
        // zeros there.
        if !previous {
            f.set_len(expected).map_err(|_| damaged())?;
        }
        return Ok(version);
    }
    if found != expected {
        return Err(damaged());
    }
    Ok(version)
}

/// Where the process slots ever taken end in the ledger `f` (of this version), by its header's
/// `procs_used`; the whole table when that cannot be read.
fn slots_end(f: &File) -> u64 {
    let used = read_u32(f, std::mem::offset_of!(Header, procs_used) as u64)
        .map_or(MAX_PROCS, |u| (u as usize).min(MAX_PROCS));
    (std::mem::offset_of!(Header, procs) + used * std::mem::size_of::<ProcRec>()) as u64
}
