//! The process-local half of the simulated driver: initialisation, the objects this process made
//! (contexts, streams, events, modules, pools, ...), the current-context stack of each thread,
//! the device virtual address space, and waiting for queued work in real time.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::mem::ManuallyDrop;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cuda_abi::CUresult;
use parking_lot::{Condvar, Mutex, MutexGuard};
use simgpu::clock::{self, US};
use simgpu::layout::GRANULE;
use simgpu::{AllocId, State};

use crate::handles::*;
use crate::ranges::FreeRanges;

pub type Res<T = ()> = Result<T, CUresult>;

pub const E_INVALID_VALUE: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;
pub const E_OOM: CUresult = CUresult::CUDA_ERROR_OUT_OF_MEMORY;
pub const E_INVALID_CONTEXT: CUresult = CUresult::CUDA_ERROR_INVALID_CONTEXT;
pub const E_INVALID_HANDLE: CUresult = CUresult::CUDA_ERROR_INVALID_HANDLE;
pub const E_INVALID_DEVICE: CUresult = CUresult::CUDA_ERROR_INVALID_DEVICE;

/// Turns a `Res` into the status the API returns.
pub fn status(r: Res) -> CUresult {
    match r {
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(e) => e,
    }
}

/// Writes through an out-pointer, refusing NULL.
///
/// # Safety
/// `p` must be NULL or valid for a write of `T`.
pub unsafe fn put<T>(p: *mut T, v: T) -> Res {
    if p.is_null() {
        return Err(E_INVALID_VALUE);
    }
    // SAFETY: non-NULL and valid per the contract.
    unsafe { p.write(v) };
    Ok(())
}

pub struct CtxLocal {
    /// Physical device index in the state file.
    pub dev: u32,
    /// CUDA ordinal as this process sees it.
    pub ordinal: i32,
    pub shared: u32,
    pub shared_gen: u32,
    pub primary: bool,
    pub flags: u32,
    /// Last item queued on the legacy default stream or any blocking stream.
    pub last_blocking: u64,
    pub legacy_last: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MapKind {
    /// cuMemAlloc / cuMemAllocPitch / cuMemAllocManaged: owns its allocation.
    Owned,
    /// A chunk of an async memory pool.
    PoolChunk,
    /// A VMM handle mapped with cuMemMap.
    Vmm,
    /// Memory of another process opened with cuIpcOpenMemHandle.
    Ipc,
    /// Graph-allocated memory, backed at the graph's first launch.
    Graph,
}

/// A range of this process's device address space.
#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    pub len: u64,
    pub dev: u32,
    pub ctx: u64,
    /// The allocation behind it (None: graph memory not backed yet).
    pub id: Option<AllocId>,
    /// Offset of the range's start inside the allocation.
    pub offset: u64,
    pub kind: MapKind,
    /// The bytes the caller asked for (Owned mappings).
    pub size: u64,
    pub host_mapped: bool,
    /// The VMM handle (Vmm mappings) or graph exec (Graph mappings), else 0.
    pub handle: u64,
}

/// The `dev` of a mapping of memory that no device holds: a host-located VMM handle.
pub const NO_DEVICE: u32 = u32::MAX;

impl Mapping {
    /// Whether the range's bytes are host memory rather than device memory: managed memory
    /// attached to the host (this process's own memory at the range's address), or a
    /// host-located VMM handle mapped with cuMemMap (a memory file, `vmm::HostMem`).
    pub fn on_host(&self) -> bool {
        self.id.is_none()
            && match self.kind {
                MapKind::Owned => self.host_mapped,
                MapKind::Vmm => true,
                _ => false,
            }
    }
}

pub struct Inner {
    pub ctxs: Registry<CtxLocal>,
    pub primary: Vec<(u64, u32, u32)>, // per ordinal: (ctx handle or 0, refcount, flags)
    pub streams: Registry<crate::stream::Stream>,
    pub events: Registry<crate::stream::EventObj>,
    pub modules: Registry<crate::module::Module>,
    pub funcs: Registry<crate::module::Func>,
    pub arrays: Registry<crate::memory::ArrayObj>,
    pub mipmaps: Registry<crate::memory::ArrayObj>,
    pub pools: Registry<crate::pool::Pool>,
    pub default_pool: Vec<u64>,
    pub current_pool: Vec<u64>,
    pub vmm: Registry<crate::vmm::VmmHandle>,
    pub graphs: Registry<crate::graph::Graph>,
    pub execs: Registry<crate::graph::Exec>,
    pub maps: BTreeMap<u64, Mapping>,
    /// cuMemAddressReserve ranges: start -> length.
    pub reserved: BTreeMap<u64, u64>,
    /// Page-locked host memory: address -> (length, made by us (true) or registered (false)).
    pub host: HashMap<u64, (usize, bool)>,
    pub va: VaSpace,
    pub va32: VaSpace,
    /// Streams capturing in global mode (unsafe calls are refused meanwhile).
    pub global_captures: u32,
    /// Per device: the sum of this process's managed allocations there, and the device memory
    /// that backs them beyond it (`memory::MANAGED_STEP`).
    pub managed: HashMap<u32, (u64, Option<AllocId>)>,
}

thread_local! {
    /// This thread's stream-capture interaction mode (cuThreadExchangeStreamCaptureMode);
    /// no destructor, so it works during thread teardown.
    pub static CAPTURE_MODE: std::cell::Cell<u32> =
        const { std::cell::Cell::new(cuda_abi::CU_STREAM_CAPTURE_MODE_GLOBAL) };
}

/// The lock on this process's objects, which every call that touches them takes. While the
/// process is locked by the checkpoint API (`checkpoint.rs`), callers wait here until it is
/// unlocked, as the real driver blocks a locked process's API calls; the process's checkpoint
/// thread passes.
pub struct Gate {
    inner: Mutex<Inner>,
    /// Threads holding the lock or on their way to it.
    held: AtomicU32,
    blocked: AtomicBool,
    wait: Mutex<()>,
    changed: Condvar,
}

thread_local! {
    /// Set on the process's checkpoint thread, which the gate never stops.
    pub static CHECKPOINT_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// How many gate guards this thread holds: a thread inside a call is let finish it.
    static HOLDING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

pub struct GateGuard<'a> {
    gate: &'a Gate,
    guard: Option<MutexGuard<'a, Inner>>,
}

/// A call under way that does not hold the lock ([`Gate::under_way`]).
pub struct UnderWay<'a> {
    _call: GateGuard<'a>,
}

impl std::ops::Deref for GateGuard<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for GateGuard<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        self.guard.as_mut().expect("held until dropped")
    }
}

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        self.guard = None;
        HOLDING.with(|h| h.set(h.get().saturating_sub(1)));
        self.gate.held.fetch_sub(1, Ordering::SeqCst);
        if self.gate.blocked.load(Ordering::SeqCst) {
            let _w = self.gate.wait.lock();
            self.gate.changed.notify_all();
        }
    }
}

impl Gate {
    pub fn new(inner: Inner) -> Gate {
        Gate {
            inner: Mutex::new(inner),
            held: AtomicU32::new(0),
            blocked: AtomicBool::new(false),
            wait: Mutex::new(()),
            changed: Condvar::new(),
        }
    }

    fn sleep_while_blocked(&self) {
        let mut w = self.wait.lock();
        while self.blocked.load(Ordering::SeqCst) {
            self.changed.wait_for(&mut w, Duration::from_millis(50));
        }
    }

    /// Waits while the process is locked for a checkpoint, unless this thread is the
    /// checkpoint thread or is inside a call (holds the lock).
    pub fn wait_open(&self) {
        if self.blocked.load(Ordering::SeqCst)
            && !CHECKPOINT_THREAD.with(|c| c.get())
            && HOLDING.with(|h| h.get()) == 0
        {
            self.sleep_while_blocked();
        }
    }

    /// Takes the lock, first waiting while the process is locked for a checkpoint.
    pub fn lock(&self) -> GateGuard<'_> {
        self.count_in();
        let guard = Some(self.inner.lock());
        GateGuard { gate: self, guard }
    }

    /// Marks a call under way for as long as the guard lives, without the lock: a copy or a
    /// memset, which reads or writes device memory with the lock let go. A checkpoint's lock
    /// waits for it, as for any call (first waiting while the process is locked).
    pub fn under_way(&self) -> UnderWay<'_> {
        self.count_in();
        UnderWay {
            _call: GateGuard {
                gate: self,
                guard: None,
            },
        }
    }

    /// Counts this thread in `held`, first waiting while the process is locked for a checkpoint,
    /// unless this thread is the checkpoint thread or already inside a call.
    fn count_in(&self) {
        let passes = CHECKPOINT_THREAD.with(|c| c.get()) || HOLDING.with(|h| h.get()) > 0;
        loop {
            if !passes && self.blocked.load(Ordering::SeqCst) {
                self.sleep_while_blocked();
            }
            // Counted before looking again, so that `block` sees either this thread or the
            // thread sees the block.
            self.held.fetch_add(1, Ordering::SeqCst);
            if passes || !self.blocked.load(Ordering::SeqCst) {
                break;
            }
            self.held.fetch_sub(1, Ordering::SeqCst);
            let _w = self.wait.lock();
            self.changed.notify_all();
        }
        HOLDING.with(|h| h.set(h.get() + 1));
    }

    /// Stops new calls and waits until none is under way, for at most `timeout` (None: as long
    /// as it takes). False if the time ran out; calls then go on.
    pub fn block(&self, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        self.blocked.store(true, Ordering::SeqCst);
        let mut w = self.wait.lock();
        while self.held.load(Ordering::SeqCst) != 0 {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                self.blocked.store(false, Ordering::SeqCst);
                self.changed.notify_all();
                return false;
            }
            self.changed.wait_for(&mut w, Duration::from_millis(5));
        }
        true
    }

    /// Lets calls in again.
    pub fn unblock(&self) {
        self.blocked.store(false, Ordering::SeqCst);
        let _w = self.wait.lock();
        self.changed.notify_all();
    }
}

pub struct Driver {
    pub state: State,
    /// CUDA ordinal -> physical device.
    pub visible: Vec<u32>,
    pub inner: Gate,
    pub hostfn: OnceLock<std::sync::mpsc::Sender<crate::stream::HostCall>>,
}

static DRIVER: OnceLock<Result<Driver, CUresult>> = OnceLock::new();
static FORKED: AtomicBool = AtomicBool::new(false);

// The per-thread state has no destructor (ManuallyDrop), so it stays usable while a thread is
// torn down: a `thread_local` destructor of the program (cuda.core releases its contexts from
// one) may run after ours would have, and the real driver permits driver calls there. Nothing
// leaks from a thread whose context stack is empty when it ends (an emptied stack gives its
// buffer back); one that ends with contexts current, or after using the per-thread default
// stream, leaves a few bytes, as the real driver's per-thread state does.
thread_local! {
    static CTX_STACK: ManuallyDrop<RefCell<Vec<u64>>> =
        const { ManuallyDrop::new(RefCell::new(Vec::new())) };
    /// Per-thread default streams: ctx handle -> last sequence number queued on it.
    pub static PER_THREAD: ManuallyDrop<RefCell<BTreeMap<u64, u64>>> =
        const { ManuallyDrop::new(RefCell::new(BTreeMap::new())) };
}

extern "C" fn after_fork_in_child() {
    // A child cannot use the CUDA state of its parent (as with the real driver); its liveness
    // slot belongs to the parent.
    if let Some(Ok(d)) = DRIVER.get() {
        d.state.forget_registration();
        FORKED.store(true, Ordering::Relaxed);
    }
}

/// `SIMGPU_ADDRESSES`: `reuse` (the default: first fit, so a freed address is handed out
/// again at once) or `fresh` (next fit: every allocation gets an address not used since the
/// space was last gone through). Err: one line.
fn fresh_addresses() -> Result<bool, String> {
    match std::env::var("SIMGPU_ADDRESSES") {
        Err(_) => Ok(false),
        Ok(v) => match v.trim() {
            "" | "reuse" => Ok(false),
            "fresh" => Ok(true),
            other => Err(format!(
                "simgpu: SIMGPU_ADDRESSES={:?} is neither reuse nor fresh; write e.g. \
                 SIMGPU_ADDRESSES=fresh",
                other.chars().take(64).collect::<String>()
            )),
        },
    }
}

/// cuInit: opens the state, registers the process, applies CUDA_VISIBLE_DEVICES.
pub fn init() -> CUresult {
    if FORKED.load(Ordering::Relaxed) {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    }
    let r = DRIVER.get_or_init(|| {
        let fresh = fresh_addresses().map_err(|e| {
            eprintln!("{e}");
            CUresult::CUDA_ERROR_INVALID_VALUE
        })?;
        let state = simgpu::state_from_env().map_err(|e| {
            eprintln!("{e}");
            CUresult::CUDA_ERROR_NO_DEVICE
        })?;
        state.register().map_err(|e| {
            eprintln!("{e}");
            CUresult::CUDA_ERROR_UNKNOWN
        })?;
        let visible = visible_devices(
            &state,
            std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
        );
        // SAFETY: registering a plain extern "C" function with no preconditions.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        let n = visible.len();
        Ok(Driver {
            state,
            visible,
            inner: Gate::new(Inner {
                ctxs: Registry::new(TAG_CTX),
                primary: vec![(0, 0, 0); n],
                streams: Registry::new(TAG_STREAM),
                events: Registry::new(TAG_EVENT),
                modules: Registry::new(TAG_MODULE),
                funcs: Registry::new(TAG_FUNC),
                arrays: Registry::new(TAG_ARRAY),
                mipmaps: Registry::new(TAG_MIPMAP),
                pools: Registry::new(TAG_POOL),
                default_pool: vec![0; n],
                current_pool: vec![0; n],
                vmm: Registry::new(TAG_VMM),
                graphs: Registry::new(TAG_GRAPH),
                execs: Registry::new(TAG_EXEC),
                maps: BTreeMap::new(),
                reserved: BTreeMap::new(),
                host: HashMap::new(),
                va: VaSpace::new(false, fresh),
                va32: VaSpace::new(true, fresh),
                global_captures: 0,
                managed: HashMap::new(),
            }),
            hostfn: OnceLock::new(),
        })
    });
    if let Ok(d) = r {
        crate::checkpoint::start(d);
    }
    match r {
        Ok(d) if d.visible.is_empty() => CUresult::CUDA_ERROR_NO_DEVICE,
        Ok(_) => CUresult::CUDA_SUCCESS,
        Err(e) => *e,
    }
}

/// The initialised driver, or CUDA_ERROR_NOT_INITIALIZED. While the process is locked by the
/// checkpoint API, a call waits here until it is unlocked (every entry point goes through here,
/// also those that never take the process's lock), as the real driver blocks every API call of
/// a locked process.
pub fn drv() -> Res<&'static Driver> {
    let d = driver()?;
    d.inner.wait_open();
    Ok(d)
}

/// The initialised driver, for the checkpoint API itself, which a locked process may call.
pub fn driver() -> Res<&'static Driver> {
    if FORKED.load(Ordering::Relaxed) {
        return Err(CUresult::CUDA_ERROR_NOT_INITIALIZED);
    }
    match DRIVER.get() {
        Some(Ok(d)) if !d.visible.is_empty() => Ok(d),
        Some(Ok(_)) => Err(CUresult::CUDA_ERROR_NO_DEVICE),
        _ => Err(CUresult::CUDA_ERROR_NOT_INITIALIZED),
    }
}

/// CUDA_VISIBLE_DEVICES as the real driver reads it: indices or UUIDs (`GPU-` prefixes),
/// comma-separated; the list stops at the first entry that names no (new) device.
pub fn visible_devices(state: &State, spec: Option<&str>) -> Vec<u32> {
    let all: Vec<u32> = (0..state.ndev()).collect();
    let Some(spec) = spec else { return all };
    let mut out = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        let found = if let Ok(i) = entry.parse::<u32>() {
            all.iter().copied().find(|&d| d == i)
        } else if entry.len() > 4 && entry.to_ascii_uppercase().starts_with("GPU-") {
            let want = entry.to_ascii_lowercase();
            let hits: Vec<u32> = all
                .iter()
                .copied()
                .filter(|&d| state.uuid_string(d).to_ascii_lowercase().starts_with(&want))
                .collect();
            (hits.len() == 1).then(|| hits[0])
        } else {
            None
        };
        match found {
            Some(d) if !out.contains(&d) => out.push(d),
            _ => break,
        }
    }
    out
}

impl Driver {
    pub fn physical(&self, ordinal: i32) -> Res<u32> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|o| self.visible.get(o).copied())
            .ok_or(E_INVALID_DEVICE)
    }

    pub fn overhead(&self) -> u64 {
        self.state.config().context_overhead
    }
}

// ---- the current context ----------------------------------------------------------------

pub fn current_ctx() -> Option<u64> {
    CTX_STACK.with(|s| s.borrow().last().copied())
}

pub fn set_current(h: Option<u64>) {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        match (h, s.is_empty()) {
            (Some(h), true) => s.push(h),
            (Some(h), false) => *s.last_mut().unwrap() = h,
            (None, _) => {
                s.pop();
            }
        }
        give_back_if_empty(&mut s);
    })
}

pub fn push_current(h: u64) {
    CTX_STACK.with(|s| s.borrow_mut().push(h))
}

pub fn pop_current() -> Option<u64> {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        let h = s.pop();
        give_back_if_empty(&mut s);
        h
    })
}

/// Drops a destroyed context from this thread's stack.
pub fn forget_current(h: u64) {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.retain(|&c| c != h);
        give_back_if_empty(&mut s);
    })
}

/// Frees an empty stack's buffer (the stack itself is never dropped).
fn give_back_if_empty(s: &mut Vec<u64>) {
    if s.is_empty() {
        *s = Vec::new();
    }
}

impl Inner {
    /// The current context of this thread, checked to be alive.
    pub fn cur(&self) -> Res<(u64, &CtxLocal)> {
        let h = current_ctx().ok_or(E_INVALID_CONTEXT)?;
        self.ctxs.get(h).map(|c| (h, c)).ok_or(E_INVALID_CONTEXT)
    }

    pub fn ctx(&self, h: u64) -> Res<&CtxLocal> {
        self.ctxs.get(h).ok_or(E_INVALID_CONTEXT)
    }

    /// The mapping containing `va`, with its start.
    pub fn find(&self, va: u64) -> Option<(u64, Mapping)> {
        self.maps
            .range(..=va)
            .next_back()
            .filter(|(s, m)| va < *s + m.len)
            .map(|(s, m)| (*s, *m))
    }

    pub fn refuse_if_capturing(&mut self) -> Res {
        // A thread in relaxed mode (cuThreadExchangeStreamCaptureMode) may make unsafe calls.
        let relaxed = CAPTURE_MODE.get() == cuda_abi::CU_STREAM_CAPTURE_MODE_RELAXED;
        if self.global_captures > 0 && !relaxed {
            for h in self.streams.handles() {
                if let Some(s) = self.streams.get_mut(h)
                    && let Some(c) = s.capture.as_mut()
                    && c.mode == cuda_abi::CU_STREAM_CAPTURE_MODE_GLOBAL
                {
                    c.invalidated = true;
                }
            }
            return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        Ok(())
    }
}

// ---- device virtual address space -------------------------------------------------------

/// A reserved (PROT_NONE) range of this process's address space from which device pointers are
/// handed out, so they never collide with host memory and managed memory can be mapped there.
pub struct VaSpace {
    low: bool,
    base: u64,
    len: u64,
    free: FreeRanges,
    /// `SIMGPU_ADDRESSES=fresh`: hand out addresses next fit from `cursor`, so that no address
    /// comes back until the space has been gone through once; else first fit.
    fresh: bool,
    cursor: u64,
}

const VA_SIZE: u64 = 1 << 44; // 16 TiB
/// For the 32-bit (v1) API; MAP_32BIT has a 1 GiB window on x86-64, shared with the program.
const VA32_SIZE: u64 = 256 << 20;

impl VaSpace {
    fn new(low: bool, fresh: bool) -> VaSpace {
        VaSpace {
            low,
            base: 0,
            len: 0,
            free: FreeRanges::default(),
            fresh,
            cursor: 0,
        }
    }

    fn reserve(&mut self) -> Res {
        if self.len != 0 {
            return Ok(());
        }
        let (len, extra) = if self.low {
            (VA32_SIZE, libc::MAP_32BIT)
        } else {
            (VA_SIZE, 0)
        };
        // SAFETY: an anonymous PROT_NONE reservation; nothing is overwritten (no MAP_FIXED).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | extra,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(E_OOM);
        }
        self.base = (p as u64).next_multiple_of(GRANULE);
        self.len = len - (self.base - p as u64);
        self.free = FreeRanges::new(self.base, self.len);
        Ok(())
    }

    /// Takes `len` bytes (rounded to 2 MiB) aligned to `align` (at least 2 MiB).
    pub fn take(&mut self, len: u64, align: u64) -> Res<u64> {
        self.reserve()?;
        let align = align.max(GRANULE).next_power_of_two();
        let len = len.max(1).next_multiple_of(GRANULE);
        if !self.fresh {
            return self.free.take(len, align).ok_or(E_OOM);
        }
        let at = self.free.take_from(self.cursor, len, align).ok_or(E_OOM)?;
        self.cursor = at + len;
        Ok(at)
    }

    /// Takes exactly `[addr, addr+len)` if it is free (cuMemAddressReserve with a fixed address).
    pub fn take_at(&mut self, addr: u64, len: u64) -> Option<u64> {
        self.reserve().ok()?;
        self.free
            .take_at(addr, len.next_multiple_of(GRANULE))
            .then_some(addr)
    }

    pub fn give(&mut self, addr: u64, len: u64) {
        self.free.give(addr, len.max(1).next_multiple_of(GRANULE));
    }

    pub fn contains(&self, addr: u64) -> bool {
        self.len != 0 && addr >= self.base && addr < self.base + self.len
    }
}

// ---- waiting for work -------------------------------------------------------------------

/// Blocks until item `seq` of shared context `ctx` on device `dev` has finished (or the context
/// is gone), sleeping (never spinning) for at least the engine time still needed, and waking on
/// time (`clock::sleep_ns_on_time`): a real driver's synchronising call either spins or yields
/// through the wait (a stream's, a context's, an event's without `CU_EVENT_BLOCKING_SYNC`) or
/// blocks in the kernel until the device's interrupt wakes it (a blocking-sync event, the
/// driver's own threads); neither wakes later for want of another process's timer.
pub fn wait_seq(d: &Driver, dev: u32, ctx: u32, ctx_gen: u32, seq: u64) {
    loop {
        let wait = {
            let mut g = d.state.lock_device(dev);
            g.advance_now();
            let dv = g.dev();
            if !dv.ctx_valid(ctx, ctx_gen) || dv.completed(ctx) >= seq {
                return;
            }
            dv.min_wait(ctx, seq)
        };
        clock::sleep_ns_on_time(wait.clamp(20 * US, 10_000 * US));
    }
}
