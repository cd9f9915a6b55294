//! The soak: the node agent under `--enforce stop` for minutes (`SOAK_SECS`, default 600) while
//! runc containers, honest and bypassing, start, churn and die beside each other on one simulated
//! device. Not part of every test run (it is `#[ignore]`d): `tests/soak` runs it and prints its
//! figures, which docs/agent.md records. Judged by the simulator's count and the kernel's:
//!
//! - two honest containers held to core limits 30 and 20 launch 1 ms kernels all along: every
//!   10 s window of each (after the first 10 s) within 3 points of its limit, but for those any
//!   part of which lies within `FIND_S` of a compute bypass's start (the agent needs 100 of the
//!   driver's stamps to find it: those windows are reported);
//! - every bypass that holds 2 GiB under a 1 GiB cap is gone (nothing held by the simulator's
//!   count) within the grace (2 s) plus one period (1 s) plus 1 s for the driver to release;
//! - a bypass launching kernels under a 20% limit (replaced every 60 s) is found by the stamps
//!   that name it and held within 5 points of its limit from `FIND_S` after its start, or
//!   killed;
//! - honest short-lived containers (churning allocations under a cap, SIGKILLed at random) are
//!   never killed by the agent;
//! - the agent's memory and open descriptors stay flat;
//! - nothing is left behind: no container state, no place on the compute board, no process on
//!   the simulated device, no frozen cgroup.
//!
//! Needs root, runc and busybox (`tests/tools/ensure-tools`), and the release build.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuslice_test_engines as engines;
use cuslice_test_engines::runc::RuncContainer;
use cuslice_test_engines::{Container, Spec, name, root_required};
use cuslice_test_harness::{GIB, Sim, bin_dir};

const GRACE_S: f64 = 2.0;
const PERIOD_S: f64 = 1.0;
/// How long the agent may take to find a compute bypass beside other slices by the stamps that
/// name it (100 of them, a stamp every 100 ms; its window then fills), from its start.
const FIND_S: f64 = 25.0;

struct Agent {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Agent {
    fn start(sim: &Sim, root: &Path) -> Agent {
        let mut c = sim.command(&bin_dir().join("cuslice"), &["agent", "--state-root"]);
        c.arg(root).args(["--enforce", "stop"]);
        let mut child = c.stderr(Stdio::piped()).spawn().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = log.clone();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                l.lock().unwrap().push(line);
            }
        });
        Agent { child, log }
    }

    /// The agent's own pid: the child of `simgpu run`.
    fn pid(&self) -> Option<i32> {
        let p = self.child.id();
        std::fs::read_to_string(format!("/proc/{p}/task/{p}/children"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            // SAFETY: a plain signal to a process of the test's own.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (resident KiB, open descriptors) of process `pid`.
fn footprint(pid: i32) -> (u64, usize) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    (rss, fds)
}

/// Per host pid: (held bytes, device time ns), processes and exited ones, by the simulator.
fn truth(sim: &Sim) -> BTreeMap<i64, (u64, u64)> {
    let d = sim.device(0);
    let mut out = BTreeMap::new();
    for k in ["exited", "processes"] {
        for p in d[k].as_array().cloned().unwrap_or_default() {
            out.insert(
                p["pid"].as_i64().unwrap(),
                (
                    p["held"].as_u64().unwrap_or(0),
                    p["device_time_ns"].as_u64().unwrap_or(0),
                ),
            );
        }
    }
    out
}

fn live_pids(sim: &Sim) -> Vec<i64> {
    sim.device(0)["processes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| p["pid"].as_i64().unwrap())
        .collect()
}

fn container(sim: &Sim, root: &Path, what: &str, env: &[&str], cmd: &[&str]) -> RuncContainer {
    let n = name(what);
    RuncContainer::start(
        sim,
        &Spec {
            name: &n,
            env,
            cmd,
            read_only: false,
        },
        &["--state-root", root.to_str().unwrap()],
    )
}

/// A bypass over its memory cap: from when the simulator first shows it over, how long until
/// it shows nothing held by it.
struct Bypass {
    c: Option<RuncContainer>,
    pid: i32,
    over_at: Option<Instant>,
    gone_after: Option<f64>,
}

#[test]
#[ignore = "the soak runs for minutes: tests/soak runs it"]
fn soak() {
    root_required();
    let _serial = cuslice_test_harness::serial();
    let secs: u64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let sim = Sim::new(&["--memory", "16GiB"]);
    let root = tempfile::Builder::new()
        .prefix("cuslice-soak-")
        .tempdir()
        .unwrap();
    let agent = Agent::start(&sim, root.path());
    std::thread::sleep(Duration::from_secs(1));
    let kernels = [
        "cuda-workload",
        "launch",
        "--ns-per-block",
        "1000",
        "--blocks",
        "1000",
        "--secs",
    ];
    let long = (secs + 30).to_string();
    let honest_cmd: Vec<&str> = kernels.iter().copied().chain([long.as_str()]).collect();
    let mut honest: Vec<(f64, RuncContainer)> = [30.0, 20.0]
        .into_iter()
        .map(|limit| {
            let env = format!("CUSLICE_CORE_LIMIT={limit}");
            let mut c = container(
                &sim,
                root.path(),
                "honest",
                &["CUSLICE_MEMORY_LIMIT=1GiB", &env],
                &honest_cmd,
            );
            engines::wait_for(&mut c, "start");
            (limit, c)
        })
        .collect();
    let honest_pids: Vec<i64> = honest.iter().map(|(_, c)| c.host_pid() as i64).collect();
    let t0 = Instant::now();
    let mut samples: Vec<(Instant, Vec<u64>)> = Vec::new();
    let mut footprints: Vec<(u64, u64, usize)> = Vec::new();
    let mut bypasses: Vec<Bypass> = Vec::new();
    let mut compute_bypass: Option<(RuncContainer, i64, u64, Instant)> = None;
    let mut compute_bypass_starts: Vec<Instant> = Vec::new();
    let mut compute_bypass_shares: Vec<f64> = Vec::new();
    let mut churners: Vec<(RuncContainer, Instant)> = Vec::new();
    let mut churners_started = 0;
    let mut churners_killed = 0;
    let mut round = 0u64;
    while t0.elapsed() < Duration::from_secs(secs) {
        round += 1;
        let now = Instant::now();
        let t = truth(&sim);
        samples.push((
            now,
            honest_pids
                .iter()
                .map(|p| t.get(p).map_or(0, |x| x.1))
                .collect(),
        ));
        // Bypasses over their memory cap: when over, when gone.
        for b in bypasses.iter_mut().filter(|b| b.gone_after.is_none()) {
            let held = t.get(&(b.pid as i64)).map_or(0, |x| x.0);
            let live = live_pids(&sim).contains(&(b.pid as i64));
            match (b.over_at, held > GIB && live) {
                (None, true) => b.over_at = Some(now),
                (Some(at), false) if !live || held <= GIB => {
                    b.gone_after = Some(now.duration_since(at).as_secs_f64());
                    if let Some(c) = b.c.take() {
                        Box::new(c).remove();
                    }
                }
                _ => {}
            }
        }
        // Every 15 s, a new bypass over its memory cap (at most two at once).
        if round % 30 == 1 && bypasses.iter().filter(|b| b.gone_after.is_none()).count() < 2 {
            let mut c = container(
                &sim,
                root.path(),
                "bypass",
                &["CUSLICE_MEMORY_LIMIT=1GiB"],
                &[
                    "cuda-workload",
                    "--route",
                    "bypass",
                    "hold",
                    "--bytes",
                    "2GiB",
                    "--secs",
                    "120",
                ],
            );
            engines::wait_for(&mut c, "start");
            let pid = c.host_pid();
            bypasses.push(Bypass {
                c: Some(c),
                pid,
                over_at: None,
                gone_after: None,
            });
        }
        // A bypass launching kernels under a 20% limit, replaced every 60 s.
        if round % 120 == 10 {
            if let Some((c, pid, used, at)) = compute_bypass.take() {
                let now_used = t.get(&pid).map_or(used, |x| x.1);
                compute_bypass_shares
                    .push(100.0 * (now_used - used) as f64 / at.elapsed().as_nanos() as f64);
                Box::new(c).remove();
            }
            let mut c = container(
                &sim,
                root.path(),
                "compute-bypass",
                &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_CORE_LIMIT=20"],
                &[
                    "cuda-workload",
                    "--route",
                    "bypass",
                    "launch",
                    "--ns-per-block",
                    "1000",
                    "--blocks",
                    "1000",
                    "--secs",
                    "120",
                ],
            );
            engines::wait_for(&mut c, "start");
            let pid = c.host_pid() as i64;
            eprintln!(
                "a compute bypass starts at {:.0} s",
                t0.elapsed().as_secs_f64()
            );
            compute_bypass = Some((c, pid, 0, Instant::now()));
            compute_bypass_starts.push(Instant::now());
        }
        if round % 120 == 10 + 2 * FIND_S as u64
            && let Some((_, pid, used, at)) = compute_bypass.as_mut()
        {
            *used = truth(&sim).get(pid).map_or(0, |x| x.1);
            *at = Instant::now();
        }
        // Honest churners: one every 10 s (at most three), each SIGKILLed or removed after 5-25 s.
        if round % 20 == 5 && churners.len() < 3 {
            let mut c = container(
                &sim,
                root.path(),
                "churner",
                &["CUSLICE_MEMORY_LIMIT=512MiB"],
                &[
                    "cuda-workload",
                    "churn",
                    "--threads",
                    "2",
                    "--secs",
                    "60",
                    "--min",
                    "1MiB",
                    "--max",
                    "64MiB",
                    "--hold-max",
                    "4",
                ],
            );
            engines::wait_for(&mut c, "start");
            churners_started += 1;
            let life = 5 + (round * 7919) % 21;
            churners.push((c, Instant::now() + Duration::from_secs(life)));
        }
        // Churners past their time: half SIGKILLed (dying), half removed the engine's way.
        let mut ending = Vec::new();
        let mut i = 0;
        while i < churners.len() {
            if Instant::now() >= churners[i].1 {
                ending.push(churners.remove(i).0);
            } else {
                i += 1;
            }
        }
        for c in ending {
            if churners_started % 2 == 0 {
                // SAFETY: a plain signal to a process of the test's own container.
                unsafe { libc::kill(c.host_pid(), libc::SIGKILL) };
                churners_killed += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Box::new(c).remove();
        }
        if round.is_multiple_of(20)
            && let Some(pid) = agent.pid()
        {
            let (rss, fds) = footprint(pid);
            footprints.push((t0.elapsed().as_secs(), rss, fds));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let ended = Instant::now();
    // Wind down: everything removed, then what is left.
    for (_, c) in honest.drain(..) {
        Box::new(c).remove();
    }
    for b in bypasses.iter_mut() {
        if let Some(c) = b.c.take() {
            Box::new(c).remove();
        }
    }
    if let Some((c, ..)) = compute_bypass.take() {
        Box::new(c).remove();
    }
    for (c, _) in churners.drain(..) {
        Box::new(c).remove();
    }
    let log = agent.log.lock().unwrap().clone();
    let agent_pid = agent.pid();
    std::thread::sleep(Duration::from_secs(3));
    let left_containers =
        std::fs::read_dir(root.path().join("containers")).map_or(0, |d| d.count());
    let root_text = root.path().display().to_string();
    let left_places = std::fs::read_dir(cuslice_state::board::DEFAULT_DIR)
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("grant"))
                        .is_ok_and(|g| g.contains(&root_text))
                })
                .count()
        })
        .unwrap_or(0);
    let left_procs = live_pids(&sim);
    drop(agent);

    // The figures.
    let mut problems = Vec::new();
    let window = Duration::from_secs(10);
    for (k, limit) in [30.0, 20.0].iter().enumerate() {
        let mut worst: (f64, f64) = (f64::MAX, f64::MIN);
        let mut low_at = 0.0;
        // Windows while a compute bypass was being found.
        let mut finding: (f64, f64) = (f64::MAX, f64::MIN);
        let start = samples
            .iter()
            .position(|(t, _)| t.duration_since(t0) >= window)
            .unwrap_or(0);
        for i in start..samples.len() {
            let Some(j) = samples[..i]
                .iter()
                .rposition(|(t, _)| samples[i].0.duration_since(*t) >= window)
            else {
                continue;
            };
            let (a, b) = (&samples[j], &samples[i]);
            let share = 100.0 * (b.1[k] - a.1[k]) as f64 / (b.0 - a.0).as_nanos() as f64;
            // A window any part of which lies within `FIND_S` of a bypass's start (one that
            // started within the window included).
            let found = !compute_bypass_starts
                .iter()
                .any(|s| *s < b.0 && a.0.saturating_duration_since(*s).as_secs_f64() < FIND_S);
            if !found {
                finding = (finding.0.min(share), finding.1.max(share));
                continue;
            }
            if share < worst.0 {
                low_at = b.0.duration_since(t0).as_secs_f64();
            }
            worst = (worst.0.min(share), worst.1.max(share));
        }
        eprintln!(
            "honest, core limit {limit}%: 10 s windows {:.1}% to {:.1}% (the lowest ending at \
             {low_at:.0} s); within {FIND_S} s of a compute bypass's start, {:.1}% to \
             {:.1}%",
            worst.0, worst.1, finding.0, finding.1
        );
        if worst.0 < limit - 3.0 || worst.1 > limit + 3.0 {
            problems.push(format!(
                "the honest container at {limit}% got {:.1}% to {:.1}% in 10 s windows",
                worst.0, worst.1
            ));
        }
    }
    let gone: Vec<f64> = bypasses.iter().filter_map(|b| b.gone_after).collect();
    let bound = GRACE_S + PERIOD_S + 1.0;
    // Over for less than the bound when the soak ended: not judged.
    let late = |b: &Bypass| {
        b.gone_after.is_none()
            && b.over_at
                .is_some_and(|at| ended.duration_since(at).as_secs_f64() <= bound)
    };
    eprintln!(
        "bypasses over their memory cap: {} started, {} gone, after {:.2?} s (bound {bound} s); \
         {} over for less than that when the soak ended",
        bypasses.len(),
        gone.len(),
        gone,
        bypasses.iter().filter(|b| late(b)).count()
    );
    if gone.iter().any(|g| *g > bound)
        || bypasses
            .iter()
            .any(|b| b.over_at.is_some() && b.gone_after.is_none() && !late(b))
    {
        problems.push(format!(
            "a bypass over its cap was not gone within {bound} s: {gone:.2?}"
        ));
    }
    eprintln!(
        "bypasses launching under a 20% limit, shares from {FIND_S} s after their start: \
         {compute_bypass_shares:.1?}"
    );
    if compute_bypass_shares.iter().any(|s| *s > 25.0) {
        problems.push(format!(
            "a compute bypass under a 20% limit got {compute_bypass_shares:.1?} once found"
        ));
    }
    // Under one utilisation sample a period (the simulator's default, as a real driver), a bypass
    // beside slices without a core limit (the churners, the memory bypasses) cannot be bounded:
    // they may have used any part of the device (docs/agent.md, residual risks); the stamps
    // that name it find it all the same.
    let unbounded = log
        .iter()
        // The agent names a runc container by its id's first 12 characters: "cuslice-comp".
        .filter(|l| l.contains("cuslice-comp") && l.contains("cannot be bounded"))
        .count();
    eprintln!("the agent said {unbounded} times that a compute bypass's use could not be bounded");
    for l in log.iter().filter(|l| l.contains("cuslice-comp")).take(4) {
        eprintln!("  agent: {l}");
    }
    let named = log
        .iter()
        .filter(|l| {
            l.contains("cuslice-comp")
                && (l.contains("samples that name it") || l.contains("samples named its"))
        })
        .count();
    eprintln!("the agent found a compute bypass by the stamps that name it {named} times");
    // Honest churners: never killed by the agent.
    let killed_honest: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("churner") && l.contains("killed"))
        .collect();
    eprintln!(
        "honest churners: {churners_started} started, {churners_killed} SIGKILLed by the test, {} killed by the agent",
        killed_honest.len()
    );
    if !killed_honest.is_empty() {
        problems.push(format!(
            "the agent killed honest churners: {killed_honest:?}"
        ));
    }
    eprintln!("agent (s, RSS KiB, fds): {footprints:?}");
    if let (Some(first), Some(last)) = (footprints.get(1), footprints.last())
        && (last.1 > first.1 + first.1 / 5 + 2048 || last.2 > first.2 + 4)
    {
        problems.push(format!("the agent grew: {first:?} -> {last:?}"));
    }
    eprintln!(
        "left behind: {left_containers} container directories, {left_places} places on the board, processes on the device {left_procs:?}; agent pid was {agent_pid:?}"
    );
    if left_containers + left_places > 0 || !left_procs.is_empty() {
        problems.push("something was left behind".into());
    }
    let frozen: Vec<String> = log
        .iter()
        .filter(|l| l.contains("cannot thaw"))
        .cloned()
        .collect();
    if !frozen.is_empty() {
        eprintln!("agent lines about thawing: {frozen:?}");
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
