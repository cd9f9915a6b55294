//! `cuslice-runtime`: a runtime for engines that cannot be given a hook by configuration (Docker's
//! `runtimes`, containerd's runtime `BinaryName`). On `create` and `run` it applies the CDI
//! devices the container's `cdi.k8s.io/*` annotations name, and those the DRA plugin's container
//! index gives a Kubernetes container (for engines without CDI support, such as containerd
//! 1.6; see [`cdi::indexed_devices`]), then adds `cuslice-hook` to the bundle's config.json when the
//! container mentions cuslice and no cuslice-hook is there yet; then, for every command, it
//! execs the real runtime (runc by default) with the arguments it was given, untouched.
//!
//! Its own options come first and are removed before the real runtime sees the arguments:
//! `--cuslice-runtime=PATH` (the real runtime), `--cuslice-hook=PATH` (default: `cuslice-hook`
//! beside this executable), `--cuslice-hook-arg=ARG` (repeatable: extra hook arguments, e.g.
//! `--library=/opt/cuslice/libcuslice.so`), `--cuslice-cdi-spec-dir=DIR` (repeatable, lowest
//! priority first; default `/etc/cdi` and `/var/run/cdi`), `--cuslice-container-index=DIR`
//! (default [`cdi::DEFAULT_CONTAINER_INDEX`]). Docker passes them with `runtimeArgs`.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use cuslice_policy::echo::cut;
use serde_json::{Value, json};

use cuslice_cdi::{self as cdi, HOOK_BIN, HOOK_STAGES};

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Args {
    pub runtime: Option<OsString>,
    pub hook: Option<PathBuf>,
    pub hook_args: Vec<String>,
    /// `--cuslice-cdi-spec-dir`, in order; empty: [`cdi::DEFAULT_SPEC_DIRS`].
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// `--cuslice-container-index`; None: [`cdi::DEFAULT_CONTAINER_INDEX`].
    pub container_index: Option<PathBuf>,
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
        } else if let Some(v) = s.strip_prefix("--cuslice-cdi-spec-dir=") {
            a.cdi_spec_dirs.push(v.into());
        } else if let Some(v) = s.strip_prefix("--cuslice-container-index=") {
            a.container_index = Some(v.into());
        } else {
            a.rest.push(arg);
        }
    }
    a
}

impl Args {
    /// The CDI spec directories to search, lowest priority first.
    pub fn spec_dirs(&self) -> Vec<PathBuf> {
        if self.cdi_spec_dirs.is_empty() {
            cdi::DEFAULT_SPEC_DIRS.iter().map(PathBuf::from).collect()
        } else {
            self.cdi_spec_dirs.clone()
        }
    }

    /// The DRA plugin's container index.
    pub fn container_index(&self) -> PathBuf {
        self.container_index
            .clone()
            .unwrap_or_else(|| PathBuf::from(cdi::DEFAULT_CONTAINER_INDEX))
    }
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
    let mut args = vec![Value::from(HOOK_BIN), Value::from(stage)];
    args.extend(extra.iter().map(|a| Value::from(a.as_str())));
    json!({ "path": hook.to_string_lossy(), "args": args })
}

/// Adds the hook (createRuntime and poststop) to a spec that mentions cuslice, at each stage
/// that runs no cuslice-hook yet (one added by a CDI spec, or by an earlier run, counts: see
/// [`cdi::is_cuslice_hook`]). `Ok(false)`: nothing changed.
pub fn add_hooks_to(v: &mut Value, hook: &Path, extra: &[String]) -> Result<bool, String> {
    if !crate::hook::spec_mentions(v) {
        return Ok(false);
    }
    let Some(obj) = v.as_object_mut() else {
        return Err("config.json is not a JSON object".into());
    };
    let hooks = obj.entry("hooks").or_insert_with(|| json!({}));
    let Some(hooks) = hooks.as_object_mut() else {
        return Err("config.json: \"hooks\" is not an object".into());
    };
    let mut changed = false;
    for stage in HOOK_STAGES {
        let list = hooks.entry(stage).or_insert_with(|| json!([]));
        let Some(list) = list.as_array_mut() else {
            return Err(format!("config.json: hooks.{stage} is not an array"));
        };
        let mine = &*hook.to_string_lossy();
        let present = list.iter().any(|h| {
            cdi::is_cuslice_hook(h) || h.get("path").and_then(Value::as_str) == Some(mine)
        });
        if !present {
            list.push(hook_entry(hook, stage, extra));
            changed = true;
        }
    }
    Ok(changed)
}

/// [`add_hooks_to`] on config.json's text. `Ok(None)`: leave the file as it is (no cuslice
/// settings, or the hook is already there).
pub fn add_hooks(spec: &str, hook: &Path, extra: &[String]) -> Result<Option<String>, String> {
    let mut v: Value =
        serde_json::from_str(spec).map_err(|e| format!("config.json is not JSON: {e}"))?;
    if !add_hooks_to(&mut v, hook, extra)? {
        return Ok(None);
    }
    serde_json::to_string(&v)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// What `create`/`run` does to config.json's text: applies the CDI devices its `cdi.k8s.io/*`
/// annotations name and those the container index `index` gives it, resolved from `cdi_dirs`,
/// then [`add_hooks_to`]. `Ok(None)`: leave the
/// file as it is (nothing asked for, or text the real runtime will refuse itself). `Err`: one
/// line saying why the container must not be created (an annotation that names a device that is
/// malformed, not defined, or whose edits cannot be applied).
pub fn prepare_config(
    text: &str,
    hook: &Path,
    extra: &[String],
    cdi_dirs: &[PathBuf],
    index: &Path,
) -> Result<Option<String>, String> {
    // Not JSON: the runtime reports that itself.
    let Ok(mut v) = serde_json::from_str::<Value>(text) else {
        return Ok(None);
    };
    let mut asked = cdi::annotated_devices(&v)?;
    for d in cdi::indexed_devices(index, &v)? {
        if !asked.iter().any(|(_, id)| *id == d.1) {
            asked.push(d);
        }
    }
    // Where an id came from, for messages: an annotation, or the container index.
    let source = |k: &str| {
        if k.starts_with(cdi::ANNOTATION_PREFIX) {
            format!("annotation {}", cut(k))
        } else {
            k.to_owned()
        }
    };
    if asked.is_empty() {
        // As before CDI: a spec the hook cannot be added to is left for the runtime to judge.
        return match add_hooks_to(&mut v, hook, extra) {
            Ok(true) => serde_json::to_string(&v)
                .map(Some)
                .map_err(|e| e.to_string()),
            Ok(false) | Err(_) => Ok(None),
        };
    }
    let registry = cdi::Registry::load(cdi_dirs);
    let ids: Vec<&str> = asked.iter().map(|(_, id)| id.as_str()).collect();
    let key_of = |id: &str| {
        asked
            .iter()
            .find(|(_, i)| i == id)
            .map_or("", |(k, _)| k.as_str())
            .to_owned()
    };
    let edits = registry.resolve(&ids).map_err(|u| {
        format!(
            "{}: {u} (cuslice-runtime --cuslice-cdi-spec-dir=DIR searches other \
             directories); the container is not created",
            source(&key_of(&u.id))
        )
    })?;
    let keys: Vec<String> = {
        let mut k: Vec<String> = asked.iter().map(|(k, _)| k.clone()).collect();
        k.dedup();
        k
    };
    cdi::apply_edits(&mut v, &edits, &cdi::host_node).map_err(|e| {
        format!(
            "{}: cannot apply CDI devices {}: {e}; the container is not created",
            keys.iter()
                .map(|k| source(k))
                .collect::<Vec<_>>()
                .join(", "),
            ids.join(",")
        )
    })?;
    add_hooks_to(&mut v, hook, extra).map_err(|e| format!("{e}; the container is not created"))?;
    serde_json::to_string(&v)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The runtime's log (`--log PATH`) and whether it is JSON (`--log-format json`), from the
/// global options before the command: containerd's shim reports the last error logged there
/// when `create` fails.
pub fn runtime_log(rest: &[OsString]) -> Option<(PathBuf, bool)> {
    let (mut log, mut json) = (None, false);
    let mut i = 0;
    while i < rest.len() {
        let s = rest[i].to_string_lossy();
        if !s.starts_with('-') {
            break;
        }
        let (name, value) = match s.split_once('=') {
            Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
            None => (s.to_string(), None),
        };
        let takes = GLOBAL_WITH_VALUE.contains(&name.as_str());
        let value = match (takes, value) {
            (true, None) => {
                i += 1;
                rest.get(i).map(|v| v.to_string_lossy().into_owned())
            }
            (_, v) => v,
        };
        match name.as_str() {
            "--log" => log = value.map(PathBuf::from),
            "--log-format" => json = value.as_deref() == Some("json"),
            _ => {}
        }
        i += 1;
    }
    log.map(|l| (l, json))
}

/// One line for the runtime's log: logrus's JSON (`{"level":"error","msg":...,"time":...}`,
/// as runc writes it) or text.
pub fn log_line(msg: &str, json: bool, now: std::time::SystemTime) -> String {
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let time = rfc3339(secs);
    if json {
        format!(
            "{}\n",
            json!({ "level": "error", "msg": msg, "time": time })
        )
    } else {
        format!("time=\"{time}\" level=error msg={msg:?}\n")
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the epoch (UTC; days to civil date after Howard
/// Hinnant's algorithm).
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The real runtime: `--cuslice-runtime`, else `runc`.
pub fn runtime(a: &Args) -> &OsStr {
    a.runtime.as_deref().unwrap_or(OsStr::new("runc"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_INDEX: &str = "/nonexistent/index";

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn own_options_are_removed() {
        let a = split_args(os(&[
            "--cuslice-runtime=/usr/sbin/runc",
            "--cuslice-container-index=/idx",
            "--cuslice-hook-arg=--library=/x.so",
            "--cuslice-cdi-spec-dir=/a",
            "--cuslice-cdi-spec-dir=/b",
            "--root",
            "/run/r",
            "create",
            "--bundle",
            "/b",
            "id",
        ]));
        assert_eq!(a.runtime.as_deref(), Some(OsStr::new("/usr/sbin/runc")));
        assert_eq!(a.hook_args, ["--library=/x.so"]);
        assert_eq!(a.spec_dirs(), [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(a.container_index(), PathBuf::from("/idx"));
        assert_eq!(
            Args::default().container_index(),
            PathBuf::from(cdi::DEFAULT_CONTAINER_INDEX)
        );
        assert_eq!(
            Args::default().spec_dirs(),
            [PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")]
        );
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

    fn claim_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let spec = cdi::claim_spec(
            &[cdi::ClaimDevice {
                name: "uid1-gpu-0".into(),
                env: vec![("CUSLICE_MEMORY_LIMIT".into(), "1073741824".into())],
                device_nodes: vec![("/dev/nvidia0".into(), "/dev/null".into())],
                library_mounts: vec![],
            }],
            "/usr/local/bin/cuslice-hook",
            "/usr/local/lib/cuslice/libcuslice.so",
        );
        cdi::write_spec(dir.path(), &cdi::claim_spec_file("uid1"), &spec).unwrap();
        dir
    }

    #[test]
    fn cdi_annotations_applied_with_one_hook() {
        let dir = claim_dir();
        let dirs = [dir.path().to_path_buf()];
        let hook = Path::new("/opt/other/cuslice-hook");
        let config = r#"{"process":{"env":["PATH=/bin"]},"annotations":{"cdi.k8s.io/gpu.cuslice.io_uid1":"gpu.cuslice.io/claim=uid1-gpu-0"}}"#;
        let out = prepare_config(config, hook, &[], &dirs, Path::new(NO_INDEX))
            .unwrap()
            .unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v["process"]["env"],
            json!(["PATH=/bin", "CUSLICE_MEMORY_LIMIT=1073741824"])
        );
        assert_eq!(
            v["linux"]["devices"],
            json!([{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 3, "fileMode": 0o666}])
        );
        // The spec's hook only: the runtime's own (another path) is not added too.
        for stage in HOOK_STAGES {
            let list = v["hooks"][stage].as_array().unwrap();
            assert_eq!(list.len(), 1, "{stage}: {list:?}");
            assert_eq!(list[0]["path"], "/usr/local/bin/cuslice-hook");
        }
        // Without annotations: as before.
        let plain = r#"{"process":{"env":["CUSLICE_MEMORY_LIMIT=1GiB"]}}"#;
        let out = prepare_config(plain, hook, &[], &dirs, Path::new(NO_INDEX))
            .unwrap()
            .unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v["hooks"]["createRuntime"][0]["path"],
            "/opt/other/cuslice-hook"
        );
        assert_eq!(
            prepare_config(r#"{"process":{}}"#, hook, &[], &dirs, Path::new(NO_INDEX)),
            Ok(None)
        );
        assert_eq!(
            prepare_config("{", hook, &[], &dirs, Path::new(NO_INDEX)),
            Ok(None)
        );
        // A spec without hooks: the runtime adds its own once the env mentions cuslice.
        let bare = tempfile::tempdir().unwrap();
        std::fs::write(
            bare.path().join("v.json"),
            r#"{"cdiVersion":"0.5.0","kind":"v.com/c","devices":[{"name":"d","containerEdits":{"env":["CUSLICE_CORE_LIMIT=50"]}}]}"#,
        )
        .unwrap();
        let config = r#"{"annotations":{"cdi.k8s.io/x":"v.com/c=d"}}"#;
        let out = prepare_config(
            config,
            hook,
            &[],
            &[bare.path().to_path_buf()],
            Path::new(NO_INDEX),
        )
        .unwrap()
        .unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["hooks"]["poststop"][0]["path"], "/opt/other/cuslice-hook");
    }

    #[test]
    fn unresolvable_cdi_annotation_stops_the_container() {
        let dir = claim_dir();
        let dirs = [dir.path().to_path_buf(), PathBuf::from("/nonexistent/cdi")];
        let hook = Path::new("/h/cuslice-hook");
        let config = r#"{"annotations":{"cdi.k8s.io/gpu.cuslice.io_uid9":"gpu.cuslice.io/claim=uid9-gpu-0"}}"#;
        let e = prepare_config(config, hook, &[], &dirs, Path::new(NO_INDEX)).unwrap_err();
        assert_eq!(
            e,
            format!(
                "annotation cdi.k8s.io/gpu.cuslice.io_uid9: CDI device gpu.cuslice.io/claim=uid9-gpu-0 \
                 is not defined in any spec under {}, /nonexistent/cdi (cuslice-runtime \
                 --cuslice-cdi-spec-dir=DIR searches other directories); the container is not created",
                dir.path().display()
            )
        );
        let config = r#"{"annotations":{"cdi.k8s.io/k":"gpu-0"}}"#;
        let e = prepare_config(config, hook, &[], &dirs, Path::new(NO_INDEX)).unwrap_err();
        assert!(
            e.starts_with("annotation cdi.k8s.io/k: \"gpu-0\" is not a fully-qualified"),
            "{e}"
        );
        // A device node that is not there on the host.
        let spec = cdi::claim_spec(
            &[cdi::ClaimDevice {
                name: "gone".into(),
                env: vec![],
                device_nodes: vec![("/dev/nvidia9".into(), "/nonexistent/nvidia9".into())],
                library_mounts: vec![],
            }],
            "/h/cuslice-hook",
            "/l.so",
        );
        cdi::write_spec(dir.path(), "gone.json", &spec).unwrap();
        let config = r#"{"annotations":{"cdi.k8s.io/k":"gpu.cuslice.io/claim=gone"}}"#;
        let e = prepare_config(config, hook, &[], &dirs, Path::new(NO_INDEX)).unwrap_err();
        assert_eq!(
            e,
            "annotation cdi.k8s.io/k: cannot apply CDI devices gpu.cuslice.io/claim=gone: device \
             node /dev/nvidia9: cannot stat /nonexistent/nvidia9: No such file or directory (os \
             error 2); the container is not created"
        );
    }

    #[test]
    fn runtime_log_for_errors() {
        let containerd = os(&[
            "--root",
            "/r",
            "--log",
            "/b/log.json",
            "--log-format",
            "json",
            "create",
            "--bundle",
            "/b",
            "id",
        ]);
        assert_eq!(runtime_log(&containerd), Some(("/b/log.json".into(), true)));
        assert_eq!(
            runtime_log(&os(&["--log=/l", "run", "--log", "/x", "id"])),
            Some(("/l".into(), false))
        );
        assert_eq!(runtime_log(&os(&["create", "id"])), None);
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_709_251_200 + 3_723);
        let line = log_line("no \"device\"", true, t);
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            v,
            json!({"level": "error", "msg": "no \"device\"", "time": "2024-03-01T01:02:03Z"})
        );
        assert!(line.ends_with("}\n"));
        assert_eq!(
            log_line("x", false, std::time::UNIX_EPOCH),
            "time=\"1970-01-01T00:00:00Z\" level=error msg=\"x\"\n"
        );
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    /// A Kubernetes container on containerd 1.6 carries no CDI annotation for its DRA claim; its
    /// CRI annotations find the DRA plugin's index entry, whose devices are applied, once.
    #[test]
    fn container_index_devices_applied() {
        let dir = claim_dir();
        let dirs = [dir.path().to_path_buf()];
        let index = tempfile::tempdir().unwrap();
        let entry = cdi::IndexEntry {
            pod_uid: "p1".into(),
            cdi_devices: vec!["gpu.cuslice.io/claim=uid1-gpu-0".into()],
            claim: None,
        };
        std::fs::write(
            index
                .path()
                .join(cdi::index_file("default", "inference", "main", "uid1").unwrap()),
            serde_json::to_string(&entry).unwrap(),
        )
        .unwrap();
        let hook = Path::new("/opt/cuslice/bin/cuslice-hook");
        let config = serde_json::json!({"process": {"env": ["PATH=/bin"]}, "annotations": {
            cdi::CRI_CONTAINER_TYPE: "container", cdi::CRI_NAMESPACE: "default",
            cdi::CRI_POD: "inference", cdi::CRI_POD_UID: "p1", cdi::CRI_CONTAINER: "main"}})
        .to_string();
        let out = prepare_config(&config, hook, &[], &dirs, index.path())
            .unwrap()
            .unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        let env: Vec<&str> = v["process"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect();
        assert!(
            env.iter().any(|e| e.starts_with("CUSLICE_MEMORY_LIMIT=")),
            "{env:?}"
        );
        for stage in HOOK_STAGES {
            assert_eq!(v["hooks"][stage].as_array().unwrap().len(), 1, "{stage}");
        }
        // Another pod of the same name: not its entry, nothing applied.
        let other = config.replace("\"p1\"", "\"p2\"");
        let out = prepare_config(&other, hook, &[], &dirs, index.path()).unwrap();
        assert_eq!(out, None);
        // An entry naming a device no spec defines: one line naming the container and the file.
        let entry = cdi::IndexEntry {
            pod_uid: "p1".into(),
            cdi_devices: vec!["gpu.cuslice.io/claim=gone-gpu-0".into()],
            claim: None,
        };
        std::fs::write(
            index.path().join("default_inference_main_uid1.json"),
            serde_json::to_string(&entry).unwrap(),
        )
        .unwrap();
        let e = prepare_config(&config, hook, &[], &dirs, index.path()).unwrap_err();
        assert!(
            e.starts_with("container default/inference/main in ")
                && e.contains("default_inference_main_uid1.json: CDI device gpu.cuslice.io/claim=gone-gpu-0 is not defined"),
            "{e}"
        );
    }
}
