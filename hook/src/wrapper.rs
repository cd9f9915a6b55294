//! `cuslice-runtime`: a runtime for engines that cannot be given a hook by configuration (Docker's
//! `runtimes`, containerd's runtime `BinaryName`). On `create` and `run` it adds `cuslice-hook` to
//! the bundle's config.json when the container mentions cuslice; then, for every command, it
//! execs the real runtime (runc by default) with the arguments it was given, untouched.
//!
//! Its own options come first and are removed before the real runtime sees the arguments:
//! `--cuslice-runtime=PATH` (the real runtime), `--cuslice-hook=PATH` (default: `cuslice-hook`
//! beside this executable), `--cuslice-hook-arg=ARG` (repeatable: extra hook arguments, e.g.
//! `--library=/opt/cuslice/libcuslice.so`). Docker passes them with `runtimeArgs`.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Args {
    pub runtime: Option<OsString>,
    pub hook: Option<PathBuf>,
    pub hook_args: Vec<String>,
    /// Everything else, for the real runtime, in order.
    pub rest: Vec<OsString>,
}

pub fn split_args(argv: impl IntoIterator<Item = OsString>) -> Args {
    let mut a = Args::default();
    for arg in argv {
        let s = arg.to_string_lossy();
        if let Some(v) = s.strip_prefix("--cuslice-runtime=") {
            a.runtime = Some(v.into());
        } else if let Some(v) = s.strip_prefix("--cuslice-hook=") {
            a.hook = Some(v.into());
        } else if let Some(v) = s.strip_prefix("--cuslice-hook-arg=") {
            a.hook_args.push(v.into());
        } else {
            a.rest.push(arg);
        }
    }
    a
}

/// runc's global options that take a value (`runc --help`).
const GLOBAL_WITH_VALUE: [&str; 5] = ["--root", "--log", "--log-format", "--criu", "--rootless"];

/// The bundle of a `create` or `run` command (default: the working directory); `None` for every
/// other command.
pub fn bundle_of(rest: &[OsString]) -> Option<PathBuf> {
    let mut i = 0;
    // Skip the global options to find the command.
    while i < rest.len() {
        let s = rest[i].to_string_lossy();
        if !s.starts_with('-') {
            break;
        }
        i += if GLOBAL_WITH_VALUE.contains(&s.as_ref()) {
            2
        } else {
            1
        };
    }
    let command = rest.get(i)?.to_string_lossy();
    if command != "create" && command != "run" {
        return None;
    }
    let mut args = rest[i + 1..].iter();
    while let Some(a) = args.next() {
        let s = a.to_string_lossy();
        if s == "--bundle" || s == "-b" {
            return args.next().map(PathBuf::from);
        }
        if let Some(v) = s
            .strip_prefix("--bundle=")
            .or_else(|| s.strip_prefix("-b="))
        {
            return Some(PathBuf::from(v));
        }
    }
    Some(PathBuf::from("."))
}

fn hook_entry(hook: &Path, stage: &str, extra: &[String]) -> Value {
    let mut args = vec![Value::from("cuslice-hook"), Value::from(stage)];
    args.extend(extra.iter().map(|a| Value::from(a.as_str())));
    json!({ "path": hook.to_string_lossy(), "args": args })
}

/// Adds the hook (createRuntime and poststop) to a spec that mentions cuslice. `Ok(None)`: leave
/// the file as it is (no cuslice settings, or the hook is already there).
pub fn add_hooks(spec: &str, hook: &Path, extra: &[String]) -> Result<Option<String>, String> {
    let mut v: Value =
        serde_json::from_str(spec).map_err(|e| format!("config.json is not JSON: {e}"))?;
    if !crate::hook::spec_mentions(&v) {
        return Ok(None);
    }
    let Some(obj) = v.as_object_mut() else {
        return Err("config.json is not a JSON object".into());
    };
    let hooks = obj.entry("hooks").or_insert_with(|| json!({}));
    let Some(hooks) = hooks.as_object_mut() else {
        return Err("config.json: \"hooks\" is not an object".into());
    };
    let mut changed = false;
    for stage in ["createRuntime", "poststop"] {
        let list = hooks.entry(stage).or_insert_with(|| json!([]));
        let Some(list) = list.as_array_mut() else {
            return Err(format!("config.json: hooks.{stage} is not an array"));
        };
        let present = list
            .iter()
            .any(|h| h.get("path").and_then(Value::as_str) == Some(&*hook.to_string_lossy()));
        if !present {
            list.push(hook_entry(hook, stage, extra));
            changed = true;
        }
    }
    if !changed {
        return Ok(None);
    }
    serde_json::to_string(&v)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The real runtime: `--cuslice-runtime`, else `runc`.
pub fn runtime(a: &Args) -> &OsStr {
    a.runtime.as_deref().unwrap_or(OsStr::new("runc"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn own_options_are_removed() {
        let a = split_args(os(&[
            "--cuslice-runtime=/usr/sbin/runc",
            "--cuslice-hook-arg=--library=/x.so",
            "--root",
            "/run/r",
            "create",
            "--bundle",
            "/b",
            "id",
        ]));
        assert_eq!(a.runtime.as_deref(), Some(OsStr::new("/usr/sbin/runc")));
        assert_eq!(a.hook_args, ["--library=/x.so"]);
        assert_eq!(
            a.rest,
            os(&["--root", "/run/r", "create", "--bundle", "/b", "id"])
        );
    }

    #[test]
    fn bundles() {
        // What dockerd's and containerd's shims pass.
        let docker = os(&[
            "--root",
            "/var/run/docker/runtime-runc/moby",
            "--log",
            "/x/log.json",
            "--log-format",
            "json",
            "--systemd-cgroup",
            "create",
            "--bundle",
            "/b1",
            "--pid-file",
            "/p",
            "id",
        ]);
        assert_eq!(bundle_of(&docker), Some("/b1".into()));
        assert_eq!(bundle_of(&os(&["run", "-b=/b2", "id"])), Some("/b2".into()));
        assert_eq!(bundle_of(&os(&["create", "id"])), Some(".".into()));
        for other in [
            &["start", "id"][..],
            &["--root", "/r", "delete", "--bundle", "/b", "id"],
            &["state", "create"],
            &[],
        ] {
            assert_eq!(bundle_of(&os(other)), None, "{other:?}");
        }
    }

    #[test]
    fn hooks_added_only_for_cuslice_containers() {
        let hook = Path::new("/usr/local/bin/cuslice-hook");
        let plain = r#"{"process":{"env":["PATH=/bin"]},"root":{"path":"rootfs"}}"#;
        assert_eq!(add_hooks(plain, hook, &[]), Ok(None));
        let sliced = r#"{"process":{"env":["CUSLICE_MEMORY_LIMIT=1GiB"]},"hooks":{"poststop":[{"path":"/other"}]},"x":{"keep":[1,2]}}"#;
        let out = add_hooks(sliced, hook, &["--library=/l.so".into()])
            .unwrap()
            .unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["x"], json!({"keep": [1, 2]}));
        assert_eq!(
            v["hooks"]["createRuntime"],
            json!([{"path": "/usr/local/bin/cuslice-hook", "args": ["cuslice-hook", "createRuntime", "--library=/l.so"]}])
        );
        assert_eq!(v["hooks"]["poststop"][0]["path"], "/other");
        assert_eq!(v["hooks"]["poststop"][1]["args"][1], "poststop");
        // Twice is once.
        assert_eq!(add_hooks(&out, hook, &[]), Ok(None));
        let annotated = r#"{"annotations":{"cuslice.io/memory-limit":"1GiB"}}"#;
        assert!(add_hooks(annotated, hook, &[]).unwrap().is_some());
        assert!(add_hooks("[1]", hook, &[]).is_ok());
        assert!(add_hooks("{", hook, &[]).is_err());
    }
}
