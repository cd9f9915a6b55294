//! Reading a ledger from the node's tools: with `pread` into a copy, never mapped (a container
//! can truncate or lock its own ledger; a copy is safe from both).

use super::*;

/// A ledger opened for reading by the node's tools (the agent reads every slice's every period).
/// It is read with `pread` into a copy, never mapped: a container can write its own ledger, and
/// could truncate it under a mapping (whose reader would then die of SIGBUS) or hold its locks;
/// a copy is neither. A ledger cut short reads as zeros past its end.
pub struct ReadOnly {
    file: File,
    path: PathBuf,
    /// The file's format: `VERSION`, or `PREVIOUS`, whose copy is read into this version's
    /// layout (`read_copy_used`).
    version: u32,
    copy: parking_lot::Mutex<Box<Header>>,
}

/// Opens a ledger a tenant may have tampered with: a regular file only (never a FIFO, whose open
/// or read could wait, nor a link), with its header checked: of this version or the previous
/// one (the node's tools read both). Returns it with its version.
pub(super) fn open_checked(path: &Path, write: bool) -> Result<(File, u32), LedgerError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |err| LedgerError::Io {
        path: path.to_path_buf(),
        err,
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    if !f.metadata().map_err(io)?.is_file() {
        return Err(LedgerError::Foreign {
            path: path.to_path_buf(),
        });
    }
    let version = validate(&f, path, true)?;
    Ok((f, version))
}

/// A zeroed header on the heap (a megabyte: never on a stack).
pub(super) fn zeroed_header() -> Box<Header> {
    // SAFETY: every field of `Header` is an integer, an atomic integer or a lock word, for all of
    // which all-zero bytes are a valid value.
    unsafe { Box::<Header>::new_zeroed().assume_init() }
}

/// Reads the ledger of `version` in `f` into `copy`: the header and the device records, then
/// the process slots that were ever taken (`procs_used`, as the header just read says). The
/// slots past them stay as they were in `copy`: zero, since no slot there was taken when it was
/// read before. A file of the previous version is laid out as this one up to the process table,
/// whose records lack their last word (`frozen_ns`): each is read into its slot of `copy`, that
/// word zero.
pub(super) fn read_copy_used(f: &File, copy: &mut Header, version: u32) {
    let table = std::mem::offset_of!(Header, procs);
    // Device records are taken lowest first and never given back: the ones in use are the first,
    // up to the first free one. They are read that far (a record at a time: a slice uses one
    // device or a few of the 64 records, and the whole table is a hundred kilobytes, read every
    // period for every slice); the rest of `copy`'s table is zeroed, as if read free.
    let devices = std::mem::offset_of!(Header, devices);
    let rec = std::mem::size_of::<DeviceRec>();
    read_range(f, copy, 0, devices);
    let mut end = MAX_DEVICES;
    for i in 0..MAX_DEVICES {
        let at = devices + i * rec;
        read_range(f, copy, at, at + rec);
        if copy.devices[i].state.load(Ordering::Relaxed) == FREE {
            end = i + 1;
            break;
        }
    }
    zero_range(copy, devices + end * rec, table);
    let used = (copy.procs_used.load(Ordering::Relaxed) as usize).min(MAX_PROCS);
    if version != PREVIOUS {
        read_range(
            f,
            copy,
            table,
            table + used * std::mem::size_of::<ProcRec>(),
        );
        return;
    }
    let start = (copy as *mut Header).cast::<u8>();
    // SAFETY: `copy` is `size()` bytes we hold exclusively; any bytes are a valid `Header`.
    let bytes = unsafe { std::slice::from_raw_parts_mut(start, size()) };
    let mut record = vec![0u8; PREVIOUS_PROC_SIZE];
    for s in 0..used {
        read_bytes_at(f, &mut record, proc_field_at(PREVIOUS, s, 0));
        let at = proc_field_at(VERSION, s, 0);
        bytes[at..at + PREVIOUS_PROC_SIZE].copy_from_slice(&record);
        let frozen = at + std::mem::offset_of!(ProcRec, frozen_ns);
        bytes[frozen..frozen + 8].fill(0);
    }
}

/// Reads `buf.len()` bytes of `f` from `at` into `buf` (zeros past what could be read).
fn read_bytes_at(f: &File, buf: &mut [u8], at: usize) {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], (at + done) as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    buf[done..].fill(0);
}

/// Reads bytes `from..to` of the ledger in `f` into the same bytes of `copy` (zeros past what
/// could be read).
fn read_range(f: &File, copy: &mut Header, from: usize, to: usize) {
    let start = (copy as *mut Header).cast::<u8>();
    // SAFETY: `copy` is `size()` bytes we hold exclusively; any bytes are a valid `Header`.
    let bytes = unsafe { std::slice::from_raw_parts_mut(start, size()) };
    read_bytes(f, bytes, from, to);
}

/// Zeroes bytes `from..to` of `copy`.
fn zero_range(copy: &mut Header, from: usize, to: usize) {
    let start = (copy as *mut Header).cast::<u8>();
    // SAFETY: `copy` is `size()` bytes we hold exclusively; all-zero bytes are a valid `Header`
    // (`zeroed_header`).
    let bytes = unsafe { std::slice::from_raw_parts_mut(start, size()) };
    bytes[from.min(to)..to].fill(0);
}

/// Reads bytes `from..to` of the file `f` into the same bytes of `bytes` (zeros past what could
/// be read).
pub(super) fn read_bytes(f: &File, bytes: &mut [u8], from: usize, to: usize) {
    let to = to.min(bytes.len());
    let mut done = from;
    while done < to {
        match f.read_at(&mut bytes[done..to], done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    bytes[done..to].fill(0);
}

impl ReadOnly {
    /// Opens the ledger at `path`, of this version or the previous one.
    pub fn open(path: &Path) -> Result<ReadOnly, LedgerError> {
        let (file, version) = open_checked(path, false)?;
        Ok(ReadOnly {
            file,
            path: path.to_path_buf(),
            version,
            copy: parking_lot::Mutex::new(zeroed_header()),
        })
    }

    /// What the ledger holds now, copied out (`Snapshot::version` says in which format it was).
    /// A device's history of marks is taken from a copy in which no writer was at work on it
    /// (read again, a few times at most, until so).
    pub fn snapshot(&self) -> Snapshot {
        let mut copy = self.copy.lock();
        for _ in 0..10 {
            read_copy_used(&self.file, &mut copy, self.version);
            if self.marks_settled(&copy) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let fd = self.file.as_raw_fd();
        let mut snap = snapshot_of(&copy, |s| {
            liveness::held_by_other(fd, LIVENESS_BASE + s as i64)
        });
        snap.version = self.version;
        snap
    }

    /// Whether, in `copy`, no writer was changing any live device's marks: each one's sequence
    /// count is even and still what the file holds now.
    fn marks_settled(&self, copy: &Header) -> bool {
        copy.devices.iter().enumerate().all(|(i, d)| {
            if d.state.load(Ordering::Relaxed) != LIVE {
                return true;
            }
            let seq = d.marks_seq.load(Ordering::Relaxed);
            let at = std::mem::offset_of!(Header, devices)
                + i * std::mem::size_of::<DeviceRec>()
                + std::mem::offset_of!(DeviceRec, marks_seq);
            seq.is_multiple_of(2) && read_u64(&self.file, at as u64) == Some(seq)
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

pub(super) fn read_u64(f: &File, at: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    (f.read_at(&mut b, at).ok()? == 8).then(|| u64::from_ne_bytes(b))
}

pub(super) fn read_u32(f: &File, at: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    (f.read_at(&mut b, at).ok()? == 4).then(|| u32::from_ne_bytes(b))
}

pub(super) fn write_at(f: &File, at: usize, bytes: &[u8]) -> io::Result<()> {
    f.write_all_at(bytes, at as u64)
}
