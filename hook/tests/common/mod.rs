//! End-to-end scenarios shared by every engine's test (runc, containerd, Docker, Podman): real
//! containers run the test workload against simgpu (its libcuda.so.1 and libnvidia-ml.so.1
//! mounted where the NVIDIA toolkit mounts the real ones, its state file shared), with cuslice
//! registered the way that engine takes it. Ground truth comes from the simulator (what each
//! process held, by host pid) and from the engine (exit status, error output).
//!
//! Needs root and the engines installed (`tests/ensure-tools` installs them on Debian).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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
    /// Stops and removes the container the engine's usual way (poststop runs).
    fn remove(self: Box<Self>);
}

pub fn root_required() {
    assert!(
        nix_is_root(),
        "these tests start real container engines and need root (tests/run is run as root)"
    );
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
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
        (sim.state.clone(), "/run/simgpu/state", true),
    ]
}

pub const GPU_ENV: &str = "SIMGPU_STATE=/run/simgpu/state";

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
    ] {
        assert!(!said.iter().any(|l| l == done), "{done}: {said:?}");
    }
    wait_for(&mut *c, "holding");
    let (used, peak) = held_by(&sim, c.host_pid());
    assert!(peak <= GIB, "peak {peak} > 1 GiB");
    assert!(used >= GIB - 128 * MIB, "held {used}");
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
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
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

// ---- helpers for engine implementations -------------------------------------------------

pub fn spawn_piped(mut cmd: Command) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

pub fn hook() -> PathBuf {
    bin_dir().join("cuslice-hook")
}
