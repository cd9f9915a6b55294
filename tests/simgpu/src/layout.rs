//! The state file: one header, a process table, then one block per device followed by that
//! device's granule arrays. Everything is `#[repr(C)]` plain data; a field is written only under
//! the lock that guards it (the process-table lock or the device's lock), except the atomics in
//! [`ProcSlot`] that device-level code reads without the process-table lock.
//!
//! Changing any struct here changes [`LAYOUT_VERSION`]; a file of another version is refused.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64};

use cuslice_shm::OwnerLock;

pub const MAGIC: [u8; 8] = *b"SIMGPU\0\0";
/// 7: the locks are simgpu's own (`OwnerLock` words naming a locker, see `lockers.rs`), no
/// longer glibc robust mutexes, whose owner is a thread id that only means something in the
/// owner's pid namespace; the header has the lockers' generations.
/// 9: the header says whether the devices are linked by NVLink (`Header::nvlink`).
/// 10: kernels that wait for the clock (`ITEM_WAIT`, their deadline in `Item::arg`).
/// 11: context switches take engine time (`SimConfig::switch_ns`, `EngineState::loaded`,
/// `switch_left`, `switches`).
/// 12: processes can be checkpointed (`ProcSlot::ckpt_*`, the checkpoint API).
pub const LAYOUT_VERSION: u32 = 12;

/// Allocation granularity: every allocation takes whole 2 MiB granules.
pub const GRANULE: u64 = 2 << 20;
pub const MAX_DEVICES: usize = 16;
/// Processes that can use one state file at the same time.
pub const MAX_PROCS: usize = 1024;
/// Contexts per device, over all processes.
pub const MAX_CTXS: usize = 256;
/// Work items a context can have queued before a launch blocks (like a full push buffer).
pub const RING: usize = 256;
/// Events per device, over all processes.
pub const MAX_EVENTS: usize = 4096;
/// Exited processes remembered per device for `simgpu show`.
pub const EXITED: usize = 128;
/// Largest simulated device.
pub const MAX_DEVICE_MEMORY: u64 = 1 << 40;
/// Utilisation history: busy time per [`UTIL_BUCKET_NS`] of monotonic time, the last
/// `UTIL_POINTS` buckets.
pub const UTIL_POINTS: usize = 128;
pub const UTIL_BUCKET_NS: u64 = 10_000_000;

pub const NONE: u32 = u32::MAX;

/// Lockers (see `lockers.rs`): open states that take locks, at the same time.
pub const MAX_LOCKERS: usize = 2048;

/// Configuration fixed when the file is made.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SimConfig {
    pub context_overhead: u64,
    pub timeslice_ns: u64,
    /// Mean engine time a switch from one context to another takes (no kernel runs; NVML's
    /// counters see it busy; it counts in the incoming context's time slice); each switch takes
    /// between 0 and twice this.
    pub switch_ns: u64,
    /// How often the simulated driver takes a per-process utilisation sample (NVML).
    pub util_sample_ns: u64,
    /// Wall-clock microseconds at monotonic 0, fixed at creation: NVML sample time stamps are
    /// wall-clock, and every process must turn a bucket's end into the same stamp.
    pub wall_at_mono_zero_us: u64,
    pub memory: u64,
    pub driver_version: i32,
    pub sm_count: u32,
    pub cc_major: u32,
    pub cc_minor: u32,
    pub name: [u8; 64],
    pub nvml_driver_version: [u8; 32],
}

#[repr(C)]
pub struct Header {
    pub magic: [u8; 8],
    pub version: u32,
    pub header_size: u32,
    pub file_size: u64,
    /// Random identity of this simulated machine (IPC handles from another one are refused).
    pub machine_id: u64,
    pub ndev: u32,
    /// 1: every pair of devices is linked by NVLink, with peer access (`simgpu init --nvlink`;
    /// an SXM board's GPUs); 0: PCIe cards without peer access. Fixed when the file is made.
    pub nvlink: u32,
    pub config: SimConfig,
    /// How NVML gives per-process utilisation samples (`state::ProcessSamples`): 1, one sample
    /// per period naming one process with the device's utilisation (what a real driver does);
    /// 2, one per process with its own share; 0, none (`nvmlDeviceGetProcessUtilization`
    /// answers NOT_SUPPORTED, as on MIG instances and some vGPU profiles). `simgpu init
    /// --process-samples`, `--no-process-samples`; `simgpu set --process-samples`.
    pub process_samples: AtomicU32,
    /// Bit `i` set while device `i` has fallen off the bus (Xid 79): NVML answers every query
    /// about it with GPU_IS_LOST, as the real driver does until the node is repaired
    /// (`simgpu set --device I --lost on|off`). CUDA is not affected.
    pub lost: AtomicU32,
    /// What each device is; fixed when the file is made, read without locks.
    pub devices: [DeviceInfo; MAX_DEVICES],
    /// Guards the process table: registration, and freeing the slots of dead processes.
    pub procs_lock: OwnerLock,
    pub _pad2: u32,
    /// Each locker's generation, bumped by the state that takes the locker; a lock word holds
    /// a locker and its generation.
    pub lockers: [AtomicU32; MAX_LOCKERS],
    pub procs: [ProcSlot; MAX_PROCS],
}

pub const SLOT_FREE: u32 = 0;
pub const SLOT_LIVE: u32 = 1;

/// A process using the simulated driver. Liveness is an OFD lock on byte
/// `LIVENESS_LOCK_BASE + slot` of the state file, which the kernel drops when the process dies.
#[repr(C)]
pub struct ProcSlot {
    pub state: AtomicU32,
    pub generation: AtomicU32,
    /// The PID as the process itself sees it (its own PID namespace).
    pub ns_pid: AtomicI32,
    /// The PID in the initial namespace, 0 until known (see `State::resolve_host_pids`).
    pub host_pid: AtomicI32,
    /// Inode of the process's PID namespace.
    pub pidns: AtomicU64,
    pub started_ns: AtomicU64,
    /// The command name; written under the process-table lock only.
    pub comm: std::cell::UnsafeCell<[u8; 16]>,
    /// The process's checkpoint state (`CKPT_RUNNING` ...), as `cuCheckpointProcessGetState`
    /// answers it; written by the process's own checkpoint thread.
    pub ckpt_state: AtomicU32,
    /// A request to the process's checkpoint thread (`CKPT_OP_*`), 0 when none is pending: a
    /// caller holding the slot's checkpoint lock (byte `CKPT_LOCK_BASE + slot`) stores it and
    /// wakes the thread (a futex on this word); the thread stores the result in `ckpt_result`,
    /// then 0 here, and wakes the caller.
    pub ckpt_req: AtomicU32,
    /// The request's argument (the lock's timeout in ms, 0: none).
    pub ckpt_arg: AtomicU32,
    pub ckpt_result: AtomicI32,
    /// The checkpoint thread's id, as the process sees it; 0 until it runs.
    pub ckpt_tid: AtomicI32,
    /// 1 once a restore failed for lack of device memory: the process stays CHECKPOINTED and
    /// every later restore is refused (what driver 580 does).
    pub ckpt_stuck: AtomicU32,
    /// Device memory the process had when it was checkpointed, now held in its host memory.
    pub ckpt_host_bytes: AtomicU64,
}

pub const CKPT_RUNNING: u32 = 0;
pub const CKPT_LOCKED: u32 = 1;
pub const CKPT_CHECKPOINTED: u32 = 2;
pub const CKPT_FAILED: u32 = 3;

pub const CKPT_OP_LOCK: u32 = 1;
pub const CKPT_OP_CHECKPOINT: u32 = 2;
pub const CKPT_OP_RESTORE: u32 = 3;
pub const CKPT_OP_UNLOCK: u32 = 4;

pub const LIVENESS_LOCK_BASE: i64 = 1 << 40;
/// Locker `i`'s liveness lock is on byte `LOCKER_LOCK_BASE + i`.
pub const LOCKER_LOCK_BASE: i64 = LIVENESS_LOCK_BASE + (1 << 20);
/// Callers of the checkpoint API on the process in slot `s` take turns on byte
/// `CKPT_LOCK_BASE + s` (an OFD write lock, dropped if the caller dies).
pub const CKPT_LOCK_BASE: i64 = LIVENESS_LOCK_BASE + (2 << 20);

/// Busy time per bucket of [`UTIL_BUCKET_NS`], for utilisation over a window.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UtilRing {
    pub next: u32,
    pub len: u32,
    /// Bucket number (monotonic ns / UTIL_BUCKET_NS) of each entry.
    pub bucket: [u64; UTIL_POINTS],
    /// Busy ns within that bucket.
    pub busy: [u64; UTIL_POINTS],
}

/// One process's use of one device.
#[repr(C)]
pub struct ProcDev {
    pub contexts: u32,
    pub _pad: u32,
    pub held: u64,
    pub peak: u64,
    pub device_time_ns: u64,
    pub oom_refusals: u64,
    pub util: UtilRing,
}

pub const CTX_FREE: u32 = 0;
pub const CTX_LIVE: u32 = 1;
pub const CTX_PRIMARY: u32 = 1;

pub const ITEM_KERNEL: u32 = 1;
pub const ITEM_MARKER: u32 = 2;
pub const ITEM_HOSTFN: u32 = 3;
/// A kernel that waits for the clock (a spin on `%globaltimer`): it ends at the first moment it
/// is on the engine at or after its deadline, however much of the time until then it ran.
pub const ITEM_WAIT: u32 = 4;
/// `remaining` of a host function that has not returned yet.
pub const HOSTFN_PENDING: u64 = u64::MAX;

/// One unit of queued work. Item `seq` lives at `ring[seq % RING]`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Item {
    pub kind: u32,
    /// The submitting process's stream id (for diagnostics only).
    pub stream: u32,
    /// Engine time still needed (kernels; a waiting kernel: until its deadline, as of when it
    /// last ran), or `HOSTFN_PENDING`.
    pub remaining: u64,
    /// Marker: event index | record generation << 32. Waiting kernel: its deadline (monotonic
    /// ns), set when it first runs; 0 until then.
    pub arg: u64,
    pub total: u64,
}

/// A context: the unit the engine time-slices between, with its in-order work queue.
#[repr(C)]
pub struct Ctx {
    pub state: u32,
    pub generation: u32,
    pub owner: u32,
    pub flags: u32,
    /// Sequence number of the last item queued / finished; pending = submitted - completed.
    pub submitted: u64,
    pub completed: u64,
    pub device_time_ns: u64,
    /// Head granule of the context's hidden overhead allocation, or NONE.
    pub overhead: u32,
    pub _pad: u32,
    pub ring: [Item; RING],
}

pub const EVENT_FREE: u32 = 0;
pub const EVENT_CREATED: u32 = 1;
pub const EVENT_PENDING: u32 = 2;
pub const EVENT_DONE: u32 = 3;

#[repr(C)]
pub struct Event {
    pub state: u32,
    pub generation: u32,
    pub owner: u32,
    pub record_generation: u32,
    pub ts: u64,
}

#[repr(C)]
pub struct EngineState {
    pub sim_time: u64,
    pub current: u32,
    /// The context whose state is on the engine (the last one that ran), NONE at first: running
    /// another takes a switch.
    pub loaded: u32,
    pub slice_used: u64,
    /// Engine time left of the switch to `current` under way.
    pub switch_left: u64,
    /// Switches so far (each one's length is drawn from this count).
    pub switches: u64,
    pub busy_ns: u64,
    pub last_scan_ns: u64,
    pub active: [u64; MAX_CTXS / 64],
    pub util: UtilRing,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ExitedProc {
    pub ns_pid: i32,
    pub host_pid: i32,
    pub peak: u64,
    pub device_time_ns: u64,
    pub exited_ns: u64,
    pub comm: [u8; 16],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct DeviceInfo {
    pub index: u32,
    pub pci_bus: u32,
    pub uuid: [u8; 16],
    pub total: u64,
    pub ngran: u32,
    pub _pad: u32,
    /// Offsets, from the start of the file, of this device's block and granule arrays, and of
    /// its region in the memory-contents file.
    pub block_off: u64,
    pub granules_off: u64,
    pub allocs_off: u64,
    pub bitmap_off: u64,
    pub data_off: u64,
}

#[repr(C)]
pub struct MemState {
    pub used_gran: u32,
    pub cursor: u32,
    pub next_generation: u32,
    /// The most granules ever in use at once on the device (all processes together).
    pub peak_gran: u32,
}

#[repr(C)]
pub struct DeviceBlock {
    /// Guards everything of the device but its `DeviceInfo` (see `State::lock_device`).
    pub lock: OwnerLock,
    pub mem: MemState,
    pub engine: EngineState,
    pub exited_next: u64,
    pub exited: [ExitedProc; EXITED],
    pub procs: [ProcDev; MAX_PROCS],
    pub events: [Event; MAX_EVENTS],
    pub ctxs: [Ctx; MAX_CTXS],
}

/// One granule's place in an allocation: `head` is the allocation's first granule + 1 (0: free),
/// `next` the allocation's next granule + 1 (0: last).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Granule {
    pub head: u32,
    pub next: u32,
}

/// What an allocation is, for `simgpu show` and for the tests' ground truth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum AllocKind {
    Mem = 1,
    Pitch = 2,
    Managed = 3,
    Array = 4,
    Pool = 5,
    Vmm = 6,
    Context = 7,
    Module = 8,
    Graph = 9,
}

impl AllocKind {
    pub const ALL: [AllocKind; 9] = [
        AllocKind::Mem,
        AllocKind::Pitch,
        AllocKind::Managed,
        AllocKind::Array,
        AllocKind::Pool,
        AllocKind::Vmm,
        AllocKind::Context,
        AllocKind::Module,
        AllocKind::Graph,
    ];
    pub fn from_u32(v: u32) -> Option<AllocKind> {
        AllocKind::ALL.into_iter().find(|k| *k as u32 == v)
    }
    pub fn name(self) -> &'static str {
        match self {
            AllocKind::Mem => "mem",
            AllocKind::Pitch => "pitch",
            AllocKind::Managed => "managed",
            AllocKind::Array => "array",
            AllocKind::Pool => "pool",
            AllocKind::Vmm => "vmm",
            AllocKind::Context => "context",
            AllocKind::Module => "module",
            AllocKind::Graph => "graph",
        }
    }
}

/// An allocation, stored at the index of its first granule.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct AllocRec {
    pub valid: u32,
    pub kind: u32,
    pub owner: u32,
    pub generation: u32,
    pub size: u64,
    pub ngran: u32,
    /// Extra references (VMM handles imported by other processes).
    pub refs: u32,
}

pub const fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Where everything of a device with `ngran` granules sits, relative to its block.
pub struct DeviceLayout {
    pub granules: u64,
    pub allocs: u64,
    pub bitmap: u64,
    pub size: u64,
}

impl DeviceLayout {
    pub fn new(ngran: u32) -> DeviceLayout {
        let n = ngran as u64;
        let granules = align_up(std::mem::size_of::<DeviceBlock>() as u64, 4096);
        let allocs = align_up(granules + n * std::mem::size_of::<Granule>() as u64, 64);
        let bitmap = align_up(allocs + n * std::mem::size_of::<AllocRec>() as u64, 64);
        let size = align_up(bitmap + n.div_ceil(64) * 8, 4096);
        DeviceLayout {
            granules,
            allocs,
            bitmap,
            size,
        }
    }
}

pub fn cstr_field<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let bytes = s.as_bytes();
    let n = bytes.len().min(N - 1);
    out[..n].copy_from_slice(&bytes[..n]);
    out
}

pub fn field_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}
