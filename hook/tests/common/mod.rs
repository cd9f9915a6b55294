//! End-to-end scenarios shared by every engine's test (runc, containerd, Docker, Podman): real
//! containers run the test workload against simgpu (its libcuda.so.1 and libnvidia-ml.so.1
//! mounted where the NVIDIA toolkit mounts the real ones, its state file shared), with cuslice
//! registered the way that engine takes it. Ground truth comes from the simulator (what each
//! process held, by host pid) and from the engine (exit status, error output).
//!
//! Needs root and the engines installed (`tests/ensure-tools` installs them on Debian).

#![allow(dead_code)]

pub mod cdi;
pub mod containerd;
pub mod hostile;
pub mod podman;
pub mod preload;
pub mod runc;
pub mod shares;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use cuslice_test_harness::Stderr;
use cuslice_test_harness::{GIB, MIB, Sim, bin_dir, parse_lines};
use serde_json::Value;

pub const STATE_ROOT: &str = "/run/cuslice";

/// What a test asks an engine to run.
pub struct Spec<'a> {
    pub name: &'a str,
    pub env: &'a [&'a str],
    pub cmd: &'a [&'a str],
    pub read_only: bool,
}

pub trait Engine {
    /// Runs a container to completion; its output (stdout, and stderr with the engine's errors).
    fn run(&self, sim: &Sim, spec: &Spec<'_>) -> Output;
    /// Starts a container in the background; its stdout piped.
    fn spawn(&self, sim: &Sim, spec: &Spec<'_>) -> Box<dyn Container + '_>;
}

pub trait Container {
    /// The container's init process, as the host sees it.
    fn host_pid(&self) -> i32;
    fn id(&self) -> String;
    fn stdout(&mut self) -> &mut BufReader<std::process::ChildStdout>;
    /// What the engine and the container's processes have written to stderr so far.
    fn stderr(&self) -> String;
    /// Stops and removes the container the engine's usual way (poststop runs).
    fn remove(self: Box<Self>);
}

pub fn root_required() {
    cuslice_test_harness::require_root("these tests start real container engines");
}

/// A unique name for a container of this test run.
pub fn name(what: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "cuslice-{what}-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// A minimal glibc root filesystem: busybox, the test workload and the libraries they need.
/// No /etc and no /run: the hook has to make its mount points (and remove them afterwards).
pub fn make_rootfs(dir: &Path) {
    let run = |c: &mut Command| {
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{c:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for d in [
        "bin",
        "lib/x86_64-linux-gnu",
        "lib64",
        "usr/lib/x86_64-linux-gnu",
        "proc",
        "sys",
        "dev",
        "tmp",
    ] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    run(Command::new("cp")
        .arg(busybox())
        .arg(dir.join("bin/busybox")));
    for tool in [
        "sh", "cat", "echo", "ls", "env", "sleep", "test", "grep", "umount", "mount", "true",
    ] {
        std::os::unix::fs::symlink("busybox", dir.join("bin").join(tool)).unwrap();
    }
    run(Command::new("cp")
        .arg(bin_dir().join("cuda-workload"))
        .arg(dir.join("bin/")));
    for lib in ["libc.so.6", "libgcc_s.so.1", "libm.so.6"] {
        run(Command::new("cp")
            .arg(Path::new("/lib/x86_64-linux-gnu").join(lib))
            .arg(dir.join("lib/x86_64-linux-gnu/")));
    }
    run(Command::new("cp")
        .arg("/lib64/ld-linux-x86-64.so.2")
        .arg(dir.join("lib64/")));
    // Also where a Debian image has it, and where a second link map (an audit module's) finds
    // it by name.
    run(Command::new("cp")
        .arg("/lib64/ld-linux-x86-64.so.2")
        .arg(dir.join("lib/x86_64-linux-gnu/")));
    run(Command::new("cp")
        .arg(drop_preload())
        .arg(dir.join("lib/drop-preload.so")));
}

/// tests/data/drop-preload.c built (once per test binary): an LD_AUDIT module with which a
/// process keeps /etc/ld.so.preload's cuslice from loading; in every test rootfs at
/// /lib/drop-preload.so.
fn drop_preload() -> &'static Path {
    static SO: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &SO.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let so = dir.path().join("drop-preload.so");
        let src = bin_dir().join("../../tests/data/drop-preload.c");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&so)
            .arg(&src)
            .output()
            .expect("cc is missing: apt-get install gcc (tests/ensure-tools does)");
        assert!(
            out.status.success(),
            "cc {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        (dir, so)
    })
    .1
}

fn busybox() -> &'static str {
    for p in ["/bin/busybox", "/usr/bin/busybox"] {
        if Path::new(p).exists() {
            return p;
        }
    }
    panic!("busybox is missing: apt-get install busybox-static (tests/ensure-tools does)")
}

/// A rootfs tarball for engines that import images (docker import, podman import).
pub fn rootfs_tar() -> &'static Path {
    static TAR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &TAR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        make_rootfs(&dir.path().join("rootfs"));
        let tar = dir.path().join("rootfs.tar");
        let out = Command::new("tar")
            .arg("-C")
            .arg(dir.path().join("rootfs"))
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .output()
            .unwrap();
        assert!(out.status.success());
        (dir, tar)
    })
    .1
}

/// Bind mounts that stand in for the NVIDIA container toolkit: simgpu's libraries where the real
/// driver's go, and the simulator's state file. (source, destination, writable)
pub fn gpu_mounts(sim: &Sim) -> Vec<(PathBuf, &'static str, bool)> {
    vec![
        (
            bin_dir().join("libsimgpu_cuda.so"),
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            false,
        ),
        (
            bin_dir().join("libsimgpu_nvml.so"),
            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            false,
        ),
    ]
    .into_iter()
    .chain(sim_state_mount(sim))
    .collect()
}

pub const GPU_ENV: &str = "SIMGPU_STATE=/run/simgpu/state";

/// Of [`gpu_mounts`], the simulator's state file and its device memory only: with CDI, the
/// libraries come from the claim's spec and these stand in for the GPU itself (managed memory is
/// mapped from the memory file, as a real driver maps it through its device nodes).
pub fn sim_state_mount(sim: &Sim) -> Vec<(PathBuf, &'static str, bool)> {
    vec![
        (sim.state.clone(), "/run/simgpu/state", true),
        (sim.memory_file(), "/run/simgpu/state.mem", true),
    ]
}

pub fn all_env<'a>(spec: &Spec<'a>) -> Vec<&'a str> {
    let mut v = vec![GPU_ENV, "PATH=/bin"];
    v.extend_from_slice(spec.env);
    v
}

/// Reads the container's JSON lines until one whose event is `event`.
pub fn wait_for(c: &mut dyn Container, event: &str) -> Value {
    lines_until(c, event).1
}

/// Reads the container's output until a JSON line whose event is `event`; the lines before it too.
pub fn lines_until(c: &mut dyn Container, event: &str) -> (Vec<String>, Value) {
    let start = Instant::now();
    let mut before = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        let n = c.stdout().read_line(&mut line).unwrap();
        assert!(
            n > 0,
            "the container ended before printing {event:?}; it printed {before:?}"
        );
        if let Ok(v) = serde_json::from_str::<Value>(&line)
            && v["event"] == event
        {
            return (before, v);
        }
        before.push(line.trim_end().to_string());
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no {event:?} in 60 s"
        );
    }
}

/// What the simulator says the process `host_pid` holds on device 0 and held at most.
pub fn held_by(sim: &Sim, host_pid: i32) -> (u64, u64) {
    let dev = sim.device(0);
    let p = dev["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == host_pid)
        .unwrap_or_else(|| panic!("simgpu lists no process {host_pid}: {dev}"));
    (p["held"].as_u64().unwrap(), p["peak"].as_u64().unwrap())
}

pub fn slice_dir(id: &str) -> PathBuf {
    Path::new(STATE_ROOT).join("containers").join(id)
}

const FILL: &[&str] = &[
    "cuda-workload",
    "fill",
    "--family",
    "mem",
    "--chunk",
    "64MiB",
    "--hold",
    "60",
];

/// The shared scenarios as `#[test]`s of the calling engine's test binary.
#[macro_export]
macro_rules! engine_scenarios {
    ($engine:expr) => {
        #[test]
        fn held_to_its_cap() {
            $crate::common::root_required();
            $crate::common::held_to_cap($engine);
        }
        #[test]
        fn two_containers_two_caps() {
            $crate::common::root_required();
            $crate::common::two_caps($engine);
        }
        #[test]
        fn bad_value_stops_the_container() {
            $crate::common::root_required();
            $crate::common::bad_value($engine);
        }
        #[test]
        fn container_without_settings_is_untouched() {
            $crate::common::root_required();
            $crate::common::untouched($engine);
        }
        #[test]
        fn limits_cannot_be_lifted_from_inside() {
            $crate::common::root_required();
            $crate::common::cannot_lift($engine);
        }
        #[test]
        fn state_gone_after_stop_and_sigkill() {
            $crate::common::root_required();
            $crate::common::state_gone($engine);
        }
        #[test]
        fn status_shows_the_container() {
            $crate::common::root_required();
            $crate::common::status_shows($engine);
        }
        #[test]
        fn the_agent_tells_container_processes_their_host_pids() {
            $crate::common::root_required();
            $crate::common::agent_tells_host_pids($engine);
        }
        #[test]
        fn without_the_agent_the_container_runs_with_one_warning() {
            $crate::common::root_required();
            $crate::common::without_agent($engine);
        }
    };
}

// ---- the scenarios ----------------------------------------------------------------------

/// A container with CUSLICE_MEMORY_LIMIT=1GiB sees a 1 GiB device and is refused past it; the
/// simulator confirms it never held more.
pub fn held_to_cap(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("cap");
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: FILL,
            read_only: false,
        },
    );
    let start = wait_for(&mut *c, "start");
    assert_eq!(
        start["total"], GIB,
        "the device as the container sees it: {start}"
    );
    let refused = wait_for(&mut *c, "refused");
    assert_eq!(refused["code"], 2, "{refused}");
    wait_for(&mut *c, "holding");
    let (used, peak) = held_by(&sim, c.host_pid());
    assert!(
        peak <= GIB && used <= GIB,
        "held {used}, peak {peak} > 1 GiB"
    );
    assert!(
        used >= GIB - 128 * MIB,
        "refused while 128 MiB more fitted: held {used}"
    );
    assert!(slice_dir(&c.id()).join("mnt/slice/ledger").exists());
    c.remove();
}

/// Two containers on one device, caps 1 GiB and 2 GiB, filling at the same time.
pub fn two_caps(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let (n1, n2) = (name("one"), name("two"));
    let mut a = engine.spawn(
        &sim,
        &Spec {
            name: &n1,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: FILL,
            read_only: false,
        },
    );
    let mut b = engine.spawn(
        &sim,
        &Spec {
            name: &n2,
            env: &["CUSLICE_MEMORY_LIMIT=2GiB"],
            cmd: FILL,
            read_only: false,
        },
    );
    wait_for(&mut *a, "holding");
    wait_for(&mut *b, "holding");
    let (ua, pa) = held_by(&sim, a.host_pid());
    let (ub, pb) = held_by(&sim, b.host_pid());
    assert!(
        pa <= GIB && ua >= GIB - 128 * MIB,
        "first: held {ua}, peak {pa}"
    );
    assert!(
        pb <= 2 * GIB && ub >= 2 * GIB - 128 * MIB,
        "second: held {ub}, peak {pb}"
    );
    a.remove();
    b.remove();
}

/// `CUSLICE_MEMORY_LIMIT=12XB` stops the container; the engine's output names the variable.
pub fn bad_value(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("bad");
    let out = engine.run(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=12XB"],
            cmd: &["echo", "STARTED"],
            read_only: false,
        },
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "started anyway: {all}");
    assert!(!all.contains("STARTED"), "{all}");
    assert!(
        all.contains("CUSLICE_MEMORY_LIMIT=\\\"12XB\\\"")
            || all.contains("CUSLICE_MEMORY_LIMIT=\"12XB\""),
        "the engine's output does not name the variable and value: {all}"
    );
    assert!(
        all.contains("CUSLICE_MEMORY_LIMIT=4GiB"),
        "no example in: {all}"
    );
    assert!(!slice_dir(&n).exists(), "state left behind");
}

/// A cap no device holds (2^64-1 bytes, which would be no cap at all) and a 100 kB value are
/// refused in one line naming the variable, the value (cut short) and what would work.
pub fn too_large_or_too_long(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let digits = "9".repeat(100_000);
    let long = format!("CUSLICE_MEMORY_LIMIT={digits}XB");
    let cut = format!(
        "CUSLICE_MEMORY_LIMIT=\"{}\"… ({} bytes)",
        &digits[..64],
        digits.len() + 2
    );
    let cases: [(&str, [&str; 2]); 2] = [
        (
            "CUSLICE_MEMORY_LIMIT=18446744073709551615",
            [
                "CUSLICE_MEMORY_LIMIT=\"18446744073709551615\" is too large",
                "at most 1 PiB",
            ],
        ),
        (&long, [&cut, "CUSLICE_MEMORY_LIMIT=4GiB"]),
    ];
    for (env, says) in cases {
        let n = name("bad");
        let out = engine.run(
            &sim,
            &Spec {
                name: &n,
                env: &[env],
                cmd: &["echo", "STARTED"],
                read_only: false,
            },
        );
        // runc's log line escapes the quotes of the hook's message.
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .replace("\\\"", "\"");
        let shown = &all[..all.len().min(2000)];
        assert!(!out.status.success(), "started anyway: {shown}");
        assert!(!all.contains("STARTED"), "{shown}");
        assert!(
            all.len() < 4000,
            "the engine's output is {} bytes: {shown}",
            all.len()
        );
        for s in says {
            assert!(all.contains(s), "{shown} does not say {s:?}");
        }
        assert!(!slice_dir(&n).exists(), "state left behind");
    }
}

/// A container without cuslice settings: no preload, no slice, full device.
pub fn untouched(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("plain");
    let out = engine.run(
        &sim,
        &Spec {
            name: &n,
            env: &[],
            cmd: &[
                "sh",
                "-c",
                "cat /etc/ld.so.preload 2>&1; ls /run/cuslice 2>&1; cuda-workload info",
            ],
            read_only: false,
        },
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("libcuslice"), "{text}");
    assert!(
        text.contains("ld.so.preload': No such file")
            || text.contains("ld.so.preload: No such file"),
        "the container has an /etc/ld.so.preload: {text}"
    );
    assert!(
        text.contains("/run/cuslice: No such file"),
        "the container has /run/cuslice: {text}"
    );
    let lines = parse_lines(&text);
    assert_eq!(lines[0]["total"], 8 * GIB, "{text}");
}

/// Inside, a process that unsets LD_PRELOAD and sets its own CUSLICE_* is still capped, and the
/// mounted files cannot be edited or unmounted. Also with a read-only rootfs.
pub fn cannot_lift(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("lift");
    let script = "echo CUSLICE_MEMORY_LIMIT=64GiB > /run/cuslice/slice/config && echo EDITED-CONFIG; \
                  echo > /etc/ld.so.preload && echo EDITED-PRELOAD; \
                  umount /etc/ld.so.preload 2>/dev/null && echo UNMOUNTED; \
                  rm -f /run/cuslice/slice/ledger && echo REMOVED-LEDGER; \
                  touch /run/cuslice/slice/extra 2>/dev/null && echo EDITED-SLICE; \
                  touch /run/cuslice/shared-by-all 2>/dev/null && echo EDITED-SKELETON; \
                  unset LD_PRELOAD; exec env -u LD_PRELOAD CUSLICE_MEMORY_LIMIT=64GiB CUDA_DEVICE_MEMORY_LIMIT=64g \
                  cuda-workload fill --family mem --chunk 64MiB --hold 60";
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &["sh", "-c", script],
            read_only: true,
        },
    );
    let (said, start) = lines_until(&mut *c, "start");
    assert_eq!(start["total"], GIB, "{start}");
    for done in [
        "EDITED-CONFIG",
        "EDITED-PRELOAD",
        "UNMOUNTED",
        "REMOVED-LEDGER",
        "EDITED-SLICE",
        "EDITED-SKELETON",
    ] {
        assert!(!said.iter().any(|l| l == done), "{done}: {said:?}");
    }
    wait_for(&mut *c, "holding");
    let (used, peak) = held_by(&sim, c.host_pid());
    assert!(peak <= GIB, "peak {peak} > 1 GiB");
    assert!(used >= GIB - 128 * MIB, "held {used}");
    // /run/cuslice is the node's one skeleton of mount points, shared by every container: no
    // container can add to it.
    assert!(!Path::new(STATE_ROOT).join("skel/shared-by-all").exists());
    // Refused by the kernel, as the shell in the container says.
    for file in ["/run/cuslice/slice/config", "/etc/ld.so.preload"] {
        let want = format!("can't create {file}: Read-only file system");
        poll(&want, || c.stderr().contains(&want).then_some(()));
    }
    c.remove();
}

/// The slice's state goes when the container is removed, and when its process is killed with
/// SIGKILL (the engine's poststop, or else the next hook's sweep).
pub fn state_gone(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("gone");
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: FILL,
            read_only: false,
        },
    );
    wait_for(&mut *c, "holding");
    let id = c.id();
    assert!(slice_dir(&id).exists());
    c.remove();
    assert!(
        !slice_dir(&id).exists(),
        "state left after the container was removed"
    );

    let n = name("killed");
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: FILL,
            read_only: false,
        },
    );
    wait_for(&mut *c, "holding");
    let id = c.id();
    let pid = c.host_pid();
    assert!(slice_dir(&id).exists());
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).output();
    // Whatever the engine does after its process dies, the state is gone once the next
    // container starts (every hook sweeps) or the operator sweeps.
    let deadline = Instant::now() + Duration::from_secs(20);
    while slice_dir(&id).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if slice_dir(&id).exists() {
        let out = Command::new(bin_dir().join("cuslice-hook"))
            .arg("sweep")
            .output()
            .unwrap();
        assert!(out.status.success());
    }
    assert!(!slice_dir(&id).exists(), "state left after SIGKILL");
    c.remove();
}

/// `cuslice status --json` on the host lists the container's slice by its id, with its cap and
/// core limit, its two processes by host pid (the engine's pid for its init) and what each
/// holds as the simulator says; and no longer lists it once the container is removed.
pub fn status_shows(engine: &dyn Engine) {
    // What this checks is a node without the agent: status is what tells the host pids.
    let _turn = agent_turn();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("status");
    let script = "cuda-workload hold --bytes 256MiB --secs 60 & \
                  exec cuda-workload launch --ns-per-block 1000 --blocks 1000 --secs 60";
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_CORE_LIMIT=40"],
            cmd: &["sh", "-c", script],
            read_only: false,
        },
    );
    let mut seen = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                c.stdout().read_line(&mut line).unwrap() > 0,
                "ended: {seen:?}"
            );
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v["event"] == "holding" || v["event"] == "start" && v["scenario"] == "launch" {
                seen.push(v);
                break;
            }
        }
    }
    std::thread::sleep(Duration::from_millis(1500));
    let id = c.id();
    let status = || status_json(&sim);
    let find = |view: &Value| slice_in(view, &id);
    let view = status();
    let truth = sim.device(0);
    let slice = find(&view);
    assert_eq!(view["devices"][0]["uuid"], truth["uuid"]);
    assert_eq!(slice["kind"], "container");
    assert_eq!(slice["memory"]["limit"], GIB, "{slice}");
    assert_eq!(slice["compute"]["limit_pct"], 40.0, "{slice}");
    let procs = slice["processes"].as_array().unwrap().clone();
    assert_eq!(procs.len(), 2, "{slice}");
    let init = procs
        .iter()
        .find(|p| p["container_pid"] == 1)
        .unwrap_or_else(|| panic!("no container pid 1 in {slice}"));
    assert_eq!(init["pid"], c.host_pid(), "{slice}");
    let mut total = 0;
    for p in &procs {
        let pid = p["pid"].as_i64().unwrap() as i32;
        let (held, _) = held_by(&sim, pid);
        assert_eq!(
            p["memory"].as_u64().unwrap(),
            held,
            "process {pid}: {slice}"
        );
        total += held;
    }
    assert_eq!(slice["memory"]["used"].as_u64().unwrap(), total, "{slice}");
    // The simulator's device time for the container's processes, against status's.
    let device_time_matches = |slice: &Value, truth: &Value, when: &str| {
        let device_time: f64 = truth["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| procs.iter().any(|q| q["pid"] == p["pid"]))
            .map(|p| p["device_time_ns"].as_u64().unwrap() as f64 / 1e9)
            .sum();
        let seen = slice["compute"]["device_seconds"].as_f64().unwrap();
        assert!(
            (seen - device_time).abs() < 0.3,
            "device time {when}: status {seen} s, simulator {device_time} s"
        );
    };
    device_time_matches(&slice, &truth, "at first");
    // The simulator now names the container's processes by host pid, as a real driver always
    // does; told their host pids by status, their meters keep reading NVML (no estimates).
    std::thread::sleep(Duration::from_millis(2500));
    let slice = find(&status());
    let truth = sim.device(0);
    assert_eq!(slice["compute"]["estimated"], false, "{slice}");
    device_time_matches(&slice, &truth, "after");
    c.remove();
    let after = status();
    assert!(
        !after.to_string().contains(&id),
        "removed container still listed: {after}"
    );
}

// ---- the node agent ----------------------------------------------------------------------

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
/// (the simulator's count); its workload says once, at `CUSLICE_LOG=warn`, that the compute
/// meter uses launch estimates until the agent runs; `cuslice status` has a note saying so.
pub fn without_agent(engine: &dyn Engine) {
    let _turn = agent_turn();
    if cuslice_state::agent::ask(&agent_socket(), Duration::from_secs(1)).is_ok() {
        panic!(
            "a cuslice agent answers on {}: this scenario needs a node without one; stop it",
            agent_socket().display()
        );
    }
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
            && w.contains("compute meter uses launch estimates until the agent runs")
            && w.contains("`cuslice agent`"),
        "{w}"
    );
    let (used, peak) = held_by(&sim, c.host_pid());
    assert!(peak <= GIB, "held {used}, peak {peak} > 1 GiB");
    assert!(
        used >= GIB - 128 * MIB,
        "refused while 128 MiB more fitted: held {used}"
    );

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
        )) && notes[0].contains("compute meters of container slices use launch estimates")
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

// ---- helpers for engine implementations -------------------------------------------------

/// Starts `cmd` with stdout piped and stderr captured: what the engine and the container's
/// processes write there (refusals a scenario provokes on purpose) reaches the test's output only
/// when the test fails, and [`Container::stderr`] reads it.
pub fn spawn_piped(mut cmd: Command) -> (Child, BufReader<std::process::ChildStdout>, Stderr) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let out = BufReader::new(child.stdout.take().unwrap());
    let err = Stderr::capture(&mut child);
    (child, out, err)
}

pub fn hook() -> PathBuf {
    bin_dir().join("cuslice-hook")
}

// ---- helpers for engines with a daemon or shared state ----------------------------------

/// The path of an engine's program: `path` as given when it holds a '/', else found on PATH (and
/// the sbin directories root's PATH has). Fails, naming the Debian package, when it is missing.
pub fn tool(path: &str, package: &str) -> PathBuf {
    let found = if path.contains('/') {
        Some(PathBuf::from(path)).filter(|p| p.is_file())
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
            .map(|d| d.join(path))
            .find(|p| p.is_file())
    };
    found.unwrap_or_else(|| {
        panic!("{path} is missing: apt-get install {package} (tests/ensure-tools installs it)")
    })
}

/// Runs `f` when the test process exits. Statics are never dropped, so a daemon shared by the
/// tests of one binary is stopped here. Functions run last-registered first.
pub fn at_exit(f: fn()) {
    static FNS: std::sync::Mutex<Vec<fn()>> = std::sync::Mutex::new(Vec::new());
    static REGISTER: std::sync::Once = std::sync::Once::new();
    extern "C" fn run_all() {
        let fns = std::mem::take(&mut *FNS.lock().unwrap_or_else(|e| e.into_inner()));
        for f in fns.into_iter().rev() {
            // A panic must not unwind out of an extern "C" function.
            let _ = std::panic::catch_unwind(f);
        }
    }
    FNS.lock().unwrap_or_else(|e| e.into_inner()).push(f);
    REGISTER.call_once(|| {
        // SAFETY: `run_all` is an `extern "C" fn()` that lives as long as the program and never
        // unwinds; atexit only stores the pointer.
        let rc = unsafe { libc::atexit(run_all) };
        assert_eq!(rc, 0, "atexit failed");
    });
}

/// A fresh directory for an engine's state (kept: the caller removes it with [`remove_dir`]).
pub fn state_dir(what: &str) -> PathBuf {
    tempfile::Builder::new()
        .prefix(&format!("cuslice-{what}-"))
        .tempdir()
        .unwrap()
        .keep()
}

/// Unmounts whatever is still mounted under `dir` (deepest first), then removes it.
pub fn remove_dir(dir: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut under: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mountinfo(m)))
        .filter(|m| m.starts_with(dir))
        .collect();
    under.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    under.dedup();
    for m in under {
        let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// /proc/self/mountinfo writes space, tab, newline and backslash as \ooo.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An engine daemon started by the tests, with its state in its own directory.
pub struct Daemon {
    pub what: &'static str,
    pub dir: PathBuf,
    child: std::sync::Mutex<Option<Child>>,
}

impl Daemon {
    /// Starts `cmd` (its output goes to DIR/WHAT.log) and waits up to 60 s until `ready` holds.
    /// On failure it stops what it started, removes `dir` and fails with the daemon's log.
    pub fn start(
        what: &'static str,
        dir: PathBuf,
        mut cmd: Command,
        ready: impl Fn() -> bool,
    ) -> Daemon {
        let log = std::fs::File::create(dir.join(format!("{what}.log"))).unwrap();
        let child = match cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                remove_dir(&dir);
                panic!("{cmd:?}: {e}");
            }
        };
        let d = Daemon {
            what,
            dir,
            child: std::sync::Mutex::new(Some(child)),
        };
        let start = Instant::now();
        loop {
            if ready() {
                return d;
            }
            let exited = d
                .child
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || start.elapsed() > Duration::from_secs(60) {
                let log = d.log();
                d.stop();
                panic!(
                    "{what} did not start ({}): {log}",
                    exited.map_or("not ready in 60 s".to_string(), |s| s.to_string())
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.log", self.what))).unwrap_or_default()
    }

    /// SIGTERM, then SIGKILL after 30 s; then unmounts what it left under its directory and
    /// removes it. Idempotent.
    pub fn stop(&self) {
        let Some(mut child) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let start = Instant::now();
        while child.try_wait().ok().flatten().is_none() {
            if start.elapsed() > Duration::from_secs(30) {
                eprintln!("{} did not stop in 30 s: killing it", self.what);
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        remove_dir(&self.dir);
    }
}

/// Waits up to 30 s for `f` to give a value.
pub fn poll<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    cuslice_test_harness::poll(what, 30, f)
}

/// Runs a command to completion; its stdout, or a failure naming the command and its stderr.
pub fn output_of(cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `cuslice install --engine ENGINE --prefix PREFIX --config CONFIG`, as a user registers
/// cuslice with an engine: it copies cuslice-hook, cuslice-runtime, cuslice, libcuslice.so and libcuslice_core.so from
/// target/release into PREFIX/bin and PREFIX/lib/cuslice and writes the engine's registration at
/// CONFIG. Returns what it printed. `--no-agent`: these run against the real root, where a
/// systemd host would get the agent's unit installed and started.
pub fn cuslice_install(engine: &str, prefix: &Path, config: &Path) -> String {
    let installer = bin_dir().join("cuslice");
    assert!(
        installer.is_file(),
        "{} is missing: run `cargo build --release --workspace` before the tests",
        installer.display()
    );
    let out = output_of(
        Command::new(&installer)
            .args(["install", "--no-agent", "--engine", engine, "--prefix"])
            .arg(prefix)
            .arg("--config")
            .arg(config),
    );
    for f in [
        "bin/cuslice-hook",
        "bin/cuslice-runtime",
        "lib/cuslice/libcuslice.so",
        "lib/cuslice/libcuslice_core.so",
    ] {
        assert!(
            prefix.join(f).is_file(),
            "cuslice install did not install PREFIX/{f}: {out}"
        );
    }
    assert!(
        config.exists(),
        "cuslice install wrote no {}: {out}",
        config.display()
    );
    out
}

/// Of `paths` (files or directories an engine makes outside its state directory, e.g.
/// /run/containerd/s), those that do not exist yet: the ones to remove with [`remove_new`].
pub fn new_paths(paths: &[&str]) -> Vec<PathBuf> {
    paths
        .iter()
        .map(PathBuf::from)
        .filter(|p| std::fs::symlink_metadata(p).is_err())
        .collect()
}

/// Removes what [`new_paths`] listed, last first: files, and directories if they are empty
/// (something else may have started using them meanwhile).
pub fn remove_new(paths: &[PathBuf]) {
    for p in paths.iter().rev() {
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => {
                let _ = std::fs::remove_dir(p);
            }
            Ok(_) => {
                let _ = std::fs::remove_file(p);
            }
            Err(_) => {}
        }
    }
}

/// Runs `f`; if it panics, runs `undo` first (stops what a shared engine's setup had started),
/// then goes on panicking.
pub fn or_undo<T>(f: impl FnOnce() -> T, undo: impl FnOnce()) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(e) => {
            undo();
            std::panic::resume_unwind(e)
        }
    }
}

/// `cuslice status --json` under the simulator.
pub fn status_json(sim: &Sim) -> Value {
    let out = sim
        .command(&bin_dir().join("cuslice"), &["status", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Container `id`'s slice on device 0 in a `cuslice status --json` view.
pub fn slice_in(view: &Value, id: &str) -> Value {
    view["devices"][0]["slices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["slice"] == id)
        .unwrap_or_else(|| panic!("container {id} not in {view}"))
        .clone()
}
