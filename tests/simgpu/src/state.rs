//! The state file: making and opening it, process registration and liveness, locked access to
//! devices, and reclaiming what dead processes held.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use crate::clock::{self, MS};
use crate::dev::{Dev, Reclaimed};
use crate::layout::*;
use crate::lockers::{self, TOKENS};
use cuslice_shm::{Locked, liveness};

/// Inode number of the initial PID namespace (`PROC_PID_INIT_INO` in the kernel).
const INIT_PIDNS_INO: u64 = 0xEFFF_FFFC;
/// How often device-level code looks for dead processes while the device is in use.
const SCAN_INTERVAL_NS: u64 = 100 * MS;
/// `State::locker`'s token while a thread of the state takes a locker.
const CLAIMING: u32 = u32::MAX;

const _: () = assert!(MAX_LOCKERS <= TOKENS.slots() as usize);

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot {what} {path}: {err}")]
    Io {
        what: &'static str,
        path: PathBuf,
        err: io::Error,
    },
    #[error(
        "{path} is not a simgpu state file (bad magic); make one with `simgpu init --state FILE` or `simgpu run`"
    )]
    NotState { path: PathBuf },
    #[error(
        "{path} has state layout version {found}, this simgpu understands version {expected}; remove the file and start again"
    )]
    Version {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("{path} is damaged ({why}); remove the file and start again")]
    Damaged { path: PathBuf, why: String },
    #[error(
        "{path} already describes {have}, not {want}; leave out the device options or use another --state file"
    )]
    Mismatch {
        path: PathBuf,
        have: String,
        want: String,
    },
    #[error("all {MAX_PROCS} process slots of {path} are in use by live processes")]
    TooManyProcesses { path: PathBuf },
    #[error("{0}")]
    Invalid(String),
}

/// How the simulated driver answers `nvmlDeviceGetProcessUtilization` (`Header::process_samples`
/// holds the code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ProcessSamples {
    /// NOT_SUPPORTED, as on MIG instances and some vGPU profiles.
    Off = 0,
    /// What a real driver does (measured on an NVIDIA H200, driver 580): one sample per sample
    /// period, naming one process (the one with the most busy time in the period) and giving
    /// the device's utilisation over the period, not that process's own share.
    OnePerPeriod = 1,
    /// One sample per process that ran in the period, each with that process's own share.
    PerProcess = 2,
}

impl ProcessSamples {
    pub fn from_code(c: u32) -> ProcessSamples {
        match c {
            0 => ProcessSamples::Off,
            2 => ProcessSamples::PerProcess,
            _ => ProcessSamples::OnePerPeriod,
        }
    }

    /// `on` is the default model, one sample per period.
    pub fn parse(s: &str) -> Result<ProcessSamples, String> {
        match s {
            "off" => Ok(ProcessSamples::Off),
            "on" | "one-per-period" => Ok(ProcessSamples::OnePerPeriod),
            "per-process" => Ok(ProcessSamples::PerProcess),
            _ => Err(format!(
                "{s:?} is none of `one-per-period` (or `on`), `per-process`, `off`"
            )),
        }
    }
}

/// What a new state file describes.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    pub devices: u32,
    pub memory: u64,
    pub context_overhead: u64,
    pub sm_count: u32,
    pub timeslice_ns: u64,
    pub util_sample_ns: u64,
    /// How NVML gives per-process utilisation samples (see `Header::process_samples`).
    pub process_samples: ProcessSamples,
    /// Every pair of devices linked by NVLink, with peer access (see `Header::nvlink`).
    pub nvlink: bool,
    pub name: String,
    pub driver_version: i32,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            devices: 1,
            memory: 16 << 30,
            context_overhead: 300 << 20,
            sm_count: 132,
            timeslice_ns: 2 * MS,
            util_sample_ns: 100 * MS,
            process_samples: ProcessSamples::OnePerPeriod,
            nvlink: false,
            name: "SimGPU (simulated)".into(),
            driver_version: 13000,
        }
    }
}

impl CreateOptions {
    fn validate(&self) -> Result<(), StateError> {
        let bad = |m: String| Err(StateError::Invalid(m));
        if self.devices == 0 || self.devices as usize > MAX_DEVICES {
            return bad(format!(
                "--devices {} is out of range; use 1 to {MAX_DEVICES}",
                self.devices
            ));
        }
        if self.memory < GRANULE
            || self.memory > MAX_DEVICE_MEMORY
            || !self.memory.is_multiple_of(GRANULE)
        {
            return bad(format!(
                "--memory {} must be a multiple of 2 MiB between 2 MiB and 1 TiB, e.g. 16GiB",
                self.memory
            ));
        }
        if self.context_overhead >= self.memory {
            return bad("--context-overhead must be smaller than --memory, e.g. 300MiB".into());
        }
        if self.timeslice_ns == 0 {
            return bad("--timeslice must be positive, e.g. 2ms".into());
        }
        if !self.util_sample_ns.is_multiple_of(UTIL_BUCKET_NS)
            || !(UTIL_BUCKET_NS..=1000 * MS).contains(&self.util_sample_ns)
        {
            return bad(format!(
                "--util-sample-ms {} must be a multiple of 10 between 10 and 1000, e.g. 100",
                self.util_sample_ns as f64 / MS as f64
            ));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "{} device(s) of {} with {} context overhead",
            self.devices,
            cuslice_policy::format_size(self.memory),
            cuslice_policy::format_size(self.context_overhead)
        )
    }
}

/// An open state file, mapped into this process.
pub struct State {
    path: PathBuf,
    file: File,
    base: *mut u8,
    len: usize,
    my_slot: AtomicU32,
    data: OnceLock<Result<DataMap, String>>,
    /// This state's locker (see `lockers.rs`): the fork count when it was taken in the high
    /// half, its token in the low half (0: none yet; `CLAIMING`: a thread is taking one).
    locker: AtomicU64,
    /// The descriptor holding the locker's liveness lock (-1: none).
    locker_fd: AtomicI32,
}

// SAFETY: the mapping is shared memory designed for concurrent use; every mutable access goes
// through a lock of the file (device guards, the process-table lock) or an atomic.
unsafe impl Send for State {}
// SAFETY: as above.
unsafe impl Sync for State {}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StateError + use<> {
    let path = path.to_path_buf();
    move |err| StateError::Io { what, path, err }
}

/// The memory-contents file of a state (`STATE.mem`): sparse, device memory backing.
pub struct DataMap {
    pub base: *mut u8,
    pub len: usize,
}

// SAFETY: shared memory; concurrent access to device memory contents is the application's
// business, as on a real GPU.
unsafe impl Send for DataMap {}
// SAFETY: as above.
unsafe impl Sync for DataMap {}

pub fn data_path(state: &Path) -> PathBuf {
    let mut p = state.as_os_str().to_owned();
    p.push(".mem");
    PathBuf::from(p)
}

impl State {
    /// Opens `path`, making it first if it does not exist. With `explicit`, an existing file
    /// that describes other devices is refused instead of silently used.
    pub fn create_or_open(
        path: &Path,
        opts: &CreateOptions,
        explicit: bool,
    ) -> Result<State, StateError> {
        opts.validate()?;
        match State::open(path) {
            Ok(s) => {
                let c = s.header().config;
                let have = CreateOptions {
                    devices: s.ndev(),
                    memory: c.memory,
                    context_overhead: c.context_overhead,
                    ..opts.clone()
                };
                if explicit && have.describe() != opts.describe() {
                    return Err(StateError::Mismatch {
                        path: path.into(),
                        have: have.describe(),
                        want: opts.describe(),
                    });
                }
                Ok(s)
            }
            Err(StateError::Io { err, .. }) if err.kind() == io::ErrorKind::NotFound => {
                State::make(path, opts)?;
                State::open(path)
            }
            Err(e) => Err(e),
        }
    }

    fn make(path: &Path, opts: &CreateOptions) -> Result<(), StateError> {
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let tmp = dir.join(format!(
            ".simgpu-new-{}-{}",
            std::process::id(),
            clock::now_ns()
        ));
        let ngran = (opts.memory / GRANULE) as u32;
        let dl = DeviceLayout::new(ngran);
        let header_size = align_up(std::mem::size_of::<Header>() as u64, 4096);
        let file_size = header_size + dl.size * opts.devices as u64;
        let result = (|| {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o666)
                .open(&tmp)
                .map_err(io_err("create", &tmp))?;
            f.set_permissions(std::fs::Permissions::from_mode(0o666))
                .map_err(io_err("chmod", &tmp))?;
            f.set_len(file_size).map_err(io_err("size", &tmp))?;
            let map = Mapping::new(&f, file_size as usize).map_err(io_err("map", &tmp))?;
            // SAFETY: the file is new, private to us until linked, and `file_size` long.
            unsafe { init_file(map.base, header_size, &dl, opts) }
                .map_err(io_err("initialise", &tmp))?;
            let data = data_path(path);
            let df = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o666)
                .open(&data)
                .map_err(io_err("create", &data))?;
            df.set_permissions(std::fs::Permissions::from_mode(0o666))
                .map_err(io_err("chmod", &data))?;
            df.set_len(opts.memory * opts.devices as u64)
                .map_err(io_err("size", &data))?;
            // Publish atomically; if another process won the race, use its file.
            match std::fs::hard_link(&tmp, path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(io_err("create", path)(e)),
            }
        })();
        let _ = std::fs::remove_file(&tmp);
        result
    }

    pub fn open(path: &Path) -> Result<State, StateError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io_err("open", path))?;
        let len = file.metadata().map_err(io_err("stat", path))?.len();
        if len < std::mem::size_of::<Header>() as u64 {
            let mut magic = [0u8; 8];
            let n = std::io::Read::read(&mut &file, &mut magic).unwrap_or(0);
            return Err(if n == 8 && magic == MAGIC {
                StateError::Damaged {
                    path: path.into(),
                    why: format!("only {len} bytes long"),
                }
            } else {
                StateError::NotState { path: path.into() }
            });
        }
        let map = Mapping::new(&file, len as usize).map_err(io_err("map", path))?;
        let state = State {
            path: path.to_path_buf(),
            file,
            base: map.base,
            len: len as usize,
            my_slot: AtomicU32::new(NONE),
            data: OnceLock::new(),
            locker: AtomicU64::new(0),
            locker_fd: AtomicI32::new(-1),
        };
        std::mem::forget(map); // owned by State from here on
        state.validate()?;
        Ok(state)
    }

    fn validate(&self) -> Result<(), StateError> {
        let h = self.header();
        let damaged = |why: String| {
            Err(StateError::Damaged {
                path: self.path.clone(),
                why,
            })
        };
        if h.magic != MAGIC {
            return Err(StateError::NotState {
                path: self.path.clone(),
            });
        }
        if h.version != LAYOUT_VERSION {
            return Err(StateError::Version {
                path: self.path.clone(),
                found: h.version,
                expected: LAYOUT_VERSION,
            });
        }
        if h.header_size as u64 != align_up(std::mem::size_of::<Header>() as u64, 4096)
            || h.file_size != self.len as u64
        {
            return damaged(format!(
                "header says {} bytes, file has {}",
                h.file_size, self.len
            ));
        }
        if h.ndev == 0 || h.ndev as usize > MAX_DEVICES {
            return damaged(format!("{} devices", h.ndev));
        }
        for d in 0..h.ndev {
            let off = h.devices[d as usize].block_off;
            let ngran = (h.config.memory / GRANULE) as u32;
            let dl = DeviceLayout::new(ngran);
            if !off.is_multiple_of(4096) || off + dl.size > self.len as u64 {
                return damaged(format!("device {d} lies outside the file"));
            }
            let i = self.device_info(d);
            if i.ngran != ngran
                || i.granules_off != off + dl.granules
                || i.allocs_off != off + dl.allocs
                || i.bitmap_off != off + dl.bitmap
            {
                return damaged(format!("device {d} layout is inconsistent"));
            }
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the file is at least a Header long (checked in `open`) and mapped for our
        // lifetime; fields other than atomics and locks are written only when the file is made.
        unsafe { &*(self.base as *const Header) }
    }

    pub fn config(&self) -> SimConfig {
        self.header().config
    }

    /// How NVML gives per-process utilisation samples now.
    pub fn process_samples(&self) -> ProcessSamples {
        ProcessSamples::from_code(self.header().process_samples.load(Ordering::Relaxed))
    }

    /// Changes how NVML gives per-process utilisation samples, for every process at once.
    pub fn set_process_samples(&self, how: ProcessSamples) {
        self.header()
            .process_samples
            .store(how as u32, Ordering::Relaxed);
    }

    /// Whether device `i` has fallen off the bus (NVML answers GPU_IS_LOST for it).
    pub fn lost(&self, i: u32) -> bool {
        i < 32 && self.header().lost.load(Ordering::Relaxed) & (1 << i) != 0
    }

    /// Marks device `i` lost or back, for every process at once.
    pub fn set_lost(&self, i: u32, lost: bool) {
        let bit = 1u32 << i;
        let l = &self.header().lost;
        if lost {
            l.fetch_or(bit, Ordering::Relaxed);
        } else {
            l.fetch_and(!bit, Ordering::Relaxed);
        }
    }

    pub fn ndev(&self) -> u32 {
        self.header().ndev
    }

    /// Whether devices `a` and `b` (two different ones) are linked by NVLink, with peer access.
    pub fn linked(&self, a: u32, b: u32) -> bool {
        a != b && a < self.ndev() && b < self.ndev() && self.header().nvlink == 1
    }

    fn block_ptr(&self, d: u32) -> *mut DeviceBlock {
        assert!(d < self.ndev(), "device {d} out of range");
        // SAFETY: validated in `open`: the block lies inside the mapping.
        unsafe { self.base.add(self.device_info(d).block_off as usize) as *mut DeviceBlock }
    }

    /// The fixed description of device `d` (never changes after the file is made).
    pub fn device_info(&self, d: u32) -> &DeviceInfo {
        &self.header().devices[d as usize]
    }

    pub fn uuid_string(&self, d: u32) -> String {
        format_uuid(&self.device_info(d).uuid)
    }

    pub fn pci_bus_id(&self, d: u32) -> String {
        format!("00000000:{:02X}:00.0", self.device_info(d).pci_bus)
    }

    /// Locks device `d`. If the last holder died mid-update, repairs the device first.
    #[inline]
    pub fn lock_device(&self, d: u32) -> DevGuard<'_> {
        let block = self.block_ptr(d);
        // SAFETY: the lock lives in the mapping for our lifetime.
        let lock = unsafe { &(*block).lock };
        let how = lock.lock(self.token(), |t| self.locker_dead(t));
        let mut g = DevGuard {
            state: self,
            block,
            d,
            taken_over: how == Locked::OwnerDied,
        };
        if g.taken_over {
            g.dev().repair();
        }
        g
    }

    /// Locks the process table (registration and sweeps take it; tests hold it).
    pub fn lock_process_table(&self) -> ProcsGuard<'_> {
        let lock = &self.header().procs_lock;
        // Nothing under this lock can be left half-done: a slot is either LIVE with its fields
        // written or FREE, and `sweep` settles the rest.
        let how = lock.lock(self.token(), |t| self.locker_dead(t));
        ProcsGuard {
            state: self,
            taken_over: how == Locked::OwnerDied,
        }
    }

    fn lock_procs(&self) -> ProcsGuard<'_> {
        self.lock_process_table()
    }

    // ---- lockers (see lockers.rs) ---------------------------------------------------------

    /// The token this state writes into the locks it takes.
    #[inline]
    fn token(&self) -> u32 {
        let v = self.locker.load(Ordering::Acquire);
        let token = v as u32;
        if (v >> 32) as u32 == lockers::forks() && token != 0 && token != CLAIMING {
            return token;
        }
        self.claim_locker()
    }

    #[cold]
    fn claim_locker(&self) -> u32 {
        loop {
            let forks = lockers::forks();
            let v = self.locker.load(Ordering::Acquire);
            let (at, token) = ((v >> 32) as u32, v as u32);
            if at == forks && token != 0 && token != CLAIMING {
                return token;
            }
            if at == forks && token == CLAIMING {
                std::thread::yield_now();
                continue;
            }
            // None yet, or the parent's (this is a forked child, whose copy of the parent's
            // descriptor was closed): take one.
            let mine = (forks as u64) << 32;
            if self
                .locker
                .compare_exchange(
                    v,
                    mine | CLAIMING as u64,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
            {
                continue;
            }
            let token = self.take_locker();
            self.locker.store(mine | token as u64, Ordering::Release);
            return token;
        }
    }

    /// Opens a description of the state file of its own and takes a free locker through it.
    fn take_locker(&self) -> u32 {
        let warn = |why: String| {
            eprintln!(
                "simgpu: {why}; this process's locks of {} will never be taken over if it dies holding one",
                self.path.display()
            );
            TOKENS.unknown()
        };
        let reopened = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
            .or_else(|_| {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(&self.path)
            });
        let fd = match reopened {
            Ok(f) => std::os::fd::IntoRawFd::into_raw_fd(f),
            Err(e) => return warn(format!("cannot open {} again: {e}", self.path.display())),
        };
        if !lockers::keep_out_of_children(fd) {
            // SAFETY: closing the descriptor opened just above.
            unsafe { libc::close(fd) };
            return warn("too many simgpu states are open in this process".into());
        }
        self.locker_fd.store(fd, Ordering::Relaxed);
        // Start the search somewhere else in each process, so that many starting at once do not
        // all try the same lockers first.
        let start = (clock::now_ns() ^ std::process::id() as u64) as usize;
        for k in 0..MAX_LOCKERS {
            let i = (start + k) % MAX_LOCKERS;
            if liveness::hold(fd, LOCKER_LOCK_BASE + i as i64).is_ok() {
                let generation = self.header().lockers[i]
                    .fetch_add(1, Ordering::AcqRel)
                    .wrapping_add(1);
                return TOKENS.make(i as u32, generation);
            }
        }
        warn(format!("all {MAX_LOCKERS} lockers are taken"))
    }

    /// Whether the state that wrote `token` into a lock is gone: its locker was taken by another
    /// since (the generation differs), or nobody holds the locker's liveness lock. Never says so
    /// of a token it cannot place.
    fn locker_dead(&self, token: u32) -> bool {
        let Some((i, generation)) = TOKENS.owner(token) else {
            return false;
        };
        let Some(g) = self.header().lockers.get(i as usize) else {
            return false;
        };
        let mine = self.locker.load(Ordering::Acquire);
        if (mine >> 32) as u32 == lockers::forks() && mine as u32 == token {
            // Another thread of this state: slow, not dead (we are alive).
            return false;
        }
        g.load(Ordering::Acquire) & TOKENS.generation_mask() != generation
            || !liveness::held_by_other(self.file.as_raw_fd(), LOCKER_LOCK_BASE + i as i64)
    }

    // ---- processes ------------------------------------------------------------------------

    pub fn my_slot(&self) -> Option<u32> {
        let s = self.my_slot.load(Ordering::Relaxed);
        (s != NONE).then_some(s)
    }

    /// Whether the process in slot `s` is alive: its liveness lock is held (the kernel drops it
    /// when the process dies, however it dies).
    pub fn slot_alive(&self, s: u32) -> bool {
        let slot = &self.header().procs[s as usize];
        if slot.state.load(Ordering::Acquire) != SLOT_LIVE {
            return false;
        }
        if self.my_slot() == Some(s) {
            return true; // our own lock does not conflict with our own query
        }
        liveness::held_by_other(self.file.as_raw_fd(), LIVENESS_LOCK_BASE + s as i64)
    }

    /// Registers this process (once); returns its slot.
    pub fn register(&self) -> Result<u32, StateError> {
        if let Some(s) = self.my_slot() {
            return Ok(s);
        }
        let _g = self.lock_procs();
        self.sweep_locked();
        let (pidns, ns_pid) = (own_pidns(), std::process::id() as i32);
        for s in 0..MAX_PROCS as u32 {
            let slot = &self.header().procs[s as usize];
            if slot.state.load(Ordering::Acquire) != SLOT_FREE {
                continue;
            }
            if liveness::hold(self.file.as_raw_fd(), LIVENESS_LOCK_BASE + s as i64).is_err() {
                continue;
            }
            slot.generation.fetch_add(1, Ordering::Relaxed);
            slot.ns_pid.store(ns_pid, Ordering::Relaxed);
            slot.host_pid.store(
                if pidns == INIT_PIDNS_INO { ns_pid } else { 0 },
                Ordering::Relaxed,
            );
            slot.pidns.store(pidns, Ordering::Relaxed);
            slot.started_ns.store(clock::now_ns(), Ordering::Relaxed);
            // SAFETY: `comm` is written only under the process-table lock, which we hold.
            unsafe { *slot.comm.get() = cstr_field(&own_comm()) };
            slot.state.store(SLOT_LIVE, Ordering::Release);
            self.my_slot.store(s, Ordering::Relaxed);
            return Ok(s);
        }
        Err(StateError::TooManyProcesses {
            path: self.path.clone(),
        })
    }

    /// In a forked child: the slot and its liveness lock belong to the parent.
    pub fn forget_registration(&self) {
        self.my_slot.store(NONE, Ordering::Relaxed);
    }

    fn exited_record(&self, s: u32) -> ExitedProc {
        let slot = &self.header().procs[s as usize];
        ExitedProc {
            ns_pid: slot.ns_pid.load(Ordering::Relaxed),
            host_pid: slot.host_pid.load(Ordering::Relaxed),
            peak: 0,
            device_time_ns: 0,
            exited_ns: clock::now_ns(),
            // SAFETY: comm changes only at registration, under the process-table lock; a racing
            // read yields at worst a mixed name, never invalid memory.
            comm: unsafe { *slot.comm.get() },
        }
    }

    /// Reclaims everything dead processes held, on every device, and frees their slots.
    pub fn sweep(&self) {
        let _g = self.lock_procs();
        self.sweep_locked();
    }

    fn sweep_locked(&self) {
        for s in 0..MAX_PROCS as u32 {
            let slot = &self.header().procs[s as usize];
            if slot.state.load(Ordering::Acquire) == SLOT_LIVE && !self.slot_alive(s) {
                let who = self.exited_record(s);
                for d in 0..self.ndev() {
                    self.lock_device(d).dev().reclaim_owner(s, &who);
                }
                slot.state.store(SLOT_FREE, Ordering::Release);
            }
        }
    }

    /// Fills in host PIDs of processes in other PID namespaces (containers) by looking them up in
    /// /proc; only meaningful when this process sees the initial PID namespace.
    pub fn resolve_host_pids(&self) {
        if own_pidns() != INIT_PIDNS_INO {
            return;
        }
        let wanted: Vec<u32> = (0..MAX_PROCS as u32)
            .filter(|&s| {
                let slot = &self.header().procs[s as usize];
                slot.state.load(Ordering::Acquire) == SLOT_LIVE
                    && slot.host_pid.load(Ordering::Relaxed) == 0
            })
            .collect();
        if wanted.is_empty() {
            return;
        }
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(ns) = std::fs::metadata(format!("/proc/{pid}/ns/pid")).map(|m| m.ino()) else {
                continue;
            };
            for &s in &wanted {
                let slot = &self.header().procs[s as usize];
                if slot.pidns.load(Ordering::Relaxed) == ns
                    && innermost_pid(pid) == Some(slot.ns_pid.load(Ordering::Relaxed))
                {
                    slot.host_pid.store(pid, Ordering::Relaxed);
                }
            }
        }
    }

    /// The PID NVML reports for slot `s`: the host PID when known, else the process's own.
    pub fn reported_pid(&self, s: u32) -> i32 {
        let slot = &self.header().procs[s as usize];
        match slot.host_pid.load(Ordering::Relaxed) {
            0 => slot.ns_pid.load(Ordering::Relaxed),
            p => p,
        }
    }

    pub fn slot_comm(&self, s: u32) -> String {
        // SAFETY: see `exited_record`.
        field_str(unsafe { &*self.header().procs[s as usize].comm.get() })
    }

    pub fn slot_ns_pid(&self, s: u32) -> i32 {
        self.header().procs[s as usize]
            .ns_pid
            .load(Ordering::Relaxed)
    }

    // ---- memory contents ------------------------------------------------------------------

    /// The mapping of `STATE.mem` (device memory contents), made on first use.
    pub fn data(&self) -> Result<&DataMap, String> {
        self.data
            .get_or_init(|| {
                let p = data_path(&self.path);
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&p)
                    .map_err(|e| format!("cannot open {}: {e}", p.display()))?;
                let len = f.metadata().map_err(|e| e.to_string())?.len() as usize;
                let m = Mapping::new(&f, len)
                    .map_err(|e| format!("cannot map {}: {e}", p.display()))?;
                let dm = DataMap { base: m.base, len };
                std::mem::forget(m);
                Ok(dm)
            })
            .as_ref()
            .map_err(|e| e.clone())
    }

    pub fn data_fd_path(&self) -> PathBuf {
        data_path(&self.path)
    }
}

impl Drop for State {
    fn drop(&mut self) {
        let fd = self.locker_fd.load(Ordering::Relaxed);
        if fd >= 0 && (self.locker.load(Ordering::Relaxed) >> 32) as u32 == lockers::forks() {
            // (After a fork the child closed it already, and the number may be another's now.)
            lockers::forget(fd);
            // SAFETY: the locker's descriptor, opened by `take_locker` and closed once here.
            unsafe { libc::close(fd) };
        }
        // SAFETY: base/len describe the mapping made in `open`, unmapped once here.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
        if let Some(Ok(d)) = self.data.get() {
            // SAFETY: as above, for the contents mapping.
            unsafe { libc::munmap(d.base as *mut libc::c_void, d.len) };
        }
    }
}

/// The locked process table. Dropping it unlocks.
pub struct ProcsGuard<'a> {
    state: &'a State,
    taken_over: bool,
}

impl ProcsGuard<'_> {
    /// Whether the lock was taken over from a holder that died holding it.
    pub fn taken_over(&self) -> bool {
        self.taken_over
    }
}

impl Drop for ProcsGuard<'_> {
    fn drop(&mut self) {
        self.state.header().procs_lock.unlock();
    }
}

/// A locked device. Dropping it unlocks.
pub struct DevGuard<'a> {
    state: &'a State,
    block: *mut DeviceBlock,
    d: u32,
    taken_over: bool,
}

impl DevGuard<'_> {
    pub fn index(&self) -> u32 {
        self.d
    }

    /// Whether the lock was taken over from a holder that died holding it (the device was
    /// repaired before this guard was handed out).
    pub fn taken_over(&self) -> bool {
        self.taken_over
    }

    pub fn dev(&mut self) -> Dev<'_> {
        let s = self.state;
        let info = *s.device_info(self.d);
        let n = info.ngran as usize;
        // SAFETY: we hold the device lock, so nothing else reads or writes this device's block or
        // granule arrays (the immutable DeviceInfo lives in the header); `validate` checked that
        // they lie inside the mapping.
        unsafe {
            Dev {
                total: info.total,
                ngran: info.ngran,
                granules: std::slice::from_raw_parts_mut(
                    s.base.add(info.granules_off as usize) as *mut Granule,
                    n,
                ),
                allocs: std::slice::from_raw_parts_mut(
                    s.base.add(info.allocs_off as usize) as *mut AllocRec,
                    n,
                ),
                bitmap: std::slice::from_raw_parts_mut(
                    s.base.add(info.bitmap_off as usize) as *mut u64,
                    n.div_ceil(64),
                ),
                b: &mut *self.block,
            }
        }
    }

    /// Brings the engine up to now (and, every 100 ms, reclaims dead processes on this device so
    /// their queued work stops competing). Returns now.
    pub fn advance_now(&mut self) -> u64 {
        let now = clock::now_ns();
        let timeslice = self.state.config().timeslice_ns;
        let last_scan = self.dev().b.engine.last_scan_ns;
        if now.saturating_sub(last_scan) >= SCAN_INTERVAL_NS {
            self.dev().b.engine.last_scan_ns = now;
            self.reclaim_dead();
        }
        self.dev().advance(now, timeslice);
        now
    }

    /// Releases what dead processes hold on this device (their slots are freed later by
    /// `State::sweep`). Called before refusing an allocation, so a dead process's memory never
    /// causes a refusal.
    pub fn reclaim_dead(&mut self) -> Reclaimed {
        let mut total = Reclaimed::default();
        let owners: Vec<u32> = {
            let d = self.dev();
            (0..MAX_PROCS as u32)
                .filter(|&s| {
                    d.b.procs[s as usize].contexts > 0
                        || d.b.procs[s as usize].held > 0
                        || d.b.procs[s as usize].device_time_ns > 0
                })
                .collect()
        };
        for s in owners {
            if !self.state.slot_alive(s) {
                let who = self.state.exited_record(s);
                let r = self.dev().reclaim_owner(s, &who);
                total.allocations += r.allocations;
                total.bytes += r.bytes;
                total.contexts += r.contexts;
                total.events += r.events;
            }
        }
        total
    }
}

impl Drop for DevGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the lock lives in the mapping, and we hold it.
        unsafe { (*self.block).lock.unlock() };
    }
}

struct Mapping {
    base: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(f: &File, len: usize) -> io::Result<Mapping> {
        // SAFETY: mapping a file we have open read-write; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            base: p as *mut u8,
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// # Safety
/// `base` must map a new, zero-filled file of the size computed from `header_size` and `dl`.
unsafe fn init_file(
    base: *mut u8,
    header_size: u64,
    dl: &DeviceLayout,
    o: &CreateOptions,
) -> io::Result<()> {
    // SAFETY: per the contract the memory is ours, zeroed (a valid value for every field) and
    // large enough for the header and every device block.
    unsafe {
        let h = &mut *(base as *mut Header);
        h.version = LAYOUT_VERSION;
        h.header_size = header_size as u32;
        h.file_size = header_size + dl.size * o.devices as u64;
        h.machine_id = random_u64();
        h.ndev = o.devices;
        h.nvlink = o.nvlink.into();
        h.config = SimConfig {
            context_overhead: o.context_overhead,
            timeslice_ns: o.timeslice_ns,
            util_sample_ns: o.util_sample_ns,
            wall_at_mono_zero_us: crate::clock::wall_us() - crate::clock::now_ns() / 1000,
            memory: o.memory,
            driver_version: o.driver_version,
            sm_count: o.sm_count,
            cc_major: 9,
            cc_minor: 0,
            name: cstr_field(&o.name),
            nvml_driver_version: cstr_field("580.95.05"),
        };
        h.process_samples = AtomicU32::new(o.process_samples as u32);
        // The locks and the lockers' generations are zero: free.
        for d in 0..o.devices {
            let off = header_size + dl.size * d as u64;
            let b = &mut *(base.add(off as usize) as *mut DeviceBlock);
            let mut uuid = [0u8; 16];
            uuid[..8].copy_from_slice(&random_u64().to_le_bytes());
            uuid[8..].copy_from_slice(&random_u64().to_le_bytes());
            uuid[6] = (uuid[6] & 0x0f) | 0x40; // an RFC 4122 version-4 UUID, like real GPUs'
            uuid[8] = (uuid[8] & 0x3f) | 0x80;
            h.devices[d as usize] = DeviceInfo {
                index: d,
                // Apart like a real 8-GPU server's, and within the 8-bit bus number for all 16.
                pci_bus: 0x18 + d * 0x0e,
                uuid,
                total: o.memory,
                ngran: (o.memory / GRANULE) as u32,
                _pad: 0,
                block_off: off,
                granules_off: off + dl.granules,
                allocs_off: off + dl.allocs,
                bitmap_off: off + dl.bitmap,
                data_off: o.memory * d as u64,
            };
            b.engine.current = NONE;
            for c in b.ctxs.iter_mut() {
                c.overhead = NONE;
            }
        }
        // The magic goes last: a half-made file is never mistaken for a state.
        std::sync::atomic::fence(Ordering::SeqCst);
        h.magic = MAGIC;
    }
    Ok(())
}

pub fn format_uuid(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, b.len(), 0) };
    if n != 8 {
        return clock::now_ns() ^ (std::process::id() as u64) << 32;
    }
    u64::from_le_bytes(b)
}

fn own_pidns() -> u64 {
    std::fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0)
}

fn own_comm() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The PID of host process `pid` inside its own (innermost) PID namespace.
fn innermost_pid(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}
