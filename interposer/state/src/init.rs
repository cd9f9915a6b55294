//! The container's first process as the hook saw it from the host: its host pid, its pid in the
//! container's pid namespace, and that namespace. The hook writes it beside the slice's config
//! (`CONTAINER_INIT`, read-only in the container); that process, and no other, finds itself
//! there and so knows its host pid (the pid NVML names it by) from its first CUDA call, with or
//! without the node agent. A container's main program is usually that process (the engine runs
//! its command as the container's first process, and `exec` keeps the pid); its children learn
//! their host pids from the agent.
//!
//! One line, `<host pid> <pid in the container> <pid namespace inode>`:
//!
//! ```text
//! 48213 1 4026532871
//! ```
//!
//! What it says is trusted no more than the ledger's host pids (which the slice's own processes
//! write): it names a process of the slice to itself, and a wrong name would change only how the
//! slice's own first context is measured. The node agent checks the slice against the driver's
//! count either way.

use std::os::unix::fs::MetadataExt;

/// The file's name in the slice's directory.
pub const FILE: &str = "init";
/// The file inside the container.
pub const CONTAINER_FILE: &str = crate::paths::CONTAINER_INIT;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Init {
    pub host_pid: i32,
    /// Its pid in its own (the container's) pid namespace.
    pub ns_pid: i32,
    /// That namespace's inode number (`/proc/PID/ns/pid`), unique among live namespaces.
    pub pid_ns: u64,
}

impl Init {
    /// What `/proc` (the host's, as the hook sees it) says of process `pid`; None if it is gone
    /// or `/proc` does not say.
    pub fn of(pid: i32) -> Option<Init> {
        let pid_ns = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?.ino();
        Some(Init {
            host_pid: pid,
            ns_pid: inner_pid(pid)?,
            pid_ns,
        })
    }

    pub fn format(&self) -> String {
        format!("{} {} {}\n", self.host_pid, self.ns_pid, self.pid_ns)
    }

    /// Reads the file's text; None for anything but one well-formed line.
    pub fn parse(text: &str) -> Option<Init> {
        let mut w = text.strip_suffix('\n')?.split(' ');
        let init = Init {
            host_pid: w.next()?.parse().ok().filter(|&p| p > 0)?,
            ns_pid: w.next()?.parse().ok().filter(|&p| p > 0)?,
            pid_ns: w.next()?.parse().ok()?,
        };
        w.next().is_none().then_some(init)
    }

    /// The host pid of the process whose pid is `pid` in the pid namespace `pid_ns`, if that
    /// is this process.
    pub fn host_pid_of(&self, pid: i32, pid_ns: u64) -> Option<i32> {
        (pid == self.ns_pid && pid_ns == self.pid_ns).then_some(self.host_pid)
    }
}

/// The pid process `pid` (as this process's `/proc` names it) has in its own pid namespace.
pub fn inner_pid(pid: i32) -> Option<i32> {
    let status = crate::fsio::read_proc(&format!("/proc/{pid}/status"))?;
    innermost_pid(std::str::from_utf8(&status).ok()?)
}

/// The last field of the `NSpid:` line of a `/proc/PID/status` text: the process's pid in its
/// own pid namespace (the line lists its pid in each namespace it is in, outermost first).
pub fn innermost_pid(status: &str) -> Option<i32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// This process's host pid, if it is the process the container's `init` file names.
pub fn own_host_pid(text: &str) -> Option<i32> {
    let ns = std::fs::metadata("/proc/self/ns/pid").ok()?.ino();
    let pid = i32::try_from(std::process::id()).ok()?;
    Init::parse(text)?.host_pid_of(pid, ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let i = Init {
            host_pid: 48213,
            ns_pid: 1,
            pid_ns: 4026532871,
        };
        assert_eq!(i.format(), "48213 1 4026532871\n");
        assert_eq!(Init::parse(&i.format()), Some(i));
        for bad in [
            "",
            "48213 1 4026532871",
            "48213 1\n",
            "48213 1 4026532871 9\n",
            "0 1 4026532871\n",
            "48213 -1 4026532871\n",
            "x 1 4026532871\n",
        ] {
            assert_eq!(Init::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_innermost_pid_is_the_last_of_nspid() {
        let status = "Name:\tsh\nTgid:\t48213\nNSpid:\t48213\t1\nPPid:\t9\n";
        assert_eq!(innermost_pid(status), Some(1));
        assert_eq!(innermost_pid("NSpid:\t77\n"), Some(77));
        assert_eq!(innermost_pid("Name:\tsh\n"), None);
    }

    #[test]
    fn names_only_that_process_in_that_namespace() {
        let i = Init {
            host_pid: 48213,
            ns_pid: 1,
            pid_ns: 7,
        };
        assert_eq!(i.host_pid_of(1, 7), Some(48213));
        // Pid 1 of another namespace (one a tenant made inside the container) is not it.
        assert_eq!(i.host_pid_of(1, 8), None);
        assert_eq!(i.host_pid_of(2, 7), None);
    }

    #[test]
    fn this_process_as_proc_shows_it() {
        let me = i32::try_from(std::process::id()).unwrap();
        let i = Init::of(me).unwrap();
        assert_eq!(i.host_pid, me);
        // The test runs in the host's (or one) pid namespace: its pid there is its own.
        assert_eq!(i.ns_pid, me);
        assert_eq!(own_host_pid(&i.format()), Some(me));
        let other = Init {
            ns_pid: me + 1,
            ..i
        };
        assert_eq!(own_host_pid(&other.format()), None);
    }
}
