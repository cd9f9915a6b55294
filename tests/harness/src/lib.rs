//! Helpers for tests that run real processes against the simulated driver (simgpu's own tests
//! and the interposer's). They need the release build of the whole workspace
//! (`cargo build --release --workspace`), which `tests/run` does first.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const MIB: u64 = 1 << 20;

/// Tests that measure shares of time take turns, so a loaded machine does not skew them.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
pub const GIB: u64 = 1 << 30;

/// target/release, where the simulated libraries and the workload are built.
pub fn bin_dir() -> PathBuf {
    // A test binary runs from target/<profile>/deps/.
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    for f in [
        "simgpu",
        "libcuslice.so",
        "libsimgpu_cuda.so",
        "libsimgpu_nvml.so",
        "cuda-workload",
        "cuda-workload-linked",
    ] {
        assert!(
            dir.join(f).exists(),
            "{} is missing: run `cargo build --release --workspace` before the tests (tests/run does)",
            dir.join(f).display()
        );
    }
    dir
}

pub fn simgpu() -> PathBuf {
    bin_dir().join("simgpu")
}

/// The interposer library under test.
pub fn libcuslice() -> PathBuf {
    bin_dir().join("libcuslice.so")
}

pub fn workload() -> PathBuf {
    bin_dir().join("cuda-workload")
}

pub fn data_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../data")
        .join(name)
}

/// A simulated machine in a temporary folder.
pub struct Sim {
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
}

impl Sim {
    pub fn new(args: &[&str]) -> Sim {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let out = Command::new(simgpu())
            .arg("init")
            .arg("--state")
            .arg(&state)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "simgpu init failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Sim { dir, state }
    }

    /// A command that runs `program args` under `simgpu run --state`.
    pub fn command(&self, program: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(simgpu());
        c.arg("run")
            .arg("--state")
            .arg(&self.state)
            .arg("--")
            .arg(program)
            .args(args);
        c
    }

    /// Runs the workload to completion; returns its JSON lines and exit code.
    pub fn workload(&self, args: &[&str]) -> (Vec<Value>, i32) {
        let out = self.command(&workload(), args).output().unwrap();
        let lines = parse_lines(&String::from_utf8_lossy(&out.stdout));
        if !out.status.success() {
            eprintln!(
                "workload {args:?} exited {:?}; stderr: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        (lines, out.status.code().unwrap_or(-1))
    }

    /// Starts the workload in the background with piped stdout/stdin.
    pub fn spawn(&self, args: &[&str]) -> Running {
        let mut child = self
            .command(&workload(), args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Running { child, out }
    }

    pub fn show(&self) -> Value {
        let out = Command::new(simgpu())
            .args(["show", "--json", "--state"])
            .arg(&self.state)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "simgpu show failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn device(&self, i: usize) -> Value {
        self.show()["devices"][i].clone()
    }
}

pub struct Running {
    pub child: Child,
    pub out: BufReader<std::process::ChildStdout>,
}

impl Running {
    /// Reads JSON lines until one with `"event": event` (panics after `timeout`).
    pub fn wait_for(&mut self, event: &str, timeout: Duration) -> Value {
        let start = Instant::now();
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "workload ended before printing {event:?}");
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && v["event"] == event
            {
                return v;
            }
            assert!(start.elapsed() < timeout, "no {event:?} within {timeout:?}");
        }
    }

    /// Closes stdin (a `hold` scenario then frees and exits) and waits.
    pub fn release(mut self) -> i32 {
        drop(self.child.stdin.take());
        self.child.wait().unwrap().code().unwrap_or(-1)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn parse_lines(s: &str) -> Vec<Value> {
    s.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

pub fn event<'a>(lines: &'a [Value], name: &str) -> &'a Value {
    lines
        .iter()
        .find(|v| v["event"] == name)
        .unwrap_or_else(|| panic!("no {name:?} event in {lines:?}"))
}

pub fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}
