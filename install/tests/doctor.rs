//! `cuslice doctor` on the simulated GPU, against a scratch `--root` where `cuslice install`
//! registered the engines from the release build, with a live `cuslice agent`: every item is
//! ok, and each part broken on purpose (a file removed, an engine's configuration rewritten, an
//! engine uninstalled, a container's stale state, the agent killed) turns into one PROBLEM line
//! naming its fix, with exit code 1. The fixes it names are run and make it healthy again.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use cuslice_test_harness::{Sim, bin_dir};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_cuslice");
const ENGINES: &str = "cdi,containerd,docker,podman";

struct Node {
    sim: Sim,
    dir: tempfile::TempDir,
    root: PathBuf,
    state: PathBuf,
}

impl Node {
    fn new() -> Node {
        Node::on(&[])
    }

    /// On a simulator made by `simgpu init ARGS`.
    fn on(args: &[&str]) -> Node {
        let sim = Sim::new(args);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let state = dir.path().join("state");
        fs::create_dir_all(&root).unwrap();
        Node {
            sim,
            dir,
            root,
            state,
        }
    }

    fn path(&self, target: &str) -> PathBuf {
        self.root.join(target.trim_start_matches('/'))
    }

    /// `cuslice install|uninstall --root ROOT --engine ENGINES` (from the release build).
    fn cuslice_install(&self, cmd: &str, engines: &str) {
        let mut c = Command::new(BIN);
        c.arg(cmd)
            .arg("--root")
            .arg(&self.root)
            .args(["--engine", engines]);
        if cmd == "install" {
            c.arg("--no-agent").arg("--from").arg(bin_dir());
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{cmd}: {}", text(&out));
    }

    /// `cuslice doctor` under the simulator (NVML is simgpu's): (exit code, stdout lines).
    fn doctor(&self, args: &[&str]) -> (i32, Output) {
        let out = self
            .sim
            .command(Path::new(BIN), &["doctor", "--root"])
            .arg(&self.root)
            .arg("--state-root")
            .arg(&self.state)
            .args(args)
            .output()
            .unwrap();
        (out.status.code().unwrap_or(-1), out)
    }

    fn lines(&self) -> (i32, Vec<String>) {
        let (code, out) = self.doctor(&[]);
        let lines = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        (code, lines)
    }

    /// `cuslice agent` under the simulator, once it listens.
    fn agent(&self) -> Child {
        let mut child = self
            .sim
            .command(Path::new(BIN), &["agent", "--state-root"])
            .arg(&self.state)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("cuslice agent: listening on"), "{line}");
        child
    }
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn problems(lines: &[String]) -> Vec<&String> {
    lines.iter().filter(|l| l.starts_with("PROBLEM")).collect()
}

/// Exactly one problem line, which starts with `start` and says `fix`.
fn one_problem(node: &Node, start: &str, fix: &str) {
    let (code, lines) = node.lines();
    let p = problems(&lines);
    assert_eq!(code, 1, "{lines:#?}");
    assert_eq!(p.len(), 1, "{lines:#?}");
    assert!(p[0].starts_with(start), "{start}: {lines:#?}");
    assert!(
        p[0].ends_with(&format!("; fix: {fix}")),
        "{fix}: {lines:#?}"
    );
}

fn healthy(node: &Node) -> Vec<String> {
    let (code, lines) = node.lines();
    assert_eq!(code, 0, "{lines:#?}");
    assert!(problems(&lines).is_empty(), "{lines:#?}");
    lines
}

#[test]
fn doctor_says_what_is_right_and_each_thing_broken() {
    let node = Node::new();
    node.cuslice_install("install", ENGINES);
    let mut agent = node.agent();
    let version = env!("CARGO_PKG_VERSION");
    let install = format!(
        "cuslice install --engine docker,containerd,podman,cdi --root {}",
        node.root.display()
    );

    // Healthy: every item as it is.
    let lines = healthy(&node);
    let socket = node.state.join("agent/agent.sock");
    for want in [
        "note    gpu: the GPU is simgpu's simulated device (a test instrument), not a real one"
            .to_owned(),
        "ok      engine docker: registered".to_owned(),
        "ok      engine containerd: registered".to_owned(),
        "ok      engine podman: registered".to_owned(),
        "ok      engine cdi: registered".to_owned(),
        "note    engine crio: not registered; command: cuslice install --engine crio".to_owned(),
        format!("ok      file /usr/local/bin/cuslice-hook: {version}"),
        format!("ok      file /usr/local/bin/cuslice: {version}"),
        format!("ok      file /usr/local/bin/cuslice-runtime: {version}"),
        format!("ok      file /usr/local/lib/cuslice/libcuslice.so: {version}"),
        format!("ok      file /usr/local/lib/cuslice/libcuslice_core.so: {version}"),
        "ok      stale state: none".to_owned(),
    ] {
        assert!(lines.contains(&want), "{want}: {lines:#?}");
    }
    // The cgroup layout and the state root's file system, as the kernel has them.
    let v2_only = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let cgroup = lines
        .iter()
        .find(|l| l.starts_with("ok      cgroup: "))
        .unwrap_or_else(|| panic!("no cgroup line: {lines:#?}"));
    assert!(
        cgroup.contains(if v2_only { "v2" } else { "v1" }),
        "{cgroup} (/sys/fs/cgroup/cgroup.controllers exists: {v2_only})"
    );
    let fs_type = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(&node.state)
        .output()
        .unwrap();
    let tmpfs = String::from_utf8_lossy(&fs_type.stdout).trim() == "tmpfs";
    let root_line = lines
        .iter()
        .find(|l| l.contains(&format!(" state root {}: ", node.state.display())))
        .unwrap_or_else(|| panic!("no state root line: {lines:#?}"));
    assert!(
        if tmpfs {
            root_line.starts_with("ok      ") && root_line.contains(": tmpfs, ")
        } else {
            root_line.starts_with("note    ") && root_line.contains(": not tmpfs (")
        },
        "{root_line} (tmpfs: {tmpfs})"
    );
    // The agent runs under `simgpu run`, as its child: its pid is not the one spawned here.
    let line = lines
        .iter()
        .find(|l| l.starts_with("ok      agent: running (pid "))
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert!(
        line.ends_with(&format!(
            "), answers on {}, version {version}",
            socket.display()
        )),
        "{lines:#?}"
    );
    let nvml = lines
        .iter()
        .find(|l| l.starts_with("ok      nvml: driver "));
    assert!(
        nvml.is_some_and(|l| l.contains(", NVML ") && l.ends_with(", 1 GPU")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("ok      gpu 0 meter: SimGPU (simulated): turns (")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("ok      gpu 0 processes: per-process memory")),
        "{lines:#?}"
    );

    // --json parses, and says the same.
    let (code, out) = node.doctor(&["--json"]);
    assert_eq!(code, 0, "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("doctor --json");
    assert_eq!(v["healthy"], true);
    assert_eq!(v["version"], version);
    let items = v["items"].as_array().unwrap();
    let podman = items
        .iter()
        .find(|i| i["check"] == "engine podman")
        .unwrap();
    assert_eq!(podman["status"], "ok", "{podman}");
    assert!(items.iter().all(|i| i["status"] != "problem"), "{v:#}");

    // The hook removed.
    let hook = node.path("/usr/local/bin/cuslice-hook");
    let saved = node.dir.path().join("cuslice-hook.saved");
    fs::rename(&hook, &saved).unwrap();
    one_problem(
        &node,
        "PROBLEM file /usr/local/bin/cuslice-hook: missing",
        &install,
    );
    let (code, out) = node.doctor(&["--json"]);
    assert_eq!(code, 1);
    let v: Value = serde_json::from_slice(&out.stdout).expect("doctor --json");
    assert_eq!(v["healthy"], false);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cuslice doctor: 1 problem"),
        "{}",
        text(&out)
    );
    fs::rename(&saved, &hook).unwrap();
    healthy(&node);

    // containerd's config.toml rewritten without the import of cuslice's drop-in.
    let config = node.path("/etc/containerd/config.toml");
    let before = fs::read_to_string(&config).unwrap();
    let reverted: String = before
        .lines()
        .filter(|l| !l.starts_with("imports"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(before, reverted);
    fs::write(&config, reverted).unwrap();
    one_problem(
        &node,
        "PROBLEM engine containerd: registered, but out of date: install would change \
         /etc/containerd/config.toml",
        "cuslice install --engine containerd",
    );
    // The fix it names (with --root: the scratch system) makes it healthy.
    node.cuslice_install("install", "containerd");
    healthy(&node);

    // Docker's daemon.json edited by hand to run another binary under cuslice's name.
    let daemon = node.path("/etc/docker/daemon.json");
    let before = fs::read_to_string(&daemon).unwrap();
    fs::write(
        &daemon,
        before.replace("/usr/local/bin/cuslice-runtime", "/opt/old/cuslice-runtime"),
    )
    .unwrap();
    one_problem(
        &node,
        &format!(
            "PROBLEM engine docker: install would refuse: {}: runtimes.cuslice already points \
             to /opt/old/cuslice-runtime",
            daemon.display()
        ),
        "what the refusal says, then cuslice install --engine docker",
    );
    fs::write(&daemon, before).unwrap();
    healthy(&node);

    // A container whose init is gone, with its state still kept.
    let mut dead = Command::new("true").spawn().unwrap();
    let pid = dead.id() as i32;
    dead.wait().unwrap();
    let root = cuslice_state::host::Root::new(&node.state);
    fs::create_dir_all(root.dir("deadbeef0123456789")).unwrap();
    root.write_record(&cuslice_state::host::Record {
        id: "deadbeef0123456789".into(),
        pid,
        start: 1,
        rootfs: "/nonexistent".into(),
        name: None,
        kubernetes: None,
        created: Vec::new(),
        ledger_version: None,
        slurm: None,
    })
    .unwrap();
    let sweep = format!("cuslice-hook sweep --state-root {}", node.state.display());
    one_problem(
        &node,
        "PROBLEM stale state: 1 container whose init is gone still hold state (deadbeef0123)",
        &sweep,
    );
    let node_dir = node.dir.path().join("node");
    let out = Command::new(node.path("/usr/local/bin/cuslice-hook"))
        .args(["sweep", "--state-root"])
        .arg(&node.state)
        .arg("--node-dir")
        .arg(&node_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    healthy(&node);

    // Every engine uninstalled: nothing registered, nothing installed.
    node.cuslice_install("uninstall", ENGINES);
    let (code, lines) = node.lines();
    assert_eq!(code, 1, "{lines:#?}");
    let p = problems(&lines);
    assert_eq!(p.len(), 2, "{lines:#?}");
    assert!(
        p[0].starts_with("PROBLEM engines: cuslice is registered with no container engine"),
        "{lines:#?}"
    );
    assert!(
        p[1].starts_with("PROBLEM files: cuslice is not installed (none of /usr/local/bin/"),
        "{lines:#?}"
    );
    node.cuslice_install("install", ENGINES);
    healthy(&node);

    // A throwaway container through runc with the installed hook (root only).
    if cuslice_test_harness::is_root() {
        let ok = "ok      container test (runc): the library loaded in a container with \
                  CUSLICE_MEMORY_LIMIT=1GiB and the container sees a 1 GiB device";
        let (code, out) = node.doctor(&["--container-test", "runc"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(code, 0, "{}", text(&out));
        assert!(stdout.lines().any(|l| l == ok), "{}", text(&out));
        // Its state is gone with it (poststop ran).
        healthy(&node);
        // A hook that does nothing: the container sees the whole device.
        let hook = node.path("/usr/local/bin/cuslice-hook");
        let saved = node.dir.path().join("cuslice-hook.saved");
        fs::rename(&hook, &saved).unwrap();
        fs::write(&hook, "#!/bin/sh\nexit 0\n").unwrap();
        fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).unwrap();
        let (code, out) = node.doctor(&["--container-test", "runc"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(code, 1, "{}", text(&out));
        assert!(
            stdout.lines().any(|l| l.starts_with(
                "PROBLEM container test (runc): with CUSLICE_MEMORY_LIMIT=1GiB the container \
                 sees a device of 17179869184 bytes"
            )),
            "{}",
            text(&out)
        );
        fs::rename(&saved, &hook).unwrap();
    } else {
        println!("NOT RUN: doctor --container-test runc (needs root)");
    }

    // The agent killed (its socket stays behind, and nobody answers on it).
    let _ = agent.kill();
    let _ = agent.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if node.lines().0 == 1 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    one_problem(
        &node,
        &format!("PROBLEM agent: no cuslice agent at {}", socket.display()),
        "run `cuslice agent --enforce stop` as root (at boot, with the init system you use)",
    );
    // Started again, it is found again.
    let mut agent = node.agent();
    healthy(&node);
    let _ = agent.kill();
    let _ = agent.wait();
}

/// One line per GPU on how compute limits are metered there (by turns, whatever the driver
/// gives), and, as the driver answers `nvmlDeviceGetProcessUtilization`, what the node agent
/// checks slices by: its per-process samples, or, where it answers NOT_SUPPORTED (MIG instances,
/// some virtual GPUs; `simgpu init --no-process-samples`), the device's busy time alone.
/// Information either way, never a problem.
#[test]
fn doctor_says_how_compute_limits_are_metered_on_each_gpu() {
    for (init, status, says) in [
        (
            &["--devices", "2"][..],
            "ok",
            "the driver gives per-process utilisation samples",
        ),
        (
            &["--devices", "2", "--no-process-samples"][..],
            "note",
            "the driver gives no per-process utilisation samples \
             (nvmlDeviceGetProcessUtilization answers NOT_SUPPORTED",
        ),
    ] {
        let node = Node::on(init);
        let (_, lines) = node.lines();
        let word = if status == "ok" {
            "ok      "
        } else {
            "note    "
        };
        for gpu in 0..2 {
            let want = format!("{word}gpu {gpu} meter: SimGPU (simulated): turns (");
            let found: Vec<&String> = lines
                .iter()
                .filter(|l| l.contains(&format!("gpu {gpu} meter: ")))
                .collect();
            assert_eq!(found.len(), 1, "{init:?}: {lines:#?}");
            assert!(found[0].starts_with(&want), "{init:?}: {want}\n{lines:#?}");
            assert!(found[0].contains(says), "{init:?}: {says}\n{lines:#?}");
        }

        let (_, out) = node.doctor(&["--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).expect("doctor --json");
        let items: Vec<&Value> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["check"].as_str().is_some_and(|c| c.ends_with(" meter")))
            .collect();
        assert_eq!(items.len(), 2, "{init:?}: {v:#}");
        for i in items {
            assert_eq!(i["status"], status, "{init:?}: {i}");
            assert!(
                i["detail"].as_str().unwrap().contains(says),
                "{init:?}: {i}"
            );
        }
    }
}

/// On a machine with no GPU driver at all (this one, outside the simulator: no
/// libnvidia-ml.so.1 to load), the doctor says so in one line and reads nothing else of a GPU.
#[test]
fn without_a_gpu_driver_the_doctor_says_so_in_one_line() {
    let nvml_here = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"]
        .iter()
        .any(|d| Path::new(d).join("libnvidia-ml.so.1").exists());
    if nvml_here {
        eprintln!("skipped: this machine has an NVIDIA driver (libnvidia-ml.so.1)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin_dir().join("cuslice"))
        .args(["doctor", "--root"])
        .arg(dir.path())
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("SIMGPU_STATE")
        .output()
        .unwrap();
    let text = text(&out);
    let gpu: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" nvml: ") || l.contains(" gpu"))
        .collect();
    assert_eq!(gpu.len(), 1, "{text}");
    assert!(
        gpu[0].starts_with("note    nvml: no NVML (")
            && gpu[0].contains("no GPU driver on this node, so nothing to slice here"),
        "{text}"
    );
}
