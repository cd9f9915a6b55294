//! The state file: making and opening it, process registration and liveness, locked access to
//! devices, and reclaiming what dead processes held. Making a new file is in `create`, this
//! state's locker in `locker`, processes in `processes`, and the device guard in `device`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use crate::clock::MS;
use crate::layout::*;
use crate::lockers::{self, TOKENS};
use cuslice_shm::Locked;

mod create;
mod device;
mod locker;
mod processes;

pub use device::DevGuard;
pub use processes::CheckpointTurn;

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
    /// What a real driver does (measured on an NVIDIA H200 and an H100, driver 580): one sample
    /// per sample period, naming one process that ran (each with a chance in proportion to its
    /// busy time in the period) and giving the device's utilisation over the period, not that
    /// process's own share.
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
    /// Mean length of a context switch (see `SimConfig::switch_ns`).
    pub switch_ns: u64,
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
            // The bare default's timing: 2 ms slices, switches that take nothing, samples every
            // 100 ms. `--gpu h100|h200` gives the hardware's (HARDWARE_TIMING).
            timeslice_ns: 2_000_000,
            switch_ns: 0,
            util_sample_ns: 100 * MS,
            process_samples: ProcessSamples::OnePerPeriod,
            nvlink: false,
            name: "SimGPU (simulated)".into(),
            driver_version: 13000,
        }
    }
}

/// The engine's and NVML's timing as the calibration against H100 and H200 runs found them
/// (docs/simgpu.md, "Calibration against hardware"): time slice, mean context switch, sample
/// period. Both kinds showed the same.
pub const HARDWARE_TIMING: (u64, u64, u64) = (1_024_000, 50_000, 200 * MS);

/// A GPU whose runs on hardware simgpu was calibrated against (docs/simgpu.md, "Calibration
/// against hardware"): `simgpu init --gpu KIND` makes a device that says what that GPU says of
/// itself (name, memory as `cuMemGetInfo` gives it, a context's memory as NVML lists it), with
/// the hardware's timing (`HARDWARE_TIMING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuKind {
    /// NVIDIA H100 80GB HBM3 (SXM), driver 580.159.04.
    H100,
    /// NVIDIA H200 (SXM), driver 580.159.04.
    H200,
}

impl GpuKind {
    pub fn parse(s: &str) -> Result<GpuKind, String> {
        match s.to_ascii_lowercase().as_str() {
            "h100" => Ok(GpuKind::H100),
            "h200" => Ok(GpuKind::H200),
            _ => Err(format!("{s:?} is neither `h100` nor `h200`")),
        }
    }

    /// The options of a device of this kind (the others as by default).
    pub fn options(self) -> CreateOptions {
        let (name, memory) = match self {
            // cuMemGetInfo's total on the hardware (85017493504 and 150109880320 bytes), to
            // whole granules.
            GpuKind::H100 => ("NVIDIA H100 80GB HBM3", 40_539 * GRANULE),
            GpuKind::H200 => ("NVIDIA H200", 71_577 * GRANULE),
        };
        CreateOptions {
            memory,
            // What NVML listed for a process with one context and nothing allocated.
            context_overhead: 518 << 20,
            name: name.into(),
            timeslice_ns: HARDWARE_TIMING.0,
            switch_ns: HARDWARE_TIMING.1,
            util_sample_ns: HARDWARE_TIMING.2,
            ..CreateOptions::default()
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
            return bad("--timeslice-us must be positive, e.g. 1024".into());
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
