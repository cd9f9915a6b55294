//! This process's membership of a slice: whether it has joined (`state`), the slice it joined
//! (the configuration, the ledger, its slot), the devices as this process sees them (ordinal ->
//! UUID, cap, allocation granularity), the one step every charge goes through (`Slice::reserve`),
//! and the process-local tables of what it holds (which allocation was charged how much, to
//! which device and context; what each stream-ordered pool is charged). What a fork does to
//! those tables is in `fork`.
//!
//! Joining is `startup`'s (at cuInit, or at the first NVML call of a process that never calls
//! it); this module only keeps what it set. It uses the real entry points (`real`) and
//! cuslice's own NVML queries (`nvml_query`), and nothing above them: the wrappers of every API
//! area use it, and it uses none of them.
//!
//! Nothing here runs until CUDA or NVML is used: a process that never touches them (a shell, `ls`,
//! with the library in /etc/ld.so.preload) pays for the `dlsym` check and nothing else.

use std::cell::{Cell, UnsafeCell};
use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, Ordering};

use cuda_abi::*;
use cuslice_policy::config::Config;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::alloc_table::Table;
use crate::log::info;
use crate::real;
use cuslice_state::ledger::{Ledger, OverCap};

pub use cuslice_state::uuid_string;

mod fork;
pub use fork::{before_fork, child_after_fork, unlock_after_fork};

const UNINIT: u8 = 0;
/// No cuslice setting at all: every call goes straight to the driver.
const OFF: u8 = 1;
const ON: u8 = 2;
/// A bad setting: CUDA initialisation is refused, and so is every counted call.
const REFUSED: u8 = 3;

static MODE: AtomicU8 = AtomicU8::new(UNINIT);
static SLICE: AtomicPtr<Slice> = AtomicPtr::new(std::ptr::null_mut());

pub struct Dev {
    pub cudev: CUdevice,
    /// The device's record in the ledger.
    pub index: u32,
    pub uuid: [u8; 16],
    pub physical: u64,
    /// The driver's allocation granularity: what a small allocation really takes.
    pub granularity: u64,
}

pub struct Slice {
    pub config: Config,
    pub ledger: Ledger,
    pub slot: u32,
    /// The OCI hook made the slice (a container): its place on the node's compute board too.
    pub hooked: bool,
    /// Set at cuInit (an NVML-only process such as nvidia-smi never sets it). The compute
    /// meters of the devices (`compute`) are set just before.
    pub devs: OnceLock<Vec<Dev>>,
}

pub enum State {
    /// cuInit has not run (or the process never uses CUDA): the driver answers for itself.
    Uninit,
    Off,
    On(&'static Slice),
    Refused,
}

pub fn state() -> State {
    match MODE.load(Ordering::Acquire) {
        OFF => State::Off,
        REFUSED => State::Refused,
        ON => {
            let p = SLICE.load(Ordering::Acquire);
            // SAFETY: published once with Release after full construction, never freed (a forked
            // child leaks it and resets MODE first).
            match unsafe { p.as_ref() } {
                Some(s) => State::On(s),
                None => State::Uninit,
            }
        }
        _ => State::Uninit,
    }
}

/// The slice when cuInit has attached the devices.
pub fn active() -> Result<Option<&'static Slice>, CUresult> {
    match state() {
        State::On(s) if s.devs.get().is_some() => Ok(Some(s)),
        State::Refused => Err(CUresult::CUDA_ERROR_NOT_PERMITTED),
        _ => Ok(None),
    }
}

/// Whether the process has settled its membership: None before (nobody joined yet), else
/// whether CUDA may be used (false: refused).
pub fn settled() -> Option<bool> {
    match MODE.load(Ordering::Acquire) {
        UNINIT => None,
        m => Some(m != REFUSED),
    }
}

/// The membership is refused: CUDA initialisation and every counted call are refused.
pub fn set_refused() {
    MODE.store(REFUSED, Ordering::Release);
}

/// No cuslice setting applies to this process: every call goes straight to the driver.
pub fn set_off() {
    MODE.store(OFF, Ordering::Release);
}

/// Publishes the slice this process joined (once; it is never freed).
pub fn set_joined(slice: Box<Slice>) {
    SLICE.store(Box::into_raw(slice), Ordering::Release);
    MODE.store(ON, Ordering::Release);
}

impl Slice {
    pub fn devs(&self) -> &[Dev] {
        self.devs.get().map_or(&[], |v| v.as_slice())
    }

    pub fn dev_by_cudev(&self, d: CUdevice) -> Option<usize> {
        self.devs().iter().position(|x| x.cudev == d)
    }

    /// What this slice reports for device `ordinal`: (cap, slice holds), after reclaiming what
    /// dead processes held.
    pub fn cap_and_used(&self, ordinal: usize) -> Option<(Option<u64>, u64)> {
        let d = self.devs().get(ordinal)?;
        self.sweep();
        Some((self.ledger.limit(d.index), self.ledger.used(d.index)))
    }

    /// Reclaims what dead processes of the slice held, on each device once the driver no longer
    /// lists the process there (until then the memory is still on the device). Where NVML cannot
    /// tell, a dead process's holdings are reclaimed at once. Returns the bytes still held for
    /// dead processes the driver has not finished with.
    pub fn sweep(&self) -> u64 {
        self.ledger.sweep(self.slot, &|pid, uuid| {
            crate::nvml_query::lists_pid(uuid, pid).unwrap_or(false)
        })
    }

    /// Checks and reserves `bytes` on device `ordinal` for this process: the one step every
    /// allocation goes through. Before refusing, reclaims dead processes' holdings and this
    /// process's idle pool memory, then tries once more; while the driver is still tearing down
    /// a dead process of the slice, it waits for that (up to `DEAD_WAIT`) rather than refuse.
    pub fn reserve(&self, ordinal: usize, bytes: u64) -> Result<(), CUresult> {
        self.reserve_quietly(ordinal, bytes)
            .map_err(|over| self.refuse(ordinal, bytes, over))
    }

    /// `reserve` without recording or logging a refusal: Err says what the slice holds of its
    /// cap.
    pub fn reserve_quietly(&self, ordinal: usize, bytes: u64) -> Result<(), OverCap> {
        let Some(d) = self.devs().get(ordinal) else {
            return Ok(());
        };
        if bytes == 0 || self.ledger.reserve(self.slot, d.index, bytes).is_ok() {
            return Ok(());
        }
        let mut waiting = self.sweep();
        give_back_idle(self, ordinal);
        let _busy = crate::gate::busy_while();
        let deadline = std::time::Instant::now() + DEAD_WAIT;
        let mut result = self.ledger.reserve(self.slot, d.index, bytes);
        while result.is_err() && waiting > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(2));
            waiting = self.sweep();
            result = self.ledger.reserve(self.slot, d.index, bytes);
        }
        result
    }

    /// Records and logs a refusal at the cap; the error every refusal returns.
    fn refuse(&self, ordinal: usize, bytes: u64, over: OverCap) -> CUresult {
        if let Some(d) = self.devs().get(ordinal) {
            self.ledger.note_refusal(d.index);
        }
        info!(
            "refused {} on device {ordinal}: the slice holds {} of its {} cap",
            cuslice_policy::format_size(bytes),
            cuslice_policy::format_size(over.used),
            cuslice_policy::format_size(over.limit)
        );
        CUresult::CUDA_ERROR_OUT_OF_MEMORY
    }

    /// `reserve` for an allocation that may wait at the cap (`CUSLICE_MEMORY_WAIT`; without it,
    /// `reserve` itself). It queues behind the slice's allocations already waiting on the device
    /// (first come, first served), sleeps on the ledger's futex word holding no lock, and is
    /// woken by the slice's frees; every `RECHECK` it also looks for what a dead process left
    /// and for a cap the node raised, which come without a free. Out of time, it is refused as
    /// `reserve` would be. Only for calls that hold no lock a free could need: a free of this
    /// process must never wait for its own waiting allocation.
    pub fn reserve_or_wait(&self, ordinal: usize, bytes: u64) -> Result<(), CUresult> {
        let Some(wait) = self.config.memory_wait else {
            return self.reserve(ordinal, bytes);
        };
        let Some(d) = self.devs().get(ordinal) else {
            return Ok(());
        };
        if bytes == 0 {
            return Ok(());
        }
        let over = if self.ledger.queued(d.index) {
            OverCap {
                used: self.ledger.used(d.index),
                limit: self.ledger.limit(d.index).unwrap_or(u64::MAX),
            }
        } else {
            match self.reserve_quietly(ordinal, bytes) {
                Ok(()) => return Ok(()),
                Err(over) => over,
            }
        };
        if bytes > over.limit {
            // No free can ever make room for it.
            return Err(self.refuse(ordinal, bytes, over));
        }
        // However long it waits, the process is not idle (`freeze`).
        let _busy = crate::gate::busy_while();
        let Some(ticket) = self.ledger.wait_enter(d.index) else {
            info!("{WAIT_SLOTS_FULL}");
            return Err(self.refuse(ordinal, bytes, over));
        };
        let deadline = std::time::Instant::now() + wait;
        loop {
            let seq = match self.ledger.wait_try(self.slot, d.index, bytes, ticket) {
                Ok(()) => return Ok(()),
                Err(seq) => seq,
            };
            let now = std::time::Instant::now();
            if now >= deadline {
                self.ledger.wait_leave(d.index, ticket);
                let over = OverCap {
                    used: self.ledger.used(d.index),
                    limit: self.ledger.limit(d.index).unwrap_or(u64::MAX),
                };
                return Err(self.refuse(ordinal, bytes, over));
            }
            self.ledger
                .wait_sleep(d.index, seq, (deadline - now).min(RECHECK));
            self.sweep();
        }
    }

    /// Whether allocations past the cap may be served from host memory
    /// (`CUSLICE_MEMORY_SPILL`).
    #[inline]
    pub fn spills(&self) -> bool {
        self.config.memory_spill.is_some()
    }

    /// Checks and reserves `bytes` of spill (host memory past the cap) on device `ordinal`:
    /// within what this process holds by its own count and its own `CUSLICE_MEMORY_SPILL`
    /// (`MINE_SPILLED`), then within the slice's spill in the ledger.
    pub fn reserve_spill(&self, ordinal: usize, bytes: u64) -> Result<(), CUresult> {
        let (Some(d), Some(mine)) = (self.devs().get(ordinal), MINE_SPILLED.get(ordinal)) else {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        };
        let own = self.config.memory_spill.unwrap_or(0);
        if let Err(held) = mine.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
            held.checked_add(bytes).filter(|&after| after <= own)
        }) {
            info!(
                "cannot spill {} on device {ordinal}: this process holds {} of its {} spill",
                cuslice_policy::format_size(bytes),
                cuslice_policy::format_size(held),
                cuslice_policy::format_size(own)
            );
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        self.ledger
            .reserve_spill(self.slot, d.index, bytes)
            .map_err(|over| {
                mine.fetch_sub(bytes, Ordering::Relaxed);
                info!(
                    "cannot spill {} on device {ordinal}: the slice holds {} of its {} spill",
                    cuslice_policy::format_size(bytes),
                    cuslice_policy::format_size(over.used),
                    cuslice_policy::format_size(over.limit)
                );
                CUresult::CUDA_ERROR_OUT_OF_MEMORY
            })
    }

    pub fn release_spill(&self, ordinal: usize, bytes: u64) {
        if let Some(d) = self.devs().get(ordinal)
            && bytes > 0
        {
            if let Some(mine) = MINE_SPILLED.get(ordinal) {
                // Never below nothing: what this process reserved is all it gives back.
                let _ = mine.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                    Some(held.saturating_sub(bytes))
                });
            }
            self.ledger.release_spill(self.slot, d.index, bytes);
        }
    }

    pub fn release(&self, ordinal: usize, bytes: u64) {
        if let Some(d) = self.devs().get(ordinal)
            && bytes > 0
        {
            self.ledger.release(self.slot, d.index, bytes);
        }
    }

    /// Charges `bytes` the driver already holds for this process on device `ordinal` (a pool
    /// grown beyond what its allocations charged), whether or not they fit under the cap: the
    /// slice never charges less than the driver holds.
    pub fn charge_held(&self, ordinal: usize, bytes: u64) {
        if let Some(d) = self.devs().get(ordinal)
            && bytes > 0
        {
            self.ledger.charge(self.slot, d.index, bytes);
        }
    }

    /// Moves a reservation of `reserved` to `actual` bytes. If more is needed and it does not
    /// fit, the reservation is given back and the caller must undo the operation.
    pub fn settle(&self, ordinal: usize, reserved: u64, actual: u64) -> Result<(), CUresult> {
        if actual > reserved {
            self.reserve(ordinal, actual - reserved)
                .inspect_err(|_| self.release(ordinal, reserved))
        } else {
            self.release(ordinal, reserved - actual);
            Ok(())
        }
    }

    /// Rounds a request up to what the driver really takes for it. Granularities are powers of
    /// two on every driver we know of: a mask then, not a 64-bit division, on every allocation.
    #[inline]
    pub fn rounded(&self, ordinal: usize, bytes: u64) -> u64 {
        let g = self.devs().get(ordinal).map_or(1, |d| d.granularity.max(1));
        if g.is_power_of_two() {
            return bytes.checked_add(g - 1).map_or(u64::MAX, |b| b & !(g - 1));
        }
        bytes.div_ceil(g).saturating_mul(g)
    }

    /// What this process has charged on device `ordinal`: for telling its own allocations apart
    /// from hidden memory when measuring what the device holds. Read from its own slot of the
    /// ledger (no process-wide counter for every allocation to update).
    pub fn own_charged(&self, ordinal: usize) -> u64 {
        self.devs()
            .get(ordinal)
            .map_or(0, |d| self.ledger.charged(self.slot, d.index))
    }
}

/// How long a refusal waits for the driver to free a dead process's memory.
const DEAD_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How often an allocation waiting at the cap looks for memory that came back without a free
/// (a dead process's, reclaimed by the sweep; a cap the node raised).
const RECHECK: std::time::Duration = std::time::Duration::from_millis(100);

const WAIT_SLOTS_FULL: &str = "the slice's queue of allocations waiting at the cap is full; \
                               refused at once";

// ---- the current context ---------------------------------------------------------------------

static CTX_GENERATION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static CURRENT: Cell<(usize, usize, u64)> = const { Cell::new((0, 0, u64::MAX)) };
}

/// Contexts were destroyed: cached context -> device answers may be stale.
pub fn contexts_changed() {
    CTX_GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The context of a charge whose allocation the driver can name the context of
/// (`CU_POINTER_ATTRIBUTE_CONTEXT`): asked only when a context goes away ([`ask_contexts`]), so
/// that an allocation on a process's one device costs no call for its context.
pub const CTX_ASK: usize = usize::MAX;

/// What an allocation of device memory is charged under: (context, device ordinal). On a slice of
/// one device, [`CTX_ASK`] and 0 without asking the driver; else as [`current`]. A call made
/// with no context current still reaches the driver, which refuses it.
#[inline]
pub fn allocation_place(s: &Slice) -> Option<(usize, usize)> {
    if s.devs().len() == 1 {
        return Some((CTX_ASK, 0));
    }
    current(s)
}

/// The current context and the ordinal of its device, or None without a current context (the
/// real call will then report the error itself).
#[inline]
pub fn current(s: &Slice) -> Option<(usize, usize)> {
    let get = real::cuCtxGetCurrent()?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    if !unsafe { get(&mut ctx) }.is_ok() || ctx.is_null() {
        return None;
    }
    // One device (the usual case): every context is on it; no need to ask which.
    if s.devs().len() == 1 {
        return Some((ctx as usize, 0));
    }
    current_device(s, ctx)
}

fn current_device(s: &Slice, ctx: CUcontext) -> Option<(usize, usize)> {
    let gen_now = CTX_GENERATION.load(Ordering::Relaxed);
    let (c, o, g) = CURRENT.with(|c| c.get());
    if c == ctx as usize && g == gen_now {
        return Some((c, o));
    }
    let mut d: CUdevice = 0;
    // SAFETY: valid out-pointer; a context is current.
    if !unsafe { real::cuCtxGetDevice()?(&mut d) }.is_ok() {
        return None;
    }
    let o = s.dev_by_cudev(d)?;
    CURRENT.with(|c| c.set((ctx as usize, o, gen_now)));
    Some((ctx as usize, o))
}

// ---- the process-local table -----------------------------------------------------------------

/// One charge: `bytes` on device `dev`, made under context `ctx` (0: not tied to a context;
/// [`CTX_ASK`]: the context current when it was made, which the driver names when asked).
#[derive(Clone, Copy, Debug)]
pub struct Charge {
    pub dev: usize,
    pub bytes: u64,
    pub ctx: usize,
}

#[derive(Debug)]
pub struct VmmHandle {
    pub charge: Charge,
    /// References: cuMemCreate's plus one per cuMemRetainAllocationHandle, minus releases.
    pub refs: u32,
    /// Live mappings of the handle; its memory is freed when both counts reach zero.
    pub maps: u32,
}

#[derive(Debug)]
pub struct PoolRec {
    pub dev: usize,
    /// The pool's reserved memory as last charged.
    pub charged: u64,
}

#[derive(Default)]
pub struct Local {
    pub arrays: FxHashMap<usize, Charge>,
    pub vmm: FxHashMap<u64, VmmHandle>,
    /// Mapped VA ranges: start -> (length, handle).
    pub mappings: std::collections::BTreeMap<u64, (u64, u64)>,
    pub pools: FxHashMap<usize, PoolRec>,
    /// Contexts this process made: context -> charge for its hidden memory.
    pub contexts: FxHashMap<usize, Charge>,
    /// Primary contexts: device ordinal -> (context, retain count).
    pub primary: FxHashMap<usize, (usize, u32)>,
    /// Modules and libraries: handle -> charge for the memory their loading took.
    pub modules: FxHashMap<usize, Charge>,
}

pub static LOCAL: Mutex<Option<Local>> = Mutex::new(None);

/// Runs `f` on the process-local table.
pub fn local<R>(f: impl FnOnce(&mut Local) -> R) -> R {
    let mut g = LOCAL.lock();
    f(g.get_or_insert_with(Local::default))
}

// ---- managed memory ---------------------------------------------------------------------------

/// Managed allocations, kept apart from the allocation table: the driver backs a process's
/// managed memory on a device in steps (`cuslice_policy::managed`), so what is charged for them
/// on a device is their sum rounded up to the step, not each alone. One lock serialises the
/// managed allocations and frees of the process (rare, and never on the launch path). Lock
/// order: `MANAGED` before `LOCAL` (a reservation may give back idle pool memory).
#[derive(Default)]
pub struct Managed {
    /// Pointer -> charge (the allocation's own bytes).
    pub allocs: FxHashMap<u64, Charge>,
    /// Device ordinal -> the sum of its allocations' bytes.
    pub bytes: FxHashMap<usize, u64>,
}

impl Managed {
    /// What is charged on a device for managed allocations of `bytes` in all.
    pub fn backed(bytes: u64) -> u64 {
        bytes.saturating_add(cuslice_policy::managed::slack(bytes))
    }

    /// The sum of the allocations on device `dev`.
    pub fn held(&self, dev: usize) -> u64 {
        self.bytes.get(&dev).copied().unwrap_or(0)
    }

    /// Records an allocation (what it adds to the charge on its device, the caller reserved).
    pub fn insert(&mut self, ptr: u64, c: Charge) {
        *self.bytes.entry(c.dev).or_default() += c.bytes;
        self.allocs.insert(ptr, c);
    }

    /// Forgets the allocation at `ptr`; returns it and what the charge on its device drops by.
    pub fn remove(&mut self, ptr: u64) -> Option<(Charge, u64)> {
        let c = self.allocs.remove(&ptr)?;
        let before = self.held(c.dev);
        let after = before.saturating_sub(c.bytes);
        self.bytes.insert(c.dev, after);
        Some((c, Self::backed(before) - Self::backed(after)))
    }
}

pub static MANAGED: Mutex<Option<Managed>> = Mutex::new(None);

/// Allocations served from host memory past the cap (`CUSLICE_MEMORY_SPILL`): pointer -> charge
/// against the slice's spill. Apart from the allocation table, so that the table and its hot
/// path stay as they are; a free the table does not know looks here only once the process has
/// spilled (`SPILL_USED`).
pub static SPILLED: Mutex<Option<FxHashMap<u64, Charge>>> = Mutex::new(None);
pub static SPILL_USED: AtomicBool = AtomicBool::new(false);
/// What this process holds in host memory past the cap, per device ordinal, by its own count.
/// The ledger's spill words (the slice's bound and what its processes hold) are in a file the
/// tenant can write; this count and the process's configuration (root-owned in a container) are
/// not, so a tenant who rewrites those words still spills at most its `CUSLICE_MEMORY_SPILL` in
/// each process.
pub static MINE_SPILLED: [AtomicU64; cuslice_state::ledger::MAX_DEVICES] =
    [const { AtomicU64::new(0) }; cuslice_state::ledger::MAX_DEVICES];
/// Whether the process ever made a managed allocation: a free the allocation table does not know
/// looks in `MANAGED` only then.
pub static MANAGED_USED: AtomicBool = AtomicBool::new(false);

/// Runs `f` on the managed-memory table.
pub fn managed<R>(f: impl FnOnce(&mut Managed) -> R) -> R {
    let mut g = MANAGED.lock();
    f(g.get_or_insert_with(Managed::default))
}

// ---- the allocation table ----------------------------------------------------------------------

/// Allocations charged by pointer (cuMemAlloc, pitched, managed): pointer -> charge. Every
/// allocation and free of the process touches it, from any thread, so it is split into shards by
/// the pointer's hash, each with its own lock in its own cache line: threads allocating at once
/// seldom meet on a lock (one process-wide lock had every thread queue on it).
const SHARDS: usize = 64;

/// One shard: a spin lock (taken with one compare-and-swap, given back with a plain store; a
/// parking mutex gives back with a second compare-and-swap) around a table whose inline keys
/// share the lock's cache line (`alloc_table`). It is held for one table operation, and with 64
/// shards two threads seldom want the same one; a thread that does spins briefly, then yields
/// until the holder is scheduled again.
#[repr(C, align(64))]
struct Shard {
    locked: AtomicBool,
    map: UnsafeCell<Table<Charge>>,
}

// SAFETY: `map` is only reached through `with`, under `locked`.
unsafe impl Sync for Shard {}

impl Shard {
    const fn new() -> Shard {
        Shard {
            locked: AtomicBool::new(false),
            map: UnsafeCell::new(Table::new(Charge {
                dev: 0,
                bytes: 0,
                ctx: 0,
            })),
        }
    }

    #[inline]
    fn lock(&self) {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
    }

    #[cold]
    fn lock_contended(&self) {
        let mut tries = 0u32;
        loop {
            if !self.locked.load(Ordering::Relaxed)
                && self
                    .locked
                    .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            tries += 1;
            if tries < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    #[inline]
    fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }

    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut Table<Charge>) -> R) -> R {
        self.lock();
        // SAFETY: the lock is held: nobody else reaches the map until `unlock`. `f` cannot
        // unwind (panic = abort), so the lock is always given back.
        let r = f(unsafe { &mut *self.map.get() });
        self.unlock();
        r
    }
}

static ALLOCS: [Shard; SHARDS] = [const { Shard::new() }; SHARDS];

#[inline]
fn shard(ptr: u64) -> &'static Shard {
    // Fibonacci hashing: the top bits of the product depend on every bit of the pointer (device
    // pointers share their low, aligned bits).
    let i = (ptr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SHARDS.trailing_zeros())) as usize;
    &ALLOCS[i % SHARDS]
}

/// Records the charge of the allocation at `ptr`; returns a charge it replaced.
#[inline]
pub fn alloc_insert(ptr: u64, c: Charge) -> Option<Charge> {
    shard(ptr).with(|m| m.insert(ptr, c))
}

/// Forgets the allocation at `ptr`, returning its charge.
#[inline]
pub fn alloc_remove(ptr: u64) -> Option<Charge> {
    shard(ptr).with(|m| m.remove(&ptr))
}

/// Before context `ctx` goes away: every charge made under [`CTX_ASK`] is given the context the
/// driver says its allocation is in, while the driver still knows it (one call for each; a charge
/// the driver cannot place keeps `CTX_ASK`: nothing releases it with a context).
pub fn ask_contexts(ctx: usize) {
    let Some(attr) = real::cuPointerGetAttribute() else {
        return;
    };
    for sh in ALLOCS.iter() {
        let mut asked = Vec::new();
        sh.with(|m| {
            m.retain(|&ptr, c| {
                if c.ctx == CTX_ASK {
                    asked.push(ptr);
                }
                true
            })
        });
        if asked.is_empty() {
            continue;
        }
        // Asked with the shard unlocked: the driver takes locks of its own.
        let going: rustc_hash::FxHashSet<u64> = asked
            .into_iter()
            .filter(|&ptr| {
                let mut c: CUcontext = std::ptr::null_mut();
                // SAFETY: a CUcontext out-value for CU_POINTER_ATTRIBUTE_CONTEXT, of an
                // allocation the driver handed out and this process has not freed.
                let r = unsafe {
                    attr(
                        (&mut c as *mut CUcontext).cast::<c_void>(),
                        CU_POINTER_ATTRIBUTE_CONTEXT,
                        ptr,
                    )
                };
                r.is_ok() && c as usize == ctx
            })
            .collect();
        if going.is_empty() {
            // Only the charges of the context going away are placed; the others stay to ask.
            continue;
        }
        sh.with(|m| {
            m.retain(|p, v| {
                if v.ctx == CTX_ASK && going.contains(p) {
                    v.ctx = ctx;
                }
                true
            })
        });
    }
}

/// A context went away (destroyed, or a primary context's last release or a reset): the driver
/// freed everything made in it.
pub fn context_gone(s: &Slice, ctx: usize) {
    let mut freed = Vec::new();
    for sh in ALLOCS.iter() {
        sh.with(|m| {
            m.retain(|_, c| {
                c.ctx != ctx || {
                    freed.push(*c);
                    false
                }
            })
        });
    }
    freed.extend(local(|l| {
        let mut out = Vec::new();
        l.arrays.retain(|_, c| {
            c.ctx != ctx || {
                out.push(*c);
                false
            }
        });
        l.modules.retain(|_, c| {
            c.ctx != ctx || {
                out.push(*c);
                false
            }
        });
        if let Some(c) = l.contexts.remove(&ctx) {
            out.push(c);
        }
        out
    }));
    for c in freed {
        s.release(c.dev, c.bytes);
    }
    if SPILL_USED.load(Ordering::Relaxed) {
        let mut gone = Vec::new();
        if let Some(t) = SPILLED.lock().as_mut() {
            t.retain(|_, c| {
                c.ctx != ctx || {
                    gone.push(*c);
                    false
                }
            });
        }
        for c in gone {
            s.release_spill(c.dev, c.bytes);
        }
    }
    if MANAGED_USED.load(Ordering::Relaxed) {
        managed(|m| {
            let gone: Vec<u64> = m
                .allocs
                .iter()
                .filter(|(_, c)| c.ctx == ctx)
                .map(|(&p, _)| p)
                .collect();
            for p in gone {
                if let Some((c, drop)) = m.remove(p) {
                    s.release(c.dev, drop);
                }
            }
        });
    }
    contexts_changed();
}

// ---- stream-ordered pools ----------------------------------------------------------------------

// What a pool costs the slice is its reserved memory as the driver reports it (see `pool`, whose
// wrappers keep these records; a reservation about to be refused gives idle pool memory back).

fn reserved_now(pool: CUmemoryPool) -> Option<u64> {
    let f = real::cuMemPoolGetAttribute()?;
    let mut v: u64 = 0;
    // SAFETY: a u64 out-value for a u64-valued attribute.
    let r = unsafe {
        f(
            pool,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            (&mut v as *mut u64).cast::<c_void>(),
        )
    };
    r.is_ok().then_some(v)
}

/// Brings the pool's charge to what it reserves now; returns the change (+ grown, - shrunk).
/// The driver is asked under the table's lock, so two threads bringing the same pool up to date
/// apply their readings in the order they were taken (a stale reading never lands last).
pub fn sync_pool(pool: CUmemoryPool, dev: usize) -> i128 {
    local(|l| {
        let Some(now) = reserved_now(pool) else {
            return 0;
        };
        let rec = l
            .pools
            .entry(pool as usize)
            .or_insert(PoolRec { dev, charged: 0 });
        let delta = now as i128 - rec.charged as i128;
        rec.charged = now;
        delta
    })
}

/// Brings every pool this process knows to what the driver reserves for it now: what the driver
/// gave back (at a synchronisation, above the release threshold) is released to the slice, and
/// growth no allocation charged yet is charged, even past the cap (the driver holds it).
pub fn refresh_pools(s: &Slice) {
    let pools: Vec<(usize, usize)> = local(|l| l.pools.iter().map(|(k, p)| (*k, p.dev)).collect());
    for (p, dev) in pools {
        apply_held(s, dev, sync_pool(p as CUmemoryPool, dev));
    }
}

/// Applies a change in what a pool holds that no allocation call is settling: shrinkage is
/// released, growth (another thread's allocation, read first here) is charged as held.
pub fn apply_held(s: &Slice, dev: usize, delta: i128) {
    match delta {
        d if d < 0 => s.release(dev, d.unsigned_abs() as u64),
        d if d > 0 => s.charge_held(dev, d as u64),
        _ => {}
    }
}

/// Trims this process's pools on device `dev` down to what their blocks use and gives the
/// difference back to the slice (called before any refusal).
pub fn give_back_idle(s: &Slice, dev: usize) {
    let Some(trim) = real::cuMemPoolTrimTo() else {
        return;
    };
    let pools: Vec<usize> = local(|l| {
        l.pools
            .iter()
            .filter(|(_, p)| p.dev == dev && p.charged > 0)
            .map(|(k, _)| *k)
            .collect()
    });
    for p in pools {
        // SAFETY: a pool handle this process obtained from the driver.
        unsafe { trim(p as CUmemoryPool, 0) };
        apply_held(s, dev, sync_pool(p as CUmemoryPool, dev));
    }
}

#[cfg(test)]
mod tests;
