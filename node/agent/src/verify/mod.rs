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
//!
//! **Modules**, one step of a tick each: `slices` (the container slices under the state root and
//! which slice a process is in), `holders` (who holds what by the driver's count, what the
//! ledgers say, the limits that apply, what goes to the meter), `check` (judging: memory,
//! ledgers, files, compute, and logging what started and ended), `stop` (the kills under
//! `Enforce::Stop`), and `meter` (the meter and thaw threads).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cuslice_node::findings::{self, Actions, Finding, Findings};
use cuslice_node::nvml::{Device, Nvml};
use cuslice_policy::config::Config as SliceConfig;
use cuslice_policy::config::gpus::NvmlGpu;
use cuslice_state::host::Root;
use cuslice_state::ledger::ReadOnly;

use crate::cgroup::{self, Freezer, Mounts, Placement, Scope};
use crate::judge::{self, Bucket, OverTime, SampleClock, Tracker, Window};
use crate::{Config, Enforce};

mod check;
mod evidence;
mod holders;
mod meter;
mod slices;
mod stop;

use meter::{meter_loop, spawn, thaw_loop};
use slices::short;

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
    /// The slice's claims on the compute board say what no honest process posts: a device claimed
    /// twice, figures past its grant, a file not its own. Readers count them once or not at all.
    Claims,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Memory => "memory",
            Kind::Compute => "compute",
            Kind::Ledger => "ledger",
            Kind::Files => "files",
            Kind::Claims => "claims",
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
    /// The ledger's format as the hook recorded it (`Record::ledger_version`).
    ledger_version: Option<u32>,
    /// Its place on the node's compute board (`<id>/board`), if it has one: the place's
    /// number, and its folder (the hook's record, host-only, written once for the container).
    place: Option<u64>,
    place_dir: Option<PathBuf>,
    /// A Slurm job's slice: its config file (device, inode), which its processes see at
    /// `/run/cuslice/slice/config` in their own mount namespaces (a job has no pid namespace or
    /// cgroup of cuslice's to tell its processes by).
    job_config: Option<(u64, u64)>,
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

impl Slice {
    /// The format of the slice's ledger: as its record says (the container can rewrite its
    /// ledger's header, not its record); a record without one is the previous release's.
    fn ledger_format(&self) -> u32 {
        self.ledger_version
            .unwrap_or(cuslice_state::ledger::PREVIOUS)
    }

    fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("slice {} ({n})", short(&self.id)),
            None => format!("slice {}", short(&self.id)),
        }
    }
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
    /// Under one sample a period: the stamps that named the slice, and whether they ever put it
    /// far over its limit (`judge::named_over`).
    named: judge::Named,
    named_over: bool,
    /// `stop` killed its processes on the device for it (`KillWhy::Named`).
    named_killed: bool,
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
    /// The stamps that named the slice, when they put it far over its limit: its device time
    /// is then what they name.
    named: Option<judge::NamedShare>,
}

/// A kill of the processes that ran a slice's work on a device.
#[derive(Debug, Clone)]
struct ComputeKill {
    /// Unix seconds.
    at: f64,
    pids: Vec<i32>,
    why: KillWhy,
}

/// Why `stop` killed them.
#[derive(Debug, Clone, Copy)]
enum KillWhy {
    /// It owed more device time than freezing holds (`judge::Hold::Kill`; ns owed beyond the
    /// slice's share).
    Debt(u64),
    /// The driver's samples that name it put it far over its limit (`judge::named_over`): its
    /// work goes around the library, and freezing holds it only while it waits.
    Named(judge::NamedShare),
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
    /// What the driver saw each slice use on each device, step by step (`seen`).
    seen: evidence::Window,
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
    /// The agent's directory, where it publishes what the driver saw (`seen`).
    agent_dir: PathBuf,
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
        cuslice_state::seen::remove(&self.0.agent_dir);
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
    /// Slices whose ledger could not be read this tick (a format this release does not read,
    /// docs/upgrades.md): their ledger is not compared with the driver, since nothing known is
    /// not the same as nothing held; the problem is logged once. Their caps still hold by the
    /// driver's count.
    unreadable: BTreeSet<String>,
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
            agent_dir: Root::new(&cfg.state_root).agent(),
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
                seen: evidence::Window::default(),
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
            unreadable: BTreeSet::new(),
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

    fn once(&mut self, line: String) {
        if !self.logged.contains(&line) {
            log(&line);
        }
        self.problems.insert(line);
    }

    /// Whether the last check found a slice process with no host pid yet (or could not look).
    pub fn untold(&self) -> bool {
        self.untold
    }

    /// One period's check (and, under `Enforce::Stop`, its enforcement): who holds what, what
    /// the ledgers say, the limits that apply, then judge, log, stop and write the findings.
    pub fn tick(&mut self) {
        if self.shared.stop.load(Ordering::SeqCst) {
            return;
        }
        self.logged = std::mem::take(&mut self.problems);
        let nvml = self.nvml();
        let slices = self.slices();
        let Some(nvml) = nvml else {
            self.shared.lock().slices = slices;
            self.write(Vec::new());
            return;
        };
        let devices = self.devices(&nvml);
        // With each GPU's device node, where a slice's hook recorded its GPUs by them.
        let by_node = slices.values().any(|s| {
            s.config
                .gpus()
                .is_some_and(|g| g.nodes.is_some() && !s.config.mentioned_ordinals().is_empty())
        });
        let gpus: Vec<NvmlGpu> = devices
            .iter()
            .map(|(d, uuid)| NvmlGpu {
                uuid: uuid.clone(),
                minor: by_node.then(|| nvml.minor(*d).ok().flatten()).flatten(),
            })
            .collect();

        let mut holders = self.holders(&nvml, &devices, &slices);
        let ledger_used = self.read_ledgers(&slices, &mut holders.held);
        let cleared = self.looked_again(&nvml, &devices, &slices, &holders, &ledger_used);
        let limits = holders::limits(&slices, &gpus, &holders.held);
        self.unattributed_memory(
            &nvml,
            &holders.read,
            &holders.entries,
            &holders.uncapped(),
            &holders.held,
            &limits,
        );
        let usage = self.hand_to_meter(&devices, &slices, &mut holders, &limits);

        let grace = self.cfg.grace.as_secs_f64();
        let at = check::At {
            now: unix_now(),
            grace,
            window: judge::over_window_s(grace, self.cfg.period.as_secs_f64()),
        };
        let mut found =
            self.check_memory(&slices, &holders.held, &ledger_used, &cleared, &limits, at);
        found.extend(self.check_files(&slices));
        found.extend(check::check_claims(&slices));
        self.forget(&slices, &holders, at);
        found.extend(self.check_compute(&slices, &usage, &limits, at.now));
        self.log_changes(&mut found, at.now);
        if self.cfg.enforce == Enforce::Stop {
            self.stop(&slices, &holders.held, &mut found, at);
        }
        self.write(found.into_iter().map(|(_, f)| f).collect());
    }

    /// The driver, opened at the first tick that can (and then shared with the meter).
    fn nvml(&mut self) -> Option<Arc<Nvml>> {
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
    }

    /// The GPUs and their UUIDs; none (logged once) when the driver cannot list them.
    fn devices(&mut self, nvml: &Nvml) -> Vec<(Device, String)> {
        match nvml.devices().and_then(|ds| {
            ds.into_iter()
                .map(|d| Ok((d, nvml.uuid(d)?)))
                .collect::<Result<Vec<_>, String>>()
        }) {
            Ok(d) => d,
            Err(e) => {
                self.once(format!("cannot list the GPUs: {e}"));
                Vec::new()
            }
        }
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
