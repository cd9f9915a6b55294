//! Priority between slices on one device (`CUSLICE_PRIORITY=high|normal|low`). Pure.
//!
//! - Turns (`crate::turn`): a waiting high slice takes the next turn before any other, and a
//!   holder below it ends its turn at once, with nothing queued ahead beside it.
//! - The allotment ([`view`]): a slice below a high one leaves the high slices out (turns already
//!   put them first), and a high slice sees the slices below it as wanting no more than their
//!   requests. So neither is throttled by tokens on the other's account, and requests keep their
//!   meaning.
//!
//! Normal and low slices behave alike: both give way to high slices only.

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

/// The demands `share::allot` sees for a slice at `mine`, from every slice on the device (its
/// own first, kept first): a slice below high priority leaves the high slices out; a high slice
/// sees each slice below it as wanting at most its request (lent while unused, as requests are).
pub fn view(mine: Priority, slices: &[(Demand, Priority)]) -> Vec<Demand> {
    slices
        .iter()
        .enumerate()
        .filter(|&(i, &(_, p))| counted(mine, i, p))
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

/// Whether a slice at `mine` counts slice `i` (at `p`; its own is 0) in its view: a slice below
/// high priority leaves the high slices out.
fn counted(mine: Priority, i: usize, p: Priority) -> bool {
    i == 0 || mine == Priority::High || p < Priority::High
}

/// Each slice's allotment (ppm) as a slice at `mine` sees it, from every slice on the device
/// (its own first): `share::allot` over its `view`, and the whole device for a slice the view
/// leaves out (high slices, seen from below: they go first).
pub fn allotments(mine: Priority, slices: &[(Demand, Priority)]) -> Vec<u32> {
    let mut allotted = crate::share::allot(&view(mine, slices)).into_iter();
    slices
        .iter()
        .enumerate()
        .map(|(i, &(_, p))| {
            if counted(mine, i, p) {
                allotted.next().unwrap_or(0)
            } else {
                crate::share::FULL
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn each_slices_allotment_is_as_the_reader_sees_it_and_a_high_one_seen_from_below_has_all() {
        use crate::share::FULL;
        let busy = Demand {
            request: 0,
            limit: FULL,
            hungry: true,
            usage: FULL / 2,
        };
        let (hi, no) = (Priority::High, Priority::Normal);
        let pct = |v: Vec<u32>| v.into_iter().map(|x| x / 10_000).collect::<Vec<_>>();
        assert_eq!(pct(allotments(no, &[(busy, no), (busy, no)])), [50, 50]);
        assert_eq!(
            pct(allotments(no, &[(busy, no), (busy, hi), (busy, no)])),
            [50, 100, 50]
        );
        assert_eq!(pct(allotments(hi, &[(busy, hi), (busy, no)]))[0], 100);
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
}
