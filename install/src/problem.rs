//! What the pure transforms report when they refuse a file.

use std::fmt;

/// What is wrong with one file and what would work. The command prints it as one line:
/// `cuslice install: FILE: WHAT; FIX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// What is wrong, with the parser's line and column where it has them.
    pub what: String,
    /// What the user can do about it.
    pub fix: String,
}

impl Problem {
    pub fn new(what: impl Into<String>, fix: impl Into<String>) -> Self {
        Problem {
            what: one_line(&what.into()),
            fix: one_line(&fix.into()),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; {}", self.what, self.fix)
    }
}

/// Folds a parser's multi-line message into one line.
pub fn one_line(s: &str) -> String {
    s.split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// 1-based line and column (in characters) of a byte offset in `text`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_from_one() {
        let t = "ab\ncd\n";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 1), (1, 2));
        assert_eq!(line_col(t, 3), (2, 1));
        assert_eq!(line_col(t, 5), (2, 3));
        assert_eq!(line_col(t, 100), (3, 1));
    }

    #[test]
    fn problems_are_one_line() {
        let p = Problem::new("bad\n  thing\n", "fix\nit");
        assert_eq!(p.to_string(), "bad thing; fix it");
    }
}
