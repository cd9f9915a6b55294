//! The node agent beside the engines: `cuslice agent` started on a state root, and the scenarios
//! in which it tells container processes their host pids, or is missing.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use cuslice_test_harness::{Sim, bin_dir};
use serde_json::Value;

use crate::*;

/// The agent's socket as the hook's containers see it, on the host.
pub fn agent_socket() -> PathBuf {
    Path::new(STATE_ROOT)
        .join("agent")
        .join(cuslice_state::agent::SOCKET_NAME)
}

/// Scenarios that run the node agent on the state root every engine's hook shares, or that need
/// none there, take turns (one agent per state root; the socket is the state root's).
pub fn agent_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// `cuslice agent --state-root /run/cuslice` (or a test's own root) under the simulator, stopped
/// when dropped. Hold `agent_turn` while it runs on /run/cuslice.
pub struct NodeAgent {
    child: Child,
    /// Its log, shown with a failing test's output.
    err: cuslice_test_harness::Stderr,
    socket: PathBuf,
}

impl NodeAgent {
    pub fn start(sim: &Sim) -> NodeAgent {
        NodeAgent::start_at_with(sim, Path::new(STATE_ROOT), &[])
    }

    /// The agent on state root `root` (a test's own, which needs no `agent_turn`).
    pub fn start_at(sim: &Sim, root: &Path) -> NodeAgent {
        NodeAgent::start_at_with(sim, root, &[])
    }

    /// The agent on /run/cuslice with more arguments (`--enforce stop`).
    pub fn start_with(sim: &Sim, args: &[&str]) -> NodeAgent {
        NodeAgent::start_at_with(sim, Path::new(STATE_ROOT), args)
    }

    /// The agent on state root `root` with more arguments.
    pub fn start_at_args(sim: &Sim, root: &Path, args: &[&str]) -> NodeAgent {
        NodeAgent::start_at_with(sim, root, args)
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        self.err.text()
    }

    fn start_at_with(sim: &Sim, root: &Path, args: &[&str]) -> NodeAgent {
        let root_arg = root.display().to_string();
        let mut a = vec!["agent", "--state-root", root_arg.as_str()];
        a.extend_from_slice(args);
        let mut child = sim
            .command(&bin_dir().join("cuslice"), &a)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = cuslice_test_harness::Stderr::capture(&mut child);
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let socket = root.join("agent").join(cuslice_state::agent::SOCKET_NAME);
        let want = format!("cuslice agent: listening on {}", socket.display());
        if line.trim_end() != want {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "cuslice agent did not start; it printed {line:?}; stderr: {}",
                err.text()
            );
        }
        NodeAgent { child, err, socket }
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        // simgpu run's program dies with it (SIGKILL); until then the socket may still answer.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while cuslice_state::agent::ask(&self.socket, Duration::from_secs(1)).is_ok()
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Reads the container's output until every event in `events` was seen (each a predicate on
/// the JSON line); the lines that are not JSON (stderr merged in) come back too.
fn read_until(c: &mut dyn Container, events: &mut [&mut dyn FnMut(&Value) -> bool]) -> Vec<String> {
    let start = Instant::now();
    let mut seen = vec![false; events.len()];
    let mut text = Vec::new();
    let mut line = String::new();
    while seen.iter().any(|s| !s) {
        line.clear();
        assert!(
            c.stdout().read_line(&mut line).unwrap() > 0,
            "the container ended; it printed {text:?}"
        );
        match serde_json::from_str::<Value>(&line) {
            Ok(v) => {
                for (s, e) in seen.iter_mut().zip(events.iter_mut()) {
                    *s = *s || e(&v);
                }
            }
            Err(_) => text.push(line.trim_end().to_string()),
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not every event in 60 s; non-JSON lines: {text:?}"
        );
    }
    text
}

/// The pid the kernel shows for host process `host` inside its innermost pid namespace, and
/// that namespace.
fn inner_pid(host: i32) -> (i32, PathBuf) {
    let status = std::fs::read_to_string(format!("/proc/{host}/status")).unwrap();
    let inner = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap();
    (
        inner,
        std::fs::read_link(format!("/proc/{host}/ns/pid")).unwrap(),
    )
}

/// With `cuslice agent` running, a container with a core limit whose workload launches kernels
/// gets its processes' host pids into its ledger as they start (the interposer asks the agent
/// at cuInit, through the hook's read-only mount of the agent's directory), with no node tool
/// run: the kernel confirms each mapping. The simulator lists them by host pid; NVML in the
/// container (`info`) lists the slice's processes by host pid; `cuslice status` shows the
/// slice's compute figures measured, not estimated.
pub fn agent_tells_host_pids(engine: &dyn Engine) {
    let _turn = agent_turn();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let _agent = NodeAgent::start(&sim);
    let n = name("agent");
    let script = "grep ' /run/cuslice/agent ' /proc/self/mounts; \
                  cuda-workload hold --bytes 256MiB --secs 60 2>&1 & \
                  while :; do cuda-workload info 2>&1; sleep 1; done & \
                  exec cuda-workload launch --ns-per-block 1000 --blocks 1000 --secs 60 2>&1";
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            // Room for three contexts (the holder's, the launcher's, `info`'s) and 256 MiB.
            env: &[
                "CUSLICE_MEMORY_LIMIT=2GiB",
                "CUSLICE_CORE_LIMIT=40",
                "CUSLICE_LOG=warn",
            ],
            cmd: &["sh", "-c", script],
            read_only: false,
        },
    );
    let mut holder = 0;
    let text = read_until(
        &mut *c,
        &mut [
            &mut |v: &Value| {
                let yes = v["event"] == "holding";
                if yes {
                    holder = v["pid"].as_i64().unwrap() as i32;
                }
                yes
            },
            &mut |v: &Value| v["event"] == "start" && v["scenario"] == "launch",
        ],
    );
    let mount = text
        .iter()
        .find(|l| l.contains(" /run/cuslice/agent "))
        .unwrap_or_else(|| panic!("/run/cuslice/agent is not mounted: {text:?}"));
    let options: Vec<&str> = mount.split(' ').nth(3).unwrap().split(',').collect();
    for o in ["ro", "nosuid", "nodev"] {
        assert!(options.contains(&o), "not {o}: {mount}");
    }
    assert!(
        !text.iter().any(|l| l.contains("cuslice agent")),
        "a warning about the agent while it runs: {text:?}"
    );

    // The ledger, as the processes left it at cuInit: each process's host pid, which the
    // kernel confirms (same pid namespace as the container's init, same pid inside).
    let id = c.id();
    let init = c.host_pid();
    let (_, ns) = inner_pid(init);
    let ledger = slice_dir(&id).join("mnt/slice/ledger");
    let snap = cuslice_state::ledger::Ledger::read(&ledger).unwrap();
    let mut hosts = Vec::new();
    for inside in [1, holder] {
        let p = snap
            .procs
            .iter()
            .find(|p| p.pid == inside)
            .unwrap_or_else(|| panic!("no process {inside} in the ledger: {:?}", snap.procs));
        let host = p
            .host_pid
            .unwrap_or_else(|| panic!("process {inside} has no host pid in the ledger"));
        assert_eq!(inner_pid(host), (inside, ns.clone()), "host pid {host}");
        hosts.push(host);
    }
    assert_eq!(hosts[0], init);

    // The simulator lists them by host pid (as a real driver does).
    let truth = sim.device(0);
    for h in &hosts {
        held_by(&sim, *h);
    }
    // NVML in the container lists the slice's processes by host pid too.
    let mut listed = Vec::new();
    read_until(
        &mut *c,
        &mut [&mut |v: &Value| {
            if v["event"] != "info" {
                return false;
            }
            listed = v["nvml"]["devices"][0]["processes"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|p| p["pid"].as_i64().unwrap() as i32)
                        .collect()
                })
                .unwrap_or_default();
            hosts.iter().all(|h| listed.contains(h))
        }],
    );
    // `cuslice status`: measured compute figures, the processes by host pid.
    let status = || -> Value {
        let out = sim
            .command(&bin_dir().join("cuslice"), &["status", "--json"])
            .output()
            .unwrap();
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (view, slice) = loop {
        let view = status();
        let slice = view["devices"][0]["slices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["slice"] == id.as_str())
            .unwrap_or_else(|| panic!("container {id} not in {view}"))
            .clone();
        // Measured device time: some noted, and not by estimate (a slice that has noted
        // nothing yet is not "estimated" either).
        let measured = slice["compute"]["estimated"] == false
            && slice["compute"]["device_seconds"].as_f64() > Some(0.0);
        if measured || Instant::now() > deadline {
            break (view, slice);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(view["agent"]["running"], true, "{view}");
    assert_eq!(slice["compute"]["estimated"], false, "{slice}");
    assert!(
        slice["compute"]["device_seconds"].as_f64().unwrap() > 0.0,
        "{slice}"
    );
    let init_row = slice["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["container_pid"] == 1)
        .unwrap_or_else(|| panic!("{slice}"))
        .clone();
    assert_eq!(init_row["pid"], init, "{slice}");
    assert!(
        truth["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == init),
        "{truth}"
    );
    c.remove();
}

/// With no agent on the node, a container with caps still starts and is held to its memory cap
/// (the simulator's count); its workload says once, at `CUSLICE_LOG=warn`, that nothing checks
/// its slice against the driver's count until the agent runs; `cuslice status` has a note saying
/// so.
pub fn without_agent(engine: &dyn Engine) {
    let _turn = agent_turn();
    if cuslice_state::agent::ask(&agent_socket(), Duration::from_secs(1)).is_ok() {
        panic!(
            "a cuslice agent answers on {}: this scenario needs a node without one; stop it",
            agent_socket().display()
        );
    }
    // A node that never ran an agent: the findings an agent of an earlier test left when it was
    // killed would make `cuslice status` say, rightly, that they are stale.
    let _ = std::fs::remove_file(Path::new(STATE_ROOT).join("agent-state/findings.json"));
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("noagent");
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &[
                "CUSLICE_MEMORY_LIMIT=1GiB",
                "CUSLICE_CORE_LIMIT=50",
                "CUSLICE_LOG=warn",
            ],
            cmd: &[
                "sh",
                "-c",
                "exec cuda-workload fill --family mem --chunk 64MiB --hold 60 2>&1",
            ],
            read_only: false,
        },
    );
    let (said, start) = lines_until(&mut *c, "start");
    assert_eq!(start["total"], GIB, "{start}");
    let refused = wait_for(&mut *c, "refused");
    assert_eq!(refused["code"], 2, "{refused}");
    let (more, _) = lines_until(&mut *c, "holding");
    let all: Vec<&String> = said.iter().chain(&more).collect();
    let warnings: Vec<&&String> = all.iter().filter(|l| l.contains("agent")).collect();
    assert_eq!(warnings.len(), 1, "{all:?}");
    let w = warnings[0];
    assert!(
        w.starts_with("cuslice: no cuslice agent at /run/cuslice/agent/agent.sock")
            && w.contains("nothing checks this container's slice against the driver's count")
            && w.contains("`cuslice agent`"),
        "{w}"
    );
    let (used, peak) = held_by(&sim, c.host_pid());
    assert!(peak <= GIB, "held {used}, peak {peak} > 1 GiB");
    assert!(
        used >= GIB - 128 * MIB,
        "refused while 128 MiB more fitted: held {used}"
    );
    // Without the agent, the container's first process still knows its host pid (the one NVML
    // names it by, so its first context is measured by its own entry there): the hook's word.
    // Read before `cuslice status`, which tells host pids itself.
    let ledger = slice_dir(&c.id()).join("mnt/slice/ledger");
    let snap = cuslice_state::ledger::Ledger::read(&ledger).unwrap();
    let first = snap
        .procs
        .iter()
        .find(|p| p.pid == 1)
        .unwrap_or_else(|| panic!("no process 1 in the ledger: {:?}", snap.procs));
    assert_eq!(first.host_pid, Some(c.host_pid()), "{:?}", snap.procs);

    let out = sim
        .command(&bin_dir().join("cuslice"), &["status"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let notes: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("note: ") && l.contains("agent"))
        .collect();
    assert_eq!(notes.len(), 1, "{text}");
    assert!(
        notes[0].starts_with(&format!(
            "note: no cuslice agent at {}",
            agent_socket().display()
        )) && notes[0].contains("nothing checks container slices against the driver's count")
            && notes[0].contains("`cuslice agent`"),
        "{}",
        notes[0]
    );
    let out = sim
        .command(&bin_dir().join("cuslice"), &["status", "--json"])
        .output()
        .unwrap();
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["agent"]["running"], false, "{view}");
    c.remove();
}
