//! An upgrade under running containers, for real (docs/upgrades.md): the previous release
//! (built from its own commit, `CUSLICE_PREVIOUS` naming its target/release, as
//! `tests/upgrade/run` does) is installed with its own `cuslice install`, its hook starts runc
//! and Podman containers on simgpu and its agent watches them; then this build is installed over
//! it with `cuslice install`, this agent replaces that one, and new containers start beside the
//! old.
//! Judged by the simulator's count (memory held, device time), the agent's findings,
//! `cuslice status` and the exporter; then `cuslice uninstall`.
//!
//! Ignored in the per-commit run (building the previous release takes minutes); `tests/run`
//! runs it through `tests/upgrade/run` whenever a state format differs from the ones recorded
//! in tests/upgrade/formats (docs/testing.md).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cuslice_test_engines::podman::{self, Podman};
use cuslice_test_engines::runc::{RuncContainer, bundle};
use cuslice_test_engines::*;
use cuslice_test_harness::{GIB, MIB, Sim, bin_dir};
use serde_json::Value;

/// The previous release's target/release.
fn previous() -> PathBuf {
    let dir = PathBuf::from(std::env::var_os("CUSLICE_PREVIOUS").expect(
        "CUSLICE_PREVIOUS names the previous release's target/release: tests/upgrade/run sets it",
    ));
    assert!(
        dir.join("cuslice").is_file(),
        "{}: no cuslice there",
        dir.display()
    );
    dir
}

/// The ledger version the release in `dir` writes, from the formats line of its `cuslice
/// --version` ("state formats: ledger 7 (reads 6, 7); ..."). Releases before that line wrote 6.
fn ledger_written(dir: &Path) -> u64 {
    let out = output_of(Command::new(dir.join("cuslice")).arg("--version"));
    out.split_once("ledger ")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(6)
}

struct Node {
    prefix: PathBuf,
    /// The hooks.d directory `cuslice install --engine podman` writes.
    hooks_dir: PathBuf,
    /// Podman's hooks directory: the installed descriptors, each given this node's state root
    /// and board (the runc containers get them in their bundles).
    pod_hooks: PathBuf,
    root: PathBuf,
    node_dir: PathBuf,
}

impl Node {
    fn arg(p: &Path) -> &str {
        p.to_str().unwrap()
    }

    /// `cuslice install` of the release in `from`, as an operator runs it; then Podman's copy
    /// of the descriptors it wrote.
    fn install(&self, from: &Path) -> String {
        let out = output_of(
            Command::new(from.join("cuslice"))
                .args(["install", "--no-agent", "--engine", "podman", "--prefix"])
                .arg(&self.prefix)
                .arg("--config")
                .arg(&self.hooks_dir)
                .arg("--from")
                .arg(from),
        );
        let _ = std::fs::remove_dir_all(&self.pod_hooks);
        std::fs::create_dir_all(&self.pod_hooks).unwrap();
        let mut written = 0;
        for entry in std::fs::read_dir(&self.hooks_dir).unwrap() {
            let path = entry.unwrap().path();
            let mut d: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let args = d["hook"]["args"].as_array_mut().unwrap();
            for a in [
                "--state-root",
                Node::arg(&self.root),
                "--node-dir",
                Node::arg(&self.node_dir),
            ] {
                args.push(Value::from(a));
            }
            std::fs::write(
                self.pod_hooks.join(path.file_name().unwrap()),
                d.to_string(),
            )
            .unwrap();
            written += 1;
        }
        assert_eq!(
            written,
            2,
            "{} holds no createRuntime and poststop descriptors: {out}",
            self.hooks_dir.display()
        );
        out
    }

    /// A runc container started by the hook installed in the prefix now.
    fn start(&self, sim: &Sim, n: &str, env: &[&str], cmd: &[&str]) -> RuncContainer {
        let spec = Spec {
            name: n,
            env,
            cmd,
            read_only: false,
        };
        let hook_args = [
            "--state-root",
            Node::arg(&self.root),
            "--node-dir",
            Node::arg(&self.node_dir),
        ];
        let b = bundle(sim, &spec, &hook_args);
        let path = b.path.join("config.json");
        let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let hook = self.prefix.join("bin/cuslice-hook");
        for stage in ["prestart", "poststop"] {
            c["hooks"][stage][0]["path"] = Value::from(hook.to_str().unwrap());
        }
        std::fs::write(&path, c.to_string()).unwrap();
        RuncContainer::start_bundle(b, n)
    }

    /// The node agent of the release in `dir`, on this node's state root, with `--enforce
    /// enforce` (the DaemonSet's is `stop`).
    fn agent(&self, sim: &Sim, dir: &Path, enforce: &str) -> (std::process::Child, Stderr) {
        let mut child = sim
            .command(
                &dir.join("cuslice"),
                &[
                    "agent",
                    "--state-root",
                    Node::arg(&self.root),
                    "--enforce",
                    enforce,
                ],
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = Stderr::capture(&mut child);
        let socket = self.root.join("agent/agent.sock");
        poll("the agent's socket", || socket.exists().then_some(()));
        (child, err)
    }

    /// `cuslice status --json` of this build.
    fn status(&self, sim: &Sim) -> Value {
        cuslice_test_harness::json_of(&mut sim.command(
            &bin_dir().join("cuslice"),
            &["status", "--json", "--state-root", Node::arg(&self.root)],
        ))
    }

    /// `cuslice top --json`'s first view of this node.
    fn top(&self, sim: &Sim) -> Value {
        top_json(sim, &["--state-root", Node::arg(&self.root)])
    }

    fn set(&self, target: &str, args: &[&str]) -> String {
        output_of(
            Command::new(bin_dir().join("cuslice"))
                .args(["set", target, "--state-root"])
                .arg(&self.root)
                .arg("--node-dir")
                .arg(&self.node_dir)
                .args(args),
        )
    }
}

/// The host pids of a runc container's processes.
fn pids_of(id: &str) -> Vec<i32> {
    let out = output_of(Command::new("runc").args(["ps", "--format", "json", id]));
    serde_json::from_str::<Vec<i32>>(&out).unwrap_or_default()
}

/// What the simulator says a runc container's processes hold on device 0 now, and the most
/// each held, summed.
fn held_by_container(sim: &Sim, id: &str) -> (u64, u64) {
    held_by(sim, &pids_of(id))
}

/// What the simulator says these host pids hold on device 0 now, and the most each held,
/// summed.
fn held_by(sim: &Sim, pids: &[i32]) -> (u64, u64) {
    let dev = sim.device(0);
    dev["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| pids.iter().any(|&x| p["pid"] == x))
        .fold((0, 0), |(h, k), p| {
            (
                h + p["held"].as_u64().unwrap(),
                k + p["peak"].as_u64().unwrap(),
            )
        })
}

/// A process started in a running container with `runc exec`.
struct Exec {
    child: std::process::Child,
    /// Its host pid: killing `runc exec` or `podman exec` would leave it running.
    pid: i32,
}

impl Drop for Exec {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of a process this test started; no memory is involved.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

const FILL: [&str; 8] = [
    "cuda-workload",
    "fill",
    "--family",
    "mem",
    "--chunk",
    "32MiB",
    "--hold",
    "600",
];

/// Runs `cmd` (a `cuda-workload fill` in a running container) until its refusal; `pid` then
/// finds its host pid.
fn fill(mut cmd: Command, what: &str, pid: impl FnOnce() -> i32) -> Exec {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(out));
    let t0 = Instant::now();
    let mut seen = Vec::new();
    loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            let err = child
                .wait_with_output()
                .map(|o| o.stderr)
                .unwrap_or_default();
            panic!(
                "{what}: fill ended without a refusal: {seen:?} {}",
                String::from_utf8_lossy(&err)
            );
        };
        if serde_json::from_str::<Value>(&line).is_ok_and(|v| v["event"] == "refused") {
            break;
        }
        seen.push(line);
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{what}: no refusal in 60 s"
        );
    }
    Exec { child, pid: pid() }
}

/// `runc exec ID cuda-workload fill` until its refusal: a new process in a running container.
fn fill_in(id: &str) -> Exec {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let mut cmd = Command::new("runc");
    cmd.args(["exec", "--pid-file"])
        .arg(&pid_file)
        .arg(id)
        .args(FILL);
    fill(cmd, &format!("runc exec {id}"), || {
        poll("runc exec's pid file", || {
            std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
        })
    })
}

/// `podman exec NAME cuda-workload fill` until its refusal; its host pid is the one the
/// container did not have before.
fn fill_in_pod(pod: &Podman, name: &str) -> Exec {
    let before = pod.host_pids(name);
    fill(
        pod.exec(name, &FILL),
        &format!("podman exec {name}"),
        || {
            poll("the podman exec's host pid", || {
                pod.host_pids(name)
                    .into_iter()
                    .find(|p| !before.contains(p))
            })
        },
    )
}

fn slice<'a>(view: &'a Value, id: &str) -> &'a Value {
    view["devices"][0]["slices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["slice"] == id)
        .unwrap_or_else(|| panic!("{id} not in cuslice status: {view}"))
}

/// Two busy slices limited to 30, the previous release's (metered by NVML's samples) and this
/// release's (taking turns), side by side: the previous one within 3 points of its limit; this
/// one never more than 3 over it, and at least half of it (its turns are charged whole, and the
/// driver time-slices the previous release's work into them).
fn mixed_shares_hold(ids: &[&String; 2], got: &[f64], report: &[String]) {
    assert!(
        (got[0] - 30.0).abs() <= 3.0,
        "{} got {:.1}%, limit 30: {report:?}",
        ids[0],
        got[0]
    );
    assert!(
        (15.0..=33.0).contains(&got[1]),
        "{} got {:.1}%, limit 30 (at least 15 beside the previous release's slice): {report:?}",
        ids[1],
        got[1]
    );
}

/// Device time share (percent) of each host pid over `secs`, by the simulator's clock.
fn shares(sim: &Sim, pids: &[i32], secs: u64) -> Vec<f64> {
    let a = (Instant::now(), sim.device_times(0));
    std::thread::sleep(Duration::from_secs(secs));
    let b = (Instant::now(), sim.device_times(0));
    let wall = (b.0 - a.0).as_nanos() as f64;
    pids.iter()
        .map(|&p| {
            let t = |m: &std::collections::HashMap<i64, u64>| m.get(&(p as i64)).copied();
            100.0 * (t(&b.1).unwrap_or(0) - t(&a.1).unwrap_or(0)) as f64 / wall
        })
        .collect()
}

const HOLD: [&str; 6] = [
    "cuda-workload",
    "hold",
    "--bytes",
    "256MiB",
    "--secs",
    "600",
];

/// A Podman container holding 256 MiB under a 1 GiB cap, started by the hook installed in the
/// node's prefix now.
fn start_pod<'a>(pod: &'a Podman, sim: &Sim, node: &Node, name: &str) -> Box<dyn Container + 'a> {
    let spec = Spec {
        name,
        env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
        cmd: &HOLD,
        read_only: false,
    };
    let mut c = pod.spawn_with_hooks(sim, &spec, &node.pod_hooks);
    wait_for(&mut *c, "holding");
    c
}

const KERNELS: &str = "exec cuda-workload launch --ns-per-block 1000 --blocks 1000 --secs 600";

#[test]
#[ignore = "needs the previous release built: tests/upgrade/run"]
fn an_upgrade_keeps_the_previous_releases_containers_capped_beside_new_ones() {
    root_required();
    let prev = previous();
    let sim = Sim::new(&["--memory", "16GiB"]);
    let tmp = tempfile::tempdir().unwrap();
    let node = Node {
        prefix: tmp.path().join("prefix"),
        hooks_dir: tmp.path().join("hooks.d"),
        pod_hooks: tmp.path().join("podman-hooks.d"),
        root: tmp.path().join("state"),
        node_dir: tmp.path().join("board"),
    };
    let mut report = Vec::new();

    // The previous release: installed, its agent, two containers.
    node.install(&prev);
    let (mut old_agent, old_log) = node.agent(&sim, &prev, "stop");
    let (old_mem, old_busy) = (name("old-mem"), name("old-busy"));
    let mut a = node.start(&sim, &old_mem, &["CUSLICE_MEMORY_LIMIT=1GiB"], &HOLD);
    wait_for(&mut a, "holding");
    let mut b = node.start(
        &sim,
        &old_busy,
        &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_CORE_LIMIT=30"],
        &["sh", "-c", KERNELS],
    );
    wait_for(&mut b, "start");
    let pod = podman::engine();
    let old_pod = name("old-pod");
    let e = start_pod(pod, &sim, &node, &old_pod);
    // The previous agent finds nothing wrong with its own release's slices.
    std::thread::sleep(Duration::from_secs(3));
    let before_upgrade = output_of(Command::new(prev.join("cuslice")).args([
        "status",
        "--json",
        "--state-root",
        Node::arg(&node.root),
    ]));
    let before_upgrade: Value = serde_json::from_str(&before_upgrade).unwrap();
    let old_findings = &before_upgrade["findings"]["findings"];
    assert_eq!(
        old_findings.as_array().map_or(0, Vec::len),
        0,
        "the previous agent's findings: {old_findings}\n{}",
        old_log.text()
    );

    // The upgrade: this build's files over the previous ones, this agent for that one.
    let library = node.prefix.join("lib/cuslice/libcuslice.so");
    let before = std::fs::read(&library).unwrap();
    node.install(&bin_dir());
    assert_ne!(
        std::fs::read(&library).unwrap(),
        before,
        "the library was not replaced"
    );
    let _ = old_agent.kill();
    let _ = old_agent.wait();
    let old_agent_log = old_log.text();
    let (mut agent, log) = node.agent(&sim, &bin_dir(), "stop");

    // New containers beside the old ones.
    let (new_mem, new_busy) = (name("new-mem"), name("new-busy"));
    let mut c = node.start(&sim, &new_mem, &["CUSLICE_MEMORY_LIMIT=1GiB"], &HOLD);
    wait_for(&mut c, "holding");
    let mut d = node.start(
        &sim,
        &new_busy,
        &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_CORE_LIMIT=30"],
        &["sh", "-c", KERNELS],
    );
    wait_for(&mut d, "start");
    let new_pod = name("new-pod");
    let f = start_pod(pod, &sim, &node, &new_pod);

    // Caps: a new process in each memory container fills it to its cap, by the simulator's
    // count: in the old one it loads the old library (its mount is the file it had) and joins
    // the old slice.
    let mut fills = Vec::new();
    let mut pod_fills = Vec::new();
    for (id, engine) in [
        (&old_mem, "runc"),
        (&new_mem, "runc"),
        (&old_pod, "podman"),
        (&new_pod, "podman"),
    ] {
        let (held, peak) = if engine == "runc" {
            fills.push(fill_in(id));
            held_by_container(&sim, id)
        } else {
            pod_fills.push(fill_in_pod(pod, id));
            held_by(&sim, &pod.host_pids(id))
        };
        report.push(format!(
            "{id} ({engine}): {} MiB held, {} MiB at most, cap 1024 MiB",
            held / MIB,
            peak / MIB
        ));
        assert!(peak <= GIB, "{id} held {peak} bytes, over its 1 GiB cap");
        assert!(held > GIB - 64 * MIB, "{id} refused early: it holds {held}");
    }

    // Shares: the previous release's busy slice gets its limit, 30% of the device. This
    // release's takes turns, which the previous release's work does not: the driver time-slices
    // that work into its turns, which are charged whole (docs/upgrades.md). It never gets more
    // than its limit, and at least half of it.
    let busy = [b.host_pid(), d.host_pid()];
    let got = shares(&sim, &busy, 6);
    report.push(format!(
        "{old_busy}: {:.1}%, {new_busy}: {:.1}% of device time (limit 30)",
        got[0], got[1]
    ));
    mixed_shares_hold(&[&old_busy, &new_busy], &got, &report);

    // What this build's status says of both, and that the old one says which release it runs.
    let view = node.status(&sim);
    let (was, now) = (ledger_written(&prev), ledger_written(&bin_dir()));
    let slices = [
        (&old_mem, old_mem.clone(), pids_of(&old_mem), was),
        (&new_mem, new_mem.clone(), pids_of(&new_mem), now),
        (&old_pod, e.id(), pod.host_pids(&old_pod), was),
        (&new_pod, f.id(), pod.host_pids(&new_pod), now),
    ];
    // The exporter, over the same state root: each slice's ledger version and cap.
    let metrics = scrape(&sim, &node.root);
    let series = |metric: &str, id: &str| -> Vec<String> {
        metrics
            .lines()
            .filter(|l| {
                l.starts_with(&format!("{metric}{{")) && l.contains(&format!("slice=\"{id}\""))
            })
            .map(str::to_owned)
            .collect()
    };
    let top = node.top(&sim);
    for (name, id, pids, version) in slices {
        let s = slice(&view, &id);
        assert_eq!(s["ledger_version"], version, "{name}: {s}");
        assert_eq!(s["memory"]["limit"], GIB, "{name}: {s}");
        let t = slice(&top, &id);
        assert_eq!(t["ledger_version"], version, "cuslice top, {name}: {t}");
        assert_eq!(t["memory"]["limit"], GIB, "cuslice top, {name}: {t}");
        let (held, _) = held_by(&sim, &pids);
        let used = s["memory"]["used"].as_u64().unwrap();
        assert!(
            used.abs_diff(held) <= 64 * MIB,
            "{name}: status {used}, simulator {held}"
        );
        let info = series("cuslice_slice_info", &id);
        assert!(
            info.len() == 1 && info[0].contains(&format!("ledger_version=\"{version}\"")),
            "{name}: {info:?}\n{metrics}"
        );
        let cap = series("cuslice_slice_memory_limit_bytes", &id);
        assert!(
            cap.len() == 1 && cap[0].ends_with(&format!(" {GIB}")),
            "{name}: {cap:?}"
        );
    }
    let text = output_of(Command::new(bin_dir().join("cuslice")).args([
        "status",
        "--state-root",
        Node::arg(&node.root),
    ]));
    assert_eq!(
        text.contains("previous release's library"),
        was != now,
        "ledgers {was} and {now}: {text}"
    );

    // `cuslice set` on the old slice: its cap raised to 1.5 GiB, and a new fill there stops at
    // it by the simulator's count.
    node.set(&old_mem, &["--memory-limit", "1536MiB"]);
    fills.push(fill_in(&old_mem));
    let (held, peak) = held_by_container(&sim, &old_mem);
    report.push(format!(
        "{old_mem} after cuslice set 1536MiB: {} MiB held, {} MiB at most",
        held / MIB,
        peak / MIB
    ));
    assert!(
        held <= 1536 * MIB && held > 1536 * MIB - 64 * MIB,
        "{report:?}"
    );

    // The agent found nothing wrong with either release's slices.
    std::thread::sleep(Duration::from_secs(3));
    let view = node.status(&sim);
    let findings = &view["findings"]["findings"];
    assert_eq!(
        findings.as_array().map_or(0, Vec::len),
        0,
        "{findings}\n{}",
        log.text()
    );
    let problems = &view["findings"]["problems"];
    assert_eq!(problems.as_array().map_or(0, Vec::len), 0, "{problems}");
    report.push(format!("agent findings: {findings}, problems: {problems}"));

    // Containers of the previous release stopped under this one: this hook's poststop removes
    // their state as that release's did (Podman runs the poststop descriptor it read when the
    // container was made, which names the hook's path: now this release's file).
    let state = node.root.join("containers").join(&old_mem);
    let pod_state = node.root.join("containers").join(e.id());
    for s in [&state, &pod_state] {
        assert!(s.is_dir(), "{} is missing", s.display());
    }
    drop(fills.remove(2));
    drop(fills.remove(0));
    drop(pod_fills.remove(0));
    Box::new(a).remove();
    e.remove();
    poll("the stopped containers' state removed", || {
        (!state.exists() && !pod_state.exists()).then_some(())
    });

    // Back one release, as a rollback does: the previous files over these, the previous agent
    // (under --enforce stop, the DaemonSet's) for this one. That agent cuts this release's
    // ledgers back to its own format's size, which this library survives (it reads only the
    // process slots ever taken, and a new process grows the file back). The running containers
    // stay as they were: this release's keep this library (their mount is the file they had),
    // their cap and their share, a new process there included, by the simulator's count.
    node.install(&prev);
    let _ = agent.kill();
    let _ = agent.wait();
    let (mut old_agent, old_log) = node.agent(&sim, &prev, "stop");
    drop(fills.remove(0));
    drop(pod_fills.remove(0));
    fills.push(fill_in(&new_mem));
    pod_fills.push(fill_in_pod(pod, &new_pod));
    for (id, pids) in [
        (&new_mem, pids_of(&new_mem)),
        (&new_pod, pod.host_pids(&new_pod)),
    ] {
        let (held, peak) = held_by(&sim, &pids);
        report.push(format!(
            "after the downgrade, {id}: {} MiB held, {} MiB at most, cap 1024 MiB",
            held / MIB,
            peak / MIB
        ));
        assert!(held <= GIB && held > GIB - 64 * MIB, "{report:?}");
    }
    std::thread::sleep(Duration::from_secs(4));
    for (id, k) in [(&old_busy, &mut b), (&new_mem, &mut c), (&new_busy, &mut d)] {
        assert!(
            k.exited().is_none(),
            "{id} ended after the downgrade: {report:?}"
        );
    }
    let got = shares(&sim, &busy, 4);
    report.push(format!(
        "after the downgrade: {old_busy}: {:.1}%, {new_busy}: {:.1}% of device time (limit 30)",
        got[0], got[1]
    ));
    mixed_shares_hold(&[&old_busy, &new_busy], &got, &report);
    // What the previous release's tools make of this release's slices: recorded, not judged
    // (that release is what it is; docs/upgrades.md says what to expect).
    let old_status = sim
        .command(
            &prev.join("cuslice"),
            &["status", "--state-root", Node::arg(&node.root)],
        )
        .output()
        .unwrap();
    report.push(format!(
        "the previous release's status after the downgrade:\n{}",
        String::from_utf8_lossy(&old_status.stdout)
    ));
    let _ = old_agent.kill();
    let _ = old_agent.wait();
    report.push(format!("the previous agent's log:\n{}", old_log.text()));

    drop(fills);
    drop(pod_fills);
    for k in [b, c, d] {
        Box::new(k).remove();
    }
    f.remove();
    // This release's containers stopped under the previous release: its poststop does not know
    // to detach their own space, so each leaves its directory with that tmpfs in it
    // (docs/upgrades.md, "Downgrade"). This release's sweep detaches and removes them.
    let spaces = || -> Vec<String> {
        let root = node.root.canonicalize().unwrap().display().to_string();
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&root))
            .map(str::to_string)
            .collect()
    };
    report.push(format!(
        "own spaces left by the previous release's poststop: {:?}",
        spaces()
    ));
    output_of(
        Command::new(bin_dir().join("cuslice-hook"))
            .args(["sweep", "--state-root", Node::arg(&node.root)])
            .args(["--node-dir", Node::arg(&node.node_dir)]),
    );
    assert!(
        spaces().is_empty(),
        "left mounted after this release's sweep: {:?}",
        spaces()
    );
    let out = output_of(
        Command::new(bin_dir().join("cuslice"))
            .args(["uninstall", "--engine", "podman", "--prefix"])
            .arg(&node.prefix)
            .arg("--config")
            .arg(&node.hooks_dir),
    );
    assert!(
        !node.prefix.join("bin/cuslice-hook").exists(),
        "uninstall left the hook: {out}"
    );
    eprintln!(
        "{}\nprevious agent's log:\n{old_agent_log}\nagent's log:\n{}",
        report.join("\n"),
        log.text()
    );
}
