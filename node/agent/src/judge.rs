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

    /// Forgets processes not seen for `idle_us` before `now_us` (their pids may come back as
    /// other processes).
    pub fn forget_before(&mut self, now_us: u64, idle_us: u64) {
        self.last
            .retain(|_, t| now_us.saturating_sub(*t) <= idle_us);
    }
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
    /// (end of the step, ns; device time used in it; time frozen in it), oldest first.
    steps: VecDeque<(u64, u64, u64)>,
    /// When the window's history starts (the start of the oldest step kept).
    start_ns: Option<u64>,
}

/// What a window says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// History the window holds (ns).
    pub span_ns: u64,
    /// Device time used over the span, as a share of the span (0-1).
    pub share: f64,
    /// As a share of the time the slice was not frozen (0-1): what it would use if let.
    pub demand: f64,
}

impl Window {
    /// Adds the step ending at `now_ns`.
    pub fn add(&mut self, now_ns: u64, used_ns: u64, frozen_ns: u64) {
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
        let used: u64 = self.steps.iter().map(|s| s.1).sum();
        let frozen: u64 = self.steps.iter().map(|s| s.2).sum();
        let running = span.saturating_sub(frozen).max(1);
        Some(Usage {
            span_ns: span,
            share: (used as f64 / span as f64).min(1.0),
            demand: (used as f64 / running as f64).min(1.0),
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

/// `stop` holds a slice to its limit plus this many points (so a slice the library already
/// holds at its limit is never frozen for the driver's rounding)...
pub const ENFORCE_SLACK_PCT: f64 = 2.0;
/// ...with this much device time banked while it uses less...
pub const BANK_NS: i64 = 200_000_000;
/// ...by freezing it for at most this long at a time...
pub const MAX_FREEZE_NS: u64 = 250_000_000;
/// ...and not for less than this.
pub const MIN_FREEZE_NS: u64 = 5_000_000;

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
        if self.tokens >= 0 || rate <= 0.0 {
            return None;
        }
        let ns = ((-self.tokens) as f64 / rate) as u64;
        (ns >= MIN_FREEZE_NS).then(|| ns.min(MAX_FREEZE_NS))
    }
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
