//! containerd: the drop-in `conf.d/NAME.toml` that declares the runtime, and the main config's
//! top-level `imports`, edited with toml_edit so every other byte of it stays as it was.
//!
//! Version 2 configs (containerd 1.x) use the CRI plugin `io.containerd.grpc.v1.cri`; version 3
//! (containerd 2.x) uses `io.containerd.cri.v1.runtime`. containerd before 2.0 replaces a plugin's
//! whole section with the one an imported file declares (containerd issue #5837), so for version
//! 2 the drop-in carries a copy of the main config's CRI section with the runtime added; and a
//! configured `runtimes` table replaces containerd's default one (issue #9968), so the drop-in also
//! declares `runc` when the main config does not.

use serde_json::Value as J;
use toml_edit::{DocumentMut, ImDocument, Item, Key, TableLike, Value};

use super::glob;
use crate::problem::{Problem, line_col};

/// What the containerd registration needs, as paths on the target system.
#[derive(Debug, Clone)]
pub struct Containerd<'a> {
    /// The runtime name (`--name`).
    pub name: &'a str,
    /// PREFIX/bin/cuslice-runtime.
    pub runtime_path: &'a str,
    /// The drop-in's path, as written into `imports`.
    pub dropin_path: &'a str,
    /// The directory of the main config (relative `imports` are relative to it).
    pub config_dir: &'a str,
}

/// The two files after `install`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub main: String,
    pub dropin: String,
    /// The config version the drop-in was written for (2 or 3).
    pub version: i64,
}

/// The CRI plugin that holds runtimes, per config version.
pub fn cri_plugin(version: i64) -> &'static str {
    if version >= 3 {
        "io.containerd.cri.v1.runtime"
    } else {
        "io.containerd.grpc.v1.cri"
    }
}

const FIX_SYNTAX: &str = "fix the file (containerd would refuse it too), then run again";

fn toml_str(s: &str) -> String {
    Value::from(s).to_string()
}

fn at(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    match span {
        Some(r) => {
            let (l, c) = line_col(text, r.start);
            format!(" (line {l} column {c})")
        }
        None => String::new(),
    }
}

/// The main config as `install` creates it when it does not exist.
pub fn created_main(c: &Containerd<'_>) -> String {
    format!(
        "# Created by `cuslice install --engine containerd`: containerd's defaults plus cuslice's drop-in.\n\
         version = 2\n\
         imports = [{}]\n",
        toml_str(c.dropin_path)
    )
}

/// toml_edit's message ("invalid table header\nexpected `.`, `]`") on one line.
fn message(m: &str) -> String {
    m.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses the main config, with spans for messages.
fn parse(text: &str) -> Result<ImDocument<&str>, Problem> {
    ImDocument::parse(text).map_err(|e| {
        Problem::new(
            format!(
                "not valid TOML ({}{})",
                message(e.message()),
                at(text, e.span())
            ),
            FIX_SYNTAX,
        )
    })
}

/// The config's `version`, 2 or 3; anything else is refused.
fn version(text: &str, doc: &ImDocument<&str>) -> Result<i64, Problem> {
    let migrate = "migrate it to version 2 (containerd 1.x; `containerd config default` shows the \
                   layout) or 3 (containerd 2.x: `containerd config migrate`), then run again";
    match doc.get("version") {
        None => Err(Problem::new(
            "no `version` line, so this is a version 1 config; cuslice's drop-in and `imports` \
             need version 2 or later",
            migrate,
        )),
        Some(item) => match item.as_integer() {
            Some(v @ (2 | 3)) => Ok(v),
            Some(1) => Err(Problem::new(
                format!(
                    "`version = 1`{}; cuslice's drop-in and `imports` need version 2 or later",
                    at(text, item.span())
                ),
                migrate,
            )),
            Some(v) => Err(Problem::new(
                format!(
                    "`version = {v}`{} is not a config version cuslice knows",
                    at(text, item.span())
                ),
                "cuslice writes version 2 (containerd 1.x) and 3 (containerd 2.x) drop-ins; \
                 register the runtime by hand",
            )),
            None => Err(Problem::new(
                format!("`version`{} is not an integer", at(text, item.span())),
                "write e.g. `version = 2`, then run again",
            )),
        },
    }
}

/// The `imports` entries, checked to be an array of strings.
fn imports(text: &str, doc: &ImDocument<&str>) -> Result<Option<Vec<String>>, Problem> {
    let Some(item) = doc.get("imports") else {
        return Ok(None);
    };
    let bad = || {
        Problem::new(
            format!(
                "`imports`{} is not an array of strings",
                at(text, item.span())
            ),
            "make it e.g. imports = [\"/etc/containerd/conf.d/*.toml\"], then run again",
        )
    };
    let arr = item.as_array().ok_or_else(bad)?;
    arr.iter()
        .map(|v| v.as_str().map(str::to_owned).ok_or_else(bad))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Whether an `imports` entry (a path or a pattern) already loads the drop-in.
fn loads(entry: &str, c: &Containerd<'_>) -> bool {
    let full = if entry.starts_with('/') {
        entry.to_owned()
    } else {
        format!("{}/{entry}", c.config_dir.trim_end_matches('/'))
    };
    full == c.dropin_path || glob::matches(&full, c.dropin_path)
}

/// A TOML item as plain data, to compare two layouts of the same content.
pub fn plain(item: &Item) -> J {
    match item {
        Item::None => J::Null,
        Item::Value(v) => plain_value(v),
        Item::Table(t) => plain_table(t),
        Item::ArrayOfTables(a) => J::Array(a.iter().map(|t| plain_table(t)).collect()),
    }
}

fn plain_table(t: &dyn TableLike) -> J {
    J::Object(t.iter().map(|(k, v)| (k.to_owned(), plain(v))).collect())
}

fn plain_value(v: &Value) -> J {
    match v {
        Value::String(s) => J::String(s.value().clone()),
        Value::Integer(i) => J::from(*i.value()),
        Value::Float(f) => J::String(f.value().to_string()),
        Value::Boolean(b) => J::Bool(*b.value()),
        Value::Datetime(d) => J::String(d.value().to_string()),
        Value::Array(a) => J::Array(a.iter().map(plain_value).collect()),
        Value::InlineTable(t) => plain_table(t),
    }
}

/// Drops empty tables (tables that only held what was taken out), recursively.
fn prune(v: &mut J) {
    if let J::Object(m) = v {
        for x in m.values_mut() {
            prune(x);
        }
        m.retain(|_, x| !matches!(x, J::Object(o) if o.is_empty()));
    }
}

/// `item[path...]` through tables and inline tables.
fn lookup<'i>(item: &'i Item, path: &[&str]) -> Option<&'i Item> {
    let mut cur = item;
    for key in path {
        cur = cur.as_table_like()?.get(key)?;
    }
    Some(cur)
}

/// The drop-in for `version`, given the main config's CRI section (`cri`) if it has one.
fn dropin(c: &Containerd<'_>, version: i64, cri: Option<&Item>) -> Result<String, Problem> {
    let plugin = cri_plugin(version);
    let table = |runtime: &str| {
        format!(
            "plugins.{}.containerd.runtimes.{}",
            toml_str(plugin),
            Key::new(runtime).display_repr()
        )
    };
    let mut out = format!(
        "# Written by `cuslice install --engine containerd`; `cuslice uninstall --engine containerd` removes it.\n\
         # Kubernetes selects this runtime with a RuntimeClass whose handler is {:?}.\n",
        c.name
    );
    let copy = if version == 2 { cri } else { None };
    if copy.is_some() {
        out.push_str(
            "# containerd 1.x replaces the main config's CRI section with an imported one, so this\n\
             # is a copy of config.toml's, plus the runtime: run install again after editing that.\n",
        );
    }
    out.push_str(&format!("version = {version}\n"));
    if let Some(cri) = copy {
        let mut cri = cri.clone();
        if let Some(t) = cri.as_table_mut() {
            t.set_implicit(false);
            t.set_dotted(false);
            t.decor_mut().clear();
        }
        if let Some(rt) = cri
            .as_table_like_mut()
            .and_then(|t| t.get_mut("containerd"))
            .and_then(Item::as_table_like_mut)
            .and_then(|t| t.get_mut("runtimes"))
            .and_then(Item::as_table_like_mut)
        {
            rt.remove(c.name);
        }
        let mut doc = DocumentMut::new();
        let mut plugins = toml_edit::Table::new();
        plugins.set_implicit(true);
        plugins.insert(plugin, cri);
        doc.insert("plugins", Item::Table(plugins));
        out.push('\n');
        out.push_str(doc.to_string().trim_start_matches('\n'));
    }
    // container_annotations: the CRI passes a container's `cdi.k8s.io/` annotations into its
    // OCI spec only for a runtime that lists them; cuslice-runtime applies the CDI devices they
    // name (containerd 1.6 does not apply CDI itself).
    out.push_str(&format!(
        "\n[{}]\n  runtime_type = \"io.containerd.runc.v2\"\n  container_annotations = [\"{}*\"]\n\n[{}.options]\n  BinaryName = {}\n",
        table(c.name),
        cuslice_cdi::ANNOTATION_PREFIX,
        table(c.name),
        toml_str(c.runtime_path)
    ));
    let has_runc = cri.is_some_and(|i| lookup(i, &["containerd", "runtimes", "runc"]).is_some());
    if !has_runc && c.name != "runc" {
        out.push_str(&format!(
            "\n# A configured `runtimes` table replaces containerd's default one: keep runc.\n\
             [{}]\n  runtime_type = \"io.containerd.runc.v2\"\n",
            table("runc")
        ));
    }

    // The drop-in must parse and say what it should: the copied section (minus any old entry
    // under our name) plus our runtime.
    let check: DocumentMut = out.parse().map_err(|e: toml_edit::TomlError| {
        Problem::new(
            format!(
                "could not copy its CRI section into the drop-in ({})",
                message(e.message())
            ),
            "declare the runtime in config.toml by hand (see docs/install.md)",
        )
    })?;
    let ours = lookup(
        check.as_item(),
        &["plugins", plugin, "containerd", "runtimes", c.name],
    );
    let binary = ours.and_then(|i| lookup(i, &["options", "BinaryName"]));
    if binary.and_then(Item::as_str) != Some(c.runtime_path) {
        return Err(Problem::new(
            "could not declare the runtime in a drop-in for this config's layout",
            "declare the runtime in config.toml by hand (see docs/install.md)",
        ));
    }
    if let Some(cri) = copy {
        let mut want = plain(cri);
        let mut got = lookup(check.as_item(), &["plugins", plugin])
            .map(plain)
            .unwrap_or(J::Null);
        for v in [&mut want, &mut got] {
            if let Some(rt) = v
                .pointer_mut("/containerd/runtimes")
                .and_then(J::as_object_mut)
            {
                rt.remove(c.name);
                if !has_runc {
                    rt.remove("runc");
                }
            }
        }
        prune(&mut want);
        prune(&mut got);
        if want != got {
            return Err(Problem::new(
                "could not copy its CRI section into the drop-in faithfully (an unusual layout)",
                "declare the runtime in config.toml by hand (see docs/install.md)",
            ));
        }
    }
    Ok(out)
}

/// Both files after `install`. `old_main` is None when config.toml does not exist.
pub fn install(old_main: Option<&str>, c: &Containerd<'_>) -> Result<Installed, Problem> {
    let Some(old) = old_main else {
        return Ok(Installed {
            main: created_main(c),
            dropin: dropin(c, 2, None)?,
            version: 2,
        });
    };
    let im = parse(old)?;
    let version = version(old, &im)?;
    let entries = imports(old, &im)?;
    // Copied from the editable document: its formatting no longer refers into `old`.
    let mut doc: DocumentMut = im.clone().into_mut();
    let cri = lookup(doc.as_item(), &["plugins", cri_plugin(version)]);
    let dropin = dropin(c, version, cri)?;

    if entries
        .as_ref()
        .is_some_and(|e| e.iter().any(|x| loads(x, c)))
    {
        return Ok(Installed {
            main: old.to_owned(),
            dropin,
            version,
        });
    }
    match doc.get_mut("imports").and_then(Item::as_array_mut) {
        Some(arr) => {
            let mut v = Value::from(c.dropin_path);
            let n = arr.len();
            let lead = |i: usize, arr: &toml_edit::Array| -> String {
                arr.get(i)
                    .and_then(|x| x.decor().prefix())
                    .and_then(|p| p.as_str())
                    .unwrap_or("")
                    .to_owned()
            };
            let prefix = match n {
                0 => String::new(),
                1 => {
                    let p = lead(0, arr);
                    if p.contains('\n') { p } else { " ".to_owned() }
                }
                _ => lead(n - 1, arr),
            };
            v.decor_mut().set_prefix(prefix);
            // Whitespace before `]` belongs to the last value (without a trailing comma): it
            // moves to the new last value.
            if let Some(last) = n.checked_sub(1).and_then(|i| arr.get_mut(i)) {
                let suffix = last
                    .decor()
                    .suffix()
                    .and_then(|s| s.as_str())
                    .unwrap_or("")
                    .to_owned();
                if !suffix.is_empty() {
                    last.decor_mut().set_suffix("");
                    v.decor_mut().set_suffix(suffix);
                }
            }
            arr.push_formatted(v);
        }
        None => {
            let mut arr = toml_edit::Array::new();
            arr.push(c.dropin_path);
            doc.insert("imports", toml_edit::value(arr));
        }
    }
    Ok(Installed {
        main: doc.to_string(),
        dropin,
        version,
    })
}

/// config.toml after `uninstall`: the `imports` entry equal to the drop-in's path removed (the key
/// too when nothing else is left in it); None when the file should not exist (it did not, or it
/// is exactly what install creates from nothing).
pub fn uninstall(old_main: Option<&str>, c: &Containerd<'_>) -> Result<Option<String>, Problem> {
    let Some(old) = old_main else { return Ok(None) };
    if old == created_main(c) {
        return Ok(None);
    }
    let im = parse(old)?;
    let Some(entries) = imports(old, &im).ok().flatten() else {
        return Ok(Some(old.to_owned()));
    };
    if !entries.iter().any(|e| e == c.dropin_path) {
        return Ok(Some(old.to_owned()));
    }
    let mut doc: DocumentMut = im.clone().into_mut();
    let mut now_empty = false;
    if let Some(arr) = doc.get_mut("imports").and_then(Item::as_array_mut) {
        for i in (0..arr.len()).rev() {
            if arr.get(i).and_then(Value::as_str) == Some(c.dropin_path) {
                let removed = arr.remove(i);
                let suffix = removed
                    .decor()
                    .suffix()
                    .and_then(|s| s.as_str())
                    .unwrap_or("")
                    .to_owned();
                // Give the whitespace before `]` back to the new last value.
                if i == arr.len()
                    && !suffix.is_empty()
                    && let Some(prev) = i.checked_sub(1).and_then(|j| arr.get_mut(j))
                {
                    prev.decor_mut().set_suffix(suffix);
                }
            }
        }
        now_empty = arr.is_empty();
    }
    if now_empty {
        doc.remove("imports");
    }
    Ok(Some(doc.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Containerd<'static> = Containerd {
        name: "cuslice",
        runtime_path: "/usr/local/bin/cuslice-runtime",
        dropin_path: "/etc/containerd/conf.d/cuslice.toml",
        config_dir: "/etc/containerd",
    };

    fn roundtrip(before: &str) -> Installed {
        let after = install(Some(before), &C).expect("install");
        let again = install(Some(&after.main), &C).expect("install twice");
        assert_eq!(again, after, "idempotent");
        assert_eq!(
            uninstall(Some(&after.main), &C)
                .expect("uninstall")
                .as_deref(),
            Some(before),
            "uninstall restores"
        );
        after
    }

    fn runtime_of(dropin: &str, version: i64) -> J {
        let doc: DocumentMut = dropin.parse().expect("drop-in parses");
        lookup(
            doc.as_item(),
            &["plugins", cri_plugin(version), "containerd", "runtimes"],
        )
        .map(plain)
        .expect("runtimes")
    }

    #[test]
    fn comments_and_other_plugins_v2() {
        let before = r#"# containerd config, managed by hand
version = 2
root = "/var/lib/containerd"   # where images live

[grpc]
  address = "/run/containerd/containerd.sock"

# The CRI plugin
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
"#;
        let after = roundtrip(before);
        assert_eq!(after.version, 2);
        assert_eq!(
            after.main,
            before.replace(
                "   # where images live\n",
                "   # where images live\nimports = [\"/etc/containerd/conf.d/cuslice.toml\"]\n"
            )
        );
        // The drop-in: a copy of the CRI section plus the runtime.
        let rt = runtime_of(&after.dropin, 2);
        assert_eq!(rt["runc"]["options"]["SystemdCgroup"], true);
        assert_eq!(
            rt["cuslice"]["options"]["BinaryName"],
            "/usr/local/bin/cuslice-runtime"
        );
        assert_eq!(rt["cuslice"]["runtime_type"], "io.containerd.runc.v2");
        assert_eq!(
            rt["cuslice"]["container_annotations"],
            serde_json::json!(["cdi.k8s.io/*"])
        );
        let doc: DocumentMut = after.dropin.parse().expect("parses");
        assert_eq!(
            doc["plugins"]["io.containerd.grpc.v1.cri"]["sandbox_image"].as_str(),
            Some("registry.k8s.io/pause:3.9")
        );
        assert_eq!(doc["version"].as_integer(), Some(2));
        assert!(doc.get("grpc").is_none(), "only the CRI section is copied");
    }

    #[test]
    fn existing_imports_one_line_and_multi_line() {
        let one = "version = 2\nimports = [\"/etc/containerd/other.toml\"]\n";
        let after = roundtrip(one);
        assert_eq!(
            after.main,
            "version = 2\nimports = [\"/etc/containerd/other.toml\", \"/etc/containerd/conf.d/cuslice.toml\"]\n"
        );
        let multi = "version = 2\nimports = [\n  \"/a.toml\",\n  \"/b.toml\",\n]\n";
        let after = roundtrip(multi);
        assert_eq!(
            after.main,
            "version = 2\nimports = [\n  \"/a.toml\",\n  \"/b.toml\",\n  \"/etc/containerd/conf.d/cuslice.toml\",\n]\n"
        );
        let no_comma = "version = 2\nimports = [\n  \"/a.toml\"\n]\n";
        let after = roundtrip(no_comma);
        assert_eq!(
            after.main,
            "version = 2\nimports = [\n  \"/a.toml\",\n  \"/etc/containerd/conf.d/cuslice.toml\"\n]\n"
        );
        // An empty array cuslice filled goes away with its entry (uninstall cannot tell it from
        // one it created).
        let empty = "version = 2\nimports = []\n# end\n";
        let after = install(Some(empty), &C).expect("install");
        assert_eq!(
            after.main,
            "version = 2\nimports = [\"/etc/containerd/conf.d/cuslice.toml\"]\n# end\n"
        );
        assert_eq!(
            uninstall(Some(&after.main), &C)
                .expect("uninstall")
                .as_deref(),
            Some("version = 2\n# end\n")
        );
    }

    #[test]
    fn glob_already_present_is_no_change() {
        for before in [
            "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n",
            "version = 2\nimports = [\"conf.d/*.toml\"]\n",
            "version = 2\nimports = [\"/etc/containerd/conf.d/cuslice.toml\"]\n",
        ] {
            let after = install(Some(before), &C).expect("install");
            assert_eq!(after.main, before);
            // Uninstall removes only an entry equal to the drop-in's path.
            let undone = uninstall(Some(before), &C).expect("uninstall");
            if before.contains("cuslice.toml") {
                assert_eq!(undone.as_deref(), Some("version = 2\n"));
            } else {
                assert_eq!(undone.as_deref(), Some(before));
            }
        }
    }

    #[test]
    fn version_3_uses_the_containerd_2_plugin() {
        let before = "version = 3\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = 'io.containerd.runc.v2'\n";
        let after = roundtrip(before);
        assert_eq!(after.version, 3);
        assert!(
            after
                .dropin
                .contains("[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.cuslice]"),
            "{}",
            after.dropin
        );
        assert!(!after.dropin.contains("grpc.v1.cri"));
        assert!(
            !after.dropin.contains("runtimes.runc]"),
            "runc is in config.toml"
        );
        let rt = runtime_of(&after.dropin, 3);
        assert_eq!(
            rt["cuslice"]["options"]["BinaryName"],
            "/usr/local/bin/cuslice-runtime"
        );
        assert_eq!(
            after
                .dropin
                .lines()
                .filter(|l| l.starts_with("version"))
                .count(),
            1
        );
        assert!(after.dropin.contains("version = 3\n"));
    }

    #[test]
    fn missing_file_is_created_and_removed() {
        let after = install(None, &C).expect("install");
        assert_eq!(after.main, created_main(&C));
        assert!(after.main.contains("version = 2\n"));
        assert_eq!(install(Some(&after.main), &C).expect("again"), after);
        assert_eq!(uninstall(Some(&after.main), &C).expect("uninstall"), None);
        assert_eq!(uninstall(None, &C).expect("uninstall"), None);
        // No CRI section anywhere: the drop-in keeps runc.
        let rt = runtime_of(&after.dropin, 2);
        assert_eq!(rt["runc"]["runtime_type"], "io.containerd.runc.v2");
        assert_eq!(
            after.dropin,
            "# Written by `cuslice install --engine containerd`; `cuslice uninstall --engine containerd` removes it.\n\
             # Kubernetes selects this runtime with a RuntimeClass whose handler is \"cuslice\".\n\
             version = 2\n\
             \n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.cuslice]\n\
             \x20 runtime_type = \"io.containerd.runc.v2\"\n\
             \x20 container_annotations = [\"cdi.k8s.io/*\"]\n\
             \n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.cuslice.options]\n\
             \x20 BinaryName = \"/usr/local/bin/cuslice-runtime\"\n\
             \n\
             # A configured `runtimes` table replaces containerd's default one: keep runc.\n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n\
             \x20 runtime_type = \"io.containerd.runc.v2\"\n"
        );
    }

    #[test]
    fn old_entry_under_our_name_is_replaced_in_the_copy() {
        let before = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.cuslice]\n  runtime_type = \"io.containerd.runc.v2\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.cuslice.options]\n    BinaryName = \"/old/cuslice-runtime\"\n";
        let after = roundtrip(before);
        let rt = runtime_of(&after.dropin, 2);
        assert_eq!(
            rt["cuslice"]["options"]["BinaryName"],
            "/usr/local/bin/cuslice-runtime"
        );
        assert_eq!(rt["runc"]["runtime_type"], "io.containerd.runc.v2");
    }

    #[test]
    fn dotted_and_inline_layouts() {
        let dotted =
            "version = 2\nplugins.\"io.containerd.grpc.v1.cri\".sandbox_image = \"pause:3.9\"\n";
        let after = roundtrip(dotted);
        let doc: DocumentMut = after.dropin.parse().expect("parses");
        assert_eq!(
            doc["plugins"]["io.containerd.grpc.v1.cri"]["sandbox_image"].as_str(),
            Some("pause:3.9")
        );
        // An inline runtimes table cannot take another table: refused, nothing written.
        let inline = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nruntimes = { runc = { runtime_type = \"io.containerd.runc.v2\" } }\n";
        let e = install(Some(inline), &C).expect_err("inline");
        assert!(e.fix.contains("by hand"), "{e}");
    }

    #[test]
    fn refusals() {
        let cases = [
            ("version = 2\n[plugins\n", "not valid TOML"),
            ("[plugins]\n", "version 1 config"),
            ("version = 1\n", "`version = 1`"),
            ("version = 4\n", "`version = 4`"),
            ("version = \"2\"\n", "not an integer"),
            (
                "version = 2\nimports = \"/etc/x.toml\"\n",
                "not an array of strings",
            ),
            ("version = 2\nimports = [1]\n", "not an array of strings"),
        ];
        for (text, want) in cases {
            let e = install(Some(text), &C).expect_err(text);
            assert!(e.what.contains(want), "{text}: {e}");
            assert!(!e.to_string().contains('\n'), "{e}");
        }
        let e = install(Some("version = 2\nimports = 5\n"), &C).expect_err("imports");
        assert!(e.what.contains("line 2 column"), "{e}");
        let e = install(Some("version = 2\nx = = 1\n"), &C).expect_err("syntax");
        assert!(e.what.contains("line 2 column"), "{e}");
    }

    #[test]
    fn quoted_runtime_names() {
        let c = Containerd {
            name: "cuslice.v2",
            ..C
        };
        let after = install(None, &c).expect("install");
        assert!(
            after.dropin.contains("runtimes.\"cuslice.v2\"]"),
            "{}",
            after.dropin
        );
        let rt = runtime_of(&after.dropin, 2);
        assert!(rt.get("cuslice.v2").is_some());
    }
}
