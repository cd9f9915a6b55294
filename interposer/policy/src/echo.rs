//! How a refusal shows a value the user gave: quoted, whole when it is short, else its first
//! 64 characters and its length, so that a megabyte of input makes a line of a few hundred
//! bytes. Pure.

/// How many characters of a value a message shows.
pub const SHOWN: usize = 64;

/// `value` quoted and escaped as `{:?}` writes it (`"4GiB"`); past [`SHOWN`] characters, the
/// first of them and the length in bytes: `"99999…"… (100000 bytes)`.
pub fn quoted(value: &str) -> String {
    match value.char_indices().nth(SHOWN) {
        None => format!("{value:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes)", &value[..end], value.len()),
    }
}

/// `value` as it is when short, else its first [`SHOWN`] characters and its length in bytes,
/// unquoted: for a value inside an example or a `NAME=VALUE` the message shows.
pub fn cut(value: &str) -> std::borrow::Cow<'_, str> {
    match value.char_indices().nth(SHOWN) {
        None => value.into(),
        Some((end, _)) => format!("{}… ({} bytes)", &value[..end], value.len()).into(),
    }
}

/// `s` with its control characters escaped (`\n` as the two characters `\` `n`), so that a
/// message stays on one line whatever a name or value holds.
pub fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_whole_and_long_ones_cut() {
        assert_eq!(quoted("4GiB"), "\"4GiB\"");
        assert_eq!(quoted("a\nb"), "\"a\\nb\"");
        assert_eq!(cut("4GiB"), "4GiB");
        let exactly = "x".repeat(SHOWN);
        assert_eq!(quoted(&exactly), format!("{exactly:?}"));
        let long = "9".repeat(1 << 20);
        let q = quoted(&long);
        assert_eq!(q, format!("\"{}\"… (1048576 bytes)", &long[..SHOWN]));
        assert_eq!(cut(&long), format!("{}… (1048576 bytes)", &long[..SHOWN]));
        // Cut at a character, never inside one.
        let wide = "é".repeat(100);
        assert_eq!(cut(&wide), format!("{}… (200 bytes)", "é".repeat(SHOWN)));
    }
}
