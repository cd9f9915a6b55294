//! `cuslice set TARGET [--device N] --memory-limit SIZE --core-limit P --core-request P
//! --priority X`: changes a running slice's limits and priority from the node, without a restart
//! (docs/live-limits.md).
//!
//! - TARGET is what `cuslice status` shows: a container's id (or a unique prefix of it), its
//!   name or pod/container, or a standalone slice's CUSLICE_STATE_DIR.
//! - `--device` (an index as the slice sees it, or a GPU UUID) changes the limits of that device
//!   alone; without it, of every device of the slice.
//! - Every value is checked before anything is written, and so is the device: a core request
//!   that would take the requests of the slices on a device past 100% is refused. The check and
//!   the writes are one step against any other `cuslice set` on the node (`requests`). A refusal
//!   is one line and changes nothing.
//! - What is written, in this order: a container's hook file (`slice/config`, the authoritative
//!   record, read-only inside the container; replaced atomically), then the slice's grant on the
//!   node's compute board (what other slices let it claim), then the slice's ledger (what the
//!   slice's processes enforce: the cap at their next allocation, the core request and limit at
//!   their meter's next period, when they also post the new claim on the board).
//! - Nothing of the slice's own files is locked or waited for: a tenant holding its ledger's
//!   locks cannot hold up the node's tools.
//!
//! Nothing is freed: a cap lowered below what the slice holds refuses new allocations until the
//! slice is under it.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cuslice_policy::config::live::{LiveLimit, RequestAboveLimit, live_core, parse_live};
use cuslice_policy::config::{Config, MAX_ORDINAL, hook_file};
use cuslice_policy::echo::{one_line, quoted};
use cuslice_policy::format_size;
use cuslice_policy::grant::{self, Grant};
use cuslice_policy::priority::Priority;
use cuslice_policy::share::FULL;
use cuslice_state::board;
use cuslice_state::fsio::{self, Durability};
use cuslice_state::host::{Record, Root};
use cuslice_state::ledger::{self, Ledger, LiveChange};
use cuslice_state::uuid_string;

use crate::nvml::Nvml;
use crate::requests::Requests;
use cuslice_policy::config::gpus::NvmlGpu;

/// In a container's host-only state directory: device UUID -> what the slice held when
/// `cuslice set` lowered its cap below that (read by the node agent).
pub const LOWERED: &str = "lowered.json";

/// Where the node's compute board is unless told otherwise (the hook's and the interposer's
/// default).
pub const DEFAULT_NODE_DIR: &str = board::DEFAULT_DIR;

/// What to change; each value as the user wrote it.
#[derive(Debug, Clone, Default)]
pub struct Change {
    pub memory_limit: Option<String>,
    pub core_limit: Option<String>,
    pub core_request: Option<String>,
    pub priority: Option<String>,
    /// The one device to change (an index as the slice sees it, or a GPU UUID); None: every
    /// device of the slice.
    pub device: Option<String>,
}

/// Where slices live on this node.
#[derive(Debug, Clone)]
pub struct Places {
    /// The OCI hook's state root (`/run/cuslice`).
    pub state_root: PathBuf,
    /// The node's compute board (the hook's `--node-dir`, a standalone slice's
    /// CUSLICE_NODE_DIR; by default /dev/shm/cuslice).
    pub node_dir: PathBuf,
}

/// A slice found by its TARGET.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// How messages name it.
    pub label: String,
    pub ledger: PathBuf,
    /// The hook file, for a container.
    pub config: Option<PathBuf>,
    /// The container's host-only state directory (`containers/<id>/`).
    pub dir: Option<PathBuf>,
}

/// Finds the slice `target` names: a running container of the hook's (id, unique id prefix,
/// name, pod/container), else a standalone slice's state directory. Err: one line.
pub fn resolve(target: &str, state_root: &Path) -> Result<Target, String> {
    let root = Root::new(state_root);
    let mut live: Vec<Record> = root.records().into_iter().filter(|r| r.alive()).collect();
    live.sort_by(|a, b| a.id.cmp(&b.id));
    let exact: Vec<&Record> = live
        .iter()
        .filter(|r| r.id == target || r.name.as_deref() == Some(target))
        .collect();
    let matches = if exact.is_empty() && !target.is_empty() {
        live.iter().filter(|r| r.id.starts_with(target)).collect()
    } else {
        exact
    };
    match matches.as_slice() {
        [r] => {
            let slice = root.mnt(&r.id).join("slice");
            return Ok(Target {
                label: match &r.name {
                    Some(n) => format!("container {} ({n})", short(&r.id)),
                    None => format!("container {}", short(&r.id)),
                },
                ledger: slice.join(ledger::FILE_NAME),
                config: Some(slice.join("config")),
                dir: Some(root.dir(&r.id)),
            });
        }
        [] => {}
        many => {
            let ids: Vec<&str> = many.iter().map(|r| short(&r.id)).collect();
            return Err(format!(
                "{} names {} containers ({}); give more of the id",
                quoted(target),
                many.len(),
                ids.join(", ")
            ));
        }
    }
    let dir = Path::new(target);
    if dir.join(ledger::FILE_NAME).is_file() {
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        return Ok(Target {
            label: format!("slice {}", dir.display()),
            ledger: dir.join(ledger::FILE_NAME),
            config: None,
            dir: None,
        });
    }
    Err(format!(
        "{} is neither a running container under {} (by id, id prefix, name or \
         pod/container) nor a standalone slice's CUSLICE_STATE_DIR (a directory with a ledger); \
         `cuslice status` lists the slices",
        quoted(target),
        state_root.display()
    ))
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// The checked values of a `Change`.
struct Values {
    memory: Option<u64>,
    core_limit: Option<u32>,
    core_request: Option<u32>,
    /// `Priority::code`.
    priority: Option<u32>,
    /// For the hook file: (which, the value as written).
    written: Vec<(LiveLimit, String)>,
}

fn values(c: &Change) -> Result<Values, String> {
    let mut v = Values {
        memory: None,
        core_limit: None,
        core_request: None,
        priority: None,
        written: Vec::new(),
    };
    for (what, given) in [
        (LiveLimit::Memory, &c.memory_limit),
        (LiveLimit::CoreLimit, &c.core_limit),
        (LiveLimit::CoreRequest, &c.core_request),
        (LiveLimit::Priority, &c.priority),
    ] {
        let Some(given) = given else { continue };
        let n = parse_live(what, given).map_err(|e| refused_value(what, given, &e))?;
        match what {
            LiveLimit::Memory => v.memory = Some(n),
            LiveLimit::CoreLimit => v.core_limit = Some(n as u32),
            LiveLimit::CoreRequest => v.core_request = Some(n as u32),
            LiveLimit::Priority => v.priority = Some(n as u32),
        }
        v.written.push((what, given.trim().to_string()));
    }
    if v.written.is_empty() {
        return Err(
            "nothing to change; give --memory-limit SIZE, --core-limit PERCENT, \
             --core-request PERCENT and/or --priority high|normal|low"
                .to_string(),
        );
    }
    Ok(v)
}

/// The flag that names `what` on `cuslice set`'s command line.
pub fn flag(what: LiveLimit) -> &'static str {
    match what {
        LiveLimit::Memory => "--memory-limit",
        LiveLimit::CoreLimit => "--core-limit",
        LiveLimit::CoreRequest => "--core-request",
        LiveLimit::Priority => "--priority",
    }
}

/// A refused value, worded with its flag: `--memory-limit "12XB" is not a size (unknown unit);
/// write e.g. --memory-limit 4GiB (...)`. One line.
fn refused_value(what: LiveLimit, given: &str, e: &cuslice_policy::ConfigError) -> String {
    let example = e
        .example
        .split_once('=')
        .map_or(e.example.as_str(), |(_, v)| v);
    one_line(&format!(
        "{} {} {}; write e.g. {} {example}",
        flag(what),
        quoted(given),
        e.problem,
        flag(what),
    ))
}

fn request_above_limit(e: RequestAboveLimit) -> String {
    format!(
        "a core request of {}% above a core limit of {}% cannot be met; give {} at most {} (or \
         raise {} with it)",
        e.request,
        e.limit,
        flag(LiveLimit::CoreRequest),
        e.limit,
        flag(LiveLimit::CoreLimit)
    )
}

fn pct(ppm: u32) -> String {
    if ppm >= FULL {
        "none".to_string()
    } else {
        format!("{}%", ppm.div_ceil(FULL / 100))
    }
}

/// A device named by `--device`: an index, or a GPU UUID (or a prefix of one that names one
/// device, as `CUDA_VISIBLE_DEVICES` takes them).
#[derive(Debug, Clone, PartialEq, Eq)]
enum DeviceArg {
    Index(u32),
    Uuid(String),
}

fn device_arg(given: &str) -> Result<DeviceArg, String> {
    let g = given.trim();
    if let Ok(i) = g.parse::<u32>() {
        if i > MAX_ORDINAL {
            return Err(format!(
                "--device {} is out of range; a device index is from 0 to {MAX_ORDINAL}; write \
                 e.g. --device 0 (the first device the slice sees), or its UUID",
                quoted(given)
            ));
        }
        return Ok(DeviceArg::Index(i));
    }
    if g.len() > 4 && g.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("GPU-")) {
        return Ok(DeviceArg::Uuid(g.to_ascii_lowercase()));
    }
    Err(format!(
        "--device {} is neither a device index nor a GPU UUID; write e.g. --device 0 (the \
         first device the slice sees) or --device GPU-... (as `cuslice status` shows it)",
        quoted(given)
    ))
}

/// The slice's devices in the order its processes see them (the order its first process
/// registered them in the ledger: CUDA's ordinals, as `CUSLICE_MEMORY_LIMIT_<i>` counts them),
/// as `index: UUID`, for a refusal.
fn listed(devices: &[String]) -> String {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| format!("{i}: {d}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which of `devices` `arg` names: its index among them. Err: one line.
fn pick(label: &str, devices: &[String], arg: &DeviceArg) -> Result<usize, String> {
    let found: Vec<usize> = devices
        .iter()
        .enumerate()
        .filter(|(i, d)| match arg {
            DeviceArg::Index(n) => *i == *n as usize,
            DeviceArg::Uuid(u) => d.to_ascii_lowercase().starts_with(u),
        })
        .map(|(i, _)| i)
        .collect();
    match found.as_slice() {
        [i] => Ok(*i),
        [] => Err(format!(
            "{label} has no device {}; its devices are {}",
            match arg {
                DeviceArg::Index(i) => i.to_string(),
                DeviceArg::Uuid(u) => quoted(u).to_string(),
            },
            listed(devices)
        )),
        _ => Err(format!(
            "{label}: --device {} names {} of its devices ({}); give more of the UUID",
            match arg {
                DeviceArg::Index(i) => i.to_string(),
                DeviceArg::Uuid(u) => quoted(u).to_string(),
            },
            found.len(),
            listed(devices)
        )),
    }
}

/// Where the hook recorded a container's GPUs (its settings name devices by ordinal), the
/// container's GPUs (UUIDs) in that numbering, from this host's NVML. None: the slice's devices
/// are numbered as its first process saw them (the ledger's order).
fn container_order(t: &Target) -> Result<Option<Vec<String>>, String> {
    let Some(text) = t.config.as_ref().and_then(|p| fs::read_to_string(p).ok()) else {
        return Ok(None);
    };
    let c = Config::from_hook_file(&text, std::iter::empty::<(&str, &str)>())
        .map_err(|e| format!("{}: {e}", t.label))?;
    let Some(gpus) = c.gpus().filter(|_| !c.mentioned_ordinals().is_empty()) else {
        return Ok(None);
    };
    let listed = Nvml::open().and_then(|n| {
        n.devices()?
            .into_iter()
            .map(|d| {
                Ok(NvmlGpu {
                    uuid: n.uuid(d)?,
                    minor: n.minor(d)?,
                })
            })
            .collect::<Result<Vec<_>, String>>()
    });
    let listed = listed.map_err(|e| {
        format!(
            "{}: its per-device limits number its GPUs by NVML's list, which cannot be read: {e}",
            t.label
        )
    })?;
    Ok(Some(gpus.order(&listed, true)))
}

/// Changes the limits of the slice `target` names. Ok: what changed, one line per device.
/// Err: one line; nothing was changed.
pub fn set(target: &str, change: &Change, places: &Places) -> Result<String, String> {
    let v = values(change)?;
    let device = change.device.as_deref().map(device_arg).transpose()?;
    if device.is_some() && v.priority.is_some() {
        return Err(
            "--priority is the slice's on every device, not one device's; give it without \
             --device"
                .to_string(),
        );
    }
    let t = resolve(target, &places.state_root)?;
    // A container's: the hooks' lock, so that two changes (or a change and the container's
    // poststop) do not interleave.
    let _lock = match &t.config {
        Some(_) => Some(
            Root::new(&places.state_root)
                .lock()
                .map_err(|e| format!("{}: {e}", places.state_root.display()))?,
        ),
        None => None,
    };
    // A core request: no other `cuslice set` on the node checks or writes one until this one
    // has written its own (docs/live-limits.md).
    let mut requests = match v.core_request {
        Some(_) if places.node_dir.is_dir() => Some(Requests::lock(&places.node_dir)?),
        _ => None,
    };
    let snap = Ledger::read(&t.ledger).map_err(|e| e.to_string())?;
    if snap.devices.is_empty() && t.config.is_none() {
        return Err(format!(
            "{}: no process of it has initialised CUDA yet, so it has no limits to change; a \
             standalone slice's limits come from the environment of its processes until then",
            t.label
        ));
    }
    // The device `--device` names: its index in the ledger, which is its ordinal in the hook
    // file. A container none of whose processes has used a device yet can still be given a
    // limit for an ordinal, in its hook file.
    let (chosen, ordinal) = match &device {
        None => (None, None),
        Some(DeviceArg::Index(i)) if snap.devices.is_empty() => (None, Some(*i)),
        Some(arg) if snap.devices.is_empty() => {
            return Err(format!(
                "{}: no process of it has used a device yet, so no device has the UUID {}; \
                 give its index (--device 0 for the first device it sees)",
                t.label,
                quoted(match arg {
                    DeviceArg::Uuid(u) => u.as_str(),
                    DeviceArg::Index(_) => "",
                })
            ));
        }
        Some(arg) => {
            let uuids: Vec<String> = snap.devices.iter().map(|d| uuid_string(&d.uuid)).collect();
            match container_order(&t)? {
                // The container's numbering, as its hook recorded its GPUs: the ordinal is the
                // GPU's place there, whatever order the slice's first process saw them in. A GPU
                // no process has used yet has no device in the ledger to change now.
                Some(order) => {
                    let o = pick(&t.label, &order, arg)?;
                    let in_ledger = uuids.iter().position(|d| *d == order[o]);
                    (Some(in_ledger.unwrap_or(usize::MAX)), Some(o as u32))
                }
                None => {
                    let i = pick(&t.label, &uuids, arg)?;
                    (Some(i), Some(i as u32))
                }
            }
        }
    };
    // Every device first: the new core request and limit, and room for the request.
    let mut plans = Vec::new();
    for (i, d) in snap.devices.iter().enumerate() {
        if chosen.is_some_and(|c| c != i) {
            continue;
        }
        let uuid = uuid_string(&d.uuid);
        let core = if v.core_limit.is_some() || v.core_request.is_some() {
            let c = live_core((d.core_request, d.core_limit), v.core_request, v.core_limit)
                .map_err(|e| format!("{} on {uuid}: {}", t.label, request_above_limit(e)))?;
            let taken = match &requests {
                Some(r) => r.taken(&places.node_dir, &d.uuid, snap.slice_id),
                None => board::requested(&places.node_dir, &d.uuid, snap.slice_id),
            };
            if c.0 > 0 && taken.saturating_add(c.0) > FULL {
                return Err(refused_claim(&t.label, &uuid, taken, c.0));
            }
            Some(c)
        } else {
            None
        };
        plans.push((
            d,
            uuid,
            LiveChange {
                memory: v.memory,
                core,
                priority: v.priority,
            },
        ));
    }
    // The hook file as it will be: checked (a request above the limit, for every device it
    // names) before anything is written.
    let config = match &t.config {
        Some(path) => {
            let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let new = match ordinal {
                Some(o) => hook_file::rewrite_device(&text, o, &v.written),
                None => hook_file::rewrite(&text, &v.written),
            }
            .map_err(|e| format!("{}: the change would make it unusable: {e}", t.label))?;
            Some((path, new))
        }
        None => None,
    };
    // A container's cap lowered below what it holds: what it held, for the node agent, which
    // then kills nothing for it under `--enforce stop` (docs/live-limits.md). Written before
    // the hook file, whose replacement makes the agent read both again.
    if let (Some(dir), Some(cap)) = (&t.dir, v.memory) {
        let path = dir.join(LOWERED);
        let mut lowered: BTreeMap<String, u64> = fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        for (d, uuid, _) in &plans {
            if d.used > cap {
                lowered.insert(uuid.clone(), d.used);
            } else {
                lowered.remove(uuid);
            }
        }
        let text = serde_json::to_vec_pretty(&lowered).map_err(|e| e.to_string())?;
        write_keeping_mode(&path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some((path, text)) = &config {
        write_keeping_mode(path, text.as_bytes())
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    // What the other slices let it claim: for a container, what its new hook file sets; for a
    // standalone slice, its grant with the new values.
    // A container's grant is written where the hook made it, in the slice's own space (the
    // board shows it read-only); a standalone slice's, and one of the previous release, on the
    // board itself.
    let board_place = board::slice_dir(&places.node_dir, snap.slice_id);
    let own = t
        .dir
        .as_ref()
        .map(|d| d.join("mnt").join(cuslice_state::host::OWN_PLACE))
        .filter(|p| p.is_dir());
    let place = own.unwrap_or(board_place);
    let grant_path = place.join(board::GRANT);
    if place.is_dir() {
        let old = board::read_grant(&grant_path);
        let grant = match &config {
            Some((_, text)) => Grant::from_config(
                &Config::from_hook_file(text, std::iter::empty::<(&str, &str)>())
                    .map_err(|e| format!("{}: {e}", t.label))?,
                old.origin,
            ),
            // The most it may claim on any device: for one device, what it may claim there
            // now or on another.
            None => {
                let ppm = |p: u32, old: u32| {
                    let new = p.min(100) * (FULL / 100);
                    if device.is_some() { new.max(old) } else { new }
                };
                Grant {
                    request: v.core_request.map_or(old.request, |p| ppm(p, old.request)),
                    limit: v.core_limit.map_or(old.limit, |p| ppm(p, old.limit)),
                    priority: v.priority.map_or(old.priority, Priority::from_code),
                    memory: match v.memory {
                        Some(m) if device.is_some() => grant::larger_cap(old.memory, Some(m)),
                        Some(m) => Some(m),
                        None => old.memory,
                    },
                    freezes: old.freezes,
                    origin: old.origin,
                }
            }
        };
        board::write_grant(&grant_path, &grant, 0o644)
            .map_err(|e| format!("{}: {e}", grant_path.display()))?;
    }
    let mut lines = Vec::new();
    for (d, uuid, live) in &plans {
        Ledger::set_live(&t.ledger, &d.uuid, live).map_err(|e| e.to_string())?;
        if let (Some(r), Some((request, _))) = (requests.as_mut(), live.core) {
            r.note(snap.slice_id, &d.uuid, request);
        }
        let mut what = Vec::new();
        if let Some(m) = live.memory {
            let was = d.limit.map_or("none".to_string(), format_size);
            let mut s = format!("memory limit {} (was {was})", format_size(m));
            if d.used > m {
                s.push_str(&format!(
                    "; it holds {}, so allocations are refused until it is under",
                    format_size(d.used)
                ));
            }
            what.push(s);
        }
        if let Some((request, limit)) = live.core {
            if v.core_limit.is_some() {
                what.push(format!(
                    "core limit {} (was {})",
                    pct(limit),
                    pct(d.core_limit)
                ));
            }
            if v.core_request.is_some() {
                // A request of 100% is a request (the whole device when contended), not "none"
                // as a limit of 100% is.
                let req = |r: u32| {
                    if r == 0 {
                        "none".to_string()
                    } else {
                        format!("{}%", r.min(FULL).div_ceil(FULL / 100))
                    }
                };
                what.push(format!(
                    "core request {} (was {})",
                    req(request),
                    req(d.core_request)
                ));
            }
        }
        if let Some(code) = live.priority {
            what.push(format!(
                "priority {} (was {})",
                Priority::from_code(code),
                Priority::from_code(d.priority)
            ));
        }
        lines.push(format!("{} on {uuid}: {}", t.label, what.join(", ")));
    }
    if let Some(r) = requests {
        r.save(&places.node_dir)?;
    }
    if plans.is_empty() {
        lines.push(format!(
            "{}{}: {} (its processes have not used {} yet; they start with it)",
            t.label,
            ordinal.map_or(String::new(), |o| format!(" on device {o}")),
            v.written
                .iter()
                .map(|(w, s)| format!("{} {s}", flag(*w)))
                .collect::<Vec<_>>()
                .join(", "),
            if ordinal.is_some() {
                "that device"
            } else {
                "a device"
            }
        ));
    }
    Ok(lines.join("\n"))
}

fn refused_claim(label: &str, uuid: &str, taken: u32, asked: u32) -> String {
    let pct = |ppm: u32| ppm.div_ceil(FULL / 100);
    format!(
        "{label}: a core request of {}% would take device {uuid} past 100% (the other slices \
         there request {}%); give at most --core-request {}",
        pct(asked),
        pct(taken),
        100u32.saturating_sub(pct(taken))
    )
}

/// Replaces `path` by a file holding `text`, atomically (a reader sees the old file or the new,
/// never a part), with the old file's mode (0644 for a new one). The file is fsynced, its
/// directory not.
fn write_keeping_mode(path: &Path, text: &[u8]) -> io::Result<()> {
    let mode = fs::metadata(path).map_or(0o644, |m| m.permissions().mode() & 0o7777);
    fsio::write_atomic(path, text, mode, Durability::File)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state root with running "containers" (this test process as their init).
    fn root(containers: &[(&str, Option<&str>)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let pid = std::process::id() as i32;
        for (id, name) in containers {
            fs::create_dir_all(root.mnt(id).join("slice")).unwrap();
            root.write_record(&Record {
                id: id.to_string(),
                pid,
                start: cuslice_state::host::start_time(pid).unwrap(),
                rootfs: PathBuf::from("/"),
                name: name.map(str::to_string),
                kubernetes: None,
                created: Vec::new(),
                ledger_version: None,
                slurm: None,
            })
            .unwrap();
        }
        dir
    }

    #[test]
    fn refused_values_are_named_by_their_flags() {
        let c = |memory: &str, core: Option<&str>, priority: Option<&str>| {
            values(&Change {
                memory_limit: Some(memory.to_string()),
                core_limit: core.map(str::to_string),
                core_request: None,
                priority: priority.map(str::to_string),
                device: None,
            })
            .map(|v| (v.memory, v.core_limit, v.priority))
        };
        assert_eq!(
            c("2GiB", Some("60"), Some("high")),
            Ok((Some(2 << 30), Some(60), Some(Priority::High.code())))
        );
        let e = c("12XB", None, None).unwrap_err();
        assert!(
            e.starts_with("--memory-limit \"12XB\" is not a size"),
            "{e}"
        );
        assert!(e.contains("write e.g. --memory-limit 4GiB"), "{e}");
        for bad in ["0", "101", "", "x"] {
            let e = c("1GiB", Some(bad), None).unwrap_err();
            assert!(e.starts_with(&format!("--core-limit {bad:?}")), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let e = c("1GiB", None, Some("urgent")).unwrap_err();
        assert_eq!(
            e,
            "--priority \"urgent\" is not a priority (high, normal or low); write e.g. \
             --priority high"
        );
        let e = c("18446744073709551615", None, None).unwrap_err();
        assert!(
            e.starts_with("--memory-limit \"18446744073709551615\" is too large"),
            "{e}"
        );
        assert!(e.contains("at most 1 PiB"), "{e}");
        let long = format!("{}XB", "9".repeat(1 << 20));
        let cut = format!("\"{}\"… ({} bytes)", &long[..64], long.len());
        let e = c(&long, None, None).unwrap_err();
        assert!(e.len() < 600, "{} bytes", e.len());
        assert!(e.starts_with(&format!("--memory-limit {cut}")), "{e}");
        let e = c("1GiB", None, Some(&long)).unwrap_err();
        assert!(e.starts_with(&format!("--priority {cut}")), "{e}");
    }

    #[test]
    fn a_device_is_an_index_or_a_uuid_and_anything_else_is_refused_in_one_line() {
        assert_eq!(device_arg("1"), Ok(DeviceArg::Index(1)));
        assert_eq!(device_arg(" 0 "), Ok(DeviceArg::Index(0)));
        assert_eq!(
            device_arg("GPU-ABC"),
            Ok(DeviceArg::Uuid("gpu-abc".to_string()))
        );
        for (bad, says) in [
            ("64", "out of range"),
            ("-1", "neither a device index nor a GPU UUID"),
            ("gpu0", "neither"),
            ("GPU-", "neither"),
            ("GPé-1", "neither"),
            ("", "neither"),
        ] {
            let e = device_arg(bad).unwrap_err();
            assert!(e.starts_with(&format!("--device {}", quoted(bad))), "{e}");
            assert!(e.contains(says), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let devices = [uuid_string(&[0xaa; 16]), uuid_string(&[0xab; 16])];
        let second = devices[1].clone();
        assert_eq!(pick("s", &devices, &DeviceArg::Index(1)), Ok(1));
        assert_eq!(pick("s", &devices, &device_arg(&second).unwrap()), Ok(1));
        assert_eq!(
            pick("s", &devices, &device_arg(&second[..10]).unwrap()),
            Ok(1)
        );
        let e = pick("s", &devices, &DeviceArg::Index(2)).unwrap_err();
        assert!(
            e.starts_with("s has no device 2; its devices are 0: GPU-aaaa"),
            "{e}"
        );
        let e = pick("s", &devices, &device_arg("GPU-a").unwrap()).unwrap_err();
        assert!(e.contains("names 2 of its devices"), "{e}");
        let e = pick("s", &devices, &device_arg("GPU-ff").unwrap()).unwrap_err();
        assert!(e.starts_with("s has no device \"gpu-ff\""), "{e}");
    }

    #[test]
    fn a_request_above_the_limit_names_both_flags() {
        let e = request_above_limit(RequestAboveLimit {
            request: 40,
            limit: 30,
        });
        assert_eq!(
            e,
            "a core request of 40% above a core limit of 30% cannot be met; give --core-request \
             at most 30 (or raise --core-limit with it)"
        );
    }

    #[test]
    fn a_target_is_an_id_a_unique_prefix_a_name_or_pod_container_or_a_state_dir() {
        let r = root(&[
            ("3f2a9c1e0b7d11", Some("job-0/trainer")),
            ("3f2a77aa", Some("web")),
            ("9999", None),
        ]);
        let id = |t: &str| {
            resolve(t, r.path()).map(|t| t.ledger.parent().unwrap().parent().unwrap().to_path_buf())
        };
        let mnt = |id: &str| Root::new(r.path()).mnt(id);
        assert_eq!(id("3f2a9c1e0b7d11"), Ok(mnt("3f2a9c1e0b7d11")));
        assert_eq!(id("3f2a9"), Ok(mnt("3f2a9c1e0b7d11")));
        assert_eq!(id("job-0/trainer"), Ok(mnt("3f2a9c1e0b7d11")));
        assert_eq!(id("web"), Ok(mnt("3f2a77aa")));
        let e = id("3f2a").unwrap_err();
        assert!(e.contains("names 2 containers"), "{e}");
        let e = id("nothing").unwrap_err();
        assert!(e.contains("`cuslice status` lists the slices"), "{e}");
        let long = "x".repeat(100_000);
        let e = id(&long).unwrap_err();
        assert!(e.len() < 600, "{} bytes", e.len());
        assert!(e.starts_with(&quoted(&long)), "{}", &e[..100]);
        let t = resolve("9999", r.path()).unwrap();
        assert_eq!(t.config, Some(mnt("9999").join("slice/config")));
        // A standalone slice: a directory with a ledger.
        let sd = tempfile::tempdir().unwrap();
        fs::write(sd.path().join(ledger::FILE_NAME), b"").unwrap();
        let t = resolve(sd.path().to_str().unwrap(), r.path()).unwrap();
        assert_eq!((t.config, t.dir), (None, None));
        assert_eq!(t.ledger, sd.path().join(ledger::FILE_NAME));
    }
}
