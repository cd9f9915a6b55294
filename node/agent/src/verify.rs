//! Every period: the driver's own per-process memory and utilisation (NVML, read from the
//! agent's own, host, pid namespace), mapped to the container slices the hook keeps under the
//! state root, checked against each slice's cap and core limit from the hook's `config` (which
//! the container cannot write; read again when `cuslice set` replaces it), never from its ledger
//! (which it can). Under `Enforce::Stop` a
//! slice over its cap for the grace in total within a window has its processes killed (the
//! whole container if it goes over again within the window), and a slice over its core limit
//! is frozen (its cgroup) while it owes device time by the driver's count, what ran while it
//! was frozen included, and has the processes that ran on the device killed once it owes more
//! than freezing holds. See docs/agent.md.
//!
//! Three threads: `tick` (the agent's loop, every period) reads the slices and the memory,
//! judges, kills, logs and writes `findings.json`; a meter thread started by `Verifier::new`
//! reads the utilisation samples every `POLL` (the driver keeps only the newest sample per
//! process, so they must be read more often than it takes them) and freezes; a thaw thread
//! thaws each frozen slice when its time is served. The thaw never waits on the driver: a
//! driver call that stalls (on a real GPU while it recovers from an error; on simgpu while a
//! frozen process holds the device's lock) cannot keep a slice frozen past its time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cuslice_hook::state::{Record, Root, start_time};
use cuslice_node::findings::{self, Actions, Finding, Findings};
use cuslice_node::nvml::{Device, Nvml};
use cuslice_policy::config::{Config as SliceConfig, Limits};
use cuslice_policy::format_size;
use cuslice_state::ledger::ReadOnly;
use cuslice_state::uuid_string;

use crate::cgroup::{self, Freezer, Mounts, Placement, Scope};
use crate::judge::{
    self, Bucket, Held, Hold, MemoryAction, OverTime, SampleClock, Tracker, Window,
};
use crate::{Config, Enforce};

/// How often the meter thread reads the driver's utilisation samples and decides freezes.
pub const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Memory,
    Compute,
    Ledger,
    /// A file of the slice's that its processes write (its ledger, its claims on the compute
    /// board) larger than cuslice makes it: written past its end, using the host's memory.
    Files,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Memory => "memory",
            Kind::Compute => "compute",
            Kind::Ledger => "ledger",
            Kind::Files => "files",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    slice: String,
    uuid: String,
    kind: Kind,
}

/// A container slice as the hook recorded it.
struct Slice {
    id: String,
    name: Option<String>,
    init: i32,
    /// The init's pid namespace (`/proc/PID/ns/pid`); None when it is the agent's own.
    pidns: Option<PathBuf>,
    scope: Scope,
    freezer: Result<Freezer, String>,
    config: SliceConfig,
    /// The config file's inode and modification time when read: `cuslice set` replaces the file
    /// (a new inode), and the slice is read again.
    config_stamp: Option<(u64, i64, i64)>,
    /// Device UUID -> what the slice held when `cuslice set` lowered its cap below that
    /// (`containers/<id>/lowered.json`, host-only).
    lowered: BTreeMap<String, u64>,
    ledger: PathBuf,
}

/// A slice's cap on one device as the agent last saw it, and what it may hold over it since
/// the cap was lowered while it ran.
#[derive(Debug, Clone, Copy, Default)]
struct CapState {
    cap: Option<u64>,
    allowance: Option<u64>,
    /// The value of `lowered.json` the allowance was last seeded from.
    seeded: Option<u64>,
}

/// What tells a hook file replaced or changed since it was read.
fn stamp(path: &std::path::Path) -> Option<(u64, i64, i64)> {
    fs::metadata(path)
        .ok()
        .map(|m| (m.ino(), m.mtime(), m.mtime_nsec()))
}

impl Slice {
    fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("slice {} ({n})", short(&self.id)),
            None => format!("slice {}", short(&self.id)),
        }
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// What the meter keeps per slice and device.
#[derive(Default)]
struct Meter {
    window: Window,
    bucket: Bucket,
    /// The core limit (percent) from the slice's config, and the rate `stop` holds it to.
    limit_pct: Option<f64>,
    rate: Option<f64>,
    /// The agent's loop has set the limit at least once.
    limit_seen: bool,
    /// Until when (ns) the bucket is not spent: the limit changed while the slice ran.
    settle_until: u64,
    /// Pids whose samples counted, and when they last did (ns).
    pids: BTreeMap<u32, u64>,
    /// The last time `stop` killed the processes that ran on the device because the slice
    /// owed more than freezing holds.
    killed: Option<ComputeKill>,
    /// Under one sample a period (`judge::SampleModel::OnePerPeriod`), the last step's bound;
    /// None under per-process samples (the window holds the slice's own device time).
    bound: Option<judge::Bound>,
    /// Under one sample a period: the device's busy time per step, and by how much it was
    /// beyond what the limits of the slices on it allow, in steps where that was all the
    /// driver established (`judge::Bound::Shared`).
    busy: Window,
    beyond: Window,
}

/// What the meter established for a slice under one sample a period, over its window.
#[derive(Debug, Clone, Copy)]
struct Bounded {
    /// The last step's bound.
    last: judge::Bound,
    /// The device's busy time, as a share of the window (0-1).
    busy: f64,
    /// How far the device was busy beyond what the limits of the slices on it allow, as a
    /// share of the window (0-1), in steps where that was all that could be established.
    beyond: f64,
}

/// A kill for device time owed (`judge::Hold::Kill`).
#[derive(Debug, Clone)]
struct ComputeKill {
    /// Unix seconds.
    at: f64,
    pids: Vec<i32>,
    /// Device time owed beyond the slice's share when it was killed (ns).
    debt_ns: u64,
}

/// A slice frozen now.
struct Frozen {
    freezer: Freezer,
    since: Instant,
    until: Instant,
}

struct State {
    nvml: Option<Arc<Nvml>>,
    devices: Vec<(Device, String)>,
    slices: BTreeMap<String, Arc<Slice>>,
    /// Pid -> slice, as classified since the last tick.
    pids: HashMap<u32, Option<String>>,
    clocks: HashMap<String, SampleClock>,
    /// Per device: who may run on it (the slices with a process there, and `None` for
    /// processes in no slice), from the agent's last look at NVML's process list.
    parties: HashMap<String, BTreeMap<Option<String>, judge::Party>>,
    /// Per device: the processes of slices NVML's process list showed there at the last tick.
    device_pids: HashMap<String, Vec<(u32, String)>>,
    meters: BTreeMap<(String, String), Meter>,
    frozen: BTreeMap<String, Frozen>,
    /// Slices the thaw thread thawed since the meter's last step: when each was frozen and
    /// when it was thawed (the meter counts that time and does not freeze them again at once).
    thawed: BTreeMap<String, (Instant, Instant)>,
    /// The thaw thread runs: without it the meter never freezes.
    thawing: bool,
    /// Slices whose cgroup could not be frozen (logged once).
    unfreezable: BTreeSet<String>,
    /// Slices whose cgroup someone else froze (an operator's pause): the agent leaves them be
    /// (logged once per pause).
    paused: BTreeSet<String>,
    record: cgroup::Record,
    actions: Actions,
    last_poll: Option<Instant>,
}

impl State {
    /// Thaws slice `id` if the agent holds it frozen, counts the time, forgets it in the
    /// record, and tells the meter (which counts the frozen time, and lets the slice run for a
    /// step before it freezes it again).
    fn unfreeze(&mut self, id: &str, now: Instant) {
        let Some(f) = self.frozen.remove(id) else {
            return;
        };
        match f.freezer.thaw() {
            Ok(()) => {
                let _ = self.record.remove(&f.freezer);
            }
            Err(e) => log(&format!(
                "cannot thaw slice {} ({}): {e}",
                short(id),
                f.freezer.dir().display()
            )),
        }
        self.actions.frozen_seconds += now.saturating_duration_since(f.since).as_secs_f64();
        self.thawed.insert(id.to_string(), (f.since, now));
    }
}

struct Shared {
    enforce: Enforce,
    base: Instant,
    stop: AtomicBool,
    state: Mutex<State>,
    /// Wakes the thaw thread: a slice was frozen, or the agent stops.
    wake: Condvar,
    agent: Placement,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mono_ns(&self, t: Instant) -> u64 {
        t.duration_since(self.base).as_nanos() as u64
    }
}

/// Stops the meter and thaws every cgroup the agent froze; for a signal handler's thread.
#[derive(Clone)]
pub struct Stopper(Arc<Shared>);

impl Stopper {
    /// Idempotent. After it, nothing is frozen by this agent and nothing will be.
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::SeqCst);
        let mut st = self.0.lock();
        self.0.wake.notify_all();
        let frozen: Vec<(String, Frozen)> = std::mem::take(&mut st.frozen).into_iter().collect();
        for (id, f) in frozen {
            if let Err(e) = f.freezer.thaw() {
                log(&format!(
                    "cannot thaw slice {} ({}): {e}",
                    short(&id),
                    f.freezer.dir().display()
                ));
            }
        }
        let (_, failed) = st.record.thaw_all();
        for line in failed {
            log(&line);
        }
    }
}

pub struct Verifier {
    cfg: Config,
    dir: PathBuf,
    shared: Arc<Shared>,
    meter: Option<JoinHandle<()>>,
    /// None when it could not be started: then the meter never freezes.
    thaw: Option<JoinHandle<()>>,
    mounts: Mounts,
    tracker: Tracker<Key>,
    ledger_streak: BTreeMap<Key, u32>,
    /// Per slice and device: the cap at the last check, and what the slice may hold over it
    /// since `cuslice set` lowered it (`judge::lowered_allowance`).
    caps: BTreeMap<(String, String), CapState>,
    /// Per slice and device: its time over its memory cap within the window, and its last
    /// kill for it.
    over: BTreeMap<(String, String), OverTime>,
    /// Each slice's ledger, mapped once (with the file's inode: a new file is mapped afresh).
    ledgers: HashMap<PathBuf, (u64, ReadOnly)>,
    /// A process in a slice whose ledger was read has no host pid yet (it started before the
    /// agent, or could not reach its socket): the agent's loop tells host pids from /proc.
    untold: bool,
    /// Problems seen in the last tick and in this one: each is logged when it first appears,
    /// not again while it lasts.
    logged: BTreeSet<String>,
    problems: BTreeSet<String>,
    /// What the driver could not establish about compute, per slice (or "" for the device)
    /// and device, as last logged.
    notes: BTreeMap<(String, String), String>,
    /// Per device: the least of its used memory less every listed process's entry (the
    /// driver's own), and the checks in a row that showed memory unattributed.
    driver_own: BTreeMap<String, u64>,
    unattributed: BTreeMap<String, u32>,
}

fn log(line: &str) {
    eprintln!("cuslice agent: {line}");
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Verifier {
    pub fn new(cfg: &Config) -> Verifier {
        // The agent's own files (not the socket directory, which containers see): findings.json
        // and the record of cgroups it froze. Root only.
        let dir = findings::dir(&cfg.state_root);
        let made = fs::create_dir_all(&dir)
            .and_then(|()| fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)));
        if let Err(e) = made {
            log(&format!(
                "cannot make {}: {e}; findings are not written and frozen cgroups not recorded \
                 (run as root, or give --state-root)",
                dir.display()
            ));
        }
        let mut record = cgroup::Record::load(&dir);
        let (thawed, failed) = record.thaw_all();
        for f in &thawed {
            log(&format!(
                "thawed {}, which an earlier agent froze and did not thaw",
                f.dir().display()
            ));
        }
        for line in failed {
            log(&line);
        }
        let agent = cgroup::placement(std::process::id() as i32).unwrap_or_default();
        let shared = Arc::new(Shared {
            enforce: cfg.enforce,
            base: Instant::now(),
            stop: AtomicBool::new(false),
            agent,
            state: Mutex::new(State {
                nvml: None,
                devices: Vec::new(),
                slices: BTreeMap::new(),
                pids: HashMap::new(),
                clocks: HashMap::new(),
                parties: HashMap::new(),
                device_pids: HashMap::new(),
                meters: BTreeMap::new(),
                frozen: BTreeMap::new(),
                thawed: BTreeMap::new(),
                thawing: false,
                unfreezable: BTreeSet::new(),
                paused: BTreeSet::new(),
                record,
                actions: Actions::default(),
                last_poll: None,
            }),
            wake: Condvar::new(),
        });
        let meter = spawn(
            &shared,
            "cuslice-meter",
            meter_loop,
            "compute is not checked",
        );
        let thaw = spawn(&shared, "cuslice-thaw", thaw_loop, "nothing is frozen");
        shared.lock().thawing = thaw.is_some();
        Verifier {
            cfg: cfg.clone(),
            dir,
            shared,
            meter,
            thaw,
            mounts: cgroup::mounts(),
            tracker: Tracker::default(),
            ledger_streak: BTreeMap::new(),
            caps: BTreeMap::new(),
            over: BTreeMap::new(),
            ledgers: HashMap::new(),
            untold: true,
            logged: BTreeSet::new(),
            problems: BTreeSet::new(),
            notes: BTreeMap::new(),
            driver_own: BTreeMap::new(),
            unattributed: BTreeMap::new(),
        }
    }

    /// Stops the meter and thaws what the agent froze; call it before the agent exits (on
    /// SIGTERM and SIGINT). Dropping the verifier does the same.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.shared.clone())
    }

    /// Device memory that no process's NVML entry shows, beyond what the slices' caps allow
    /// (`judge::unattributed`): reported, never acted on (no slice can be named).
    fn unattributed_memory(
        &mut self,
        nvml: &Nvml,
        read: &BTreeSet<String>,
        entries: &BTreeMap<String, u64>,
        uncapped: &BTreeSet<String>,
        held: &BTreeMap<(String, String), Vec<Held>>,
        limits: &BTreeMap<(String, String), Limits>,
    ) {
        let gpus = match nvml.gpus() {
            Ok(g) => g,
            Err(e) => {
                self.once(format!("cannot read the GPUs' used memory: {e}"));
                return;
            }
        };
        for g in gpus {
            if !read.contains(&g.uuid) {
                continue;
            }
            let listed = entries.get(&g.uuid).copied().unwrap_or(0);
            let own = self.driver_own.entry(g.uuid.clone()).or_insert(u64::MAX);
            *own = (*own).min(g.used.saturating_sub(listed));
            let own = *own;
            // What the slices there may hold that their entries do not show (managed memory
            // made through the library counts against the cap); None: a party with no cap.
            let headroom = if uncapped.contains(&g.uuid) {
                None
            } else {
                held.iter()
                    .filter(|((_, u), _)| *u == g.uuid)
                    .try_fold(0u64, |sum, (key, list)| {
                        let cap = limits.get(key)?.memory?;
                        Some(sum + cap.saturating_sub(judge::total(list)))
                    })
            };
            let streak = self.unattributed.entry(g.uuid.clone()).or_default();
            match judge::unattributed(g.used, listed, own, headroom) {
                Some(beyond) => {
                    *streak += 1;
                    if *streak == judge::LEDGER_TICKS {
                        log(&format!(
                            "{}: the device's used memory is {}, {} more than every listed \
                             process's NVML entry ({}), the driver's own ({}, the least seen) \
                             and what the slices' caps leave them ({}) account for: memory no \
                             process's entry shows, such as managed memory (a real driver never \
                             counts it in a process's entry); no slice can be named; action: \
                             none",
                            g.uuid,
                            format_size(g.used),
                            format_size(beyond),
                            format_size(listed),
                            format_size(own),
                            format_size(headroom.unwrap_or(0))
                        ));
                    }
                }
                None => {
                    if *streak >= judge::LEDGER_TICKS {
                        log(&format!(
                            "{}: the device's used memory is accounted for again",
                            g.uuid
                        ));
                    }
                    *streak = 0;
                }
            }
        }
    }

    fn once(&mut self, line: String) {
        if !self.logged.contains(&line) {
            log(&line);
        }
        self.problems.insert(line);
    }

    /// One period's check (and, under `Enforce::Stop`, its enforcement).
    /// Whether the last check found a slice process with no host pid yet (or could not look).
    pub fn untold(&self) -> bool {
        self.untold
    }

    pub fn tick(&mut self) {
        if self.shared.stop.load(Ordering::SeqCst) {
            return;
        }
        self.logged = std::mem::take(&mut self.problems);
        let nvml = {
            let have = self.shared.lock().nvml.clone();
            match have {
                Some(n) => Some(n),
                None => match Nvml::open() {
                    Ok(n) => {
                        let n = Arc::new(n);
                        self.shared.lock().nvml = Some(n.clone());
                        Some(n)
                    }
                    Err(e) => {
                        self.once(format!("cannot check slices against the driver: {e}"));
                        None
                    }
                },
            }
        };
        let slices = self.slices();
        let Some(nvml) = nvml else {
            self.shared.lock().slices = slices;
            self.write(Vec::new());
            return;
        };
        let devices: Vec<(Device, String)> = match nvml.devices().and_then(|ds| {
            ds.into_iter()
                .map(|d| Ok((d, nvml.uuid(d)?)))
                .collect::<Result<Vec<_>, String>>()
        }) {
            Ok(d) => d,
            Err(e) => {
                self.once(format!("cannot list the GPUs: {e}"));
                Vec::new()
            }
        };
        let uuids: Vec<String> = devices.iter().map(|d| d.1.clone()).collect();

        // Who holds what, by the driver's count, per slice and device.
        let mut pid_slice: HashMap<u32, Option<String>> = HashMap::new();
        let mut held: BTreeMap<(String, String), Vec<Held>> = BTreeMap::new();
        // Devices whose processes were read: a slice with none there holds nothing there.
        let mut read: BTreeSet<String> = BTreeSet::new();
        // Devices with a process in no slice.
        let mut outside: BTreeSet<String> = BTreeSet::new();
        let mut device_pids: HashMap<String, Vec<(u32, String)>> = HashMap::new();
        // Per device: the sum of every listed process's entry.
        let mut entries: BTreeMap<String, u64> = BTreeMap::new();
        // Devices with a process whose entry NVML does not give.
        let mut blind: BTreeSet<String> = BTreeSet::new();
        for (d, uuid) in &devices {
            let procs = match nvml.processes(*d) {
                Ok(p) => p,
                Err(e) => {
                    self.once(format!("{uuid}: {e}"));
                    continue;
                }
            };
            read.insert(uuid.clone());
            for p in procs {
                *entries.entry(uuid.clone()).or_default() += p.used.unwrap_or(0);
                if p.used.is_none() {
                    blind.insert(uuid.clone());
                }
                let slice = pid_slice
                    .entry(p.pid)
                    .or_insert_with(|| classify(p.pid as i32, &slices))
                    .clone();
                if let Some(s) = &slice {
                    device_pids
                        .entry(uuid.clone())
                        .or_default()
                        .push((p.pid, s.clone()));
                }
                if let Some(s) = slice {
                    held.entry((s, uuid.clone())).or_default().push(Held {
                        pid: p.pid as i32,
                        driver: p.used.unwrap_or(0),
                        charged: None,
                    });
                } else {
                    outside.insert(uuid.clone());
                }
            }
        }

        // What each slice's ledger says.
        let mut ledger_used: HashMap<(String, String), u64> = HashMap::new();
        let mut mapped = HashMap::new();
        let mut untold = false;
        for (id, s) in &slices {
            if !held.keys().any(|(x, _)| x == id) {
                continue;
            }
            let ino = fs::metadata(&s.ledger).map_or(0, |m| m.ino());
            let ledger = match self.ledgers.remove(&s.ledger) {
                Some((i, l)) if i == ino => Ok(l),
                _ => ReadOnly::open(&s.ledger),
            };
            let snap = match ledger {
                Ok(l) => {
                    let snap = l.snapshot();
                    mapped.insert(s.ledger.clone(), (ino, l));
                    snap
                }
                Err(e) => {
                    self.once(format!("{}: {e}", s.label()));
                    continue;
                }
            };
            untold |= snap.procs.iter().any(|p| p.alive && p.host_pid.is_none());
            for (i, dev) in snap.devices.iter().enumerate() {
                let uuid = uuid_string(&dev.uuid);
                ledger_used.insert((id.clone(), uuid.clone()), dev.used);
                if let Some(list) = held.get_mut(&(id.clone(), uuid)) {
                    for h in list.iter_mut() {
                        // By the host pid the agent told the process (no /proc read), else by
                        // its pid in its own namespace.
                        let told = snap
                            .procs
                            .iter()
                            .find(|p| p.alive && p.host_pid == Some(h.pid));
                        let entry = told.or_else(|| {
                            let inner = inner_pid(h.pid);
                            snap.procs
                                .iter()
                                .find(|p| p.alive && p.host_pid.is_none() && Some(p.pid) == inner)
                        });
                        h.charged = entry.map(|p| p.charged.get(i).copied().unwrap_or(0));
                    }
                }
            }
        }

        // Ledgers of slices gone (or with nothing on a device) are unmapped.
        self.ledgers = mapped;
        self.untold = untold;

        // The limits that apply, from the hook's config.
        let mut limits: BTreeMap<(String, String), Limits> = BTreeMap::new();
        for (id, s) in &slices {
            let nvidia = environ(s.init, "NVIDIA_VISIBLE_DEVICES");
            for uuid in &uuids {
                let key = (id.clone(), uuid.clone());
                let per_process: Vec<Limits> = if s.config.mentioned_ordinals().is_empty() {
                    Vec::new()
                } else {
                    held.get(&key)
                        .into_iter()
                        .flatten()
                        .map(|h| {
                            let cuda = environ(h.pid, "CUDA_VISIBLE_DEVICES");
                            judge::limits_for(
                                &s.config,
                                uuid,
                                &uuids,
                                nvidia.as_deref(),
                                cuda.as_deref(),
                            )
                        })
                        .collect()
                };
                let l = per_process
                    .into_iter()
                    .reduce(judge::strictest)
                    .unwrap_or_else(|| {
                        judge::limits_for(&s.config, uuid, &uuids, nvidia.as_deref(), None)
                    });
                limits.insert(key, l);
            }
        }

        let uncapped: BTreeSet<String> = outside.union(&blind).cloned().collect();
        self.unattributed_memory(&nvml, &read, &entries, &uncapped, &held, &limits);

        // Who may run on each device, for the bound under one sample a period: a slice with a
        // limit is taken to use at most that limit + `OVER_PCT` only while every process it has
        // there is known to its ledger (held by the library's meter).
        let mut parties: HashMap<String, BTreeMap<Option<String>, judge::Party>> = HashMap::new();
        for ((id, uuid), list) in &held {
            let core = limits
                .get(&(id.clone(), uuid.clone()))
                .and_then(|l| l.core_limit);
            let known = list.iter().all(|h| h.charged.is_some());
            parties.entry(uuid.clone()).or_default().insert(
                Some(id.clone()),
                judge::Party {
                    cap: core
                        .filter(|_| known)
                        .map(|l| (f64::from(l) + judge::OVER_PCT) / 100.0),
                    limited: core.is_some(),
                },
            );
        }
        for uuid in &outside {
            parties.entry(uuid.clone()).or_default().insert(
                None,
                judge::Party {
                    cap: None,
                    limited: false,
                },
            );
        }

        // Hand the slices and limits to the meter; take what it measured.
        type Measured = (judge::Usage, Vec<i32>, Option<ComputeKill>, Option<Bounded>);
        let usage: BTreeMap<(String, String), Measured> = {
            let mut st = self.shared.lock();
            let now_ns = self.shared.mono_ns(Instant::now());
            st.devices = devices.clone();
            st.parties = parties;
            st.device_pids = device_pids;
            st.slices = slices.clone();
            st.pids = pid_slice.clone();
            for (key, l) in &limits {
                let limit_pct = l.core_limit.map(f64::from);
                if limit_pct.is_none() && !st.meters.contains_key(key) {
                    continue;
                }
                let m = st.meters.entry(key.clone()).or_default();
                if judge::limit_changed(m.limit_seen, m.limit_pct, limit_pct) {
                    // Judged afresh against the new limit (`cuslice set`).
                    m.window = Window::default();
                    m.bucket = Bucket::default();
                    m.settle_until = now_ns + judge::LIMIT_SETTLE_NS;
                }
                m.limit_seen = true;
                m.limit_pct = limit_pct;
                m.rate = match self.shared.enforce {
                    Enforce::Stop => limit_pct.map(judge::enforced_rate),
                    Enforce::Report => None,
                };
            }
            st.meters.retain(|(id, _), _| slices.contains_key(id));
            st.meters
                .iter()
                .filter_map(|(k, m)| {
                    Some((
                        k.clone(),
                        (
                            m.window.usage()?,
                            m.pids.keys().map(|&p| p as i32).collect(),
                            m.killed.clone(),
                            m.bound.map(|b| Bounded {
                                last: b,
                                busy: m.busy.usage().map_or(0.0, |u| u.share),
                                beyond: m.beyond.usage().map_or(0.0, |u| u.share),
                            }),
                        ),
                    ))
                })
                .collect()
        };

        // Judge.
        let mut found: Vec<(Key, Finding)> = Vec::new();
        let now = unix_now();
        let grace = self.cfg.grace.as_secs_f64();
        let window = judge::over_window_s(grace, self.cfg.period.as_secs_f64());
        for ((id, uuid), list) in &held {
            let s = &slices[id];
            let driver = judge::total(list);
            let mut pids: Vec<i32> = list.iter().map(|h| h.pid).collect();
            pids.sort_unstable();
            let l = limits
                .get(&(id.clone(), uuid.clone()))
                .copied()
                .unwrap_or_default();
            let st = self
                .caps
                .entry((id.clone(), uuid.clone()))
                .or_insert(CapState {
                    cap: l.memory,
                    ..CapState::default()
                });
            // What `cuslice set` recorded the slice held when it lowered the cap (so an agent
            // that did not see the old cap allows it too), taken once per value.
            let recorded = s.lowered.get(uuid.as_str()).copied();
            let mut allowance = st.allowance;
            if recorded.is_some() && recorded != st.seeded {
                st.seeded = recorded;
                allowance = recorded
                    .map(|r| r.saturating_add(judge::ledger_slack(r)))
                    .max(allowance);
            }
            let allowance = judge::lowered_allowance(st.cap, l.memory, driver, allowance);
            (st.cap, st.allowance) = (l.memory, allowance);
            // Time over the cap adds up within the window (what a lowered cap allows aside).
            let over_cap = l.memory.is_some_and(|cap| driver > cap);
            let allowed = allowance.is_some_and(|a| driver <= a);
            let over_s = self
                .over
                .entry((id.clone(), uuid.clone()))
                .or_default()
                .check(now, over_cap && !allowed, window);
            if let Some(cap) = l.memory
                && driver > cap
            {
                let action = match (self.cfg.enforce, allowance) {
                    (Enforce::Report, _) => "none (--enforce report)".to_string(),
                    (Enforce::Stop, Some(a)) if driver <= a => format!(
                        "none: its cap was lowered while it held {} (cuslice set); nothing is \
                         freed, its new allocations are refused until it is under",
                        format_size(a)
                    ),
                    (Enforce::Stop, _) => format!(
                        "its processes are killed once over for {grace:.1} s in total within \
                         {window:.0} s (--grace)"
                    ),
                };
                found.push((
                    Key {
                        slice: id.clone(),
                        uuid: uuid.clone(),
                        kind: Kind::Memory,
                    },
                    Finding {
                        message: format!(
                            "{} holds {} on {uuid} by the driver's count, over its cap of {} \
                             (pids {})",
                            s.label(),
                            format_size(driver),
                            format_size(cap),
                            join(&pids)
                        ),
                        driver_bytes: Some(driver),
                        cap_bytes: Some(cap),
                        over_s: Some(round1(over_s)),
                        window_s: Some(window),
                        ..finding(s, uuid, Kind::Memory, pids.clone(), action)
                    },
                ));
            }
            let ledger = ledger_used
                .get(&(id.clone(), uuid.clone()))
                .copied()
                .unwrap_or(0);
            let key = Key {
                slice: id.clone(),
                uuid: uuid.clone(),
                kind: Kind::Ledger,
            };
            let streak = self.ledger_streak.entry(key.clone()).or_insert(0);
            if judge::ledger_short(ledger, driver) {
                *streak += 1;
            } else {
                *streak = 0;
            }
            if *streak >= judge::LEDGER_TICKS || (*streak > 0 && self.tracker.active(&key)) {
                let unknown: Vec<i32> = list
                    .iter()
                    .filter(|h| h.driver > h.charged.unwrap_or(0) + judge::ledger_slack(0))
                    .map(|h| h.pid)
                    .collect();
                found.push((
                    key,
                    Finding {
                        message: format!(
                            "{}'s ledger does not match the driver on {uuid}: the ledger says \
                             the slice holds {}, the driver {} (pids {} hold more than their \
                             ledger entries: they went around the library, or the ledger was \
                             written over)",
                            s.label(),
                            format_size(ledger),
                            format_size(driver),
                            join(&unknown)
                        ),
                        driver_bytes: Some(driver),
                        ledger_bytes: Some(ledger),
                        cap_bytes: l.memory,
                        ..finding(s, uuid, Kind::Ledger, unknown.clone(), "none".into())
                    },
                ));
            }
        }
        // The files a slice's processes may write: no larger than cuslice makes them. Under
        // `stop`, cut back to that size (the slice's own mappings never reach past it).
        for (id, s) in &slices {
            let claims = fs::read(Root::new(&self.cfg.state_root).dir(id).join("board"))
                .ok()
                .map(|p| {
                    PathBuf::from(std::ffi::OsString::from_vec(p))
                        .join(cuslice_state::board::CLAIMS)
                });
            let files = [
                Some((s.ledger.clone(), cuslice_state::ledger::file_size())),
                claims.map(|c| (c, cuslice_state::board::SIZE as u64)),
            ];
            let mut grown = Vec::new();
            for (path, want) in files.into_iter().flatten() {
                let Ok(m) = fs::symlink_metadata(&path) else {
                    continue;
                };
                if !m.is_file() || m.len() <= want {
                    continue;
                }
                let mut what = format!("{} is {} bytes, not {want}", path.display(), m.len());
                if self.cfg.enforce == Enforce::Stop {
                    let cut = fs::OpenOptions::new()
                        .write(true)
                        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                        .open(&path)
                        .and_then(|f| f.set_len(want));
                    what.push_str(&match cut {
                        Ok(()) => " (cut back)".to_string(),
                        Err(e) => format!(" (cannot cut it back: {e})"),
                    });
                }
                grown.push(what);
            }
            if grown.is_empty() {
                continue;
            }
            let action = if self.cfg.enforce == Enforce::Stop {
                "cut back to their size"
            } else {
                "none"
            };
            found.push((
                Key {
                    slice: id.clone(),
                    uuid: "-".into(),
                    kind: Kind::Files,
                },
                Finding {
                    message: format!(
                        "{}'s processes wrote past the end of their files, which use the host's \
                         memory: {}",
                        s.label(),
                        grown.join("; ")
                    ),
                    ..finding(s, "-", Kind::Files, Vec::new(), action.into())
                },
            ));
        }
        // A slice seen on a device before and holding nothing there now is not over there.
        for ((id, uuid), o) in &mut self.over {
            if read.contains(uuid) && !held.contains_key(&(id.clone(), uuid.clone())) {
                o.check(now, false, window);
            }
        }
        self.over
            .retain(|(id, _), o| slices.contains_key(id) && !o.idle());
        self.ledger_streak
            .retain(|k, n| *n > 0 && slices.contains_key(&k.slice));
        self.caps.retain(|(id, _), _| slices.contains_key(id));
        let mut notes: BTreeMap<(String, String), String> = BTreeMap::new();
        for ((id, uuid), (u, pids, killed, bounded)) in &usage {
            let Some(s) = slices.get(id) else { continue };
            let Some(limit) = limits
                .get(&(id.clone(), uuid.clone()))
                .and_then(|l| l.core_limit)
            else {
                continue;
            };
            let key = Key {
                slice: id.clone(),
                uuid: uuid.clone(),
                kind: Kind::Compute,
            };
            let limit = f64::from(limit);
            // Under one sample a period, what the driver could not establish is said, not
            // guessed.
            let span_s = u.span_ns as f64 / 1e9;
            match bounded.map(|b| b.last) {
                Some(judge::Bound::Unbounded) => {
                    notes.insert(
                        (id.clone(), uuid.clone()),
                        format!(
                            "{}'s compute on {uuid} cannot be bounded while it lasts: the driver \
                             names one process per sample, with the device's figure, and a \
                             process in no slice, in a slice without a core limit, or unknown \
                             to its slice's ledger runs beside it; not judged",
                            s.label()
                        ),
                    );
                }
                Some(judge::Bound::Shared(_))
                    if bounded.is_some_and(|b| b.beyond * 100.0 > judge::BACK_PCT)
                        && u.span_ns >= judge::MIN_HISTORY_NS =>
                {
                    let b = bounded.expect("matched");
                    notes.insert(
                        (String::new(), uuid.clone()),
                        format!(
                            "{uuid} was busy {:.1}% over the last {span_s:.1} s, {:.1} points \
                             more than the core limits of the slices on it allow (each limit + \
                             {:.0} points): one of them is over its limit, but the driver names \
                             one process per sample, with the device's figure, so which cannot \
                             be told; nothing frozen",
                            b.busy * 100.0,
                            b.beyond * 100.0,
                            judge::OVER_PCT
                        ),
                    );
                }
                _ => {}
            }
            if !judge::compute_over(Some(*u), limit, self.tracker.active(&key)) {
                continue;
            }
            let by = match bounded {
                None => "by the driver's count".to_string(),
                Some(_) => "by the lower bound the driver establishes".to_string(),
            };
            // Only figures measured: the driver's device time (or the bound it establishes),
            // the agent's own freezes.
            let kill_past = format!(
                "its processes on the device are killed if it owes more than {:.1} s of device \
                 time beyond its limit",
                judge::KILL_DEBT_NS as f64 / 1e9
            );
            let action = match (self.cfg.enforce, &s.freezer, killed) {
                (Enforce::Report, _, _) => "none (--enforce report)".to_string(),
                (Enforce::Stop, _, Some(k)) if now - k.at < span_s => format!(
                    "killed pids {} {:.0} s ago: it owed {:.2} s of device time beyond its \
                     limit {by}, more than freezing holds",
                    join(&k.pids),
                    now - k.at,
                    k.debt_ns as f64 / 1e9
                ),
                (Enforce::Stop, Ok(_), _) => format!(
                    "its cgroup is frozen while it owes device time {by} (frozen {:.0}% of \
                     the last {span_s:.1} s); {kill_past}",
                    u.frozen * 100.0
                ),
                (Enforce::Stop, Err(e), _) => format!("cannot be frozen ({e}); {kill_past}"),
            };
            found.push((
                key,
                Finding {
                    message: match bounded {
                        None => format!(
                            "{} used {:.1}% of {uuid} by the driver's count over the last \
                             {span_s:.1} s, over its core limit of {limit:.0}% ({:.1}% of the \
                             time it was not frozen; pids {})",
                            s.label(),
                            u.share * 100.0,
                            u.demand * 100.0,
                            join(pids)
                        ),
                        Some(b) => format!(
                            "{} used at least {:.1}% of {uuid} over the last {span_s:.1} s, \
                             over its core limit of {limit:.0}% ({:.1}% of the time it was not \
                             frozen; pids {}): a lower bound, the device's busy time ({:.1}%) \
                             less what the other slices on it may use by their limits (the \
                             driver names one process per sample, with the device's figure)",
                            s.label(),
                            u.share * 100.0,
                            u.demand * 100.0,
                            join(pids),
                            b.busy * 100.0
                        ),
                    },
                    share_pct: Some(round1(u.share * 100.0)),
                    demand_pct: Some(round1(u.demand * 100.0)),
                    limit_pct: Some(limit),
                    window_s: Some(round1(span_s)),
                    ..finding(s, uuid, Kind::Compute, pids.clone(), action)
                },
            ));
        }

        // Notes on what the driver could not establish: logged when they start and end. A
        // slice with no window to judge yet (its limit just changed) keeps its note.
        for (k, line) in &self.notes {
            if !k.0.is_empty() && slices.contains_key(&k.0) && !usage.contains_key(k) {
                notes.entry(k.clone()).or_insert_with(|| line.clone());
            }
        }
        for (k, line) in &notes {
            if !self.notes.contains_key(k) {
                log(line);
            }
        }
        for k in std::mem::take(&mut self.notes).into_keys() {
            if !notes.contains_key(&k) {
                let what = if k.0.is_empty() {
                    format!("{}: busy within the slices' core limits again", k.1)
                } else {
                    format!(
                        "slice {} on {}: its compute can be bounded again",
                        short(&k.0),
                        k.1
                    )
                };
                log(&what);
            }
        }
        self.notes = notes;

        // Log what started and ended.
        let keys: Vec<Key> = found.iter().map(|(k, _)| k.clone()).collect();
        let (started, ended) = self.tracker.update(now, &keys);
        for k in &started {
            if let Some((_, f)) = found.iter().find(|(x, _)| x == k) {
                log(&format!("{}; action: {}", f.message, f.action));
            }
        }
        for (k, since) in &ended {
            let what = match k.kind {
                Kind::Memory => "back within its memory cap",
                Kind::Compute => "back within its core limit",
                Kind::Ledger => "ledger matches the driver again",
                Kind::Files => "its files are their size again",
            };
            log(&format!(
                "slice {} on {}: {what} (after {:.1} s)",
                short(&k.slice),
                k.uuid,
                now - since
            ));
        }
        for (k, f) in &mut found {
            f.since = self.tracker.since(k).unwrap_or(now);
        }

        // Stop: kill what was over its cap for the grace in total within the window, and the
        // whole container when it goes over again after that.
        if self.cfg.enforce == Enforce::Stop {
            // Ticks are `period` apart: a total this close to the grace is taken as over it.
            let slack = self.cfg.period.as_secs_f64() / 10.0;
            for (k, f) in &mut found {
                if k.kind != Kind::Memory {
                    continue;
                }
                let key = (k.slice.clone(), k.uuid.clone());
                let (Some(list), Some(cap)) = (held.get(&key), f.cap_bytes) else {
                    continue;
                };
                let allowed = self
                    .caps
                    .get(&key)
                    .and_then(|c| c.allowance)
                    .is_some_and(|a| f.driver_bytes.is_some_and(|d| d <= a));
                if allowed {
                    continue;
                }
                let (over_s, last_kill) = self
                    .over
                    .get(&key)
                    .map_or((0.0, None), |o| (o.total(), o.kill.clone()));
                let s = &slices[&k.slice];
                let killed = match judge::memory_action(
                    cap,
                    list,
                    over_s + slack,
                    grace,
                    last_kill.as_ref(),
                ) {
                    MemoryAction::Nothing => continue,
                    MemoryAction::Kill(victims) => {
                        let killed = self.kill(s, &victims, list, cap, over_s, window);
                        f.action = format!("killed pids {}", join(&killed));
                        killed
                    }
                    MemoryAction::KillAll => {
                        let killed = self.kill_all(s, list, cap, window);
                        f.action = format!(
                            "killed every process of the container (pids {}): over its cap \
                             again within {window:.0} s of a kill",
                            join(&killed)
                        );
                        killed
                    }
                };
                if let Some(o) = self.over.get_mut(&key)
                    && !killed.is_empty()
                {
                    o.kill = Some((now, killed));
                }
            }
        }

        self.write(found.into_iter().map(|(_, f)| f).collect());
    }

    /// The live container slices under the state root.
    fn slices(&mut self) -> BTreeMap<String, Arc<Slice>> {
        let root = Root::new(&self.cfg.state_root);
        let mut out = BTreeMap::new();
        let mut records: Vec<Record> = root.records();
        records.sort_by(|a, b| a.id.cmp(&b.id));
        let old = self.shared.lock().slices.clone();
        for r in records {
            if start_time(r.pid) != Some(r.start) {
                continue; // gone; the next hook or `cuslice-hook sweep` removes it
            }
            let config_path = root.mnt(&r.id).join("slice/config");
            let config_stamp = stamp(&config_path);
            if let Some(s) = old.get(&r.id)
                && s.init == r.pid
                && s.config_stamp == config_stamp
            {
                out.insert(r.id.clone(), s.clone());
                continue;
            }
            let config = match fs::read_to_string(&config_path)
                .map_err(|e| e.to_string())
                .and_then(|t| {
                    SliceConfig::from_hook_file(&t, std::iter::empty::<(&str, &str)>())
                        .map_err(|e| e.to_string())
                }) {
                Ok(c) => c,
                Err(e) => {
                    self.once(format!(
                        "slice {}: {}: {e}; its limits are unknown, so it is not checked",
                        short(&r.id),
                        config_path.display()
                    ));
                    continue;
                }
            };
            let init = cgroup::placement(r.pid).unwrap_or_default();
            let scope = Scope::of(&init, &self.shared.agent);
            let own_ns = fs::read_link("/proc/self/ns/pid").ok();
            let pidns = fs::read_link(format!("/proc/{}/ns/pid", r.pid))
                .ok()
                .filter(|ns| Some(ns) != own_ns.as_ref());
            let freezer = Freezer::for_scope(&scope, &self.mounts);
            let lowered = fs::read_to_string(root.dir(&r.id).join(cuslice_node::set::LOWERED))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
            out.insert(
                r.id.clone(),
                Arc::new(Slice {
                    ledger: root
                        .mnt(&r.id)
                        .join("slice")
                        .join(cuslice_state::ledger::FILE_NAME),
                    id: r.id,
                    name: r.name,
                    init: r.pid,
                    pidns,
                    scope,
                    freezer,
                    config,
                    config_stamp,
                    lowered,
                }),
            );
        }
        // Slices that went away: forget their cgroups (a cgroup that is gone needs no thaw).
        let mut st = self.shared.lock();
        for (id, s) in &old {
            if out.contains_key(id) {
                continue;
            }
            if let Some(f) = st.frozen.remove(id) {
                let _ = f.freezer.thaw();
            }
            if let Ok(f) = &s.freezer {
                let _ = st.record.remove(f);
            }
            st.unfreezable.remove(id);
        }
        out
    }

    /// SIGKILLs `victims` (host pids of slice `s`, each checked to still be the slice's).
    fn kill(
        &mut self,
        s: &Slice,
        victims: &[i32],
        held: &[Held],
        cap: u64,
        over_s: f64,
        window: f64,
    ) -> Vec<i32> {
        let killed = self.signal(s, victims);
        for &pid in &killed {
            let bytes = held.iter().find(|h| h.pid == pid).map_or(0, |h| h.driver);
            log(&format!(
                "killed pid {pid} of {} (it held {} by the driver's count): the slice was over \
                 its cap of {} for {over_s:.1} s in the last {window:.0} s (--grace {:.1} s)",
                s.label(),
                format_size(bytes),
                format_size(cap),
                self.cfg.grace.as_secs_f64()
            ));
        }
        killed
    }

    /// SIGKILLs every process of slice `s` (its init and everything in its pid namespace or
    /// cgroup): it went over its cap again after a kill, within the window.
    fn kill_all(&mut self, s: &Slice, held: &[Held], cap: u64, window: f64) -> Vec<i32> {
        let mut all: Vec<i32> = fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .collect();
        all.sort_unstable();
        // The init first: in a pid namespace of its own, the kernel kills the rest with it.
        all.retain(|&p| p != s.init);
        all.insert(0, s.init);
        let killed = self.signal(s, &all);
        if !killed.is_empty() {
            log(&format!(
                "killed every process of {} (pids {}): it went over its cap of {} again \
                 within {window:.0} s of a kill ({} by the driver's count, pids {})",
                s.label(),
                join(&killed),
                format_size(cap),
                format_size(judge::total(held)),
                join(&held.iter().map(|h| h.pid).collect::<Vec<_>>())
            ));
        }
        killed
    }

    /// SIGKILLs those of `pids` that are slice `s`'s still (not gone, not another process's
    /// pid now), thawing its cgroup first if the agent froze it (SIGKILL stays pending on a
    /// process frozen by the v1 freezer). Returns those killed.
    fn signal(&mut self, s: &Slice, pids: &[i32]) -> Vec<i32> {
        let slices: BTreeMap<String, Arc<Slice>> = self.shared.lock().slices.clone();
        let ours: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|&p| classify(p, &slices).as_deref() == Some(s.id.as_str()))
            .collect();
        if ours.is_empty() {
            return ours;
        }
        self.shared.lock().unfreeze(&s.id, Instant::now());
        let mut killed = Vec::new();
        for pid in ours {
            match nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            ) {
                Ok(()) => killed.push(pid),
                Err(nix::errno::Errno::ESRCH) => {}
                Err(e) => log(&format!("cannot kill pid {pid} of {}: {e}", s.label())),
            }
        }
        self.shared.lock().actions.kills += killed.len() as u64;
        killed
    }

    fn write(&mut self, found: Vec<Finding>) {
        let actions = {
            let st = self.shared.lock();
            let mut a = st.actions.clone();
            // Freezes still in progress count up to now.
            let now = Instant::now();
            a.frozen_seconds += st
                .frozen
                .values()
                .map(|f| now.duration_since(f.since).as_secs_f64())
                .sum::<f64>();
            a.frozen_seconds = (a.frozen_seconds * 1000.0).round() / 1000.0;
            a
        };
        let f = Findings {
            time: unix_now(),
            period_s: self.cfg.period.as_secs_f64(),
            enforce: match self.cfg.enforce {
                Enforce::Report => "report".into(),
                Enforce::Stop => "stop".into(),
            },
            findings: found,
            actions,
            problems: self.problems.iter().cloned().collect(),
        };
        let path = self.dir.join(findings::FILE_NAME);
        if let Err(e) = findings::write(&path, &f) {
            self.once(format!("cannot write {}: {e}", path.display()));
        }
    }
}

impl Drop for Verifier {
    fn drop(&mut self) {
        self.stopper().stop();
        for t in [self.meter.take(), self.thaw.take()].into_iter().flatten() {
            let _ = t.join();
        }
        let _ = fs::remove_file(self.dir.join(findings::FILE_NAME));
    }
}

fn finding(s: &Slice, uuid: &str, kind: Kind, pids: Vec<i32>, action: String) -> Finding {
    Finding {
        slice: s.id.clone(),
        name: s.name.clone(),
        uuid: uuid.to_string(),
        kind: kind.name().to_string(),
        since: 0.0,
        message: String::new(),
        pids,
        driver_bytes: None,
        cap_bytes: None,
        ledger_bytes: None,
        share_pct: None,
        demand_pct: None,
        limit_pct: None,
        window_s: None,
        over_s: None,
        action,
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn join(pids: &[i32]) -> String {
    if pids.is_empty() {
        return "none".into();
    }
    pids.iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The slice process `pid` (host pid) belongs to: the one whose init shares its pid namespace,
/// or whose cgroup it is in.
fn classify(pid: i32, slices: &BTreeMap<String, Arc<Slice>>) -> Option<String> {
    let ns = fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    if let Some(s) = slices.values().find(|s| s.pidns.as_ref() == Some(&ns)) {
        return Some(s.id.clone());
    }
    let p = cgroup::placement(pid).ok()?;
    slices
        .values()
        .find(|s| s.scope.contains(&p))
        .map(|s| s.id.clone())
}

/// The pid process `pid` has in its own pid namespace (the last field of `NSpid`).
fn inner_pid(pid: i32) -> Option<i32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// A variable of process `pid`'s environment as it was at exec.
fn environ(pid: i32, name: &str) -> Option<String> {
    let raw = fs::read(format!("/proc/{pid}/environ")).ok()?;
    raw.split(|&b| b == 0).find_map(|kv| {
        let kv = std::str::from_utf8(kv).ok()?;
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.to_string())
    })
}

// ---- the meter thread -------------------------------------------------------------------------

/// Starts one of the verifier's threads; None (and a line saying what is lost) if it cannot.
fn spawn(
    shared: &Arc<Shared>,
    name: &str,
    body: fn(&Shared),
    lost: &str,
) -> Option<JoinHandle<()>> {
    let s = shared.clone();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || body(&s))
        .map_err(|e| log(&format!("cannot start the {name} thread: {e}; {lost}")))
        .ok()
}

fn meter_loop(shared: &Shared) {
    while !shared.stop.load(Ordering::SeqCst) {
        let t0 = Instant::now();
        poll(shared);
        std::thread::sleep(POLL.saturating_sub(t0.elapsed()));
    }
}

/// The thaw thread: thaws each frozen slice when its time is served, waking when the meter
/// freezes one and at the earliest end. Takes only the state's lock, never the driver.
fn thaw_loop(shared: &Shared) {
    let mut st = shared.lock();
    while !shared.stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        let due: Vec<String> = st
            .frozen
            .iter()
            .filter(|(_, f)| f.until <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            st.unfreeze(&id, now);
        }
        let next = st.frozen.values().map(|f| f.until).min();
        st = match next {
            Some(t) => {
                let wait = t.saturating_duration_since(Instant::now());
                shared
                    .wake
                    .wait_timeout(st, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => shared.wake.wait(st).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

/// One meter step: new samples into each slice's window and bucket, then freezes what owes
/// (the thaw thread thaws).
fn poll(shared: &Shared) {
    let (nvml, devices, since) = {
        let st = shared.lock();
        let Some(nvml) = st.nvml.clone() else { return };
        let since: Vec<u64> = st
            .devices
            .iter()
            .map(|(_, u)| st.clocks.get(u).map_or(0, |c| c.seen_us))
            .collect();
        (nvml, st.devices.clone(), since)
    };
    let now_wall = wall_us();
    // The driver's calls are made without the lock: `tick` may take it meanwhile.
    let samples: Vec<(String, Vec<cuslice_node::nvml::Sample>)> = devices
        .iter()
        .zip(since)
        .filter_map(|((d, uuid), since)| {
            let since = if since == 0 { now_wall } else { since };
            Some((uuid.clone(), nvml.samples(*d, since).ok()?))
        })
        .collect();
    let now = Instant::now();
    let now_ns = shared.mono_ns(now);
    let mut st = shared.lock();
    let st = &mut *st;
    let dt = st
        .last_poll
        .map_or(0, |t| now.duration_since(t).as_nanos() as u64);
    let prev = st.last_poll.unwrap_or(now);
    st.last_poll = Some(now);
    // Per slice and device: its device time by its own samples (per-process samples).
    let mut used: BTreeMap<(String, String), u64> = BTreeMap::new();
    // Per device under one sample a period: the time the step's stamps stand for, the device's
    // busy time in it, and the slices (None: processes in no slice) the samples named.
    let mut one_per_period: BTreeMap<String, (u64, u64, BTreeSet<Option<String>>)> =
        BTreeMap::new();
    for (uuid, mut list) in samples {
        list.sort_by_key(|x| (x.time_us, x.pid));
        let clock = st
            .clocks
            .entry(uuid.clone())
            .or_insert_with(|| SampleClock::new(now_wall));
        if list
            .windows(2)
            .any(|w| w[0].time_us == w[1].time_us && w[0].pid != w[1].pid)
        {
            clock.multi_seen_us = Some(now_wall);
        }
        let model = judge::sample_model(clock.multi_seen_us, now_wall);
        let (mut cover, mut busy, mut named) = (0, 0, BTreeSet::new());
        for x in list {
            let slice = st
                .pids
                .entry(x.pid)
                .or_insert_with(|| classify(x.pid as i32, &st.slices))
                .clone();
            let ns = clock.take(x.pid, x.time_us, x.sm);
            if model == judge::SampleModel::OnePerPeriod {
                let (c, b) = clock.take_stamp(x.time_us, x.sm);
                cover += c;
                busy += b;
                named.insert(slice.clone());
            }
            if let Some(id) = slice {
                let key = (id, uuid.clone());
                if model == judge::SampleModel::PerProcess {
                    *used.entry(key.clone()).or_default() += ns;
                }
                if ns > 0 {
                    st.meters.entry(key).or_default().pids.insert(x.pid, now_ns);
                }
            }
        }
        clock.forget_before(now_wall, 10_000_000);
        if model == judge::SampleModel::OnePerPeriod {
            one_per_period.insert(uuid, (cover, busy, named));
        }
    }
    // Under one sample a period, each slice's bound (`judge::bounds`) over who may have run:
    // the parties NVML's process list showed at the last tick, and any the samples named since.
    let mut bound: BTreeMap<(String, String), (judge::Bound, u64)> = BTreeMap::new();
    for (uuid, (cover, busy, named)) in &one_per_period {
        let mut parties = st.parties.get(uuid).cloned().unwrap_or_default();
        for n in named {
            parties.entry(n.clone()).or_insert(judge::Party {
                cap: None,
                limited: n
                    .as_ref()
                    .is_some_and(|id| st.meters.contains_key(&(id.clone(), uuid.clone()))),
            });
        }
        let list: Vec<judge::Party> = parties.values().cloned().collect();
        let found = judge::bounds(*busy, *cover, &list);
        for (id, b) in parties.keys().zip(found) {
            if let Some(id) = id {
                bound.insert((id.clone(), uuid.clone()), (b, *busy));
            }
        }
        // A slice with a meter here and no process: it used nothing.
        for (id, u) in st.meters.keys() {
            if u == uuid && !parties.contains_key(&Some(id.clone())) {
                bound.insert(
                    (id.clone(), u.clone()),
                    (judge::Bound::Established(0), *busy),
                );
            }
        }
        // The slices a bound may be acted on for: their processes on the device count as
        // having run there (the samples may never name a slice that uses a minority share).
        for (pid, id) in st.device_pids.get(uuid).into_iter().flatten() {
            let key = (id.clone(), uuid.clone());
            if let (Some((judge::Bound::Established(lb), _)), Some(m)) =
                (bound.get(&key), st.meters.get_mut(&key))
                && *lb > 0
            {
                m.pids.insert(*pid, now_ns);
            }
        }
    }
    // Time each slice spent frozen since the last step (frozen now, or thawed meanwhile).
    let thawed = std::mem::take(&mut st.thawed);
    let frozen_ns = |id: &str| -> u64 {
        let span = |since: Instant, to: Instant| to.saturating_duration_since(since.max(prev));
        let now_frozen = st.frozen.get(id).map(|f| span(f.since, now));
        let was_frozen = thawed.get(id).map(|&(since, at)| span(since, at));
        (now_frozen.unwrap_or_default() + was_frozen.unwrap_or_default()).as_nanos() as u64
    };
    let mut holds: Vec<((String, String), Hold)> = Vec::new();
    let keys: Vec<(String, String)> = st.meters.keys().cloned().collect();
    for key in keys {
        let f = frozen_ns(&key.0);
        let (u, b) = match bound.get(&key) {
            Some(&(b, busy)) => match b {
                judge::Bound::Established(lb) => (lb, Some((b, busy))),
                _ => (0, Some((b, busy))),
            },
            None => (
                used.get(&key).copied().unwrap_or(0).min(i64::MAX as u64) as i64,
                None,
            ),
        };
        let (frozen, just_thawed) = (st.frozen.contains_key(&key.0), thawed.contains_key(&key.0));
        let m = st.meters.get_mut(&key).expect("listed above");
        m.window.add_signed(now_ns, u, f);
        m.bound = b.map(|b| b.0);
        if let Some((b, busy)) = b {
            m.busy.add(now_ns, busy, 0);
            let beyond = match b {
                judge::Bound::Shared(e) => e,
                _ => 0,
            };
            m.beyond.add_signed(now_ns, beyond, 0);
        }
        m.pids
            .retain(|_, t| now_ns.saturating_sub(*t) < judge::WINDOW_NS);
        if let Some(rate) = m.rate {
            if now_ns < m.settle_until {
                m.bucket = Bucket::default();
            } else {
                m.bucket.step_signed(rate, dt, u);
            }
            holds.push((key, m.bucket.hold(rate, frozen, just_thawed)));
        }
    }
    if shared.enforce != Enforce::Stop || !st.thawing || shared.stop.load(Ordering::SeqCst) {
        return;
    }
    // Per slice: the processes to kill for device time owed, and how long to hold it frozen
    // (the longest any device asks).
    let mut owed: BTreeMap<String, u64> = BTreeMap::new();
    for (key, hold) in holds {
        match hold {
            Hold::Nothing => {}
            Hold::Freeze(ns) | Hold::Extend(ns) => {
                let e = owed.entry(key.0.clone()).or_default();
                *e = (*e).max(ns);
            }
            Hold::Kill => kill_for_debt(st, &key, now, now_ns),
        }
    }
    for (id, ns) in owed {
        let until = now + Duration::from_nanos(ns);
        if let Some(f) = st.frozen.get_mut(&id) {
            // Still owed, counting what ran while frozen: frozen on.
            f.until = f.until.max(until);
            continue;
        }
        if thawed.contains_key(&id) || st.thawed.contains_key(&id) {
            continue; // thawed since the last step, or just now to be killed
        }
        let Some(s) = st.slices.get(&id).cloned() else {
            continue;
        };
        let freezer = match &s.freezer {
            Ok(f) => f.clone(),
            Err(e) => {
                if st.unfreezable.insert(id.clone()) {
                    log(&format!(
                        "{} is over its core limit but cannot be frozen: {e}",
                        s.label()
                    ));
                }
                continue;
            }
        };
        // A cgroup frozen by someone else (an operator's `runc pause`) is theirs: the agent
        // neither freezes it nor, later, thaws it.
        if freezer.requested().unwrap_or(false) {
            if st.paused.insert(id.clone()) {
                log(&format!(
                    "{} is over its core limit, but {} is frozen by someone else (a pause); \
                     the agent leaves it as it is",
                    s.label(),
                    freezer.dir().display()
                ));
            }
            continue;
        }
        st.paused.remove(&id);
        if let Err(e) = st.record.add(&freezer) {
            log(&format!(
                "cannot record {} before freezing it: {e}; not frozen",
                freezer.dir().display()
            ));
            continue;
        }
        match freezer.freeze() {
            Ok(()) => {
                st.actions.freezes += 1;
                st.frozen.insert(
                    id,
                    Frozen {
                        freezer,
                        since: now,
                        until: now + Duration::from_nanos(ns),
                    },
                );
                shared.wake.notify_all();
            }
            Err(e) => {
                if st.unfreezable.insert(id.clone()) {
                    log(&format!(
                        "cannot freeze {} ({}): {e}",
                        s.label(),
                        freezer.dir().display()
                    ));
                }
            }
        }
    }
}

/// Kills the processes of slice `key.0` that ran on device `key.1` (those the driver's samples
/// showed in the last second), each checked to be the slice's still: the slice owes more
/// device time than freezing holds (`judge::KILL_DEBT_NS`). Its cgroup is thawed first
/// (SIGKILL stays pending on a process frozen by the v1 freezer); the debt stands, so the meter
/// freezes what is left of the slice again until it is paid.
fn kill_for_debt(st: &mut State, key: &(String, String), now: Instant, now_ns: u64) {
    let (id, uuid) = key;
    let Some(s) = st.slices.get(id).cloned() else {
        return;
    };
    let Some(m) = st.meters.get(key) else { return };
    let debt_ns = m.bucket.debt_ns();
    let limit = m.limit_pct.unwrap_or(0.0);
    // Each checked to be the slice's still (not gone, not another process's pid now).
    let ran: Vec<i32> = m
        .pids
        .iter()
        .filter(|(_, t)| now_ns.saturating_sub(**t) < 1_000_000_000)
        .map(|(&p, _)| p as i32)
        .filter(|&p| classify(p, &st.slices).as_deref() == Some(id.as_str()))
        .collect();
    if !ran.is_empty() {
        st.unfreeze(id, now);
    }
    let mut killed = Vec::new();
    for pid in ran {
        match nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        ) {
            Ok(()) => killed.push(pid),
            Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => log(&format!("cannot kill pid {pid} of {}: {e}", s.label())),
        }
    }
    let m = st.meters.get_mut(key).expect("read above");
    m.bucket.killed();
    if killed.is_empty() {
        return;
    }
    st.actions.kills += killed.len() as u64;
    log(&format!(
        "killed pids {} of {}: by the driver's count it owed {:.2} s of device time on {uuid} \
         beyond its core limit of {limit:.0}%, more than freezing holds ({:.1} s): work it \
         queued ran on while it was frozen",
        join(&killed),
        s.label(),
        debt_ns as f64 / 1e9,
        judge::KILL_DEBT_NS as f64 / 1e9
    ));
    m.killed = Some(ComputeKill {
        at: unix_now(),
        pids: killed,
        debt_ns,
    });
}
