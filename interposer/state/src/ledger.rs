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
//!
//! This file holds the layout and the memory accounting (joining, sweeping the dead, reserving,
//! charging, releasing, the queries on them): one concern, kept together because every part
//! reads the same records under the same locks. Apart from it: opening and checking a ledger
//! (`open`), allocations at the cap (`at_cap`), the compute figures and live limits (`compute`),
//! the tools' reader (`read_only`, which reads the previous release's format too) and snapshots
//! (`view`).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

use cuslice_shm::{ByteLock, Locked, OwnerLock, OwnerTokens, liveness};

use crate::snapshot::{DeviceSnapshot, MeteredBy, ProcSnapshot, Snapshot};

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
/// 8: when each process was frozen to the host (`ProcRec::frozen_ns`), so that the node's tools
/// show frozen bytes apart from those on the device.
pub const VERSION: u32 = 8;
/// The previous version, which the node's tools still read and change (`read`, `set_live`,
/// `tell_host_pids`): the slices the previous release started keep writing it after an upgrade
/// (docs/upgrades.md). The library itself joins only `VERSION`. Its layout is this one's with
/// a process record one word shorter (no `frozen_ns`, which is the record's last word).
pub const PREVIOUS: u32 = 7;

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
    /// What the last device time reported was measured by (`MeteredBy::code`: 3 turns; earlier
    /// meters wrote 0 the driver's samples, 1 launch estimates, 2 the library's own timing).
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
    /// When the process was frozen to the host (`CUSLICE_MEMORY_FREEZE_IDLE`: its device memory
    /// is in its host memory, through the driver's checkpoint; CLOCK_MONOTONIC ns), 0 while it is
    /// not. What it has charged stays charged (its cap is unchanged). The last word: version 7's
    /// record is this one without it.
    frozen_ns: AtomicU64,
}

/// A version-7 process record's size: this version's without `frozen_ns`.
const PREVIOUS_PROC_SIZE: usize = std::mem::offset_of!(ProcRec, frozen_ns);
const _: () = assert!(PREVIOUS_PROC_SIZE + 8 == std::mem::size_of::<ProcRec>());
// Version 7's sizes on x86_64 and aarch64 (what its files measure).
const _: () = assert!(PREVIOUS_PROC_SIZE == 1304);

/// The size of a process record in a ledger file of `version` (this one or the previous).
fn proc_size(version: u32) -> usize {
    if version == PREVIOUS {
        PREVIOUS_PROC_SIZE
    } else {
        std::mem::size_of::<ProcRec>()
    }
}

/// Where field `field` (its offset in `ProcRec`, before `frozen_ns`) of process record `s` lies
/// in a ledger file of `version`.
fn proc_field_at(version: u32, s: usize, field: usize) -> usize {
    std::mem::offset_of!(Header, procs) + s * proc_size(version) + field
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
        PREVIOUS => {
            Some((std::mem::offset_of!(Header, procs) + MAX_PROCS * PREVIOUS_PROC_SIZE) as u64)
        }
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
            p.frozen_ns.store(0, Ordering::Relaxed);
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

    /// Records that process slot `s` was frozen to the host at `at_ns` (CLOCK_MONOTONIC), or,
    /// with 0, that it is back on the device. Its charges stay as they are.
    pub fn set_frozen(&self, s: u32, at_ns: u64) {
        if let Some(p) = self.header().procs.get(s as usize) {
            p.frozen_ns.store(at_ns, Ordering::Relaxed);
        }
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
        let mut copy = zeroed_header();
        read_copy_used(&f, &mut copy, version);
        let at = |s: usize, field: usize| proc_field_at(version, s, field);
        let (host_pid_at, generation_at) = (
            std::mem::offset_of!(ProcRec, host_pid),
            std::mem::offset_of!(ProcRec, generation),
        );
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
            write_at(&f, at(s, host_pid_at), &h.to_ne_bytes()).map_err(io)?;
            if read_u32(&f, at(s, generation_at) as u64) != Some(generation) {
                // Re-registered while we wrote: whatever we wrote is not its pid.
                write_at(&f, at(s, host_pid_at), &0i32.to_ne_bytes()).map_err(io)?;
            }
        }
        Ok(())
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

impl Drop for Ledger {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmapping our own mapping; nothing borrowed from it outlives `self`.
            unsafe { libc::munmap(self.map.cast(), self.len) };
        }
    }
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

// After the macros above, which they use.
mod at_cap;
mod compute;
mod open;
mod read_only;
mod view;

use at_cap::wake_all;
use open::validate;
pub use read_only::ReadOnly;
use read_only::{open_checked, read_copy_used, read_u32, write_at, zeroed_header};
use view::{snapshot_of, uuid_of};

#[cfg(test)]
mod previous_tests;
#[cfg(test)]
mod tests;
