//! `cuslice agent` checking real runc containers on simgpu against the driver's own counts.
//! Each container runs the test workload, which goes around the library where the scenario
//! says (`--route bypass`: dlsym on a renamed copy of libcuda.so.1); the agent runs under
//! `simgpu run` as it would on a GPU node, with a state root of the test's own (so it never
//! sees, let alone stops, another test's containers). Ground truth: the simulator (what each
//! process holds, the device time it used), the kernel (the cgroup freezer's state, exit
//! statuses), never the agent's own files alone.
//!
//! Needs root, runc and busybox (`tests/ensure-tools`), and the release build.

#[path = "../../../hook/tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::runc::RuncContainer;
use common::{Container, Spec, name, root_required};
use cuslice_test_harness::{GIB, MIB, Sim, bin_dir};
use serde_json::{Value, json};

/// A runc container whose hooks use the test's state root `root`.
fn runc(sim: &Sim, root: &Path, spec: &Spec<'_>) -> RuncContainer {
    RuncContainer::start(sim, spec, &["--state-root", root.to_str().unwrap()])
}

// ---- the agent -------------------------------------------------------------------------------

struct Agent {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Agent {
    /// `cuslice agent --state-root ROOT ARGS` under `simgpu run` (NVML is the simulator's).
    fn start(sim: &Sim, root: &Path, args: &[&str]) -> Agent {
        let mut c = sim.command(&bin_dir().join("cuslice"), &["agent", "--state-root"]);
        c.arg(root).args(args);
        let mut child = c.stderr(Stdio::piped()).spawn().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = log.clone();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[agent] {line}");
                l.lock().unwrap().push(line);
            }
        });
        Agent { child, log }
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Waits up to `secs` for a log line containing `what`.
    fn wait_log(&self, what: &str, secs: u64) -> String {
        poll(&format!("agent log line with {what:?}"), secs, || {
            self.log().into_iter().find(|l| l.contains(what))
        })
    }

    /// SIGKILL (simgpu run's child, the agent, gets SIGKILL as its parent dies).
    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        self.child.wait().unwrap()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.terminate();
        }
    }
}

fn poll<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "no {what} in {secs} s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits up to 30 s for the kernel to report the v1 freezer cgroup `state` FROZEN.
fn wait_frozen(state: &Path) {
    poll("the container frozen", 30, || {
        std::fs::read_to_string(state)
            .is_ok_and(|s| s.trim() == "FROZEN")
            .then_some(())
    });
}

/// The agent's findings.json, if written.
fn findings(root: &Path) -> Option<Value> {
    let t = std::fs::read_to_string(root.join("agent-state/findings.json")).ok()?;
    serde_json::from_str(&t).ok()
}

fn finding_of(root: &Path, slice: &str, kind: &str) -> Option<Value> {
    findings(root)?["findings"]
        .as_array()?
        .iter()
        .find(|f| f["slice"] == slice && f["kind"] == kind)
        .cloned()
}

/// What the simulator says process `pid` holds on device 0 now (0 if it holds nothing), and
/// the device time (ns) it used.
fn truth(sim: &Sim, pid: i32) -> (u64, u64) {
    let dev = sim.device(0);
    let p = dev["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .cloned();
    let held = p.as_ref().and_then(|p| p["held"].as_u64()).unwrap_or(0);
    let time = p
        .as_ref()
        .and_then(|p| p["device_time_ns"].as_u64())
        .unwrap_or(0);
    (held, time)
}

fn state_root() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("cuslice-agent-test-")
        .tempdir()
        .unwrap()
}

const BYPASS_2GIB: &[&str] = &[
    "cuda-workload",
    "--route",
    "bypass",
    "hold",
    "--bytes",
    "2GiB",
    "--secs",
    "120",
];

// ---- the scenarios ---------------------------------------------------------------------------

/// `--enforce stop`, memory: a container capped at 1 GiB whose workload goes around the library
/// and holds 2 GiB (the simulator shows it: the library did not stop it) is killed once it has
/// been over for the grace, and the simulator shows the memory gone.
#[test]
fn stop_kills_a_slice_over_its_memory_cap() {
    root_required();
    let _serial = cuslice_test_harness::serial();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let root = state_root();
    let agent = Agent::start(
        &sim,
        root.path(),
        &["--enforce", "stop", "--period", "1", "--grace", "2"],
    );
    let n = name("stopmem");
    let mut c = runc(
        &sim,
        root.path(),
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: BYPASS_2GIB,
            read_only: false,
        },
    );
    common::wait_for(&mut c, "bypass");
    let holding = common::wait_for(&mut c, "holding");
    let over_at = Instant::now();
    let pid = c.host_pid();
    let (held, _) = truth(&sim, pid);
    assert!(
        held > 2 * GIB,
        "the bypass holds {held} bytes by the simulator's count: the library was not bypassed \
         ({holding})"
    );
    // The memory goes when the agent kills the process.
    poll("memory released", 30, || {
        (truth(&sim, pid).0 == 0).then_some(())
    });
    let gone_after = over_at.elapsed();
    eprintln!(
        "memory over the cap until gone: {:.2} s (grace 2 s, period 1 s)",
        gone_after.as_secs_f64()
    );
    let status = poll("the container's exit", 10, || c.exited());
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status).or(status.code().map(|c| c - 128)),
        Some(9),
        "the container's process was SIGKILLed: {status:?}"
    );
    let line = agent.wait_log(&format!("killed pid {pid} "), 5);
    assert!(line.contains("over its cap of 1 GiB"), "{line}");
    assert!(
        agent
            .log()
            .iter()
            .any(|l| l.contains(&n[..12]) && l.contains("by the driver's count")),
        "the finding was logged before the kill: {:?}",
        agent.log()
    );
    drop(c);
    drop(agent);
}

/// `--enforce stop`, compute: a container with a 30% core limit whose workload goes around the
/// library and launches 1 ms kernels back to back is held near 30% of the device by freezing its
/// cgroup; on SIGTERM the agent leaves it thawed; an agent SIGKILLed while it is frozen leaves
/// it frozen, and the next agent thaws it as it starts.
#[test]
fn stop_holds_a_slice_to_its_core_limit_by_freezing() {
    root_required();
    let _serial = cuslice_test_harness::serial();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let root = state_root();
    let mut agent = Agent::start(&sim, root.path(), &["--enforce", "stop"]);
    let n = name("stopcpu");
    let mut c = runc(
        &sim,
        root.path(),
        &Spec {
            name: &n,
            env: &["CUSLICE_CORE_LIMIT=30"],
            cmd: &[
                "cuda-workload",
                "--route",
                "bypass",
                "launch",
                "--ns-per-block",
                "1000000",
                "--blocks",
                "1",
                "--secs",
                "120",
            ],
            read_only: false,
        },
    );
    common::wait_for(&mut c, "start");
    let started = Instant::now();
    let pid = c.host_pid();
    let freezer = PathBuf::from(format!("/sys/fs/cgroup/freezer/{n}/freezer.state"));
    wait_frozen(&freezer);
    eprintln!(
        "first frozen {:.2} s after the workload started",
        started.elapsed().as_secs_f64()
    );
    // The finding needs 5 s of history; give the duty cycle a few more seconds to settle.
    agent.wait_log("over its core limit", 30);
    eprintln!(
        "finding logged {:.2} s after the workload started",
        started.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(3));
    let (_, t0) = truth(&sim, pid);
    let w0 = Instant::now();
    let mut frozen_seen = false;
    while w0.elapsed() < Duration::from_secs(10) {
        frozen_seen |= std::fs::read_to_string(&freezer).is_ok_and(|s| s.trim() == "FROZEN");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, t1) = truth(&sim, pid);
    let share = (t1 - t0) as f64 / w0.elapsed().as_nanos() as f64 * 100.0;
    eprintln!("share over 10 s under --enforce stop: {share:.1}% (limit 30%)");
    assert!(
        (share - 30.0).abs() <= 5.0,
        "the bypass used {share:.1}% of the device over 10 s by the simulator's count, not \
         within 5 points of its 30% limit"
    );
    assert!(
        frozen_seen,
        "the kernel never reported {} FROZEN",
        freezer.display()
    );
    let f = findings(root.path()).unwrap();
    eprintln!("actions: {}", f["actions"]);
    assert!(f["actions"]["freezes"].as_u64().unwrap() > 0, "{f}");

    // A driver that stalls does not keep the slice frozen: with the device's lock held (as a
    // process frozen in the middle of a driver call holds simgpu's, the agent's driver calls
    // block), the freeze still ends when its time is served.
    wait_frozen(&freezer);
    let state = simgpu::State::open(&sim.state).unwrap();
    let stalled = Instant::now();
    let thawed = {
        let _lock = state.lock_device(0);
        let mut thawed = None;
        while thawed.is_none() && stalled.elapsed() < Duration::from_secs(3) {
            if std::fs::read_to_string(&freezer).is_ok_and(|s| s.trim() == "THAWED") {
                thawed = Some(stalled.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        thawed
    };
    drop(state);
    let thawed = thawed.expect("the slice stayed frozen for 3 s while the driver stalled");
    eprintln!(
        "thawed {:.0} ms into a stalled driver",
        thawed.as_secs_f64() * 1000.0
    );
    // SIGTERM: the agent thaws what it froze before it exits.
    let status = agent.terminate();
    assert!(status.success(), "{status:?}");
    assert_eq!(std::fs::read_to_string(&freezer).unwrap().trim(), "THAWED");
    // And the container runs free again (the whole device).
    let (_, t2) = truth(&sim, pid);
    std::thread::sleep(Duration::from_secs(2));
    let (_, t3) = truth(&sim, pid);
    let free = (t3 - t2) as f64 / 2e9 * 100.0;
    assert!(free > 80.0, "after the agent stopped: {free:.1}%");

    // SIGKILL while frozen: nothing can thaw then, so the next agent does.
    let mut second = Agent::start(&sim, root.path(), &["--enforce", "stop"]);
    wait_frozen(&freezer);
    second.kill9();
    let left = std::fs::read_to_string(&freezer).unwrap();
    let _third = Agent::start(&sim, root.path(), &["--enforce", "report"]);
    if left.trim() != "THAWED" {
        let line = _third.wait_log("which an earlier agent froze", 10);
        assert!(line.contains(&n), "{line}");
    }
    assert_eq!(std::fs::read_to_string(&freezer).unwrap().trim(), "THAWED");
    Box::new(c).remove();
}

/// `--enforce report`: the same memory overuse shows in the agent's log, findings.json,
/// `cuslice status` and the exporter, and nothing is killed. An honest container beside it has
/// no finding.
#[test]
fn report_shows_the_overuse_and_kills_nothing() {
    root_required();
    let _serial = cuslice_test_harness::serial();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let root = state_root();
    let agent = Agent::start(&sim, root.path(), &["--enforce", "report", "--grace", "1"]);
    let (n, honest) = (name("report"), name("honest"));
    let mut c = runc(
        &sim,
        root.path(),
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: BYPASS_2GIB,
            read_only: false,
        },
    );
    let mut h = runc(
        &sim,
        root.path(),
        &Spec {
            name: &honest,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &[
                "cuda-workload",
                "hold",
                "--bytes",
                "512MiB",
                "--secs",
                "120",
            ],
            read_only: false,
        },
    );
    common::wait_for(&mut c, "holding");
    common::wait_for(&mut h, "holding");
    let pid = c.host_pid();
    let line = agent.wait_log("by the driver's count, over its cap", 20);
    assert!(line.contains(&n[..12]) && line.contains("1 GiB"), "{line}");
    assert!(line.contains("--enforce report"), "{line}");
    let f = poll("a memory finding", 10, || {
        finding_of(root.path(), &n, "memory")
    });
    let (held, _) = truth(&sim, pid);
    assert_eq!(f["driver_bytes"], held, "{f}");
    assert_eq!(f["cap_bytes"], GIB, "{f}");
    assert_eq!(f["pids"], json!([pid]), "{f}");
    // The bypass is unknown to the ledger too.
    let l = poll("a ledger finding", 10, || {
        finding_of(root.path(), &n, "ledger")
    });
    assert_eq!(l["pids"], json!([pid]), "{l}");

    // cuslice status, as people read it.
    let out = sim
        .command(
            &bin_dir().join("cuslice"),
            &["status", "--state-root", root.path().to_str().unwrap()],
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.starts_with("agent: ")
            && l.contains(&n[..12])
            && l.contains("over its cap")),
        "{text}"
    );
    // The exporter.
    let metrics = scrape(&sim, root.path());
    let violation = format!("slice=\"{n}\"");
    let has = |check: &str| {
        metrics.lines().any(|l| {
            l.starts_with("cuslice_slice_violation{")
                && l.contains(&violation)
                && l.contains(&format!("check=\"{check}\""))
                && l.ends_with(" 1")
        })
    };
    assert!(has("memory") && has("ledger"), "{metrics}");
    assert!(
        metrics.contains("cuslice_agent_actions_total{action=\"kill\"} 0"),
        "{metrics}"
    );
    // Nothing killed, however long it stays over: the simulator still shows it holding.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(truth(&sim, pid).0, held);
    assert!(c.exited().is_none());
    assert!(!agent.log().iter().any(|l| l.contains("killed")));
    // The honest container has nothing against it.
    let all = findings(root.path()).unwrap();
    assert!(
        !all["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["slice"] == honest),
        "{all}"
    );
    // The finding ends when the overuse does, with one line.
    Box::new(c).remove();
    agent.wait_log("back within its memory cap", 10);
    Box::new(h).remove();
}

/// A tenant that writes zeros over its ledger's counters from inside its container (so the
/// library would let it past its cap) is found: the ledger does not match the driver.
#[test]
fn a_ledger_written_over_is_found() {
    root_required();
    let _serial = cuslice_test_harness::serial();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let root = state_root();
    let agent = Agent::start(&sim, root.path(), &["--enforce", "report"]);
    let n = name("tamper");
    let mut c = runc(
        &sim,
        root.path(),
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=2GiB"],
            cmd: &[
                "cuda-workload",
                "hold",
                "--bytes",
                "900MiB",
                "--zero-ledger",
                "/run/cuslice/slice/ledger",
                "--secs",
                "120",
            ],
            read_only: false,
        },
    );
    let t = common::wait_for(&mut c, "tampered");
    assert!(t["words"].as_u64().unwrap() >= 2, "{t}");
    let pid = c.host_pid();
    let f = poll("a ledger finding", 15, || {
        finding_of(root.path(), &n, "ledger")
    });
    let (held, _) = truth(&sim, pid);
    assert!(held >= 900 * MIB, "{held}");
    assert_eq!(f["driver_bytes"], held, "{f}");
    assert_eq!(f["ledger_bytes"], 0, "{f}");
    assert_eq!(f["pids"], json!([pid]), "{f}");
    let line = agent.wait_log("ledger does not match the driver", 5);
    assert!(line.contains(&n[..12]), "{line}");
    Box::new(c).remove();
}

/// GET /metrics from `cuslice exporter` over the same state root.
fn scrape(sim: &Sim, root: &Path) -> String {
    let mut child = sim
        .command(
            &bin_dir().join("cuslice"),
            &[
                "exporter",
                "--listen",
                "127.0.0.1:0",
                "--state-root",
                root.to_str().unwrap(),
            ],
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .trim()
        .strip_prefix("cuslice exporter: serving http://")
        .and_then(|s| s.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("first line: {first:?}"))
        .to_string();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    body
}

/// `--enforce stop` leaves alone a slice the library already holds to its core limit: the
/// driver's count agrees with the library's, so the agent finds nothing and freezes nothing.
#[test]
fn stop_leaves_a_slice_the_library_holds_alone() {
    root_required();
    let _serial = cuslice_test_harness::serial();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let root = state_root();
    let agent = Agent::start(&sim, root.path(), &["--enforce", "stop"]);
    let n = name("honestcpu");
    let mut c = runc(
        &sim,
        root.path(),
        &Spec {
            name: &n,
            env: &["CUSLICE_CORE_LIMIT=30"],
            cmd: &[
                "cuda-workload",
                "launch",
                "--ns-per-block",
                "1000000",
                "--blocks",
                "1",
                "--secs",
                "120",
            ],
            read_only: false,
        },
    );
    common::wait_for(&mut c, "start");
    let pid = c.host_pid();
    std::thread::sleep(Duration::from_secs(3));
    let (_, t0) = truth(&sim, pid);
    let w0 = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let (_, t1) = truth(&sim, pid);
    let share = (t1 - t0) as f64 / w0.elapsed().as_nanos() as f64 * 100.0;
    let f = findings(root.path()).unwrap();
    eprintln!("share {share:.1}%, findings {f}");
    assert_eq!(f["actions"]["freezes"], 0, "{f}");
    assert!(f["findings"].as_array().unwrap().is_empty(), "{f}");
    assert!((share - 30.0).abs() <= 3.0, "{share:.1}%");
    drop(agent);
    Box::new(c).remove();
}
