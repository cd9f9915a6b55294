//! What the client tests share. The tests run programs nobody here wrote, as their users run
//! them, on simgpu with and without cuslice: `cuda_client.py` (NVIDIA's Python bindings,
//! `tests/clients.rs`), a C program against NVIDIA's libcudart (`tests/cudart.rs`), CuPy
//! (`tests/cupy.rs`) and PyTorch (`tests/torch.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cuslice_test_harness::{MIB, Sim, libcuslice, parse_lines, u};
use serde_json::Value;

/// A slice: its state folder and the environment its processes get.
pub struct Slice {
    pub dir: tempfile::TempDir,
    pub env: Vec<(String, String)>,
}

impl Slice {
    pub fn new(env: &[(&str, &str)]) -> Slice {
        let dir = tempfile::tempdir().unwrap();
        let mut env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.push(("CUSLICE_STATE_DIR".into(), dir.path().display().to_string()));
        Slice { dir, env }
    }

    /// A slice capped at 1 GiB.
    pub fn capped() -> Slice {
        Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")])
    }
}

/// `program args` on `sim`, inside `slice` (libcuslice.so preloaded, the slice's environment)
/// or outside.
pub fn command(sim: &Sim, program: &Path, slice: Option<&Slice>, args: &[&str]) -> Command {
    let mut c = sim.command(program, args);
    if let Some(s) = slice {
        c.env("LD_PRELOAD", libcuslice());
        for (k, v) in &s.env {
            c.env(k, v);
        }
    }
    c
}

/// Runs `cmd` to completion and returns the JSON lines it printed; panics (with its output)
/// unless it exits 0.
pub fn run_to_end(cmd: &mut Command, what: &str) -> Vec<Value> {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} exited {:?}; stdout: {stdout}; stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    parse_lines(&stdout)
}

/// A process's entry, live or exited, on device 0.
pub fn process(sim: &Sim, pid: u64) -> Value {
    let d = sim.device(0);
    ["processes", "exited"]
        .iter()
        .flat_map(|k| d[*k].as_array().cloned().unwrap_or_default())
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} was never on the device: {d}"))
}

pub fn mib(b: u64) -> f64 {
    b as f64 / MIB as f64
}

/// Each process's share of device 0 (percent) over the next `window`, by the simulator's count
/// of its device time.
pub fn device_shares(sim: &Sim, pids: &[u64], window: Duration) -> Vec<f64> {
    let times = || -> (Instant, Vec<u64>) {
        let t = Instant::now();
        let d = pids
            .iter()
            .map(|p| u(&process(sim, *p)["device_time_ns"]))
            .collect();
        (t, d)
    };
    let (t0, a) = times();
    std::thread::sleep(window);
    let (t1, b) = times();
    let span = (t1 - t0).as_nanos() as f64;
    a.iter()
        .zip(&b)
        .map(|(a, b)| 100.0 * (b - a) as f64 / span)
        .collect()
}

/// Where `tests/frameworks/install` put the framework environments: `$CUSLICE_FRAMEWORKS`, else
/// `target/frameworks` of this workspace.
pub fn frameworks_dir() -> PathBuf {
    match std::env::var_os("CUSLICE_FRAMEWORKS") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/frameworks"),
    }
}

/// The python of framework environment `venv` (`cu12`, `cu13`) if it can import `module`;
/// otherwise why not, in one line that names the installer.
pub fn framework_python(venv: &str, module: &str) -> Result<PathBuf, String> {
    let python = frameworks_dir().join(venv).join("bin/python");
    if !python.exists() {
        return Err(format!(
            "no {} (run tests/frameworks/install)",
            python.display()
        ));
    }
    let out = Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .output()
        .map_err(|e| format!("{}: {e} (run tests/frameworks/install)", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} cannot import {module}: {} (run tests/frameworks/install)",
            python.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    Ok(python)
}

/// [`framework_python`], or None after one skip line; under `CI` a missing environment fails.
pub fn framework_python_or_skip(venv: &str, module: &str) -> Option<PathBuf> {
    match framework_python(venv, module) {
        Ok(p) => Some(p),
        Err(why) => {
            assert!(std::env::var_os("CI").is_none(), "{why}");
            eprintln!("skipped: {why}");
            None
        }
    }
}
