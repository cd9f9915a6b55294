//! `/etc/docker/daemon.json`: the `runtimes.NAME` entry and, on request, `default-runtime`.
//!
//! serde_json (with `preserve_order`) parses and checks the file; the change itself is spliced
//! into the text (see `jsonedit`), in the file's indentation and line endings, so every other byte
//! stays as it was and uninstall gives back the original bytes.

use serde_json::{Value, json};

use super::jsonedit::{self, Object, Style};
use crate::problem::{Problem, line_col};

/// What goes into daemon.json.
#[derive(Debug, Clone)]
pub struct Docker<'a> {
    /// The runtime name (`--name`).
    pub name: &'a str,
    /// PREFIX/bin/cuslice-runtime.
    pub runtime_path: &'a str,
    /// Also set `default-runtime` (install only).
    pub default_runtime: bool,
}

const FIX_SYNTAX: &str =
    "fix the file (dockerd would refuse it too) or move it away, then run again";

/// A member's line and column, for messages.
fn at(text: &str, offset: usize) -> String {
    let (l, c) = line_col(text, offset);
    format!("line {l} column {c}")
}

/// Parses and checks the parts cuslice touches; returns the top-level object's span.
fn parse(text: &str) -> Result<Object, Problem> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| Problem::new(format!("not valid JSON ({e})"), FIX_SYNTAX))?;
    if !value.is_object() {
        return Err(Problem::new(
            "the top level is not a JSON object",
            "daemon.json must be an object like {\"runtimes\": {}}; fix or move the file, then run again",
        ));
    }
    let top = jsonedit::top_object(text).map_err(|e| {
        Problem::new(
            format!("could not locate the members ({})", at(text, e.0)),
            FIX_SYNTAX,
        )
    })?;
    if let Some((_, m)) = top.member("runtimes")
        && text.as_bytes()[m.value_start] != b'{'
    {
        return Err(Problem::new(
            format!(
                "\"runtimes\" is not an object ({})",
                at(text, m.value_start)
            ),
            "make it an object of runtimes like {\"runc\": {\"path\": \"runc\"}}, then run again",
        ));
    }
    Ok(top)
}

/// The `runtimes` object, if there is one.
fn runtimes(text: &str, top: &Object) -> Result<Option<Object>, Problem> {
    match top.member("runtimes") {
        None => Ok(None),
        Some((_, m)) => jsonedit::object_at(text, m.value_start)
            .map(Some)
            .map_err(|e| {
                Problem::new(
                    format!("could not locate \"runtimes\" ({})", at(text, e.0)),
                    FIX_SYNTAX,
                )
            }),
    }
}

/// The `path` of the entry at `m`, or None when it is not an object with a string `path`.
fn entry_path(text: &str, m: &jsonedit::Member) -> Option<String> {
    let v: Value = serde_json::from_str(&text[m.value_start..m.value_end]).ok()?;
    v.get("path")?.as_str().map(str::to_owned)
}

/// The string value of a member, if it is a string.
fn string_value(text: &str, m: &jsonedit::Member) -> Option<String> {
    serde_json::from_str::<Value>(&text[m.value_start..m.value_end])
        .ok()?
        .as_str()
        .map(str::to_owned)
}

/// The PREFIX an entry's path was installed with, when it looks like cuslice's.
fn installed_prefix(path: &str) -> Option<&str> {
    path.strip_suffix("/bin/cuslice-runtime")
        .map(|p| if p.is_empty() { "/" } else { p })
}

/// daemon.json after `install`. `old` is None when the file does not exist.
pub fn install(old: Option<&str>, d: &Docker<'_>) -> Result<String, Problem> {
    let entry = json!({ "path": d.runtime_path });
    let old = match old {
        Some(t) if !t.trim().is_empty() => t,
        _ => {
            // A new file (or an empty one, which dockerd reads as no settings).
            let mut map = serde_json::Map::new();
            map.insert("runtimes".into(), json!({ d.name: entry }));
            if d.default_runtime {
                map.insert("default-runtime".into(), json!(d.name));
            }
            let style = Style {
                indent: "  ".into(),
                newline: "\n",
            };
            return Ok(format!(
                "{}\n",
                jsonedit::pretty(&Value::Object(map), "", &style)
            ));
        }
    };
    let style = Style::detect(old);
    let top = parse(old)?;
    let mut text = old.to_owned();

    // Check everything first, then splice.
    let mut add_entry = true;
    if let Some(rt) = runtimes(old, &top)?
        && let Some((_, m)) = rt.member(d.name)
    {
        match entry_path(old, m) {
            Some(p) if p == d.runtime_path => add_entry = false,
            Some(p) => {
                return Err(Problem::new(
                    format!(
                        "runtimes.{} already points to {p} ({}), not {}",
                        d.name,
                        at(old, m.key_start),
                        d.runtime_path
                    ),
                    format!(
                        "run `cuslice uninstall --engine docker{}` first, or install under \
                             another name with --name",
                        installed_prefix(&p)
                            .map(|x| format!(" --prefix {x}"))
                            .unwrap_or_default()
                    ),
                ));
            }
            None => {
                return Err(Problem::new(
                    format!(
                        "runtimes.{} exists but is not an object with a \"path\" ({})",
                        d.name,
                        at(old, m.key_start)
                    ),
                    "remove that entry, or install under another name with --name",
                ));
            }
        }
    }
    let mut add_default = false;
    if d.default_runtime {
        match top.member("default-runtime") {
            None => add_default = true,
            Some((_, m)) => match string_value(old, m) {
                Some(v) if v == d.name => {}
                other => {
                    let shown = other.map_or_else(
                        || old[m.value_start..m.value_end].to_owned(),
                        |v| format!("{v:?}"),
                    );
                    return Err(Problem::new(
                        format!(
                            "\"default-runtime\" is already {shown} ({})",
                            at(old, m.key_start)
                        ),
                        "remove it first if cuslice should be the default (uninstall would not \
                         restore it), or install without --default-runtime",
                    ));
                }
            },
        }
    }

    if add_entry {
        let top = parse(&text)?;
        text = match runtimes(&text, &top)? {
            None => {
                jsonedit::insert_member(&text, &top, "runtimes", &json!({ d.name: entry }), &style)
            }
            Some(rt) => jsonedit::insert_member(&text, &rt, d.name, &entry, &style),
        };
    }
    if add_default {
        let top = parse(&text)?;
        text = jsonedit::insert_member(&text, &top, "default-runtime", &json!(d.name), &style);
    }
    Ok(text)
}

/// daemon.json after `uninstall`: None when the file should not exist (it did not, or it would
/// hold nothing but `{}` once cuslice's entries are gone).
pub fn uninstall(old: Option<&str>, d: &Docker<'_>) -> Result<Option<String>, Problem> {
    let Some(old) = old else { return Ok(None) };
    if old.trim().is_empty() {
        return Ok(Some(old.to_owned()));
    }
    let top = parse(old)?;

    // Check: an entry under our name that points elsewhere is not ours to remove.
    let mut remove_entry = false;
    if let Some(rt) = runtimes(old, &top)?
        && let Some((_, m)) = rt.member(d.name)
    {
        match entry_path(old, m) {
            Some(p) if p == d.runtime_path => remove_entry = true,
            other => {
                let p = other.unwrap_or_else(|| old[m.value_start..m.value_end].to_owned());
                return Err(Problem::new(
                    format!(
                        "runtimes.{} points to {p} ({}), not {}, so cuslice did not install it \
                             with this --prefix",
                        d.name,
                        at(old, m.key_start),
                        d.runtime_path
                    ),
                    format!(
                        "run uninstall with the --prefix it was installed with{}, or remove \
                             the entry by hand",
                        installed_prefix(&p)
                            .map(|x| format!(" (--prefix {x})"))
                            .unwrap_or_default()
                    ),
                ));
            }
        }
    }
    let remove_default = top
        .member("default-runtime")
        .and_then(|(_, m)| string_value(old, m))
        .is_some_and(|v| v == d.name);
    if !remove_entry && !remove_default {
        return Ok(Some(old.to_owned()));
    }

    // Undo in the reverse order of install: default-runtime, then the entry.
    let mut text = old.to_owned();
    if remove_default {
        let top = parse(&text)?;
        if let Some((i, _)) = top.member("default-runtime") {
            text = jsonedit::remove_member(&text, &top, i);
        }
    }
    if remove_entry {
        let top = parse(&text)?;
        if let Some(rt) = runtimes(&text, &top)?
            && let Some((i, _)) = rt.member(d.name)
        {
            text = if rt.members.len() == 1 {
                // The whole "runtimes" member goes: install added it with this entry.
                match top.member("runtimes") {
                    Some((ti, _)) => jsonedit::remove_member(&text, &top, ti),
                    None => text,
                }
            } else {
                jsonedit::remove_member(&text, &rt, i)
            };
        }
    }
    let top = parse(&text)?;
    if top.members.is_empty() {
        return Ok(None);
    }
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Docker<'static> = Docker {
        name: "cuslice",
        runtime_path: "/usr/local/bin/cuslice-runtime",
        default_runtime: false,
    };
    const DD: Docker<'static> = Docker {
        default_runtime: true,
        ..D
    };

    fn roundtrip(before: &str, d: &Docker<'_>) -> String {
        let after = install(Some(before), d).expect("install");
        assert_eq!(
            install(Some(&after), d).expect("install twice"),
            after,
            "idempotent"
        );
        let undone = uninstall(Some(&after), d).expect("uninstall");
        assert_eq!(undone.as_deref(), Some(before), "uninstall restores");
        after
    }

    #[test]
    fn other_keys_and_another_runtime_two_spaces() {
        let before = r#"{
  "log-driver": "json-file",
  "dns": ["8.8.8.8", "1.1.1.1"],
  "runtimes": {
    "nvidia": {
      "path": "nvidia-container-runtime",
      "runtimeArgs": []
    }
  },
  "storage-driver": "overlay2"
}
"#;
        let after = roundtrip(before, &D);
        assert_eq!(
            after,
            r#"{
  "log-driver": "json-file",
  "dns": ["8.8.8.8", "1.1.1.1"],
  "runtimes": {
    "nvidia": {
      "path": "nvidia-container-runtime",
      "runtimeArgs": []
    },
    "cuslice": {
      "path": "/usr/local/bin/cuslice-runtime"
    }
  },
  "storage-driver": "overlay2"
}
"#
        );
    }

    #[test]
    fn tabs_and_no_trailing_newline() {
        let before = "{\n\t\"debug\": true\n}";
        let after = roundtrip(before, &D);
        assert_eq!(
            after,
            "{\n\t\"debug\": true,\n\t\"runtimes\": {\n\t\t\"cuslice\": {\n\t\t\t\"path\": \"/usr/local/bin/cuslice-runtime\"\n\t\t}\n\t}\n}"
        );
    }

    #[test]
    fn four_spaces_with_default_runtime() {
        let before = "{\n    \"debug\": true\n}\n";
        let after = roundtrip(before, &DD);
        assert_eq!(
            after,
            "{\n    \"debug\": true,\n    \"runtimes\": {\n        \"cuslice\": {\n            \"path\": \"/usr/local/bin/cuslice-runtime\"\n        }\n    },\n    \"default-runtime\": \"cuslice\"\n}\n"
        );
    }

    #[test]
    fn missing_file_is_created_and_removed_again() {
        let after = install(None, &D).expect("install");
        assert_eq!(
            after,
            "{\n  \"runtimes\": {\n    \"cuslice\": {\n      \"path\": \"/usr/local/bin/cuslice-runtime\"\n    }\n  }\n}\n"
        );
        assert_eq!(install(Some(&after), &D).expect("again"), after);
        assert_eq!(uninstall(Some(&after), &D).expect("uninstall"), None);
        let with_default = install(None, &DD).expect("install");
        assert!(with_default.contains("\"default-runtime\": \"cuslice\""));
        assert_eq!(uninstall(Some(&with_default), &D).expect("uninstall"), None);
        assert_eq!(uninstall(None, &D).expect("uninstall"), None);
    }

    #[test]
    fn empty_object_and_one_line_files() {
        // A file that holds nothing else once cuslice's entry is gone is removed.
        let after = install(Some("{}\n"), &D).expect("install");
        assert_eq!(uninstall(Some(&after), &D).expect("uninstall"), None);
        let one = roundtrip("{\"debug\":true}", &D);
        assert_eq!(
            one,
            "{\"debug\":true,\"runtimes\":{\"cuslice\":{\"path\":\"/usr/local/bin/cuslice-runtime\"}}}"
        );
        roundtrip("{\"runtimes\": {\"runc\": {\"path\": \"runc\"}}}\n", &D);
        // An empty "runtimes" that cuslice filled goes away with its entry (uninstall cannot
        // tell it from one install added).
        let after = install(Some("{\"debug\": true, \"runtimes\": {}}"), &D).expect("install");
        assert_eq!(
            uninstall(Some(&after), &D).expect("uninstall").as_deref(),
            Some("{\"debug\": true}")
        );
    }

    #[test]
    fn crlf_file() {
        roundtrip("{\r\n  \"debug\": true\r\n}\r\n", &DD);
    }

    #[test]
    fn already_installed_is_no_change() {
        let t = "{\n  \"runtimes\": {\n    \"cuslice\": {\n      \"path\": \"/usr/local/bin/cuslice-runtime\"\n    }\n  }\n}\n";
        assert_eq!(install(Some(t), &D).expect("install"), t);
    }

    #[test]
    fn refusals() {
        let cases: [(&str, &str); 6] = [
            ("{\"a\": 1,}", "not valid JSON"),
            ("[1, 2]", "top level is not a JSON object"),
            ("{\"runtimes\": []}", "\"runtimes\" is not an object"),
            (
                "{\"runtimes\": {\"cuslice\": {\"path\": \"/opt/cs/bin/cuslice-runtime\"}}}",
                "already points to /opt/cs/bin/cuslice-runtime",
            ),
            (
                "{\"runtimes\": {\"cuslice\": \"x\"}}",
                "not an object with a \"path\"",
            ),
            ("{\"default-runtime\": \"nvidia\"}", "already \"nvidia\""),
        ];
        for (text, want) in cases {
            let e = install(Some(text), &DD).expect_err(text);
            assert!(e.what.contains(want), "{text}: {e}");
            assert!(!e.to_string().contains('\n'));
        }
        let e = install(Some("{\n  \"a\": 1,\n}"), &D).expect_err("bad");
        assert!(e.what.contains("line 3 column 1"), "{e}");
        let e = install(
            Some("{\"runtimes\": {\"cuslice\": {\"path\": \"/opt/cs/bin/cuslice-runtime\"}}}"),
            &D,
        )
        .expect_err("other path");
        assert!(e.fix.contains("--prefix /opt/cs"), "{e}");
    }

    #[test]
    fn uninstall_leaves_what_is_not_ours() {
        let other = "{\"runtimes\": {\"cuslice\": {\"path\": \"/opt/bin/cuslice-runtime\"}}}";
        let e = uninstall(Some(other), &D).expect_err("not ours");
        assert!(e.what.contains("points to /opt/bin/cuslice-runtime"), "{e}");
        let t = "{\"default-runtime\": \"runc\", \"debug\": true}\n";
        assert_eq!(uninstall(Some(t), &D).expect("no-op").as_deref(), Some(t));
        let t = "{}";
        assert_eq!(uninstall(Some(t), &D).expect("no-op").as_deref(), Some(t));
    }

    #[test]
    fn uninstall_removes_default_runtime_naming_us() {
        let t = "{\n  \"debug\": true,\n  \"default-runtime\": \"cuslice\"\n}\n";
        assert_eq!(
            uninstall(Some(t), &D).expect("uninstall").as_deref(),
            Some("{\n  \"debug\": true\n}\n")
        );
    }
}
