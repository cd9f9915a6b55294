//! A slice's turns file (`<node dir>/<slice>/turns`): its turn on each device
//! (`cuslice_policy::turn`), which the other slices on the device read while they wait for one,
//! and the words its own processes share within a turn (`Gate`). Fixed size, binary, one entry
//! per device at the index of the slice's claims entry for it. Written by the slice's own
//! processes alone (a container's is mounted read-write into it, as its claims are); read by
//! the others with `pread`, one entry at a time, never mapped or locked. A file of its own beside
//! the claims, so that the claims keep the format the previous release reads (its slices and
//! this release's see each other's requests and usage while both run on a node).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use cuslice_policy::turn::Turn;

use crate::ledger::MAX_DEVICES;

pub const FILE: &str = "turns";
pub const MAGIC: [u8; 8] = *b"CUSLTURN";
pub const VERSION: u32 = 1;

#[repr(C)]
struct Header {
    magic: [u8; 8],
    version: u32,
    size: u32,
    slice: u64,
    _reserved: [u64; 5],
}

/// The slice's turn on one device.
#[repr(C, align(64))]
pub(super) struct Entry {
    /// The device's UUID, as two big-endian words (as in the claims).
    pub(super) uuid: [AtomicU64; 2],
    /// `Turn`'s code: idle, waiting, urgent or holding (`u32::MAX` while being written).
    pub(super) turn: AtomicU32,
    _pad: u32,
    /// Waiting: since when (its place in the queue); holding: when it took the turn.
    pub(super) since: AtomicU64,
    /// Holding: when its turn is planned to end.
    pub(super) until: AtomicU64,
    /// Device memory the slice's processes are bringing back from the host now (a thaw's
    /// restore), and allocating now (bytes, each a sum its processes add to and take from), and
    /// until when either figure holds (`Board::begin_room`; in what was padding: a file of an
    /// earlier build has 0 there, nothing posted).
    pub(super) thawing: AtomicU64,
    pub(super) allocating: AtomicU64,
    pub(super) room_until: AtomicU64,
    /// What the slice's own processes share within a turn (other slices never read it).
    pub(super) gate: Gate,
}

/// How the processes of a slice share its turn on a device: the words every launch of theirs
/// reads, on a cache line of their own. Written by the slice's processes alone; a slice that
/// corrupts them disturbs its own launches alone.
#[repr(C, align(64))]
pub struct Gate {
    /// The turn's number, raised at each take.
    pub number: AtomicU64,
    /// 1 while turn `number` is open (its launches may go), else 0: the futex word launches
    /// wait on.
    pub open: AtomicU32,
    /// Processes that launched in turn `number` and have not drained their work yet.
    pub pending: AtomicU32,
    /// Work queued in turn `number` so far (ns, by `cost`).
    pub queued: AtomicU64,
    /// How much may be queued so far (ns): raised by the turn's leader as the turn runs.
    pub allowed: AtomicU64,
    /// What one launch costs (ns), by the spans of the slice's last turns.
    pub cost: AtomicU64,
    /// When a process of the slice last found the gate closed with work to launch.
    pub wanted: AtomicU64,
    /// The turn that was last settled (its span charged): each turn is settled once.
    pub settled: AtomicU64,
    /// Device time taken from the slice's tokens ahead for turn `number` (ns): its planned
    /// length; the settling charges the rest of its span.
    pub reserved: AtomicU64,
    /// The last turn in which the slice's queue was seen to run dry while launches waited for
    /// the allowance, or which ended idle: its span says nothing of what a launch costs.
    pub dry: AtomicU64,
    /// 1 when the slice's last turn ended with work left (its round, its tokens, or a slice it
    /// gives way to), 0 when it ended with nothing left to run: then its next wait comes after a
    /// lull, and is urgent (`turn::Class`).
    pub cut: AtomicU32,
    /// Launching threads of the slice's processes that wait for the open turn's allowance to be
    /// raised (in what was padding: a file of an earlier build has 0 there).
    pub held: AtomicU32,
    /// When turn `number` was closed (0 while open).
    pub closed_ns: AtomicU64,
    /// How long the slice's gaps between bursts of work have proved (ns): its holder waits that
    /// long, at least, with nothing to run before it passes the turn on to a slice that waits.
    pub quiet_ns: AtomicU64,
    /// When the first launch of turn `number` went (0: none yet): its span starts there, not at
    /// the take (the launching threads' wake-up is nobody's device time).
    pub started_ns: AtomicU64,
    /// When the work of turn `number` was done (0: not known yet): the latest that a process
    /// of the slice measured, each after draining its own (in what was padding: a file of an
    /// earlier build has 0 there). The turn's span ends there, not when a drain noticed it.
    pub done_ns: AtomicU64,
}

// The words fill two cache lines; a new one takes padding, never the size (the file's format).
const _: () = assert!(std::mem::size_of::<Gate>() == 128);
const _: () = assert!(std::mem::size_of::<Entry>() == 192);

#[repr(C)]
pub(super) struct Turns {
    header: Header,
    pub(super) entries: [Entry; MAX_DEVICES],
}

/// The size of a turns file.
pub const SIZE: usize = std::mem::size_of::<Turns>();
const ENTRY_SIZE: usize = std::mem::size_of::<Entry>();

/// Where entry `i` lies in a turns file.
pub(super) fn offset(i: usize) -> u64 {
    (std::mem::offset_of!(Turns, entries) + i * ENTRY_SIZE) as u64
}

fn header_bytes(slice: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(std::mem::size_of::<Header>());
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_ne_bytes());
    b.extend_from_slice(&(SIZE as u32).to_ne_bytes());
    b.extend_from_slice(&slice.to_ne_bytes());
    b.resize(std::mem::size_of::<Header>(), 0);
    b
}

/// Makes slice `slice`'s turns file at `path` (the hook, for a container), mode `mode`.
pub fn create(path: &Path, slice: u64, mode: u32) -> io::Result<()> {
    crate::board::create_sized(path, &header_bytes(slice), SIZE, mode)
}

/// Opens (or, for a standalone slice, makes) the slice's turns file in `dir`.
pub(super) fn open(dir: &Path, slice: u64, make: bool) -> io::Result<File> {
    if make {
        return cuslice_shm::file::open_or_create(dir, FILE, SIZE as u64, 0o644, |f, _| {
            use std::io::Write;
            (&mut &*f).write_all(&header_bytes(slice))
        });
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(FILE))
}

/// Maps `file` (checked: a turns file of this version, for `slice`).
pub(super) fn map(file: &File, slice: u64) -> Option<*mut Turns> {
    if file.metadata().ok()?.len() != SIZE as u64 {
        return None;
    }
    // SAFETY: a fresh shared mapping of SIZE bytes of a file of that size; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let t = p.cast::<Turns>();
    // SAFETY: mapped above, SIZE bytes, shared memory touched through atomics and plain reads
    // of the header this release writes once.
    let h = unsafe { &(*t).header };
    if h.magic == MAGIC && h.version == VERSION && h.size as usize == SIZE && h.slice == slice {
        Some(t)
    } else {
        // SAFETY: the mapping made above, not used again.
        unsafe { libc::munmap(p, SIZE) };
        None
    }
}

/// Unmaps a mapping `map` made.
pub(super) fn unmap(t: *mut Turns) {
    // SAFETY: a mapping of SIZE bytes made by `map`, unmapped once (the board's drop).
    unsafe { libc::munmap(t.cast(), SIZE) };
}

/// A copy of entry `i` of another slice's turns file (`pread`; what is missing reads as zeros,
/// an idle turn).
pub(super) fn read_entry(f: &File, i: usize) -> Entry {
    // SAFETY: Entry is plain atomics and integers, for which all-zero bytes are valid.
    let mut e: Entry = unsafe { std::mem::zeroed() };
    // SAFETY: the bytes of our own local `e`, valid for any bit pattern (as above).
    let bytes =
        unsafe { std::slice::from_raw_parts_mut((&mut e as *mut Entry).cast::<u8>(), ENTRY_SIZE) };
    let mut done = 0;
    while done < ENTRY_SIZE {
        match f.read_at(&mut bytes[done..], offset(i) + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    e
}

impl Entry {
    /// Whether the entry names device `w` (its UUID as two words).
    pub(super) fn is(&self, w: (u64, u64)) -> bool {
        self.uuid[0].load(Ordering::Relaxed) == w.0 && self.uuid[1].load(Ordering::Relaxed) == w.1
    }

    pub(super) fn turn(&self) -> Turn {
        Turn::from_words(
            self.turn.load(Ordering::Acquire),
            self.since.load(Ordering::Relaxed),
            self.until.load(Ordering::Relaxed),
        )
    }
}
