//! Compute time-share: every launch route (cuLaunchKernel, cuLaunchKernelEx,
//! cuLaunchCooperativeKernel, cuGraphLaunch, each with its `_ptsz` twin) passes a gate before
//! the driver sees the launch. See docs/compute.md. One concern in one file: the gate's fast
//! path, the slice's allotment and tokens each period, and the compute thread that runs both
//! and the slice's turns (`turns`); the policy they apply is `cuslice_policy::share`, `turn` and
//! `priority`, pure.
//!
//! - With no other slice on the device, no limit of its own and no priority to act on, a slice
//!   has the whole device and the gate costs two relaxed loads.
//! - Otherwise its launches go through exclusive turns (`turns`): one slice at a time has work
//!   on the device, each for its allotment's part of a round, paid for by its tokens (ns of
//!   device time, shared by the slice's processes in its ledger, earned at the allotment).
//! - The allotment comes from the node's compute board (`cuslice_state::board`): every slice's
//!   request, limit, recent usage and whether it was held back, each bounded by what the node
//!   granted it, through `share::allot`. Each slice writes only its own claims there.

#![allow(non_snake_case)]

use std::ffi::{c_uint, c_void};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};

use cuda_abi::*;
use cuslice_policy::grant::{Grant, Origin};
use cuslice_policy::priority::{self, Priority};
use cuslice_policy::share::{self, FULL};
use cuslice_policy::turn::Turn;
use parking_lot::Mutex;

use crate::log::{debug, error};
use crate::membership::{self, Dev, Slice};
use crate::turns::{self, Slot, Turns};
use cuslice_state::board::{self, Board, Maker, Post};
use cuslice_state::paths::CONTAINER_AGENT_DIR;
use cuslice_state::seen;

/// How often the compute thread recomputes the allotment and posts the slice's claims.
pub const PERIOD_NS: u64 = 50_000_000;
/// Slices that launched nothing for this long are left out of the allotment.
const ACTIVE_NS: u64 = 1_000_000_000;
/// A slice held back by its tokens, or using all of its allotment (`share::uses_all`), counts as
/// wanting more for this long: without the hold a slice given more would at once look as if it
/// did not use it and be cut back.
const HUNGRY_HOLD_NS: u64 = 500_000_000;
/// A slice alone on a device with the whole of it posts that it holds the turn this far ahead,
/// renewed each period: a slice that comes to want it waits until the first one notices.
const FREE_HOLD_NS: u64 = 3 * PERIOD_NS;

static STARTED: AtomicBool = AtomicBool::new(false);
/// Some device of this process goes through turns.
static METERED: AtomicBool = AtomicBool::new(false);
/// The node agent's evidence of what the driver saw each slice use, as this process last read it
/// (`cuslice_state::seen`).
static SEEN: Mutex<seen::Cached> = parking_lot::const_mutex(seen::Cached::new());
/// This process's meters, one per device in the order of `Slice::devs`: set once by `join`
/// (before the devices are), never freed (a forked child leaks its parent's).
static METERS: AtomicPtr<Vec<Meter>> = AtomicPtr::new(std::ptr::null_mut());

/// This process's meters (none before cuInit has attached the devices).
#[inline]
fn meters() -> &'static [Meter] {
    let p = METERS.load(Ordering::Acquire);
    // SAFETY: null, or published once with Release after full construction and never freed.
    unsafe { p.as_ref() }.map_or(&[], |v| v.as_slice())
}

/// This process's metering of one device.
pub struct Meter {
    index: u32,
    uuid: [u8; 16],
    request: u32,
    limit: u32,
    /// The slice's place on the node's compute board (shared by its meters).
    board: Option<Arc<Board>>,
    /// `Priority::code`; `cuslice set --priority` changes it while the process runs.
    priority: AtomicU32,
    /// This process's part in the slice's turns on the device.
    turns: Turns,
    period: Mutex<Period>,
}

struct Period {
    /// When the last period ended.
    at_ns: u64,
    /// The slice's device time in the ledger then.
    device_ns: u64,
    /// Launches this process held back for tokens by then.
    throttled: u64,
    allot: u32,
    usage: u32,
    /// The slice counts as wanting more than it uses until then (see `HUNGRY_HOLD_NS`).
    hungry_until: u64,
    /// Another slice was active on the device until then.
    others_until: u64,
}

pub fn now_ns() -> u64 {
    board::now_ns()
}

fn ppm(percent: Option<u32>, none: u32) -> u32 {
    percent.map_or(none, |p| p.min(100) * (FULL / 100))
}

/// The directory of the node's compute board.
pub fn node_dir(s: &Slice) -> PathBuf {
    s.config
        .node_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(board::DEFAULT_DIR))
}

/// Bounds the other slices' claims on device `uuid` (`views`, this slice's first) by what the
/// driver saw them use, where the node agent says (`share::corroborate`): a claim counts for at
/// most twice what the slice was seen using beyond its request, and one without a request seen
/// idle (or, for a container's slice, not listed) is passed over. Where the agent is not
/// running, or has no per-process samples of the device, claims count as they are.
fn corroborate(views: &mut Vec<board::SliceView>, uuid: &[u8; 16], now: u64) {
    if views.len() < 2 {
        return;
    }
    let Some(evidence) = SEEN
        .lock()
        .get(std::path::Path::new(CONTAINER_AGENT_DIR), now)
    else {
        return;
    };
    let uuid = membership::uuid_string(uuid);
    if !evidence.covers(&uuid) {
        return;
    }
    // A container's slice the agent does not list yet (it lists those it found in its last look)
    // has not been seen at work. A standalone slice's is never listed, and counts as it is.
    let seen: Vec<Option<u32>> = views
        .iter()
        .enumerate()
        .map(|(i, v)| {
            (i > 0)
                .then(|| evidence.used(&uuid, v.slice).or(v.hooked.then_some(0)))
                .flatten()
        })
        .collect();
    let demands: Vec<share::Demand> = views.iter().map(|v| v.demand).collect();
    let mut bounded = share::corroborate(&demands, &seen).into_iter();
    views.retain_mut(|v| match bounded.next() {
        Some(Some(d)) => {
            v.demand = d;
            true
        }
        Some(None) => false,
        None => true,
    });
}

/// Takes the slice's place on the node's compute board, claims each device with this slice's
/// request, limit and priority, and sets up this process's meters (at cuInit, before the devices
/// are set). Err: a one-line reason to refuse CUDA (a request the device cannot guarantee, or a
/// core setting that cannot be coordinated).
pub fn join(s: &Slice, devs: &[Dev]) -> Result<(), String> {
    let dir = node_dir(s);
    let now = now_ns();
    // In a container the hook made the slice's place (and its grant, from the same settings);
    // a standalone slice makes its own.
    let maker = if s.hooked {
        Maker::Hooked
    } else {
        Maker::Standalone(Grant::from_config(&s.config, Origin::Standalone))
    };
    let board = match Board::open(&dir, s.ledger.slice_id(), maker) {
        Ok(b) => Some(Arc::new(b)),
        Err(e) => {
            let core = devs.iter().enumerate().any(|(o, d)| {
                let l = crate::nvml_query::device_limits(&s.config, o as u32, &d.uuid);
                l.core_request.is_some() || l.core_limit.is_some()
            });
            if core {
                return Err(format!("{e}; core limits and requests need it"));
            }
            crate::log::warning!("{e}; this slice's work is not coordinated with other slices'");
            None
        }
    };
    let mut meters = Vec::with_capacity(devs.len());
    let mut gated_at_join = Vec::with_capacity(devs.len());
    for (ordinal, d) in devs.iter().enumerate() {
        let l = crate::nvml_query::device_limits(&s.config, ordinal as u32, &d.uuid);
        // What `cuslice set` changed while the slice ran wins over this process's configuration.
        let (request, limit) = s
            .ledger
            .live_core(d.index)
            .unwrap_or((ppm(l.core_request, 0), ppm(l.core_limit, FULL)));
        let priority = s
            .ledger
            .live_priority(d.index)
            .map_or(s.config.priority, Priority::from_code);
        if let Some(b) = &board {
            b.claim(d.index, &d.uuid, request, limit, priority)
                .map_err(|e| e.to_string())?;
        }
        s.ledger.set_priority(d.index, priority.code());
        s.ledger.set_core(d.index, request, limit);
        let gated = limit < FULL && board.is_some();
        if let Some(t) = s.ledger.tokens(d.index) {
            if t.last_refill.load(Ordering::Relaxed) == 0 {
                t.last_refill.store(now, Ordering::Relaxed);
            }
            if limit < FULL {
                t.share.fetch_min(limit, Ordering::Relaxed);
            }
        }
        METERED.fetch_or(gated, Ordering::Relaxed);
        gated_at_join.push(gated);
        meters.push(Meter {
            index: d.index,
            uuid: d.uuid,
            request,
            limit,
            board: board.clone(),
            priority: AtomicU32::new(priority.code()),
            turns: Turns::default(),
            period: Mutex::new(Period {
                at_ns: now,
                device_ns: s.ledger.device_ns(d.index),
                throttled: 0,
                allot: limit,
                usage: 0,
                hungry_until: 0,
                others_until: 0,
            }),
        });
    }
    for (m, gated) in meters.iter().zip(gated_at_join) {
        m.turns.gated.store(gated, Ordering::Relaxed);
    }
    crate::wants::set(
        meters
            .iter()
            .zip(devs)
            .map(|(m, d)| crate::wants::Place::new(m.board.clone(), m.uuid, m.index, d.physical))
            .collect(),
    );
    let meters: &'static Vec<Meter> = Box::leak(Box::new(meters));
    for m in meters {
        turns::register(&m.turns);
    }
    METERS.store(
        meters as *const Vec<Meter> as *mut Vec<Meter>,
        Ordering::Release,
    );
    Ok(())
}

impl Meter {
    fn priority(&self) -> Priority {
        Priority::from_code(self.priority.load(Ordering::Relaxed))
    }

    /// What the compute thread needs of the slice's turn on this device (None without a place on
    /// the board).
    fn slot<'a>(&'a self, s: &'a Slice) -> Option<Slot<'a>> {
        let board = self.board.as_deref()?;
        Some(Slot {
            board,
            gate: board.gate(self.index)?,
            ledger: &s.ledger,
            tokens: s.ledger.tokens(self.index)?,
            d: self.index,
            uuid: &self.uuid,
            slice: s.ledger.slice_id(),
            priority: self.priority(),
        })
    }

    /// One period: what the slice used, its claims posted, its allotment recomputed, and whether
    /// its launches go through turns. Returns that.
    fn tick(&self, s: &Slice, now: u64) -> bool {
        let Some(t) = s.ledger.tokens(self.index) else {
            return false;
        };
        let mut p = self.period.lock();
        let span = now.saturating_sub(p.at_ns).max(1);
        // The slice's use: its turns' spans (every process of the slice adds its own turns'),
        // as the ledger has them.
        let device_ns = s.ledger.device_ns(self.index);
        let usage = (device_ns.saturating_sub(p.device_ns) as u128 * FULL as u128 / span as u128)
            .min(FULL as u128) as u32;
        (p.at_ns, p.device_ns, p.usage) = (now, device_ns, usage);
        let throttled = self.turns.throttled();
        let held = throttled != p.throttled;
        p.throttled = throttled;
        if held || share::uses_all(usage, p.allot) {
            p.hungry_until = now + HUNGRY_HOLD_NS;
        }
        let hungry = now < p.hungry_until;
        // The slice's request and limit now: `cuslice set` may have changed them (docs/status.md).
        let (request, limit) = s
            .ledger
            .core(self.index)
            .unwrap_or((self.request, self.limit));
        let prio = match s.ledger.live_priority(self.index) {
            Some(code) if code != self.priority.swap(code, Ordering::Relaxed) => {
                let p = Priority::from_code(code);
                debug!(
                    "device {}: priority {p} (cuslice set)",
                    membership::uuid_string(&self.uuid)
                );
                p
            }
            _ => self.priority(),
        };
        let Some(b) = &self.board else {
            t.share.store(limit, Ordering::Relaxed);
            return false;
        };
        let active = if usage > 0 || self.turns.gated.load(Ordering::Relaxed) {
            now
        } else {
            0
        };
        b.post(
            self.index,
            &self.uuid,
            &Post {
                request,
                limit,
                priority: prio,
                usage,
                hungry_until: if hungry { p.hungry_until } else { 0 },
                active_ns: active,
            },
            now,
        );
        let mut views = b.views(self.index, &self.uuid, now, now.saturating_sub(ACTIVE_NS));
        corroborate(&mut views, &self.uuid, now);
        // What each other slice may hold this one's turns up by (`turn::Observer`): its
        // allotment, as this slice would count it were it at normal priority (a slice below this
        // one still takes the time this one leaves). A slice the node agent has not seen at work
        // has none.
        let counted: Vec<_> = views.iter().map(|v| (v.demand, v.priority)).collect();
        let allotted: Vec<(u64, u32)> = views
            .iter()
            .map(|v| v.slice)
            .zip(priority::allotments(prio.min(Priority::Normal), &counted))
            .skip(1)
            .collect();
        self.turns.allotted(&allotted, now);
        let waiting = b
            .rivals(self.index, &self.uuid)
            .iter()
            .any(|r| r.turn != Turn::Idle);
        if views.len() > 1 || waiting {
            p.others_until = now + ACTIVE_NS;
        }
        let views: Vec<_> = views.iter().map(|v| (v.demand, v.priority)).collect();
        let demands = priority::view(prio, &views);
        let allot = share::allot(&demands).first().copied().unwrap_or(limit);
        if allot != p.allot {
            debug!(
                "device {}: allotment {} -> {} ppm (used {usage} ppm, request {}, limit {})",
                membership::uuid_string(&self.uuid),
                p.allot,
                allot,
                request,
                limit
            );
        }
        p.allot = allot;
        t.share.store(allot, Ordering::Relaxed);
        turns::refill(&t, now);
        let gated = allot < FULL || now < p.others_until;
        let was = self.turns.gated.swap(gated, Ordering::Relaxed);
        if !gated {
            self.hold_free(b, now);
        } else if !was {
            // Launches went straight to the driver until now: the slice's free hold ends, and its
            // launches queue for turns like the others'.
            debug!(
                "device {}: launches take turns (allotment {allot} ppm)",
                membership::uuid_string(&self.uuid)
            );
            if let Turn::Holding { .. } = b.turn(self.index)
                && b.gate(self.index)
                    .is_some_and(|g| g.open.load(Ordering::Acquire) == 0)
            {
                b.swap_turn(self.index, Turn::HOLDING, Turn::Idle);
            }
        }
        gated
    }

    /// A slice alone on the device with the whole of it launches straight to the driver: it
    /// posts that it holds the turn, a little ahead, so that a slice that comes to want it waits
    /// for this one to notice (next period) instead of sharing the device unmetered.
    fn hold_free(&self, b: &Board, now: u64) {
        let g = b.gate(self.index);
        if g.is_some_and(|g| g.open.load(Ordering::Acquire) == 1) {
            // A turn still runs: it ends when it idles (its leader closes it).
            return;
        }
        let until = now + FREE_HOLD_NS;
        match b.turn(self.index) {
            Turn::Holding { .. } => b.renew_turn(self.index, until),
            Turn::Idle => {
                b.swap_turn(self.index, Turn::IDLE, Turn::Holding { since: now, until });
            }
            waiting => {
                b.swap_turn(
                    self.index,
                    waiting.words().0,
                    Turn::Holding { since: now, until },
                );
            }
        }
    }
}

/// The compute thread: every period each device's tick; in between, the slice's turns on the
/// devices whose launches take them.
fn manager(s: &'static Slice) {
    // Its sleeps are short (tens of µs near a handoff): the default timer slack (50 µs) would
    // lengthen each one.
    // SAFETY: PR_SET_TIMERSLACK takes a value and touches nothing of ours; this thread's own.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    let mut next_tick = 0;
    loop {
        let now = now_ns();
        if now >= next_tick {
            let mut metered = false;
            for m in meters() {
                metered |= m.tick(s, now);
            }
            METERED.store(metered, Ordering::Relaxed);
            next_tick = now + PERIOD_NS;
        }
        let mut wake = next_tick;
        for m in meters() {
            if !m.turns.gated.load(Ordering::Relaxed) && !m.turns.involved() {
                continue;
            }
            if let Some(slot) = m.slot(s)
                && let Some(t) = m.turns.manage(&slot, now_ns())
            {
                wake = wake.min(t);
            }
        }
        turns::sleep_until(wake);
    }
}

fn start() {
    static ONCE: Mutex<()> = Mutex::new(());
    let _g = ONCE.lock();
    if STARTED.load(Ordering::Acquire) {
        return;
    }
    let s = match membership::active() {
        Ok(Some(s)) => s,
        // Not a slice (no cuslice setting), or refused: nothing to meter, and every launch
        // from now on takes the fast path.
        _ if matches!(
            membership::state(),
            membership::State::Off | membership::State::Refused
        ) =>
        {
            STARTED.store(true, Ordering::Release);
            return;
        }
        _ => return,
    };
    STARTED.store(true, Ordering::Release);
    if meters().is_empty() {
        return;
    }
    if let Err(e) = std::thread::Builder::new()
        .name("cuslice-compute".into())
        .spawn(move || manager(s))
    {
        error!("cannot start the compute thread: {e}; core limits are not enforced");
    }
}

/// Whether a launch may go straight on to the driver: the compute thread is started and no
/// device takes turns (no core limit, no other slice on the device).
#[inline(always)]
fn gate_open() -> bool {
    STARTED.load(Ordering::Relaxed) && !METERED.load(Ordering::Relaxed)
}

/// Every launch the fast path does not let through passes here first: returns once it may go.
/// `stream` (the launch's stream; `ptsz`: a `_ptsz` entry point) is evaluated only where the
/// launch takes a turn.
#[inline(always)]
fn gate(stream: impl FnOnce() -> CUstream, ptsz: bool) {
    if !STARTED.load(Ordering::Relaxed) {
        start();
    }
    if METERED.load(Ordering::Relaxed) {
        gate_metered(stream(), ptsz);
    }
}

#[inline(always)]
fn gate_metered(stream: CUstream, ptsz: bool) {
    let Ok(Some(s)) = membership::active() else {
        return;
    };
    let meters = meters();
    // One device (the usual case): no need to ask the driver which context is current.
    let m = if meters.len() == 1 {
        meters.first()
    } else {
        membership::current(s).and_then(|(_, o)| meters.get(o))
    };
    let Some(m) = m else { return };
    if !m.turns.gated.load(Ordering::Relaxed) {
        return;
    }
    if let Some(g) = m.board.as_deref().and_then(|b| b.gate(m.index)) {
        m.turns.enter(g, stream, ptsz);
    }
}

/// In a forked child: no compute thread runs there (the child joins afresh at its own cuInit).
pub fn child_after_fork() {
    STARTED.store(false, Ordering::Relaxed);
    METERED.store(false, Ordering::Relaxed);
    // The parent's meters are leaked with its slice (`membership::child_after_fork`).
    METERS.store(std::ptr::null_mut(), Ordering::Relaxed);
    crate::wants::child_after_fork();
    turns::child_after_fork();
}

/// At process exit: its part in its slice's turns ends, and the last process of a standalone
/// slice takes the slice's place off the node's compute board (a process killed before it could
/// is swept by the next standalone process, once its claims are old: `board::LEFTOVER_NS`).
pub fn at_exit() {
    let Ok(Some(s)) = membership::active() else {
        return;
    };
    for m in meters() {
        if let Some(slot) = m.slot(s) {
            m.turns.at_exit(&slot);
        }
    }
    let Some(b) = meters().iter().find_map(|m| m.board.as_ref()) else {
        return;
    };
    if s.hooked {
        return;
    }
    let others = s
        .ledger
        .snapshot()
        .procs
        .iter()
        .filter(|p| p.alive && p.pid != std::process::id() as i32)
        .count();
    if others == 0 {
        b.leave();
    }
}

/// Each wrapper's fast path is three loads (the real function, cached in the wrapper, and the two
/// flags of `gate_open`) and a jump to the driver: no call of its own, so no registers to save.
/// The rest (resolving the real function, starting the compute thread, waiting for the slice's
/// turn) is in the out-of-line `slow` twin, which answers with the real function, so that a launch
/// in a turn too is a jump to the driver from the wrapper.
macro_rules! launch_wrappers {
    ($($name:ident($($arg:ident: $ty:ty),*) on $stream:expr, $ptsz:expr;)*) => {
        $(
        /// # Safety
        /// The CUDA driver API contract of the function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            let mut p = slow::$name::REAL.load(Ordering::Relaxed);
            if p.is_null() || !gate_open() {
                p = slow::$name::prepare($stream);
                if p.is_null() {
                    return CUresult::CUDA_ERROR_NOT_INITIALIZED;
                }
            }
            // SAFETY: `p` was stored by `slow::$name::prepare` from `real::$name()`, a pointer
            // of exactly this type.
            let f = unsafe {
                std::mem::transmute::<*mut (), unsafe extern "C" fn($($ty),*) -> CUresult>(p)
            };
            // SAFETY: forwarded unchanged.
            unsafe { f($($arg),*) }
        }
        )*

        mod slow {
            #![allow(non_snake_case)]
            use super::*;

            $(
            pub mod $name {
                use super::*;

                /// The real function, once resolved.
                pub static REAL: std::sync::atomic::AtomicPtr<()> =
                    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

                /// Resolves the real function and passes the gate with the launch's stream: the
                /// real function (null if the driver lacks it).
                #[cold]
                #[inline(never)]
                pub fn prepare(stream: CUstream) -> *mut () {
                    let Some(f) = real::$name() else {
                        return std::ptr::null_mut();
                    };
                    if REAL.load(Ordering::Relaxed) != f as *mut () {
                        REAL.store(f as *mut (), Ordering::Relaxed);
                    }
                    gate(|| stream, $ptsz);
                    f as *mut ()
                }
            }
            )*
        }
    };
}

use crate::real;

/// The stream of a `cuLaunchKernelEx` launch (null for a null config, which the driver refuses).
fn ex_stream(config: *const CUlaunchConfig) -> CUstream {
    // SAFETY: the caller passes the launch's config, which the driver reads too; null is checked.
    unsafe { config.as_ref() }.map_or(std::ptr::null_mut(), |c| c.hStream)
}

launch_wrappers! {
    cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) on stream, false;
    cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) on stream, true;
    cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) on ex_stream(config), false;
    cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) on ex_stream(config), true;
    cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void) on stream, false;
    cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void) on stream, true;
    cuGraphLaunch(exec: CUgraphExec, stream: CUstream) on stream, false;
    cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) on stream, true;
}

macro_rules! stream_destroy_wrappers {
    ($($name:ident;)*) => {$(
        /// # Safety
        /// The CUDA driver API contract of the function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(stream: CUstream) -> CUresult {
            let Some(f) = real::$name() else {
                return CUresult::CUDA_ERROR_NOT_INITIALIZED;
            };
            // The compute thread records no more events on it (`turns`).
            turns::forget_stream(stream as usize);
            // SAFETY: forwarded unchanged.
            unsafe { f(stream) }
        }
    )*};
}

stream_destroy_wrappers! {
    cuStreamDestroy;
    cuStreamDestroy_v2;
}
