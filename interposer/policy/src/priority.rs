//! Priority between slices on one device (`CUSLICE_PRIORITY=high|normal|low`): the decisions the
//! compute gate makes for a launch of a slice below a high-priority one. Pure functions over plain
//! numbers (ns of `CLOCK_MONOTONIC`); the interposer feeds them what the node's compute board says
//! about the high-priority work in flight and whether the launching stream is idle.
//!
//! - A **high** slice publishes, at each launch, when the work it has launched so far is expected
//!   to be done ([`busy_until`]).
//! - A slice below it (normal or low) **yields** ([`yields`]) while a high slice was active on the
//!   device in the last second, unless it is using less than its core request.
//! - A yielding slice's launch ([`admit`]) waits while high work is in flight, and then until the
//!   launching stream has nothing left on the device: its queued work is at most the one kernel
//!   being launched, so a high-priority kernel waits behind at most one kernel per stream of it.
//! - Starvation bound: no launch is held longer than [`HOLD_MAX_NS`]; then it goes regardless.
//!
//! - The allotment ([`view`]): a slice below a high one leaves the high slices out (the gate
//!   already puts them first), and a high slice sees the slices below it as wanting no more than
//!   their requests. So neither is throttled by tokens on the other's account, and requests keep
//!   their meaning.
//!
//! Normal and low slices behave alike: both yield to high slices only. (Low yielding to normal
//! would put every normal slice beside a low one on the gate's slow path.)

use crate::share::Demand;

/// A slice's priority on its devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Low,
    #[default]
    Normal,
    High,
}

impl Priority {
    /// `high`, `normal` or `low` (case-insensitive, surrounding whitespace ignored).
    pub fn parse(s: &str) -> Option<Priority> {
        match s.trim().to_ascii_lowercase().as_str() {
            "high" => Some(Priority::High),
            "normal" => Some(Priority::Normal),
            "low" => Some(Priority::Low),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }

    /// How the compute board stores it (0, the zero of a fresh entry, is normal).
    pub fn code(self) -> u32 {
        match self {
            Priority::Normal => 0,
            Priority::Low => 1,
            Priority::High => 2,
        }
    }

    pub fn from_code(code: u32) -> Priority {
        match code {
            1 => Priority::Low,
            2 => Priority::High,
            _ => Priority::Normal,
        }
    }
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The longest a launch of a yielding slice is held at the gate. A slice beside a high-priority
/// one that keeps the device busy still launches at least once per this time on each of its
/// threads (and its kernels then get the device's time slices like anyone's).
pub const HOLD_MAX_NS: u64 = 50_000_000;

/// A yielding launch whose stream is still busy past the estimate looks again after this long.
pub const POLL_NS: u64 = 50_000;

/// Whether a slice at `mine` yields to high-priority work on the device: a high slice other than
/// it was active there lately, and it is not using less than its core request (`request` and
/// `usage` in ppm; 0: no request), which the high slice's priority does not take away.
pub fn yields(mine: Priority, high_active: bool, request: u32, usage: u32) -> bool {
    mine < Priority::High && high_active && (request == 0 || usage >= request)
}

/// When a slice's work is expected to be done after one more launch at `now` expected to cost
/// `cost_ns`, if what it launched before was expected to be done at `until`. When that estimate
/// has run out, `still_busy` (asked only then) says whether the launching stream still has work
/// left: then one more launch's worth is taken to be left (the estimate runs short when other
/// slices' work delays this one's, and without this the slices that yield to it would take the
/// gap).
pub fn busy_until(until: u64, now: u64, cost_ns: u64, still_busy: impl FnOnce() -> bool) -> u64 {
    let from = if until > now {
        until
    } else if still_busy() {
        now.saturating_add(cost_ns)
    } else {
        now
    };
    from.saturating_add(cost_ns)
}

/// The demands `share::allot` sees for a slice at `mine`, from every slice on the device (its
/// own first, kept first): a slice below high priority leaves the high slices out; a high slice
/// sees each slice below it as wanting at most its request (lent while unused, as requests are).
pub fn view(mine: Priority, slices: &[(Demand, Priority)]) -> Vec<Demand> {
    slices
        .iter()
        .enumerate()
        .filter(|&(i, &(_, p))| i == 0 || mine == Priority::High || p < Priority::High)
        .map(|(i, &(d, p))| {
            if i > 0 && mine == Priority::High && p < Priority::High {
                Demand {
                    limit: d.limit.min(d.request),
                    usage: d.usage.min(d.request),
                    ..d
                }
            } else {
                d
            }
        })
        .collect()
}

/// What the gate does with a yielding slice's launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Launch now.
    Go,
    /// Sleep this long (ns), then ask again.
    Wait(u64),
}

/// The decision for a launch of a yielding slice held since `held_from`: wait while high-priority
/// work is expected in flight (`high_until`), then until the launching stream is idle
/// (`stream_idle`, asked only then), sleeping until this process's own work is expected done
/// (`own_until`) or `POLL_NS`; never past `HOLD_MAX_NS` from `held_from`.
pub fn admit(
    now: u64,
    held_from: u64,
    high_until: u64,
    own_until: u64,
    stream_idle: impl FnOnce() -> bool,
) -> Admit {
    let deadline = held_from.saturating_add(HOLD_MAX_NS);
    if now >= deadline {
        return Admit::Go;
    }
    let left = deadline - now;
    if high_until > now {
        return Admit::Wait((high_until - now).min(left));
    }
    if stream_idle() {
        return Admit::Go;
    }
    Admit::Wait(own_until.saturating_sub(now).max(POLL_NS).min(left))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn parses_the_three_levels_and_nothing_else() {
        assert_eq!(Priority::parse("high"), Some(Priority::High));
        assert_eq!(Priority::parse(" Normal "), Some(Priority::Normal));
        assert_eq!(Priority::parse("LOW"), Some(Priority::Low));
        for bad in ["", "urgent", "1", "hi", "high,low"] {
            assert_eq!(Priority::parse(bad), None, "{bad:?}");
        }
        for p in [Priority::Low, Priority::Normal, Priority::High] {
            assert_eq!(Priority::from_code(p.code()), p);
            assert_eq!(Priority::parse(p.as_str()), Some(p));
        }
        assert_eq!(Priority::from_code(0), Priority::Normal);
        assert_eq!(Priority::default(), Priority::Normal);
    }

    #[test]
    fn only_slices_below_an_active_high_one_yield_and_never_below_their_request() {
        assert!(yields(Priority::Low, true, 0, 0));
        assert!(yields(Priority::Normal, true, 0, 0));
        assert!(!yields(Priority::High, true, 0, 0));
        assert!(!yields(Priority::Low, false, 0, 0));
        // Request 30%: yields only while it uses at least that.
        assert!(!yields(Priority::Low, true, 300_000, 290_000));
        assert!(yields(Priority::Low, true, 300_000, 300_000));
    }

    #[test]
    fn the_allotment_puts_high_slices_first_and_keeps_requests() {
        use crate::share::{FULL, allot};
        let d = |request: u32, hungry: bool, usage: u32| Demand {
            request: request * 10_000,
            limit: FULL,
            hungry,
            usage: usage * 10_000,
        };
        let (hi, lo, no) = (Priority::High, Priority::Low, Priority::Normal);
        let pct = |v: Vec<u32>| v.into_iter().map(|x| x / 10_000).collect::<Vec<_>>();
        // Two busy best-effort slices: without priority they split the device.
        let busy = [(d(0, true, 50), no), (d(0, true, 50), no)];
        assert_eq!(pct(allot(&view(no, &busy))), [50, 50]);
        // High beside low: each is alone in its own view (the gate orders them), so neither is
        // throttled by tokens on the other's account.
        let me_high = [(d(0, true, 5), hi), (d(0, true, 95), lo)];
        assert_eq!(pct(allot(&view(hi, &me_high))), [100, 0]);
        let me_low = [(d(0, true, 95), lo), (d(0, true, 5), hi)];
        assert_eq!(view(lo, &me_low).len(), 1);
        assert_eq!(pct(allot(&view(lo, &me_low))), [100]);
        // A low slice's request is kept from the high one while it wants it, and lent while not.
        let wants = [(d(0, true, 90), hi), (d(30, true, 30), lo)];
        assert_eq!(pct(allot(&view(hi, &wants))), [70, 30]);
        // (Idle, it keeps the usual headroom of share::SLACK.)
        let idle = [(d(0, true, 90), hi), (d(30, false, 0), lo)];
        assert_eq!(pct(allot(&view(hi, &idle))), [95, 5]);
        // Two high slices (and two low ones) share as before.
        let two = [
            (d(0, true, 50), hi),
            (d(0, true, 50), hi),
            (d(0, true, 50), lo),
        ];
        assert_eq!(pct(allot(&view(hi, &two))), [50, 50, 0]);
    }

    #[test]
    fn high_work_in_flight_is_the_sum_of_its_launches_from_when_the_device_had_it() {
        let idle = || false;
        assert_eq!(busy_until(0, 100, 10, idle), 110);
        // Queued behind its own earlier work (the stream is not asked).
        assert_eq!(busy_until(150, 100, 10, || unreachable!()), 160);
        assert_eq!(busy_until(u64::MAX - 1, 0, 10, idle), u64::MAX);
        // The estimate ran out but the stream is still busy: one more launch's worth is left.
        assert_eq!(busy_until(90, 100, 10, || true), 120);
    }

    #[test]
    fn a_launch_waits_for_high_work_then_its_own_stream_and_never_past_the_bound() {
        let busy = || false;
        let idle = || true;
        // High work in flight for 2 ms more: wait that long (the stream is not asked).
        let asked = std::cell::Cell::new(false);
        let ask = || {
            asked.set(true);
            true
        };
        assert_eq!(
            admit(10 * MS, 10 * MS, 12 * MS, 0, ask),
            Admit::Wait(2 * MS)
        );
        assert!(!asked.get());
        // No high work: go if the stream is idle, else wait for own work (at least POLL_NS).
        assert_eq!(admit(10 * MS, 10 * MS, 9 * MS, 0, idle), Admit::Go);
        assert_eq!(admit(10 * MS, 10 * MS, 0, 11 * MS, busy), Admit::Wait(MS));
        assert_eq!(admit(10 * MS, 10 * MS, 0, 0, busy), Admit::Wait(POLL_NS));
        // Never waits past the bound; at the bound it goes whatever is in flight.
        let from = 10 * MS;
        assert_eq!(
            admit(from + HOLD_MAX_NS - MS, from, u64::MAX, 0, busy),
            Admit::Wait(MS)
        );
        assert_eq!(
            admit(from + HOLD_MAX_NS - 10_000, from, 0, u64::MAX, busy),
            Admit::Wait(10_000)
        );
        assert_eq!(
            admit(from + HOLD_MAX_NS, from, u64::MAX, u64::MAX, busy),
            Admit::Go
        );
    }
}
