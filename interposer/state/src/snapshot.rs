//! A ledger copied out for the node tools (`Ledger::read`, `Ledger::snapshot`), and the
//! arithmetic they do on it: the compute share a slice achieved over a recent window, from the
//! per-second marks of its device time. Pure: no files, no clocks.

use cuslice_policy::share::FULL;

/// One slice's ledger at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The ledger's format (`ledger::VERSION`, or `ledger::PREVIOUS` for a slice the previous
    /// release started): what the slice's library writes.
    pub version: u32,
    pub slice_id: u64,
    pub devices: Vec<DeviceSnapshot>,
    /// The slice's processes: live ones, and dead ones whose memory the device still held when
    /// last swept.
    pub procs: Vec<ProcSnapshot>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSnapshot {
    pub uuid: [u8; 16],
    /// The memory cap (bytes), if the slice has one.
    pub limit: Option<u64>,
    /// Bytes the slice's processes hold, and the most they ever held at once. Of `used`,
    /// `frozen` is in the host memory of processes frozen when idle (what they will need back on
    /// the device; still charged against the cap), the rest on the device.
    pub used: u64,
    pub peak: u64,
    pub frozen: u64,
    /// The most the slice may hold in host memory past its cap (`CUSLICE_MEMORY_SPILL`), if
    /// set; what it holds there now, and the most it held there at once.
    pub spill_limit: Option<u64>,
    pub spilled: u64,
    pub spill_peak: u64,
    /// Allocations waiting now for the slice's frees (`CUSLICE_MEMORY_WAIT`).
    pub waiting: u32,
    /// Allocations refused at the cap.
    pub refusals: u64,
    pub context_overhead: u64,
    /// Core request and limit (ppm of the device; 0 and `FULL` when not set).
    pub core_request: u32,
    pub core_limit: u32,
    /// The slice's priority (`cuslice_policy::priority::Priority::code`: 0 normal, 1 low, 2 high).
    pub priority: u32,
    /// What the node changed while the slice ran (`ledger::LIVE_MEMORY`, `LIVE_CORE`,
    /// `LIVE_PRIORITY` bits).
    pub live: u32,
    /// The share of the device the slice may use now (ppm), as its meters last worked it out.
    pub allotted: u32,
    /// Device time used, as the slice's meters measured it (ns since the slice began).
    pub device_ns: u64,
    /// Time launching threads were held back (ns, summed over threads).
    pub throttled_ns: u64,
    /// What the latest device time reported was measured by (see [`MeteredBy`]).
    pub metered_by: MeteredBy,
    /// When a meter last reported (CLOCK_MONOTONIC ns; 0: no process has launched work).
    pub metered_ns: u64,
    /// Marks of (`device_ns`, `throttled_ns`) about a second apart, oldest first.
    pub marks: Vec<Mark>,
}

/// What a slice's meter measured its device time by (the ledger keeps it as a code, 0 to 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MeteredBy {
    /// The driver's per-process utilisation samples (NVML): the previous release's meter.
    #[default]
    Samples,
    /// Launch estimates alone (the previous release's meter, where NVML did not report the
    /// process).
    Estimates,
    /// The library's own timing of sampled launches with CUDA events (the previous release's
    /// meter, where the driver gave no per-process samples).
    SelfTiming,
    /// Exclusive turns: the slice's device time is its turns' spans, each timed with nobody else
    /// on the device (docs/compute.md). The previous release reads this code as estimates.
    Turns,
}

impl MeteredBy {
    pub fn code(self) -> u32 {
        match self {
            MeteredBy::Samples => 0,
            MeteredBy::Estimates => 1,
            MeteredBy::SelfTiming => 2,
            MeteredBy::Turns => 3,
        }
    }

    /// Unknown codes (a later release's) read as estimates: not the driver's count.
    pub fn from_code(code: u32) -> MeteredBy {
        match code {
            0 => MeteredBy::Samples,
            2 => MeteredBy::SelfTiming,
            3 => MeteredBy::Turns,
            _ => MeteredBy::Estimates,
        }
    }

    /// How status, the exporter and doctor name it.
    pub fn name(self) -> &'static str {
        match self {
            MeteredBy::Samples => "samples",
            MeteredBy::Estimates => "estimates",
            MeteredBy::SelfTiming => "self-timing",
            MeteredBy::Turns => "turns",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mark {
    pub at_ns: u64,
    pub device_ns: u64,
    pub throttled_ns: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProcSnapshot {
    /// The pid as the process saw itself (in a container: in its pid namespace).
    pub pid: i32,
    /// Its pid in the host's pid namespace, once the node agent or a node tool told it.
    pub host_pid: Option<i32>,
    /// Whether the process still holds its slot (it is running).
    pub alive: bool,
    /// Bytes charged to it, per device, in the order of `Snapshot::devices`.
    pub charged: Vec<u64>,
    /// Bytes it holds in host memory past the cap, per device, in the same order.
    pub spilled: Vec<u64>,
    /// When it was frozen to the host (CLOCK_MONOTONIC ns), while it is: its `charged` is then
    /// in its host memory, not on the device.
    pub frozen_ns: Option<u64>,
}

/// How far a mark may sit from where a window should start, as a part of the window: before it
/// (the span measured is longer than the window) and after it (shorter). Marks are the first
/// report in each second, so they are about a second apart, further where a process stalled
/// across a second's start: a window may start up to about a gap's half from the nearest.
const SLACK_BEFORE: f64 = 1.0;
const SLACK_AFTER: f64 = 0.5;

impl DeviceSnapshot {
    /// The share of the device (0.0-1.0) the slice used over about the last `window_ns` before
    /// `now_ns` (CLOCK_MONOTONIC, the clock of the marks): the device time between the mark
    /// closest to the window's start and the latest report, over the time between them. None
    /// when there is no mark near enough (no process of the slice ran that long ago), except
    /// that a slice whose meters have not reported for a whole window used nothing in it.
    pub fn share_over(&self, window_ns: u64, now_ns: u64) -> Option<f64> {
        if self.metered_ns == 0 || now_ns.saturating_sub(self.metered_ns) >= window_ns {
            return Some(0.0);
        }
        let want = self.metered_ns.saturating_sub(window_ns);
        let near = |m: &&Mark| {
            if m.at_ns <= want {
                (want - m.at_ns) as f64 <= window_ns as f64 * SLACK_BEFORE
            } else {
                (m.at_ns - want) as f64 <= window_ns as f64 * SLACK_AFTER
            }
        };
        let m = self
            .marks
            .iter()
            .filter(|m| m.at_ns < self.metered_ns)
            .filter(near)
            .min_by_key(|m| m.at_ns.abs_diff(want))?;
        let span = self.metered_ns - m.at_ns;
        let used = self.device_ns.saturating_sub(m.device_ns);
        Some((used as f64 / span as f64).min(1.0))
    }

    /// The core request and limit as fractions of the device, None when not set.
    pub fn request(&self) -> Option<f64> {
        (self.core_request > 0).then(|| self.core_request as f64 / FULL as f64)
    }

    pub fn core_limit(&self) -> Option<f64> {
        (self.core_limit < FULL).then(|| self.core_limit as f64 / FULL as f64)
    }

    pub fn allotted(&self) -> f64 {
        self.allotted.min(FULL) as f64 / FULL as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn dev(marks: &[(u64, u64)], device_ns: u64, metered_ns: u64) -> DeviceSnapshot {
        DeviceSnapshot {
            uuid: [0; 16],
            limit: None,
            used: 0,
            peak: 0,
            frozen: 0,
            spill_limit: None,
            spilled: 0,
            spill_peak: 0,
            waiting: 0,
            refusals: 0,
            context_overhead: 0,
            core_request: 0,
            core_limit: FULL,
            priority: 0,
            live: 0,
            allotted: FULL,
            device_ns,
            throttled_ns: 0,
            metered_by: MeteredBy::Samples,
            metered_ns,
            marks: marks
                .iter()
                .map(|&(at_ns, device_ns)| Mark {
                    at_ns,
                    device_ns,
                    throttled_ns: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn share_is_device_time_over_wall_time_since_the_mark_nearest_the_window_start() {
        // 30% of the device, marks each second from t=100 s to t=115 s.
        let marks: Vec<_> = (100..116)
            .map(|t| (t * S + 20_000_000, (t - 100) * 3 * S / 10))
            .collect();
        let d = dev(&marks, 15 * 3 * S / 10 + 3 * S / 100, 115 * S + 120_000_000);
        let one = d.share_over(S, 115 * S + 150_000_000).unwrap();
        assert!((one - 0.3).abs() < 0.001, "{one}");
        let ten = d.share_over(10 * S, 115 * S + 150_000_000).unwrap();
        assert!((ten - 0.3).abs() < 0.001, "{ten}");
    }

    #[test]
    fn no_history_that_far_back_is_unknown_not_zero() {
        // The slice began 2 s ago: 1 s is known, 10 s is not.
        let d = dev(&[(100 * S, 0), (101 * S, S / 2)], S, 102 * S);
        assert_eq!(d.share_over(S, 102 * S), Some(0.5));
        assert_eq!(d.share_over(10 * S, 102 * S), None);
    }

    #[test]
    fn a_stall_across_a_seconds_start_still_leaves_a_window() {
        // The process stalled 0.7 s into second 101: that second's mark is its latest report,
        // and the one before is 1.7 s old. The share is over those 1.7 s.
        let d = dev(
            &[(100 * S, 0), (101 * S + 7 * S / 10, S / 2)],
            S / 2,
            101 * S + 7 * S / 10,
        );
        let one = d.share_over(S, 101 * S + 8 * S / 10).unwrap();
        assert!((one - 0.5 / 1.7).abs() < 0.001, "{one}");
        // A mark more than a window before the start is too far.
        let d = dev(&[(100 * S, 0)], S / 2, 102 * S + S / 10);
        assert_eq!(d.share_over(S, 102 * S + S / 5), None);
    }

    #[test]
    fn a_slice_whose_meters_went_quiet_used_nothing() {
        let d = dev(&[(100 * S, 0)], S, 101 * S);
        assert_eq!(d.share_over(S, 103 * S), Some(0.0));
        // Never launched anything.
        assert_eq!(dev(&[], 0, 0).share_over(10 * S, 50 * S), Some(0.0));
    }

    #[test]
    fn request_and_limit_are_fractions_or_unset() {
        let mut d = dev(&[], 0, 0);
        assert_eq!((d.request(), d.core_limit()), (None, None));
        d.core_request = FULL / 5;
        d.core_limit = FULL * 3 / 10;
        assert_eq!((d.request(), d.core_limit()), (Some(0.2), Some(0.3)));
    }
}
