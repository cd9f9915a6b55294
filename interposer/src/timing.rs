//! The library's own timing of launches: every metered process times a sample of its launches
//! with CUDA events on the launching stream, and the meter thread reads the timings back (the
//! arithmetic is `cuslice_policy::timing`). Where the driver gives no per-process utilisation
//! samples they are the meter's readings; under one sample a period, what a launch costs.
//!
//! - A timed launch records one event on its stream just before the launch and one just after,
//!   with the launching thread's own context current. Nothing else on the path changes: an untimed
//!   launch costs one countdown (a load and a store) on the metered path.
//! - Launches into a stream being captured are never timed: an event recorded there would become
//!   a node of the application's graph.
//! - At most `IN_FLIGHT` timings wait to be read; events are reused (one pair per timing, created
//!   in the launching context the first time) and never destroyed: an application that destroys
//!   its context takes them with it. The context wrappers call `forget` first, so no event of a
//!   destroyed context is read; a timing whose events fail to read is dropped too.
//! - The meter thread reads them with `cuEventElapsedTime` (never a synchronising call), after
//!   setting its own stream-capture mode to relaxed so that another thread's capture never
//!   forbids the read, nor is invalidated by it.

use std::cell::Cell;
use std::ffi::c_uint;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use cuda_abi::*;
use cuslice_policy::timing::LaunchCosts;
use parking_lot::Mutex;

use crate::real;

/// Timings waiting to be read, at most.
const IN_FLIGHT: usize = 64;

/// Every timer of the process (one per metered device), for `forget`.
static TIMERS: Mutex<Vec<&'static Timer>> = Mutex::new(Vec::new());
/// Held while the meter thread reads events, and by `forget`: a context is never destroyed
/// while its events are being read.
static READING: Mutex<()> = Mutex::new(());

/// Makes `t` known to `forget` (once, when the meters are set up).
pub fn register(t: &'static Timer) {
    TIMERS.lock().push(t);
}

/// In a forked child: the parent's timers are not the child's (it sets up its own at its
/// cuInit), and a lock another thread of the parent held at the fork is never given back.
pub fn child_after_fork() {
    for lock in [&TIMERS as &dyn ForceUnlock, &READING] {
        lock.force_unlock_if_held();
    }
    TIMERS.lock().clear();
}

trait ForceUnlock {
    fn force_unlock_if_held(&self);
}

impl<T> ForceUnlock for Mutex<T> {
    fn force_unlock_if_held(&self) {
        if self.is_locked() {
            // SAFETY: in a forked child only the forking thread runs, and it holds none of these
            // locks (it was not in `forget` or a meter read, which do not fork): a holder was
            // another thread of the parent, which does not exist here.
            unsafe { self.force_unlock() };
        }
    }
}

/// Before context `ctx` is destroyed (`cuCtxDestroy`, the last release or a reset of a primary
/// context): its events go with it, so no timing may read them afterwards. They are dropped
/// here, after any read in progress, and never touched again; the driver frees them with the
/// context. (Reading an event of a destroyed context is undefined on a real driver.)
pub fn forget(ctx: usize) {
    let _reading = READING.lock();
    for t in TIMERS.lock().iter() {
        let mut p = t.pending.lock();
        p.free.retain(|q| q.ctx != ctx);
        p.flight.retain(|(q, _)| q.ctx != ctx);
    }
}

#[derive(Clone, Copy)]
struct Pair {
    ctx: usize,
    start: usize,
    end: usize,
}

#[derive(Default)]
struct Pending {
    /// Event pairs ready for another timing.
    free: Vec<Pair>,
    /// Timings recorded, oldest first, with the kind of launch each timed.
    flight: Vec<(Pair, u64)>,
}

/// One device's self-timing, in one process.
#[derive(Default)]
pub struct Timer {
    /// Whether launches are timed (set by the meter each period).
    on: AtomicBool,
    /// One launch in about this many is timed (set by the meter each period).
    stride: AtomicU32,
    /// Launches until the next timed one, and the state of the random strides.
    left: AtomicU32,
    rng: AtomicU64,
    pending: Mutex<Pending>,
}

/// A launch whose start event was recorded: `finish` records its end.
pub struct Started {
    pair: Pair,
    kind: u64,
    stream: CUstream,
    ptsz: bool,
}

impl Timer {
    /// Turns timing on or off, one launch in about `stride` timed.
    pub fn set(&self, on: bool, stride: u32) {
        self.stride.store(stride.max(1), Ordering::Relaxed);
        self.on.store(on, Ordering::Relaxed);
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Whether this launch is to be timed: a random one in about `stride`. The countdown is a
    /// plain load and store (no locked instruction, no thread-local: in a preloaded library
    /// that is a call): threads launching at once may lose a step of it, which only moves which
    /// launch is timed.
    #[inline(always)]
    pub fn due(&self) -> bool {
        if !self.on.load(Ordering::Relaxed) {
            return false;
        }
        let left = self.left.load(Ordering::Relaxed);
        if left > 1 {
            self.left.store(left - 1, Ordering::Relaxed);
            return false;
        }
        self.restart();
        true
    }

    /// The next countdown: uniform in 1..=2*stride-1, one in `stride` on average, never in
    /// step with a pattern of the application's (xorshift64*).
    #[cold]
    #[inline(never)]
    fn restart(&self) {
        let mut x = self.rng.load(Ordering::Relaxed);
        if x == 0 {
            x = (self as *const Timer as u64) ^ u64::from(std::process::id()) << 32 | 1;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Ordering::Relaxed);
        let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32;
        let stride = self.stride.load(Ordering::Relaxed).max(1) as u64;
        self.left
            .store((1 + r % (2 * stride - 1)) as u32, Ordering::Relaxed);
    }

    /// Records the start event of a launch of kind `kind` on `stream` (`ptsz`: through a
    /// `_ptsz` entry point). None: not timed (the stream is being captured, too many timings
    /// wait, or the driver refused).
    #[cold]
    #[inline(never)]
    pub fn begin(&self, stream: CUstream, ptsz: bool, kind: u64) -> Option<Started> {
        // A stream being captured, or one the driver cannot say of, is left alone.
        if crate::stream::capturing(stream, ptsz) != Some(false) {
            return None;
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        if !unsafe { real::cuCtxGetCurrent()?(&mut ctx) }.is_ok() || ctx.is_null() {
            return None;
        }
        let ctx = ctx as usize;
        let pair = {
            let mut p = self.pending.lock();
            if p.flight.len() >= IN_FLIGHT {
                return None;
            }
            p.free
                .iter()
                .position(|q| q.ctx == ctx)
                .map(|i| p.free.swap_remove(i))
        };
        let pair = match pair {
            Some(p) => p,
            None => Pair {
                ctx,
                start: create_event()?,
                end: create_event()?,
            },
        };
        if record(pair.start, stream, ptsz) {
            Some(Started {
                pair,
                kind,
                stream,
                ptsz,
            })
        } else {
            None
        }
    }

    /// Records the end event of a launch `begin` started, if the launch (`launched`) went to the
    /// driver.
    pub fn finish(&self, s: Started, launched: bool) {
        let ok = launched && record(s.pair.end, s.stream, s.ptsz);
        let mut p = self.pending.lock();
        if ok {
            p.flight.push((s.pair, s.kind));
        } else {
            p.free.push(s.pair);
        }
    }

    /// Reads the timings done so far into `costs` (from the meter thread); the others wait.
    pub fn collect(&self, costs: &mut LaunchCosts) {
        let _reading = READING.lock();
        let flight = std::mem::take(&mut self.pending.lock().flight);
        if flight.is_empty() {
            return;
        }
        let Some(elapsed) = real::cuEventElapsedTime() else {
            return;
        };
        relax_capture_mode();
        let (mut waiting, mut done) = (Vec::new(), Vec::new());
        for (pair, kind) in flight {
            let mut ms = 0f32;
            // SAFETY: a valid out-pointer and two events this library created; a context the
            // application destroyed makes them invalid handles, which the driver refuses.
            let r = unsafe { elapsed(&mut ms, pair.start as CUevent, pair.end as CUevent) };
            match r {
                CUresult::CUDA_SUCCESS => {
                    costs.add(kind, (ms.max(0.0) as f64 * 1e6) as u64);
                    done.push(pair);
                }
                CUresult::CUDA_ERROR_NOT_READY => waiting.push((pair, kind)),
                // Gone with its context, or otherwise unreadable: dropped.
                _ => {}
            }
        }
        let mut p = self.pending.lock();
        // Timings recorded meanwhile stay after the older ones still waiting.
        waiting.append(&mut p.flight);
        p.flight = waiting;
        p.free.append(&mut done);
    }
}

fn create_event() -> Option<usize> {
    let mut e: CUevent = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; flags 0 (CU_EVENT_DEFAULT): an event that records time.
    let r = unsafe { real::cuEventCreate()?(&mut e, 0) };
    (r.is_ok() && !e.is_null()).then_some(e as usize)
}

fn record(event: usize, stream: CUstream, ptsz: bool) -> bool {
    let f = if ptsz {
        real::cuEventRecord_ptsz()
    } else {
        real::cuEventRecord()
    };
    // SAFETY: an event this library created in the current context, on the stream the
    // application launches on.
    f.is_some_and(|f| unsafe { f(event as CUevent, stream) }.is_ok())
}

/// Sets the calling thread's stream-capture mode to relaxed, once: the meter thread's event
/// reads are then neither forbidden by another thread's global-mode capture nor invalidate it.
fn relax_capture_mode() {
    thread_local! {
        static DONE: Cell<bool> = const { Cell::new(false) };
    }
    if DONE.with(|d| d.replace(true)) {
        return;
    }
    if let Some(f) = real::cuThreadExchangeStreamCaptureMode() {
        let mut mode: c_uint = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a valid in/out pointer to a capture mode.
        unsafe { f(&mut mode) };
    }
}
