//! Durations as users write them: `5s`, `500ms`, `2m`, `1.5s`, `1h`. Pure.
//!
//! A number (a fraction allowed) followed by one unit: `ms`, `s`, `m` (minutes) or `h`, case
//! insensitive. A bare number is refused: `5` could mean seconds or milliseconds, and guessing
//! wrong by a factor of 1000 is worse than asking. Zero is a valid duration here; callers that
//! need a positive one say so.

use std::fmt;
use std::time::Duration;

/// The longest duration accepted: one day, longer than any allocation should wait.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Why a string is not a duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurationError {
    Empty,
    Negative,
    NoNumber,
    NoUnit,
    UnknownUnit,
    TooLong,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DurationError::Empty => "it is empty",
            DurationError::Negative => "durations cannot be negative",
            DurationError::NoNumber => "it does not start with a number",
            DurationError::NoUnit => "it has no unit",
            DurationError::UnknownUnit => "unknown unit",
            DurationError::TooLong => "it is longer than a day",
        })
    }
}

/// The units, as they multiply nanoseconds.
fn unit_ns(unit: &str) -> Option<u64> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "ms" => 1_000_000,
        "s" | "sec" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Parses a duration such as `5s` or `250ms` (surrounding whitespace ignored).
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if s.starts_with('-') {
        return Err(DurationError::Negative);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = (&s[..split], s[split..].trim());
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return Err(DurationError::NoNumber);
    }
    if unit.is_empty() {
        return Err(DurationError::NoUnit);
    }
    let scale = unit_ns(unit).ok_or(DurationError::UnknownUnit)?;
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| DurationError::TooLong)?
    };
    let mut ns = whole.checked_mul(scale).ok_or(DurationError::TooLong)?;
    // The fraction, digit by digit, to the nanosecond (finer digits are dropped).
    let mut place = scale;
    for digit in fraction.bytes() {
        place /= 10;
        ns = ns.saturating_add(u64::from(digit - b'0') * place);
    }
    let d = Duration::from_nanos(ns);
    if d > MAX_DURATION {
        return Err(DurationError::TooLong);
    }
    Ok(d)
}

/// A duration as `parse_duration` reads it back: `5s`, `250ms`, `1.5s`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else if ms >= 1000 {
        format!("{}s", ms as f64 / 1000.0)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_users_write_them() {
        let ok = [
            ("5s", 5_000),
            ("500ms", 500),
            ("2m", 120_000),
            ("1h", 3_600_000),
            ("1.5s", 1_500),
            (" 10S ", 10_000),
            ("0s", 0),
            ("0.25s", 250),
            ("3 s", 3_000),
            (".5s", 500),
        ];
        for (s, ms) in ok {
            assert_eq!(parse_duration(s), Ok(Duration::from_millis(ms)), "{s:?}");
        }
    }

    #[test]
    fn what_is_not_a_duration() {
        let bad = [
            ("", DurationError::Empty),
            ("  ", DurationError::Empty),
            ("-1s", DurationError::Negative),
            ("5", DurationError::NoUnit),
            ("s", DurationError::NoNumber),
            ("1.2.3s", DurationError::NoNumber),
            ("5 fortnights", DurationError::UnknownUnit),
            ("5us", DurationError::UnknownUnit),
            ("25h", DurationError::TooLong),
            ("99999999999999999999s", DurationError::TooLong),
        ];
        for (s, e) in bad {
            assert_eq!(parse_duration(s), Err(e), "{s:?}");
        }
    }

    #[test]
    fn formatted_durations_read_back() {
        for ms in [0, 1, 250, 1000, 1500, 5000, 120_000] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{ms}");
        }
    }
}
