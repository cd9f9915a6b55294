//! Limits changed while a slice runs (`cuslice set`): which limit, its value checked as the
//! variable it stands for would be, and a device's new core request and limit. The command
//! line's flag names belong to the CLI; errors here carry the variable's problem and example
//! for the CLI to word with its flags.

use super::names::Quantity;
use super::{Config, ConfigError};

/// Which limit `cuslice set` changes. (The flag that names each on the command line is the
/// CLI's.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveLimit {
    Memory,
    CoreLimit,
    CoreRequest,
    Priority,
}

impl LiveLimit {
    /// The all-devices variable the hook file gets for it.
    pub fn variable(self) -> &'static str {
        match self {
            LiveLimit::Memory => "CUSLICE_MEMORY_LIMIT",
            LiveLimit::CoreLimit => "CUSLICE_CORE_LIMIT",
            LiveLimit::CoreRequest => "CUSLICE_CORE_REQUEST",
            LiveLimit::Priority => "CUSLICE_PRIORITY",
        }
    }

    pub(super) fn quantity(self) -> Option<Quantity> {
        match self {
            LiveLimit::Memory => Some(Quantity::Memory),
            LiveLimit::CoreLimit => Some(Quantity::CoreLimit),
            LiveLimit::CoreRequest => Some(Quantity::CoreRequest),
            LiveLimit::Priority => None,
        }
    }
}

/// A value given for `what` while a slice runs, checked as the variable it stands for
/// ([`LiveLimit::variable`]) would be: bytes for memory, percent (1-100) for the core limit and
/// request, `Priority::code` for the priority. Err: the variable's error (its `problem`, and an
/// `example` of `NAME=VALUE`), for the caller to word with its own names.
pub fn parse_live(what: LiveLimit, value: &str) -> Result<u64, ConfigError> {
    let c = Config::from_vars([(what.variable(), value)])?;
    let l = c.limits(0);
    Ok(match what {
        LiveLimit::Memory => l.memory,
        LiveLimit::CoreLimit => l.core_limit.map(u64::from),
        LiveLimit::CoreRequest => l.core_request.map(u64::from),
        LiveLimit::Priority => Some(u64::from(c.priority.code())),
    }
    .unwrap_or(0))
}

/// A core request above the core limit it would have, in whole percent (rounded up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestAboveLimit {
    pub request: u32,
    pub limit: u32,
}

/// A device's core request and limit (ppm) after changing `request` and/or `limit` (percent)
/// from `current` (ppm). Err when the request would exceed the limit.
pub fn live_core(
    current: (u32, u32),
    request: Option<u32>,
    limit: Option<u32>,
) -> Result<(u32, u32), RequestAboveLimit> {
    const FULL: u32 = crate::share::FULL;
    let r = request.map_or(current.0, |p| p.min(100) * (FULL / 100));
    let l = limit.map_or(current.1, |p| p.min(100) * (FULL / 100));
    if r > l {
        let pct = |ppm: u32| ppm.div_ceil(FULL / 100);
        return Err(RequestAboveLimit {
            request: pct(r),
            limit: pct(l),
        });
    }
    Ok((r, l))
}

#[cfg(test)]
mod tests {
    use super::super::tests::GIB;
    use super::*;
    use crate::priority::Priority;

    #[test]
    fn live_values_are_checked_like_their_variables() {
        assert_eq!(parse_live(LiveLimit::Memory, "2GiB"), Ok(2 * GIB));
        assert_eq!(parse_live(LiveLimit::CoreLimit, "60"), Ok(60));
        assert_eq!(parse_live(LiveLimit::CoreRequest, "25%"), Ok(25));
        assert_eq!(
            parse_live(LiveLimit::Priority, " Normal "),
            Ok(u64::from(Priority::Normal.code()))
        );
        assert_eq!(
            parse_live(LiveLimit::Priority, "high"),
            Ok(u64::from(Priority::High.code()))
        );
        let e = parse_live(LiveLimit::Memory, "12XB").unwrap_err();
        assert_eq!(e.variable, "CUSLICE_MEMORY_LIMIT");
        assert!(e.problem.starts_with("is not a size"), "{e}");
        assert!(e.example.starts_with("CUSLICE_MEMORY_LIMIT=4GiB"), "{e}");
        for bad in ["0", "101", "", "x"] {
            let e = parse_live(LiveLimit::CoreLimit, bad).unwrap_err();
            assert_eq!(
                (e.variable.as_str(), e.value.as_str()),
                ("CUSLICE_CORE_LIMIT", bad)
            );
        }
        let e = parse_live(LiveLimit::Priority, "urgent").unwrap_err();
        assert_eq!(e.example, "CUSLICE_PRIORITY=high");
        let e = parse_live(LiveLimit::Memory, "18446744073709551615").unwrap_err();
        assert!(e.problem.contains("at most 1 PiB"), "{e}");
    }

    #[test]
    fn live_core_keeps_what_is_not_changed_and_refuses_a_request_above_the_limit() {
        const P: u32 = crate::share::FULL / 100;
        assert_eq!(live_core((0, 30 * P), None, Some(60)), Ok((0, 60 * P)));
        assert_eq!(
            live_core((10 * P, 30 * P), Some(20), None),
            Ok((20 * P, 30 * P))
        );
        assert_eq!(
            live_core((10 * P, 30 * P), Some(40), None),
            Err(RequestAboveLimit {
                request: 40,
                limit: 30
            })
        );
        assert!(live_core((20 * P, 30 * P), None, Some(10)).is_err());
    }
}
