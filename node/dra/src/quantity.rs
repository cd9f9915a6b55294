//! Kubernetes resource quantities (`8Gi`, `30`, `1.5Gi`, `256M`, `1e3`), as whole numbers: the
//! bytes of a memory capacity, the percent of a `cores` capacity. Pure.

use cuslice_policy::echo::quoted;

/// The exact whole number a quantity stands for, or one line saying why it is not one.
pub fn parse(q: &str) -> Result<u64, String> {
    let s = q.trim();
    let bad = |why: &str| {
        format!(
            "{} is not a quantity this driver takes ({why}); write e.g. 8Gi, 512Mi or 30",
            quoted(q)
        )
    };
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(end);
    if number.is_empty() || number.starts_with('.') || number.ends_with('.') {
        return Err(bad("no number"));
    }
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if frac.contains('.') {
        return Err(bad("two decimal points"));
    }
    // value = digits / 10^frac.len() * base^power
    let digits: u128 = format!("{whole}{frac}")
        .parse()
        .map_err(|_| bad("too large"))?;
    let (mul, div_pow10): (u128, u32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "m" => (1, 3),
        "k" => (1_000, 0),
        "M" => (1_000_000, 0),
        "G" => (1_000_000_000, 0),
        "T" => (1_000_000_000_000, 0),
        "P" => (1_000_000_000_000_000, 0),
        "E" => (1_000_000_000_000_000_000, 0),
        e if e.starts_with(['e', 'E']) => {
            let exp: u32 = e[1..].parse().map_err(|_| bad("unknown suffix"))?;
            (10u128.checked_pow(exp).ok_or_else(|| bad("too large"))?, 0)
        }
        _ => return Err(bad("unknown suffix")),
    };
    let scaled = digits.checked_mul(mul).ok_or_else(|| bad("too large"))?;
    let div = u32::try_from(frac.len())
        .ok()
        .and_then(|n| 10u128.checked_pow(n.checked_add(div_pow10)?))
        .ok_or_else(|| bad("too many decimal places"))?;
    if scaled % div != 0 {
        return Err(bad("not a whole number"));
    }
    u64::try_from(scaled / div).map_err(|_| bad("too large"))
}

/// A byte count in the largest binary unit that holds it exactly: `16Gi`, `81559Mi`, `1000`.
pub fn bytes(n: u64) -> String {
    for (unit, shift) in [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ] {
        if n != 0 && n.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_kubernetes_writes() {
        for (q, v) in [
            ("8Gi", 8 << 30),
            ("256Mi", 256 << 20),
            ("30", 30),
            ("1.5Gi", 3 << 29),
            ("2k", 2000),
            ("1e3", 1000),
            ("3000m", 3),
            ("81559Mi", 81559 << 20),
            (" 4Ki ", 4096),
        ] {
            assert_eq!(parse(q), Ok(v), "{q}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_whole_quantity() {
        // More decimal places than a u128 power of ten holds (it wrapped to 0, then divided).
        let fine = format!("0.{}1", "0".repeat(130));
        assert!(parse(&fine).is_err());
        for q in [
            "",
            "Gi",
            "-1",
            "1.5",
            "8GB",
            "1..2",
            "500m",
            "1.",
            "99999999999999999999Ei",
        ] {
            let e = parse(q).unwrap_err();
            assert!(e.contains("e.g. 8Gi"), "{q}: {e}");
        }
    }

    #[test]
    fn formats_bytes_in_the_largest_exact_unit() {
        assert_eq!(bytes(16 << 30), "16Gi");
        assert_eq!(bytes(85_520_809_984), "81559Mi");
        assert_eq!(bytes(1000), "1000");
        assert_eq!(bytes(0), "0");
        for n in [16u64 << 30, 85_520_809_984, 1000, 1 << 10] {
            assert_eq!(parse(&bytes(n)), Ok(n));
        }
    }
}
