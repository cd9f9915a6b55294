//! Shell patterns as containerd matches its `imports` (Go's `filepath.Match`): `*` is any run of
//! characters except `/`, `?` one character except `/`, `[...]` a class (`[^...]` negated, ranges
//! `a-z`), `\` quotes the next character.

/// Whether `name` matches `pattern` in full. A malformed pattern matches nothing, as in Go.
pub fn matches(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    match_from(&p, &n)
}

fn match_from(p: &[char], n: &[char]) -> bool {
    match p.first() {
        None => n.is_empty(),
        Some('*') => {
            let rest = &p[1..];
            // `*` takes 0..k characters, stopping at the first `/`.
            let mut k = 0;
            loop {
                if match_from(rest, &n[k..]) {
                    return true;
                }
                if k == n.len() || n[k] == '/' {
                    return false;
                }
                k += 1;
            }
        }
        Some('?') => n.first().is_some_and(|&c| c != '/') && match_from(&p[1..], &n[1..]),
        Some('[') => {
            let Some(&c) = n.first() else { return false };
            match class(&p[1..], c) {
                Some((true, used)) if c != '/' => match_from(&p[1 + used..], &n[1..]),
                _ => false,
            }
        }
        Some('\\') => match p.get(1) {
            Some(&q) => n.first() == Some(&q) && match_from(&p[2..], &n[1..]),
            None => false,
        },
        Some(&q) => n.first() == Some(&q) && match_from(&p[1..], &n[1..]),
    }
}

/// Matches `c` against the class starting after `[`; returns (matched, chars used incl. `]`).
fn class(p: &[char], c: char) -> Option<(bool, usize)> {
    let mut i = 0;
    let negated = p.first() == Some(&'^');
    if negated {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    loop {
        let lo = match p.get(i)? {
            ']' if !first => return Some((hit != negated, i + 1)),
            '\\' => {
                i += 1;
                *p.get(i)?
            }
            &x => x,
        };
        first = false;
        i += 1;
        let hi = if p.get(i) == Some(&'-') && p.get(i + 1).is_some_and(|&x| x != ']') {
            i += 1;
            let h = match p.get(i)? {
                '\\' => {
                    i += 1;
                    *p.get(i)?
                }
                &x => x,
            };
            i += 1;
            h
        } else {
            lo
        };
        if lo <= c && c <= hi {
            hit = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn star_question_and_classes() {
        let f = "/etc/containerd/conf.d/cuslice.toml";
        assert!(matches("/etc/containerd/conf.d/*.toml", f));
        assert!(matches("/etc/containerd/conf.d/*", f));
        assert!(matches("/etc/containerd/*/*.toml", f));
        assert!(matches("/etc/containerd/conf.d/c?slice.toml", f));
        assert!(matches("/etc/containerd/conf.d/[a-c]*.toml", f));
        assert!(matches(f, f));
        assert!(!matches("/etc/containerd/*.toml", f), "* does not cross /");
        assert!(!matches("/etc/containerd/conf.d/*.conf", f));
        assert!(!matches("/etc/containerd/conf.d/[^c]*.toml", f));
        assert!(!matches("/etc/containerd/conf.d/[d-z]*.toml", f));
        assert!(!matches("/etc/containerd/conf.d/[c", f), "malformed");
        assert!(matches("/a/\\*", "/a/*"));
        assert!(!matches("/a/\\*", "/a/b"));
    }
}
