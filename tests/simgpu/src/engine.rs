//! The compute engine of one device.
//!
//! Each context has an in-order queue of work. The engine runs one item at a time and
//! time-slices between contexts that have runnable work, round-robin, `timeslice_ns` each (like a
//! GPU without MPS: contexts never run concurrently, and a long kernel is preempted at the end of
//! its slice when another context is waiting). A context alone on the device runs without
//! switches, its slice renewed each `timeslice_ns`, so a context that arrives waits for the rest of
//! the current slice at most. Nothing runs in the background: whichever process touches the device first calls
//! [`Dev::advance`] with the current time, which replays exactly what the engine did since the
//! last call. Every launch advances before it queues, so the replay never misses a submission.
//!
//! Changing contexts takes engine time: a **switch** (saving one context's state, loading the
//! next one's) runs no kernel, so it is nobody's device time, but the driver's utilisation
//! counters (NVML) count it as busy, with the incoming context; it counts in the incoming
//! context's time slice. How long each switch takes is drawn from the switch count, between 0 and twice the mean
//! (`Sched::switch_ns`), so where a time slice ends in a context's kernels varies as it does on a
//! GPU, where kernels and switches never take exactly the same time twice.
//!
//! Kernels come in two kinds. A **working** kernel (`ITEM_KERNEL`) needs a fixed amount of engine
//! time: preempted, it resumes where it stopped, and its wall time stretches. A **waiting** kernel
//! (`ITEM_WAIT`, a spin on the GPU's global timer) needs the clock to reach its deadline, which is
//! set when it first runs (its start plus the time it waits for): it keeps the engine busy only
//! while it is scheduled, and ends at the first moment it is on the engine at or after its
//! deadline. Switched out and resumed after its deadline, it ends at once, having used less engine
//! time than it waited for; only what it ran is credited (device time, busy time, utilisation).

use crate::dev::Dev;
use crate::layout::*;

/// How the engine arbitrates between contexts (fixed when the state was made).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sched {
    /// How long a context runs while others wait.
    pub timeslice_ns: u64,
    /// The mean length of a switch from one context to another.
    pub switch_ns: u64,
}

impl From<u64> for Sched {
    /// Time slices of `timeslice_ns`, switches that take no time.
    fn from(timeslice_ns: u64) -> Sched {
        Sched {
            timeslice_ns,
            switch_ns: 0,
        }
    }
}

/// The length of switch number `n` when switches take `mean` on average: uniform in
/// `[0, 2 * mean]`, a fixed function of `n` (so a run replays alike).
pub fn switch_length(mean: u64, n: u64) -> u64 {
    if mean == 0 {
        return 0;
    }
    ((splitmix64(n) as u128 * (2 * mean as u128 + 1)) >> 64) as u64
}

/// A well-mixed 64-bit function of `x` (SplitMix64's output step): numbers in a row give draws
/// that look independent.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Why an item could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

impl Dev<'_> {
    /// Queues `item` on context `c`; returns its sequence number.
    pub fn push(&mut self, c: u32, item: Item) -> Result<u64, QueueFull> {
        let ctx = &mut self.b.ctxs[c as usize];
        if ctx.submitted - ctx.completed >= RING as u64 {
            return Err(QueueFull);
        }
        let seq = ctx.submitted + 1;
        ctx.ring[(seq % RING as u64) as usize] = item;
        ctx.submitted = seq;
        self.set_active(c, true);
        Ok(seq)
    }

    pub fn completed(&self, c: u32) -> u64 {
        self.b.ctxs[c as usize].completed
    }

    pub fn submitted(&self, c: u32) -> u64 {
        self.b.ctxs[c as usize].submitted
    }

    /// Engine time that must pass, at the very least, before item `seq` of context `c` is done:
    /// the remaining work queued up to it (host functions count as 20 us; a waiting kernel that
    /// has started, the time to its deadline).
    pub fn min_wait(&self, c: u32, seq: u64) -> u64 {
        let ctx = &self.b.ctxs[c as usize];
        let now = self.b.engine.sim_time;
        (ctx.completed + 1..=seq.min(ctx.submitted))
            .map(|s| {
                let it = &ctx.ring[(s % RING as u64) as usize];
                match it.kind {
                    ITEM_KERNEL => it.remaining,
                    ITEM_WAIT if it.arg != 0 => it.arg.saturating_sub(now),
                    ITEM_WAIT => it.remaining,
                    ITEM_HOSTFN if it.remaining == HOSTFN_PENDING => 20_000,
                    _ => 0,
                }
            })
            .fold(0u64, |a, b| a.saturating_add(b))
    }

    /// Marks the host function at the head of context `c` as returned.
    pub fn finish_hostfn(&mut self, c: u32, seq: u64) {
        let ctx = &mut self.b.ctxs[c as usize];
        if ctx.completed < seq && seq <= ctx.submitted {
            let it = &mut ctx.ring[(seq % RING as u64) as usize];
            if it.kind == ITEM_HOSTFN {
                it.remaining = 0;
            }
        }
    }

    fn head(&self, c: u32) -> Option<Item> {
        let ctx = &self.b.ctxs[c as usize];
        (ctx.state == CTX_LIVE && ctx.submitted > ctx.completed)
            .then(|| ctx.ring[((ctx.completed + 1) % RING as u64) as usize])
    }

    fn runnable(&self, c: u32) -> bool {
        self.head(c)
            .is_some_and(|it| !(it.kind == ITEM_HOSTFN && it.remaining == HOSTFN_PENDING))
    }

    /// The next runnable context after `after` in round-robin order, `after` itself last.
    fn next_runnable(&self, after: u32) -> Option<u32> {
        let start = if after == NONE { 0 } else { after + 1 };
        // Active contexts in ascending order: the first runnable one at or after `start`, else
        // (wrapping around) the lowest runnable one.
        let mut wrapped = None;
        for (w, &bits) in self.b.engine.active.iter().enumerate() {
            let mut bits = bits;
            while bits != 0 {
                let c = w as u32 * 64 + bits.trailing_zeros();
                bits &= bits - 1;
                if !self.runnable(c) {
                    continue;
                }
                if c >= start {
                    return Some(c);
                }
                wrapped.get_or_insert(c);
            }
        }
        wrapped
    }

    fn others_runnable(&self, c: u32) -> bool {
        self.b.engine.active.iter().enumerate().any(|(w, &bits)| {
            let mut bits = bits;
            while bits != 0 {
                let o = w as u32 * 64 + bits.trailing_zeros();
                bits &= bits - 1;
                if o != c && self.runnable(o) {
                    return true;
                }
            }
            false
        })
    }

    fn complete_head(&mut self, c: u32) {
        let ctx = &mut self.b.ctxs[c as usize];
        ctx.completed += 1;
        if ctx.completed == ctx.submitted {
            self.set_active(c, false);
        }
    }

    fn fire_marker(&mut self, arg: u64, t: u64) {
        let (i, record_generation) = ((arg & 0xffff_ffff) as usize, (arg >> 32) as u32);
        if let Some(e) = self.b.events.get_mut(i)
            && e.state == EVENT_PENDING
            && e.record_generation == record_generation
        {
            e.ts = t;
            e.state = EVENT_DONE;
        }
    }

    fn credit(&mut self, c: u32, run: u64, t_end: u64) {
        let ctx = &mut self.b.ctxs[c as usize];
        ctx.device_time_ns += run;
        let owner = ctx.owner as usize;
        let p = &mut self.b.procs[owner];
        p.device_time_ns += run;
        add_busy(&mut p.util, t_end - run, t_end);
        let e = &mut self.b.engine;
        e.busy_ns += run;
        add_busy(&mut e.util, t_end - run, t_end);
    }

    /// Whether no context has work queued or running.
    pub fn engine_idle(&self) -> bool {
        self.b.engine.current == NONE && self.b.engine.active.iter().all(|w| *w == 0)
    }

    /// Makes `c` the context on the engine, with a fresh time slice; if another context's state
    /// is loaded, a switch starts (the engine runs nobody until it is over).
    fn switch_to(&mut self, c: u32, switch_ns: u64) {
        let e = &mut self.b.engine;
        e.current = c;
        e.slice_used = 0;
        if e.loaded != c {
            e.loaded = c;
            e.switches += 1;
            e.switch_left = switch_length(switch_ns, e.switches);
        }
    }

    /// Replays the engine up to `now` (monotonic ns).
    pub fn advance(&mut self, now: u64, sched: impl Into<Sched>) {
        let sched = sched.into();
        let timeslice = sched.timeslice_ns.max(1);
        let mut t = self.b.engine.sim_time;
        if self.engine_idle() {
            // Idle: nothing to replay.
            self.b.engine.sim_time = t.max(now);
            return;
        }
        loop {
            let mut cur = self.b.engine.current;
            if cur == NONE || !self.runnable(cur) {
                match self.next_runnable(cur) {
                    Some(c) => {
                        cur = c;
                        self.switch_to(c, sched.switch_ns);
                    }
                    None => {
                        self.b.engine.current = NONE;
                        self.b.engine.switch_left = 0;
                        t = t.max(now);
                        break;
                    }
                }
            }
            if self.b.engine.switch_left > 0 {
                // Switching: no kernel runs, so nobody is credited device time, but the
                // driver's utilisation counters see the engine busy (with the incoming context),
                // and the incoming context's slice runs.
                if t >= now {
                    break;
                }
                let e = &mut self.b.engine;
                let d = e.switch_left.min(now - t);
                t += d;
                e.sim_time = t;
                e.slice_used += d;
                e.switch_left -= d;
                add_busy(&mut e.util, t - d, t);
                let owner = self.b.ctxs[cur as usize].owner as usize;
                add_busy(&mut self.b.procs[owner].util, t - d, t);
                continue;
            }
            let Some(item) = self.head(cur) else { continue };
            match item.kind {
                ITEM_MARKER => {
                    self.fire_marker(item.arg, t);
                    self.complete_head(cur);
                    continue;
                }
                ITEM_HOSTFN => {
                    // Runnable only once it has returned.
                    self.complete_head(cur);
                    continue;
                }
                _ => {}
            }
            let waiting = item.kind == ITEM_WAIT;
            // A waiting kernel on the engine at or after its deadline ends there and then.
            if item.remaining == 0 || (waiting && item.arg != 0 && t >= item.arg) {
                self.complete_head(cur);
                continue;
            }
            if t >= now {
                break;
            }
            let others = self.others_runnable(cur);
            if others && self.b.engine.slice_used >= timeslice {
                let next = self.next_runnable(cur).unwrap_or(cur);
                self.switch_to(next, sched.switch_ns);
                continue;
            }
            let slot = ((self.b.ctxs[cur as usize].completed + 1) % RING as u64) as usize;
            let left = if waiting {
                // It starts now: its deadline is its wait from here.
                let it = &mut self.b.ctxs[cur as usize].ring[slot];
                if it.arg == 0 {
                    it.arg = t.saturating_add(it.remaining).max(1);
                }
                it.arg - t
            } else {
                item.remaining
            };
            let mut run = left.min(now - t);
            if others {
                run = run.min(timeslice - self.b.engine.slice_used);
            }
            t += run;
            self.b.engine.sim_time = t;
            self.b.engine.slice_used += run;
            if !others {
                // Alone, the context's slice is renewed each time it runs out (as the hardware
                // scheduler reloads a channel group's timeslice): a context that arrives waits
                // for the rest of the current slice, not for none of it.
                self.b.engine.slice_used %= timeslice;
            }
            let it = &mut self.b.ctxs[cur as usize].ring[slot];
            it.remaining = left - run;
            let done = it.remaining == 0;
            self.credit(cur, run, t);
            if done {
                self.complete_head(cur);
            }
        }
        self.b.engine.sim_time = t;
    }
}

/// Adds the busy span `[from, to)` to the history, split at bucket boundaries.
pub fn add_busy(r: &mut UtilRing, from: u64, to: u64) {
    let mut t = from;
    while t < to {
        let b = t / UTIL_BUCKET_NS;
        let end = ((b + 1) * UTIL_BUCKET_NS).min(to);
        let last = (r.next as usize + UTIL_POINTS - 1) % UTIL_POINTS;
        if r.len > 0 && r.bucket[last] == b {
            r.busy[last] += end - t;
        } else if r.len == 0 || r.bucket[last] < b {
            let i = r.next as usize;
            r.bucket[i] = b;
            r.busy[i] = end - t;
            r.next = ((i + 1) % UTIL_POINTS) as u32;
            r.len = (r.len + 1).min(UTIL_POINTS as u32);
        }
        t = end;
    }
}

/// Busy time in `[from, to)` according to the history `r`: whole buckets exactly, a bucket cut by
/// either end in proportion to the part inside (the history does not know where in a bucket the
/// work ran). Time older than the history counts as idle.
pub fn busy_between(r: &UtilRing, from: u64, to: u64) -> u64 {
    if to <= from {
        return 0;
    }
    (0..r.len as usize)
        .map(|k| (r.next as usize + UTIL_POINTS - 1 - k) % UTIL_POINTS)
        .map(|i| {
            let (start, end) = (
                r.bucket[i] * UTIL_BUCKET_NS,
                (r.bucket[i] + 1) * UTIL_BUCKET_NS,
            );
            let inside = end.min(to).saturating_sub(start.max(from));
            (r.busy[i] as u128 * inside as u128 / UTIL_BUCKET_NS as u128) as u64
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::MS;
    use crate::dev::testdev::TestDevice;

    fn kernel(ns: u64) -> Item {
        Item {
            kind: ITEM_KERNEL,
            stream: 0,
            remaining: ns,
            arg: 0,
            total: ns,
        }
    }

    #[test]
    fn a_lone_context_runs_back_to_back() {
        let mut t = TestDevice::new(64 << 20);
        let mut d = t.dev();
        let (c, _) = d.create_ctx(0, 0, 0).unwrap();
        d.advance(1_000, 2 * MS);
        for _ in 0..3 {
            d.push(c, kernel(MS)).unwrap();
        }
        d.advance(1_000 + 2 * MS + MS / 2, 2 * MS);
        assert_eq!(d.completed(c), 2);
        assert_eq!(d.min_wait(c, 3), MS / 2);
        d.advance(1_000 + 10 * MS, 2 * MS);
        assert_eq!(d.completed(c), 3);
        assert_eq!(d.b.procs[0].device_time_ns, 3 * MS);
        assert_eq!(d.b.engine.busy_ns, 3 * MS);
    }

    #[test]
    fn two_busy_contexts_share_the_engine_by_time_slices() {
        let mut t = TestDevice::new(64 << 20);
        let mut d = t.dev();
        let (a, _) = d.create_ctx(1, 0, 0).unwrap();
        let (b, _) = d.create_ctx(2, 0, 0).unwrap();
        let start = 10 * MS;
        d.advance(start, 2 * MS);
        // A queues one 10 ms kernel, B many 1 ms kernels: both get half the engine.
        d.push(a, kernel(10 * MS)).unwrap();
        for _ in 0..20 {
            d.push(b, kernel(MS)).unwrap();
        }
        d.advance(start + 8 * MS, 2 * MS);
        assert_eq!(d.b.procs[1].device_time_ns, 4 * MS);
        assert_eq!(d.b.procs[2].device_time_ns, 4 * MS);
        // A's kernel takes 20 ms of wall time for 10 ms of engine time.
        d.advance(start + 20 * MS, 2 * MS);
        assert_eq!(d.completed(a), 1);
        assert_eq!(d.b.procs[2].device_time_ns, 10 * MS);
    }

    fn waiting(ns: u64) -> Item {
        Item {
            kind: ITEM_WAIT,
            ..kernel(ns)
        }
    }

    /// Queues a marker for a fresh event of context `c`'s process; returns the event.
    fn marker(d: &mut Dev, c: u32) -> u32 {
        let owner = d.b.ctxs[c as usize].owner;
        let (e, _) = d.create_event(owner).unwrap();
        d.b.events[e as usize].state = EVENT_PENDING;
        d.b.events[e as usize].record_generation = 1;
        d.push(
            c,
            Item {
                kind: ITEM_MARKER,
                arg: e as u64 | 1 << 32,
                ..Item::default()
            },
        )
        .unwrap();
        e
    }

    /// Context A queues one 3 ms kernel of `kind` and a marker after it, beside B's 1 ms kernels
    /// back to back, 2 ms slices from 10 ms. A runs 10-12 ms, B 12-14 ms, then A again.
    /// Returns (A's device time, when A's marker fired, B's device time) at 20 ms.
    fn three_ms_beside_a_busy_neighbour(kind: Item) -> (u64, u64, u64) {
        let mut t = TestDevice::new(64 << 20);
        let mut d = t.dev();
        let (a, _) = d.create_ctx(1, 0, 0).unwrap();
        let (b, _) = d.create_ctx(2, 0, 0).unwrap();
        let start = 10 * MS;
        d.advance(start, 2 * MS);
        d.push(a, kind).unwrap();
        let e = marker(&mut d, a);
        for _ in 0..20 {
            d.push(b, kernel(MS)).unwrap();
        }
        d.advance(start + 20 * MS / 2, 2 * MS);
        assert_eq!(d.b.events[e as usize].state, EVENT_DONE);
        let busy = d.b.engine.busy_ns;
        let (ta, tb) = (d.b.procs[1].device_time_ns, d.b.procs[2].device_time_ns);
        assert_eq!(
            busy,
            ta + tb,
            "the engine was busy all along, with one of them"
        );
        assert_eq!(busy, 10 * MS);
        (ta, d.b.events[e as usize].ts - start, tb)
    }

    #[test]
    fn a_working_kernel_beside_a_busy_neighbour_resumes_where_it_stopped() {
        // 2 ms in A's first slice, the last 1 ms after B's: done at 5 ms, all 3 ms credited.
        let (ta, done, tb) = three_ms_beside_a_busy_neighbour(kernel(3 * MS));
        assert_eq!((ta, done, tb), (3 * MS, 5 * MS, 7 * MS));
    }

    #[test]
    fn a_waiting_kernel_beside_a_busy_neighbour_ends_on_time_having_run_less() {
        // Its deadline is 3 ms after it started; when A is back on the engine at 4 ms it is past
        // it, so the kernel ends at once: it ran (and is credited) 2 ms of the 3 it waited.
        let (ta, done, tb) = three_ms_beside_a_busy_neighbour(waiting(3 * MS));
        assert_eq!((ta, done, tb), (2 * MS, 4 * MS, 8 * MS));
    }

    #[test]
    fn a_waiting_kernel_alone_keeps_the_engine_busy_until_its_deadline() {
        let mut t = TestDevice::new(64 << 20);
        let mut d = t.dev();
        let (c, _) = d.create_ctx(0, 0, 0).unwrap();
        d.advance(MS, 2 * MS);
        d.push(c, waiting(5 * MS)).unwrap();
        d.push(c, waiting(5 * MS)).unwrap();
        let e = marker(&mut d, c);
        d.advance(3 * MS, 2 * MS);
        assert_eq!(
            d.min_wait(c, 2),
            3 * MS + 5 * MS,
            "started: to its deadline; then all of it"
        );
        d.advance(20 * MS, 2 * MS);
        assert_eq!(d.b.events[e as usize].ts, 11 * MS);
        assert_eq!(d.b.procs[0].device_time_ns, 10 * MS);
        assert_eq!(d.b.engine.busy_ns, 10 * MS);
    }

    #[test]
    fn a_waiting_kernel_s_deadline_is_set_when_it_first_runs_not_when_queued() {
        let mut t = TestDevice::new(64 << 20);
        let mut d = t.dev();
        let (b, _) = d.create_ctx(2, 0, 0).unwrap();
        let (a, _) = d.create_ctx(1, 0, 0).unwrap();
        d.advance(10 * MS, 2 * MS);
        for _ in 0..20 {
            d.push(b, kernel(MS)).unwrap();
        }
        d.advance(11 * MS, 2 * MS);
        // Queued at 11 ms, behind the rest of B's slice: it starts at 12 ms, so its deadline is
        // 15 ms. It runs 12-14 ms, B 14-16 ms, and it ends when A is back, at 16 ms.
        d.push(a, waiting(3 * MS)).unwrap();
        let e = marker(&mut d, a);
        d.advance(13 * MS, 2 * MS);
        assert_eq!(d.min_wait(a, 1), 2 * MS);
        d.advance(15 * MS, 2 * MS);
        assert_eq!(
            d.completed(a),
            0,
            "switched out before its deadline, it waits for its turn"
        );
        assert_eq!(d.min_wait(a, 1), 0);
        d.advance(30 * MS, 2 * MS);
        assert_eq!(d.b.events[e as usize].ts, 16 * MS);
        assert_eq!(d.b.procs[1].device_time_ns, 2 * MS);
    }

    #[test]
    fn markers_take_the_time_the_engine_reaches_them() {
        let mut t = TestDevice::new(64 << 20);
        let mut d = t.dev();
        let (c, _) = d.create_ctx(0, 0, 0).unwrap();
        let (e, _) = d.create_event(0).unwrap();
        d.advance(MS, 2 * MS);
        d.push(c, kernel(3 * MS)).unwrap();
        d.b.events[e as usize].state = EVENT_PENDING;
        d.b.events[e as usize].record_generation = 5;
        d.push(
            c,
            Item {
                kind: ITEM_MARKER,
                arg: e as u64 | 5 << 32,
                ..Item::default()
            },
        )
        .unwrap();
        d.advance(2 * MS, 2 * MS);
        assert_eq!(d.b.events[e as usize].state, EVENT_PENDING);
        d.advance(100 * MS, 2 * MS);
        assert_eq!(d.b.events[e as usize].state, EVENT_DONE);
        assert_eq!(d.b.events[e as usize].ts, 4 * MS);
    }

    #[test]
    fn a_pending_host_function_blocks_only_its_context() {
        let mut t = TestDevice::new(64 << 20);
        let mut d = t.dev();
        let (a, _) = d.create_ctx(1, 0, 0).unwrap();
        let (b, _) = d.create_ctx(2, 0, 0).unwrap();
        d.advance(MS, 2 * MS);
        let h = d
            .push(
                a,
                Item {
                    kind: ITEM_HOSTFN,
                    remaining: HOSTFN_PENDING,
                    ..Item::default()
                },
            )
            .unwrap();
        d.push(a, kernel(MS)).unwrap();
        d.push(b, kernel(MS)).unwrap();
        d.advance(5 * MS, 2 * MS);
        assert_eq!(d.completed(a), 0);
        assert_eq!(d.completed(b), 1);
        d.finish_hostfn(a, h);
        d.advance(5 * MS, 2 * MS);
        assert_eq!(
            d.completed(a),
            1,
            "the host function completes when it has returned"
        );
        d.advance(7 * MS, 2 * MS);
        assert_eq!(d.completed(a), 2);
        assert_eq!(d.b.procs[1].device_time_ns, MS);
    }

    #[test]
    fn full_queue_is_refused_and_idle_time_is_not_work() {
        let mut t = TestDevice::new(64 << 20);
        let mut d = t.dev();
        let (c, _) = d.create_ctx(0, 0, 0).unwrap();
        for _ in 0..RING {
            d.push(c, kernel(1)).unwrap();
        }
        assert_eq!(d.push(c, kernel(1)), Err(QueueFull));
        d.advance(MS, 2 * MS);
        d.push(c, kernel(1)).unwrap();
        d.advance(10 * MS, 2 * MS);
        assert_eq!(d.b.engine.busy_ns, RING as u64 + 1);
    }

    #[test]
    fn round_robin_visits_every_busy_context_in_turn() {
        let mut t = TestDevice::new(64 << 20);
        let mut d = t.dev();
        let ctxs: Vec<u32> = (0..3).map(|o| d.create_ctx(o, 0, 0).unwrap().0).collect();
        d.advance(MS, MS);
        for &c in &ctxs {
            for _ in 0..10 {
                d.push(c, kernel(MS)).unwrap();
            }
        }
        // 1 ms slices: after 3 ms each context has had exactly one slice, after 9 ms three.
        d.advance(4 * MS, MS);
        assert!((0..3).all(|o| d.b.procs[o].device_time_ns == MS));
        d.advance(10 * MS, MS);
        assert!((0..3).all(|o| d.b.procs[o].device_time_ns == 3 * MS));
    }

    #[test]
    fn switch_lengths_are_uniform_up_to_twice_the_mean_and_replay_alike() {
        assert_eq!(switch_length(0, 7), 0);
        let n = 100_000u64;
        let lens: Vec<u64> = (1..=n).map(|k| switch_length(50_000, k)).collect();
        assert!(lens.iter().all(|&l| l <= 100_000));
        let mean = lens.iter().sum::<u64>() / n;
        assert!((49_000..=51_000).contains(&mean), "mean {mean}");
        // A quarter of them are under 25 us.
        let short = lens.iter().filter(|&&l| l < 25_000).count() as f64 / n as f64;
        assert!((0.24..0.26).contains(&short), "{short}");
        assert_eq!(switch_length(50_000, 42), switch_length(50_000, 42));
    }

    #[test]
    fn a_switch_runs_no_kernel_reads_busy_and_counts_in_the_incoming_slice() {
        let mut t = TestDevice::new(64 << 20);
        let mut d = t.dev();
        let (a, _) = d.create_ctx(1, 0, 0).unwrap();
        let (b, _) = d.create_ctx(2, 0, 0).unwrap();
        let sched = Sched {
            timeslice_ns: 2 * MS,
            switch_ns: 100_000,
        };
        let start = 10 * MS;
        d.advance(start, sched);
        for _ in 0..100 {
            d.push(a, kernel(MS)).unwrap();
            d.push(b, kernel(MS)).unwrap();
        }
        d.advance(start + 50 * MS, sched);
        let e = &d.b.engine;
        // A switch before each slice, the first loading A: 2 ms slices of which the switch takes
        // its part.
        assert!((24..=27).contains(&e.switches), "{} switches", e.switches);
        let switching: u64 = (1..=e.switches).map(|k| switch_length(100_000, k)).sum();
        assert_eq!(
            e.busy_ns + switching - e.switch_left,
            50 * MS,
            "the engine either ran a kernel or switched"
        );
        assert_eq!(
            d.b.procs[1].device_time_ns + d.b.procs[2].device_time_ns,
            e.busy_ns,
            "nobody is credited for a switch"
        );
        assert_eq!(
            busy_between(&d.b.engine.util, start, start + 50 * MS),
            50 * MS,
            "the driver's counters see the engine busy throughout, switches too"
        );
        // Each got half of what ran, within a switch.
        let diff = d.b.procs[1]
            .device_time_ns
            .abs_diff(d.b.procs[2].device_time_ns);
        assert!(diff <= 2 * MS, "{diff}");
    }

    #[test]
    fn a_context_alone_switches_once_to_load_and_never_again() {
        let mut t = TestDevice::new(64 << 20);
        let mut d = t.dev();
        let (c, _) = d.create_ctx(0, 0, 0).unwrap();
        let sched = Sched {
            timeslice_ns: MS,
            switch_ns: 100_000,
        };
        d.advance(MS, sched);
        for _ in 0..20 {
            d.push(c, kernel(MS)).unwrap();
        }
        d.advance(5 * MS, sched);
        // Idle for a while, then more work: its state is still on the engine.
        d.advance(40 * MS, sched);
        d.push(c, kernel(MS)).unwrap();
        d.advance(60 * MS, sched);
        assert_eq!(d.b.engine.switches, 1);
        assert_eq!(d.completed(c), 21);
        assert_eq!(d.b.procs[0].device_time_ns, 21 * MS);
    }

    /// Two contexts each keeping 1 ms waiting kernels queued for 200 ms with time slices of
    /// 1024 us: what their kernels asked for over the engine time they ran.
    fn asked_over_ran(switch_ns: u64) -> f64 {
        let mut t = TestDevice::new(64 << 20);
        let mut d = t.dev();
        let (a, _) = d.create_ctx(1, 0, 0).unwrap();
        let (b, _) = d.create_ctx(2, 0, 0).unwrap();
        let sched = Sched {
            timeslice_ns: 1_024_000,
            switch_ns,
        };
        d.advance(MS, sched);
        let mut now = MS;
        while now < 201 * MS {
            for c in [a, b] {
                while d.submitted(c) - d.completed(c) < 4 {
                    d.push(c, waiting(MS)).unwrap();
                }
            }
            now += 100_000;
            d.advance(now, sched);
        }
        let asked = (d.completed(a) + d.completed(b)) * MS;
        asked as f64 / d.b.engine.busy_ns as f64
    }

    #[test]
    fn a_waiting_kernel_switched_out_just_after_it_started_is_credited_its_whole_wait() {
        // Slices a little longer than the kernels: each slice runs one kernel and starts the
        // next, which is past its deadline when its context is back: two asked for each slice.
        let r = asked_over_ran(0);
        assert!((1.9..2.0).contains(&r), "{r}");
        // Switches of 0-100 us eat into the slice: the second kernel starts in a quarter of the
        // slices (those whose switch took under 24 us); in the others the first is switched out
        // just before its end.
        let r = asked_over_ran(50_000);
        assert!((1.2..1.35).contains(&r), "{r}");
    }

    fn ring() -> UtilRing {
        UtilRing {
            next: 0,
            len: 0,
            bucket: [0; UTIL_POINTS],
            busy: [0; UTIL_POINTS],
        }
    }

    #[test]
    fn utilisation_history_measures_windows() {
        let mut r = ring();
        // Busy the first half of every 100 ms from 1 s to 3 s.
        for k in 0..20u64 {
            let t = 1_000 * MS + k * 100 * MS;
            add_busy(&mut r, t, t + 50 * MS);
        }
        assert_eq!(busy_between(&r, 2_000 * MS, 3_000 * MS), 500 * MS);
        // Whole buckets are exact wherever the work ran in them.
        assert_eq!(busy_between(&r, 2_000 * MS, 2_050 * MS), 50 * MS);
        assert_eq!(busy_between(&r, 2_050 * MS, 2_100 * MS), 0);
        // A bucket cut by the window counts in proportion.
        assert_eq!(busy_between(&r, 2_045 * MS, 2_055 * MS), 5 * MS);
    }

    #[test]
    fn busy_spans_split_at_bucket_boundaries() {
        let mut r = ring();
        add_busy(&mut r, 5 * MS, 27 * MS);
        add_busy(&mut r, 27 * MS, 28 * MS);
        assert_eq!(busy_between(&r, 0, 10 * MS), 5 * MS);
        assert_eq!(busy_between(&r, 10 * MS, 20 * MS), 10 * MS);
        assert_eq!(busy_between(&r, 20 * MS, 30 * MS), 8 * MS);
        // The ring keeps the newest UTIL_POINTS buckets.
        add_busy(&mut r, 0, (UTIL_POINTS as u64 + 10) * UTIL_BUCKET_NS);
        assert_eq!(r.len as usize, UTIL_POINTS);
        assert_eq!(busy_between(&r, 0, 10 * UTIL_BUCKET_NS), 0);
    }
}
