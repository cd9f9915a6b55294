//! The slice's ledger: what every process of the slice holds on each device, shared through a
//! mapped file (`$CUSLICE_STATE_DIR/ledger`, or the directory the hook mounts), or through an
//! anonymous mapping when a process is a slice of its own.
//!
//! Layout: a versioned header, a table of devices (by UUID: the cap, the total held, the peak,
//! refusals, the last measured context overhead) and a table of process slots (pid and what the
//! process holds on each device). The per-process charges are the truth; a device's `used` is
//! their sum, kept up to date under the device's lock, so "check and reserve" is one step for
//! every process of the slice.
//!
//! Each device record also carries what the node tools show of the slice's compute: the core
//! request and limit, the device time its processes used as their meters measured it, the time
//! their launches were held back, and one mark a second of both (the last `MARKS` seconds), from
//! which `cuslice status` works out the share achieved over the last 1 s and 10 s. `read` takes
//! a snapshot of a ledger without joining it.
//!
//! SIGKILL at any instruction, in any pid namespace (a slice's processes may be in several: a
//! standalone CUSLICE_STATE_DIR shared by containers, a sandbox inside a container): each
//! process's liveness lock (an OFD lock on one byte of the file) is dropped by the kernel when it
//! dies, and no lock names a process by pid or thread id. A process that dies holding a device
//! lock (a word naming it by token) leaves the lock to the next locker that finds it dead, which
//! recomputes `used` from the charges; the table lock is an OFD lock the kernel drops; a dead
//! process's charges are reclaimed by the next sweep, which runs before any refusal and on every
//! memory read.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

use cuslice_shm::{ByteLock, Locked, OwnerLock, OwnerTokens, liveness};

use crate::snapshot::{DeviceSnapshot, ProcSnapshot, Snapshot};

pub const MAGIC: [u8; 8] = *b"CUSLICE\x00";
/// 4: the device lock is cuslice's own (`cuslice_shm::OwnerLock`), next to the figures it
/// guards.
/// 5: each process's compute usage per device (`ProcRec::usage`), summed for the node's compute
/// board.
/// 6: no glibc robust mutexes (their owner is a thread id, which means something only in the
/// owner's pid namespace, and the processes of a slice may be in several): the table lock is an
/// OFD lock on a byte of the file (`TABLE_LOCK_BYTE`), the measuring lock an `OwnerLock`; the
/// header says how far the process table was ever used (`procs_used`).
/// 7: what an allocation does at the cap: each device's queue of allocations waiting for the
/// slice's frees (`waiters`, `wake`, `queue`) and its memory spilled to the host (`spill_limit`,
/// `spilled`; per process `ProcRec::spilled`).
pub const VERSION: u32 = 7;
/// The previous version, which the node's tools still read and change (`read`, `set_live`,
/// `tell_host_pids`): the slices the previous release started keep writing it after an upgrade
/// (docs/upgrades.md). The library itself joins only `VERSION`.
pub const PREVIOUS: u32 = v6::VERSION;

mod v6;
pub const MAX_DEVICES: usize = 64;
pub const MAX_PROCS: usize = 1024;
/// Liveness locks sit far past the end of the file (OFD locks need no backing bytes).
const LIVENESS_BASE: i64 = 1 << 40;
/// The table lock (see `Ledger::lock_table`): an OFD lock on this byte.
const TABLE_LOCK_BYTE: i64 = LIVENESS_BASE - 1;
pub const FILE_NAME: &str = "ledger";
/// Seconds of history kept per device (one mark a second).
pub const MARKS: usize = 16;

const FREE: u32 = 0;
const LIVE: u32 = 1;
const LIMIT_UNSET: u64 = u64::MAX;
/// How many allocations of a slice may wait on one device at once (`CUSLICE_MEMORY_WAIT`); one
/// more is refused at once.
pub const WAIT_SLOTS: usize = 64;
/// `DeviceRec::live` bits: the node changed the memory cap / the core request and limit.
pub const LIVE_MEMORY: u32 = 1;
pub const LIVE_CORE: u32 = 2;
pub const LIVE_PRIORITY: u32 = 4;

#[repr(C)]
pub struct Header {
    magic: [u8; 8],
    version: u32,
    header_size: u32,
    file_size: u64,
    max_devices: u32,
    max_procs: u32,
    /// One past the highest process slot ever taken (slots are taken lowest first): the node's
    /// tools read the process table that far, not all `MAX_PROCS` slots.
    procs_used: AtomicU32,
    /// A random identity for the slice, which names its place on the node's compute board.
    slice_id: u64,
    devices: [DeviceRec; MAX_DEVICES],
    procs: [ProcRec; MAX_PROCS],
}

/// A device's record. Its first cache line holds what every allocation and free touches: the
/// lock, the cap, what the slice holds and its peak.
#[repr(C, align(64))]
pub struct DeviceRec {
    /// Guards `used`, `peak`, the processes' `charged` on this device and the marks. It names
    /// its holder by token (slot and registration generation, see `TOKENS`): a waiter that
    /// wonders asks whether the holder still lives through its liveness lock, and takes the lock
    /// over from a dead one ([`Locked::OwnerDied`]: the charges are the truth, `used` is
    /// recounted). One compare-and-swap to take, a plain store to give back.
    lock: OwnerLock,
    state: AtomicU32,
    /// What `cuslice set` changed while the slice ran (`LIVE_MEMORY`, `LIVE_CORE`): a process
    /// that joins later takes those values from here, not from its own configuration.
    live: AtomicU32,
    /// Allocations queued in `queue` (under `lock`): a free that sees more than 0 wakes them
    /// (`wake`). In the first cache line, so that a free pays one load it already has, no more.
    waiters: AtomicU32,
    /// The cap in bytes; LIMIT_UNSET when no process of the slice has set one.
    limit: AtomicU64,
    used: AtomicU64,
    peak: AtomicU64,
    /// The device's UUID, as two words (written once, under the table lock, before `state`).
    uuid: [AtomicU64; 2],
    /// Held while a process measures the slice's first context on the device (named by token,
    /// as `lock`).
    measure: OwnerLock,
    refusals: AtomicU64,
    context_overhead: AtomicU64,
    /// Compute time-share: the slice's tokens (ns of device time it may still use; negative: it
    /// owes), when they were last refilled (CLOCK_MONOTONIC ns) and the slice's allotment (ppm).
    tokens: AtomicI64,
    last_refill: AtomicU64,
    share: AtomicU32,
    /// 1: the last device time reported was launch estimates (NVML did not report the process).
    estimated: AtomicU32,
    /// The core request and limit (ppm; 0 and FULL when not set) the slice's processes run with.
    core_request: AtomicU32,
    core_limit: AtomicU32,
    /// The slice's priority on the device (`Priority::code`: 0 normal, 1 low, 2 high).
    priority: AtomicU32,
    /// Device time the slice's processes used (ns), as their meters measured it.
    device_ns: AtomicU64,
    /// Time the slice's launching threads spent held back by the gate (ns, summed over threads).
    throttled_ns: AtomicU64,
    /// When a meter last reported (CLOCK_MONOTONIC ns); 0: never.
    metered_ns: AtomicU64,
    /// Even when `marks` is consistent, odd while a writer changes it.
    marks_seq: AtomicU64,
    /// `device_ns` and `throttled_ns` as they were at the first report of each second, in the
    /// slot of that second modulo MARKS.
    marks: [Mark; MARKS],
    /// The futex word waiting allocations sleep on: a free with waiters adds one and wakes them.
    wake: AtomicU32,
    /// The slice's spill on the device: the most it may hold in host memory past its cap
    /// (LIMIT_UNSET: none set), and what its processes hold there now (the sum of their
    /// `ProcRec::spilled`, kept under `lock`).
    spill_limit: AtomicU64,
    spilled: AtomicU64,
    spill_peak: AtomicU64,
    /// The next ticket of the wait queue (under `lock`): first come, first served.
    wait_next: AtomicU64,
    /// Allocations waiting for the slice's frees, each named by its process's token (0: a free
    /// entry) with its ticket. An entry whose process died is skipped and cleared by whoever
    /// finds it.
    queue: [WaitEntry; WAIT_SLOTS],
}

#[repr(C)]
struct WaitEntry {
    token: AtomicU32,
    ticket: AtomicU64,
}

#[repr(C)]
struct Mark {
    /// When the mark was taken (CLOCK_MONOTONIC ns); 0: never.
    at_ns: AtomicU64,
    device_ns: AtomicU64,
    throttled_ns: AtomicU64,
}

/// Where field `$field` of device record `$d` lies in the file.
macro_rules! dev_at {
    ($d:expr, $field:ident) => {
        std::mem::offset_of!(Header, devices)
            + $d * std::mem::size_of::<DeviceRec>()
            + std::mem::offset_of!(DeviceRec, $field)
    };
}

/// Where field `$field` of process record `$s` lies in the file.
macro_rules! proc_at {
    ($s:expr, $field:ident) => {
        std::mem::offset_of!(Header, procs)
            + $s * std::mem::size_of::<ProcRec>()
            + std::mem::offset_of!(ProcRec, $field)
    };
}

fn random_id() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: fills our own 8-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == 8 {
        return u64::from_ne_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (std::process::id() as u64) << 32
}

fn uuid_words(u: &[u8; 16]) -> (u64, u64) {
    let (a, b) = u.split_at(8);
    let w = |x: &[u8]| x.iter().fold(0u64, |acc, b| acc << 8 | *b as u64);
    (w(a), w(b))
}

impl DeviceRec {
    fn has_uuid(&self, u: &[u8; 16]) -> bool {
        let (a, b) = uuid_words(u);
        self.uuid[0].load(Ordering::Relaxed) == a && self.uuid[1].load(Ordering::Relaxed) == b
    }
}

#[repr(C)]
pub struct ProcRec {
    state: AtomicU32,
    generation: AtomicU32,
    pid: AtomicI32,
    /// The process's pid in the host's pid namespace, when the node agent (or a node tool) has
    /// told it (0: not known). NVML names processes by host pid, which a process in a container cannot learn
    /// itself; its compute meter needs it to find its own utilisation samples.
    host_pid: AtomicI32,
    charged: [AtomicU64; MAX_DEVICES],
    /// When the process's compute meter last reported (CLOCK_MONOTONIC ns; 0: never).
    beat_ns: AtomicU64,
    /// Its share of each device in its meter's last period (ppm).
    usage: [AtomicU32; MAX_DEVICES],
    /// What it holds in host memory past the cap on each device (`CUSLICE_MEMORY_SPILL`).
    spilled: [AtomicU64; MAX_DEVICES],
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("cannot use {path}: {err}")]
    Io { path: PathBuf, err: io::Error },
    #[error(
        "{path} is not a cuslice ledger (it does not start with cuslice's magic bytes); move it away or point CUSLICE_STATE_DIR at another directory"
    )]
    Foreign { path: PathBuf },
    #[error(
        "{path} is a cuslice ledger of version {found}, this library reads version {VERSION}; stop the processes using it and remove it, or use another CUSLICE_STATE_DIR"
    )]
    Version { path: PathBuf, found: u32 },
    #[error(
        "{path} is a slice's ledger of version {found}, which this cuslice (ledger versions {PREVIOUS} and {VERSION}) cannot read: use the cuslice release that started the slice (`cuslice --version` names the formats each release speaks)"
    )]
    Unreadable { path: PathBuf, found: u32 },
    #[error(
        "{path} is damaged (size {found} bytes, its header says {expected}); stop the processes using it and remove it"
    )]
    Damaged {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
    #[error(
        "{path}: no process of this slice has used device {uuid} yet, so it has no limits there to change"
    )]
    NoDevice { path: PathBuf, uuid: String },
    #[error("{path}: all {MAX_PROCS} process slots are in use")]
    Full { path: PathBuf },
    #[error("{path}: all {MAX_DEVICES} device slots are in use")]
    DevicesFull { path: PathBuf },
    #[error(
        "the memory cap {asked} for device {uuid} differs from the cap {recorded} the slice in {path} already has; processes of one slice must agree (or leave it unset to inherit)"
    )]
    CapConflict {
        path: PathBuf,
        uuid: String,
        asked: String,
        recorded: String,
    },
}

/// A slice's compute tokens on one device, shared by its processes.
#[derive(Clone, Copy)]
pub struct Tokens<'a> {
    pub tokens: &'a AtomicI64,
    pub last_refill: &'a AtomicU64,
    pub share: &'a AtomicU32,
}

/// What `cuslice set` changes on one device: the cap (bytes), the core request and limit (ppm).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveChange {
    pub memory: Option<u64>,
    pub core: Option<(u32, u32)>,
    /// `Priority::code`.
    pub priority: Option<u32>,
}

/// A refusal: the request would take the slice past its cap.
#[derive(Debug, Clone, Copy)]
pub struct OverCap {
    pub used: u64,
    pub limit: u64,
}

pub struct Ledger {
    map: *mut Header,
    len: usize,
    /// The backing file; None for a private (anonymous) ledger.
    file: Option<File>,
    path: PathBuf,
    /// This process's slot once registered (u32::MAX before).
    me: AtomicU32,
    /// What this process writes into a device lock it holds (see `TOKENS`).
    token: AtomicU32,
    /// This process's side of the table lock (see `lock_table`).
    table: ByteLock,
}

// SAFETY: the mapping is shared memory accessed only through atomics and under the ledger's
// locks.
unsafe impl Send for Ledger {}
// SAFETY: as above.
unsafe impl Sync for Ledger {}

fn size() -> usize {
    std::mem::size_of::<Header>()
}

/// The size of every ledger file of this version (the hook makes them so; the node agent
/// reports one that has grown).
pub fn file_size() -> u64 {
    size() as u64
}

/// The size of every ledger file of `version`, for the versions the node's tools read.
pub fn file_size_of(version: u32) -> Option<u64> {
    match version {
        VERSION => Some(size() as u64),
        PREVIOUS => Some(v6::size() as u64),
        _ => None,
    }
}

/// The version of the ledger at `path`, from its header (None: not a ledger, or unreadable).
pub fn version_of(path: &Path) -> Option<u32> {
    let f = File::open(path).ok()?;
    let mut head = [0u8; 12];
    (f.read_at(&mut head, 0).ok()? == 12 && head[..8] == MAGIC)
        .then(|| u32::from_ne_bytes([head[8], head[9], head[10], head[11]]))
}

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

    /// # Safety
    /// The mapping must be new and unused by anyone else.
    unsafe fn format(&self) -> io::Result<()> {
        let h = self.map;
        // SAFETY: per the contract the memory is ours; fields are written before anyone reads.
        unsafe {
            (*h).version = VERSION;
            (*h).header_size = size() as u32;
            (*h).file_size = size() as u64;
            (*h).max_devices = MAX_DEVICES as u32;
            (*h).max_procs = MAX_PROCS as u32;
            (*h).slice_id = random_id();
            // The locks are zero: free.
            for d in (*h).devices.iter() {
                d.limit.store(LIMIT_UNSET, Ordering::Relaxed);
                d.spill_limit.store(LIMIT_UNSET, Ordering::Relaxed);
                d.share
                    .store(cuslice_policy::share::FULL, Ordering::Relaxed);
                d.core_limit
                    .store(cuslice_policy::share::FULL, Ordering::Relaxed);
            }
            // The magic last: a file is recognised only when it is complete.
            (*h).magic = MAGIC;
        }
        Ok(())
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping lives as long as `self` and was validated or formatted.
        unsafe { &*self.map }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The process slots ever taken (`procs_used`; slots are taken lowest first). The rest are
    /// free and never read, so that a ledger cut short past them by an agent of an earlier
    /// release (docs/upgrades.md) is never touched there.
    fn slots(&self) -> &[ProcRec] {
        let h = self.header();
        let used = (h.procs_used.load(Ordering::Acquire) as usize).min(MAX_PROCS);
        &h.procs[..used]
    }

    fn dev(&self, d: u32) -> Option<&DeviceRec> {
        self.header().devices.get(d as usize)
    }

    /// Locks the tables of processes and devices. A process takes it to register, before it
    /// has a slot (so no token could name it): an OFD lock on `TABLE_LOCK_BYTE`, which the
    /// kernel drops when its holder dies and which holds across pid namespaces, plus this
    /// process's mutex. Nothing under it is left half-done in a way the next holder or a reader
    /// could trip on: slots and devices turn LIVE only after their fields are written, and a
    /// sweep killed half-way is done again by the next.
    fn lock_table(&self) -> cuslice_shm::lock::ByteGuard<'_> {
        self.table.lock(self.file.as_ref().map(|f| f.as_raw_fd()))
    }

    fn lock_dev<'a>(&'a self, rec: &'a DeviceRec, d: usize) -> DevGuard<'a> {
        let token = self.token.load(Ordering::Relaxed);
        if let Locked::OwnerDied = rec.lock.lock(token, |owner| self.owner_dead(owner)) {
            // The dead owner may have updated a charge and not `used` (or the other way round):
            // the charges are the truth.
            let sum = self
                .slots()
                .iter()
                .filter(|p| p.state.load(Ordering::Acquire) == LIVE)
                .filter_map(|p| p.charged.get(d))
                .map(|c| c.load(Ordering::Relaxed))
                .fold(0u64, u64::saturating_add);
            rec.used.store(sum, Ordering::Relaxed);
            let spilled = self
                .slots()
                .iter()
                .filter(|p| p.state.load(Ordering::Acquire) == LIVE)
                .filter_map(|p| p.spilled.get(d))
                .map(|c| c.load(Ordering::Relaxed))
                .fold(0u64, u64::saturating_add);
            rec.spilled.store(spilled, Ordering::Relaxed);
        }
        DevGuard { rec }
    }

    /// Whether the process whose token is `owner` is gone: its slot was freed or taken by
    /// another process since (the generation differs), or nobody holds its liveness lock.
    fn owner_dead(&self, owner: u32) -> bool {
        let Some((slot, generation)) = token_owner(owner) else {
            return false;
        };
        if slot == self.me.load(Ordering::Relaxed) {
            // Another thread of this process (slow, not dead: we are alive).
            return false;
        }
        let Some(p) = self.header().procs.get(slot as usize) else {
            return false;
        };
        p.generation.load(Ordering::Acquire) & GEN_MASK != generation
            || p.state.load(Ordering::Acquire) != LIVE
            || !self.alive(slot as usize)
    }

    fn alive(&self, s: usize) -> bool {
        if s as u32 == self.me.load(Ordering::Relaxed) {
            // Our own lock never conflicts with our own query.
            return true;
        }
        match &self.file {
            // Private ledgers have one process: this one.
            None => true,
            Some(f) => liveness::held_by_other(f.as_raw_fd(), LIVENESS_BASE + s as i64),
        }
    }

    /// Takes a process slot for this process.
    pub fn register(&self) -> Result<u32, LedgerError> {
        let _g = self.lock_table();
        // Frees the slots of dead processes that hold nothing; those still charged wait for a
        // sweep that can ask the driver.
        self.sweep_locked(None, &|_, _| true);
        for (s, p) in self.header().procs.iter().enumerate() {
            if p.state.load(Ordering::Acquire) != FREE {
                continue;
            }
            if let Some(f) = &self.file
                && liveness::hold(f.as_raw_fd(), LIVENESS_BASE + s as i64).is_err()
            {
                continue;
            }
            let generation = p.generation.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            self.token
                .store(make_token(s as u32, generation), Ordering::Relaxed);
            p.pid.store(std::process::id() as i32, Ordering::Relaxed);
            p.host_pid.store(0, Ordering::Relaxed);
            for c in p.charged.iter() {
                c.store(0, Ordering::Relaxed);
            }
            p.beat_ns.store(0, Ordering::Relaxed);
            for u in p.usage.iter() {
                u.store(0, Ordering::Relaxed);
            }
            for c in p.spilled.iter() {
                c.store(0, Ordering::Relaxed);
            }
            p.state.store(LIVE, Ordering::Release);
            self.me.store(s as u32, Ordering::Relaxed);
            self.header()
                .procs_used
                .fetch_max(s as u32 + 1, Ordering::Relaxed);
            return Ok(s as u32);
        }
        Err(LedgerError::Full {
            path: self.path.clone(),
        })
    }

    /// Reclaims what dead processes hold. A dead process's charge on a device stays while
    /// `on_device(pid, uuid)` says the device still holds its memory (the driver frees a
    /// process's memory some time after the process is gone); its slot is freed once nothing is
    /// charged to it. Returns the bytes still charged to dead processes for that reason.
    pub fn sweep(&self, me: u32, on_device: &dyn Fn(i32, &[u8; 16]) -> bool) -> u64 {
        let _g = self.lock_table();
        self.sweep_locked(Some(me), on_device)
    }

    fn sweep_locked(&self, me: Option<u32>, on_device: &dyn Fn(i32, &[u8; 16]) -> bool) -> u64 {
        if self.file.is_none() {
            return 0;
        }
        let mut waiting = 0;
        for (s, p) in self.slots().iter().enumerate() {
            if p.state.load(Ordering::Acquire) != LIVE || Some(s as u32) == me || self.alive(s) {
                continue;
            }
            // The pid the driver lists the process under: its host pid where it was told it.
            let pid = match p.host_pid.load(Ordering::Relaxed) {
                h if h > 0 => h,
                _ => p.pid.load(Ordering::Relaxed),
            };
            let mut kept = false;
            for (d, rec) in self.header().devices.iter().enumerate() {
                // Spilled memory is the process's host memory: gone with the process.
                if let Some(c) = p.spilled.get(d)
                    && c.load(Ordering::Relaxed) > 0
                {
                    let _g = self.lock_dev(rec, d);
                    let n = c.swap(0, Ordering::Relaxed);
                    rec.spilled.store(
                        rec.spilled.load(Ordering::Relaxed).saturating_sub(n),
                        Ordering::Relaxed,
                    );
                }
                let Some(c) = p.charged.get(d) else { continue };
                if c.load(Ordering::Relaxed) == 0 {
                    continue;
                }
                if on_device(pid, &uuid_of(rec)) {
                    kept = true;
                    waiting += c.load(Ordering::Relaxed);
                    continue;
                }
                let _g = self.lock_dev(rec, d);
                let n = c.swap(0, Ordering::Relaxed);
                rec.used.store(
                    rec.used.load(Ordering::Relaxed).saturating_sub(n),
                    Ordering::Relaxed,
                );
            }
            if !kept {
                p.state.store(FREE, Ordering::Release);
            }
        }
        waiting
    }

    /// The device record for `uuid`, made if new. `cap` is this process's configured cap (None:
    /// inherit whatever the slice has). Returns the index and the slice's cap for the device.
    pub fn device(
        &self,
        uuid: [u8; 16],
        cap: Option<u64>,
    ) -> Result<(u32, Option<u64>), LedgerError> {
        let _g = self.lock_table();
        let devices = &self.header().devices;
        let found = devices
            .iter()
            .position(|d| d.state.load(Ordering::Acquire) == LIVE && d.has_uuid(&uuid));
        let i = match found {
            Some(i) => i,
            None => {
                let i = devices
                    .iter()
                    .position(|d| d.state.load(Ordering::Acquire) == FREE)
                    .ok_or_else(|| LedgerError::DevicesFull {
                        path: self.path.clone(),
                    })?;
                let (a, b) = uuid_words(&uuid);
                devices[i].uuid[0].store(a, Ordering::Relaxed);
                devices[i].uuid[1].store(b, Ordering::Relaxed);
                i
            }
        };
        let rec = &devices[i];
        let recorded = rec.limit.load(Ordering::Relaxed);
        let effective = match (cap, recorded) {
            (None, LIMIT_UNSET) => None,
            (None, r) => Some(r),
            (Some(c), LIMIT_UNSET) => {
                rec.limit.store(c, Ordering::Relaxed);
                Some(c)
            }
            (Some(c), r) if c == r => Some(c),
            // The node changed the cap while the slice ran (`cuslice set`): the slice's cap now,
            // whatever this process's configuration said when it was written.
            (Some(_), r) if rec.live.load(Ordering::Relaxed) & LIVE_MEMORY != 0 => Some(r),
            (Some(c), r) => {
                return Err(LedgerError::CapConflict {
                    path: self.path.clone(),
                    uuid: crate::uuid_string(&uuid),
                    asked: cuslice_policy::format_size(c),
                    recorded: cuslice_policy::format_size(r),
                });
            }
        };
        rec.state.store(LIVE, Ordering::Release);
        Ok((i as u32, effective))
    }

    /// Checks and reserves `bytes` for process `me` on device `d` in one step.
    pub fn reserve(&self, me: u32, d: u32, bytes: u64) -> Result<(), OverCap> {
        let (Some(rec), Some(p)) = (self.dev(d), self.header().procs.get(me as usize)) else {
            return Err(OverCap { used: 0, limit: 0 });
        };
        let Some(charge) = p.charged.get(d as usize) else {
            return Err(OverCap { used: 0, limit: 0 });
        };
        let _g = self.lock_dev(rec, d as usize);
        let used = rec.used.load(Ordering::Relaxed);
        let limit = rec.limit.load(Ordering::Relaxed);
        let after = used.saturating_add(bytes);
        if after > limit {
            return Err(OverCap { used, limit });
        }
        charge.store(charge.load(Ordering::Relaxed) + bytes, Ordering::Relaxed);
        rec.used.store(after, Ordering::Relaxed);
        if after > rec.peak.load(Ordering::Relaxed) {
            rec.peak.store(after, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Charges `bytes` to process `me` on device `d` without checking the cap: memory the driver
    /// already holds for it (the cap was checked when it was asked for, or the driver took it on
    /// its own), which the ledger must count even if that puts the slice over its cap.
    pub fn charge(&self, me: u32, d: u32, bytes: u64) {
        let (Some(rec), Some(p)) = (self.dev(d), self.header().procs.get(me as usize)) else {
            return;
        };
        let Some(charge) = p.charged.get(d as usize) else {
            return;
        };
        let _g = self.lock_dev(rec, d as usize);
        charge.store(charge.load(Ordering::Relaxed) + bytes, Ordering::Relaxed);
        let after = rec.used.load(Ordering::Relaxed).saturating_add(bytes);
        rec.used.store(after, Ordering::Relaxed);
        if after > rec.peak.load(Ordering::Relaxed) {
            rec.peak.store(after, Ordering::Relaxed);
        }
    }

    /// Gives back `bytes` process `me` held on device `d`, and wakes the allocations waiting
    /// for the slice's frees there, if any.
    pub fn release(&self, me: u32, d: u32, bytes: u64) {
        let (Some(rec), Some(p)) = (self.dev(d), self.header().procs.get(me as usize)) else {
            return;
        };
        let Some(charge) = p.charged.get(d as usize) else {
            return;
        };
        let waiters = {
            let _g = self.lock_dev(rec, d as usize);
            let n = bytes.min(charge.load(Ordering::Relaxed));
            charge.store(charge.load(Ordering::Relaxed) - n, Ordering::Relaxed);
            rec.used.store(
                rec.used.load(Ordering::Relaxed).saturating_sub(n),
                Ordering::Relaxed,
            );
            // Read under the lock: a waiter queues itself under it before it sleeps, so either
            // it saw this free when it checked, or this free sees it here.
            rec.waiters.load(Ordering::Relaxed)
        };
        if waiters > 0 {
            wake_all(&rec.wake);
        }
    }

    // ---- at the cap: waiting for the slice's frees, spilling to host memory ----------------

    /// Whether allocations wait on device `d` now: a newcomer that would go ahead of them
    /// queues behind them instead (first come, first served).
    pub fn queued(&self, d: u32) -> bool {
        self.dev(d)
            .is_some_and(|r| r.waiters.load(Ordering::Relaxed) > 0)
    }

    /// Queues an allocation of this process on device `d` to wait for the slice's frees.
    /// Returns its ticket, or None when `WAIT_SLOTS` allocations wait there already.
    pub fn wait_enter(&self, d: u32) -> Option<u64> {
        let rec = self.dev(d)?;
        let token = self.token.load(Ordering::Relaxed);
        let _g = self.lock_dev(rec, d as usize);
        self.clear_dead_waiters(rec);
        let e = rec
            .queue
            .iter()
            .find(|e| e.token.load(Ordering::Relaxed) == 0)?;
        let ticket = rec.wait_next.load(Ordering::Relaxed);
        rec.wait_next.store(ticket + 1, Ordering::Relaxed);
        e.ticket.store(ticket, Ordering::Relaxed);
        e.token.store(token, Ordering::Relaxed);
        rec.waiters.fetch_add(1, Ordering::Relaxed);
        Some(ticket)
    }

    /// The waiting allocation `ticket` of process `me` on device `d` tries to reserve `bytes`:
    /// only when no live allocation queued before it still waits, and the bytes fit. On success
    /// it leaves the queue (and the next one is woken to try). Otherwise the futex value to
    /// sleep on with `wait_sleep` (read under the lock, so a free after it changes it).
    pub fn wait_try(&self, me: u32, d: u32, bytes: u64, ticket: u64) -> Result<(), u32> {
        let (Some(rec), Some(p)) = (self.dev(d), self.header().procs.get(me as usize)) else {
            return Err(0);
        };
        let Some(charge) = p.charged.get(d as usize) else {
            return Err(0);
        };
        let token = self.token.load(Ordering::Relaxed);
        let more = {
            let _g = self.lock_dev(rec, d as usize);
            self.clear_dead_waiters(rec);
            let seq = rec.wake.load(Ordering::Relaxed);
            let ahead = rec.queue.iter().any(|e| {
                let t = e.token.load(Ordering::Relaxed);
                t != 0 && e.ticket.load(Ordering::Relaxed) < ticket
            });
            let used = rec.used.load(Ordering::Relaxed);
            let after = used.saturating_add(bytes);
            if ahead || after > rec.limit.load(Ordering::Relaxed) {
                return Err(seq);
            }
            charge.store(charge.load(Ordering::Relaxed) + bytes, Ordering::Relaxed);
            rec.used.store(after, Ordering::Relaxed);
            if after > rec.peak.load(Ordering::Relaxed) {
                rec.peak.store(after, Ordering::Relaxed);
            }
            self.leave_locked(rec, token, ticket)
        };
        if more {
            wake_all(&rec.wake);
        }
        Ok(())
    }

    /// The waiting allocation `ticket` gives up (its time is out): it leaves the queue, and the
    /// ones behind it are woken (one of them may now be first).
    pub fn wait_leave(&self, d: u32, ticket: u64) {
        let Some(rec) = self.dev(d) else { return };
        let token = self.token.load(Ordering::Relaxed);
        let more = {
            let _g = self.lock_dev(rec, d as usize);
            self.leave_locked(rec, token, ticket)
        };
        if more {
            wake_all(&rec.wake);
        }
    }

    /// Sleeps until a free on device `d` changes its futex word from `seq`, or `timeout`
    /// passes. Holds no lock.
    pub fn wait_sleep(&self, d: u32, seq: u32, timeout: std::time::Duration) {
        if let Some(rec) = self.dev(d) {
            futex_wait(&rec.wake, seq, timeout);
        }
    }

    /// Takes the entry (`token`, `ticket`) out of the queue; whether others still wait. Under
    /// the device's lock.
    fn leave_locked(&self, rec: &DeviceRec, token: u32, ticket: u64) -> bool {
        for e in rec.queue.iter() {
            if e.token.load(Ordering::Relaxed) == token
                && e.ticket.load(Ordering::Relaxed) == ticket
            {
                e.token.store(0, Ordering::Relaxed);
                let _ = rec
                    .waiters
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| w.checked_sub(1));
                break;
            }
        }
        rec.waiters.load(Ordering::Relaxed) > 0
    }

    /// Clears the queue entries of processes that died waiting. Under the device's lock.
    fn clear_dead_waiters(&self, rec: &DeviceRec) {
        if rec.waiters.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mine = self.token.load(Ordering::Relaxed);
        let my_slot = self.me.load(Ordering::Relaxed);
        let mut live = 0;
        for e in rec.queue.iter() {
            let t = e.token.load(Ordering::Relaxed);
            if t == 0 {
                continue;
            }
            // An entry of this process's slot under another registration is a dead process's
            // whose slot this one took since.
            let stale = t != mine && token_owner(t).is_some_and(|(slot, _)| slot == my_slot);
            if stale || self.owner_dead(t) {
                e.token.store(0, Ordering::Relaxed);
            } else {
                live += 1;
            }
        }
        rec.waiters.store(live, Ordering::Relaxed);
    }

    /// Records the slice's spill on device `d` (bytes it may hold in host memory past its cap),
    /// unless a process of the slice recorded one already. Returns the slice's.
    pub fn set_spill_limit(&self, d: u32, bytes: u64) -> u64 {
        let Some(rec) = self.dev(d) else { return 0 };
        match rec.spill_limit.compare_exchange(
            LIMIT_UNSET,
            bytes,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => bytes,
            Err(recorded) => recorded,
        }
    }

    /// Checks and reserves `bytes` of spill for process `me` on device `d` in one step.
    pub fn reserve_spill(&self, me: u32, d: u32, bytes: u64) -> Result<(), OverCap> {
        let (Some(rec), Some(p)) = (self.dev(d), self.header().procs.get(me as usize)) else {
            return Err(OverCap { used: 0, limit: 0 });
        };
        let Some(charge) = p.spilled.get(d as usize) else {
            return Err(OverCap { used: 0, limit: 0 });
        };
        let _g = self.lock_dev(rec, d as usize);
        let used = rec.spilled.load(Ordering::Relaxed);
        let limit = match rec.spill_limit.load(Ordering::Relaxed) {
            LIMIT_UNSET => 0,
            l => l,
        };
        let after = used.saturating_add(bytes);
        if after > limit {
            return Err(OverCap { used, limit });
        }
        charge.store(charge.load(Ordering::Relaxed) + bytes, Ordering::Relaxed);
        rec.spilled.store(after, Ordering::Relaxed);
        if after > rec.spill_peak.load(Ordering::Relaxed) {
            rec.spill_peak.store(after, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Gives back `bytes` of spill process `me` held on device `d`.
    pub fn release_spill(&self, me: u32, d: u32, bytes: u64) {
        let (Some(rec), Some(p)) = (self.dev(d), self.header().procs.get(me as usize)) else {
            return;
        };
        let Some(charge) = p.spilled.get(d as usize) else {
            return;
        };
        let _g = self.lock_dev(rec, d as usize);
        let n = bytes.min(charge.load(Ordering::Relaxed));
        charge.store(charge.load(Ordering::Relaxed) - n, Ordering::Relaxed);
        rec.spilled.store(
            rec.spilled.load(Ordering::Relaxed).saturating_sub(n),
            Ordering::Relaxed,
        );
    }

    /// What the whole slice holds in host memory past its cap on device `d`.
    pub fn spilled(&self, d: u32) -> u64 {
        self.dev(d).map_or(0, |r| r.spilled.load(Ordering::Relaxed))
    }

    pub fn note_refusal(&self, d: u32) {
        if let Some(rec) = self.dev(d) {
            rec.refusals.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn slice_id(&self) -> u64 {
        self.header().slice_id
    }

    /// The slice's compute tokens on device `d` (see `compute`).
    pub fn tokens(&self, d: u32) -> Option<Tokens<'_>> {
        self.dev(d).map(|r| Tokens {
            tokens: &r.tokens,
            last_refill: &r.last_refill,
            share: &r.share,
        })
    }

    /// What the whole slice holds on device `d`.
    pub fn used(&self, d: u32) -> u64 {
        self.dev(d).map_or(0, |r| r.used.load(Ordering::Relaxed))
    }

    /// The slice's cap on device `d`, if any.
    pub fn limit(&self, d: u32) -> Option<u64> {
        self.dev(d)
            .map(|r| r.limit.load(Ordering::Relaxed))
            .filter(|l| *l != LIMIT_UNSET)
    }

    /// What process slot `s` holds on device `d`.
    pub fn charged(&self, s: u32, d: u32) -> u64 {
        self.header()
            .procs
            .get(s as usize)
            .and_then(|p| p.charged.get(d as usize))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// The device index for `uuid`, if some process of the slice registered it.
    pub fn find(&self, uuid: &[u8; 16]) -> Option<u32> {
        self.header()
            .devices
            .iter()
            .position(|d| d.state.load(Ordering::Acquire) == LIVE && d.has_uuid(uuid))
            .map(|i| i as u32)
    }

    /// The last context overhead measured on device `d` by any process of the slice.
    pub fn context_overhead(&self, d: u32) -> u64 {
        self.dev(d)
            .map_or(0, |r| r.context_overhead.load(Ordering::Relaxed))
    }

    /// Held while a process measures the slice's first context on device `d` (nothing is known
    /// to reserve for it yet), so racing first contexts are measured one at a time and the others
    /// reserve the measured figure. A holder killed mid-measurement passes the lock on.
    pub fn measuring(&self, d: u32) -> Option<impl Drop + '_> {
        let rec = self.dev(d)?;
        // Nothing to repair after a dead holder: the overhead is written in one store.
        let token = self.token.load(Ordering::Relaxed);
        rec.measure.lock(token, |owner| self.owner_dead(owner));
        Some(MeasureGuard { rec })
    }

    pub fn set_context_overhead(&self, d: u32, bytes: u64) {
        if let Some(r) = self.dev(d) {
            r.context_overhead.store(bytes, Ordering::Relaxed);
        }
    }

    /// Process ids of the slice's processes: the live ones, and those that have exited while
    /// the device still holds their memory.
    pub fn pids(&self) -> Vec<i32> {
        self.slots()
            .iter()
            .filter(|p| p.state.load(Ordering::Acquire) == LIVE)
            .map(|p| p.pid.load(Ordering::Relaxed))
            .collect()
    }

    /// Process slot `s`'s pid in the host's pid namespace, if the agent or a node tool told it.
    pub fn host_pid(&self, s: u32) -> Option<i32> {
        self.header()
            .procs
            .get(s as usize)
            .map(|p| p.host_pid.load(Ordering::Relaxed))
            .filter(|&p| p > 0)
    }

    /// Records slot `s`'s host pid, as the node agent told the process itself (SO_PEERCRED;
    /// docs/agent.md). Only the process in the slot calls this, for its own slot.
    pub fn set_host_pid(&self, s: u32, pid: i32) {
        if let Some(p) = self.header().procs.get(s as usize)
            && pid > 0
        {
            p.host_pid.store(pid, Ordering::Relaxed);
        }
    }

    /// The slice's processes as in `pids`, each with its host pid where it is known.
    pub fn pids_with_host(&self) -> Vec<(i32, Option<i32>)> {
        self.slots()
            .iter()
            .filter(|p| p.state.load(Ordering::Acquire) == LIVE)
            .map(|p| {
                let host = p.host_pid.load(Ordering::Relaxed);
                (p.pid.load(Ordering::Relaxed), (host > 0).then_some(host))
            })
            .collect()
    }

    /// Tells the processes of the ledger at `path` their host pids: `host(pid)` maps a pid as a
    /// process sees itself to the host's (None: unknown). For the node tools, which see both.
    /// A slot taken by a new process meanwhile is left alone.
    pub fn tell_host_pids(
        path: &Path,
        host: &dyn Fn(i32) -> Option<i32>,
    ) -> Result<(), LedgerError> {
        // A copy to read and `pwrite` to write, as in `set_live`: nothing the slice does to its
        // file can harm or hold up the node's tools.
        let (f, version) = open_checked(path, true)?;
        if version == PREVIOUS {
            return v6::tell_host_pids(&f, path, host);
        }
        let mut copy = zeroed_header();
        read_copy(&f, &mut copy);
        let io = |err| LedgerError::Io {
            path: path.to_path_buf(),
            err,
        };
        for (s, p) in copy.procs.iter().enumerate() {
            let generation = p.generation.load(Ordering::Relaxed);
            if p.state.load(Ordering::Relaxed) != LIVE {
                continue;
            }
            let Some(h) = host(p.pid.load(Ordering::Relaxed)) else {
                continue;
            };
            if p.host_pid.load(Ordering::Relaxed) == h {
                continue;
            }
            write_at(&f, proc_at!(s, host_pid), &h.to_ne_bytes()).map_err(io)?;
            if read_u32(&f, proc_at!(s, generation) as u64) != Some(generation) {
                // Re-registered while we wrote: whatever we wrote is not its pid.
                write_at(&f, proc_at!(s, host_pid), &0i32.to_ne_bytes()).map_err(io)?;
            }
        }
        Ok(())
    }

    /// Records process slot `s`'s share of device `d` in its meter's last period (ppm), at
    /// `now_ns`, and returns the slice's: the sum over its processes that reported within
    /// `fresh_ns` (a process that died or stopped reporting drops out of it).
    pub fn note_usage(&self, s: u32, d: u32, usage: u32, now_ns: u64, fresh_ns: u64) -> u32 {
        let procs = &self.header().procs;
        if let Some(p) = procs.get(s as usize)
            && let Some(u) = p.usage.get(d as usize)
        {
            u.store(usage, Ordering::Relaxed);
            p.beat_ns.store(now_ns, Ordering::Relaxed);
        }
        let mut sum = 0u32;
        for (i, p) in self.slots().iter().enumerate() {
            if p.state.load(Ordering::Acquire) != LIVE {
                continue;
            }
            let beat = p.beat_ns.load(Ordering::Relaxed);
            if i as u32 != s && beat.saturating_add(fresh_ns) < now_ns {
                continue;
            }
            let u = p
                .usage
                .get(d as usize)
                .map_or(0, |u| u.load(Ordering::Relaxed));
            sum = sum.saturating_add(u);
        }
        sum.min(cuslice_policy::share::FULL)
    }

    /// Records the core request and limit (ppm) the slice runs with on device `d`.
    pub fn set_core(&self, d: u32, request: u32, limit: u32) {
        if let Some(r) = self.dev(d) {
            r.core_request.store(request, Ordering::Relaxed);
            r.core_limit.store(limit, Ordering::Relaxed);
        }
    }

    /// Records the priority (`Priority::code`) the slice runs with on device `d`, unless the
    /// node changed it while the slice ran.
    pub fn set_priority(&self, d: u32, code: u32) {
        if let Some(r) = self.dev(d)
            && r.live.load(Ordering::Relaxed) & LIVE_PRIORITY == 0
        {
            r.priority.store(code, Ordering::Relaxed);
        }
    }

    /// The priority (`Priority::code`) on device `d` if the node changed it while the slice ran
    /// (`cuslice set --priority`): then it wins over a process's own configuration.
    pub fn live_priority(&self, d: u32) -> Option<u32> {
        let r = self.dev(d)?;
        (r.live.load(Ordering::Relaxed) & LIVE_PRIORITY != 0)
            .then(|| r.priority.load(Ordering::Relaxed))
    }

    /// The core request and limit (ppm) the slice runs with on device `d` now.
    pub fn core(&self, d: u32) -> Option<(u32, u32)> {
        self.dev(d).map(|r| {
            (
                r.core_request.load(Ordering::Relaxed),
                r.core_limit.load(Ordering::Relaxed),
            )
        })
    }

    /// The core request and limit (ppm) on device `d` if the node changed them while the slice
    /// ran (`cuslice set`): then they win over a joining process's own configuration.
    pub fn live_core(&self, d: u32) -> Option<(u32, u32)> {
        let r = self.dev(d)?;
        (r.live.load(Ordering::Relaxed) & LIVE_CORE != 0).then(|| {
            (
                r.core_request.load(Ordering::Relaxed),
                r.core_limit.load(Ordering::Relaxed),
            )
        })
    }

    /// The node side of `cuslice set`: writes `change` into the record of device `uuid` in the
    /// ledger at `path`, for the slice's processes to use at their next allocation (the cap) or
    /// meter period (the core request and limit). Nothing is freed: a cap below what the slice
    /// holds refuses allocations until it is under it. Err(NoDevice) when no process of the
    /// slice has used the device yet.
    pub fn set_live(path: &Path, uuid: &[u8; 16], change: &LiveChange) -> Result<(), LedgerError> {
        // Written with `pwrite` into the file, never through a mapping, and without the device's
        // lock: the slice's processes may have truncated the file or hold its locks, and the
        // node's tool must neither die nor wait for them. Each field is one aligned word.
        let (f, version) = open_checked(path, true)?;
        if version == PREVIOUS {
            return v6::set_live(&f, path, uuid, change);
        }
        let mut copy = zeroed_header();
        read_copy(&f, &mut copy);
        let d = copy
            .devices
            .iter()
            .position(|r| r.state.load(Ordering::Relaxed) == LIVE && r.has_uuid(uuid))
            .ok_or_else(|| LedgerError::NoDevice {
                path: path.to_path_buf(),
                uuid: crate::uuid_string(uuid),
            })?;
        let mut live = copy.devices[d].live.load(Ordering::Relaxed);
        let io = |err| LedgerError::Io {
            path: path.to_path_buf(),
            err,
        };
        if let Some(bytes) = change.memory {
            write_at(&f, dev_at!(d, limit), &bytes.to_ne_bytes()).map_err(io)?;
            live |= LIVE_MEMORY;
        }
        if let Some((request, limit)) = change.core {
            write_at(&f, dev_at!(d, core_request), &request.to_ne_bytes()).map_err(io)?;
            write_at(&f, dev_at!(d, core_limit), &limit.to_ne_bytes()).map_err(io)?;
            live |= LIVE_CORE;
        }
        if let Some(code) = change.priority {
            write_at(&f, dev_at!(d, priority), &code.to_ne_bytes()).map_err(io)?;
            live |= LIVE_PRIORITY;
        }
        // Last: a process that sees the bit finds the values in place.
        write_at(&f, dev_at!(d, live), &live.to_ne_bytes()).map_err(io)?;
        Ok(())
    }

    /// A meter's report for one period: `ns` more device time used by this process on device
    /// `d` (`estimated`: from launch estimates, NVML did not report the process), at `now_ns`
    /// (CLOCK_MONOTONIC). The first report of each second takes that second's mark, under the
    /// device's lock and a sequence count that readers check (a seqlock), so a reader never
    /// mixes two marks and a writer killed mid-mark leaves nothing a reader would trust.
    pub fn note_device_time(&self, d: u32, ns: u64, estimated: bool, now_ns: u64) {
        let Some(r) = self.dev(d) else { return };
        if ns > 0 {
            r.estimated.store(u32::from(estimated), Ordering::Relaxed);
        }
        r.device_ns.fetch_add(ns, Ordering::Relaxed);
        r.metered_ns.store(now_ns, Ordering::Relaxed);
        let second = now_ns / 1_000_000_000;
        let m = &r.marks[(second % MARKS as u64) as usize];
        let current = |m: &Mark| {
            let at = m.at_ns.load(Ordering::Relaxed);
            at != 0 && at / 1_000_000_000 == second
        };
        if current(m) {
            return;
        }
        let _g = self.lock_dev(r, d as usize);
        if current(m) {
            return;
        }
        // Odd while writing (a writer killed here left it odd already: the same).
        let seq = r.marks_seq.load(Ordering::Relaxed) | 1;
        r.marks_seq.store(seq, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        m.at_ns.store(now_ns, Ordering::Relaxed);
        m.device_ns
            .store(r.device_ns.load(Ordering::Relaxed), Ordering::Relaxed);
        m.throttled_ns
            .store(r.throttled_ns.load(Ordering::Relaxed), Ordering::Relaxed);
        r.marks_seq.store(seq + 1, Ordering::Release);
    }

    /// Adds `ns` of time a launching thread was held back on device `d`.
    pub fn note_throttled(&self, d: u32, ns: u64) {
        if let Some(r) = self.dev(d) {
            r.throttled_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// What the ledger holds now, copied out.
    pub fn snapshot(&self) -> Snapshot {
        snapshot_of(self.header(), |s| self.alive(s))
    }

    /// In a forked child: the descriptor and the mapping (and with them the parent's liveness
    /// lock: a mapping holds the open file, whose lock lives until the last reference goes) must
    /// go; the child registers afresh through a new `Ledger`. Nothing may use this one after.
    pub fn forget_in_child(&mut self) {
        if let Some(f) = self.file.take() {
            // SAFETY: closing our own descriptor; async-signal-safe, allowed after fork.
            unsafe { libc::close(std::os::fd::IntoRawFd::into_raw_fd(f)) };
            // SAFETY: unmapping our own mapping, which the caller no longer uses (the child's
            // slice is leaked and never read again); `len` 0 makes the later drop a no-op.
            unsafe { libc::munmap(self.map.cast(), self.len) };
            self.len = 0;
        }
    }
}

/// Wakes every thread sleeping on the futex word `w` (in any process: the word is in a shared
/// mapping, so no FUTEX_PRIVATE_FLAG), after moving it on so that one about to sleep does not.
fn wake_all(w: &AtomicU32) {
    w.fetch_add(1, Ordering::Release);
    // SAFETY: FUTEX_WAKE on the address of a live atomic in our mapping; it reads nothing else.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

/// Sleeps while the futex word `w` still holds `seq`, for at most `timeout` (a signal, a
/// spurious wake-up or a changed word end it early: the caller looks again).
fn futex_wait(w: &AtomicU32, seq: u32, timeout: std::time::Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on the address of a live atomic in our mapping, with a relative
    // timeout that lives across the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAIT,
            seq,
            &ts as *const libc::timespec,
        )
    };
}

fn uuid_of(rec: &DeviceRec) -> [u8; 16] {
    let mut u = [0u8; 16];
    let (a, b) = u.split_at_mut(8);
    a.copy_from_slice(&rec.uuid[0].load(Ordering::Relaxed).to_be_bytes());
    b.copy_from_slice(&rec.uuid[1].load(Ordering::Relaxed).to_be_bytes());
    u
}

/// What ledger `h` holds, copied out; `alive(slot)` says whether a process slot's process lives.
fn snapshot_of(h: &Header, alive: impl Fn(usize) -> bool) -> Snapshot {
    let devices: Vec<(usize, DeviceSnapshot)> = h
        .devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.state.load(Ordering::Acquire) == LIVE)
        .map(|(i, d)| (i, device_snapshot(uuid_of(d), d)))
        .collect();
    let procs = h
        .procs
        .iter()
        .enumerate()
        .filter(|(_, p)| p.state.load(Ordering::Acquire) == LIVE)
        .map(|(s, p)| ProcSnapshot {
            pid: p.pid.load(Ordering::Relaxed),
            host_pid: Some(p.host_pid.load(Ordering::Relaxed)).filter(|&h| h > 0),
            alive: alive(s),
            charged: devices
                .iter()
                .map(|(i, _)| p.charged.get(*i).map_or(0, |c| c.load(Ordering::Relaxed)))
                .collect(),
            spilled: devices
                .iter()
                .map(|(i, _)| p.spilled.get(*i).map_or(0, |c| c.load(Ordering::Relaxed)))
                .collect(),
        })
        .collect();
    Snapshot {
        version: VERSION,
        slice_id: h.slice_id,
        devices: devices.into_iter().map(|(_, d)| d).collect(),
        procs,
    }
}

/// Checks that `f` (opened from `path`) is a whole ledger of this version, or with `previous`
/// of the previous one too: its header, and its size as the header says. Returns its version.
fn validate(f: &File, path: &Path, previous: bool) -> Result<u32, LedgerError> {
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

impl Drop for Ledger {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmapping our own mapping; nothing borrowed from it outlives `self`.
            unsafe { libc::munmap(self.map.cast(), self.len) };
        }
    }
}

/// A ledger opened for reading by the node's tools (the agent reads every slice's every period).
/// It is read with `pread` into a copy, never mapped: a container can write its own ledger, and
/// could truncate it under a mapping (whose reader would then die of SIGBUS) or hold its locks;
/// a copy is neither. A ledger cut short reads as zeros past its end.
pub struct ReadOnly {
    file: File,
    path: PathBuf,
    copy: parking_lot::Mutex<Copy>,
}

/// The copy a `ReadOnly` reads into, in its file's format.
enum Copy {
    Current(Box<Header>),
    Previous(Box<v6::Header>),
}

/// Opens a ledger a tenant may have tampered with: a regular file only (never a FIFO, whose open
/// or read could wait, nor a link), with its header checked: of this version or the previous
/// one (the node's tools read both). Returns it with its version.
fn open_checked(path: &Path, write: bool) -> Result<(File, u32), LedgerError> {
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
fn zeroed_header() -> Box<Header> {
    // SAFETY: every field of `Header` is an integer, an atomic integer or a lock word, for all of
    // which all-zero bytes are a valid value.
    unsafe { Box::<Header>::new_zeroed().assume_init() }
}

/// Reads the ledger in `f` into `copy` (zeros past what could be read).
fn read_copy(f: &File, copy: &mut Header) {
    read_range(f, copy, 0, size());
}

/// Reads the ledger in `f` into `copy`: the header and the device records, then the process
/// slots that were ever taken (`procs_used`, as the header just read says). The slots past them
/// stay as they were in `copy`: zero, since no slot there was taken when it was read before.
fn read_copy_used(f: &File, copy: &mut Header) {
    let table = std::mem::offset_of!(Header, procs);
    read_range(f, copy, 0, table);
    let used = (copy.procs_used.load(Ordering::Relaxed) as usize).min(MAX_PROCS);
    read_range(
        f,
        copy,
        table,
        table + used * std::mem::size_of::<ProcRec>(),
    );
}

/// Reads bytes `from..to` of the ledger in `f` into the same bytes of `copy` (zeros past what
/// could be read).
fn read_range(f: &File, copy: &mut Header, from: usize, to: usize) {
    // SAFETY: `copy` is `size()` bytes we hold exclusively; any bytes are a valid `Header`.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut((copy as *mut Header).cast::<u8>(), size()) };
    read_bytes(f, bytes, from, to);
}

/// Reads bytes `from..to` of the file `f` into the same bytes of `bytes` (zeros past what could
/// be read).
fn read_bytes(f: &File, bytes: &mut [u8], from: usize, to: usize) {
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
        let copy = if version == PREVIOUS {
            Copy::Previous(v6::zeroed())
        } else {
            Copy::Current(zeroed_header())
        };
        Ok(ReadOnly {
            file,
            path: path.to_path_buf(),
            copy: parking_lot::Mutex::new(copy),
        })
    }

    /// What the ledger holds now, copied out (`Snapshot::version` says in which format it was).
    /// A device's history of marks is taken from a copy in which no writer was at work on it
    /// (read again, a few times at most, until so).
    pub fn snapshot(&self) -> Snapshot {
        let mut guard = self.copy.lock();
        let copy = match &mut *guard {
            Copy::Previous(copy) => return v6::snapshot(&self.file, copy),
            Copy::Current(copy) => copy,
        };
        for _ in 0..10 {
            read_copy_used(&self.file, copy);
            if self.marks_settled(copy) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let fd = self.file.as_raw_fd();
        snapshot_of(copy, |s| {
            liveness::held_by_other(fd, LIVENESS_BASE + s as i64)
        })
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

fn read_u64(f: &File, at: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    (f.read_at(&mut b, at).ok()? == 8).then(|| u64::from_ne_bytes(b))
}

fn read_u32(f: &File, at: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    (f.read_at(&mut b, at).ok()? == 4).then(|| u32::from_ne_bytes(b))
}

fn write_at(f: &File, at: usize, bytes: &[u8]) -> io::Result<()> {
    f.write_all_at(bytes, at as u64)
}

struct MeasureGuard<'a> {
    rec: &'a DeviceRec,
}

impl Drop for MeasureGuard<'_> {
    fn drop(&mut self) {
        self.rec.measure.unlock();
    }
}

struct DevGuard<'a> {
    rec: &'a DeviceRec,
}

impl Drop for DevGuard<'_> {
    fn drop(&mut self) {
        self.rec.lock.unlock();
    }
}

// ---- the device lock -------------------------------------------------------------------------

/// Tokens: the holder's slot + 1 in the low 11 bits, its registration's generation above.
const TOKENS: OwnerTokens = OwnerTokens::new(11);
const GEN_MASK: u32 = TOKENS.generation_mask();
/// The token of a process not registered yet: never taken for dead.
const UNKNOWN_OWNER: u32 = TOKENS.unknown();

const _: () = assert!(MAX_PROCS <= TOKENS.slots() as usize);

fn make_token(slot: u32, generation: u32) -> u32 {
    TOKENS.make(slot, generation)
}

/// (slot, generation) of a token; None for `UNKNOWN_OWNER`.
fn token_owner(token: u32) -> Option<(u32, u32)> {
    TOKENS.owner(token)
}

/// Copies device record `r` out, its marks read consistently (see `note_device_time`).
fn device_snapshot(uuid: [u8; 16], r: &DeviceRec) -> DeviceSnapshot {
    let mut marks = Vec::new();
    for _ in 0..100 {
        let s1 = r.marks_seq.load(Ordering::Acquire);
        marks.clear();
        for m in r.marks.iter() {
            let at = m.at_ns.load(Ordering::Relaxed);
            if at != 0 {
                marks.push(crate::snapshot::Mark {
                    at_ns: at,
                    device_ns: m.device_ns.load(Ordering::Relaxed),
                    throttled_ns: m.throttled_ns.load(Ordering::Relaxed),
                });
            }
        }
        std::sync::atomic::fence(Ordering::Acquire);
        if s1.is_multiple_of(2) && r.marks_seq.load(Ordering::Relaxed) == s1 {
            break;
        }
        // A writer is at work, or was killed at work: only the marks after it can be trusted
        // once it is done; until then there is no history to show.
        marks.clear();
        std::thread::yield_now();
    }
    marks.sort_by_key(|m| m.at_ns);
    let limit = r.limit.load(Ordering::Relaxed);
    let spill_limit = r.spill_limit.load(Ordering::Relaxed);
    DeviceSnapshot {
        uuid,
        limit: (limit != LIMIT_UNSET).then_some(limit),
        spill_limit: (spill_limit != LIMIT_UNSET).then_some(spill_limit),
        spilled: r.spilled.load(Ordering::Relaxed),
        spill_peak: r.spill_peak.load(Ordering::Relaxed),
        waiting: r.waiters.load(Ordering::Relaxed),
        used: r.used.load(Ordering::Relaxed),
        peak: r.peak.load(Ordering::Relaxed),
        refusals: r.refusals.load(Ordering::Relaxed),
        context_overhead: r.context_overhead.load(Ordering::Relaxed),
        core_request: r.core_request.load(Ordering::Relaxed),
        core_limit: r.core_limit.load(Ordering::Relaxed),
        priority: r.priority.load(Ordering::Relaxed),
        live: r.live.load(Ordering::Relaxed),
        allotted: r.share.load(Ordering::Relaxed),
        device_ns: r.device_ns.load(Ordering::Relaxed),
        throttled_ns: r.throttled_ns.load(Ordering::Relaxed),
        estimated: r.estimated.load(Ordering::Relaxed) != 0,
        metered_ns: r.metered_ns.load(Ordering::Relaxed),
        marks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const UUID: [u8; 16] = [7; 16];
    const CHUNK: u64 = 4096;

    /// A "process" of the slice in `dir`: its own open file description (liveness lock) and slot.
    fn join(dir: &Path, cap: Option<u64>) -> (Ledger, u32, u32) {
        let l = Ledger::open_dir(dir).unwrap();
        let me = l.register().unwrap();
        let (d, _) = l.device(UUID, cap).unwrap();
        (l, me, d)
    }

    fn charged_sum(l: &Ledger, d: u32) -> u64 {
        (0..MAX_PROCS as u32).map(|s| l.charged(s, d)).sum()
    }

    #[test]
    fn a_ledger_made_by_create_file_works_like_one_made_by_open_dir() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let made = tempfile::tempdir().unwrap();
        let path = made.path().join(FILE_NAME);
        Ledger::create_file(&path, 0o666).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), size() as u64);
        // Whatever the umask, every user of the container may update it.
        assert_eq!(meta.permissions().mode() & 0o777, 0o666);
        // The process table is a hole until processes take slots.
        assert!(
            meta.blocks() * 512 < size() as u64,
            "{} blocks",
            meta.blocks()
        );
        let formatted = tempfile::tempdir().unwrap();
        let other = Ledger::open_dir(formatted.path()).unwrap();
        let fresh = |mut s: Snapshot| {
            s.slice_id = 0;
            s
        };
        assert_eq!(fresh(Ledger::read(&path).unwrap()), fresh(other.snapshot()));
        // Processes of the slice share it: the locks, the cap and the accounts all work.
        let (a, me_a, d) = join(made.path(), Some(2 * CHUNK));
        let (b, me_b, _) = join(made.path(), Some(2 * CHUNK));
        a.reserve(me_a, d, CHUNK).unwrap();
        b.reserve(me_b, d, CHUNK).unwrap();
        assert!(b.reserve(me_b, d, 1).is_err());
        assert_eq!(Ledger::read(&path).unwrap().devices[0].used, 2 * CHUNK);
        // It is never made over an existing file.
        let err = Ledger::create_file(&path, 0o666).unwrap_err();
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        assert_eq!(Ledger::read(&path).unwrap().devices[0].used, 2 * CHUNK);
    }

    #[test]
    fn tokens_name_their_slot_and_generation() {
        for (slot, generation) in [(0, 1), (1023, 5), (17, GEN_MASK), (3, GEN_MASK + 2)] {
            let t = make_token(slot, generation);
            assert_eq!(token_owner(t), Some((slot, generation & GEN_MASK)));
        }
        assert_eq!(token_owner(UNKNOWN_OWNER), None);
        assert_eq!(token_owner(0), None);
    }

    #[test]
    fn racing_processes_fill_the_cap_exactly_and_give_it_all_back() {
        let dir = tempfile::tempdir().unwrap();
        let cap = 1000 * CHUNK;
        let procs: Vec<_> = (0..4)
            .map(|_| Arc::new(join(dir.path(), Some(cap))))
            .collect();
        // 4 processes x 4 threads reserve a chunk at a time until refused, all at once.
        let mut handles = Vec::new();
        for p in &procs {
            for _ in 0..4 {
                let p = Arc::clone(p);
                handles.push(std::thread::spawn(move || {
                    let (l, me, d) = &*p;
                    let mut got = 0u64;
                    while l.reserve(*me, *d, CHUNK).is_ok() {
                        assert!(l.used(*d) <= cap, "the slice went over its cap");
                        got += 1;
                    }
                    got
                }));
            }
        }
        let got: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let (l, _, d) = &*procs[0];
        // Not a byte over, and no refusal while a chunk still fitted.
        assert_eq!(got.iter().sum::<u64>(), 1000, "{got:?}");
        assert_eq!(l.used(*d), cap);
        assert_eq!(charged_sum(l, *d), cap);
        // Everything given back from the same threads' processes, all at once.
        let mut handles = Vec::new();
        for (i, p) in procs.iter().enumerate() {
            let mine: u64 = got[i * 4..i * 4 + 4].iter().sum();
            let p = Arc::clone(p);
            handles.push(std::thread::spawn(move || {
                let (l, me, d) = &*p;
                for _ in 0..mine {
                    l.release(*me, *d, CHUNK);
                }
            }));
        }
        handles.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(l.used(*d), 0);
        assert_eq!(charged_sum(l, *d), 0);
    }

    #[test]
    fn a_process_that_dies_holding_the_device_lock_does_not_block_the_slice() {
        let dir = tempfile::tempdir().unwrap();
        let cap = 100 * CHUNK;
        let (mut dead, dead_me, d) = join(dir.path(), Some(cap));
        let (live, live_me, _) = join(dir.path(), None);
        dead.reserve(dead_me, d, 10 * CHUNK).unwrap();
        live.reserve(live_me, d, 5 * CHUNK).unwrap();
        // The process is "killed" inside the lock, half-way through an update: it charged
        // itself 3 more chunks but never added them to the slice's total.
        let rec = dead.dev(d).unwrap();
        let token = dead.token.load(Ordering::Relaxed);
        assert!(matches!(rec.lock.lock(token, |_| false), Locked::Clean));
        let c = &dead.header().procs[dead_me as usize].charged[d as usize];
        c.store(c.load(Ordering::Relaxed) + 3 * CHUNK, Ordering::Relaxed);
        // Its liveness lock goes with its descriptor and its mapping, as at exit.
        dead.forget_in_child();
        // The next process to need the lock takes it over and recounts from the charges.
        live.reserve(live_me, d, CHUNK).unwrap();
        assert_eq!(live.used(d), 19 * CHUNK);
        assert_eq!(charged_sum(&live, d), 19 * CHUNK);
        // And the lock works as before afterwards.
        live.release(live_me, d, 6 * CHUNK);
        assert_eq!(live.used(d), 13 * CHUNK);
    }

    #[test]
    fn a_forked_child_does_not_keep_its_parent_looking_alive() {
        let dir = tempfile::tempdir().unwrap();
        let (mut parent, parent_me, _) = join(dir.path(), None);
        let (other, _, _) = join(dir.path(), None);
        assert!(other.alive(parent_me as usize));
        // What a child does with the parent's ledger it inherited (and then leaks): afterwards
        // nothing of it refers to the parent's open file.
        parent.forget_in_child();
        assert!(!other.alive(parent_me as usize));
    }

    #[test]
    fn a_slow_holder_is_waited_for_not_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let (a, _, d) = join(dir.path(), Some(100 * CHUNK));
        let (b, b_me, _) = join(dir.path(), None);
        let rec = a.dev(d).unwrap();
        let token = a.token.load(Ordering::Relaxed);
        assert!(matches!(rec.lock.lock(token, |_| false), Locked::Clean));
        let b = Arc::new(b);
        let waiter = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || b.reserve(b_me, d, CHUNK).is_ok())
        };
        // Longer than a waiter's liveness check: the holder is alive, so it must wait.
        std::thread::sleep(std::time::Duration::from_millis(3 * 20 + 20));
        assert!(!waiter.is_finished(), "a live holder's lock was taken over");
        rec.lock.unlock();
        assert!(waiter.join().unwrap());
        assert_eq!(b.used(d), CHUNK);
    }

    #[test]
    fn a_process_that_dies_holding_the_table_lock_does_not_block_the_slice() {
        let dir = tempfile::tempdir().unwrap();
        let (mut dead, _, _) = join(dir.path(), None);
        std::mem::forget(dead.lock_table());
        // Its lock goes with its descriptor and its mapping, as at exit.
        dead.forget_in_child();
        let start = std::time::Instant::now();
        let (live, me, d) = join(dir.path(), None);
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
        live.reserve(me, d, CHUNK).unwrap();
        assert_eq!(live.used(d), CHUNK);
    }

    #[test]
    fn a_live_holder_of_the_table_lock_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let (a, _, _) = join(dir.path(), None);
        let g = a.lock_table();
        let path = dir.path().to_path_buf();
        let joining = std::thread::spawn(move || join(&path, None).1);
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            !joining.is_finished(),
            "registered while another held the table lock"
        );
        drop(g);
        joining.join().unwrap();
    }

    #[test]
    fn a_process_that_dies_measuring_passes_the_measuring_lock_on() {
        let dir = tempfile::tempdir().unwrap();
        let (mut dead, _, d) = join(dir.path(), Some(100 * CHUNK));
        let (live, _, _) = join(dir.path(), None);
        std::mem::forget(dead.measuring(d).unwrap());
        let waiter = {
            let path = dir.path().to_path_buf();
            std::thread::spawn(move || {
                let (other, _, d) = join(&path, None);
                let started = std::time::Instant::now();
                drop(other.measuring(d).unwrap());
                started.elapsed()
            })
        };
        // A live holder is waited for...
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!waiter.is_finished(), "a live measurer's lock was taken");
        // ...a dead one is not.
        dead.forget_in_child();
        let waited = waiter.join().unwrap();
        assert!(waited < std::time::Duration::from_secs(2), "{waited:?}");
        drop(live.measuring(d).unwrap());
    }
}
