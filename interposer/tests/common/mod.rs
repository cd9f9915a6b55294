//! Helpers for the interposer's tests: processes run against simgpu with libcuslice.so preloaded.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use cuslice_test_harness::*;
use serde_json::Value;

/// A slice: a CUSLICE_STATE_DIR in a temporary folder, with the environment its processes get.
// Not made by every test binary (glibc's run their processes without one), and its folder is
// read only by the tests that look inside it.
#[allow(dead_code)]
pub struct Slice {
    pub dir: tempfile::TempDir,
    pub env: Vec<(String, String)>,
}

// Each test binary calls the methods it needs, not all of them.
#[allow(dead_code)]
impl Slice {
    pub fn new(env: &[(&str, &str)]) -> Slice {
        let dir = tempfile::tempdir().unwrap();
        let mut all: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        all.push(("CUSLICE_STATE_DIR".into(), dir.path().display().to_string()));
        Slice { dir, env: all }
    }

    pub fn ledger(&self) -> PathBuf {
        self.dir.path().join("ledger")
    }

    /// `program args` under simgpu with the library preloaded and the slice's environment.
    pub fn command(&self, sim: &Sim, program: &Path, args: &[&str]) -> Command {
        let mut c = sim.command(program, args);
        c.env("LD_PRELOAD", libcuslice());
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// Runs the workload to completion: (JSON lines, exit code, stderr).
    pub fn run(&self, sim: &Sim, args: &[&str]) -> (Vec<Value>, i32, String) {
        let out = self.command(sim, &workload(), args).output().unwrap();
        split(out)
    }

    /// Starts the workload in the background (stdin and stdout piped, stderr captured).
    pub fn spawn(&self, sim: &Sim, args: &[&str]) -> Running {
        Running::start(self.command(sim, &workload(), args))
    }
}

pub fn split(out: Output) -> (Vec<Value>, i32, String) {
    (
        parse_lines(&String::from_utf8_lossy(&out.stdout)),
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The simulator's device-wide peak memory in use (all processes together).
// Not every test binary reads the peak.
#[allow(dead_code)]
pub fn peak_used(sim: &Sim, dev: usize) -> u64 {
    u(&sim.device(dev)["peak_used"])
}

/// The simulator's device-wide memory in use now (all processes together).
// Not every test binary reads it.
#[allow(dead_code)]
pub fn used(sim: &Sim, dev: usize) -> u64 {
    u(&sim.device(dev)["used"])
}

/// `tests/c/NAME.c` compiled into a temporary folder (kept while the folder is): the program's
/// path beside it.
// Not every test binary runs a C program.
#[allow(dead_code)]
pub fn c_program(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let program = build_c(dir.path(), &format!("{name}.c"), name, false);
    (dir, program)
}

/// `tests/c/SRC` compiled to `dir/OUT` (a shared library where `shared`), linked with `-ldl`.
// Not every test binary runs a C program.
#[allow(dead_code)]
pub fn build_c(dir: &Path, src: &str, out: &str, shared: bool) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(src);
    let out = dir.join(out);
    let mut c = Command::new("cc");
    if shared {
        c.args(["-shared", "-fPIC"]);
    }
    let done = c
        .arg("-O1")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "cc {} failed: {}",
        src.display(),
        String::from_utf8_lossy(&done.stderr)
    );
    out
}
