//! Byte sizes as users write them: `4GiB`, `512MiB`, `1.5GiB`, `4g`, `4096m`, `1073741824`.
//!
//! Every unit is binary (1024-based): `KiB`, `MiB`, `GiB`, `TiB`, `PiB`, and the single letters
//! `k`, `m`, `g`, `t`, `p` as HAMi-core's `CUDA_DEVICE_MEMORY_LIMIT` writes them (`4g`); `B` or no
//! unit is bytes. Units are case-insensitive, and a space may stand between number and unit. A
//! fraction is allowed with a unit (`1.5GiB`) and must come out to whole bytes.
//!
//! The decimal spellings `kB`, `MB`, `GB`, `TB` and `PB` are refused ([`Reason::DecimalUnit`]):
//! `1.5GB` is 1.5 * 10^9 bytes to a disk maker and 1.5 * 2^30 to many GPU tools, 7% apart, and a
//! cap must mean one thing.

use std::fmt;

/// Why a string is not a size. Its `Display` is one line that names the value and shows what works.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{input:?} is not a size ({reason}); write e.g. 4GiB, 512MiB, 1.5GiB, 4g, 4096m or plain bytes"
)]
pub struct SizeError {
    pub input: String,
    pub reason: Reason,
}

/// The specific defect, for callers that want to branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Empty,
    Negative,
    NoNumber,
    UnknownUnit,
    FractionalBytes,
    TooLarge,
    /// `kB`, `MB`, `GB`, `TB` or `PB`: 1000- or 1024-based, depending on who reads it.
    DecimalUnit,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::Empty => "it is empty",
            Reason::Negative => "sizes cannot be negative",
            Reason::NoNumber => "it does not start with a number",
            Reason::UnknownUnit => "unknown unit",
            Reason::FractionalBytes => "it is not a whole number of bytes",
            Reason::TooLarge => "it is larger than 16 EiB",
            Reason::DecimalUnit => {
                "a decimal unit, which reads as powers of 1000 or of 1024 depending on who reads \
                 it; cuslice's units are binary: KiB, MiB, GiB, TiB, or k, m, g, t"
            }
        })
    }
}

/// The unit's power of two; `Err` for a unit that is not one (the reason).
fn unit_shift(unit: &str) -> Result<u32, Reason> {
    Ok(match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        "p" | "pib" => 50,
        "kb" | "mb" | "gb" | "tb" | "pb" => return Err(Reason::DecimalUnit),
        _ => return Err(Reason::UnknownUnit),
    })
}

/// Parses a size in bytes. Zero is a valid size here; callers that need a positive one say so.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let fail = |reason| SizeError {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(fail(Reason::Empty));
    }
    if s.starts_with('-') {
        return Err(fail(Reason::Negative));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(num_end);
    let shift = unit_shift(unit.trim()).map_err(fail)?;
    let (whole, frac) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(fail(Reason::NoNumber));
    }
    // value = (whole + frac / 10^len) << shift, computed exactly in u128.
    let digits = format!("{whole}{frac}");
    if digits.len() > 30 {
        return Err(fail(Reason::TooLarge));
    }
    let mantissa: u128 = digits.parse().map_err(|_| fail(Reason::NoNumber))?;
    let scale = 10u128.pow(frac.len() as u32);
    let scaled = mantissa << shift;
    if !scaled.is_multiple_of(scale) {
        return Err(fail(Reason::FractionalBytes));
    }
    u64::try_from(scaled / scale).map_err(|_| fail(Reason::TooLarge))
}

/// Formats bytes with the largest binary unit that keeps at most two decimals: `4 GiB`,
/// `1.5 GiB`, `300 MiB`, `1000 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u32); 5] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10), ("B", 0)];
    for (name, shift) in UNITS {
        let unit = 1u64 << shift;
        if bytes >= unit {
            let hundredths = (bytes as u128 * 100) / unit as u128;
            return if hundredths.is_multiple_of(100) {
                format!("{} {name}", hundredths / 100)
            } else if hundredths.is_multiple_of(10) {
                format!("{}.{} {name}", hundredths / 100, (hundredths % 100) / 10)
            } else {
                format!("{}.{:02} {name}", hundredths / 100, hundredths % 100)
            };
        }
    }
    "0 B".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    #[test]
    fn the_contract_examples() {
        assert_eq!(parse_size("4GiB"), Ok(4 * GIB));
        assert_eq!(parse_size("512MiB"), Ok(512 * MIB));
        assert_eq!(parse_size("1.5GiB"), Ok(3 * GIB / 2));
        assert_eq!(parse_size("4g"), Ok(4 * GIB));
        assert_eq!(parse_size("4096m"), Ok(4096 * MIB));
        assert_eq!(parse_size("1073741824"), Ok(GIB));
    }

    #[test]
    fn units_are_binary_and_case_insensitive() {
        assert_eq!(parse_size("4G"), Ok(4 * GIB));
        assert_eq!(parse_size("4gib"), Ok(4 * GIB));
        assert_eq!(parse_size("1p"), Ok(1 << 50));
        assert_eq!(parse_size("4096 B"), Ok(4096));
        assert_eq!(parse_size("2k"), Ok(2048));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size(" 8 GiB "), Ok(8 * GIB));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("0.5k"), Ok(512));
        assert_eq!(parse_size(".5GiB"), Ok(GIB / 2));
    }

    #[test]
    fn bad_sizes_say_why() {
        let reason = |s| parse_size(s).unwrap_err().reason;
        assert_eq!(reason(""), Reason::Empty);
        assert_eq!(reason("-1GiB"), Reason::Negative);
        assert_eq!(reason("12XB"), Reason::UnknownUnit);
        assert_eq!(reason("GiB"), Reason::NoNumber);
        assert_eq!(reason("1.2.3GiB"), Reason::NoNumber);
        assert_eq!(reason("1.5"), Reason::FractionalBytes);
        assert_eq!(reason("20000000PiB"), Reason::TooLarge);
        // Decimal units mean two things; none is guessed.
        for s in ["1.5GB", "4GB", "4gb", "512MB", "2kB", "1TB", "1PB", "8 GB"] {
            assert_eq!(reason(s), Reason::DecimalUnit, "{s}");
        }
        assert_eq!(
            reason("99999999999999999999999999999999999"),
            Reason::TooLarge
        );
        let msg = parse_size("12XB").unwrap_err().to_string();
        assert!(msg.contains("\"12XB\"") && msg.contains("4GiB"), "{msg}");
    }

    #[test]
    fn format_round_trips_common_sizes() {
        assert_eq!(format_size(4 * GIB), "4 GiB");
        assert_eq!(format_size(3 * GIB / 2), "1.5 GiB");
        assert_eq!(format_size(300 * MIB), "300 MiB");
        assert_eq!(format_size(1000), "1000 B");
        assert_eq!(format_size(0), "0 B");
        for s in ["4 GiB", "1.5 GiB", "300 MiB", "1.25 GiB"] {
            assert_eq!(format_size(parse_size(s).unwrap()), s);
        }
    }
}
