//! CDI (Container Device Interface) specs as cuslice writes and reads them.
//!
//! - [`Spec`] and its parts: the spec file's schema (cdiVersion, kind, devices, containerEdits).
//! - [`write_spec`]: one spec file, written atomically (a temporary file in the same directory,
//!   fsync, rename, fsync of the directory), so a runtime never reads half a spec.
//! - [`Registry`]: the specs of a list of directories (`/etc/cdi`, `/var/run/cdi` by default;
//!   `.json`, `.yaml` and `.yml`), resolving fully-qualified device ids `VENDOR/CLASS=NAME`.
//! - [`apply_edits`]: a resolved device's container edits applied to an OCI config.json.
//! - [`claim_spec`]: the spec of one prepared claim (kind [`CLAIM_KIND`]), for the DRA plugin.
//! - [`hook_args`], [`cuslice_hooks`]: the one definition of how cuslice-hook is named in hooks
//!   (stages and argv), shared by `cuslice install` and the claim specs.
//! - [`IndexEntry`], [`indexed_devices`]: the DRA plugin's container index, which tells
//!   cuslice-runtime a Kubernetes container's CDI devices where the runtime (containerd 1.6) is
//!   not told them.
//!
//! Ref: the CDI specification (cncf-tags/container-device-interface SPEC.md) and its Go
//! implementation (pkg/cdi/container-edits.go, pkg/parser/parser.go), whose behaviour the
//! resolution and the edits follow: spec-level edits once per spec, then each device's; an
//! environment variable replaces an earlier one of the same name; a device node or mount
//! replaces one at the same container path; device nodes get an allow rule in the device cgroup.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use cuslice_policy::echo::{cut, quoted};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The CDI version cuslice writes.
pub const CDI_VERSION: &str = "0.5.0";
/// The kind of the per-claim specs the DRA plugin writes.
pub const CLAIM_KIND: &str = "gpu.cuslice.io/claim";
/// The DRA driver's name (the vendor part of [`CLAIM_KIND`]).
pub const DRIVER: &str = "gpu.cuslice.io";
/// Container annotations whose values are comma-separated CDI device ids (Ref:
/// container-device-interface pkg/cdi/producer/annotations/annotations.go, `Prefix`).
pub const ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
/// Where runtimes look for specs, lowest priority first (a device defined in a later directory
/// overrides one in an earlier directory).
pub const DEFAULT_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// The hook's program name, `args[0]` of every hook entry that runs it.
pub const HOOK_BIN: &str = "cuslice-hook";
/// The hook stages cuslice registers, in the order they run.
pub const HOOK_STAGES: [&str; 2] = ["createRuntime", "poststop"];
/// The hook names a CDI spec may use (the OCI runtime spec's hook lists).
pub const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// The hook's argv for one stage (OCI hook `args` include argv\[0\]): `cuslice-hook STAGE
/// --library LIBRARY`.
pub fn hook_args(stage: &str, library: &str) -> Vec<String> {
    vec![
        HOOK_BIN.to_owned(),
        stage.to_owned(),
        "--library".to_owned(),
        library.to_owned(),
    ]
}

/// cuslice-hook at `hook` for every stage in [`HOOK_STAGES`], as CDI hooks.
pub fn cuslice_hooks(hook: &str, library: &str) -> Vec<Hook> {
    HOOK_STAGES
        .iter()
        .map(|s| Hook {
            hook_name: (*s).to_owned(),
            path: hook.to_owned(),
            args: hook_args(s, library),
            env: Vec::new(),
            timeout: None,
        })
        .collect()
}

/// Whether an OCI hook entry (`{"path": ..., "args": [...]}`) runs cuslice-hook: its argv\[0\]
/// or its program's file name is `cuslice-hook`.
pub fn is_cuslice_hook(entry: &Value) -> bool {
    let argv0 = entry.pointer("/args/0").and_then(Value::as_str);
    let file = entry
        .get("path")
        .and_then(Value::as_str)
        .and_then(|p| Path::new(p).file_name())
        .and_then(|f| f.to_str());
    argv0 == Some(HOOK_BIN) || file == Some(HOOK_BIN)
}

// ---- the schema ---------------------------------------------------------------------------

/// A CDI spec file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    /// `VENDOR/CLASS`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub devices: Vec<Device>,
    /// Edits for every container that gets at least one of this spec's devices.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `NAME=VALUE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
    /// Edits of later CDI versions that cuslice does not apply (intelRdt, netDevices): kept so a
    /// spec reads back whole, refused when a container asks for a device that has them.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// The path in the container.
    pub path: String,
    /// The node on the host (default: `path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c`, `b`, `u` or `p`; read from the host node when absent.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Device cgroup access, a subset of `rwm` (default `rwm`), or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// The OCI hook list: one of [`HOOK_NAMES`].
    pub hook_name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.additional_gids.is_empty()
            && self.other.is_empty()
    }

    /// Appends `o`'s edits after these.
    pub fn append(&mut self, o: &ContainerEdits) {
        self.env.extend(o.env.iter().cloned());
        self.device_nodes.extend(o.device_nodes.iter().cloned());
        self.hooks.extend(o.hooks.iter().cloned());
        self.mounts.extend(o.mounts.iter().cloned());
        self.additional_gids
            .extend(o.additional_gids.iter().copied());
        for (k, v) in &o.other {
            self.other.insert(k.clone(), v.clone());
        }
    }

    /// Checks what a runtime would refuse: env without `NAME=`, device nodes without a path or
    /// with an unknown type or permissions, unknown hook names, hooks or mounts without paths.
    pub fn validate(&self) -> Result<(), String> {
        for e in &self.env {
            check_env(e)?;
        }
        for d in &self.device_nodes {
            if d.path.is_empty() {
                return Err("a device node has an empty path".into());
            }
            if let Some(t) = &d.kind
                && !matches!(t.as_str(), "" | "b" | "c" | "u" | "p")
            {
                return Err(format!(
                    "device node {}: type {t:?} is not b, c, u or p",
                    d.path
                ));
            }
            if d.major.is_some_and(|m| m < 0) || d.minor.is_some_and(|m| m < 0) {
                return Err(format!("device node {}: negative device number", d.path));
            }
            if let Some(p) = &d.permissions
                && p != "none"
                && !p.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))
            {
                return Err(format!(
                    "device node {}: permissions {p:?} are not a subset of \"rwm\" or \"none\"",
                    d.path
                ));
            }
        }
        for h in &self.hooks {
            if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
                return Err(format!(
                    "hook name {:?} is not one of {}",
                    h.hook_name,
                    HOOK_NAMES.join(", ")
                ));
            }
            if h.path.is_empty() {
                return Err(format!("a {} hook has an empty path", h.hook_name));
            }
            for e in &h.env {
                check_env(e)?;
            }
        }
        for m in &self.mounts {
            if m.host_path.is_empty() || m.container_path.is_empty() {
                return Err(format!(
                    "a mount has an empty path (hostPath {:?}, containerPath {:?})",
                    m.host_path, m.container_path
                ));
            }
        }
        Ok(())
    }
}

fn check_env(e: &str) -> Result<(), String> {
    match e.find('=') {
        Some(i) if i > 0 => Ok(()),
        _ => Err(format!(
            "environment entry {e:?} is not NAME=VALUE (e.g. CUSLICE_CORE_LIMIT=60)"
        )),
    }
}

impl Spec {
    /// The spec's device `name` as a fully-qualified id: `KIND=NAME`.
    pub fn qualified(&self, name: &str) -> String {
        format!("{}={name}", self.kind)
    }

    /// The checks a runtime makes when it loads the spec: a valid kind, valid and distinct
    /// device names, valid edits.
    pub fn validate(&self) -> Result<(), String> {
        if self.cdi_version.is_empty() {
            return Err("cdiVersion is missing".into());
        }
        check_kind(&self.kind)?;
        if self.devices.is_empty() {
            return Err("the spec defines no devices".into());
        }
        self.container_edits.validate()?;
        let mut seen = std::collections::BTreeSet::new();
        for d in &self.devices {
            check_device_name(&d.name)?;
            if !seen.insert(d.name.as_str()) {
                return Err(format!("device {:?} is defined twice", d.name));
            }
            if d.container_edits.is_empty() {
                return Err(format!("device {:?} has no containerEdits", d.name));
            }
            d.container_edits
                .validate()
                .map_err(|e| format!("device {:?}: {e}", d.name))?;
        }
        Ok(())
    }

    /// The spec as a file: two-space JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }
}

// ---- fully-qualified ids ------------------------------------------------------------------

fn letter(c: char) -> bool {
    c.is_ascii_alphabetic()
}

fn alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// A vendor or class: a letter first, a letter or digit last, letters, digits, `_`, `-`, `.`
/// between (Ref: container-device-interface pkg/parser/parser.go).
fn check_vendor_or_class(what: &str, s: &str) -> Result<(), String> {
    let mut chars = s.chars();
    match chars.next() {
        None => return Err(format!("the {what} is empty")),
        Some(c) if !letter(c) => {
            return Err(format!(
                "the {what} {} does not start with a letter",
                quoted(s)
            ));
        }
        _ => {}
    }
    if !s.chars().last().is_some_and(alnum) {
        return Err(format!(
            "the {what} {} does not end with a letter or digit",
            quoted(s)
        ));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(alnum(*c) || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!("the {what} {} holds {c:?}", quoted(s)));
    }
    Ok(())
}

/// A kind: `VENDOR/CLASS`.
pub fn check_kind(kind: &str) -> Result<(), String> {
    let Some((vendor, class)) = kind.split_once('/') else {
        return Err(format!(
            "kind {} is not VENDOR/CLASS (e.g. {CLAIM_KIND})",
            quoted(kind)
        ));
    };
    check_vendor_or_class("vendor", vendor)
        .and_then(|()| check_vendor_or_class("class", class))
        .map_err(|e| format!("kind {}: {e}", quoted(kind)))
}

/// A device name: a letter or digit first and last, letters, digits, `_`, `-`, `.`, `:`
/// between.
pub fn check_device_name(name: &str) -> Result<(), String> {
    let ok_ends = name.chars().next().is_some_and(alnum) && name.chars().last().is_some_and(alnum);
    let bad = name
        .chars()
        .find(|c| !(alnum(*c) || matches!(c, '_' | '-' | '.' | ':')));
    match (name.is_empty(), ok_ends, bad) {
        (true, _, _) => Err("the device name is empty".into()),
        (_, false, _) => Err(format!(
            "device name {} does not start and end with a letter or digit",
            quoted(name)
        )),
        (_, _, Some(c)) => Err(format!("device name {} holds {c:?}", quoted(name))),
        _ => Ok(()),
    }
}

/// Splits a fully-qualified device id `VENDOR/CLASS=NAME` into kind and name.
pub fn parse_qualified(id: &str) -> Result<(&str, &str), String> {
    let example = format!("{CLAIM_KIND}=5d1f0c1e-gpu-0");
    let Some((kind, name)) = id.split_once('=') else {
        return Err(format!(
            "{} is not a fully-qualified CDI device id VENDOR/CLASS=NAME (e.g. {example})",
            quoted(id)
        ));
    };
    check_kind(kind)
        .and_then(|()| check_device_name(name))
        .map_err(|e| {
            format!(
                "{} is not a fully-qualified CDI device id ({e}); e.g. {example}",
                quoted(id)
            )
        })?;
    Ok((kind, name))
}

// ---- writing ------------------------------------------------------------------------------

/// The spec file of a prepared claim: `gpu.cuslice.io-<claim uid>.json`.
pub fn claim_spec_file(claim_uid: &str) -> String {
    format!("{DRIVER}-{claim_uid}.json")
}

/// The CDI device name of one device of a prepared claim: `<claim uid>-<device name>`.
pub fn claim_device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// Writes `spec` (validated first) to `dir/file_name` atomically: a temporary file in `dir`,
/// written and fsynced, renamed over the target, then `dir` fsynced. `dir` is made if missing.
/// The file is mode 0644.
pub fn write_spec(dir: &Path, file_name: &str, spec: &Spec) -> Result<PathBuf, String> {
    let named = file_name.ends_with(".json")
        && !file_name.starts_with('.')
        && !file_name.contains('/')
        && file_name.len() > ".json".len();
    if !named {
        return Err(format!(
            "CDI spec file name {file_name:?} is not NAME.json (e.g. {})",
            claim_spec_file("5d1f0c1e")
        ));
    }
    spec.validate()
        .map_err(|e| format!("CDI spec {file_name} not written: {e}"))?;
    let path = dir.join(file_name);
    std::fs::create_dir_all(dir).map_err(|e| {
        format!(
            "cannot write CDI spec {} (making its directory: {e})",
            path.display()
        )
    })?;
    write_atomic(&path, spec.to_json().as_bytes(), 0o644)
        .map_err(|e| format!("cannot write CDI spec {} ({e})", path.display()))?;
    Ok(path)
}

/// Writes `bytes` to `path` atomically, with `mode`: a temporary file beside it (named after it,
/// this process and the time, so two writers never share one), written and fsynced, renamed over
/// `path`, then the directory fsynced. A reader sees the old file or the new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Removes `dir/file_name` if it is there (then fsyncs `dir`). `Ok(false)`: it was not there.
pub fn remove_spec(dir: &Path, file_name: &str) -> Result<bool, String> {
    let path = dir.join(file_name);
    match std::fs::remove_file(&path) {
        Ok(()) => {
            sync_dir(dir).map_err(|e| format!("cannot sync {} ({e})", dir.display()))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("cannot remove CDI spec {} ({e})", path.display())),
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

// ---- the claim spec -----------------------------------------------------------------------

/// One device of a prepared claim, as the DRA plugin sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimDevice {
    /// The CDI device name ([`claim_device_name`]).
    pub name: String,
    /// (name, value), e.g. `("CUSLICE_MEMORY_LIMIT", "8589934592")`.
    pub env: Vec<(String, String)>,
    /// (container path, host path), e.g. `("/dev/nvidia0", "/dev/nvidia0")`.
    pub device_nodes: Vec<(String, String)>,
    /// (host path, container path) of the driver's user-space libraries, mounted read-only.
    pub library_mounts: Vec<(String, String)>,
}

/// The spec of one prepared claim: kind [`CLAIM_KIND`], one CDI device per claim device with
/// its env, device nodes and library mounts, and cuslice-hook (`hook`, `--library library`,
/// the stages `cuslice install --engine cdi` writes) once, as spec-level edits: every
/// container that gets any of the claim's devices runs the hook once per stage.
pub fn claim_spec(devices: &[ClaimDevice], hook: &str, library: &str) -> Spec {
    Spec {
        cdi_version: CDI_VERSION.to_owned(),
        kind: CLAIM_KIND.to_owned(),
        annotations: BTreeMap::new(),
        devices: devices
            .iter()
            .map(|d| Device {
                name: d.name.clone(),
                annotations: BTreeMap::new(),
                container_edits: ContainerEdits {
                    env: d.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                    device_nodes: d
                        .device_nodes
                        .iter()
                        .map(|(path, host)| DeviceNode {
                            path: path.clone(),
                            host_path: Some(host.clone()),
                            ..DeviceNode::default()
                        })
                        .collect(),
                    mounts: d
                        .library_mounts
                        .iter()
                        .map(|(host, path)| Mount {
                            host_path: host.clone(),
                            container_path: path.clone(),
                            kind: Some("bind".into()),
                            options: ["ro", "nosuid", "nodev", "bind"].map(String::from).to_vec(),
                        })
                        .collect(),
                    ..ContainerEdits::default()
                },
            })
            .collect(),
        container_edits: ContainerEdits {
            hooks: cuslice_hooks(hook, library),
            ..ContainerEdits::default()
        },
    }
}

// ---- reading ------------------------------------------------------------------------------

/// Parses a spec file's text: JSON for `.json`, YAML otherwise.
pub fn parse_spec(path: &Path, text: &str) -> Result<Spec, String> {
    let json = path.extension().is_some_and(|e| e == "json");
    let spec: Spec = if json {
        serde_json::from_str(text).map_err(|e| e.to_string())?
    } else {
        serde_norway::from_str(text).map_err(|e| e.to_string())?
    };
    spec.validate()?;
    Ok(spec)
}

/// Where a device is defined.
#[derive(Debug, Clone)]
struct Defined {
    spec: usize,
    device: usize,
}

/// The specs found in a list of directories, and their devices by fully-qualified id.
#[derive(Debug, Default)]
pub struct Registry {
    dirs: Vec<PathBuf>,
    /// (file, priority: the index of its directory, spec).
    specs: Vec<(PathBuf, usize, Spec)>,
    devices: BTreeMap<String, Defined>,
    /// Ids defined differently by two files of the same directory.
    conflicts: BTreeMap<String, (PathBuf, PathBuf)>,
    /// Files that could not be read or are not valid specs: (file, why).
    broken: Vec<(PathBuf, String)>,
}

impl Registry {
    /// Reads every `*.json`, `*.yaml` and `*.yml` in `dirs` (lowest priority first; missing
    /// directories are skipped). A device defined in a later directory overrides one in an
    /// earlier one; the same device defined differently by two files of one directory is a
    /// conflict (as the same definition twice is not). Files that are not valid specs are noted
    /// and skipped; they only matter to ids they might have defined.
    pub fn load(dirs: &[PathBuf]) -> Registry {
        let mut r = Registry {
            dirs: dirs.to_vec(),
            ..Registry::default()
        };
        for (priority, dir) in dirs.iter().enumerate() {
            let entries = match std::fs::read_dir(dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    r.broken.push((dir.clone(), e.to_string()));
                    continue;
                }
            };
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    let hidden = p
                        .file_name()
                        .and_then(|f| f.to_str())
                        .is_none_or(|f| f.starts_with('.'));
                    let ext = p.extension().and_then(|e| e.to_str());
                    !hidden && matches!(ext, Some("json" | "yaml" | "yml")) && p.is_file()
                })
                .collect();
            files.sort();
            for file in files {
                let spec = std::fs::read_to_string(&file)
                    .map_err(|e| e.to_string())
                    .and_then(|t| parse_spec(&file, &t));
                match spec {
                    Ok(spec) => r.add(file, priority, spec),
                    Err(e) => r.broken.push((file, e)),
                }
            }
        }
        r
    }

    fn add(&mut self, file: PathBuf, priority: usize, spec: Spec) {
        let index = self.specs.len();
        for (i, d) in spec.devices.iter().enumerate() {
            let id = spec.qualified(&d.name);
            let new = Defined {
                spec: index,
                device: i,
            };
            match self.devices.get(&id) {
                Some(old) if self.specs[old.spec].1 == priority => {
                    let (old_file, _, old_spec) = &self.specs[old.spec];
                    let same = old_spec.devices[old.device] == *d
                        && old_spec.container_edits == spec.container_edits;
                    if !same {
                        self.conflicts
                            .entry(id)
                            .or_insert_with(|| (old_file.clone(), file.clone()));
                    }
                }
                _ => {
                    self.conflicts.remove(&id);
                    self.devices.insert(id, new);
                }
            }
        }
        self.specs.push((file, priority, spec));
    }

    /// The directories searched, for messages: `/etc/cdi, /var/run/cdi`.
    pub fn searched(&self) -> String {
        self.dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The spec file that defines `id`, if one does.
    pub fn file_of(&self, id: &str) -> Option<&Path> {
        self.devices.get(id).map(|d| self.specs[d.spec].0.as_path())
    }

    /// The edits for a container that gets `ids`: for each spec, its spec-level edits once
    /// (where its first device is named), then each device's edits, in the order given.
    /// Fails on the first id that is malformed, not defined, defined in conflict, or whose
    /// edits cuslice cannot apply.
    pub fn resolve<S: AsRef<str>>(&self, ids: &[S]) -> Result<ContainerEdits, Unresolved> {
        let mut edits = ContainerEdits::default();
        let mut specs_done = Vec::new();
        for id in ids {
            let id = id.as_ref();
            let fail = |why: String| Unresolved {
                id: id.to_owned(),
                why,
            };
            parse_qualified(id).map_err(fail)?;
            if let Some((a, b)) = self.conflicts.get(id) {
                return Err(fail(format!(
                    "CDI device {} is defined differently in {} and {}; remove one",
                    cut(id),
                    a.display(),
                    b.display()
                )));
            }
            let Some(d) = self.devices.get(id) else {
                let mut why = format!(
                    "CDI device {} is not defined in any spec under {}",
                    cut(id),
                    self.searched()
                );
                if !self.broken.is_empty() {
                    let broken: Vec<String> = self
                        .broken
                        .iter()
                        .map(|(f, e)| format!("{}: {e}", f.display()))
                        .collect();
                    why.push_str(&format!(
                        " (specs that could not be read: {})",
                        broken.join("; ").replace('\n', " ")
                    ));
                }
                return Err(fail(why));
            };
            let (file, _, spec) = &self.specs[d.spec];
            let device = &spec.devices[d.device];
            if !specs_done.contains(&d.spec) {
                specs_done.push(d.spec);
                edits.append(&spec.container_edits);
            }
            edits.append(&device.container_edits);
            if let Some(k) = spec
                .container_edits
                .other
                .keys()
                .chain(device.container_edits.other.keys())
                .next()
            {
                return Err(fail(format!(
                    "CDI device {id} ({}) asks for containerEdits.{k}, which cuslice-runtime does \
                     not apply; use a runtime with CDI support (containerd >= 1.7, CRI-O, Podman)",
                    file.display()
                )));
            }
        }
        Ok(edits)
    }
}

/// A device id that could not be resolved, and why (one line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    pub id: String,
    pub why: String,
}

impl std::fmt::Display for Unresolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// The CDI device ids a config.json's annotations ask for: (annotation key, id) for every
/// `cdi.k8s.io/*` annotation (keys in order) and every comma-separated id in its value. Fails,
/// naming the annotation, on a value that is not a list of fully-qualified ids.
pub fn annotated_devices(config: &Value) -> Result<Vec<(String, String)>, String> {
    let Some(annotations) = config.get("annotations").and_then(Value::as_object) else {
        return Ok(Vec::new());
    };
    let mut keys: Vec<&String> = annotations
        .keys()
        .filter(|k| k.starts_with(ANNOTATION_PREFIX))
        .collect();
    keys.sort();
    let mut out = Vec::new();
    for key in keys {
        let Some(value) = annotations[key].as_str() else {
            return Err(format!(
                "annotation {}: the value is not a string",
                cut(key)
            ));
        };
        for id in value.split(',') {
            parse_qualified(id).map_err(|e| format!("annotation {}: {e}", cut(key)))?;
            out.push((key.clone(), id.to_owned()));
        }
    }
    Ok(out)
}

// ---- the container index ------------------------------------------------------------------

/// Where the DRA plugin keeps its container index by default.
pub const DEFAULT_CONTAINER_INDEX: &str = "/var/lib/kubelet/plugins/gpu.cuslice.io/containers";

/// The annotations containerd's CRI puts on every container of a pod (containerd 1.6 and later).
pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
pub const CRI_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
pub const CRI_POD: &str = "io.kubernetes.cri.sandbox-name";
pub const CRI_POD_UID: &str = "io.kubernetes.cri.sandbox-uid";
pub const CRI_CONTAINER: &str = "io.kubernetes.cri.container-name";

/// One entry of the container index: the CDI devices of one prepared claim for one container of
/// one pod. A kubelet since 1.31 passes a DRA claim's devices to the runtime only in the CRI's
/// `CDIDevices` field, which containerd 1.6 ignores; so the DRA plugin writes, for each container
/// that uses a claim it prepares, a file `NAMESPACE_POD_CONTAINER_CLAIMUID.json` (Kubernetes
/// names hold no `_`) that cuslice-runtime finds from the CRI annotations of the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IndexEntry {
    /// The pod's uid: an entry of another pod of the same name (deleted and made again) is not
    /// this container's.
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    pub cdi_devices: Vec<String>,
    /// The claim's name (its namespace is the pod's), which the hook records for the node
    /// tools' `claim` label; absent in entries of plugins that did not write it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
}

fn index_part(what: &str, s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && s != "."
        && s != "..";
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} {s:?} is not a Kubernetes name (lower-case letters, digits, '-', '.')"
        ))
    }
}

/// The index file of (namespace, pod, container, claim uid).
pub fn index_file(
    namespace: &str,
    pod: &str,
    container: &str,
    claim_uid: &str,
) -> Result<String, String> {
    index_part("namespace", namespace)?;
    index_part("pod", pod)?;
    index_part("container", container)?;
    index_part("claim uid", claim_uid)?;
    Ok(format!("{namespace}_{pod}_{container}_{claim_uid}.json"))
}

/// The CDI device ids the container index gives the container a config.json describes, from its
/// CRI annotations: (where it came from, id). Nothing for a config without them, for a pod's
/// sandbox, or where `dir` does not exist. An entry of another pod uid is skipped (a stale entry
/// of a pod of the same name); an entry that cannot be read is an error naming the file.
pub fn indexed_devices(dir: &Path, config: &Value) -> Result<Vec<(String, String)>, String> {
    let a = |k: &str| {
        config
            .get("annotations")
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
    };
    if a(CRI_CONTAINER_TYPE) == Some("sandbox") {
        return Ok(Vec::new());
    }
    let (Some(ns), Some(pod), Some(container)) = (a(CRI_NAMESPACE), a(CRI_POD), a(CRI_CONTAINER))
    else {
        return Ok(Vec::new());
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(format!(
                "the DRA plugin's container index {}: {e}",
                dir.display()
            ));
        }
    };
    let prefix = format!("{ns}_{pod}_{container}_");
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".json"))
        })
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = match std::fs::read_to_string(&f) {
            Ok(t) => t,
            // Unprepared meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", f.display())),
        };
        let entry: IndexEntry = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{}: not an entry of the DRA plugin's container index ({e})",
                f.display()
            )
        })?;
        if a(CRI_POD_UID).is_some_and(|uid| !entry.pod_uid.is_empty() && entry.pod_uid != uid) {
            continue;
        }
        let source = format!("container {ns}/{pod}/{container} in {}", f.display());
        for id in entry.cdi_devices {
            parse_qualified(&id).map_err(|e| format!("{source}: {e}"))?;
            out.push((source.clone(), id));
        }
    }
    Ok(out)
}

/// The names of the claims the container index gives container `container` of pod
/// `namespace`/`pod` (uid `pod_uid` where known), sorted: what the hook records for the node
/// tools. Only for labels, so it never fails: a missing index, an entry of another pod uid, an
/// entry that cannot be read or names no claim are all left out.
pub fn indexed_claims(
    dir: &Path,
    namespace: &str,
    pod: &str,
    container: &str,
    pod_uid: Option<&str>,
) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let prefix = format!("{namespace}_{pod}_{container}_");
    let mut claims: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".json"))
        })
        .filter_map(|e| {
            // An entry is a few hundred bytes; a bigger file is not one.
            let text = std::fs::read(e.path())
                .ok()
                .filter(|t| t.len() <= 64 << 10)?;
            let entry: IndexEntry = serde_json::from_slice(&text).ok()?;
            if pod_uid.is_some_and(|uid| !entry.pod_uid.is_empty() && entry.pod_uid != uid) {
                return None;
            }
            entry.claim
        })
        .collect();
    claims.sort();
    claims.dedup();
    claims
}

// ---- applying edits to config.json --------------------------------------------------------

/// What the host says about a device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostNode {
    /// `c`, `b` or `p`.
    pub kind: char,
    pub major: i64,
    pub minor: i64,
    /// Permission bits.
    pub mode: u32,
}

/// `stat(2)` of a device node on the host (following symlinks, as CDI does).
pub fn host_node(path: &Path) -> Result<HostNode, String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(path).map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
    let t = m.file_type();
    let kind = if t.is_char_device() {
        'c'
    } else if t.is_block_device() {
        'b'
    } else if t.is_fifo() {
        'p'
    } else {
        return Err(format!("{} is not a device node", path.display()));
    };
    Ok(HostNode {
        kind,
        major: nix::sys::stat::major(m.rdev()) as i64,
        minor: nix::sys::stat::minor(m.rdev()) as i64,
        mode: m.mode() & 0o777,
    })
}

fn obj<'a>(v: &'a mut Value, what: &str) -> Result<&'a mut Map<String, Value>, String> {
    v.as_object_mut()
        .ok_or_else(|| format!("config.json: {what} is not an object"))
}

/// `parent[key]` as an object, made if missing.
fn child_obj<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
    what: &str,
) -> Result<&'a mut Map<String, Value>, String> {
    obj(parent.entry(key).or_insert_with(|| json!({})), what)
}

/// `parent[key]` as an array, made if missing.
fn child_arr<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
    what: &str,
) -> Result<&'a mut Vec<Value>, String> {
    parent
        .entry(key)
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .ok_or_else(|| format!("config.json: {what} is not an array"))
}

/// Applies `edits` to an OCI config.json: env entries replace earlier ones of the same name (or
/// are appended); device nodes go into `linux.devices` (replacing one at the same path), with
/// type, major and minor read from the host node (`stat` of hostPath, else path) where the edit
/// leaves them out, and an allow rule in `linux.resources.devices`; mounts go into `mounts`
/// (replacing one at the same destination; then sorted by depth, stably, as CDI does); hooks are
/// appended to `hooks.<hookName>`; additional gids to `process.user.additionalGids`. Applying
/// the same edits twice gives the same config (an identical hook or allow rule is not added
/// again).
pub fn apply_edits(
    config: &mut Value,
    edits: &ContainerEdits,
    stat: &dyn Fn(&Path) -> Result<HostNode, String>,
) -> Result<(), String> {
    edits.validate()?;
    let root = obj(config, "the spec")?;

    if !edits.env.is_empty() || !edits.additional_gids.is_empty() {
        let process = child_obj(root, "process", "process")?;
        for e in &edits.env {
            let env = child_arr(process, "env", "process.env")?;
            let name = &e[..=e.find('=').unwrap_or(0)];
            env.retain(|x| !x.as_str().is_some_and(|x| x.starts_with(name)));
            env.push(Value::from(e.as_str()));
        }
        if !edits.additional_gids.is_empty() {
            let user = child_obj(process, "user", "process.user")?;
            let gids = child_arr(user, "additionalGids", "process.user.additionalGids")?;
            for g in edits.additional_gids.iter().filter(|g| **g != 0) {
                if !gids.iter().any(|x| x.as_u64() == Some(u64::from(*g))) {
                    gids.push(Value::from(*g));
                }
            }
        }
    }

    if !edits.device_nodes.is_empty() {
        let uid = root
            .get("process")
            .and_then(|p| p.pointer("/user/uid"))
            .and_then(Value::as_u64)
            .filter(|u| *u > 0);
        let gid = root
            .get("process")
            .and_then(|p| p.pointer("/user/gid"))
            .and_then(Value::as_u64)
            .filter(|g| *g > 0);
        let linux = child_obj(root, "linux", "linux")?;
        let mut rules = Vec::new();
        {
            let devices = child_arr(linux, "devices", "linux.devices")?;
            for d in &edits.device_nodes {
                let host = d.host_path.as_deref().unwrap_or(&d.path);
                let mut kind = d.kind.clone().filter(|t| !t.is_empty());
                let (mut major, mut minor, mut mode) = (d.major, d.minor, d.file_mode);
                let complete = match kind.as_deref() {
                    Some("p") => true,
                    Some(_) => major.is_some() && minor.is_some(),
                    None => false,
                };
                if !complete {
                    let n = stat(Path::new(host))
                        .map_err(|e| format!("device node {}: {e}", d.path))?;
                    let host_kind = n.kind.to_string();
                    match kind.as_deref() {
                        None => kind = Some(host_kind),
                        // `u` (unbuffered character device) is what stat calls `c`.
                        Some(t) if t == host_kind || (t == "u" && n.kind == 'c') => {}
                        Some(t) => {
                            return Err(format!(
                                "device node {}: type {t:?} but {host} is of type {:?}",
                                d.path, n.kind
                            ));
                        }
                    }
                    if n.kind != 'p' {
                        major = major.or(Some(n.major));
                        minor = minor.or(Some(n.minor));
                    }
                    mode = mode.or(Some(n.mode));
                }
                let kind = kind.unwrap_or_default();
                let mut entry = Map::new();
                entry.insert("path".into(), Value::from(d.path.as_str()));
                entry.insert("type".into(), Value::from(kind.as_str()));
                if let (Some(ma), Some(mi)) = (major, minor) {
                    entry.insert("major".into(), Value::from(ma));
                    entry.insert("minor".into(), Value::from(mi));
                }
                if let Some(m) = mode {
                    entry.insert("fileMode".into(), Value::from(m));
                }
                if let Some(u) = d.uid.map(u64::from).or(uid) {
                    entry.insert("uid".into(), Value::from(u));
                }
                if let Some(g) = d.gid.map(u64::from).or(gid) {
                    entry.insert("gid".into(), Value::from(g));
                }
                devices.retain(|x| x.get("path").and_then(Value::as_str) != Some(&d.path));
                devices.push(Value::Object(entry));
                if matches!(kind.as_str(), "b" | "c" | "u") {
                    let access = match d.permissions.as_deref() {
                        None | Some("") => "rwm",
                        Some("none") => "",
                        Some(p) => p,
                    };
                    rules.push(json!({
                        "allow": true,
                        "type": if kind == "b" { "b" } else { "c" },
                        "major": major,
                        "minor": minor,
                        "access": access,
                    }));
                }
            }
        }
        let resources = child_obj(linux, "resources", "linux.resources")?;
        let existing = child_arr(resources, "devices", "linux.resources.devices")?;
        for r in rules {
            if !existing.contains(&r) {
                existing.push(r);
            }
        }
    }

    if !edits.mounts.is_empty() {
        let mounts = child_arr(root, "mounts", "mounts")?;
        for m in &edits.mounts {
            mounts.retain(|x| {
                x.get("destination").and_then(Value::as_str) != Some(&m.container_path)
            });
            let mut entry = Map::new();
            entry.insert("destination".into(), Value::from(m.container_path.as_str()));
            if let Some(t) = &m.kind {
                entry.insert("type".into(), Value::from(t.as_str()));
            }
            entry.insert("source".into(), Value::from(m.host_path.as_str()));
            if !m.options.is_empty() {
                entry.insert("options".into(), json!(m.options));
            }
            mounts.push(Value::Object(entry));
        }
        // Parents before what is mounted inside them.
        let depth = |m: &Value| {
            let d = m.get("destination").and_then(Value::as_str).unwrap_or("");
            Path::new(d).components().count()
        };
        mounts.sort_by_key(depth);
    }

    if !edits.hooks.is_empty() {
        let hooks = child_obj(root, "hooks", "hooks")?;
        for h in &edits.hooks {
            let list = child_arr(hooks, &h.hook_name, &format!("hooks.{}", h.hook_name))?;
            let mut entry = Map::new();
            entry.insert("path".into(), Value::from(h.path.as_str()));
            if !h.args.is_empty() {
                entry.insert("args".into(), json!(h.args));
            }
            if !h.env.is_empty() {
                entry.insert("env".into(), json!(h.env));
            }
            if let Some(t) = h.timeout {
                entry.insert("timeout".into(), Value::from(t));
            }
            // The same hook twice would run twice: applying edits again (a retried `create`
            // on the same bundle) changes nothing.
            let entry = Value::Object(entry);
            if !list.contains(&entry) {
                list.push(entry);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> Spec {
        claim_spec(
            &[ClaimDevice {
                name: "5d1f-gpu-0".into(),
                env: vec![
                    ("CUSLICE_MEMORY_LIMIT".into(), "1073741824".into()),
                    ("CUSLICE_CORE_REQUEST".into(), "30".into()),
                    ("CUSLICE_CORE_LIMIT".into(), "60".into()),
                ],
                device_nodes: vec![
                    ("/dev/nvidia0".into(), "/dev/nvidia0".into()),
                    ("/dev/nvidiactl".into(), "/dev/nvidiactl".into()),
                ],
                library_mounts: vec![(
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                )],
            }],
            "/usr/local/bin/cuslice-hook",
            "/usr/local/lib/cuslice/libcuslice.so",
        )
    }

    #[test]
    fn hook_convention() {
        assert_eq!(
            hook_args("poststop", "/l.so"),
            ["cuslice-hook", "poststop", "--library", "/l.so"]
        );
        let hooks = cuslice_hooks("/h", "/l.so");
        let names: Vec<&str> = hooks.iter().map(|h| h.hook_name.as_str()).collect();
        assert_eq!(names, HOOK_STAGES);
        assert_eq!(hooks[0].args, hook_args("createRuntime", "/l.so"));
        assert!(is_cuslice_hook(&json!({"path": "/opt/x/cuslice-hook"})));
        assert!(is_cuslice_hook(
            &json!({"path": "/wrap", "args": ["cuslice-hook", "poststop"]})
        ));
        assert!(!is_cuslice_hook(
            &json!({"path": "/usr/bin/nvidia-ctk", "args": ["nvidia-ctk"]})
        ));
    }

    #[test]
    fn the_claim_spec() {
        let spec = claim();
        spec.validate().unwrap();
        let v: Value = serde_json::from_str(&spec.to_json()).unwrap();
        assert_eq!(
            v,
            json!({
                "cdiVersion": "0.5.0",
                "kind": "gpu.cuslice.io/claim",
                "devices": [{
                    "name": "5d1f-gpu-0",
                    "containerEdits": {
                        "env": [
                            "CUSLICE_MEMORY_LIMIT=1073741824",
                            "CUSLICE_CORE_REQUEST=30",
                            "CUSLICE_CORE_LIMIT=60"
                        ],
                        "deviceNodes": [
                            {"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"},
                            {"path": "/dev/nvidiactl", "hostPath": "/dev/nvidiactl"}
                        ],
                        "mounts": [{
                            "hostPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                            "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                            "type": "bind",
                            "options": ["ro", "nosuid", "nodev", "bind"]
                        }]
                    }
                }],
                "containerEdits": {
                    "hooks": [
                        {
                            "hookName": "createRuntime",
                            "path": "/usr/local/bin/cuslice-hook",
                            "args": ["cuslice-hook", "createRuntime", "--library",
                                     "/usr/local/lib/cuslice/libcuslice.so"]
                        },
                        {
                            "hookName": "poststop",
                            "path": "/usr/local/bin/cuslice-hook",
                            "args": ["cuslice-hook", "poststop", "--library",
                                     "/usr/local/lib/cuslice/libcuslice.so"]
                        }
                    ]
                }
            })
        );
        assert_eq!(
            spec.qualified("5d1f-gpu-0"),
            "gpu.cuslice.io/claim=5d1f-gpu-0"
        );
        assert_eq!(claim_spec_file("5d1f"), "gpu.cuslice.io-5d1f.json");
        assert_eq!(claim_device_name("5d1f", "gpu-0"), "5d1f-gpu-0");
        // It reads back as it was written.
        assert_eq!(
            parse_spec(Path::new("x.json"), &spec.to_json()).unwrap(),
            spec
        );
    }

    #[test]
    fn ids() {
        assert_eq!(
            parse_qualified("gpu.cuslice.io/claim=5d1f-gpu-0"),
            Ok(("gpu.cuslice.io/claim", "5d1f-gpu-0"))
        );
        assert_eq!(
            parse_qualified("vendor.com/class=a:b"),
            Ok(("vendor.com/class", "a:b"))
        );
        for bad in [
            "",
            "gpu-0",
            "/dev/nvidia0",
            "gpu.cuslice.io=x",
            "gpu.cuslice.io/claim=",
            "=x",
            "1vendor/class=x",
            "vendor/class-=x",
            "vendor/cl ass=x",
            "vendor/class=-x",
            "vendor/class=x/y",
            "vendor/class=x,y",
        ] {
            let e = parse_qualified(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
            assert!(e.contains("VENDOR/CLASS=NAME") || e.contains("e.g."), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn annotations() {
        let config = json!({"annotations": {
            "cdi.k8s.io/gpu.cuslice.io_uid2": "gpu.cuslice.io/claim=b",
            "cdi.k8s.io/gpu.cuslice.io_uid1": "gpu.cuslice.io/claim=a,vendor.com/x=y",
            "other": "z",
        }});
        assert_eq!(
            annotated_devices(&config).unwrap(),
            [
                (
                    "cdi.k8s.io/gpu.cuslice.io_uid1".into(),
                    "gpu.cuslice.io/claim=a".into()
                ),
                (
                    "cdi.k8s.io/gpu.cuslice.io_uid1".into(),
                    "vendor.com/x=y".into()
                ),
                (
                    "cdi.k8s.io/gpu.cuslice.io_uid2".into(),
                    "gpu.cuslice.io/claim=b".into()
                ),
            ]
        );
        assert_eq!(annotated_devices(&json!({})).unwrap(), []);
        assert_eq!(
            annotated_devices(&json!({"annotations": {"a": "b"}})).unwrap(),
            []
        );
        let e =
            annotated_devices(&json!({"annotations": {"cdi.k8s.io/k": "v.com/c=a,,v.com/c=b"}}))
                .unwrap_err();
        assert!(e.starts_with("annotation cdi.k8s.io/k: \"\" is not"), "{e}");

        // A megabyte in an annotation's value, in a vendor, in a device name, or in its key: the
        // refusal shows 64 characters of each and the length.
        let mb = "x".repeat(1 << 20);
        for (k, v) in [
            ("cdi.k8s.io/k".to_owned(), mb.clone()),
            ("cdi.k8s.io/k".to_owned(), format!("{mb}!.com/c=d")),
            ("cdi.k8s.io/k".to_owned(), format!("v.com/c={mb}!")),
            (format!("cdi.k8s.io/{mb}"), "bad".to_owned()),
        ] {
            let Err(e) = annotated_devices(&json!({"annotations": {k: v}})) else {
                panic!("a megabyte in an annotation was taken");
            };
            assert!(
                e.len() < 1000 && e.contains("(1048"),
                "{} bytes: {}",
                e.len(),
                &e[..200]
            );
        }
    }

    #[test]
    fn spec_validation() {
        let mut s = claim();
        s.kind = "gpu.cuslice.io".into();
        assert!(s.validate().unwrap_err().contains("VENDOR/CLASS"));
        let mut s = claim();
        s.devices.push(s.devices[0].clone());
        assert!(s.validate().unwrap_err().contains("defined twice"));
        let mut s = claim();
        s.devices[0].container_edits.env.push("=x".into());
        assert!(s.validate().unwrap_err().contains("NAME=VALUE"));
        let mut s = claim();
        s.container_edits.hooks[0].hook_name = "prestop".into();
        assert!(s.validate().unwrap_err().contains("\"prestop\""));
        let mut s = claim();
        s.devices[0].container_edits.device_nodes[0].permissions = Some("rwx".into());
        assert!(s.validate().unwrap_err().contains("permissions"));
        let mut s = claim();
        s.devices[0].container_edits = ContainerEdits::default();
        assert!(s.validate().unwrap_err().contains("no containerEdits"));
    }

    #[test]
    fn atomic_write_and_remove() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("cdi");
        let path = write_spec(&sub, "gpu.cuslice.io-5d1f.json", &claim()).unwrap();
        assert_eq!(path, sub.join("gpu.cuslice.io-5d1f.json"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), claim().to_json());
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o644);
        }
        // Overwritten whole; no temporary file left.
        let mut other = claim();
        other.devices[0].container_edits.env = vec!["A=1".into()];
        write_spec(&sub, "gpu.cuslice.io-5d1f.json", &other).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), other.to_json());
        let names: Vec<_> = std::fs::read_dir(&sub)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["gpu.cuslice.io-5d1f.json"]);
        for bad in ["", ".json", "x.yaml", "a/b.json", ".x.json"] {
            assert!(write_spec(&sub, bad, &claim()).is_err(), "{bad:?}");
        }
        let mut invalid = claim();
        invalid.kind = "x".into();
        let e = write_spec(&sub, "bad.json", &invalid).unwrap_err();
        assert!(e.contains("not written"), "{e}");
        assert!(!sub.join("bad.json").exists());
        assert_eq!(remove_spec(&sub, "gpu.cuslice.io-5d1f.json"), Ok(true));
        assert_eq!(remove_spec(&sub, "gpu.cuslice.io-5d1f.json"), Ok(false));
        assert!(!path.exists());
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn registry_resolves_json_and_yaml() {
        let root = tempfile::tempdir().unwrap();
        let (etc, run) = (root.path().join("etc"), root.path().join("run"));
        write_spec(&run, &claim_spec_file("5d1f"), &claim()).unwrap();
        write(
            &etc,
            "vendor.yaml",
            "cdiVersion: 0.6.0\nkind: vendor.com/dev\ncontainerEdits:\n  env: [SPEC=1]\n\
             devices:\n- name: a\n  containerEdits:\n    env: [A=1]\n\
             - name: b\n  containerEdits:\n    env: [B=1]\n",
        );
        // Not specs: skipped, only mentioned when an id is not found.
        write(&etc, "broken.json", "{");
        write(&etc, "notes.txt", "x");
        write(&etc, ".hidden.json", "{");
        let missing = root.path().join("missing");
        let r = Registry::load(&[etc.clone(), run.clone(), missing.clone()]);
        let edits = r
            .resolve(&[
                "vendor.com/dev=a",
                "gpu.cuslice.io/claim=5d1f-gpu-0",
                "vendor.com/dev=b",
            ])
            .unwrap();
        // Spec-level edits once per spec, before its first device's.
        assert_eq!(edits.env[..2], ["SPEC=1", "A=1"]);
        assert_eq!(edits.env[2], "CUSLICE_MEMORY_LIMIT=1073741824");
        assert_eq!(edits.env.last().unwrap(), "B=1");
        assert_eq!(edits.hooks.len(), 2);
        assert_eq!(
            r.file_of("gpu.cuslice.io/claim=5d1f-gpu-0"),
            Some(run.join("gpu.cuslice.io-5d1f.json").as_path())
        );

        let e = r.resolve(&["gpu.cuslice.io/claim=nope"]).unwrap_err();
        assert_eq!(e.id, "gpu.cuslice.io/claim=nope");
        let searched = format!(
            "{}, {}, {}",
            etc.display(),
            run.display(),
            missing.display()
        );
        assert!(
            e.why.starts_with(&format!(
                "CDI device gpu.cuslice.io/claim=nope is not defined in any spec under {searched} \
                 (specs that could not be read: {}",
                etc.join("broken.json").display()
            )),
            "{e}"
        );
        assert!(!e.why.contains('\n'), "{e}");
        let e = r.resolve(&["nope"]).unwrap_err();
        assert!(e.why.contains("VENDOR/CLASS=NAME"), "{e}");
    }

    #[test]
    fn registry_priorities_and_conflicts() {
        let root = tempfile::tempdir().unwrap();
        let (etc, run) = (root.path().join("etc"), root.path().join("run"));
        let spec = |env: &str| {
            format!(
                r#"{{"cdiVersion":"0.5.0","kind":"v.com/c","devices":[{{"name":"d","containerEdits":{{"env":["{env}"]}}}}]}}"#
            )
        };
        write(&etc, "a.json", &spec("X=etc"));
        write(&run, "a.json", &spec("X=run"));
        let r = Registry::load(&[etc.clone(), run.clone()]);
        // The later directory wins.
        assert_eq!(r.resolve(&["v.com/c=d"]).unwrap().env, ["X=run"]);
        // The same definition twice in one directory is fine; a different one is a conflict.
        write(&run, "b.json", &spec("X=run"));
        let r = Registry::load(&[etc.clone(), run.clone()]);
        assert_eq!(r.resolve(&["v.com/c=d"]).unwrap().env, ["X=run"]);
        write(&run, "c.json", &spec("X=other"));
        let r = Registry::load(&[etc.clone(), run.clone()]);
        let e = r.resolve(&["v.com/c=d"]).unwrap_err();
        assert_eq!(
            e.why,
            format!(
                "CDI device v.com/c=d is defined differently in {} and {}; remove one",
                run.join("a.json").display(),
                run.join("c.json").display()
            )
        );
        // Edits cuslice-runtime does not apply are refused, not dropped.
        write(
            &etc,
            "rdt.json",
            r#"{"cdiVersion":"0.6.0","kind":"v.com/r","devices":[{"name":"d","containerEdits":{"intelRdt":{"closID":"x"}}}]}"#,
        );
        let r = Registry::load(&[etc]);
        let e = r.resolve(&["v.com/r=d"]).unwrap_err();
        assert!(e.why.contains("containerEdits.intelRdt"), "{e}");
    }

    fn null_node(_: &Path) -> Result<HostNode, String> {
        Ok(HostNode {
            kind: 'c',
            major: 1,
            minor: 3,
            mode: 0o666,
        })
    }

    #[test]
    fn edits_applied_to_config() {
        let mut config = json!({
            "process": {"env": ["PATH=/bin", "CUSLICE_CORE_LIMIT=10"], "user": {"uid": 0, "gid": 0}},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "source": "/old"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"}
            ],
            "hooks": {"poststop": [{"path": "/other"}]},
            "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}}
        });
        let mut edits = claim().container_edits;
        edits.append(&claim().devices[0].container_edits);
        let asked = std::cell::RefCell::new(Vec::new());
        let stat = |p: &Path| {
            asked.borrow_mut().push(p.to_path_buf());
            null_node(p)
        };
        apply_edits(&mut config, &edits, &stat).unwrap();
        assert_eq!(
            config["process"]["env"],
            json!([
                "PATH=/bin",
                "CUSLICE_MEMORY_LIMIT=1073741824",
                "CUSLICE_CORE_REQUEST=30",
                "CUSLICE_CORE_LIMIT=60"
            ])
        );
        assert_eq!(
            *asked.borrow(),
            [
                PathBuf::from("/dev/nvidia0"),
                PathBuf::from("/dev/nvidiactl")
            ]
        );
        assert_eq!(
            config["linux"]["devices"][0],
            json!({"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 3, "fileMode": 0o666})
        );
        assert_eq!(
            config["linux"]["resources"]["devices"],
            json!([
                {"allow": false, "access": "rwm"},
                {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}
            ])
        );
        let dests: Vec<&str> = config["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        assert_eq!(
            dests,
            ["/proc", "/dev", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"]
        );
        assert_eq!(
            config["mounts"][2],
            json!({
                "destination": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "type": "bind",
                "source": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "options": ["ro", "nosuid", "nodev", "bind"]
            })
        );
        assert_eq!(config["hooks"]["poststop"][0], json!({"path": "/other"}));
        assert_eq!(
            config["hooks"]["poststop"][1]["args"],
            json!([
                "cuslice-hook",
                "poststop",
                "--library",
                "/usr/local/lib/cuslice/libcuslice.so"
            ])
        );
        assert_eq!(
            config["hooks"]["createRuntime"][0]["path"],
            "/usr/local/bin/cuslice-hook"
        );
        // Twice is once: no second hook, rule, env entry, node or mount.
        let once = config.clone();
        apply_edits(&mut config, &edits, &stat).unwrap();
        assert_eq!(config, once);
    }

    #[test]
    fn device_node_details() {
        let node = |d: DeviceNode| ContainerEdits {
            device_nodes: vec![d],
            ..ContainerEdits::default()
        };
        // Complete nodes are not looked up; permissions reach the cgroup rule; a non-root
        // process owns its nodes; a node at the same path is replaced.
        let mut config = json!({
            "process": {"user": {"uid": 1000, "gid": 100}},
            "linux": {"devices": [{"path": "/dev/x", "type": "c", "major": 9, "minor": 9}]}
        });
        let never = |p: &Path| -> Result<HostNode, String> { panic!("stat {}", p.display()) };
        let d = DeviceNode {
            path: "/dev/x".into(),
            kind: Some("b".into()),
            major: Some(8),
            minor: Some(0),
            permissions: Some("rw".into()),
            ..DeviceNode::default()
        };
        apply_edits(&mut config, &node(d), &never).unwrap();
        assert_eq!(
            config["linux"]["devices"],
            json!([{"path": "/dev/x", "type": "b", "major": 8, "minor": 0, "uid": 1000, "gid": 100}])
        );
        assert_eq!(
            config["linux"]["resources"]["devices"],
            json!([{"allow": true, "type": "b", "major": 8, "minor": 0, "access": "rw"}])
        );
        // A type that disagrees with the host node; a host node that is missing.
        let d = DeviceNode {
            path: "/dev/y".into(),
            host_path: Some("/host/y".into()),
            kind: Some("b".into()),
            ..DeviceNode::default()
        };
        let e = apply_edits(&mut json!({}), &node(d), &null_node).unwrap_err();
        assert!(e.contains("/host/y is of type 'c'"), "{e}");
        let d = DeviceNode {
            path: "/dev/z".into(),
            ..DeviceNode::default()
        };
        let e = apply_edits(&mut json!({}), &node(d), &|p: &Path| host_node(p)).unwrap_err();
        assert_eq!(
            e,
            "device node /dev/z: cannot stat /dev/z: No such file or directory (os error 2)"
        );
        // The real host: /dev/null is character device 1:3.
        assert_eq!(host_node(Path::new("/dev/null")).unwrap().kind, 'c');
        assert_eq!(host_node(Path::new("/dev/null")).unwrap().major, 1);
        assert_eq!(host_node(Path::new("/dev/null")).unwrap().minor, 3);
        assert!(
            host_node(Path::new("/"))
                .unwrap_err()
                .contains("not a device node")
        );
        // Not an object.
        let d = DeviceNode {
            path: "/dev/a".into(),
            ..DeviceNode::default()
        };
        let e = apply_edits(&mut json!([]), &node(d), &null_node).unwrap_err();
        assert_eq!(e, "config.json: the spec is not an object");
        assert!(
            apply_edits(
                &mut json!({"mounts": {}}),
                &claim().devices[0].container_edits,
                &null_node
            )
            .unwrap_err()
            .contains("is not an array")
        );
    }

    #[test]
    fn container_index_gives_a_pods_container_its_devices() {
        let d = tempfile::tempdir().unwrap();
        let write = |name: &str, uid: &str, ids: &[&str]| {
            let e = IndexEntry {
                pod_uid: uid.into(),
                cdi_devices: ids.iter().map(|s| s.to_string()).collect(),
                claim: None,
            };
            std::fs::write(d.path().join(name), serde_json::to_string(&e).unwrap()).unwrap();
        };
        let f = index_file("default", "inference", "main", "u1").unwrap();
        assert_eq!(f, "default_inference_main_u1.json");
        write(&f, "p1", &["gpu.cuslice.io/claim=u1-gpu-0"]);
        write(
            &index_file("default", "inference", "sidecar", "u1").unwrap(),
            "p1",
            &["gpu.cuslice.io/claim=u1-gpu-9"],
        );
        write(
            &index_file("default", "inference", "main", "u0").unwrap(),
            "p0",
            &["gpu.cuslice.io/claim=u0-gpu-0"],
        );
        let config = |kind: &str, uid: Option<&str>| {
            let mut a = json!({CRI_CONTAINER_TYPE: kind, CRI_NAMESPACE: "default",
                               CRI_POD: "inference", CRI_CONTAINER: "main"});
            if let Some(u) = uid {
                a[CRI_POD_UID] = json!(u);
            }
            json!({ "annotations": a })
        };
        let ids = |v: Vec<(String, String)>| v.into_iter().map(|(_, id)| id).collect::<Vec<_>>();
        // The pod of uid p1: its main container's entry, not the sidecar's, not p0's.
        assert_eq!(
            ids(indexed_devices(d.path(), &config("container", Some("p1"))).unwrap()),
            ["gpu.cuslice.io/claim=u1-gpu-0"]
        );
        // Without a uid annotation: every entry of that name.
        assert_eq!(
            indexed_devices(d.path(), &config("container", None))
                .unwrap()
                .len(),
            2
        );
        assert!(
            indexed_devices(d.path(), &config("sandbox", Some("p1")))
                .unwrap()
                .is_empty()
        );
        assert!(indexed_devices(d.path(), &json!({})).unwrap().is_empty());
        assert!(
            indexed_devices(&d.path().join("none"), &config("container", None))
                .unwrap()
                .is_empty()
        );
        std::fs::write(d.path().join("default_inference_main_u2.json"), "{").unwrap();
        let e = indexed_devices(d.path(), &config("container", Some("p1"))).unwrap_err();
        assert!(
            e.contains("default_inference_main_u2.json: not an entry"),
            "{e}"
        );
        for bad in ["Default", "a_b", "", "..", "a/b"] {
            assert!(index_file(bad, "p", "c", "u").is_err(), "{bad}");
        }
    }
}
