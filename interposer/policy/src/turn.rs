//! Exclusive turns (pure): plain numbers in, decisions out. Without MPS a GPU never runs the
//! contexts of different processes at once: it time-slices them, and then neither a kernel's
//! timing nor the driver's samples tell who used the device. So slices take turns: one slice at
//! a time may have work on a device, and what it used is its turn's span, from its first launch
//! to its last work done, with nobody else on the device. See docs/compute.md.
//!
//! - A slice that has work to launch waits for the turn; the waiting slice that waited longest
//!   takes it when nobody holds it. A slice whose work came after a lull (its last turn ended with
//!   nothing left to run: a light or bursty workload) waits *urgently*: it goes before the
//!   slices that keep the device busy, and a holder below it ends its turn once it has held it
//!   `MIN_HELD_NS`. So a light slice waits for about one of a busy neighbour's kernels, not for
//!   its turn. A slice granted high priority waits urgently too while it is within its allotment
//!   (its tokens pay for a whole turn); among urgent slices it goes first, and it ends any turn
//!   but a high one's. Beyond its allotment it queues like the others, so that priority never
//!   takes a request or an allotment from the slices below it. And any slice that has waited
//!   `AGE_NS` goes first too: beside a busy high-priority slice the others still get a turn now
//!   and then.
//! - Beside others a turn lasts the slice's part of a `CYCLE_NS` round (its allotment); alone,
//!   what its tokens pay for, at most a round (`length`). It is renewed while nobody else waits,
//!   and ends early when the slice has nothing queued while others wait, or when a slice it gives
//!   way to waits.
//! - Within a turn a slice queues at most `AHEAD_NS` of work beyond the time that has passed
//!   (one launch always), so that a turn ends soon after it is closed.
//! - What another slice posts is its own word. A holding record counts only while its end is no
//!   further ahead than `MAX_TURN_NS`; past its end by `GRACE_NS` it no longer holds anybody up.
//!   And each reader keeps its own record of what it saw (`Observer`): a slice it has seen
//!   holding the turn, while it waited, for longer than any honest turn lasts once another
//!   waits, or first in the queue for longer than an honest slice takes to take a free turn, or
//!   that has held it up, in all, further beyond its allotment than an honest slice does
//!   (`DEBT_NS`), holds nobody up, whatever it posts.

use crate::priority::Priority;
use crate::share::FULL;

/// One round of turns among slices that all want the device: each holds the turn for its
/// allotment's part of it.
pub const CYCLE_NS: u64 = 40_000_000;
/// The shortest turn a slice takes.
pub const MIN_TURN_NS: u64 = 1_000_000;
/// The furthest ahead a holding record may plan its end; one that plans further is not
/// believed. (A turn renewed while nobody waits goes on: its end moves, a round at a time; and a
/// slice alone on a device with the whole of it posts a hold a little longer than the period in
/// which it looks whether another slice wants the device.)
pub const MAX_TURN_NS: u64 = 200_000_000;
/// How long past its end a holding record still holds the others up: its last work is done
/// (drained) within it. A holder that died, or overran, holds nobody up past that.
pub const GRACE_NS: u64 = 100_000_000;
/// How much work (device time, by the slice's estimate) a holder keeps queued ahead of the time
/// its turn has run, beyond one launch: enough that the device never waits for its next launch,
/// and what a slice that takes the turn from it waits for at most.
pub const AHEAD_NS: u64 = 1_000_000;
/// A waiting or holding record whose time lies further ahead of the reader's clock than this is
/// not believed (honest processes share the reader's CLOCK_MONOTONIC).
pub const AHEAD_OF_CLOCK_NS: u64 = 1_000_000;

/// A slice's turn on a device, as it posts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// No work waiting.
    Idle,
    /// Work waiting for the turn since `since` (its place in the queue).
    Waiting { since: u64 },
    /// Waiting since `since`, and asking to go first (counts only from a slice granted high
    /// priority).
    Urgent { since: u64 },
    /// Holding the turn, taken at `since`, planned to end by `until`.
    Holding { since: u64, until: u64 },
}

impl Turn {
    pub const IDLE: u32 = 0;
    pub const WAITING: u32 = 1;
    pub const HOLDING: u32 = 2;
    pub const URGENT: u32 = 3;

    /// From the posted words: the state code, `since` and `until`.
    pub fn from_words(state: u32, since: u64, until: u64) -> Turn {
        match state {
            Turn::WAITING => Turn::Waiting { since },
            Turn::URGENT => Turn::Urgent { since },
            Turn::HOLDING => Turn::Holding { since, until },
            _ => Turn::Idle,
        }
    }

    /// The posted words: the state code, `since` and `until`.
    pub fn words(self) -> (u32, u64, u64) {
        match self {
            Turn::Idle => (Turn::IDLE, 0, 0),
            Turn::Waiting { since } => (Turn::WAITING, since, 0),
            Turn::Urgent { since } => (Turn::URGENT, since, 0),
            Turn::Holding { since, until } => (Turn::HOLDING, since, until),
        }
    }

    /// Whether it waits for the turn (urgently or not).
    pub fn waits(self) -> bool {
        matches!(self, Turn::Waiting { .. } | Turn::Urgent { .. })
    }
}

/// Another slice on the device, as this one reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rival {
    pub slice: u64,
    pub turn: Turn,
    pub priority: Priority,
}

impl Rival {
    /// Whether its holding record holds others up at `now`.
    pub fn holds(&self, now: u64) -> bool {
        match self.turn {
            Turn::Holding { since, until } => {
                since <= now.saturating_add(AHEAD_OF_CLOCK_NS)
                    && until >= since
                    && until <= now.saturating_add(MAX_TURN_NS)
                    && now < until.saturating_add(GRACE_NS)
            }
            _ => false,
        }
    }

    /// When it began waiting, if its waiting record is believable at `now`.
    fn waits_since(&self, now: u64) -> Option<u64> {
        match self.turn {
            Turn::Waiting { since } | Turn::Urgent { since }
                if since <= now.saturating_add(AHEAD_OF_CLOCK_NS) =>
            {
                Some(since)
            }
            _ => None,
        }
    }

    /// Where it stands in the queue at `now`, if it waits.
    fn class(&self, now: u64) -> Option<Class> {
        let since = self.waits_since(now)?;
        let urgent = matches!(self.turn, Turn::Urgent { .. });
        Some(Class::of(urgent, self.priority, since, now))
    }
}

/// Where a waiting slice stands in the queue: a lower class goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Urgent, granted high priority.
    High,
    /// Urgent (after a lull), or waiting for `AGE_NS` already.
    Urgent,
    Normal,
}

impl Class {
    /// The class of a slice at `priority` that waits since `since`, `urgent`ly or not.
    pub fn of(urgent: bool, priority: Priority, since: u64, now: u64) -> Class {
        match (urgent, priority) {
            (true, Priority::High) => Class::High,
            (true, _) => Class::Urgent,
            _ if aged(since, now) => Class::Urgent,
            _ => Class::Normal,
        }
    }
}

/// A slice that has waited this long for the turn goes first, as an urgent one does.
pub const AGE_NS: u64 = 50_000_000;

/// A slice seen holding the turn for this long while a reader waited, without being seen not
/// holding for `SEEN_NS` in between (the reader's own turns do not count; one of them is a
/// break for a slice still believed, not for one already passed over),
/// passes it on no more: an honest holder passes it on within its turn (at most a round), the
/// period in which it learns that another waits, and its drain.
pub const OVERHOLD_NS: u64 = 150_000_000;
/// A slice seen first in the queue of a free device for this long in all, without taking the
/// turn in between, is passed over: an honest one takes it within a poll, unless its host holds
/// its threads up (on a loaded 2-core machine, for up to 13 ms at a time).
pub const TAKE_GRACE_NS: u64 = 20_000_000;
/// A slice passed over that took turns before (an honest one its host held up, more likely than
/// one that never takes) is given the free device again for this long when a turn of the reader's
/// own slice ends, for `OVERHOLD_NS` after it was passed over: an honest waiter looks that often
/// near a holder's end.
pub const RETRY_NS: u64 = 250_000;
/// How long a change a reader sees must last before it counts (a slice that posts "not holding"
/// for less than this between holds is still holding), and how far before a reader first saw a
/// slice waiting its wait may have begun (readers look at least this often).
pub const SEEN_NS: u64 = 1_000_000;

/// A slice that has held this reader up (held the turn, or sat first in the queue of a free
/// device, while the reader waited) this much longer than its allotment of the time since (and
/// `LEEWAY`) is passed over, whatever it posts, until its allotment has paid the excess back.
/// Long enough that an honest slice back at work, which the node agent saw idle (no allotment
/// until it sees it at work, within its period of 1 s), is seldom passed over meanwhile.
pub const DEBT_NS: i64 = 300_000_000;
/// How far ahead of what it held this reader up a slice may run: a round.
pub const CREDIT_NS: i64 = CYCLE_NS as i64;
/// How much of the time (ppm) a slice with an allotment may hold a reader up beyond it: an honest
/// one on a loaded host sits first in the queue of a free device now and then before it takes
/// the turn, and its turns end a drain after their planned end.
pub const LEEWAY: u32 = FULL / 10;
/// A slice gone from the board (or whose turns could not be read) for this long is forgotten,
/// with what it owed: it held nobody up meanwhile. Until then what it owes is kept, so that a
/// tenant cannot clear it by making its turns unreadable for a moment.
pub const FORGET_NS: u64 = 60_000_000_000;

/// What one reader saw of each other slice's turn, by its own clock: the only account of the
/// others it trusts.
#[derive(Debug, Clone, Default)]
pub struct Observer {
    seen: Vec<Seen>,
    /// Each other slice's allotment as this reader last computed it (slice, ppm); a slice not
    /// listed has none.
    allotted: Vec<(u64, u32)>,
    /// When the slices' debts were last paid down by their allotments.
    paid_at: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    slice: u64,
    /// How long this reader, waiting, has seen the slice holding since it last saw it not
    /// holding for `SEEN_NS`.
    held_while_waiting: u64,
    /// When this reader last saw the slice holding while it waited (0: at its last look it did
    /// not wait, or the slice did not hold).
    last_look: u64,
    /// When this reader first saw the slice not holding, without a break since (0: holding).
    free_from: u64,
    /// When this reader first saw the slice waiting, without a break since (0: not waiting).
    waiting_from: u64,
    /// How long, in all, this reader has seen the slice first in the queue of a free device
    /// since it last saw it holding.
    stalled: u64,
    /// When this reader last saw it so (0: at its last look it did not).
    first_look: u64,
    /// When this reader passed it over for not taking a free turn (0: not since it last saw it
    /// hold the turn). Holders believe it idle until then.
    passed_at: u64,
    /// Whether this reader has seen it hold the turn.
    held_before: bool,
    /// How much longer it has held this reader up than its allotment of the time (ns), at least
    /// `-CREDIT_NS`.
    debt: i64,
    /// Passed over for its debt, until it is paid.
    indebted: bool,
    /// When this reader first found it gone from the board, without a break since (0: there).
    gone_since: u64,
}

impl Seen {
    /// It held this reader up for `ns` more, since the reader's last look: at most `SEEN_NS` of
    /// it, as a reader that waits looks that often (a longer gap is its host holding the reader's
    /// thread up, not the slice; one that stopped waiting says so, `Observer::not_waiting`).
    fn held_up(&mut self, ns: u64) {
        self.debt = self.debt.saturating_add(ns.min(SEEN_NS) as i64);
        if self.debt > DEBT_NS {
            self.indebted = true;
        }
    }
}

impl Observer {
    /// The others' turns as this reader believes them at `now`: `rivals` as read, less what its
    /// own record shows no honest slice would post (see `OVERHOLD_NS`, `TAKE_GRACE_NS`), and
    /// each wait counted from no earlier than `SEEN_NS` before this reader first saw it. `me`:
    /// this slice's place in the queue while it waits (slice, since, class).
    pub fn filter(
        &mut self,
        rivals: &[Rival],
        me: Option<(u64, u64, Class)>,
        now: u64,
    ) -> Vec<Rival> {
        self.pay(now);
        // A slice no longer on the board is forgotten, unless it owes and left less than
        // `FORGET_NS` ago.
        self.seen.retain_mut(|s| {
            if rivals.iter().any(|r| r.slice == s.slice) {
                s.gone_since = 0;
                return true;
            }
            if s.gone_since == 0 {
                s.gone_since = now;
            }
            s.debt > 0 && now.saturating_sub(s.gone_since) < FORGET_NS
        });
        let mut out: Vec<Rival> = Vec::with_capacity(rivals.len());
        for r in rivals {
            let i = match self.seen.iter().position(|s| s.slice == r.slice) {
                Some(i) => i,
                None => {
                    self.seen.push(Seen {
                        slice: r.slice,
                        ..Seen::default()
                    });
                    self.seen.len() - 1
                }
            };
            let s = &mut self.seen[i];
            let mut r = *r;
            if r.holds(now) {
                s.free_from = 0;
                s.stalled = 0;
                s.first_look = 0;
                s.passed_at = 0;
                s.held_before = true;
                if me.is_some() {
                    if s.last_look != 0 {
                        let held = now.saturating_sub(s.last_look);
                        s.held_while_waiting += held;
                        s.held_up(held);
                    }
                    s.last_look = now;
                } else {
                    s.last_look = 0;
                }
                if s.held_while_waiting > OVERHOLD_NS {
                    r.turn = Turn::Idle;
                }
            } else {
                s.last_look = 0;
                if s.free_from == 0 {
                    s.free_from = now;
                }
                if now - s.free_from >= SEEN_NS {
                    s.held_while_waiting = 0;
                }
            }
            match r.turn {
                Turn::Waiting { since } | Turn::Urgent { since } => {
                    if s.waiting_from == 0 {
                        s.waiting_from = now;
                    }
                    let since = since.max(s.waiting_from.saturating_sub(SEEN_NS));
                    r.turn = match r.turn {
                        Turn::Urgent { .. } => Turn::Urgent { since },
                        _ => Turn::Waiting { since },
                    };
                    // Passed over: for a holder until it takes a turn (its turn then ends at its
                    // planned end, `waiters`), for a waiter until its retry runs out.
                    if s.stalled > TAKE_GRACE_NS || (me.is_none() && s.passed_at != 0) {
                        r.turn = Turn::Idle;
                    }
                }
                _ => s.waiting_from = 0,
            }
            if s.indebted {
                r.turn = Turn::Idle;
            }
            out.push(r);
        }
        // Who is first in the queue while nobody holds the turn, as this reader waits.
        let free = me.is_some() && !out.iter().any(|r| r.holds(now));
        let me = me.map(|(slice, since, class)| (class, since, slice));
        let mut first_now = None;
        if free {
            loop {
                let first = out
                    .iter()
                    .filter_map(|r| Some((r.class(now)?, r.waits_since(now)?, r.slice)))
                    .fold(me, |a, b| match a {
                        Some(a) if before(a, b) => Some(a),
                        _ => Some(b),
                    });
                let Some((_, _, slice)) = first else { break };
                if me.is_some_and(|(.., m)| m == slice) {
                    break;
                }
                let Some(s) = self.seen.iter_mut().find(|s| s.slice == slice) else {
                    break;
                };
                if s.first_look != 0 {
                    let stalled = now.saturating_sub(s.first_look);
                    s.stalled += stalled;
                    s.held_up(stalled);
                }
                s.first_look = now;
                if s.stalled <= TAKE_GRACE_NS {
                    first_now = Some(slice);
                    break;
                }
                if s.passed_at == 0 {
                    s.passed_at = now;
                }
                // First for too long in all without taking a free turn: passed over.
                if let Some(r) = out.iter_mut().find(|r| r.slice == slice) {
                    r.turn = Turn::Idle;
                }
            }
        }
        for s in &mut self.seen {
            if first_now != Some(s.slice) {
                s.first_look = 0;
            }
        }
        out
    }

    /// This reader's own slice holds the turn at `now` (another process of it may lead, so this
    /// reader does not look at the others meanwhile): the time until its next look is nobody
    /// else's holding or stalling, and a slice it still believed gave way, as a break would show.
    /// One already passed over for holding stays so until a break is seen; one passed over for
    /// not taking a free turn, that took turns before, gets `RETRY_NS` of the free device after
    /// this turn, for `OVERHOLD_NS` after it was passed over.
    pub fn own_turn(&mut self, now: u64) {
        self.pay(now);
        for s in &mut self.seen {
            s.last_look = 0;
            s.first_look = 0;
            if s.held_while_waiting <= OVERHOLD_NS {
                s.held_while_waiting = 0;
            }
            if s.passed_at != 0 && s.held_before && now.saturating_sub(s.passed_at) <= OVERHOLD_NS {
                s.stalled = s.stalled.min(TAKE_GRACE_NS.saturating_sub(RETRY_NS));
            }
        }
    }
}

impl Observer {
    /// This reader stopped waiting at `now` (held back by its tokens, or out of work): it looks no
    /// more until it waits again, so the time until then is nobody's holding or stalling. A slice
    /// that still holds when it waits again counts from that look.
    pub fn not_waiting(&mut self, now: u64) {
        self.pay(now);
        for s in &mut self.seen {
            s.last_look = 0;
            s.first_look = 0;
        }
    }

    /// The other slices' allotments (slice, ppm) as this reader computed them at `now`: what
    /// each may hold it up from now on.
    pub fn set_allotted(&mut self, allotted: &[(u64, u32)], now: u64) {
        self.pay(now);
        self.allotted.clear();
        self.allotted.extend_from_slice(allotted);
    }

    /// Pays each slice's debt down by its allotment of the time since the last payment.
    fn pay(&mut self, now: u64) {
        let since = now.saturating_sub(self.paid_at);
        self.paid_at = now;
        if since == 0 {
            return;
        }
        for s in &mut self.seen {
            let ppm = self
                .allotted
                .iter()
                .find(|&&(slice, _)| slice == s.slice)
                .map_or(0, |&(_, ppm)| ppm)
                .min(FULL);
            let ppm = if ppm > 0 { (ppm + LEEWAY).min(FULL) } else { 0 };
            let paid = (since as u128 * ppm as u128 / FULL as u128).min(i64::MAX as u128) as i64;
            s.debt = s.debt.saturating_sub(paid).max(-CREDIT_NS);
            if s.debt <= 0 {
                s.indebted = false;
            }
        }
    }
}

/// Whether a slice waiting since `since` has waited `AGE_NS` at `now`.
fn aged(since: u64, now: u64) -> bool {
    now.saturating_sub(since) >= AGE_NS
}

/// Whether `a` goes before `b` in the queue (each: class, since, slice): the lower class first,
/// then who waited longest, then the lower slice id (so that every reader orders the same
/// records the same way).
fn before(a: (Class, u64, u64), b: (Class, u64, u64)) -> bool {
    a < b
}

/// What a waiting slice does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Take the turn now.
    Take,
    /// Another slice holds the turn until about this time: look again then (sooner if it may end
    /// early).
    HeldUntil(u64),
    /// Another slice goes first: look again soon.
    Queued,
}

/// Whether this slice (`slice`, waiting since `since`, in `class`) may take the turn at `now`.
pub fn next(slice: u64, since: u64, class: Class, rivals: &[Rival], now: u64) -> Next {
    if let Some(h) = rivals.iter().find(|r| r.holds(now)) {
        let Turn::Holding { until, .. } = h.turn else {
            unreachable!()
        };
        return Next::HeldUntil(until);
    }
    let me = (class, since, slice);
    let first = rivals
        .iter()
        .all(|r| match (r.class(now), r.waits_since(now)) {
            (Some(c), Some(s)) => before(me, (c, s, r.slice)),
            _ => true,
        });
    if first { Next::Take } else { Next::Queued }
}

/// After taking the turn at `since` (and posting it), whether this slice keeps it: of two slices
/// that took it at once, each seeing the other still waiting, the one that took it first keeps it
/// (the lower slice id at a tie), and the other goes back to waiting.
pub fn keeps(slice: u64, since: u64, rivals: &[Rival], now: u64) -> bool {
    rivals.iter().all(|r| match r.turn {
        Turn::Holding { since: s, .. } if r.holds(now) => (since, slice) < (s, r.slice),
        _ => true,
    })
}

/// The waiting slices a holder sees, as they bear on its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Waiters {
    /// Some other slice wants the device: one that waits for the turn, believed or passed over,
    /// or one that holds it at the same time. The turn is then not renewed past its end.
    pub any: bool,
    /// A slice waits that the holder gives way to: urgent, before a holder below high priority,
    /// or waiting for `AGE_NS` already, before any holder.
    pub higher: bool,
}

/// The waiting slices at `now`, for a holder at `priority`: `rivals` as this holder believes
/// them (`Observer::filter`), `read` as they post. Only a slice believed waiting ends the turn
/// early; every slice that posts a wait or holds the turn too stops it from being renewed, so
/// that it ends at its planned end. A slice passed over is still given the free device after
/// that end, should it take it then (an honest one delayed by its host), and two slices that came
/// to hold at once (each having passed the other over) part again: without that, each would go
/// on renewing its turn beside the other.
pub fn waiters(priority: Priority, rivals: &[Rival], read: &[Rival], now: u64) -> Waiters {
    let mut w = Waiters::default();
    for r in rivals {
        let Some(since) = r.waits_since(now) else {
            continue;
        };
        w.any = true;
        let urgent = matches!(r.turn, Turn::Urgent { .. });
        w.higher |= aged(since, now) || (urgent && priority != Priority::High);
    }
    w.any |= read
        .iter()
        .any(|r| r.holds(now) || r.waits_since(now).is_some());
    w
}

/// How long a turn at allotment `allot` (ppm) lasts while others want the device: its part of a
/// round, at least `MIN_TURN_NS`.
pub fn quantum(allot: u32) -> u64 {
    (CYCLE_NS as u128 * allot.min(FULL) as u128 / FULL as u128)
        .clamp(MIN_TURN_NS as u128, CYCLE_NS as u128) as u64
}

/// How long the slice's tokens (`tokens` ns of device time) let a turn last at allotment `allot`
/// (it earns `allot` of the time while it holds the turn, too); None without a bound (the whole
/// device).
pub fn paid_for(allot: u32, tokens: i64) -> Option<u64> {
    if allot >= FULL {
        return None;
    }
    let left = (FULL - allot) as u128;
    Some((tokens.max(0) as u128 * FULL as u128 / left).min(u64::MAX as u128) as u64)
}

/// How many tokens (ns of device time) a slice at allotment `allot` needs before it queues for a
/// turn (None: it needs none, having the whole device). Beside slices that want the device
/// (`contended`), its turns come one a round, each its allotment's part of the round, so the
/// round itself holds it to its allotment: it queues unless it owes more than a turn (what a turn
/// that ran long left owing is paid back by waiting). Alone, once its tokens pay for a whole turn,
/// or are as many as it can bank (`bank`): a slice that took every turn its tokens barely paid for
/// would take many short ones, each with a drain.
pub fn ready_at(allot: u32, bank: i64, contended: bool) -> Option<i64> {
    if allot >= FULL {
        return None;
    }
    let left = (FULL - allot) as u128;
    let price = |len: u64| (len as u128 * left / FULL as u128) as i64;
    Some(if contended {
        -price(quantum(allot))
    } else {
        price(quantum(allot)).min(bank)
    })
}

/// How long a turn taken now lasts while others want the device: its quantum, and half of what
/// its tokens hold beyond nothing (up to a quantum's worth) on top. A slice that got less than its
/// allotment banks what it did not use, and makes it up over the next turns; one that got more
/// owes, and gets its quantum (what it owes beyond a turn it waits for, `ready_at`). So what the
/// round loses (its handoffs, a busy host's late wake-ups, turns given up early to a slice after
/// a lull) is shared in proportion to the allotments, not left to whoever happened to lose it.
pub fn contended_length(allot: u32, tokens: i64) -> u64 {
    let q = quantum(allot);
    q + (tokens.clamp(0, q as i64) as u64) / 2
}

/// Whether a slice with `tokens` may queue for a turn (`ready_at`).
pub fn ready(allot: u32, tokens: i64, bank: i64, contended: bool) -> bool {
    ready_at(allot, bank, contended).is_none_or(|need| tokens >= need)
}

/// How long a turn taken now may last: its quantum, or what its tokens pay for if less (never
/// less than nothing: one launch always goes).
pub fn length(allot: u32, tokens: i64) -> u64 {
    let q = quantum(allot);
    paid_for(allot, tokens).map_or(q, |p| p.min(q))
}

/// What a holder does at `now`, with its turn planned to end at `end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Keep the turn; look again.
    Hold,
    /// End the turn: stop launching, let the queued work drain, then pass it on.
    Close,
    /// Nobody waits: the turn goes on until this new end.
    Renew(u64),
}

/// A holder gives way to a slice that goes before it (`Waiters::higher`) only once it has held
/// the turn this long: a slice that waited long to take it gets some work done in it.
pub const MIN_HELD_NS: u64 = MIN_TURN_NS;

/// The holder's decision at `now`: `since` and `end` are when its turn began and is planned to
/// end, `idle` whether it launched nothing since it last looked and has nothing left queued,
/// `waiters` who waits, and `renewable` what another turn would last if nobody waits (None or
/// less than `MIN_TURN_NS`: not paid for).
pub fn step(
    now: u64,
    (since, end): (u64, u64),
    idle: bool,
    waiters: Waiters,
    renewable: Option<u64>,
) -> Step {
    let held = now.saturating_sub(since);
    if (waiters.higher && held >= MIN_HELD_NS) || (waiters.any && idle) {
        return Step::Close;
    }
    if now < end {
        return Step::Hold;
    }
    match renewable {
        Some(len) if !waiters.any && len >= MIN_TURN_NS => Step::Renew(now + len),
        _ => Step::Close,
    }
}

/// How much work (ns, by the estimate) the holder may have queued `elapsed` ns into a turn of
/// `length` ns: what has run plus `ahead` (`AHEAD_NS`, or nothing beside a waiting
/// high-priority slice), never more than the turn.
pub fn allowed(elapsed: u64, length: u64, ahead: u64) -> u64 {
    elapsed.saturating_add(ahead).min(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn rival(slice: u64, turn: Turn) -> Rival {
        Rival {
            slice,
            turn,
            priority: Priority::Normal,
        }
    }

    #[test]
    fn the_slice_that_waited_longest_takes_a_free_turn() {
        let now = 100 * MS;
        let others = [
            rival(2, Turn::Waiting { since: 95 * MS }),
            rival(3, Turn::Idle),
        ];
        assert_eq!(next(1, 90 * MS, Class::Normal, &others, now), Next::Take);
        assert_eq!(next(1, 96 * MS, Class::Normal, &others, now), Next::Queued);
        // A tie goes to the lower slice id, so both readers agree.
        assert_eq!(next(1, 95 * MS, Class::Normal, &others, now), Next::Take);
        assert_eq!(
            next(
                2,
                95 * MS,
                Class::Normal,
                &[rival(1, Turn::Waiting { since: 95 * MS })],
                now
            ),
            Next::Queued
        );
    }

    #[test]
    fn an_urgent_high_priority_slice_goes_first_whatever_the_wait() {
        let now = 100 * MS;
        let high = |turn| Rival {
            slice: 2,
            turn,
            priority: Priority::High,
        };
        let urgent = [high(Turn::Urgent { since: 99 * MS })];
        assert_eq!(next(1, 60 * MS, Class::Normal, &urgent, now), Next::Queued);
        assert_eq!(next(1, 99 * MS, Class::High, &urgent, now), Next::Take);
        // Granted high but busy beyond its allotment: it waits its turn like the others.
        let busy = [high(Turn::Waiting { since: 99 * MS })];
        assert_eq!(next(1, 10 * MS, Class::Normal, &busy, now), Next::Take);
        // Urgent without high priority: before the busy, after the high.
        let light = [rival(2, Turn::Urgent { since: 99 * MS })];
        assert_eq!(next(1, 60 * MS, Class::Normal, &light, now), Next::Queued);
        assert_eq!(next(1, 99 * MS, Class::High, &light, now), Next::Take);
        assert!(waiters(Priority::Normal, &light, &light, now).higher);
        assert!(!waiters(Priority::High, &light, &light, now).higher);
        assert_eq!(
            waiters(Priority::Normal, &urgent, &urgent, now),
            Waiters {
                any: true,
                higher: true
            }
        );
        assert!(!waiters(Priority::Normal, &busy, &busy, now).higher);
    }

    #[test]
    fn a_slice_that_waited_long_goes_first_and_ends_the_holders_turn() {
        let now = 1_000 * MS;
        // A light slice, urgent: it goes before this one until this one has waited long.
        let busy = rival(2, Turn::Urgent { since: now - MS });
        let me = |since| Class::of(false, Priority::Low, since, now);
        assert_eq!(me(now - AGE_NS + 1), Class::Normal);
        assert_eq!(
            next(1, now - AGE_NS + 1, me(now - AGE_NS + 1), &[busy], now),
            Next::Queued
        );
        assert_eq!(me(now - AGE_NS), Class::Urgent);
        assert_eq!(
            next(1, now - AGE_NS, me(now - AGE_NS), &[busy], now),
            Next::Take
        );
        // Before any holder, a high-priority one included.
        let aged = rival(
            3,
            Turn::Waiting {
                since: now - AGE_NS,
            },
        );
        assert!(waiters(Priority::High, &[aged], &[aged], now).higher);
        let young = rival(3, Turn::Waiting { since: now - MS });
        assert!(!waiters(Priority::High, &[young], &[young], now).higher);
    }

    #[test]
    fn a_holder_holds_others_up_until_its_end_and_grace() {
        let now = 100 * MS;
        let held = [rival(
            2,
            Turn::Holding {
                since: 95 * MS,
                until: 105 * MS,
            },
        )];
        assert_eq!(
            next(1, 0, Class::High, &held, now),
            Next::HeldUntil(105 * MS)
        );
        // Draining past its end, within the grace: still held.
        assert_eq!(
            next(1, 0, Class::High, &held, 105 * MS + GRACE_NS - 1),
            Next::HeldUntil(105 * MS)
        );
        // Dead or overrunning: past the grace nobody waits for it.
        assert_eq!(
            next(1, 0, Class::Normal, &held, 105 * MS + GRACE_NS),
            Next::Take
        );
    }

    #[test]
    fn a_holding_record_nobody_could_hold_is_not_believed() {
        let now = 100 * MS;
        for turn in [
            // Planned to end too far ahead.
            Turn::Holding {
                since: 90 * MS,
                until: now + MAX_TURN_NS + 1,
            },
            // Taken in the future.
            Turn::Holding {
                since: now + 2 * AHEAD_OF_CLOCK_NS,
                until: now + 3 * AHEAD_OF_CLOCK_NS,
            },
            // Ending before it began.
            Turn::Holding {
                since: 99 * MS,
                until: 98 * MS,
            },
        ] {
            assert!(!rival(2, turn).holds(now), "{turn:?}");
            assert_eq!(
                next(1, 99 * MS, Class::Normal, &[rival(2, turn)], now),
                Next::Take
            );
        }
        // A waiting record from the future does not jump the queue.
        let future = [rival(
            2,
            Turn::Waiting {
                since: now + 10 * MS,
            },
        )];
        assert!(rival(2, future[0].turn).waits_since(now).is_none());
        assert_eq!(next(1, 99 * MS, Class::Normal, &future, now), Next::Take);
    }

    #[test]
    fn of_two_that_took_the_turn_at_once_the_first_keeps_it() {
        let now = 100 * MS;
        let other = |since| {
            [rival(
                2,
                Turn::Holding {
                    since,
                    until: since + 5 * MS,
                },
            )]
        };
        assert!(keeps(1, 99 * MS, &other(99 * MS + 1), now));
        assert!(!keeps(1, 99 * MS + 1, &other(99 * MS), now));
        assert!(keeps(1, 99 * MS, &other(99 * MS), now));
        assert!(!keeps(3, 99 * MS, &other(99 * MS), now));
        assert!(keeps(1, 99 * MS, &[rival(2, Turn::Idle)], now));
    }

    #[test]
    fn a_slice_seen_holding_too_long_holds_nobody_up() {
        let mut o = Observer::default();
        let t0 = 1_000 * MS;
        // Allotted half the device (what its claims say, where nobody corroborates them).
        o.set_allotted(&[(2, FULL / 2)], t0);
        // It keeps posting a fresh turn, each within the bounds.
        let forged = |now: u64| {
            [rival(
                2,
                Turn::Holding {
                    since: now,
                    until: now + 10 * MS,
                },
            )]
        };
        let mut t = t0;
        while t <= t0 + OVERHOLD_NS {
            let r = o.filter(&forged(t), Some((1, t0, Class::Normal)), t);
            assert!(r[0].holds(t), "held up at {} ms", (t - t0) / MS);
            t += 10 * MS;
        }
        let r = o.filter(&forged(t), Some((1, t0, Class::Normal)), t);
        assert_eq!(r[0].turn, Turn::Idle);
        assert_eq!(next(1, t0, Class::Normal, &r, t), Next::Take);
        // This reader's own turn in between does not start the count again.
        o.filter(&forged(t + MS / 2), None, t + MS / 2);
        o.own_turn(t);
        let r = o.filter(&forged(t + MS), Some((1, t0, Class::Normal)), t + MS);
        assert_eq!(r[0].turn, Turn::Idle);
        // Seen not holding for a moment only: still counted as the same hold.
        o.filter(&[rival(2, Turn::Idle)], None, t + MS);
        let r = o.filter(&forged(t + 2 * MS), None, t + 2 * MS);
        assert_eq!(r[0].turn, Turn::Idle);
        // Seen not holding for SEEN_NS: believed again (an honest slice's next turn).
        let t = t + 3 * MS;
        o.filter(&[rival(2, Turn::Idle)], None, t);
        o.filter(&[rival(2, Turn::Idle)], None, t + SEEN_NS);
        let r = o.filter(&forged(t + SEEN_NS + 1), None, t + SEEN_NS + 1);
        assert!(r[0].holds(t + SEEN_NS + 1));
    }

    #[test]
    fn a_slice_that_flickers_between_holding_and_waiting_first_holds_a_reader_up_no_longer_than_its_allotment()
     {
        // A tenant posts a fresh holding record for 2 ms, then that it has waited since the start
        // of time for 14 ms, and again: each hold starts the stall count again, and each wait is
        // a break in its holding, so neither bound alone ever passes it over.
        let flicker = |t: u64| {
            if (t / MS) % 16 < 2 {
                rival(
                    2,
                    Turn::Holding {
                        since: t - (t / MS % 16) * MS,
                        until: t + 2 * MS,
                    },
                )
            } else {
                rival(2, Turn::Urgent { since: 1 })
            }
        };
        // How much of `secs` the reader, waiting throughout and looking every 100 µs, is held up;
        // `vanish`: the tenant makes its turns unreadable for one look in every 2,000 (its entry
        // no longer names the device), as if it had left and come back.
        let held_up = |allotted: u32, secs: u64, vanish: bool| {
            let mut o = Observer::default();
            let t0 = 1_000 * MS;
            o.set_allotted(&[(2, allotted)], t0);
            let (mut t, mut held) = (t0, 0);
            while t < t0 + secs * 1_000 * MS {
                let seen = if vanish && (t - t0).is_multiple_of(200 * MS) {
                    Vec::new()
                } else {
                    vec![flicker(t)]
                };
                let r = o.filter(&seen, Some((1, t0, Class::Normal)), t);
                if next(1, t0, Class::Normal, &r, t) != Next::Take {
                    held += 1;
                }
                t += MS / 10;
            }
            held as f64 / (secs * 10_000) as f64
        };
        // Nothing allotted (its claims not corroborated by the node agent): passed over for good
        // after its first `DEBT_NS` (6% of 5 s), also where it leaves the board for a moment now
        // and then.
        for vanish in [false, true] {
            let none = held_up(0, 5, vanish);
            assert!(none < 0.08, "held up {:.1}% of the time", 100.0 * none);
        }
        // Half the device allotted (its claims believed): it holds the reader up about that long
        // and the leeway, as a busy slice at half would at most.
        let half = held_up(FULL / 2, 5, false);
        assert!(
            (0.5..0.65).contains(&half),
            "held up {:.1}% of the time",
            100.0 * half
        );
    }

    #[test]
    fn what_a_slice_gone_from_the_board_owes_is_kept_for_a_while_then_forgotten() {
        // Nothing allotted: a slice that holds the turn while the reader waits owes all of it.
        // It holds 10 ms of every 12 (the breaks keep it clear of `OVERHOLD_NS`).
        let held = |t: u64| {
            [rival(
                2,
                if (t / MS) % 12 < 10 {
                    Turn::Holding {
                        since: t - MS,
                        until: t + MS,
                    }
                } else {
                    Turn::Idle
                },
            )]
        };
        let me = Some((1, 0, Class::Normal));
        let mut o = Observer::default();
        let mut t = 1_200 * MS;
        o.set_allotted(&[], t);
        // A look every half millisecond for 480 ms: held up 400 ms, past what it may.
        for _ in 0..960 {
            o.filter(&held(t), me, t);
            t += MS / 2;
        }
        assert!((t / MS) % 12 < 10);
        assert!(!o.filter(&held(t), me, t)[0].holds(t), "not passed over");
        // Gone for 1.2 s: back, still passed over.
        o.filter(&[], me, t + 1);
        t += 1_200 * MS;
        assert!(
            !o.filter(&held(t), me, t)[0].holds(t),
            "1.2 s away cleared it"
        );
        // Gone for longer than `FORGET_NS`: believed again.
        o.filter(&[], me, t + 1);
        t += FORGET_NS + 12 * MS;
        o.filter(&[], me, t);
        t += 12 * MS;
        assert!(o.filter(&held(t), me, t)[0].holds(t), "not forgotten");
    }

    #[test]
    fn the_time_a_reader_did_not_look_is_not_held_against_a_slice_within_its_allotment() {
        // A slice allotted a fifth of the device holds the turn 8 ms of every 40. The reader
        // waits through one of its turns, then does not look until the next of its turns (its
        // host holds its thread up), waits through that one too and takes the turn after it; and
        // so on.
        let mut o = Observer::default();
        let t0 = 1_000 * MS;
        o.set_allotted(&[(2, FULL / 5)], t0);
        let held = |start: u64| {
            [rival(
                2,
                Turn::Holding {
                    since: start,
                    until: start + 8 * MS,
                },
            )]
        };
        for round in 0..125 {
            let start = t0 + round * 40 * MS;
            for t in (start..start + 8 * MS).step_by(MS as usize / 10).skip(1) {
                let r = o.filter(&held(start), Some((1, t0, Class::Normal)), t);
                assert!(
                    r[0].holds(t),
                    "passed over after {round} of its turns, each within its allotment"
                );
            }
            if round % 2 == 1 {
                o.own_turn(start + 8 * MS + MS / 10);
            }
        }
    }

    #[test]
    fn a_holder_that_renews_while_the_reader_stopped_waiting_is_not_an_overholder() {
        // An honest slice allotted 70% renews its turn while nobody waits. The reader waits 5 ms
        // (looking every 100 µs), is held back by its tokens for 60 ms (out of the queue, so the
        // holder renews), and waits again; twelve times. It saw the slice hold for 60 ms while it
        // waited, under `OVERHOLD_NS`: the 720 ms it did not wait are nobody's holding.
        let mut o = Observer::default();
        let t0 = 1_000 * MS;
        o.set_allotted(&[(2, FULL * 7 / 10)], t0);
        let held = |t: u64| {
            [rival(
                2,
                Turn::Holding {
                    since: t - t % (40 * MS),
                    until: t - t % (40 * MS) + 40 * MS,
                },
            )]
        };
        let mut t = t0;
        for round in 0..12 {
            for _ in 0..50 {
                let r = o.filter(&held(t), Some((1, t, Class::Normal)), t);
                assert!(r[0].holds(t), "passed over in wait {round}");
                t += MS / 10;
            }
            o.not_waiting(t);
            t += 60 * MS;
        }
    }

    #[test]
    fn a_turn_of_its_own_slice_between_two_looks_is_not_counted_as_anothers_hold() {
        // A reader that waits, then finds its slice holding (led by another process of it, so it
        // does not look at the others), then waits again: an honest slice that held before and
        // after each of those turns is never an overholder.
        let mut o = Observer::default();
        let mut t = 1_000 * MS;
        // It holds 29 ms of every 42: its allotment, 70% (this reader's 30% is the rest).
        o.set_allotted(&[(2, FULL * 7 / 10)], t);
        for _ in 0..20 {
            let held = [rival(
                2,
                Turn::Holding {
                    since: t,
                    until: t + 30 * MS,
                },
            )];
            let r = o.filter(&held, Some((1, t, Class::Normal)), t);
            assert!(r[0].holds(t));
            let r = o.filter(&held, Some((1, t, Class::Normal)), t + 29 * MS);
            assert!(r[0].holds(t + 29 * MS), "passed over at {} ms", t / MS);
            o.own_turn(t);
            t += 42 * MS;
        }
    }

    #[test]
    fn a_slice_first_in_the_queue_that_never_takes_is_passed_over() {
        let mut o = Observer::default();
        let t0 = 1_000 * MS;
        // Says it has waited since the start of time, and never takes the free turn.
        let jumper = [rival(2, Turn::Waiting { since: 1 })];
        let me = Some((1, t0, Class::Normal));
        let r = o.filter(&jumper, me, t0);
        assert_eq!(next(1, t0, Class::Normal, &r, t0), Next::Queued);
        let t = t0 + TAKE_GRACE_NS;
        let r = o.filter(&jumper, me, t);
        assert_eq!(next(1, t0, Class::Normal, &r, t), Next::Queued);
        let t = t0 + TAKE_GRACE_NS + 1;
        let r = o.filter(&jumper, me, t);
        assert_eq!(next(1, t0, Class::Normal, &r, t), Next::Take);
        // An honest slice first in line that takes the turn at once is never passed over.
        let mut o = Observer::default();
        let honest = [rival(2, Turn::Waiting { since: t0 - MS })];
        let r = o.filter(&honest, me, t0);
        assert_eq!(next(1, t0, Class::Normal, &r, t0), Next::Queued);
        let took = [rival(
            2,
            Turn::Holding {
                since: t0 + MS,
                until: t0 + 7 * MS,
            },
        )];
        let r = o.filter(&took, me, t0 + MS);
        assert!(r[0].holds(t0 + MS));
    }

    #[test]
    fn a_wait_counts_from_when_the_reader_saw_it_and_a_staller_stays_passed_over() {
        let mut o = Observer::default();
        let t0 = 1_000 * MS;
        let jumper = [rival(2, Turn::Waiting { since: 1 })];
        // Waiting since the start of time, as far as it says: since about when this reader saw.
        let r = o.filter(&jumper, None, t0);
        assert_eq!(
            r[0].turn,
            Turn::Waiting {
                since: t0 - SEEN_NS
            }
        );
        // First in the queue of a free device for a while, across another slice's turn between.
        let me = |since| Some((1, since, Class::Normal));
        o.filter(&jumper, me(t0), t0 + MS);
        o.filter(&jumper, me(t0), t0 + MS + TAKE_GRACE_NS / 2);
        let holder = rival(
            3,
            Turn::Holding {
                since: t0 + 10 * MS,
                until: t0 + 20 * MS,
            },
        );
        o.filter(&[jumper[0], holder], me(t0), t0 + 15 * MS);
        o.filter(&jumper, me(t0), t0 + 30 * MS);
        let r = o.filter(&jumper, me(t0), t0 + 30 * MS + TAKE_GRACE_NS / 2 + 1);
        assert_eq!(r[0].turn, Turn::Idle);
        // And for holders too, at their next look: it no longer ends their turns early, but
        // their turns end at their planned end (it may take the free device then).
        let t = t0 + 40 * MS;
        let r = o.filter(&jumper, None, t);
        assert_eq!(r[0].turn, Turn::Idle);
        let w = waiters(Priority::Normal, &r, &jumper, t);
        assert_eq!(
            w,
            Waiters {
                any: true,
                higher: false
            }
        );
        assert_eq!(
            step(t, (t - 5 * MS, t + MS), false, w, Some(40 * MS)),
            Step::Hold
        );
        assert_eq!(
            step(t + MS, (t - 5 * MS, t + MS), false, w, Some(40 * MS)),
            Step::Close
        );
    }

    #[test]
    fn a_slice_that_took_turns_and_stalled_once_gets_the_free_device_again_after_a_turn() {
        let t0 = 1_000 * MS;
        let me = |since| Some((1, since, Class::Normal));
        let mut o = Observer::default();
        // It took turns before: seen holding.
        let held = [rival(
            2,
            Turn::Holding {
                since: t0 - 5 * MS,
                until: t0 - MS,
            },
        )];
        o.filter(&held, me(t0 - 2 * MS), t0 - 2 * MS);
        // Then it waits first in the queue of the free device, and its host holds it up.
        let urgent = [rival(2, Turn::Urgent { since: t0 })];
        let mut t = t0;
        while t <= t0 + TAKE_GRACE_NS {
            let r = o.filter(&urgent, me(t0), t);
            assert_eq!(
                next(1, t0, Class::Normal, &r, t),
                Next::Queued,
                "{} ms",
                (t - t0) / MS
            );
            t += MS;
        }
        let r = o.filter(&urgent, me(t0), t);
        assert_eq!(next(1, t0, Class::Normal, &r, t), Next::Take);
        // This reader's turn: the passed-over slice does not end it early, and is believed
        // waiting again once it ends.
        o.own_turn(t + MS);
        let r = o.filter(&urgent, None, t + MS);
        assert_eq!(r[0].turn, Turn::Idle);
        let end = t + 40 * MS;
        o.own_turn(end);
        let r = o.filter(&urgent, me(end), end);
        assert_eq!(next(1, end, Class::Normal, &r, end), Next::Queued);
        let r = o.filter(&urgent, me(end), end + RETRY_NS);
        assert_eq!(
            next(1, end, Class::Normal, &r, end + RETRY_NS),
            Next::Queued
        );
        // Not taken within the retry: passed over again.
        let later = end + RETRY_NS + 1;
        let r = o.filter(&urgent, me(end), later);
        assert_eq!(next(1, end, Class::Normal, &r, later), Next::Take);
        // Retries end OVERHOLD_NS after it was first passed over.
        let past = t + OVERHOLD_NS + MS;
        o.own_turn(past);
        let r = o.filter(&urgent, me(past), past);
        assert_eq!(next(1, past, Class::Normal, &r, past), Next::Take);
        // Taken at a retry: believed as before.
        let mut o2 = o.clone();
        let took = [rival(
            2,
            Turn::Holding {
                since: past,
                until: past + 5 * MS,
            },
        )];
        o2.filter(&took, None, past + MS);
        let r = o2.filter(&urgent, None, past + 2 * MS);
        assert!(matches!(r[0].turn, Turn::Urgent { .. }), "{:?}", r[0].turn);

        // A slice never seen holding gets no retry.
        let mut o = Observer::default();
        let mut t = t0;
        while t <= t0 + TAKE_GRACE_NS + MS {
            o.filter(&urgent, me(t0), t);
            t += MS;
        }
        o.own_turn(t);
        let r = o.filter(&urgent, me(t), t + MS);
        assert_eq!(next(1, t, Class::Normal, &r, t + MS), Next::Take);
    }

    #[test]
    fn two_slices_that_came_to_hold_at_once_part_at_the_end_of_a_turn() {
        // A waiting slice its host held up past the take grace was passed over; the holder then
        // went on past the overhold, and the waiter passed it over in turn: both hold. Each sees
        // the other's holding record, passed over or not, so neither renews its turn: the first
        // to end waits, the other is believed again once seen not holding, and turns resume.
        let t = 1_000 * MS;
        let other = [rival(
            2,
            Turn::Holding {
                since: t - 200 * MS,
                until: t + 30 * MS,
            },
        )];
        let passed_over = [rival(2, Turn::Idle)];
        let w = waiters(Priority::Low, &passed_over, &other, t);
        assert!(w.any && !w.higher);
        let end = t + 10 * MS;
        assert_eq!(
            step(end, (t - 50 * MS, end), false, w, Some(40 * MS)),
            Step::Close
        );
        // Nobody else on the device: renewed as before.
        let w = waiters(Priority::Low, &[], &[], end);
        assert_eq!(w, Waiters::default());
        assert_eq!(
            step(end, (t - 50 * MS, end), false, w, Some(40 * MS)),
            Step::Renew(end + 40 * MS)
        );
    }

    #[test]
    fn turns_follow_the_allotment_within_a_round() {
        assert_eq!(quantum(300_000), CYCLE_NS * 3 / 10);
        assert_eq!(quantum(700_000), CYCLE_NS * 7 / 10);
        assert_eq!(quantum(FULL), CYCLE_NS);
        // A 1% slice still gets a turn a kernel can use.
        assert_eq!(quantum(10_000), MIN_TURN_NS);
    }

    #[test]
    fn tokens_pay_for_a_turn_and_what_it_earns_meanwhile() {
        // 30%: 7 ms of tokens pay for 10 ms (3 ms more are earned during it).
        assert_eq!(paid_for(300_000, 7 * MS as i64), Some(10 * MS));
        assert_eq!(
            length(300_000, 7 * MS as i64),
            (10 * MS).min(quantum(300_000))
        );
        assert_eq!(length(300_000, 7 * MS as i64 / 10), MS);
        assert_eq!(length(300_000, -5), 0);
        assert_eq!(paid_for(FULL, 0), None);
        assert_eq!(length(FULL, -5), CYCLE_NS);
    }

    #[test]
    fn a_slice_behind_its_allotment_makes_it_up_in_longer_turns_and_one_ahead_gets_its_quantum() {
        let q = quantum(300_000);
        assert_eq!(q, 12 * MS);
        assert_eq!(contended_length(300_000, -3 * MS as i64), q);
        assert_eq!(contended_length(300_000, 0), q);
        assert_eq!(contended_length(300_000, 4 * MS as i64), q + 2 * MS);
        // at most half a quantum on top, however much it banked
        assert_eq!(contended_length(300_000, 40 * MS as i64), q + q / 2);
    }

    #[test]
    fn a_slice_waits_for_a_whole_turn_of_tokens_or_a_full_bank_alone() {
        let turn = quantum(300_000) as i64;
        let bank = turn;
        // A turn at 30% costs 70% of its length net.
        assert!(!ready(300_000, turn * 7 / 10 - 1, bank, false));
        assert!(ready(300_000, turn * 7 / 10, bank, false));
        // A bank smaller than a turn's price: a full bank will do.
        assert!(ready(300_000, MS as i64, MS as i64, false));
        assert!(ready(FULL, -100, bank, false));
        assert_eq!(ready_at(FULL, bank, true), None);
    }

    #[test]
    fn beside_others_a_slice_queues_unless_it_owes_more_than_a_turn() {
        let owes = quantum(300_000) as i64 * 7 / 10;
        let bank = 6 * MS as i64;
        assert_eq!(ready_at(300_000, bank, true), Some(-owes));
        assert!(ready(300_000, 0, bank, true));
        assert!(ready(300_000, -owes, bank, true));
        assert!(!ready(300_000, -owes - 1, bank, true));
    }

    #[test]
    fn a_holder_renews_while_nobody_waits_and_closes_for_others() {
        let none = Waiters::default();
        let some = Waiters {
            any: true,
            higher: false,
        };
        let high = Waiters {
            any: true,
            higher: true,
        };
        let (now, end) = (10 * MS, 12 * MS);
        assert_eq!(step(now, (0, end), false, none, Some(5 * MS)), Step::Hold);
        assert_eq!(step(now, (0, end), false, some, Some(5 * MS)), Step::Hold);
        // Nothing queued while others wait: pass it on at once.
        assert_eq!(step(now, (0, end), true, some, Some(5 * MS)), Step::Close);
        assert_eq!(step(now, (0, end), true, none, Some(5 * MS)), Step::Hold);
        // A slice that goes first waits: at once, once the holder has had its least.
        assert_eq!(step(now, (0, end), false, high, Some(5 * MS)), Step::Close);
        assert_eq!(
            step(now, (now - MIN_HELD_NS + 1, end), false, high, Some(5 * MS)),
            Step::Hold
        );
        // At the end: renew while nobody waits and tokens pay, else close.
        assert_eq!(
            step(end, (0, end), false, none, Some(5 * MS)),
            Step::Renew(17 * MS)
        );
        assert_eq!(step(end, (0, end), false, some, Some(5 * MS)), Step::Close);
        assert_eq!(step(end, (0, end), false, none, Some(0)), Step::Close);
        // Tokens that pay for less than a turn's worth: closed, not renewed in crumbs.
        assert_eq!(
            step(end, (0, end), false, none, Some(MIN_TURN_NS - 1)),
            Step::Close
        );
        assert_eq!(step(end, (0, end), false, none, None), Step::Close);
    }

    #[test]
    fn queued_work_stays_close_behind_the_turn() {
        assert_eq!(allowed(0, 6 * MS, AHEAD_NS), AHEAD_NS);
        assert_eq!(allowed(3 * MS, 6 * MS, AHEAD_NS), 3 * MS + AHEAD_NS);
        assert_eq!(allowed(5 * MS + AHEAD_NS / 2, 6 * MS, AHEAD_NS), 6 * MS);
        assert_eq!(allowed(3 * MS, 6 * MS, 0), 3 * MS);
    }
}
