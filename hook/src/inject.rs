//! Makes the slice visible inside the container: bind mounts made in the container's mount
//! namespace (entered with setns from a forked child), before the runtime pivots into the rootfs
//! and before it remounts a read-only rootfs read-only. Nothing is mounted in the host's
//! namespace, so nothing needs unmounting: the mounts die with the container.
//!
//! | in the container | from the host | |
//! |---|---|---|
//! | `/run/cuslice` | `<state root>/containers/<id>/mnt` | read-only |
//! | `/run/cuslice/slice/ledger` | the same file | read-write: the one thing processes update |
//! | `/run/cuslice/node` | the node's compute regions (`/dev/shm/cuslice`) | read-write |
//! | `/run/cuslice/lib/libcuslice.so` | the interposer's loader | read-only |
//! | `/run/cuslice/lib/libcuslice_core.so` | the interposer, which the loader opens beside itself | read-only |
//! | `/run/cuslice/agent` | `<state root>/agent`: the node agent's socket | read-only (a socket still connects) |
//! | `/etc/ld.so.preload` | `mnt/ld.so.preload`: the image's own file, then the interposer | read-only |
//!
//! All of them nosuid,nodev. Without CAP_SYS_ADMIN (which containers do not get unless
//! privileged) a process inside can neither unmount nor remount them.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, setns};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, fork, pipe};

use crate::rootfs::{Rootfs, fd_path};

pub struct Plan<'a> {
    /// The container's init process (host pid): its mount namespace is the one to change.
    pub pid: i32,
    pub rootfs: &'a Path,
    /// `<state root>/containers/<id>/mnt`.
    pub mnt: &'a Path,
    pub node_dir: &'a Path,
    /// `<state root>/agent`, the node agent's socket directory.
    pub agent_dir: &'a Path,
    pub library: &'a Path,
}

/// Paths in the rootfs the mounts need, and what must be there.
const DIRS: [&str; 2] = ["run/cuslice", "etc"];
const PRELOAD: &str = "etc/ld.so.preload";

/// Makes the mounts. Returns the mount points it had to create in the rootfs (relative to it,
/// outermost first). On failure it removes those again and says what failed.
pub fn inject(plan: &Plan<'_>) -> Result<Vec<String>, String> {
    in_container(plan.pid, |created| {
        let r = Rootfs::open(plan.rootfs).map_err(|e| format!("{}: {e}", plan.rootfs.display()))?;
        let result = mount_all(&r, plan, created);
        if result.is_err() {
            for rel in created.iter().rev() {
                r.remove_if_empty(rel);
            }
        }
        result
    })
}

fn mount_all(r: &Rootfs, plan: &Plan<'_>, created: &mut Vec<String>) -> Result<(), String> {
    let cant_make = |what: &str, e: std::io::Error| {
        format!(
            "cannot make the mount point /{what} in the container's rootfs {} ({e}); an image with an empty /{what} would not need it",
            r.path.display()
        )
    };
    for d in DIRS {
        created.extend(r.ensure_dir(d).map_err(|e| cant_make(d, e))?);
    }
    let image = r
        .read(PRELOAD)
        .map_err(|e| format!("cannot read the image's /{PRELOAD}: {e}"))?;
    // Made here, once (not first empty at `Root::create`): readable by every user, since the
    // dynamic loader of every process in the container reads it.
    crate::state::write_new(
        &plan.mnt.join("ld.so.preload"),
        crate::settings::preload_file(image.as_deref()).as_bytes(),
        0o644,
    )
    .map_err(|e| format!("{}: {e}", plan.mnt.join("ld.so.preload").display()))?;
    if r.ensure_file(PRELOAD).map_err(|e| cant_make(PRELOAD, e))? {
        created.push(PRELOAD.to_string());
    }
    let binds: [(PathBuf, &str, bool); 7] = [
        (plan.mnt.to_path_buf(), "run/cuslice", true),
        (
            plan.mnt.join("slice/ledger"),
            "run/cuslice/slice/ledger",
            false,
        ),
        (plan.node_dir.to_path_buf(), "run/cuslice/node", false),
        // Read-only, yet the agent's socket in it still connects: connect(2) needs write
        // permission on the socket file, and read-only mounts spare sockets (as they spare
        // device nodes and fifos); it writes nothing to the file system.
        (plan.agent_dir.to_path_buf(), "run/cuslice/agent", true),
        (
            plan.library.to_path_buf(),
            "run/cuslice/lib/libcuslice.so",
            true,
        ),
        (
            crate::hook::core_beside(plan.library),
            "run/cuslice/lib/libcuslice_core.so",
            true,
        ),
        (plan.mnt.join("ld.so.preload"), PRELOAD, true),
    ];
    for (source, target, read_only) in &binds {
        bind(r, source, target, *read_only)
            .map_err(|e| format!("cannot mount {} at /{target}: {e}", source.display()))?;
    }
    Ok(())
}

fn bind(r: &Rootfs, source: &Path, target: &str, read_only: bool) -> std::io::Result<()> {
    let at: OwnedFd = r.target(target)?;
    mount(
        Some(source),
        fd_path(&at).as_str(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )?;
    // Open the target again: the new handle is on the mount just made, not what it covers.
    let at = r.target(target)?;
    let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    mount(
        None::<&str>,
        fd_path(&at).as_str(),
        None::<&str>,
        flags,
        None::<&str>,
    )?;
    Ok(())
}

/// Runs `work` in a child process that has entered `pid`'s mount namespace. The strings `work`
/// collects come back to the caller (one per line); its error comes back as the message.
fn in_container(
    pid: i32,
    work: impl FnOnce(&mut Vec<String>) -> Result<(), String>,
) -> Result<Vec<String>, String> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).map_err(|e| {
        format!("cannot open the container's mount namespace (/proc/{pid}/ns/mnt): {e}")
    })?;
    let (rx, tx) = pipe().map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: the hook is single-threaded (it starts no threads), so the child may do anything
    // the parent could; it leaves only through `_exit`.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            drop(rx);
            let mut out = Vec::new();
            let result = setns(ns.as_fd(), CloneFlags::CLONE_NEWNS)
                .map_err(|e| format!("cannot enter the container's mount namespace: {e}"))
                .and_then(|()| work(&mut out));
            let (code, text) = match result {
                Ok(()) => (
                    0,
                    out.iter()
                        .map(|s| format!("+{}\n", s.replace('\n', "\u{1}")))
                        .collect::<String>(),
                ),
                Err(e) => (1, format!("!{}\n", e.replace('\n', " "))),
            };
            let mut tx = std::fs::File::from(tx);
            let _ = tx.write_all(text.as_bytes());
            drop(tx);
            // SAFETY: ends the forked child without running the parent's exit handlers.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            drop(tx);
            let mut text = String::new();
            let _ = std::fs::File::from(rx).read_to_string(&mut text);
            let status = waitpid(child, None).map_err(|e| format!("waitpid: {e}"))?;
            let mut out = Vec::new();
            for line in text.lines() {
                if let Some(e) = line.strip_prefix('!') {
                    return Err(e.to_string());
                }
                if let Some(s) = line.strip_prefix('+') {
                    out.push(s.replace('\u{1}', "\n"));
                }
            }
            match status {
                WaitStatus::Exited(_, 0) => Ok(out),
                other => Err(format!("the mount helper ended with {other:?}")),
            }
        }
    }
}
