//! Engines with a daemon or shared state: finding an engine's program, starting and stopping its
//! daemon in a directory of its own, and removing what it leaves behind (mounts, files outside
//! its directory), also when a test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
        panic!(
            "{path} is missing: apt-get install {package} (tests/tools/ensure-tools installs it)"
        )
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
                // `d` is stopped as the panic drops it.
                let log = d.log();
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

/// A daemon dropped is stopped: one started before another failed to start (munged and
/// slurmctld, when slurmd refuses its plugin) is not left running. Those the tests keep live in
/// statics, stopped at exit.
impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
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
