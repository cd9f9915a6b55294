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

// ---- the slice's limits per device ----------------------------------------------------------

/// Entries of a `*_VISIBLE_DEVICES` list as CUDA reads them: a comma-separated list of device
/// indices or UUID prefixes (`GPU-...`), cut at the first entry that names no device. None:
/// the variable puts no restriction (unset, or NVIDIA's `all`).
fn visible(var: Option<&str>, among: &[String]) -> Option<Vec<String>> {
    let v = var?.trim();
    if v == "all" {
        return None;
    }
    let mut out = Vec::new();
    if v.is_empty() || v == "none" || v == "void" {
        return Some(out);
    }
    for e in v.split(',').map(str::trim) {
        let found = match e.parse::<usize>() {
            Ok(i) => among.get(i).cloned(),
            Err(_) if e.starts_with("GPU-") => {
                let mut m = among.iter().filter(|u| u.starts_with(e));
                match (m.next(), m.next()) {
                    (Some(u), None) => Some(u.clone()),
                    _ => None,
                }
            }
            Err(_) => None,
        };
        match found {
            Some(u) if !out.contains(&u) => out.push(u),
            _ => break,
        }
    }
    Some(out)
}

/// The limits a slice's config sets for device `uuid`, as a process of the slice numbers its
/// devices: NVML's devices (`uuids`, in NVML's order), narrowed by the container's
/// `NVIDIA_VISIBLE_DEVICES` and the process's `CUDA_VISIBLE_DEVICES`. Without per-device
/// variables every device gets the same limits. A device the process should not see at all
/// gets the strictest limits the config sets for any device.
pub fn limits_for(
    config: &Config,
    uuid: &str,
    uuids: &[String],
    nvidia_visible: Option<&str>,
    cuda_visible: Option<&str>,
) -> Limits {
    let ordinals = config.mentioned_ordinals();
    if ordinals.is_empty() {
        return config.limits(0);
    }
    let container = visible(nvidia_visible, uuids).unwrap_or_else(|| uuids.to_vec());
    let process = visible(cuda_visible, &container).unwrap_or(container);
    if let Some(i) = process.iter().position(|u| u == uuid) {
        return config.limits(i as u32);
    }
    let max = ordinals.last().copied().unwrap_or(0);
    (0..=max + 1)
        .map(|o| config.limits(o))
        .reduce(strictest)
        .unwrap_or_default()
}

/// The stricter of two sets of limits, each limit on its own (a set limit is stricter than none).
pub fn strictest(a: Limits, b: Limits) -> Limits {
    Limits {
        memory: min_some(a.memory, b.memory),
        core_limit: min_some(a.core_limit, b.core_limit),
        core_request: min_some(a.core_request, b.core_request),
    }
}

fn min_some<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
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
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MS: u64 = 1_000_000;

    fn h(pid: i32, driver: u64, charged: Option<u64>) -> Held {
        Held {
            pid,
            driver,
            charged,
        }
    }

    #[test]
    fn within_the_cap_nobody_is_killed() {
        assert!(victims(GIB, &[h(1, GIB / 2, None), h(2, GIB / 2, Some(GIB / 2))]).is_empty());
        assert!(victims(GIB, &[]).is_empty());
    }

    #[test]
    fn the_process_the_ledger_does_not_know_goes_first() {
        // A well-behaved 700 MiB process and a 600 MiB bypass under a 1 GiB cap: the bypass,
        // though smaller, is the one the ledger does not account for.
        let held = [h(1, 700 * MIB, Some(700 * MIB)), h(2, 600 * MIB, None)];
        assert_eq!(victims(GIB, &held), vec![2]);
        // A process whose charge was written down to 0 counts as unaccounted too.
        let held = [h(1, 700 * MIB, Some(700 * MIB)), h(2, 600 * MIB, Some(0))];
        assert_eq!(victims(GIB, &held), vec![2]);
    }

    #[test]
    fn then_the_largest_until_under_the_cap() {
        let held = [
            h(1, 300 * MIB, Some(300 * MIB)),
            h(2, 900 * MIB, Some(900 * MIB)),
            h(3, 500 * MIB, Some(500 * MIB)),
        ];
        // 1700 MiB under 1 GiB: killing 2 leaves 800 MiB.
        assert_eq!(victims(GIB, &held), vec![2]);
        // Under 512 MiB: 2, then 3 (leaving 300 MiB).
        assert_eq!(victims(512 * MIB, &held), vec![2, 3]);
        // Under 0 (nothing fits): everyone holding memory.
        let mut v = victims(0, &held);
        v.sort();
        assert_eq!(v, vec![1, 2, 3]);
    }

    #[test]
    fn ledger_mismatch_needs_more_than_the_slack() {
        assert!(!ledger_short(900 * MIB, 900 * MIB));
        assert!(!ledger_short(900 * MIB, 950 * MIB));
        assert!(ledger_short(0, 900 * MIB));
        assert!(ledger_short(300 * MIB, 1200 * MIB));
        // The ledger saying more than the driver (charges of a process the driver has already
        // released) is not a finding.
        assert!(!ledger_short(GIB, 0));
        // Large slices get a proportional slack.
        assert!(!ledger_short(60 * GIB, 63 * GIB));
        assert!(ledger_short(60 * GIB, 70 * GIB));
    }

    fn cfg(text: &str) -> Config {
        Config::from_hook_file(text, std::iter::empty::<(&str, &str)>()).unwrap()
    }

    #[test]
    fn one_limit_for_every_device() {
        let c = cfg("CUSLICE_MEMORY_LIMIT=1GiB\nCUSLICE_CORE_LIMIT=30\n");
        let uuids = vec!["GPU-a".to_string(), "GPU-b".to_string()];
        for u in &uuids {
            let l = limits_for(&c, u, &uuids, None, Some("1"));
            assert_eq!((l.memory, l.core_limit), (Some(GIB), Some(30)));
        }
    }

    #[test]
    fn per_device_limits_follow_the_visible_devices() {
        let c = cfg("CUSLICE_MEMORY_LIMIT_0=1GiB\nCUSLICE_MEMORY_LIMIT_1=2GiB\n");
        let uuids: Vec<String> = ["GPU-a0", "GPU-b1", "GPU-c2"].map(String::from).to_vec();
        let mem =
            |u: &str, nv: Option<&str>, cv: Option<&str>| limits_for(&c, u, &uuids, nv, cv).memory;
        assert_eq!(mem("GPU-a0", None, None), Some(GIB));
        assert_eq!(mem("GPU-b1", None, None), Some(2 * GIB));
        assert_eq!(mem("GPU-c2", None, None), None);
        // CUDA_VISIBLE_DEVICES=2,0: ordinal 0 is GPU-c2, 1 is GPU-a0.
        assert_eq!(mem("GPU-c2", None, Some("2,0")), Some(GIB));
        assert_eq!(mem("GPU-a0", None, Some("2,0")), Some(2 * GIB));
        // By UUID prefix, over what the container sees (NVIDIA_VISIBLE_DEVICES=1,2).
        assert_eq!(mem("GPU-c2", Some("1,2"), None), Some(2 * GIB));
        assert_eq!(mem("GPU-b1", Some("GPU-b"), Some("0")), Some(GIB));
        // A device the process should not see: the strictest cap.
        assert_eq!(mem("GPU-b1", None, Some("0")), Some(GIB));
        assert_eq!(mem("GPU-c2", Some("none"), None), Some(GIB));
        // An invalid entry cuts the list, as CUDA does.
        assert_eq!(mem("GPU-b1", None, Some("0,x,1")), Some(GIB));
    }

    #[test]
    fn samples_become_device_time() {
        let mut c = SampleClock::new(0);
        // The first sample of a process, before any period is known, stands for up to 1 s.
        assert_eq!(c.take(7, 1_000_000, 100), S);
        // 100 ms later: the period is 100 ms; 50% is 50.5% of it.
        assert_eq!(c.take(7, 1_100_000, 50), 100 * MS * 101 / 200);
        // A repeated stamp counts nothing.
        assert_eq!(c.take(7, 1_100_000, 50), 0);
        // After a gap of 1 s (the process was idle), a sample stands for one period only.
        assert_eq!(c.take(7, 2_100_000, 100), 100 * MS);
        // Another process's first sample, once the period is known, stands for one period.
        assert_eq!(c.take(8, 2_100_000, 100), 100 * MS);
        assert_eq!(c.seen_us, 2_100_000);
        c.forget_before(5_000_000, 1_000_000);
        assert_eq!(c.take(8, 5_000_000, 0), 100 * MS / 200);
    }

    #[test]
    fn the_model_is_told_from_the_stamps() {
        assert_eq!(sample_model(None, 50_000_000), SampleModel::OnePerPeriod);
        assert_eq!(
            sample_model(Some(45_000_000), 50_000_000),
            SampleModel::PerProcess
        );
        assert_eq!(
            sample_model(Some(39_000_000), 50_000_000),
            SampleModel::OnePerPeriod
        );
    }

    #[test]
    fn one_sample_a_period_gives_the_devices_busy_time() {
        let mut c = SampleClock::new(0);
        // The first stamp stands for up to 1 s before a period is known; then one period.
        assert_eq!(c.take_stamp(1_000_000, 100), (S, S));
        assert_eq!(
            c.take_stamp(1_200_000, 50),
            (200 * MS, 200 * MS * 101 / 200)
        );
        assert_eq!(c.take_stamp(1_200_000, 50), (0, 0));
        // A gap (nothing ran): one period only.
        assert_eq!(c.take_stamp(3_000_000, 100), (200 * MS, 200 * MS));
        assert_eq!(c.seen_us, 3_000_000);
    }

    fn party(limit: Option<f64>, known: bool) -> Party {
        Party {
            cap: limit.filter(|_| known).map(|l| (l + OVER_PCT) / 100.0),
            limited: limit.is_some(),
        }
    }

    #[test]
    fn a_bound_only_where_the_driver_establishes_it() {
        let dt = S as i64;
        let busy = S; // the device busy throughout a 1 s step
        let b = |parties: &[Party]| bounds(busy, S, parties);
        // Alone: the device's busy time is the slice's.
        assert_eq!(b(&[party(Some(30.0), true)]), vec![Bound::Established(dt)]);
        // Two honest slices at 70 and 30 flat out: neither is blamed for the other; what the
        // device did beyond their limits (+ 5 each) is someone's: none here.
        assert_eq!(
            b(&[party(Some(70.0), true), party(Some(30.0), true)]),
            vec![Bound::Shared(-dt / 10), Bound::Shared(-dt / 10)]
        );
        // Two slices at 20 and 30, the device busy throughout: 40 points beyond their limits
        // (+ 5 each), someone's, not attributable.
        assert_eq!(
            b(&[party(Some(20.0), true), party(Some(30.0), true)]),
            vec![Bound::Shared(dt * 40 / 100), Bound::Shared(dt * 40 / 100)]
        );
        // A slice at 20 whose process is unknown to its ledger (it went around the library)
        // beside an honest one at 30: at least 100 - 35 = 65% is its own; the honest one
        // cannot be bounded (the other may have used anything).
        assert_eq!(
            b(&[party(Some(20.0), false), party(Some(30.0), true)]),
            vec![Bound::Established(dt * 65 / 100), Bound::Unbounded]
        );
        // Beside a slice with no limit, or a process in no slice: nothing established.
        assert_eq!(
            b(&[party(Some(70.0), true), party(None, true)]),
            vec![Bound::Unbounded, Bound::Established(dt * 25 / 100)]
        );
        // Two that went around the library: neither bounded.
        assert_eq!(
            b(&[party(Some(20.0), false), party(Some(30.0), false)]),
            vec![Bound::Unbounded, Bound::Unbounded]
        );
        // An idle device: the bound is negative (nothing established beyond zero).
        assert_eq!(
            bounds(0, S, &[party(Some(20.0), false), party(Some(30.0), true)])[0],
            Bound::Established(-dt * 35 / 100)
        );
    }

    #[test]
    fn a_negative_bound_is_credit_up_to_the_bank() {
        let rate = enforced_rate(20.0);
        let mut b = Bucket {
            tokens: -(100 * MS as i64),
        };
        b.step_signed(rate, 0, -(50 * MS as i64));
        assert_eq!(b.tokens, -(50 * MS as i64));
        b.step_signed(rate, 0, -(S as i64));
        assert_eq!(b.tokens, BANK_NS);
        b.step_signed(rate, 0, 300 * MS as i64);
        assert_eq!(b.tokens, BANK_NS - 300 * MS as i64);
        // The window's sum never goes below 0.
        let mut w = Window::default();
        w.add_signed(0, 0, 0);
        w.add_signed(S, -(S as i64) / 2, 0);
        w.add_signed(2 * S, (S as i64) / 4, 0);
        assert_eq!(w.usage().unwrap().share, 0.0);
        w.add_signed(3 * S, S as i64, 0);
        assert!((w.usage().unwrap().share - 0.25).abs() < 1e-9);
    }

    #[test]
    fn memory_no_entry_shows_beyond_the_caps() {
        // The H200's figures: 3072 MiB of managed memory raised the device's used memory, the
        // process's entry showed its context's 518 MiB; the driver's own 600 MiB.
        let used = 600 * MIB + 518 * MIB + 3072 * MIB;
        // A slice capped at 1 GiB (506 MiB of headroom under its entry): 2566 MiB unattributed.
        assert_eq!(
            unattributed(used, 518 * MIB, 600 * MIB, Some(506 * MIB)),
            Some(2566 * MIB)
        );
        // Capped at 4 GiB: what it may hold as managed memory covers it.
        assert_eq!(
            unattributed(used, 518 * MIB, 600 * MIB, Some(3578 * MIB)),
            None
        );
        // A party with no cap beside it: nothing can be said.
        assert_eq!(unattributed(used, 518 * MIB, 600 * MIB, None), None);
        // Within the slack (allocations between the two readings).
        assert_eq!(
            unattributed(600 * MIB + 50 * MIB, 0, 600 * MIB, Some(0)),
            None
        );
    }

    #[test]
    fn window_share_and_demand() {
        let mut w = Window::default();
        assert_eq!(w.usage(), None);
        w.add(0, 0, 0);
        // 10 steps of 100 ms: busy half of each, frozen the other half.
        for i in 1..=10 {
            w.add(i * 100 * MS, 50 * MS, 50 * MS);
        }
        let u = w.usage().unwrap();
        assert_eq!(u.span_ns, S);
        assert!((u.share - 0.5).abs() < 1e-9);
        assert!((u.demand - 1.0).abs() < 1e-9);
        // Old steps leave the window.
        for i in 11..=200 {
            w.add(i * 100 * MS, 30 * MS, 0);
        }
        let u = w.usage().unwrap();
        assert_eq!(u.span_ns, WINDOW_NS);
        assert!((u.share - 0.3).abs() < 1e-9, "{u:?}");
    }

    #[test]
    fn over_the_limit_with_a_margin_and_no_flapping() {
        let u = |span_s: u64, demand: f64| {
            Some(Usage {
                span_ns: span_s * S,
                share: demand,
                demand,
                frozen: 0.0,
            })
        };
        assert!(!compute_over(None, 30.0, false));
        // Too little history: no new finding, an old one stays.
        assert!(!compute_over(u(2, 1.0), 30.0, false));
        assert!(compute_over(u(2, 0.0), 30.0, true));
        assert!(!compute_over(u(10, 0.34), 30.0, false));
        assert!(compute_over(u(10, 0.36), 30.0, false));
        // Once over, it ends only back within 3 points.
        assert!(compute_over(u(10, 0.34), 30.0, true));
        assert!(!compute_over(u(10, 0.32), 30.0, true));
    }

    #[test]
    fn the_bucket_freezes_for_the_debt() {
        let rate = enforced_rate(30.0);
        assert!((rate - 0.32).abs() < 1e-9);
        let mut b = Bucket::default();
        // Within its rate the slice keeps its bank (less what the last step used).
        for _ in 0..100 {
            b.step(rate, 50 * MS, 15 * MS);
        }
        assert_eq!(b.tokens, BANK_NS - 15 * MS as i64);
        assert_eq!(b.freeze_for(rate), None);
        // Using the whole device for 300 ms: the bank refilled to full and 50 ms used, then 16
        // ms earned and 50 ms used in each 50 ms.
        for _ in 0..6 {
            b.step(rate, 50 * MS, 50 * MS);
        }
        assert_eq!(b.tokens, BANK_NS - 50 * MS as i64 - 5 * 34 * MS as i64);
        // 20 ms owed is 62.5 ms at 32%.
        assert_eq!(b.freeze_for(rate), Some(62_500_000));
        // A large debt is paid in slices of at most MAX_FREEZE_NS.
        b.step(rate, 0, S);
        assert_eq!(b.freeze_for(rate), Some(MAX_FREEZE_NS));
        // Frozen (nothing used), the debt is earned back.
        for _ in 0..100 {
            b.step(rate, 50 * MS, 0);
        }
        assert_eq!(b.freeze_for(rate), None);
    }

    #[test]
    fn a_frozen_duty_cycle_holds_the_rate() {
        // A slice that uses the whole device whenever it is not frozen, stepped every 50 ms
        // with its samples arriving 100 ms late, held by freezing: its long-run share is the
        // enforced rate.
        let rate = enforced_rate(30.0);
        let mut b = Bucket::default();
        let mut frozen_until = 0u64;
        let mut pending: VecDeque<u64> = VecDeque::new();
        let (mut used, step) = (0u64, 10 * MS);
        let total = 600 * S / 10;
        let mut t = 0;
        while t < total {
            let running = t >= frozen_until;
            pending.push_back(if running { step } else { 0 });
            let seen = if pending.len() > 10 {
                pending.pop_front().unwrap()
            } else {
                0
            };
            used += if running { step } else { 0 };
            b.step(rate, step, seen);
            if running && let Some(f) = b.freeze_for(rate) {
                frozen_until = t + f;
            }
            t += step;
        }
        let share = used as f64 / total as f64;
        assert!((share - rate).abs() < 0.01, "{share}");
    }

    #[test]
    fn stop_holds_by_the_debt_and_kills_past_what_freezing_holds() {
        let rate = enforced_rate(30.0);
        let b = |tokens: i64| Bucket { tokens };
        let ms = |n: u64| n * MS;
        // (tokens, frozen, just thawed) -> what to do
        let cases: &[(i64, bool, bool, Hold)] = &[
            (BANK_NS, false, false, Hold::Nothing),
            (0, false, false, Hold::Nothing),
            (0, true, false, Hold::Nothing),
            // Owes 1 ms: too little for a new freeze, but a freeze in progress lasts until
            // it is paid (3.1 ms at 32%).
            (-(MS as i64), false, false, Hold::Nothing),
            (-(MS as i64), true, false, Hold::Extend(3_125_000)),
            // Owes 16 ms: 50 ms to earn back at 32%.
            (-16 * (MS as i64), false, false, Hold::Freeze(ms(50))),
            (-16 * (MS as i64), false, true, Hold::Nothing),
            (-16 * (MS as i64), true, false, Hold::Extend(ms(50))),
            // A large debt: frozen no more than MAX_FREEZE_NS past this step, then decided again.
            (-(S as i64), false, false, Hold::Freeze(MAX_FREEZE_NS)),
            (-(S as i64), true, false, Hold::Extend(MAX_FREEZE_NS)),
            (-KILL_DEBT_NS, true, false, Hold::Extend(MAX_FREEZE_NS)),
            // More than freezing holds: kill, frozen or not, just thawed or not.
            (-KILL_DEBT_NS - 1, true, false, Hold::Kill),
            (-KILL_DEBT_NS - 1, false, true, Hold::Kill),
        ];
        for &(tokens, frozen, thawed, want) in cases {
            assert_eq!(
                b(tokens).hold(rate, frozen, thawed),
                want,
                "{tokens} owed, frozen {frozen}, just thawed {thawed}"
            );
        }
        // After the kill the debt stands, and only new use beyond it kills again.
        let mut k = b(-3 * (S as i64));
        k.killed();
        assert_eq!(k.debt_ns(), KILL_DEBT_NS as u64);
        assert_eq!(k.hold(rate, true, false), Hold::Extend(MAX_FREEZE_NS));
        k.step(rate, 50 * MS, 50 * MS);
        assert_eq!(k.hold(rate, true, false), Hold::Kill);
        assert_eq!(b(5).debt_ns(), 0);
    }

    #[test]
    fn a_queue_that_runs_while_frozen_is_held_by_the_debt() {
        // A slice that keeps four 100 ms kernels queued whenever it runs: frozen, the device
        // still runs what it queued (up to 400 ms). The samples arrive 100 ms late. Frozen for
        // the debt the driver shows, its long-run share is the enforced rate, and it never
        // owes enough to be killed.
        let rate = enforced_rate(30.0);
        let mut b = Bucket::default();
        let step = 10 * MS;
        let (mut frozen, mut until, mut thawed_at) = (false, 0u64, None::<u64>);
        let mut queued = 0u64; // device time queued, ns
        let mut pending: VecDeque<u64> = VecDeque::new();
        let (mut used, mut worst) = (0u64, 0u64);
        let total = 600 * S / 10;
        let mut t = 0;
        while t < total {
            if !frozen {
                queued = 400 * MS; // refilled as kernels complete
            }
            let ran = queued.min(step);
            queued -= ran;
            used += ran;
            pending.push_back(ran);
            let seen = if pending.len() > 10 {
                pending.pop_front().unwrap()
            } else {
                0
            };
            b.step(rate, step, seen);
            worst = worst.max(b.debt_ns());
            if frozen && t >= until {
                frozen = false;
                thawed_at = Some(t);
            }
            // The meter decides every 50 ms.
            if t % (50 * MS) == 0 {
                let just = thawed_at.is_some_and(|x| t - x < 50 * MS);
                match b.hold(rate, frozen, just) {
                    Hold::Freeze(ns) => (frozen, until) = (true, t + ns),
                    Hold::Extend(ns) => until = until.max(t + ns),
                    Hold::Kill => panic!("killed at {t}"),
                    Hold::Nothing => {}
                }
            }
            t += step;
        }
        let share = used as f64 / total as f64;
        assert!((share - rate).abs() < 0.01, "{share}");
        assert!(worst < (KILL_DEBT_NS / 2) as u64, "{worst}");
    }

    #[test]
    fn time_over_the_cap_adds_up_within_the_window() {
        assert_eq!(over_window_s(2.0, 1.0), 20.0);
        assert_eq!(over_window_s(0.0, 1.0), 10.0);
        assert_eq!(over_window_s(0.5, 0.1), 5.0);
        let w = over_window_s(2.0, 1.0);
        // Checks 1 s apart: (time, over) ... -> the total at the last check.
        let f = false;
        let t = true;
        type Case<'a> = (&'a str, &'a [(f64, bool)], f64);
        let cases: &[Case] = &[
            ("never over", &[(0.0, f), (1.0, f), (2.0, f)], 0.0),
            ("over throughout", &[(0.0, t), (1.0, t), (2.0, t)], 2.0),
            (
                "went over between two checks",
                &[(0.0, f), (1.0, t), (2.0, t)],
                1.5,
            ),
            (
                "came back between two checks",
                &[(0.0, t), (1.0, f), (2.0, f)],
                0.5,
            ),
            ("seen over once", &[(0.0, f), (1.0, t), (2.0, f)], 1.0),
            // Over from 0.3 to 2.1 s of every 3 s (a loop holding for 1.8 s, resting for 1.2):
            // never over for 2 s at once, over for 2 s in total by the check at 3 s.
            ("in pieces", &[(0.0, f), (1.0, t), (2.0, t), (3.0, f)], 2.0),
            (
                "in pieces, on",
                &[(0.0, f), (1.0, t), (2.0, t), (3.0, f), (4.0, t)],
                2.5,
            ),
            // What is older than the window is forgotten.
            (
                "out of the window",
                &[(0.0, t), (1.0, t), (2.0, f), (25.0, f)],
                0.0,
            ),
        ];
        for (what, checks, want) in cases {
            let mut o = OverTime::default();
            let mut got = 0.0;
            for &(now, over) in *checks {
                got = o.check(now, over, w);
            }
            assert_eq!(got, *want, "{what}");
            assert_eq!(o.total(), *want, "{what}");
        }
        // Over at 0 and 1 s, back by 2 s, over again at 21 s: at 21 s the window (1 s to 21 s)
        // holds the half second before 2 s and the half before 21 s.
        let mut o = OverTime::default();
        for i in 0..=21 {
            o.check(f64::from(i), i < 2 || i == 21, w);
        }
        assert_eq!(o.total(), 1.0);
        // A kill is remembered for the window.
        let mut o = OverTime::default();
        o.check(0.0, true, w);
        o.kill = Some((0.0, vec![7]));
        o.check(19.0, false, w);
        assert!(o.kill.is_some() && !o.idle());
        o.check(20.0, false, w);
        assert!(o.kill.is_none());
        o.check(41.0, false, w);
        assert!(o.idle());
    }

    #[test]
    fn memory_action_by_time_over_and_kills() {
        let cap = GIB;
        let bypass = [h(1, 300 * MIB, Some(300 * MIB)), h(2, 1800 * MIB, None)];
        let killed = (0.0, vec![2]);
        // (what, held, time over, last kill, action)
        type Case<'a> = (
            &'a str,
            &'a [Held],
            f64,
            Option<&'a (f64, Vec<i32>)>,
            MemoryAction,
        );
        let cases: &[Case] = &[
            (
                "within its cap",
                &[h(1, GIB, None)],
                10.0,
                None,
                MemoryAction::Nothing,
            ),
            (
                "over, for less than the grace",
                &bypass,
                1.5,
                None,
                MemoryAction::Nothing,
            ),
            (
                "over, for the grace",
                &bypass,
                2.0,
                None,
                MemoryAction::Kill(vec![2]),
            ),
            (
                "over, for more",
                &bypass,
                9.0,
                None,
                MemoryAction::Kill(vec![2]),
            ),
            // The killed process is still counted until the driver releases it.
            (
                "after a kill, not released yet",
                &bypass,
                3.0,
                Some(&killed),
                MemoryAction::Nothing,
            ),
            (
                "after a kill, under the cap",
                &[h(1, 300 * MIB, Some(300 * MIB))],
                3.0,
                Some(&killed),
                MemoryAction::Nothing,
            ),
            // The bypass started again: the whole container.
            (
                "after a kill, over again",
                &[h(1, 300 * MIB, Some(300 * MIB)), h(3, 1800 * MIB, None)],
                3.0,
                Some(&killed),
                MemoryAction::KillAll,
            ),
            (
                "after a kill, over again at once",
                &[h(1, 300 * MIB, Some(300 * MIB)), h(3, 1800 * MIB, None)],
                0.0,
                Some(&killed),
                MemoryAction::KillAll,
            ),
        ];
        for (what, held, over, kill, want) in cases {
            assert_eq!(memory_action(cap, held, *over, 2.0, *kill), *want, "{what}");
        }
    }

    #[test]
    fn a_limit_changed_while_running_is_told_apart_from_a_first_one() {
        let cases = [
            (false, None, Some(30.0), false),
            (false, Some(30.0), Some(40.0), false),
            (true, Some(30.0), Some(30.0), false),
            (true, None, None, false),
            (true, Some(30.0), Some(40.0), true),
            (true, Some(40.0), Some(5.0), true),
            (true, None, Some(30.0), true),
            (true, Some(30.0), None, true),
        ];
        for (seen, was, now, want) in cases {
            assert_eq!(
                limit_changed(seen, was, now),
                want,
                "{seen} {was:?} {now:?}"
            );
        }
    }

    #[test]
    fn findings_start_and_end_once() {
        let mut t: Tracker<&str> = Tracker::default();
        let (s, e) = t.update(1.0, &["a", "b"]);
        assert_eq!((s, e), (vec!["a", "b"], vec![]));
        let (s, e) = t.update(2.0, &["a", "b"]);
        assert!(s.is_empty() && e.is_empty());
        let (s, e) = t.update(3.0, &["b", "c"]);
        assert_eq!((s, e), (vec!["c"], vec![("a", 1.0)]));
        assert_eq!(t.since(&"b"), Some(1.0));
        assert!(t.active(&"c") && !t.active(&"a"));
    }

    #[test]
    fn a_lowered_cap_allows_what_was_held_then_shrinking_as_it_is_freed() {
        const G: u64 = 1 << 30;
        // Lowered from 2 GiB to 512 MiB while holding 1.5 GiB: 1.5 GiB allowed.
        let a = lowered_allowance(Some(2 * G), Some(G / 2), 3 * G / 2, None);
        assert_eq!(a, Some(3 * G / 2));
        // Freed down to 1 GiB: allowed 1 GiB; growing again is not allowed past that.
        let a = lowered_allowance(Some(G / 2), Some(G / 2), G, a);
        assert_eq!(a, Some(G));
        assert_eq!(
            lowered_allowance(Some(G / 2), Some(G / 2), 2 * G, a),
            Some(G)
        );
        // Under the cap: gone for good.
        assert_eq!(lowered_allowance(Some(G / 2), Some(G / 2), G / 4, a), None);
        // Over a cap that was never lowered (a bypass, a ledger written over): nothing allowed.
        assert_eq!(lowered_allowance(Some(G), Some(G), 2 * G, None), None);
        assert_eq!(lowered_allowance(None, Some(G), 2 * G, None), None);
        // Lowered over more than the old cap allowed (already over it): the old cap at most.
        assert_eq!(
            lowered_allowance(Some(G), Some(G / 2), 2 * G, None),
            Some(G)
        );
    }
}
