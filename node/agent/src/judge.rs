//! The agent's judgement, pure: plain numbers in, findings and actions out. No files, no
//! clocks, no NVML (`verify` does the I/O). See docs/agent.md.

use std::collections::{BTreeMap, VecDeque};

use cuslice_policy::config::{Config, Limits};

pub const MIB: u64 = 1 << 20;
const S: u64 = 1_000_000_000;

// ---- memory ---------------------------------------------------------------------------------

/// One process of a slice on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Host pid.
    pub pid: i32,
    /// Bytes the driver says it holds.
    pub driver: u64,
    /// Bytes the slice's ledger charges it; None: the ledger has no slot for it (it never
    /// loaded the library, or went around it).
    pub charged: Option<u64>,
}

impl Held {
    /// What the driver counts that the ledger does not.
    fn unaccounted(&self) -> u64 {
        self.driver.saturating_sub(self.charged.unwrap_or(0))
    }
}

pub fn total(held: &[Held]) -> u64 {
    held.iter().map(|h| h.driver).sum()
}

/// The processes to kill to bring a slice holding `held` back under `cap`: first those holding
/// the most memory the ledger does not account for (a process that went around the library, or
/// whose ledger entry was overwritten), then the largest; no more than needed. Empty when the
/// slice is within its cap.
pub fn victims(cap: u64, held: &[Held]) -> Vec<i32> {
    let mut order: Vec<&Held> = held.iter().filter(|h| h.driver > 0).collect();
    order.sort_by(|a, b| {
        (b.unaccounted(), b.driver, a.pid).cmp(&(a.unaccounted(), a.driver, b.pid))
    });
    let mut left = total(held);
    let mut out = Vec::new();
    for h in order {
        if left <= cap {
            break;
        }
        left -= h.driver;
        out.push(h.pid);
    }
    out
}

/// The window over which `stop` counts a slice's time over its memory cap: this many times the
/// grace, and at least this many agent periods. A slice may be over its cap for the grace in
/// total within any such window, whether at once or in pieces; a tenant that comes back over
/// and over gets at most 1/10 of the time, and only until its first kill.
pub const OVER_WINDOW_GRACES: f64 = 10.0;
pub const OVER_WINDOW_PERIODS: f64 = 10.0;

pub fn over_window_s(grace_s: f64, period_s: f64) -> f64 {
    (OVER_WINDOW_GRACES * grace_s).max(OVER_WINDOW_PERIODS * period_s)
}

/// How long a slice was over its memory cap, in total, over the last window, from checks about
/// a period apart. The time between two checks counts in full when both saw the slice over,
/// half when one did (it went over, or came back, somewhere between them), not at all when
/// neither did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OverTime {
    /// The last check: when (seconds) and whether the slice was over.
    last: Option<(f64, bool)>,
    /// (when, seconds over counted then), oldest first.
    counted: VecDeque<(f64, f64)>,
    /// When `stop` last killed for it, and whom.
    pub kill: Option<(f64, Vec<i32>)>,
}

impl OverTime {
    /// Takes the check at `now` (seconds); returns the time over the cap within the window
    /// ending now.
    pub fn check(&mut self, now: f64, over: bool, window_s: f64) -> f64 {
        if let Some((t, was)) = self.last {
            let halves = u8::from(was) + u8::from(over);
            let add = (now - t).max(0.0) * f64::from(halves) / 2.0;
            if add > 0.0 {
                self.counted.push_back((now, add));
            }
        }
        self.last = Some((now, over));
        while self.counted.front().is_some_and(|c| c.0 <= now - window_s) {
            self.counted.pop_front();
        }
        if self.kill.as_ref().is_some_and(|k| k.0 <= now - window_s) {
            self.kill = None;
        }
        self.total()
    }

    /// The time over counted within the window at the last check.
    pub fn total(&self) -> f64 {
        // A fold from +0.0: an empty f64 sum is -0.0, which findings.json would show.
        self.counted.iter().fold(0.0, |a, c| a + c.1)
    }

    /// Nothing over and nothing killed within the window: nothing worth keeping.
    pub fn idle(&self) -> bool {
        self.counted.is_empty() && self.kill.is_none() && !self.last.is_some_and(|l| l.1)
    }
}

/// What `stop` does about a slice's memory at a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryAction {
    Nothing,
    /// Kill these processes (`victims`): the slice was over its cap for the grace in total
    /// within the window.
    Kill(Vec<i32>),
    /// Kill every process of the container: after a kill within the window, processes other
    /// than those killed hold more than the cap (a loop that starts the bypass again).
    KillAll,
}

/// What to do about a slice holding `held` under `cap`, over it for `over_s` in total within
/// the window (`OverTime::check`), with its last kill `kill` (within the window, else None).
pub fn memory_action(
    cap: u64,
    held: &[Held],
    over_s: f64,
    grace_s: f64,
    kill: Option<&(f64, Vec<i32>)>,
) -> MemoryAction {
    if total(held) <= cap {
        return MemoryAction::Nothing;
    }
    if let Some((_, killed)) = kill {
        // What the killed processes held may not be released yet; only the others count.
        let others: Vec<Held> = held
            .iter()
            .filter(|h| !killed.contains(&h.pid))
            .copied()
            .collect();
        return if total(&others) > cap {
            MemoryAction::KillAll
        } else {
            MemoryAction::Nothing
        };
    }
    if over_s >= grace_s {
        MemoryAction::Kill(victims(cap, held))
    } else {
        MemoryAction::Nothing
    }
}

/// A cap lowered while the slice runs (`cuslice set`, which alone can change the hook file)
/// frees nothing: the slice keeps what it held, and the library refuses its new allocations
/// until it is under the cap. So what the driver counted when the cap went down is allowed
/// under `stop`, shrinking as the slice frees memory, gone once it is under the cap. Given the
/// cap at the last check and now, what the driver counts now and the allowance so far, the
/// allowance now (None: none).
pub fn lowered_allowance(
    was: Option<u64>,
    cap: Option<u64>,
    driver: u64,
    allowance: Option<u64>,
) -> Option<u64> {
    let cap = cap?;
    if driver <= cap {
        return None;
    }
    match (was, allowance) {
        (Some(w), _) if cap < w => Some(driver.min(w.max(allowance.unwrap_or(0)))),
        (_, Some(a)) => Some(a.min(driver)),
        _ => None,
    }
}

/// How much more than the ledger's total the driver may count for a slice before the ledger is
/// said not to match: allocations made between the two readings, and the driver's rounding.
pub fn ledger_slack(driver: u64) -> u64 {
    (64 * MIB).max(driver / 16)
}

/// Whether the driver counts a slice holding clearly more than its ledger says (a process
/// unknown to the ledger, or counters written over).
pub fn ledger_short(ledger_used: u64, driver_used: u64) -> bool {
    driver_used > ledger_used.saturating_add(ledger_slack(driver_used))
}

/// Device memory no process's NVML entry shows, beyond what the slices may hold that way:
/// a real driver never puts managed memory in a process's entry (an H200, driver 580: 518 MiB
/// in the entry of a process holding 3072 MiB of resident managed memory, all of it in the
/// device's used memory). Given the device's used memory, the sum of every listed process's
/// entry, the driver's own (the least `used - entries` seen) and the slices' headroom under
/// their caps (None: a party with no cap is there, and may hold any amount so), the bytes
/// unattributed beyond `ledger_slack`; None when within it or when nothing can be said.
pub fn unattributed(used: u64, entries: u64, own: u64, headroom: Option<u64>) -> Option<u64> {
    let beyond = used
        .saturating_sub(entries)
        .saturating_sub(own)
        .saturating_sub(headroom?);
    (beyond > ledger_slack(used)).then_some(beyond)
}

/// Ticks in a row a ledger mismatch must be seen before it is a finding.
pub const LEDGER_TICKS: u32 = 2;

/// How many times at most a slice whose ledger looks short of the driver's count is looked at
/// again within a tick (`short_at_a_look`) before the tick counts it short.
pub const LEDGER_LOOKS: u32 = 5;

/// Whether one look again finds a slice's ledger short: the driver's count of the slice's
/// processes on the device, against its ledger read just before and just after it. A process
/// of the slice charges its ledger before the driver allocates and gives back after the driver
/// frees, so the ledger never says less than the driver counts at one moment; but the two are
/// read at different moments, and a process that frees between them makes the ledger look short
/// by what it freed. Memory held around the library is short at every look; an honest slice
/// churning at its cap, at some looks only.
pub fn short_at_a_look(ledger_before: u64, driver_used: u64, ledger_after: u64) -> bool {
    ledger_short(ledger_before.max(ledger_after), driver_used)
}

// ---- the slice's limits per device ----------------------------------------------------------

pub use cuslice_policy::config::gpus::strictest;
use cuslice_policy::config::gpus::visible;

/// The limits a slice's config sets for device `uuid`, as a process of the slice numbers its
/// devices: NVML's devices (`uuids`, in NVML's order), narrowed by the container's
/// `NVIDIA_VISIBLE_DEVICES` and the process's `CUDA_VISIBLE_DEVICES`. Without per-device
/// variables every device gets the same limits. A device the process should not see at all
/// gets the strictest limits the config sets for any device. For a slice whose GPUs its hook
/// recorded, [`Config::limits_of_gpu`] instead: the container's numbering, whatever the
/// processes' environments say.
pub fn limits_for(
    config: &Config,
    uuid: &str,
    uuids: &[String],
    nvidia_visible: Option<&str>,
    cuda_visible: Option<&str>,
) -> Limits {
    if config.mentioned_ordinals().is_empty() {
        return config.limits(0);
    }
    let container = visible(nvidia_visible, uuids).unwrap_or_else(|| uuids.to_vec());
    let process = visible(cuda_visible, &container).unwrap_or(container);
    config.limits_of_gpu(uuid, &process)
}

// ---- compute: reading the driver's samples ----------------------------------------------------

/// Turns one process's utilisation samples into device time. The driver reports, per process
/// that ran, the share of its last sample period the process had a kernel running, stamped with
/// when it was taken (one sample per process per period). A sample stands for the time back to
/// the process's previous one, but never more than one sample period (the smallest gap seen
/// between two stamps of one process on the device), and at most `FIRST_COVER_US` before a
/// period is known.
#[derive(Debug, Clone, Default)]
pub struct SampleClock {
    /// Newest stamp of each process (µs).
    last: BTreeMap<u32, u64>,
    /// Smallest gap seen between two stamps of one process (µs).
    period_us: Option<u64>,
    /// Newest stamp of any process: the next query asks for newer ones.
    pub seen_us: u64,
    /// The device's newest stamp taken by `take_stamp`, and the smallest gap seen between two
    /// (µs).
    stamp_us: Option<u64>,
    stamp_period_us: Option<u64>,
    /// When (µs) the driver last gave a stamp naming two or more processes (`sample_model`).
    pub multi_seen_us: Option<u64>,
}

const FIRST_COVER_US: u64 = 1_000_000;

impl SampleClock {
    pub fn new(now_us: u64) -> SampleClock {
        SampleClock {
            seen_us: now_us,
            ..SampleClock::default()
        }
    }

    /// Device time (ns) the sample (stamp `t_us`, `sm` percent) of `pid` stands for. Samples
    /// older than the process's last are ignored (0).
    pub fn take(&mut self, pid: u32, t_us: u64, sm: u32) -> u64 {
        let since = self.last.get(&pid).copied();
        if since.is_some_and(|s| t_us <= s) {
            return 0;
        }
        self.seen_us = self.seen_us.max(t_us);
        self.last.insert(pid, t_us);
        let cover = match since {
            Some(s) => {
                let gap = t_us - s;
                let p = self.period_us.map_or(gap, |p| p.min(gap));
                self.period_us = Some(p);
                gap.min(p)
            }
            None => self.period_us.unwrap_or(FIRST_COVER_US),
        };
        // A whole percent rounded down: k stands for [k, k+1), so k + 1/2 is unbiased; 100 is
        // exact.
        let half_pcts = if sm >= 100 { 200 } else { 2 * sm as u64 + 1 };
        cover * 1000 * half_pcts / 200
    }

    /// The time (ns) a stamp (`t_us`, the named figure `sm`) stands for under one sample a
    /// period, and the device's busy time in it: the figure is the device's over the period,
    /// so the stamp stands for the time back to the device's previous stamp, at most one
    /// period. A stamp not newer than the last counts nothing.
    pub fn take_stamp(&mut self, t_us: u64, sm: u32) -> (u64, u64) {
        let last = self.stamp_us;
        if last.is_some_and(|l| t_us <= l) {
            return (0, 0);
        }
        if let Some(l) = last {
            let gap = t_us - l;
            self.stamp_period_us = Some(self.stamp_period_us.map_or(gap, |p| p.min(gap)));
        }
        self.stamp_us = Some(t_us);
        self.seen_us = self.seen_us.max(t_us);
        stamp_busy(last, t_us, self.stamp_period_us, sm)
    }

    /// Forgets processes not seen for `idle_us` before `now_us` (their pids may come back as
    /// other processes).
    pub fn forget_before(&mut self, now_us: u64, idle_us: u64) {
        self.last
            .retain(|_, t| now_us.saturating_sub(*t) <= idle_us);
    }
}

// ---- compute: one sample a period ------------------------------------------------------------

/// How a device's driver gives per-process utilisation, told from its samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleModel {
    /// A sample per process that ran in a period, each with that process's own share: a
    /// process's device time is its own samples.
    PerProcess,
    /// One sample a period, naming one process, with the device's utilisation over the period
    /// (a real driver: an NVIDIA H200, driver 580, named one of two time-sliced processes per
    /// stamp, with the device's figure). What a process used is not in it; the device's busy
    /// time is.
    OnePerPeriod,
}

/// How long a stamp naming several processes is taken as proof of per-process samples.
pub const MODEL_MEMORY_US: u64 = 10_000_000;

/// The model a device's driver uses, given when (µs) it last gave a stamp naming two or more
/// processes (None: never): per-process samples only where the driver showed them lately. One
/// named process a stamp is judged as one sample a period, which is sound under both: with one
/// process at work the two agree, and the bound below never blames a slice for a neighbour.
pub fn sample_model(multi_seen_us: Option<u64>, now_us: u64) -> SampleModel {
    match multi_seen_us {
        Some(t) if now_us.saturating_sub(t) <= MODEL_MEMORY_US => SampleModel::PerProcess,
        _ => SampleModel::OnePerPeriod,
    }
}

/// One of the parties that may have run on a device in a step, under one sample a period: a
/// slice, or every process in no slice together.
#[derive(Debug, Clone, PartialEq)]
pub struct Party {
    /// The share of the device (0-1) it may use without being found over: its core limit plus
    /// `OVER_PCT`, for a slice with a limit whose processes on the device are all known to its
    /// ledger (held by the library's meter). None: no bound (no limit, in no slice, or a
    /// process that went around the library).
    pub cap: Option<f64>,
    /// A slice with a core limit (the agent judges it).
    pub limited: bool,
}

/// What the driver establishes about a party's device time in a step, under one sample a
/// period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// At least this (ns; negative: nothing established beyond zero): the device's busy time
    /// less what every other party may use by its cap, and no other party with a limit is
    /// bounded alike, so the figure is this party's alone (it ran alone, or beside slices held
    /// by the library's meter while it was not).
    Established(i64),
    /// Every party is a slice held to its limit alike: the device's busy time beyond their
    /// limits (this many ns; negative: none) is someone's, but the samples do not say whose.
    Shared(i64),
    /// A party with no bound ran beside it (a slice without a limit, a process in no slice, or
    /// one that went around the library): nothing can be established.
    Unbounded,
}

/// Each party's bound over stamps standing for `dt_ns` in which the device was busy `busy_ns`
/// (the named figure over each stamp's time): what the others may use is counted over the
/// same time as the busy time, not the meter's step.
pub fn bounds(busy_ns: u64, dt_ns: u64, parties: &[Party]) -> Vec<Bound> {
    let may = |p: &Party| {
        p.cap
            .map(|c| (c.clamp(0.0, 1.0) * dt_ns as f64).round() as i64)
    };
    let raw: Vec<Option<i64>> = (0..parties.len())
        .map(|i| {
            parties
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .try_fold(busy_ns.min(i64::MAX as u64) as i64, |left, (_, p)| {
                    Some(left - may(p)?)
                })
        })
        .collect();
    let bounded = parties
        .iter()
        .zip(&raw)
        .filter(|(p, r)| p.limited && r.is_some())
        .count();
    raw.iter()
        .zip(parties)
        .map(|(r, p)| match *r {
            None => Bound::Unbounded,
            Some(lb) if bounded >= 2 => Bound::Shared(lb - may(p).unwrap_or(0)),
            Some(lb) => Bound::Established(lb),
        })
        .collect()
}

/// The time (ns) a stamp `t_us` with figure `sm` stands for, and the device's busy time (ns)
/// in it, from the device's previous stamp (`last_us`, None: the first) and the sample period
/// known: back to the previous stamp, at most one period.
pub fn stamp_busy(last_us: Option<u64>, t_us: u64, period_us: Option<u64>, sm: u32) -> (u64, u64) {
    let cover = match last_us {
        Some(l) if t_us > l => {
            let gap = t_us - l;
            period_us.map_or(gap, |p| p.min(gap))
        }
        Some(_) => return (0, 0),
        None => period_us.unwrap_or(FIRST_COVER_US),
    };
    let half_pcts = if sm >= 100 { 200 } else { 2 * sm as u64 + 1 };
    (cover * 1000, cover * 1000 * half_pcts / 200)
}

// ---- compute: the window and the bucket ------------------------------------------------------

/// The window over which a slice's share is judged.
pub const WINDOW_NS: u64 = 10 * S;
/// A slice is over its limit when the share of the device it used while not frozen exceeds its
/// limit by more than this (percentage points) over the window...
pub const OVER_PCT: f64 = 5.0;
/// ...and no longer once it is back within this.
pub const BACK_PCT: f64 = 3.0;
/// ...judged once the window holds this much history.
pub const MIN_HISTORY_NS: u64 = 5 * S;

/// Device time a slice used over the last `WINDOW_NS`, and the time it spent frozen.
#[derive(Debug, Clone, Default)]
pub struct Window {
    /// (end of the step, ns; device time used in it, or its lower bound, which may be
    /// negative; time frozen in it), oldest first.
    steps: VecDeque<(u64, i64, u64)>,
    /// When the window's history starts (the start of the oldest step kept).
    start_ns: Option<u64>,
}

/// What a window says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// History the window holds (ns).
    pub span_ns: u64,
    /// Device time used over the span, as a share of the span (0-1): what the driver measured.
    pub share: f64,
    /// As a share of the time the slice was not frozen (0-1): what it would use if let. Work
    /// queued before a freeze runs on while the slice is frozen, so this is at most 1.
    pub demand: f64,
    /// The share of the span the slice was frozen (0-1).
    pub frozen: f64,
}

impl Window {
    /// Adds the step ending at `now_ns`.
    pub fn add(&mut self, now_ns: u64, used_ns: u64, frozen_ns: u64) {
        self.add_signed(now_ns, used_ns.min(i64::MAX as u64) as i64, frozen_ns);
    }

    /// Adds the step ending at `now_ns` with a lower bound of the device time used in it,
    /// which may be negative (what the others may have used is more than the device's busy
    /// time): the window's sum is the bound over the window, never below 0.
    pub fn add_signed(&mut self, now_ns: u64, used_ns: i64, frozen_ns: u64) {
        if self.start_ns.is_none() {
            self.start_ns = Some(now_ns);
            return;
        }
        self.steps.push_back((now_ns, used_ns, frozen_ns));
        while let Some(&(end, _, _)) = self.steps.front() {
            if now_ns - end < WINDOW_NS {
                break;
            }
            self.steps.pop_front();
            self.start_ns = Some(end);
        }
    }

    pub fn usage(&self) -> Option<Usage> {
        let start = self.start_ns?;
        let end = self.steps.back()?.0;
        let span = end.saturating_sub(start);
        if span == 0 {
            return None;
        }
        let used = self.steps.iter().map(|s| s.1).sum::<i64>().max(0) as u64;
        let frozen: u64 = self.steps.iter().map(|s| s.2).sum();
        let running = span.saturating_sub(frozen).max(1);
        Some(Usage {
            span_ns: span,
            share: (used as f64 / span as f64).min(1.0),
            demand: (used as f64 / running as f64).min(1.0),
            frozen: (frozen as f64 / span as f64).min(1.0),
        })
    }
}

// ---- compute: what the driver's one sample a period names -----------------------------------

/// Under one sample a period the driver names one process a stamp, each in proportion to its
/// busy time (as an H200 on driver 580 did, docs/gpu/), with the device's figure. A slice's
/// named share (the busy time of the stamps naming its processes, over the time the stamps
/// stand for) is then an unbiased estimate of its share of the device, which nobody else can
/// raise: a tenant's processes are named only for their own busy time. Its error is that of a
/// proportion over the stamps counted (at most 0.5 / sqrt(stamps)), so it is judged over a
/// long window, with at least `NAMED_MIN_STAMPS`, and only far beyond the limit.
pub const NAMED_WINDOW_NS: u64 = 30 * S;
/// Stamps the window needs before its estimate is judged: its error is then at most 5 points
/// (one standard deviation; 4.1 at 150 stamps, a full window at a stamp every 200 ms), so
/// `NAMED_OVER_PCT` is 4 to 5 of them.
pub const NAMED_MIN_STAMPS: u64 = 100;
/// A slice is over its limit by the samples that name it when its named share exceeds the limit
/// by more than this (points). Found so, it went around the library, or rewrote what the library
/// keeps of its turns: from then on its device time is what its stamps name (held to its limit
/// so, it would soon look within it again, and was let go at once).
pub const NAMED_OVER_PCT: f64 = 20.0;

/// The stamps of one device that named a slice, over the last `NAMED_WINDOW_NS`.
#[derive(Debug, Clone, Default)]
pub struct Named {
    /// (end of the step, ns; busy time of the stamps that named the slice; the time the
    /// device's stamps stand for; how many stamps the device gave), oldest first.
    steps: VecDeque<(u64, u64, u64, u64)>,
    /// The sums over `steps` of the named busy time, the cover and the stamps (asked for at
    /// every step, over a window of hundreds of steps).
    sums: (u64, u64, u64),
}

/// What the named stamps say of a slice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NamedShare {
    /// The slice's named share of the device (0-1).
    pub share: f64,
    /// Stamps counted, and the time they stand for (ns).
    pub stamps: u64,
    pub cover_ns: u64,
}

impl Named {
    /// Adds the step ending at `now_ns`: `named_ns` of busy time in stamps that named the
    /// slice, out of `stamps` stamps standing for `cover_ns`.
    pub fn add(&mut self, now_ns: u64, named_ns: u64, cover_ns: u64, stamps: u64) {
        self.steps.push_back((now_ns, named_ns, cover_ns, stamps));
        let (n, c, k) = &mut self.sums;
        (*n, *c, *k) = (*n + named_ns, *c + cover_ns, *k + stamps);
        while let Some(&(end, named, cover, count)) = self.steps.front() {
            if now_ns.saturating_sub(end) < NAMED_WINDOW_NS {
                break;
            }
            self.steps.pop_front();
            let (n, c, k) = &mut self.sums;
            (*n, *c, *k) = (*n - named, *c - cover, *k - count);
        }
    }

    /// The slice's named share over the window; None while the stamps are too few to judge.
    pub fn share(&self) -> Option<NamedShare> {
        let (named, cover, stamps) = self.sums;
        (stamps >= NAMED_MIN_STAMPS && cover > 0).then(|| NamedShare {
            share: (named as f64 / cover as f64).min(1.0),
            stamps,
            cover_ns: cover,
        })
    }
}

/// Whether the stamps that name a slice put it far over its core limit `limit_pct`.
pub fn named_over(named: Option<NamedShare>, limit_pct: f64) -> bool {
    named.is_some_and(|n| n.share * 100.0 > limit_pct + NAMED_OVER_PCT)
}

/// Whether a slice with core limit `limit_pct` is over it, given what its window says and
/// whether it was over at the last look (so a slice near the line does not flap).
pub fn compute_over(usage: Option<Usage>, limit_pct: f64, was_over: bool) -> bool {
    let Some(u) = usage else {
        return false;
    };
    if u.span_ns < MIN_HISTORY_NS {
        return was_over;
    }
    let demand = u.demand * 100.0;
    if was_over {
        demand > limit_pct + BACK_PCT
    } else {
        demand > limit_pct + OVER_PCT
    }
}

/// A core limit changed while the slice runs (`cuslice set`): the history was used under the
/// old limit, so the window starts afresh, and the bucket is full again and not spent for this
/// long, while the library's meters take up the new limit (at their next period, 50 ms; the
/// share settles within 2 s, docs/live-limits.md).
pub const LIMIT_SETTLE_NS: u64 = 2 * S;

/// Whether a slice's core limit changed while the agent watched it: it had seen one (`seen`;
/// a slice's first limit is no change), and it is not the same (set, lifted or moved).
pub fn limit_changed(seen: bool, was: Option<f64>, now: Option<f64>) -> bool {
    seen && was != now
}

/// `stop` holds a slice to its limit plus this many points (so a slice the library already
/// holds at its limit is never frozen for the driver's rounding)...
pub const ENFORCE_SLACK_PCT: f64 = 2.0;
/// ...with this much device time banked while it uses less...
pub const BANK_NS: i64 = 200_000_000;
/// ...by freezing it while it owes, decided afresh at every meter step for at most this long
/// past it (so a meter that stalls leaves nothing frozen for longer)...
pub const MAX_FREEZE_NS: u64 = 250_000_000;
/// ...a new freeze not for less than this...
pub const MIN_FREEZE_NS: u64 = 5_000_000;
/// ...and by killing the processes that ran on the device once it owes more than this: work it
/// queued before it was frozen runs on while it is frozen (the device is not frozen with it),
/// so past this much, freezing is not holding it.
pub const KILL_DEBT_NS: i64 = 2_000_000_000;

/// What a slice may still use (ns of device time) before `stop` freezes it: earned at the
/// slice's limit (plus `ENFORCE_SLACK_PCT`), spent by what the driver says it used, banked up
/// to `BANK_NS`. Negative: the slice owes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub tokens: i64,
}

impl Default for Bucket {
    fn default() -> Bucket {
        Bucket { tokens: BANK_NS }
    }
}

/// The rate (share of the device, 0-1) `stop` holds a slice with limit `limit_pct` to.
pub fn enforced_rate(limit_pct: f64) -> f64 {
    ((limit_pct + ENFORCE_SLACK_PCT) / 100.0).min(1.0)
}

impl Bucket {
    pub fn step(&mut self, rate: f64, dt_ns: u64, used_ns: u64) {
        let earned = (rate * dt_ns as f64) as i64;
        self.tokens = (self.tokens.saturating_add(earned)).min(BANK_NS);
        self.tokens = self
            .tokens
            .saturating_sub(used_ns.min(i64::MAX as u64) as i64);
    }

    /// How long to freeze the slice now: the time it takes to earn its debt back at `rate`, at
    /// most `MAX_FREEZE_NS`; None when it owes less than `MIN_FREEZE_NS` worth.
    pub fn freeze_for(&self, rate: f64) -> Option<u64> {
        let ns = self.owed_for(rate)?;
        (ns >= MIN_FREEZE_NS).then(|| ns.min(MAX_FREEZE_NS))
    }

    /// The time it takes to earn the debt back at `rate` (ns); None when nothing is owed.
    fn owed_for(&self, rate: f64) -> Option<u64> {
        if self.tokens >= 0 || rate <= 0.0 {
            return None;
        }
        Some(((-self.tokens) as f64 / rate) as u64)
    }

    /// Device time owed beyond the slice's share (ns); 0 when it owes nothing.
    pub fn debt_ns(&self) -> u64 {
        self.tokens.min(0).unsigned_abs()
    }

    /// What `stop` does about the slice at a meter step, given whether the agent holds it
    /// frozen now and whether it thawed it since the last step (a slice runs for at least one
    /// step between two freezes). The debt counts everything the driver's samples show, also
    /// what ran while the slice was frozen, so a freeze lasts until what was used is paid for,
    /// whatever the length of the kernels queued.
    pub fn hold(&self, rate: f64, frozen: bool, just_thawed: bool) -> Hold {
        if self.tokens < -KILL_DEBT_NS {
            return Hold::Kill;
        }
        let Some(ns) = self.owed_for(rate) else {
            return Hold::Nothing;
        };
        if frozen {
            Hold::Extend(ns.min(MAX_FREEZE_NS))
        } else if just_thawed || ns < MIN_FREEZE_NS {
            Hold::Nothing
        } else {
            Hold::Freeze(ns.min(MAX_FREEZE_NS))
        }
    }

    /// `step` with a lower bound of the device time used, which may be negative: what the
    /// neighbours may use beyond the device's busy time is credit, up to the bank.
    pub fn step_signed(&mut self, rate: f64, dt_ns: u64, used_ns: i64) {
        if used_ns >= 0 {
            self.step(rate, dt_ns, used_ns as u64);
        } else {
            let earned = (rate * dt_ns as f64) as i64;
            self.tokens = self
                .tokens
                .saturating_add(earned)
                .saturating_add(used_ns.unsigned_abs().min(i64::MAX as u64) as i64)
                .min(BANK_NS);
        }
    }

    /// After the processes that ran on the device were killed: the debt stands (the slice
    /// stays frozen until it is paid for), but only new use beyond it kills again.
    pub fn killed(&mut self) {
        self.tokens = self.tokens.max(-KILL_DEBT_NS);
    }
}

/// What `stop` does about a slice over its core limit at a meter step (`Bucket::hold`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    Nothing,
    /// Freeze it for this long (ns).
    Freeze(u64),
    /// It is frozen and still owes: keep it frozen at least this long from now (ns).
    Extend(u64),
    /// It owes more than `KILL_DEBT_NS`: kill the processes that ran on the device.
    Kill,
}

// ---- findings over time -----------------------------------------------------------------------

/// Which findings are current, and since when: `update` with what is seen now gives what
/// started and what ended, so each is logged once at each end.
#[derive(Debug, Clone)]
pub struct Tracker<K: Ord + Clone> {
    since: BTreeMap<K, f64>,
}

impl<K: Ord + Clone> Default for Tracker<K> {
    fn default() -> Self {
        Tracker {
            since: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone> Tracker<K> {
    /// Takes the findings seen at `now`: returns those that started, and those that ended with
    /// when they had started.
    pub fn update(&mut self, now: f64, seen: &[K]) -> (Vec<K>, Vec<(K, f64)>) {
        let started: Vec<K> = seen
            .iter()
            .filter(|k| !self.since.contains_key(k))
            .cloned()
            .collect();
        let mut ended = Vec::new();
        self.since.retain(|k, t| {
            let keep = seen.contains(k);
            if !keep {
                ended.push((k.clone(), *t));
            }
            keep
        });
        for k in &started {
            self.since.insert(k.clone(), now);
        }
        (started, ended)
    }

    pub fn since(&self, k: &K) -> Option<f64> {
        self.since.get(k).copied()
    }

    pub fn active(&self, k: &K) -> bool {
        self.since.contains_key(k)
    }
}

#[cfg(test)]
mod tests;
