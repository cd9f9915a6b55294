//! A container's cgroup, found from its init process, for two things: telling whether a process
//! belongs to the container, and freezing the container (cgroup v2 `cgroup.freeze`, or the
//! cgroup v1 freezer's `freezer.state`). Which cgroups the agent holds frozen is recorded on
//! disk (added before each freeze, removed after its thaw), so the next agent after one that
//! died thaws exactly what that one held frozen, and nothing an operator froze.
//!
//! Ref: Documentation/admin-guide/cgroup-v2.rst ("cgroup.freeze", "cgroup.events") and
//! Documentation/admin-guide/cgroup-v1/freezer-subsystem.rst in the Linux sources.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use cuslice_state::fsio::Durability;
use serde::{Deserialize, Serialize};

/// Where a process sits: its cgroup v2 path (the `0::` line) and its v1 freezer path, relative
/// to each hierarchy's root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    pub v2: Option<String>,
    pub v1_freezer: Option<String>,
}

/// Parses /proc/PID/cgroup.
pub fn parse_placement(text: &str) -> Placement {
    let mut p = Placement::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            p.v2 = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "freezer") {
            p.v1_freezer = Some(path.to_string());
        }
    }
    p
}

pub fn placement(pid: i32) -> io::Result<Placement> {
    Ok(parse_placement(&fs::read_to_string(format!(
        "/proc/{pid}/cgroup"
    ))?))
}

/// Whether `path` is `base` or below it.
fn under(path: &str, base: &str) -> bool {
    let base = base.trim_end_matches('/');
    path == base || path.starts_with(&format!("{base}/"))
}

/// A container's own cgroup in one hierarchy: not the root, and not one the agent itself is in
/// or below (a container without a cgroup of its own would otherwise take in the whole host).
fn own(container: &Option<String>, agent: &Option<String>) -> Option<String> {
    let c = container.as_ref()?;
    if c == "/" || agent.as_ref().is_some_and(|a| under(a, c)) {
        return None;
    }
    Some(c.clone())
}

/// The cgroups that tell a container's processes apart: each hierarchy where the container's
/// init has a cgroup of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub v2: Option<String>,
    pub v1_freezer: Option<String>,
}

impl Scope {
    pub fn of(init: &Placement, agent: &Placement) -> Scope {
        Scope {
            v2: own(&init.v2, &agent.v2),
            v1_freezer: own(&init.v1_freezer, &agent.v1_freezer),
        }
    }

    /// Whether a process placed at `p` is in the container's cgroups.
    pub fn contains(&self, p: &Placement) -> bool {
        let inside = |scope: &Option<String>, at: &Option<String>| match (scope, at) {
            (Some(s), Some(a)) => under(a, s),
            _ => false,
        };
        inside(&self.v2, &p.v2) || inside(&self.v1_freezer, &p.v1_freezer)
    }
}

/// The cgroup hierarchies' mount points, from /proc/self/mountinfo.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mounts {
    pub v2: Option<PathBuf>,
    pub v1_freezer: Option<PathBuf>,
}

pub fn parse_mounts(mountinfo: &str) -> Mounts {
    let mut m = Mounts::default();
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 5 || r.len() < 3 || l[3] != "/" {
            continue; // a bind mount of part of a hierarchy does not name its root
        }
        let point = PathBuf::from(unescape(l[4]));
        match r[0] {
            "cgroup2" if m.v2.is_none() => m.v2 = Some(point),
            "cgroup" if m.v1_freezer.is_none() && r[2].split(',').any(|o| o == "freezer") => {
                m.v1_freezer = Some(point)
            }
            _ => {}
        }
    }
    m
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn mounts() -> Mounts {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mounts(&t))
        .unwrap_or_default()
}

/// A cgroup that can be frozen.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "version", rename_all = "lowercase")]
pub enum Freezer {
    /// The directory of a cgroup v2 cgroup (`cgroup.freeze`).
    V2 { dir: PathBuf },
    /// The directory of a cgroup in the v1 freezer hierarchy (`freezer.state`).
    V1 { dir: PathBuf },
}

impl Freezer {
    /// The freezer for a container's scope: its v1 freezer cgroup where it has one (on a v1 or
    /// hybrid host the freezer controller is what freezes), else its v2 cgroup. Err: one line
    /// saying why it cannot be frozen.
    pub fn for_scope(scope: &Scope, mounts: &Mounts) -> Result<Freezer, String> {
        let join = |root: &Path, rel: &str| root.join(rel.trim_start_matches('/'));
        if let (Some(rel), Some(root)) = (&scope.v1_freezer, &mounts.v1_freezer) {
            let dir = join(root, rel);
            if dir.join("freezer.state").exists() {
                return Ok(Freezer::V1 { dir });
            }
        }
        if let (Some(rel), Some(root)) = (&scope.v2, &mounts.v2) {
            let dir = join(root, rel);
            if dir.join("cgroup.freeze").exists() {
                return Ok(Freezer::V2 { dir });
            }
            return Err(format!(
                "{} has no cgroup.freeze (Linux 5.2 or later freezes cgroup v2 cgroups)",
                dir.display()
            ));
        }
        Err(
            "the container has no cgroup of its own with a freezer (neither a cgroup v2 cgroup \
             nor one in the v1 freezer hierarchy)"
                .into(),
        )
    }

    pub fn dir(&self) -> &Path {
        match self {
            Freezer::V1 { dir } | Freezer::V2 { dir } => dir,
        }
    }

    fn write(&self, frozen: bool) -> io::Result<()> {
        let (file, value) = match (self, frozen) {
            (Freezer::V2 { dir }, f) => (dir.join("cgroup.freeze"), if f { "1" } else { "0" }),
            (Freezer::V1 { dir }, f) => (
                dir.join("freezer.state"),
                if f { "FROZEN" } else { "THAWED" },
            ),
        };
        // The file must exist: creating it would write into a directory that is not a cgroup.
        let mut f = fs::OpenOptions::new().write(true).open(file)?;
        io::Write::write_all(&mut f, value.as_bytes())
    }

    /// Asks the kernel to freeze every process in the cgroup and below (it completes
    /// asynchronously; `frozen` says when it has).
    pub fn freeze(&self) -> io::Result<()> {
        self.write(true)
    }

    pub fn thaw(&self) -> io::Result<()> {
        self.write(false)
    }

    /// Whether the cgroup itself is asked to be frozen (by anyone: the agent, or an operator's
    /// `runc pause`), as opposed to frozen because a cgroup above it is: v2 `cgroup.freeze`,
    /// v1 `freezer.self_freezing`.
    pub fn requested(&self) -> io::Result<bool> {
        let file = match self {
            Freezer::V2 { dir } => dir.join("cgroup.freeze"),
            Freezer::V1 { dir } => dir.join("freezer.self_freezing"),
        };
        Ok(fs::read_to_string(file)?.trim() == "1")
    }

    /// Whether the kernel reports the cgroup frozen (every process in it stopped).
    pub fn frozen(&self) -> io::Result<bool> {
        match self {
            Freezer::V2 { dir } => Ok(fs::read_to_string(dir.join("cgroup.events"))?
                .lines()
                .any(|l| l.trim() == "frozen 1")),
            Freezer::V1 { dir } => {
                Ok(fs::read_to_string(dir.join("freezer.state"))?.trim() == "FROZEN")
            }
        }
    }
}

/// The cgroups this agent holds frozen: `<dir>/frozen.json`. A cgroup is added before it is
/// frozen and removed once it is thawed (or its container is gone), so whatever kills the
/// agent, the next agent thaws what it held frozen then, and only that: a container an
/// operator froze (`runc pause`, `docker pause`) while the agent did not hold it frozen is not
/// in the record.
pub struct Record {
    path: PathBuf,
    pub freezers: Vec<Freezer>,
}

impl Record {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join("frozen.json")
    }

    pub fn load(dir: &Path) -> Record {
        let path = Record::path(dir);
        let freezers = fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        Record { path, freezers }
    }

    fn save(&self) -> io::Result<()> {
        let text = serde_json::to_vec(&self.freezers).map_err(io::Error::other)?;
        // Frozen cgroups do not outlive a reboot: no fsync.
        cuslice_state::fsio::write_atomic(&self.path, &text, 0o644, Durability::None)
    }

    pub fn add(&mut self, f: &Freezer) -> io::Result<()> {
        if !self.freezers.contains(f) {
            self.freezers.push(f.clone());
            self.save()?;
        }
        Ok(())
    }

    pub fn remove(&mut self, f: &Freezer) -> io::Result<()> {
        if let Some(i) = self.freezers.iter().position(|x| x == f) {
            self.freezers.remove(i);
            self.save()?;
        }
        Ok(())
    }

    /// Thaws every recorded cgroup that is still frozen and forgets them all. Returns those it
    /// thawed, and one line per cgroup it could not. (One recorded but not frozen: the agent
    /// died between recording it and freezing it, or between thawing it and forgetting it.)
    pub fn thaw_all(&mut self) -> (Vec<Freezer>, Vec<String>) {
        let mut thawed = Vec::new();
        let mut failed = Vec::new();
        for f in std::mem::take(&mut self.freezers) {
            if !f.dir().exists() || matches!(f.requested(), Ok(false)) {
                continue;
            }
            match f.thaw() {
                Ok(()) => thawed.push(f),
                Err(e) => failed.push(format!("cannot thaw {}: {e}", f.dir().display())),
            }
        }
        let _ = self.save();
        (thawed, failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements() {
        let v1 = "12:freezer:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n";
        assert_eq!(
            parse_placement(v1),
            Placement {
                v2: Some("/".into()),
                v1_freezer: Some("/docker/abc".into())
            }
        );
        let v2 = "0::/system.slice/docker-abc.scope\n";
        assert_eq!(
            parse_placement(v2).v2.as_deref(),
            Some("/system.slice/docker-abc.scope")
        );
    }

    #[test]
    fn scope_takes_only_the_containers_own_cgroups() {
        let agent = Placement {
            v2: Some("/".into()),
            v1_freezer: Some("/".into()),
        };
        let init = Placement {
            v2: Some("/".into()),
            v1_freezer: Some("/ctr".into()),
        };
        let s = Scope::of(&init, &agent);
        assert_eq!(s.v2, None, "the root is nobody's own");
        assert_eq!(s.v1_freezer.as_deref(), Some("/ctr"));
        let p = |f: &str| Placement {
            v2: Some("/".into()),
            v1_freezer: Some(f.into()),
        };
        assert!(s.contains(&p("/ctr")));
        assert!(s.contains(&p("/ctr/sub")));
        assert!(!s.contains(&p("/ctr2")));
        assert!(!s.contains(&p("/")));
        // A container in the agent's own cgroup (or above it) has none of its own there.
        let agent = Placement {
            v2: Some("/pods/agent".into()),
            v1_freezer: None,
        };
        let init = Placement {
            v2: Some("/pods".into()),
            v1_freezer: None,
        };
        assert_eq!(Scope::of(&init, &agent), Scope::default());
    }

    #[test]
    fn mount_points() {
        let text = "\
25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate
31 25 0:28 / /sys/fs/cgroup/freezer rw,nosuid shared:14 - cgroup cgroup rw,freezer
32 25 0:29 / /sys/fs/cgroup/memory rw,nosuid shared:15 - cgroup cgroup rw,memory
40 30 0:28 /sub /mnt/x rw - cgroup cgroup rw,freezer
";
        assert_eq!(
            parse_mounts(text),
            Mounts {
                v2: Some("/sys/fs/cgroup/unified".into()),
                v1_freezer: Some("/sys/fs/cgroup/freezer".into()),
            }
        );
        assert_eq!(unescape(r"/a\040b"), "/a b");
    }
}
