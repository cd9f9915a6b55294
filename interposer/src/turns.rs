//! Exclusive turns on a device (the policy is `cuslice_policy::turn`; docs/compute.md): this
//! process's part in its slice's turns. The gate lets a launch through while the slice's turn
//! is open and its queued work is within the turn's allowance; otherwise the launching thread
//! waits, and this process's manager (the compute thread, `compute.rs`) takes the turn
//! when it is the slice's, leads it, closes it, drains what this process queued and settles it.
//!
//! - The slice's turn and the words its processes share within it are in its own turns file on
//!   the node's compute board (`cuslice_state::board::turns`, `Gate`): the slice's turn is one,
//!   whichever of its processes launch in it.
//! - Draining: each process notes the streams it launched on in a turn (with their context).
//!   When the turn closes, its manager records an event on each of them and waits until they
//!   have all been reached, never with a synchronising call and never for longer than
//!   `turn::GRACE_NS`. A stream being captured is left alone (its launches are recorded, not
//!   run); a per-thread default stream, which only its own thread can name, and a stream the
//!   driver cannot say of, are taken to be done when the work queued in the turn is, by the
//!   estimate.
//! - What the slice used is the turn's span, from its first launch to the last process's work
//!   done: nobody else had work on the device meanwhile, so there is nothing to apportion.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};
use std::time::Duration;

use crate::log::debug;
use cuda_abi::*;
use cuslice_policy::priority::Priority;
use cuslice_policy::share::{self, FULL};
use cuslice_policy::turn::{self, Class, Next, Observer, Rival, Step, Turn};
use cuslice_shm::futex;
use cuslice_state::board::{Board, Gate};
use cuslice_state::ledger::{Ledger, Tokens};
use cuslice_state::snapshot::MeteredBy;
use parking_lot::Mutex;

use crate::real;
use cuslice_state::board::now_ns;

/// Streams noted without a lock (the first few of a turn); the rest go to the locked list.
const SLOTS: usize = 8;
/// What a launch is taken to cost before a turn has measured it.
pub const INITIAL_COST_NS: u64 = 100_000;
/// A holder that launched nothing and has nothing left to run for this long passes the turn on
/// to a slice that waits (shorter gaps keep it), or longer where the slice's own gaps between
/// bursts of work proved longer (`Turns::after_lull`).
const QUIET_NS: u64 = 50_000;
/// A slice that comes to want the turn this long after its last turn ended with nothing left to
/// run comes after a lull: it waits urgently. Sooner, the gap was its own between bursts.
const LULL_NS: u64 = 2_000_000;
/// A holder that launched nothing for this long passes the turn on even when nobody waits (so
/// that an idle slice holds nothing).
const IDLE_RELEASE_NS: u64 = 5_000_000;
/// How often a holder looks at the others and lets more work be queued.
const LEAD_POLL_NS: u64 = 200_000;
/// The same beside a high-priority slice, which waits for the turn no longer than needed.
const LEAD_POLL_HIGH_NS: u64 = 50_000;
/// How often a waiting slice looks again while another slice goes first, and while the holder
/// may end its turn early.
const WAIT_POLL_NS: u64 = 100_000;
const WAIT_POLL_SLOW_NS: u64 = 250_000;
/// How often a waiting slice looks when the holder's turn is about to end.
const HANDOFF_POLL_NS: u64 = 20_000;
/// How often a draining process asks whether its events were reached.
const DRAIN_POLL_NS: u64 = 20_000;
/// A thread waiting at the closed gate looks again at least this often.
const GATE_WAIT: Duration = Duration::from_millis(2);

/// Every `Turns` of the process (one per device), for `forget_ctx` and `forget_stream`.
static ALL: Mutex<Vec<&'static Turns>> = Mutex::new(Vec::new());

/// Makes `t` known to `forget_ctx` and `forget_stream` (once, when the meters are set up).
pub fn register(t: &'static Turns) {
    ALL.lock().push(t);
}

/// Whether this process takes part in a turn on any device (its compute thread then calls the
/// driver).
pub fn any_involved() -> bool {
    ALL.lock().iter().any(|t| t.involved())
}

/// Before context `ctx` is destroyed: the compute thread forgets its streams and events.
pub fn forget_ctx(ctx: usize) {
    for t in ALL.lock().iter() {
        t.forget_ctx(ctx);
    }
}

/// Before `stream` is destroyed: the compute thread forgets it.
pub fn forget_stream(stream: usize) {
    for t in ALL.lock().iter() {
        t.forget_stream(stream);
    }
}

/// In a forked child: the parent's are not the child's (it sets up its own at its cuInit), and a
/// lock another thread of the parent held at the fork is never given back.
pub fn child_after_fork() {
    if ALL.is_locked() {
        // SAFETY: in a forked child only the forking thread runs, and it holds no lock of this
        // module (it was not in a forget, which does not fork): a holder was another thread of
        // the parent, which does not exist here.
        unsafe { ALL.force_unlock() };
    }
    ALL.lock().clear();
}

/// The process's manager sleeps on this word; a thread that starts waiting at the gate wakes it.
static KICK: AtomicU32 = AtomicU32::new(0);

/// Wakes the manager (a launch found the gate closed).
fn kick() {
    KICK.fetch_add(1, Ordering::Release);
    futex::wake_all(&KICK);
}

/// The manager sleeps until `until` (monotonic ns), or until a launch wants a turn.
pub fn sleep_until(until: u64) {
    let seen = KICK.load(Ordering::Acquire);
    let now = now_ns();
    if until > now {
        futex::wait(&KICK, seen, Duration::from_nanos(until - now));
    }
}

/// A stream this process launched on in a turn.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Tracked {
    ctx: usize,
    stream: usize,
    ptsz: bool,
}

/// An event of this library's, created in context `ctx`.
struct Event {
    ctx: usize,
    event: usize,
}

/// An event recorded just before this process's first launch of a turn, and when (monotonic
/// ns). The slice's earlier work is done by then, so the device reaches it at once: the time
/// from it to a drain event is how long after `at` the turn's work was done, whenever the drain
/// gets to ask (`Turns::work_done`).
struct First {
    event: Event,
    at: u64,
    turn: u64,
}

#[derive(Default)]
struct Streams {
    /// The streams of turn `turn`, with their contexts.
    list: Vec<Tracked>,
    turn: u64,
    /// This process's first launch of turn `turn`, timed.
    first: Option<First>,
    /// A launch of the turn went to a stream only its own thread can name (the per-thread
    /// default stream), or to one the driver could not say the context of.
    unnamed: bool,
    /// Events for draining, reused.
    free: Vec<Event>,
}

/// What this process knows of the turn it leads (touched by its manager alone).
#[derive(Default)]
struct Lead {
    since: u64,
    until: u64,
    queued_seen: u64,
    quiet_since: u64,
    /// Events recorded on this process's streams at the last look while launches waited for the
    /// allowance: all reached by the next look, with nothing launched since, means the queue ran
    /// dry meanwhile.
    probe: Vec<Event>,
    /// What the turn had queued when `probe` was recorded.
    probed_queued: u64,
    /// Whether the turn's end counts from its first launch yet.
    anchored: bool,
}

/// This process's part in its slice's turns on one device.
pub struct Turns {
    /// Whether launches on the device go through the slice's turns (set each period by the
    /// compute thread; with the whole device and nobody else on it, they go straight on).
    pub gated: AtomicBool,
    /// The turn this process's launches joined last (its number; 0: none).
    joined: AtomicU64,
    /// The turn whose work this process drained last.
    drained: AtomicU64,
    /// The turn this process leads (took and will close).
    leads: AtomicU64,
    /// Threads of this process waiting at the gate.
    waiting: AtomicU32,
    /// When this process's threads began waiting for tokens (0: they are not).
    throttled_since: AtomicU64,
    /// Times the slice was held back: by its tokens, or by a turn that ended with work left (a
    /// count; the compute thread reads it each period: the slice wants more than it got).
    throttled: AtomicU64,
    /// Stream keys noted in turn `slots_turn` without a lock (0: free).
    slots: [AtomicUsize; SLOTS],
    slots_turn: AtomicU64,
    streams: Mutex<Streams>,
    lead: Mutex<Lead>,
    /// What this process saw of the other slices' turns (`turn::Observer`).
    observer: Mutex<Observer>,
}

impl Default for Turns {
    fn default() -> Turns {
        Turns {
            gated: AtomicBool::new(false),
            joined: AtomicU64::new(0),
            drained: AtomicU64::new(0),
            leads: AtomicU64::new(0),
            waiting: AtomicU32::new(0),
            throttled_since: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            slots: [const { AtomicUsize::new(0) }; SLOTS],
            slots_turn: AtomicU64::new(0),
            streams: Mutex::new(Streams::default()),
            lead: Mutex::new(Lead::default()),
            observer: Mutex::new(Observer::default()),
        }
    }
}

/// The per-thread default stream: only its own thread can name it.
fn per_thread(stream: CUstream, ptsz: bool) -> bool {
    let s = stream as usize;
    s == CU_STREAM_PER_THREAD || (ptsz && s == 0)
}

impl Turns {
    /// The gate of a launch on `stream` (`ptsz`: through a `_ptsz` entry point): returns once the
    /// launch may go. One load of the gate's state and one addition to what the turn queued
    /// while the turn is open and within its allowance.
    #[inline(always)]
    pub fn enter(&self, g: &Gate, stream: CUstream, ptsz: bool) {
        if g.open.load(Ordering::Acquire) == 1 {
            let n = g.number.load(Ordering::Acquire);
            if self.joined.load(Ordering::Relaxed) == n
                && g.queued.load(Ordering::Relaxed) < g.allowed.load(Ordering::Relaxed)
            {
                g.queued
                    .fetch_add(g.cost.load(Ordering::Relaxed), Ordering::Relaxed);
                self.note(n, stream, ptsz);
                return;
            }
        }
        self.enter_slow(g, stream, ptsz);
    }

    #[cold]
    #[inline(never)]
    fn enter_slow(&self, g: &Gate, stream: CUstream, ptsz: bool) {
        // However long it waits for a turn, the process is not idle (`freeze`).
        let _busy = crate::gate::busy_while();
        let mut waiting = false;
        // Until the device no longer takes turns (then it goes straight on).
        while self.gated.load(Ordering::Relaxed) {
            if g.open.load(Ordering::Acquire) == 1 {
                let n = g.number.load(Ordering::Acquire);
                if (self.joined.load(Ordering::Relaxed) == n || self.join(g, n))
                    && g.queued.load(Ordering::Relaxed) < g.allowed.load(Ordering::Relaxed)
                {
                    g.queued
                        .fetch_add(g.cost.load(Ordering::Relaxed), Ordering::Relaxed);
                    self.note(n, stream, ptsz);
                    break;
                }
                if self.joined.load(Ordering::Relaxed) == n {
                    // The turn's allowance is used up: its leader raises it as the turn runs, and
                    // wakes the gate's waiters when launches were held back.
                    g.held.fetch_add(1, Ordering::AcqRel);
                    futex::wait(&g.open, 1, Duration::from_nanos(LEAD_POLL_NS / 2));
                    // Never below 0: each take starts the count afresh (below).
                    let _ = g
                        .held
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                            Some(h.saturating_sub(1))
                        });
                    continue;
                }
            }
            if !waiting {
                waiting = true;
                self.waiting.fetch_add(1, Ordering::AcqRel);
            }
            g.wanted.fetch_max(now_ns(), Ordering::Relaxed);
            kick();
            futex::wait(&g.open, 0, GATE_WAIT);
        }
        if waiting {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Joins open turn `n`: this process's work counts in it and is drained when it closes.
    /// False if it closed meanwhile.
    fn join(&self, g: &Gate, n: u64) -> bool {
        g.pending.fetch_add(1, Ordering::SeqCst);
        if g.open.load(Ordering::SeqCst) != 1 || g.number.load(Ordering::SeqCst) != n {
            leave(g);
            return false;
        }
        let _ = g
            .started_ns
            .compare_exchange(0, now_ns(), Ordering::AcqRel, Ordering::Relaxed);
        if self.joined.swap(n, Ordering::AcqRel) != n {
            self.slots_turn.store(n, Ordering::Relaxed);
            for s in &self.slots {
                s.store(0, Ordering::Relaxed);
            }
        }
        true
    }

    /// Notes the stream of a launch in turn `n`: a few loads when it is one of the first
    /// `SLOTS` streams already noted.
    #[inline(always)]
    fn note(&self, n: u64, stream: CUstream, ptsz: bool) {
        let key = ((stream as usize) << 1 | ptsz as usize) + 1;
        if self.slots_turn.load(Ordering::Relaxed) == n {
            for s in &self.slots {
                let k = s.load(Ordering::Relaxed);
                if k == key {
                    return;
                }
                if k == 0 {
                    break;
                }
            }
        }
        self.note_slow(n, key, stream, ptsz);
    }

    #[cold]
    #[inline(never)]
    fn note_slow(&self, n: u64, key: usize, stream: CUstream, ptsz: bool) {
        let mut st = self.streams.lock();
        if st.turn != n {
            st.turn = n;
            st.list.clear();
            st.unnamed = false;
            if let Some(f) = st.first.take() {
                st.free.push(f.event);
            }
            st.first = time_first(&mut st.free, stream, ptsz, n);
        }
        if self.slots_turn.load(Ordering::Relaxed) == n
            && let Some(s) = self.slots.iter().find(|s| s.load(Ordering::Relaxed) == 0)
        {
            s.store(key, Ordering::Relaxed);
        }
        if per_thread(stream, ptsz) {
            st.unnamed = true;
            return;
        }
        let Some(ctx) = current_ctx() else {
            st.unnamed = true;
            return;
        };
        let t = Tracked {
            ctx,
            stream: stream as usize,
            ptsz,
        };
        if !st.list.contains(&t) {
            st.list.push(t);
        }
    }

    /// Before context `ctx` is destroyed: its streams and events go with it.
    fn forget_ctx(&self, ctx: usize) {
        let mut st = self.streams.lock();
        if st.list.iter().any(|t| t.ctx == ctx) {
            st.unnamed = true;
        }
        if st.first.as_ref().is_some_and(|f| f.event.ctx == ctx) {
            st.first = None;
        }
        st.list.retain(|t| t.ctx != ctx);
        st.free.retain(|e| e.ctx != ctx);
    }

    /// Before `stream` is destroyed.
    fn forget_stream(&self, stream: usize) {
        let mut st = self.streams.lock();
        st.list.retain(|t| t.stream != stream);
    }

    /// Whether this process still has a part in a turn on the device: it leads one, or has work
    /// of one to drain. The compute thread sees it through even once the device goes ungated.
    pub fn involved(&self) -> bool {
        self.leads.load(Ordering::Relaxed) != 0
            || self.joined.load(Ordering::Relaxed) != self.drained.load(Ordering::Relaxed)
    }

    /// Launches this process held back for tokens so far.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }
}

/// A process that joined a turn and is done with it (drained, or leaving).
fn leave(g: &Gate) -> bool {
    g.pending
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| p.checked_sub(1))
        .is_ok_and(|p| p == 1)
}

fn current_ctx() -> Option<usize> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let ok = unsafe { real::cuCtxGetCurrent()?(&mut ctx) }.is_ok();
    (ok && !ctx.is_null()).then_some(ctx as usize)
}

/// What the manager knows of the slice on one device, each time it looks.
pub struct Slot<'a> {
    pub board: &'a Board,
    pub gate: &'a Gate,
    pub ledger: &'a Ledger,
    pub tokens: Tokens<'a>,
    pub d: u32,
    pub uuid: &'a [u8; 16],
    pub slice: u64,
    pub priority: Priority,
}

impl Slot<'_> {
    fn allot(&self) -> u32 {
        self.tokens.share.load(Ordering::Relaxed)
    }

    /// The slice's tokens now (earnings since the last refill added).
    fn tokens_now(&self, now: u64) -> i64 {
        refill(&self.tokens, now);
        self.tokens.tokens.load(Ordering::Relaxed)
    }

    /// Takes `ns` of device time from the slice's tokens ahead, for the turn it holds (so that
    /// what it earns meanwhile is not cut by the bank): the settling charges the rest.
    fn reserve(&self, ns: u64) {
        if self.allot() < FULL {
            self.tokens.tokens.fetch_sub(ns as i64, Ordering::Relaxed);
            self.gate.reserved.fetch_add(ns, Ordering::Relaxed);
        }
    }
}

/// Adds the slice's earnings since the last refill (by any of its processes), banking at most
/// `share::bank` (a turn's worth).
pub fn refill(t: &Tokens<'_>, now: u64) {
    let last = t.last_refill.load(Ordering::Relaxed);
    if now <= last
        || t.last_refill
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let share = t.share.load(Ordering::Relaxed);
    let cap = bank(share);
    let cur = t.tokens.load(Ordering::Relaxed);
    if cur < cap {
        t.tokens.fetch_add(
            share::earned(share, now - last).min(cap - cur),
            Ordering::Relaxed,
        );
    }
}

/// How much a slice at `share` may bank: a round's worth at its share, and at least what the
/// shortest turn needs (`turn::ready_at`), so that a slice at a small share gets turns at all.
fn bank(share: u32) -> i64 {
    let shortest = turn::ready_at(share, i64::MAX, true).unwrap_or(0);
    share::earned(share, turn::CYCLE_NS).max(shortest)
}

/// How much work the holder may keep queued ahead: none beside a high-priority slice (its wait
/// for the turn is then one kernel of the holder's at most); the whole turn where no other slice
/// is on the device, so that a launching thread the host is slow to run again leaves the device
/// idle no sooner than the slice's own queue runs out (a slice that comes waits for that turn's
/// work once).
fn ahead(priority: Priority, rivals: &[Rival]) -> u64 {
    if priority != Priority::High && rivals.iter().any(|r| r.priority == Priority::High) {
        0
    } else if rivals.is_empty() {
        u64::MAX
    } else {
        turn::AHEAD_NS
    }
}

impl Turns {
    /// One look at the slice's turn on a device, by this process's manager: take it, lead it,
    /// close it, drain, settle. Returns when to look again (None: nothing to do until a launch
    /// wants a turn).
    pub fn manage(&self, s: &Slot<'_>, now: u64) -> Option<u64> {
        let g = s.gate;
        let n = g.number.load(Ordering::Acquire);
        let open = g.open.load(Ordering::Acquire) == 1;
        match s.board.turn(s.d) {
            Turn::Holding { since, until } => {
                self.observer.lock().own_turn(now);
                if open && self.leads.load(Ordering::Relaxed) == n {
                    return Some(self.lead(s, now));
                }
                if !open && self.joined.load(Ordering::Relaxed) == n {
                    if self.drained.swap(n, Ordering::AcqRel) != n {
                        self.drain(s, since);
                        if leave(g) {
                            settle(s, n, now_ns());
                        }
                    }
                    return Some(now_ns() + WAIT_POLL_NS);
                }
                if !open
                    && g.pending.load(Ordering::Acquire) == 0
                    && g.closed_ns.load(Ordering::Acquire) != 0
                {
                    // Closed and drained by every process: settled by the last one; this one
                    // only finds it so if that process died before.
                    settle(s, n, now);
                    return Some(now + WAIT_POLL_NS);
                }
                if now >= until.saturating_add(turn::GRACE_NS) {
                    // The leader died, or a drain never ended: the turn ends here.
                    g.open.store(0, Ordering::SeqCst);
                    g.closed_ns.store(now, Ordering::Relaxed);
                    futex::wake_all(&g.open);
                    g.pending.store(0, Ordering::SeqCst);
                    settle(s, n, now);
                    return Some(now + WAIT_POLL_NS);
                }
                // Another process of the slice leads; this one waits for the close to drain.
                Some(now + if open { LEAD_POLL_NS } else { WAIT_POLL_NS })
            }
            turn => self.wait(s, turn, now),
        }
    }

    /// The slice does not hold the turn: if this process has launches waiting, queue for it and
    /// take it when it is the slice's.
    fn wait(&self, s: &Slot<'_>, turn: Turn, now: u64) -> Option<u64> {
        let code = turn.words().0;
        let wants = self.waiting.load(Ordering::Acquire) > 0;
        if !wants {
            let wanted = s.gate.wanted.load(Ordering::Relaxed);
            if turn.waits() && wanted.saturating_add(IDLE_RELEASE_NS) < now {
                // Nobody of the slice wants it any more.
                s.board.swap_turn(s.d, code, Turn::Idle);
            }
            self.observer.lock().not_waiting(now);
            return None;
        }
        s.board.touch(s.d, now);
        let allot = s.allot();
        let tokens = s.tokens_now(now);
        let since = match turn {
            Turn::Waiting { since } | Turn::Urgent { since } => since,
            _ => now,
        };
        let read = s.board.rivals(s.d, s.uuid);
        let contended = read.iter().any(|r| r.turn != Turn::Idle);
        let need = turn::ready_at(allot, bank(allot), contended);
        if need.is_some_and(|need| tokens < need) {
            // Held back by its tokens until they pay for a turn (out of the queue meanwhile).
            if self.throttled_since.load(Ordering::Relaxed) == 0 {
                self.throttled_since.store(now, Ordering::Relaxed);
                self.throttled.fetch_add(1, Ordering::Relaxed);
            }
            if turn.waits() {
                s.board.swap_turn(s.d, code, Turn::Idle);
            }
            self.observer.lock().not_waiting(now);
            let pause = share::pause_ns(need.unwrap_or(0) - tokens, allot);
            return Some(now + pause.min(WAIT_POLL_SLOW_NS * 2));
        }
        let held_from = self.throttled_since.swap(0, Ordering::Relaxed);
        if held_from != 0 {
            s.ledger.note_throttled(s.d, now - held_from);
        }
        // Urgent: its work comes after a lull (its last turn ended with nothing left to run, a
        // while ago), decided when it starts to wait; or, granted high priority, its tokens pay
        // for a whole turn (it is within its allotment: busier, it queues like the others).
        let high_ready = s.priority == Priority::High
            && turn::ready_at(allot, bank(allot), false).is_none_or(|need| tokens >= need);
        let lull = match turn {
            Turn::Urgent { .. } => true,
            Turn::Waiting { .. } => false,
            _ => self.after_lull(s.gate, now),
        };
        let urgent = high_ready || lull;
        let posted = if urgent {
            Turn::Urgent { since }
        } else {
            Turn::Waiting { since }
        };
        if turn != posted && !s.board.swap_turn(s.d, code, posted) {
            return Some(now + WAIT_POLL_NS);
        }
        let class = Class::of(urgent, s.priority, since, now);
        let rivals = self.observed(&read, Some((s.slice, since, class)), now);
        match turn::next(s.slice, since, class, &rivals, now) {
            Next::Take => {
                // Beside others a turn is its part of the round, lengthened by what it has banked
                // (it got less than its allotment): what it uses beyond its tokens it owes, and
                // waits for; shortened, a slice would pay for the round's handoffs alone.
                let len = if contended {
                    turn::contended_length(allot, tokens)
                } else {
                    turn::length(allot, tokens)
                };
                // After a lull, work comes in bursts: the turn is planned short (the slices that
                // wait look often near its end), and renewed while the burst goes on and nobody
                // waits. A high-priority slice within its allotment, or one that waited long, has
                // its whole turn.
                let len = if lull && !high_ready {
                    len.min(LULL_NS)
                } else {
                    len
                };
                Some(self.take(s, posted, len, now))
            }
            Next::HeldUntil(until) => {
                // It may end early (when it idles): look now and then; near its end, often. A
                // slice the holder gives way to (urgent, or waiting long) looks often at once.
                let early = until.saturating_sub(WAIT_POLL_SLOW_NS);
                let near = until.saturating_sub(WAIT_POLL_NS * 3);
                // A holder whose turn is planned short took it after a lull: it will likely be
                // done before its end.
                let short = rivals.iter().any(|r| {
                    matches!(r.turn, Turn::Holding { since, until } if until.saturating_sub(since) <= LULL_NS + turn::MIN_TURN_NS)
                });
                let first = class != Class::Normal || short;
                Some(if first {
                    now + HANDOFF_POLL_NS
                } else if now < early {
                    early.min(now + WAIT_POLL_SLOW_NS)
                } else if now < near {
                    near.min(now + WAIT_POLL_NS)
                } else {
                    now + HANDOFF_POLL_NS
                })
            }
            Next::Queued => Some(now + WAIT_POLL_NS),
        }
    }

    /// Whether the slice's work now comes after a lull: its last turn ended with nothing left to
    /// run, and nothing ran for at least `LULL_NS` since its last work (the quiet its holder
    /// waited for, then the time since the close), or it had no turn yet. A slice that wants the
    /// turn again sooner ended it in a gap of its own between bursts of work (a
    /// synchronisation): its holder waits that long for it from now on before passing the turn
    /// on (`Gate::quiet_ns`, at most `LULL_NS`); after a lull that wait halves again.
    fn after_lull(&self, g: &Gate, now: u64) -> bool {
        if g.cut.load(Ordering::Relaxed) != 0 {
            return false;
        }
        let closed = g.closed_ns.load(Ordering::Relaxed);
        let waited = g.quiet_ns.load(Ordering::Relaxed).max(QUIET_NS);
        let gap = now.saturating_sub(closed).saturating_add(waited);
        if closed == 0 || gap >= LULL_NS {
            let _ = g
                .quiet_ns
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| Some(q / 2));
            return true;
        }
        let longer = (gap + gap / 2).clamp(QUIET_NS, LULL_NS);
        g.quiet_ns.fetch_max(longer, Ordering::Relaxed);
        false
    }

    /// The other slices' allotments on the device (slice, ppm), as this process's slice counts
    /// them at `now` (`turn::Observer::set_allotted`).
    pub fn allotted(&self, allotted: &[(u64, u32)], now: u64) {
        self.observer.lock().set_allotted(allotted, now);
    }

    /// The other slices' turns on the device, read now and as this process believes them
    /// (`turn::Observer`).
    fn rivals(&self, s: &Slot<'_>, now: u64) -> Vec<Rival> {
        let read = s.board.rivals(s.d, s.uuid);
        self.observed(&read, None, now)
    }

    /// `read` as this process believes it (`turn::Observer`); `me`: this slice's place in the
    /// queue while it waits (slice, since, class).
    fn observed(&self, read: &[Rival], me: Option<(u64, u64, Class)>, now: u64) -> Vec<Rival> {
        self.observer.lock().filter(read, me, now)
    }

    /// Takes the turn (the slice waited as `waiting` posts) for `len` and opens the gate.
    fn take(&self, s: &Slot<'_>, waiting: Turn, len: u64, now: u64) -> u64 {
        let g = s.gate;
        let held = Turn::Holding {
            since: now,
            until: now + len,
        };
        if !s.board.swap_turn(s.d, waiting.words().0, held) {
            return now + WAIT_POLL_NS;
        }
        fence(Ordering::SeqCst);
        let rivals = self.rivals(s, now);
        if !turn::keeps(s.slice, now, &rivals, now) {
            s.board.swap_turn(s.d, Turn::HOLDING, waiting);
            return now + WAIT_POLL_NS;
        }
        let n = g.number.load(Ordering::Acquire) + 1;
        g.queued.store(0, Ordering::Relaxed);
        g.allowed.store(
            turn::allowed(0, len, ahead(s.priority, &rivals)),
            Ordering::Relaxed,
        );
        g.closed_ns.store(0, Ordering::Relaxed);
        g.started_ns.store(0, Ordering::Relaxed);
        g.done_ns.store(0, Ordering::Relaxed);
        if g.cost.load(Ordering::Relaxed) == 0 {
            g.cost.store(INITIAL_COST_NS, Ordering::Relaxed);
        }
        g.pending.store(0, Ordering::Relaxed);
        g.reserved.store(0, Ordering::Relaxed);
        // Held back in the last turn counts for that turn only: a thread killed while it waited
        // for the allowance leaves its count behind.
        g.held.store(0, Ordering::Relaxed);
        s.reserve(len);
        g.number.store(n, Ordering::Release);
        {
            let mut l = self.lead.lock();
            let probe = std::mem::take(&mut l.probe);
            self.streams.lock().free.extend(probe);
            *l = Lead {
                since: now,
                until: now + len,
                queued_seen: 0,
                quiet_since: now,
                probe: Vec::new(),
                probed_queued: 0,
                anchored: false,
            };
        }
        self.leads.store(n, Ordering::Relaxed);
        g.open.store(1, Ordering::Release);
        futex::wake_all(&g.open);
        debug!(
            "{} device {}: turn {n} taken for {} us (as {waiting:?}, {} rivals)",
            now / 1000,
            s.d,
            len / 1000,
            rivals.len()
        );
        now + LEAD_POLL_NS
    }

    /// One look at the turn this process leads: let more work be queued, renew it, or close it.
    fn lead(&self, s: &Slot<'_>, now: u64) -> u64 {
        let g = s.gate;
        let read = s.board.rivals(s.d, s.uuid);
        let rivals = self.observed(&read, None, now);
        let mut l = self.lead.lock();
        let started = g.started_ns.load(Ordering::Relaxed);
        if !l.anchored && started != 0 {
            // The turn lasts its length from its first launch: the launching threads' wake-up is
            // nobody's device time.
            l.anchored = true;
            l.until += started.saturating_sub(l.since);
            s.board.renew_turn(s.d, l.until);
        }
        let queued = g.queued.load(Ordering::Relaxed);
        let launched = queued != l.queued_seen;
        l.queued_seen = queued;
        let blocked = queued >= g.allowed.load(Ordering::Relaxed);
        // Whether everything queued before the last look is done (`Probe`); no need to ask while
        // launches went since and the allowance holds none back.
        let drained = if launched && !blocked {
            self.streams.lock().free.append(&mut l.probe);
            Probe::Pending
        } else {
            self.probe(g, &mut l, queued, launched || blocked)
        };
        let ahead = ahead(s.priority, &rivals);
        // Beside a high-priority slice the queue runs dry by design (nothing is queued ahead):
        // the next launch goes as soon as the last is done.
        let release = blocked && drained == Probe::Done && ahead == 0;
        if blocked && drained == Probe::Done && ahead > 0 {
            // The queue ran dry while launches waited for the allowance: `cost` is too high, the
            // device idles in the turn, and what was queued is set back to what has run.
            g.dry
                .store(g.number.load(Ordering::Relaxed), Ordering::Relaxed);
            let cost = g.cost.load(Ordering::Relaxed);
            g.cost.store((cost * 3 / 4).max(1_000), Ordering::Relaxed);
            g.queued
                .fetch_min(now.saturating_sub(l.since), Ordering::Relaxed);
        }
        // Quiet: nothing launched since the last look and all of it done (by its events, or
        // without them by the estimate). A slice that keeps a few launches in flight launches
        // again as each ends.
        let done = match drained {
            Probe::Done => true,
            Probe::Pending => false,
            Probe::Unknown => l.since.saturating_add(queued) <= now,
        };
        if launched || !done || self.waiting.load(Ordering::Relaxed) > 0 {
            l.quiet_since = now;
        }
        let quiet = now.saturating_sub(l.quiet_since);
        let waiters = turn::waiters(s.priority, &rivals, &read, now);
        // What another turn would last, paid by the tokens left (this one's is taken ahead).
        let renew = turn::length(s.allot(), s.tokens_now(now));
        // Two slices that took the turn at once find out at their first look: the one that took
        // it later ends it. (Later, a record another posts does not end a turn.)
        let lost = now.saturating_sub(l.since) < turn::MIN_HELD_NS
            && !turn::keeps(s.slice, l.since, &rivals, now);
        let step = if quiet >= IDLE_RELEASE_NS || !self.gated.load(Ordering::Relaxed) || lost {
            // Idle long enough, the device no longer takes turns, or another slice took the turn
            // first (both took it at once): it ends.
            Step::Close
        } else {
            turn::step(
                now,
                (l.since, l.until),
                quiet >= g.quiet_ns.load(Ordering::Relaxed).max(QUIET_NS),
                waiters,
                Some(renew),
            )
        };
        match step {
            Step::Hold => {}
            Step::Renew(until) => {
                // Taken ahead from the end it had (the time since is the turn's too).
                s.reserve(until.saturating_sub(l.until));
                l.until = until;
                s.board.renew_turn(s.d, until);
            }
            Step::Close => {
                // Ended with work left: its span is its launches' device time.
                let cut = quiet < g.quiet_ns.load(Ordering::Relaxed).max(QUIET_NS);
                if !cut {
                    // It idled at the end: its span says nothing of what a launch costs.
                    g.dry
                        .store(g.number.load(Ordering::Relaxed), Ordering::Relaxed);
                }
                // Ended with launches held back (at the gate, or waiting for the allowance) by its
                // round, its tokens or someone first: the slice wants more than it got. One that
                // ended with its last launches still running, none held back, was done launching
                // (a turn planned short after a lull may end before a kernel of its does): it is
                // not throttled, and its next work may come after a lull.
                let held_back =
                    self.waiting.load(Ordering::Relaxed) > 0 || g.held.load(Ordering::Relaxed) > 0;
                let wanted_more = cut && held_back;
                if wanted_more {
                    self.throttled.fetch_add(1, Ordering::Relaxed);
                }
                g.cut.store(u32::from(wanted_more), Ordering::Relaxed);
                let probe = std::mem::take(&mut l.probe);
                drop(l);
                self.streams.lock().free.extend(probe);
                return self.close(s, now);
            }
        }
        // Counted from the first launch, as the turn's end is.
        let from = if started != 0 {
            started.max(l.since)
        } else {
            now
        };
        let length = l.until.saturating_sub(from);
        let allowed = turn::allowed(now.saturating_sub(from), length, ahead);
        let allowed = if release {
            allowed.max(queued.saturating_add(1).min(length))
        } else {
            allowed
        };
        g.allowed.store(allowed, Ordering::Relaxed);
        if blocked && allowed > queued {
            // Launches waited for the allowance: they go now, not at their next look.
            futex::wake_all(&g.open);
        }
        // Often beside a high-priority slice, or while a slice waits for this one to go quiet.
        // Launches held back with nothing queued ahead: look as often as a drain does.
        let poll = if ahead == 0 && queued >= allowed {
            DRAIN_POLL_NS
        } else if ahead == 0 || waiters.higher || (waiters.any && !launched) {
            LEAD_POLL_HIGH_NS
        } else {
            LEAD_POLL_NS
        };
        (now + poll).min(l.until.max(now + DRAIN_POLL_NS))
    }

    /// The holder's probe of its queue: whether the events recorded on this process's streams at
    /// the last look are all reached and nothing was launched since (everything queued is done;
    /// `queued`: what the turn has queued now). `again`: record a new probe (something was
    /// launched since, or launches wait for the allowance), else keep watching the last one (or
    /// record one if there is none).
    fn probe(&self, g: &Gate, l: &mut Lead, queued: u64, again: bool) -> Probe {
        let mut st = self.streams.lock();
        let reached = (!l.probe.is_empty()).then(|| {
            let query = real::cuEventQuery();
            l.probe.iter().all(|e| {
                query.is_some_and(|q| {
                    // SAFETY: an event this library created and recorded in a context the
                    // application has not destroyed (`forget_ctx` takes the same lock).
                    let r = unsafe { q(e.event as CUevent) };
                    r != CUresult::CUDA_ERROR_NOT_READY
                })
            })
        });
        if !again && reached == Some(false) {
            return Probe::Pending;
        }
        st.free.append(&mut l.probe);
        if st.turn != g.number.load(Ordering::Relaxed) || st.unnamed {
            // Nothing of this process's to watch in this turn, or work it cannot watch.
            return Probe::Unknown;
        }
        // A launch since the last probe was recorded may have gone after its events.
        let ran_dry = reached == Some(true) && l.probed_queued == queued;
        relax_capture_mode();
        let list = st.list.clone();
        l.probed_queued = queued;
        for t in &list {
            match record_on(&mut st.free, t) {
                Some(Recorded::Event(e)) => l.probe.push(e),
                Some(Recorded::Captured) => {}
                None => {
                    st.free.append(&mut l.probe);
                    return Probe::Unknown;
                }
            }
        }
        if ran_dry {
            Probe::Done
        } else {
            // Just recorded: its answer comes at the next look.
            Probe::Pending
        }
    }

    /// Closes the turn this process leads: no more launches go; this process drains its own and
    /// the last process of the slice to drain settles the turn.
    fn close(&self, s: &Slot<'_>, now: u64) -> u64 {
        let g = s.gate;
        let n = g.number.load(Ordering::Acquire);
        self.leads.store(0, Ordering::Relaxed);
        g.closed_ns.store(now, Ordering::Relaxed);
        g.open.store(0, Ordering::SeqCst);
        futex::wake_all(&g.open);
        let since = self.lead.lock().since;
        let joined = self.joined.load(Ordering::Relaxed) == n;
        if joined && self.drained.swap(n, Ordering::AcqRel) != n {
            self.drain(s, since);
            if leave(g) {
                settle(s, n, now_ns());
            }
        } else if g.pending.load(Ordering::SeqCst) == 0 {
            settle(s, n, now_ns());
        }
        now_ns() + WAIT_POLL_NS
    }

    /// Waits until the work this process queued in the turn (taken at `since`) is done: an event
    /// on each of its streams, reached; what cannot be named is done by the estimate.
    fn drain(&self, s: &Slot<'_>, since: u64) {
        let g = s.gate;
        let deadline = since
            .saturating_add(g.queued.load(Ordering::Relaxed))
            .max(now_ns())
            .saturating_add(turn::GRACE_NS);
        let by_estimate = since.saturating_add(g.queued.load(Ordering::Relaxed));
        let mut st = self.streams.lock();
        let n = g.number.load(Ordering::Acquire);
        if st.turn != n {
            // Nothing noted in this turn (its launches were all in the first slots, or none).
            g.done_ns.fetch_max(now_ns(), Ordering::AcqRel);
            return;
        }
        let mut recorded = Vec::new();
        let mut unnamed = st.unnamed;
        relax_capture_mode();
        let list = std::mem::take(&mut st.list);
        for t in &list {
            match record_on(&mut st.free, t) {
                Some(Recorded::Event(e)) => recorded.push(e),
                Some(Recorded::Captured) => {}
                None => unnamed = true,
            }
        }
        st.list = list;
        let query = real::cuEventQuery();
        // The events not reached yet (indices into `recorded`, which keeps them all: every one
        // goes back to the free list, reached or not).
        let mut waiting: Vec<usize> = (0..recorded.len()).collect();
        // The last time a look began that found work not done yet.
        let mut not_done = 0;
        while !waiting.is_empty() && now_ns() < deadline {
            let look = now_ns();
            waiting.retain(|&i| {
                let Some(q) = query else { return false };
                // SAFETY: an event this library created and recorded; a context destroyed
                // meanwhile (`forget_ctx` waits for this drain) is not.
                let r = unsafe { q(recorded[i].event as CUevent) };
                r == CUresult::CUDA_ERROR_NOT_READY
            });
            if !waiting.is_empty() {
                not_done = look;
                std::thread::sleep(Duration::from_nanos(DRAIN_POLL_NS));
            }
        }
        let seen = now_ns();
        // When the work was done: by the device's clock where it can say, within what the looks
        // saw (not done at `not_done`, done by `seen`); else when this drain saw it done.
        let done = if waiting.is_empty() && !unnamed {
            work_done(&st, &recorded, n).map_or(seen, |d| d.clamp(not_done, seen))
        } else {
            seen
        };
        st.free.append(&mut recorded);
        if unnamed {
            while now_ns() < by_estimate.min(deadline) {
                std::thread::sleep(Duration::from_nanos(
                    (by_estimate - now_ns().min(by_estimate)).max(DRAIN_POLL_NS),
                ));
            }
        }
        let done = if unnamed { now_ns() } else { done };
        if g.number.load(Ordering::Acquire) == n {
            g.done_ns.fetch_max(done, Ordering::AcqRel);
        }
    }

    /// At process exit: the process's part in a turn ends with it (its work goes with its
    /// contexts), and a turn it leads is closed.
    pub fn at_exit(&self, s: &Slot<'_>) {
        let g = s.gate;
        let n = g.number.load(Ordering::Acquire);
        let led = self.leads.swap(0, Ordering::Relaxed) == n;
        if led {
            g.closed_ns.store(now_ns(), Ordering::Relaxed);
            g.open.store(0, Ordering::SeqCst);
            futex::wake_all(&g.open);
        }
        let joined =
            self.joined.load(Ordering::Relaxed) == n && self.drained.swap(n, Ordering::AcqRel) != n;
        let last = if joined {
            leave(g)
        } else {
            g.pending.load(Ordering::SeqCst) == 0
        };
        if g.open.load(Ordering::SeqCst) == 0 && last {
            settle(s, n, now_ns());
        }
    }
}

/// What the holder's probe says of its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// Everything queued before the last look is done.
    Done,
    /// Not yet, or not known yet.
    Pending,
    /// It cannot tell (nothing of this process's to watch, or work it cannot watch): the
    /// estimate decides.
    Unknown,
}

enum Recorded {
    Event(Event),
    /// The stream is being captured: its launches are recorded into a graph, not run.
    Captured,
}

/// Records the event that times this process's first launch of turn `n` on `stream`, from the
/// launching thread (its context current) just before the launch goes. None where it cannot (a
/// stream being captured, or the driver refused): the turn's end is then when drains see it.
fn time_first(free: &mut Vec<Event>, stream: CUstream, ptsz: bool, n: u64) -> Option<First> {
    let ctx = current_ctx()?;
    if crate::stream::capturing(stream, ptsz)? {
        return None;
    }
    let event = take_event(free, ctx)?;
    let rec = if ptsz {
        real::cuEventRecord_ptsz()
    } else {
        real::cuEventRecord()
    };
    let at = now_ns();
    // SAFETY: an event of this library's in the current context, on the stream the caller is
    // about to launch on.
    if rec.is_some_and(|f| unsafe { f(event.event as CUevent, stream) }.is_ok()) {
        Some(First { event, at, turn: n })
    } else {
        free.push(event);
        None
    }
}

/// When the work of turn `n` that this process drained was done, by the device's clock: the
/// time from its first launch's event to the latest of the drain events `recorded` (all
/// reached, all in the first launch's context). None where the device cannot say.
fn work_done(st: &Streams, recorded: &[Event], n: u64) -> Option<u64> {
    let first = st.first.as_ref().filter(|f| f.turn == n)?;
    let elapsed = real::cuEventElapsedTime()?;
    let mut most = 0f32;
    for e in recorded {
        if e.ctx != first.event.ctx {
            return None;
        }
        let mut ms = 0f32;
        // SAFETY: two events of this library's in the same context, both recorded and reached;
        // a valid out-pointer.
        let r = unsafe { elapsed(&mut ms, first.event.event as CUevent, e.event as CUevent) };
        if !r.is_ok() || !ms.is_finite() {
            return None;
        }
        most = most.max(ms);
    }
    Some(first.at + (f64::from(most) * 1e6) as u64)
}

/// An event of this library's in context `ctx`, from `free` or new (timed: `work_done` measures
/// between them). The context must be current.
fn take_event(free: &mut Vec<Event>, ctx: usize) -> Option<Event> {
    if let Some(i) = free.iter().position(|e| e.ctx == ctx) {
        return Some(free.swap_remove(i));
    }
    let mut e: CUevent = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; a timed event in the current context.
    let r = unsafe { real::cuEventCreate()?(&mut e, CU_EVENT_DEFAULT) };
    (r.is_ok() && !e.is_null()).then_some(Event {
        ctx,
        event: e as usize,
    })
}

/// Records a drain event on tracked stream `t`, from the manager thread with `t`'s context
/// current. None when it cannot (the driver refused, or cannot say whether it is captured).
fn record_on(free: &mut Vec<Event>, t: &Tracked) -> Option<Recorded> {
    let set = real::cuCtxSetCurrent()?;
    // SAFETY: a context the application launched in; `forget_ctx` drops it before it is
    // destroyed, under the lock the caller holds.
    if !unsafe { set(t.ctx as CUcontext) }.is_ok() {
        return None;
    }
    let stream = t.stream as CUstream;
    match crate::stream::capturing(stream, t.ptsz) {
        Some(true) => return Some(Recorded::Captured),
        Some(false) => {}
        None => return None,
    }
    let event = take_event(free, t.ctx)?;
    let rec = if t.ptsz {
        real::cuEventRecord_ptsz()
    } else {
        real::cuEventRecord()
    };
    // SAFETY: an event of this library's in the stream's context, on a stream the application
    // launched on and has not destroyed (`forget_stream` drops it first, under the same lock).
    if rec.is_some_and(|f| unsafe { f(event.event as CUevent, stream) }.is_ok()) {
        Some(Recorded::Event(event))
    } else {
        free.push(event);
        None
    }
}

/// Settles turn `n` (once, by whichever process gets here first): charges its span to the
/// slice, learns what a launch costs, and passes the turn on (queueing again if the slice still
/// wants it).
fn settle(s: &Slot<'_>, n: u64, now: u64) {
    let g = s.gate;
    let last = g.settled.load(Ordering::Acquire);
    if last >= n
        || g.settled
            .compare_exchange(last, n, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        return;
    }
    let Turn::Holding { since, .. } = s.board.turn(s.d) else {
        return;
    };
    // From its first launch (or the take, if nothing launched) to its last work done: when its
    // processes' drains measured it, else now.
    let started = g.started_ns.load(Ordering::Relaxed);
    let from = if started == 0 {
        since
    } else {
        started.max(since)
    };
    let end = match g.done_ns.load(Ordering::Acquire) {
        done if (from..=now).contains(&done) => done,
        _ => now,
    };
    let span = end.saturating_sub(from);
    refill(&s.tokens, now);
    let reserved = g.reserved.swap(0, Ordering::Relaxed);
    debug!(
        "{} device {}: turn {n} settled: {} us from first launch to last work, {} us queued, {} us per launch, {} us of tokens",
        now / 1000,
        s.d,
        span / 1000,
        g.queued.load(Ordering::Relaxed) / 1000,
        g.cost.load(Ordering::Relaxed) / 1000,
        s.tokens.tokens.load(Ordering::Relaxed) / 1000
    );
    // What the turn used beyond what was taken ahead (or given back, if less). A slice with the
    // whole device owes nothing.
    if reserved > 0 || s.allot() < FULL {
        s.tokens
            .tokens
            .fetch_sub(span as i64 - reserved as i64, Ordering::Relaxed);
    }
    s.ledger.note_device_time(s.d, span, MeteredBy::Turns, now);
    let cost = g.cost.load(Ordering::Relaxed).max(1);
    let launches = g.queued.load(Ordering::Relaxed) / cost;
    // Where the queue never ran dry, the turn's span is its launches' device time.
    if launches > 0 && g.dry.load(Ordering::Relaxed) != n {
        let measured = (span / launches).clamp(1_000, 1_000_000_000);
        g.cost.store((cost * 3 + measured) / 4, Ordering::Relaxed);
    }
    let closed = g.closed_ns.load(Ordering::Relaxed);
    let next = if g.wanted.load(Ordering::Relaxed) >= closed.min(since) {
        Turn::Waiting { since: now }
    } else {
        Turn::Idle
    };
    s.board.swap_turn(s.d, Turn::HOLDING, next);
}

/// Sets the calling thread's stream-capture mode to relaxed, once: the manager's event records
/// and queries are then neither forbidden by another thread's global-mode capture nor
/// invalidate it.
fn relax_capture_mode() {
    use std::cell::Cell;
    thread_local! {
        static DONE: Cell<bool> = const { Cell::new(false) };
    }
    if DONE.with(|d| d.replace(true)) {
        return;
    }
    if let Some(f) = real::cuThreadExchangeStreamCaptureMode() {
        let mut mode: std::ffi::c_uint = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a valid in/out pointer to a capture mode.
        unsafe { f(&mut mode) };
    }
}
