//! Gathers the node's view: the container slices the OCI hook keeps under the state root
//! (`/run/cuslice/containers/<id>/`), the standalone slices named by their state directories,
//! and the GPUs from NVML. No slice is joined and nothing is changed, with one exception: each
//! container process's slot in its ledger is told the process's host pid (see
//! `Ledger::tell_host_pids`).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use cuslice_policy::priority::Priority;
use cuslice_state::agent;
use cuslice_state::host::{Kubernetes, Record, Root};
use cuslice_state::ledger::{self, Ledger};
use cuslice_state::snapshot::{MeteredBy, Snapshot};
use cuslice_state::uuid_string;

use crate::nvml::{self, Gpu};
use crate::view::{Agent, Compute, Device, Memory, Node, Process, Slice};

/// Where to look for slices.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The hook's state root (`cuslice-hook --state-root`, by default /run/cuslice).
    pub state_root: PathBuf,
    /// Standalone slices: their `CUSLICE_STATE_DIR`s.
    pub state_dirs: Vec<PathBuf>,
}

/// One slice found, before it is split per device.
struct Found {
    slice: String,
    kind: &'static str,
    name: Option<String>,
    kubernetes: Option<Kubernetes>,
    ledger: PathBuf,
    snap: Snapshot,
    /// Container pid -> host pid (containers only).
    host_pids: Option<HashMap<i32, i32>>,
}

fn now_mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub fn collect(src: &Sources) -> Node {
    let mut problems = Vec::new();
    let gpus = nvml::gpus().unwrap_or_else(|e| {
        problems.push(e);
        Vec::new()
    });
    let mut found = containers(&src.state_root, &mut problems);
    for dir in &src.state_dirs {
        let path = dir.join(ledger::FILE_NAME);
        match Ledger::read(&path) {
            Ok(snap) => found.push(Found {
                slice: dir.display().to_string(),
                kind: "standalone",
                name: None,
                kubernetes: None,
                ledger: path,
                snap,
                host_pids: None,
            }),
            Err(ledger::LedgerError::Io { err, .. }) if err.kind() == io::ErrorKind::NotFound => {
                problems.push(format!(
                    "{}: no slice there yet (a process run with CUSLICE_STATE_DIR={} makes it \
                     at cuInit)",
                    path.display(),
                    dir.display()
                ))
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    let time = unix_now();
    let findings = match crate::findings::read(&src.state_root) {
        Ok(Some(f)) if f.stale(time) => {
            problems.push(format!(
                "{} is {:.0} s old: is cuslice agent running? (its checks are not shown)",
                crate::findings::path(&src.state_root).display(),
                time - f.time
            ));
            None
        }
        Ok(f) => {
            if let Some(f) = &f {
                problems.extend(f.problems.iter().map(|p| format!("cuslice agent: {p}")));
            }
            f
        }
        Err(e) => {
            problems.push(e);
            None
        }
    };
    Node {
        time,
        devices: by_device(&gpus, &found, now_mono_ns()),
        problems,
        findings,
        agent: agent(&src.state_root),
    }
}

/// Whether an agent answers on the state root's socket. Without one, the hook's containers'
/// processes (but each container's first, which the hook tells) cannot learn their host pids,
/// and nothing checks their slices against the driver.
fn agent(state_root: &Path) -> Agent {
    let socket = state_root.join("agent").join(agent::SOCKET_NAME);
    let answer = agent::ask(&socket, std::time::Duration::from_secs(1));
    let note = match &answer {
        // Only where the hook keeps containers: a node of standalone slices needs no agent.
        Err(e) if state_root.join("containers").is_dir() => Some(format!(
            "{e}: nothing checks container slices against the driver's count until it runs; \
             start it with `cuslice agent` (or `systemctl start cuslice-agent.service`)"
        )),
        _ => None,
    };
    Agent {
        socket: socket.display().to_string(),
        running: answer.is_ok(),
        note,
    }
}

/// The container slices the hook keeps under `root`.
fn containers(root: &Path, problems: &mut Vec<String>) -> Vec<Found> {
    let mut out = Vec::new();
    for c in live_containers(root, problems, false) {
        match Ledger::read(&c.ledger) {
            Ok(snap) => out.push(Found {
                slice: c.id,
                kind: "container",
                name: c.record.name,
                kubernetes: c.record.kubernetes,
                ledger: c.ledger,
                snap,
                host_pids: Some(c.pids),
            }),
            Err(e) => problems.push(e.to_string()),
        }
    }
    out
}

/// Tells every running container's processes their host pids (as `collect` does on its way),
/// and nothing else: what the agent does every period, so that a process that started before
/// the agent, or could not reach its socket, is told too. Returns what could not be done, one
/// line each.
pub fn tell_host_pids(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    live_containers(root, &mut problems, true);
    problems
}

/// A running container the hook keeps state for.
struct Live {
    id: String,
    record: Record,
    ledger: PathBuf,
    /// Its pids -> host pids.
    pids: HashMap<i32, i32>,
}

/// The running containers under `root`, in id order, each told its processes' host pids on
/// the way (see `Ledger::tell_host_pids`). With `untold_only`, only containers with a running
/// process that has no host pid yet are looked up in /proc (and returned): most processes learn
/// theirs from the agent's socket, and the scan of /proc is what costs.
fn live_containers(root: &Path, problems: &mut Vec<String>, untold_only: bool) -> Vec<Live> {
    let root = Root::new(root);
    let dir = match fs::read_dir(root.containers()) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            problems.push(format!(
                "cannot read {}: {e}; container slices are shown to root only (run as root, or \
                 give --state-root)",
                root.containers().display()
            ));
            return Vec::new();
        }
    };
    let mut ids: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    ids.sort();
    let mut out = Vec::new();
    let mut namespaces = None;
    for id in ids {
        let record_path = root.dir(&id).join("record.json");
        let record: Record = match fs::read_to_string(&record_path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
        {
            Ok(r) => r,
            // The hook writes the record last: a container being created has none yet.
            Err(_) if !record_path.exists() => continue,
            Err(e) => {
                problems.push(format!(
                    "{}: {e}; this container's slice is not shown (cuslice-hook sweep removes \
                     the state of containers that are gone)",
                    record_path.display()
                ));
                continue;
            }
        };
        if !record.alive() {
            // Gone without a poststop; the next hook (or `cuslice-hook sweep`) removes it.
            continue;
        }
        let path = root.mnt(&id).join("slice").join(ledger::FILE_NAME);
        if untold_only
            && Ledger::read(&path)
                .is_ok_and(|l| l.procs.iter().all(|p| !p.alive || p.host_pid.is_some()))
        {
            continue;
        }
        // The container's pids -> host pids, from the init's pid namespace.
        let pids = fs::read_link(format!("/proc/{}/ns/pid", record.pid))
            .ok()
            .and_then(|ns| namespaces.get_or_insert_with(pid_namespaces).remove(&ns))
            .unwrap_or_default();
        // The container's processes cannot learn their host pids (but its first, which the
        // hook tells), which NVML names them by: tell them (docs/status.md). The agent tells
        // each process as it starts too (docs/agent.md); this covers the ones that could not ask.
        if let Err(e) = Ledger::tell_host_pids(&path, &|p| pids.get(&p).copied()) {
            problems.push(format!("cannot tell container {id} its host pids: {e}"));
        }
        out.push(Live {
            id,
            record,
            ledger: path,
            pids,
        });
    }
    out
}

/// Every process's pids, grouped by pid namespace (the `/proc/PID/ns/pid` link): pid as the
/// process sees itself -> pid here (from `NSpid` in /proc/PID/status, whose first field is the
/// pid here and last the innermost). One pass over /proc serves every container.
fn pid_namespaces() -> HashMap<PathBuf, HashMap<i32, i32>> {
    let mut by_ns: HashMap<PathBuf, HashMap<i32, i32>> = HashMap::new();
    let Ok(dir) = fs::read_dir("/proc") else {
        return by_ns;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let (Ok(ns), Ok(status)) = (
            fs::read_link(e.path().join("ns/pid")),
            fs::read_to_string(e.path().join("status")),
        ) else {
            continue;
        };
        if let Some(inner) = cuslice_state::init::innermost_pid(&status) {
            by_ns.entry(ns).or_default().insert(inner, pid);
        }
    }
    by_ns
}

/// The slices grouped per device: NVML's devices in NVML's order, then any device only a
/// ledger names.
fn by_device(gpus: &[Gpu], found: &[Found], now: u64) -> Vec<Device> {
    let mut devices: Vec<Device> = gpus
        .iter()
        .map(|g| Device {
            uuid: g.uuid.clone(),
            name: Some(g.name.clone()),
            memory_total: Some(g.total),
            memory_used: Some(g.used),
            slices: Vec::new(),
        })
        .collect();
    for f in found {
        for (i, d) in f.snap.devices.iter().enumerate() {
            let uuid = uuid_string(&d.uuid);
            let k = match devices.iter().position(|x| x.uuid == uuid) {
                Some(k) => k,
                None => {
                    devices.push(Device {
                        uuid,
                        name: None,
                        memory_total: None,
                        memory_used: None,
                        slices: Vec::new(),
                    });
                    devices.len() - 1
                }
            };
            let pct = |x: f64| (x * 1000.0).round() / 10.0;
            let processes = f
                .snap
                .procs
                .iter()
                .map(|p| {
                    let (pid, container_pid) = match &f.host_pids {
                        Some(m) => (m.get(&p.pid).copied(), Some(p.pid)),
                        None => (Some(p.pid), None),
                    };
                    Process {
                        pid,
                        container_pid,
                        alive: p.alive,
                        memory: p.charged.get(i).copied().unwrap_or(0),
                        frozen: p.frozen_ns.is_some(),
                    }
                })
                .collect();
            devices[k].slices.push(Slice {
                slice: f.slice.clone(),
                kind: f.kind,
                name: f.name.clone(),
                kubernetes: f.kubernetes.clone(),
                ledger: f.ledger.display().to_string(),
                ledger_version: f.snap.version,
                memory: Memory {
                    used: d.used.saturating_sub(d.frozen),
                    frozen: d.frozen,
                    limit: d.limit,
                    peak: d.peak,
                    refusals: d.refusals,
                    set_live: d.live & ledger::LIVE_MEMORY != 0,
                    spilled: d.spilled,
                    spill_limit: d.spill_limit,
                    spill_peak: d.spill_peak,
                    waiting: d.waiting,
                },
                compute: Compute {
                    request_pct: d.request().map(pct),
                    limit_pct: d.core_limit().map(pct),
                    allotted_pct: pct(d.allotted()),
                    share_1s_pct: d.share_over(1_000_000_000, now).map(pct),
                    share_10s_pct: d.share_over(10_000_000_000, now).map(pct),
                    device_seconds: d.device_ns as f64 / 1e9,
                    throttled_seconds: d.throttled_ns as f64 / 1e9,
                    estimated: d.metered_by == MeteredBy::Estimates,
                    metered_by: (d.metered_ns != 0).then(|| d.metered_by.name().to_string()),
                    set_live: d.live & ledger::LIVE_CORE != 0,
                    priority: Priority::from_code(d.priority).to_string(),
                    priority_set_live: d.live & ledger::LIVE_PRIORITY != 0,
                },
                processes,
            });
        }
    }
    devices
}
