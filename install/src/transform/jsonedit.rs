//! Byte-preserving edits of JSON text: find where an object's members lie, then insert or remove
//! one member by splicing the text, so everything else in the file (formatting, arrays kept on
//! one line, key order) stays as it was. The text must already have been parsed by serde_json;
//! the scanner only locates things.

use serde_json::Value;

/// One `"key": value` member of an object, as byte offsets into the text.
#[derive(Debug, Clone)]
pub struct Member {
    pub key: String,
    pub key_start: usize,
    pub key_end: usize,
    pub value_start: usize,
    pub value_end: usize,
}

/// An object: the offsets of its braces and its members in order.
#[derive(Debug, Clone)]
pub struct Object {
    pub open: usize,
    pub close: usize,
    pub members: Vec<Member>,
}

impl Object {
    /// The member named `key` (the last one, as serde_json keeps the last of duplicates).
    pub fn member(&self, key: &str) -> Option<(usize, &Member)> {
        self.members
            .iter()
            .enumerate()
            .rev()
            .find(|(_, m)| m.key == key)
    }
}

/// The scanner met something serde_json would not have accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanError(pub usize);

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_ws(b[i]) {
        i += 1;
    }
    i
}

/// `i` at the opening quote; returns the offset after the closing quote.
fn skip_string(b: &[u8], mut i: usize) -> Result<usize, ScanError> {
    if b.get(i) != Some(&b'"') {
        return Err(ScanError(i));
    }
    i += 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Ok(i + 1),
            _ => i += 1,
        }
    }
    Err(ScanError(i))
}

/// `i` at the first byte of a value; returns the offset after it.
fn skip_value(b: &[u8], i: usize) -> Result<usize, ScanError> {
    match b.get(i) {
        None => Err(ScanError(i)),
        Some(b'"') => skip_string(b, i),
        Some(b'{') | Some(b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = skip_string(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            Err(ScanError(j))
        }
        Some(_) => {
            let mut j = i;
            while j < b.len() && !is_ws(b[j]) && !matches!(b[j], b',' | b'}' | b']') {
                j += 1;
            }
            if j == i { Err(ScanError(i)) } else { Ok(j) }
        }
    }
}

/// The object whose `{` is at `open`.
pub fn object_at(text: &str, open: usize) -> Result<Object, ScanError> {
    let b = text.as_bytes();
    if b.get(open) != Some(&b'{') {
        return Err(ScanError(open));
    }
    let mut members = Vec::new();
    let mut i = skip_ws(b, open + 1);
    if b.get(i) == Some(&b'}') {
        return Ok(Object {
            open,
            close: i,
            members,
        });
    }
    loop {
        let key_start = i;
        let key_end = skip_string(b, i)?;
        let key: String =
            serde_json::from_str(&text[key_start..key_end]).map_err(|_| ScanError(key_start))?;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return Err(ScanError(i));
        }
        let value_start = skip_ws(b, i + 1);
        let value_end = skip_value(b, value_start)?;
        members.push(Member {
            key,
            key_start,
            key_end,
            value_start,
            value_end,
        });
        i = skip_ws(b, value_end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => {
                return Ok(Object {
                    open,
                    close: i,
                    members,
                });
            }
            _ => return Err(ScanError(i)),
        }
    }
}

/// The document's top-level object.
pub fn top_object(text: &str) -> Result<Object, ScanError> {
    let start = skip_ws(text.as_bytes(), 0);
    object_at(text, start)
}

/// How the file is laid out: the indentation unit and the line ending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Style {
    pub indent: String,
    pub newline: &'static str,
}

impl Style {
    /// Detects the indentation (tabs, or the smallest run of spaces that starts a line) and the
    /// line ending (CRLF if the file has one). Defaults: two spaces, LF.
    pub fn detect(text: &str) -> Style {
        let newline = if text.contains("\r\n") { "\r\n" } else { "\n" };
        let mut spaces: Option<usize> = None;
        for line in text.lines().skip(1) {
            let rest = line.trim_start_matches([' ', '\t']);
            if rest.is_empty() {
                continue;
            }
            if line.starts_with('\t') {
                return Style {
                    indent: "\t".into(),
                    newline,
                };
            }
            let n = line.len() - rest.len();
            if n > 0 {
                spaces = Some(spaces.map_or(n, |s| s.min(n)));
            }
        }
        Style {
            indent: " ".repeat(spaces.unwrap_or(2)),
            newline,
        }
    }
}

/// The whitespace that starts the line holding byte `at`.
fn line_indent(text: &str, at: usize) -> &str {
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = &text[start..];
    let n = line.len() - line.trim_start_matches([' ', '\t']).len();
    &line[..n]
}

/// `value` printed over several lines, each continuation line starting with `base`.
pub fn pretty(value: &Value, base: &str, style: &Style) -> String {
    use serde::Serialize;
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(style.indent.as_bytes());
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    // Serialising a serde_json::Value into memory cannot fail.
    if value.serialize(&mut ser).is_err() {
        return value.to_string();
    }
    let s = String::from_utf8_lossy(&out).into_owned();
    s.replace('\n', &format!("{}{base}", style.newline))
}

/// `text` with `"key": value` added as the last member of `obj`, laid out like its neighbours.
pub fn insert_member(text: &str, obj: &Object, key: &str, value: &Value, style: &Style) -> String {
    let key_json = Value::String(key.to_owned()).to_string();
    let mut out = String::with_capacity(text.len() + 128);
    if let Some(last) = obj.members.last() {
        // The whitespace before the last member's key, and what separates its key from its value.
        let lead_start = text[..last.key_start]
            .trim_end_matches([' ', '\t', '\n', '\r'])
            .len();
        let lead = &text[lead_start..last.key_start];
        let colon = &text[last.key_end..last.value_start];
        let value_text = if lead.contains('\n') {
            pretty(value, line_indent(text, last.key_start), style)
        } else {
            value.to_string()
        };
        out.push_str(&text[..last.value_end]);
        out.push(',');
        out.push_str(lead);
        out.push_str(&key_json);
        out.push_str(colon);
        out.push_str(&value_text);
        out.push_str(&text[last.value_end..]);
    } else {
        let base = line_indent(text, obj.open);
        let inner = format!("{base}{}", style.indent);
        out.push_str(&text[..=obj.open]);
        out.push_str(style.newline);
        out.push_str(&inner);
        out.push_str(&key_json);
        out.push_str(": ");
        out.push_str(&pretty(value, &inner, style));
        out.push_str(style.newline);
        out.push_str(base);
        out.push_str(&text[obj.close..]);
    }
    out
}

/// `text` with member `index` of `obj` removed, with the comma that joined it to a neighbour.
/// Removing the last member after `insert_member` added it gives back the original bytes.
pub fn remove_member(text: &str, obj: &Object, index: usize) -> String {
    let members = &obj.members;
    let (from, to) = if index > 0 {
        (members[index - 1].value_end, members[index].value_end)
    } else if members.len() > 1 {
        (members[0].key_start, members[1].key_start)
    } else {
        (obj.open + 1, obj.close)
    };
    format!("{}{}", &text[..from], &text[to..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scans_members_with_nested_values_and_escapes() {
        let t = r#" { "a" : [1, {"x": "}"}], "b\"c": "q\\", "d": null } "#;
        let o = top_object(t).expect("scan");
        let keys: Vec<_> = o.members.iter().map(|m| m.key.as_str()).collect();
        assert_eq!(keys, ["a", "b\"c", "d"]);
        let a = &o.members[0];
        assert_eq!(&t[a.value_start..a.value_end], r#"[1, {"x": "}"}]"#);
        assert_eq!(&t[o.members[2].value_start..o.members[2].value_end], "null");
        assert_eq!(&t[o.close..=o.close], "}");
    }

    #[test]
    fn empty_object() {
        let o = top_object("{ }").expect("scan");
        assert!(o.members.is_empty());
        assert_eq!((o.open, o.close), (0, 2));
    }

    #[test]
    fn style_detection() {
        assert_eq!(Style::detect("{\n\t\"a\": 1\n}\n").indent, "\t");
        assert_eq!(
            Style::detect("{\n    \"a\": {\n        \"b\": 1\n    }\n}").indent,
            "    "
        );
        assert_eq!(Style::detect("{\n  \"a\": 1\n}").indent, "  ");
        assert_eq!(Style::detect("{}").indent, "  ");
        assert_eq!(Style::detect("{\r\n  \"a\": 1\r\n}").newline, "\r\n");
    }

    #[test]
    fn insert_then_remove_is_identity() {
        let cases = [
            "{\n  \"a\": 1\n}\n",
            "{\n\t\"a\": [1, 2],\n\t\"b\": {\"c\": 3}\n}",
            "{\"a\":1}",
            "{ \"a\": 1 }\n",
            "{\r\n    \"a\": 1\r\n}\r\n",
        ];
        for t in cases {
            let style = Style::detect(t);
            let o = top_object(t).expect("scan");
            let added = insert_member(t, &o, "k", &json!({"x": {"p": "/q"}}), &style);
            let v: Value = serde_json::from_str(&added).expect("valid JSON after insert");
            assert_eq!(v["k"]["x"]["p"], "/q", "{added}");
            let o2 = top_object(&added).expect("scan");
            let (i, _) = o2.member("k").expect("k");
            assert_eq!(remove_member(&added, &o2, i), t);
        }
    }

    #[test]
    fn insert_keeps_neighbour_layout() {
        let t = "{\n    \"a\": 1\n}\n";
        let o = top_object(t).expect("scan");
        let out = insert_member(t, &o, "k", &json!({"x": 1}), &Style::detect(t));
        assert_eq!(
            out,
            "{\n    \"a\": 1,\n    \"k\": {\n        \"x\": 1\n    }\n}\n"
        );
    }

    #[test]
    fn insert_into_empty_nested_object() {
        let t = "{\n  \"r\": {}\n}";
        let top = top_object(t).expect("scan");
        let r = object_at(t, top.members[0].value_start).expect("scan");
        let out = insert_member(t, &r, "k", &json!(1), &Style::detect(t));
        assert_eq!(out, "{\n  \"r\": {\n    \"k\": 1\n  }\n}");
        let top = top_object(&out).expect("scan");
        let r = object_at(&out, top.members[0].value_start).expect("scan");
        assert_eq!(remove_member(&out, &r, 0), "{\n  \"r\": {}\n}");
    }

    #[test]
    fn remove_first_of_several() {
        let t = "{\"a\": 1, \"b\": 2}";
        let o = top_object(t).expect("scan");
        assert_eq!(remove_member(t, &o, 0), "{\"b\": 2}");
        assert_eq!(remove_member(t, &o, 1), "{\"a\": 1}");
    }

    #[test]
    fn scanner_refuses_broken_text() {
        assert!(top_object("{\"a\" 1}").is_err());
        assert!(top_object("{\"a\": 1").is_err());
        assert!(top_object("[1]").is_err());
    }
}
