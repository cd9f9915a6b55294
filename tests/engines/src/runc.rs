//! Plain runc: an OCI bundle whose config.json lists `cuslice-hook prestart` and `poststop`, run
//! with `runc run`. Used by the runc engine's tests and by the agent's (which give the hook a
//! state root of their own).

use std::io::BufReader;
use std::path::PathBuf;
use std::process::{Child, Command};

use cuslice_test_harness::{Sim, Stderr};
use serde_json::{Value, json};

use super::{Container, Spec, all_env, gpu_mounts, hook, make_rootfs, spawn_piped};

pub struct Bundle {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

/// A bundle running `spec` with the simulator's libraries and state mounted, and the cuslice
/// hook for prestart and poststop, each given `hook_args` after its stage.
pub fn bundle(sim: &Sim, spec: &Spec<'_>, hook_args: &[&str]) -> Bundle {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    make_rootfs(&path.join("rootfs"));
    let out = Command::new("runc")
        .arg("spec")
        .current_dir(&path)
        .output()
        .expect("runc is missing: apt-get install runc (tests/tools/ensure-tools does)");
    assert!(
        out.status.success(),
        "runc spec: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(path.join("config.json")).unwrap();
    let mut c: Value = serde_json::from_str(&text).unwrap();
    c["process"]["terminal"] = json!(false);
    c["process"]["args"] = json!(spec.cmd);
    c["process"]["env"] = json!(all_env(spec));
    c["root"]["readonly"] = json!(spec.read_only);
    let mounts = c["mounts"].as_array_mut().unwrap();
    for (src, dst, rw) in gpu_mounts(sim) {
        mounts.push(json!({"destination": dst, "type": "bind", "source": src,
            "options": ["rbind", if rw {"rw"} else {"ro"}]}));
    }
    let h = hook().display().to_string();
    let args = |stage: &'static str| -> Vec<&str> {
        let mut a = vec!["cuslice-hook", stage];
        a.extend_from_slice(hook_args);
        a
    };
    c["hooks"] = json!({
        "prestart": [{"path": h, "args": args("prestart")}],
        "poststop": [{"path": h, "args": args("poststop")}],
    });
    std::fs::write(
        path.join("config.json"),
        serde_json::to_string_pretty(&c).unwrap(),
    )
    .unwrap();
    Bundle { _dir: dir, path }
}

/// A container `runc run` keeps in the foreground; deleted when dropped.
pub struct RuncContainer {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    err: Stderr,
    id: String,
    _bundle: Bundle,
}

impl RuncContainer {
    pub fn start(sim: &Sim, spec: &Spec<'_>, hook_args: &[&str]) -> RuncContainer {
        RuncContainer::start_bundle(bundle(sim, spec, hook_args), spec.name)
    }

    /// `runc run ID` in a bundle made (and perhaps changed) by the caller.
    pub fn start_bundle(b: Bundle, id: &str) -> RuncContainer {
        let mut cmd = Command::new("runc");
        cmd.args(["run", id]).current_dir(&b.path);
        let (child, out, err) = spawn_piped(cmd);
        RuncContainer {
            child,
            out,
            err,
            id: id.to_string(),
            _bundle: b,
        }
    }

    /// Whether runc has reported the container's exit, and with what status.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

/// The pid of container `id`'s init, as the host sees it (`runc state`).
pub fn state_pid(id: &str) -> i32 {
    try_state_pid(id).unwrap_or_else(|e| panic!("runc state {id}: {e}"))
}

/// `state_pid`, or what runc said where it knows no such container (it ended and was deleted).
pub fn try_state_pid(id: &str) -> Result<i32, String> {
    let out = Command::new("runc").args(["state", id]).output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|_| String::from_utf8_lossy(&out.stderr).trim().to_string())?;
    Ok(v["pid"].as_i64().unwrap() as i32)
}

impl Container for RuncContainer {
    fn host_pid(&self) -> i32 {
        state_pid(&self.id)
    }
    fn id(&self) -> String {
        self.id.clone()
    }
    fn stdout(&mut self) -> &mut BufReader<std::process::ChildStdout> {
        &mut self.out
    }
    fn stderr(&self) -> String {
        self.err.text()
    }
    fn remove(mut self: Box<Self>) {
        let _ = Command::new("runc")
            .args(["kill", &self.id, "KILL"])
            .output();
        let _ = self.child.wait();
        let _ = Command::new("runc")
            .args(["delete", "--force", &self.id])
            .output();
    }
}

/// A test that fails half-way leaves no container behind.
impl Drop for RuncContainer {
    fn drop(&mut self) {
        let _ = Command::new("runc")
            .args(["delete", "--force", &self.id])
            .output();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
