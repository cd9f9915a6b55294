//! Freezing real cgroups: the cgroup v1 freezer and cgroup v2 `cgroup.freeze`, on the kernel's
//! own word (`freezer.state`, `cgroup.events`, and a busy process's CPU time standing still),
//! and the record that lets an agent thaw what an earlier one left frozen. Each test makes a
//! cgroup of its own and removes it. Needs root, and the hierarchy it tests mounted (a hybrid
//! host, like the CI machine, has both; a test says so and stops where its hierarchy is not).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use cuslice_agent::cgroup::{self, Freezer, Record, Scope};
use cuslice_test_harness::require_root;

/// A cgroup made by the test, with one busy process in it; removed on drop.
struct Busy {
    dir: PathBuf,
    child: Child,
}

impl Busy {
    fn start(hierarchy: &Path, what: &str) -> Busy {
        let dir = hierarchy.join(format!("cuslice-test-{what}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let child = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
        Busy { dir, child }
    }

    /// CPU time (clock ticks, user + system) the busy process has used.
    fn cpu(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }

    /// Whether it got CPU time over half a second.
    fn runs(&self) -> bool {
        let a = self.cpu();
        std::thread::sleep(Duration::from_millis(500));
        self.cpu() > a
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = Freezer::V2 {
            dir: self.dir.clone(),
        }
        .thaw();
        let _ = Freezer::V1 {
            dir: self.dir.clone(),
        }
        .thaw();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.dir).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn until(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "not {what} in 10 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn freeze_and_thaw(hierarchy: Option<PathBuf>, version: &str) {
    require_root("these tests make cgroups");
    let Some(h) = hierarchy else {
        eprintln!("SKIPPED: no cgroup {version} hierarchy is mounted here");
        return;
    };
    let busy = Busy::start(&h, version);
    // The freezer the agent would pick for a container whose init this is.
    let me = cgroup::placement(std::process::id() as i32).unwrap();
    let p = cgroup::placement(busy.child.id() as i32).unwrap();
    let scope = Scope::of(&p, &me);
    let mounts = cgroup::mounts();
    let f = Freezer::for_scope(&scope, &mounts).unwrap();
    assert_eq!(f.dir(), busy.dir, "{scope:?} {mounts:?}");
    assert!(scope.contains(&p));
    assert!(!scope.contains(&me));
    assert!(busy.runs());
    assert!(!f.requested().unwrap());
    f.freeze().unwrap();
    until("frozen", || f.frozen().unwrap());
    assert!(f.requested().unwrap());
    assert!(!busy.runs(), "a frozen process got CPU time");
    f.thaw().unwrap();
    until("thawed", || !f.frozen().unwrap());
    assert!(!f.requested().unwrap());
    assert!(busy.runs());
}

#[test]
fn v1_freezer() {
    freeze_and_thaw(cgroup::mounts().v1_freezer, "v1");
}

#[test]
fn v2_cgroup_freeze() {
    // On a hybrid host a cgroup v1 freezer hierarchy is preferred when the process has a
    // cgroup of its own there; the test's cgroup is only in v2, so v2 is what is used.
    freeze_and_thaw(cgroup::mounts().v2, "v2");
}

/// A busy process in a cgroup of its own with a freezer, and that freezer; None (the test
/// says so) where no freezer hierarchy is mounted.
fn busy_freezer(what: &str) -> Option<(Busy, Freezer)> {
    let Some(h) = cgroup::mounts().v1_freezer.or(cgroup::mounts().v2) else {
        eprintln!("SKIPPED: no cgroup freezer here");
        return None;
    };
    let busy = Busy::start(&h, what);
    let f = if busy.dir.join("freezer.state").exists() {
        Freezer::V1 {
            dir: busy.dir.clone(),
        }
    } else {
        Freezer::V2 {
            dir: busy.dir.clone(),
        }
    };
    Some((busy, f))
}

/// What an agent froze and recorded is thawed by the next one, even if the first never got
/// to thaw it (SIGKILL).
#[test]
fn a_later_agent_thaws_what_was_recorded() {
    require_root("these tests make cgroups");
    let Some((busy, f)) = busy_freezer("record") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    {
        let mut r = Record::load(state.path());
        r.add(&f).unwrap();
        f.freeze().unwrap();
        // Dropped without a thaw: the agent "died".
    }
    until("frozen", || f.frozen().unwrap());
    let mut r = Record::load(state.path());
    let (thawed, failed) = r.thaw_all();
    assert_eq!(thawed, vec![f.clone()]);
    assert!(failed.is_empty(), "{failed:?}");
    until("thawed", || !f.frozen().unwrap());
    assert!(busy.runs());
    assert!(Record::load(state.path()).freezers.is_empty());
}

/// The record holds what the agent holds frozen now: a freeze it ended is forgotten, so a
/// later agent leaves a cgroup someone else froze since (an operator's pause) alone, and one
/// recorded but never frozen (the agent died in between) is not said to be thawed.
#[test]
fn a_later_agent_leaves_what_no_agent_holds_frozen() {
    require_root("these tests make cgroups");
    let Some((busy, f)) = busy_freezer("paused") else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    {
        let mut r = Record::load(state.path());
        r.add(&f).unwrap();
        f.freeze().unwrap();
        until("frozen", || f.frozen().unwrap());
        f.thaw().unwrap();
        r.remove(&f).unwrap();
    }
    // The operator's pause.
    f.freeze().unwrap();
    until("frozen", || f.frozen().unwrap());
    let (thawed, failed) = Record::load(state.path()).thaw_all();
    assert!(
        thawed.is_empty() && failed.is_empty(),
        "{thawed:?} {failed:?}"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(f.frozen().unwrap(), "the pause was undone");
    f.thaw().unwrap();
    until("thawed", || !f.frozen().unwrap());
    // Recorded, then the agent died before it froze.
    Record::load(state.path()).add(&f).unwrap();
    let mut r = Record::load(state.path());
    let (thawed, failed) = r.thaw_all();
    assert!(
        thawed.is_empty() && failed.is_empty(),
        "{thawed:?} {failed:?}"
    );
    assert!(Record::load(state.path()).freezers.is_empty());
    assert!(busy.runs());
}
