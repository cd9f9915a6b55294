//! Real container engines under test: runc, containerd, Docker and Podman run the test workload
//! against simgpu (its libcuda.so.1 and libnvidia-ml.so.1 mounted where the NVIDIA toolkit mounts
//! the real ones, its state file shared), with cuslice registered the way each engine takes it.
//! One [`Engine`] trait, a module per engine and the scenarios they all run; ground truth comes
//! from the simulator (what each process held, by host pid) and from the engine (exit status,
//! error output). Used by the hook's, the agent's and the DRA plugin's tests.
//!
//! - this file: the [`Engine`] and [`Container`] traits, the simulated GPU in a container, and
//!   small helpers;
//! - [`rootfs`]: the minimal root filesystem every container runs;
//! - [`scenarios`]: the scenarios every engine runs ([`engine_scenarios!`] makes them `#[test]`s);
//! - [`agent`]: the node agent beside the engines, and its scenarios;
//! - [`daemon`]: engines with a daemon or shared state (start, stop, clean up);
//! - [`runc`], [`containerd`], [`podman`]: the engines shared by several test binaries (Docker's
//!   [`Engine`] is in the hook's Docker test, its one user; [`docker`] starts its dockerd);
//!   [`cdi`], [`nvidia`] (NVIDIA's container toolkit's CDI spec beside cuslice), [`preload`],
//!   [`shares`] and [`hostile`]: scenarios that need more of an engine than [`Engine`] gives.
//!
//! Needs root and the engines installed (`tests/tools/ensure-tools` installs them on Debian).

pub mod agent;
pub mod cdi;
pub mod containerd;
pub mod daemon;
pub mod docker;
pub mod hostile;
pub mod nvidia;
pub mod podman;
pub mod preload;
pub mod rootfs;
pub mod runc;
pub mod scenarios;
pub mod shares;
pub mod slurm;

pub use agent::*;
pub use daemon::*;
pub use rootfs::*;
pub use scenarios::*;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
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

/// Waits up to 30 s for `f` to give a value.
pub fn poll<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    cuslice_test_harness::poll(what, 30, f)
}

/// The body of one `GET /metrics` from `cuslice exporter` (of this build) over the state root
/// `root`: started on a free port, which its first line names, and stopped after.
pub fn scrape(sim: &Sim, root: &Path) -> String {
    cuslice_test_harness::scrape_exporter(sim.command(
        &bin_dir().join("cuslice"),
        &[
            "exporter",
            "--listen",
            "127.0.0.1:0",
            "--state-root",
            root.to_str().unwrap(),
        ],
    ))
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

/// `cuslice status --json` under the simulator.
pub fn status_json(sim: &Sim) -> Value {
    cuslice_test_harness::json_of(
        &mut sim.command(&bin_dir().join("cuslice"), &["status", "--json"]),
    )
}

/// The first view `cuslice top --json ARGS` prints under the simulator (then it is stopped).
pub fn top_json(sim: &Sim, args: &[&str]) -> Value {
    let mut all = vec!["top", "--json", "--interval", "0.2"];
    all.extend_from_slice(args);
    let mut top = sim
        .command(&bin_dir().join("cuslice"), &all)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(top.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let _ = top.kill();
    let _ = top.wait();
    serde_json::from_str(&first).unwrap_or_else(|e| panic!("cuslice top: {e}: {first:?}"))
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
