//! Makes the slice visible inside the container: bind mounts made in the container's mount
//! namespace (which the hook enters with setns, and leaves again), before the runtime pivots into
//! the rootfs and before it remounts a read-only rootfs read-only. The mounts die with the
//! container. On the host there are the container's `mnt/slice`, a tmpfs of its own
//! (`Root::create`, `host::slice_space`), and its place on the compute board, a read-only mount
//! of `mnt/slice/board` there; both are made after the container's mount namespace was, so they
//! are not seen there: clones of them (`open_tree`, taken in the host's namespace) are attached
//! in the container's: the space, its ledger, claims and turns over their places, and the board
//! with every place on it (a slave of the host's board, so places made later appear in it).
//!
//! | in the container | from the host | |
//! |---|---|---|
//! | `/run/cuslice` | `<state root>/skel`: the mount points below, shared by every container | read-only |
//! | `/run/cuslice/slice` | `<state root>/containers/<id>/mnt/slice`: the limits and the ledger | read-only |
//! | `/run/cuslice/slice/ledger` | the same file | read-write: the one thing processes update |
//! | `/run/cuslice/node` | the node's compute board (`/dev/shm/cuslice`) with every slice's place on it, a slave of the host's: places of slices that come later appear in it | read-only |
//! | `/run/cuslice/node/<slice>/claims` | the container's own claims (`mnt/slice/board/claims`) | read-write |
//! | `/run/cuslice/node/<slice>/turns` | the container's own turns (`mnt/slice/board/turns`) | read-write |
//! | `/run/cuslice/lib/libcuslice.so` | the interposer's loader | read-only |
//! | `/run/cuslice/lib/libcuslice_core.so` | the interposer, which the loader opens beside itself | read-only |
//! | `/run/cuslice/agent` | `<state root>/agent`: the node agent's socket | read-only (a socket still connects) |
//! | `/etc/ld.so.preload` | `mnt/ld.so.preload`: the interposer, then the image's own entries | read-only |
//!
//! All of them nosuid,nodev. Without CAP_SYS_ADMIN (which containers do not get unless
//! privileged) a process inside can neither unmount nor remount them.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use cuslice_state::paths::{
    CONTAINER_AGENT_DIR, CONTAINER_CORE, CONTAINER_DIR, CONTAINER_LEDGER, CONTAINER_LIBRARY,
    CONTAINER_NODE_DIR, CONTAINER_PRELOAD, CONTAINER_SLICE_DIR, PRELOAD_FILE, in_rootfs,
};
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, setns};

use crate::rootfs::{Rootfs, fd_path};

pub struct Plan<'a> {
    /// The container's init process (host pid): its mount namespace is the one to change.
    pub pid: i32,
    pub rootfs: &'a Path,
    /// `<state root>/skel` (`Root::make_skeleton`).
    pub skeleton: &'a Path,
    /// `<state root>/containers/<id>/mnt`.
    pub mnt: &'a Path,
    pub node_dir: &'a Path,
    /// The claims file the slice's processes write (in its own space, `host::OWN_PLACE`; on the
    /// board itself for a slice the previous release made), and its slice's id (which names
    /// its place).
    pub claims: &'a Path,
    pub slice: u64,
    /// `<state root>/agent`, the node agent's socket directory.
    pub agent_dir: &'a Path,
    pub library: &'a Path,
    /// The container's `/etc/ld.so.preload` ([`image_preload`]), written into `mnt`; `None`
    /// where it is there already (another task joining a Slurm job's slice).
    pub preload: Option<&'a str>,
    /// A path of the node's own to mount read-only over itself: a Slurm task sees the node's
    /// file system, the compute board's real path (`node_dir`) included, where any account may
    /// write (standalone slices' places are there).
    pub cover: Option<&'a Path>,
}

/// Paths in the rootfs the mounts need, and what must be there.
const DIRS: [&str; 2] = [in_rootfs(CONTAINER_DIR), "etc"];
const PRELOAD: &str = in_rootfs(CONTAINER_PRELOAD);

/// The container's `/etc/ld.so.preload`: the interposer first, then the well-formed entries of
/// the image's own file (`settings::preload_file`). The image's file is read in the container's
/// mount namespace, as the container will see it, and at most `settings::PRELOAD_MAX` bytes of
/// it: a larger file, or one that is not a regular file, stops the container with one line. The
/// hook calls this before it takes the node-wide lock, so that what a tenant put in its image
/// never holds up another container's start.
pub fn image_preload(pid: i32, rootfs: &Path) -> Result<String, String> {
    use crate::rootfs::ReadError;
    use crate::settings::{PRELOAD_MAX, preload_file};
    in_container(pid, || {
        let r = Rootfs::open(rootfs).map_err(|e| format!("{}: {e}", rootfs.display()))?;
        match r.read_at_most(PRELOAD, PRELOAD_MAX) {
            Ok(image) => Ok(preload_file(image.as_deref())),
            Err(ReadError::TooLarge(size)) => Err(format!(
                "the image's /{PRELOAD} is {size} bytes; cuslice-hook reads at most {PRELOAD_MAX} \
                 bytes (64 KiB) of it: list the libraries to preload in a smaller file, one path \
                 per line, or remove it"
            )),
            Err(ReadError::NotRegular(kind)) => Err(format!(
                "the image's /{PRELOAD} is {kind}, not a regular file; the dynamic loader reads a \
                 list of libraries there: make it a regular file, or remove it"
            )),
            Err(ReadError::Io(e)) => Err(format!("cannot read the image's /{PRELOAD}: {e}")),
        }
    })
}

/// Makes the mounts. Returns the mount points it had to create in the rootfs (relative to it,
/// outermost first). On failure it removes those again and says what failed.
pub fn inject(plan: &Plan<'_>) -> Result<Vec<String>, String> {
    // The slice's own space, its ledger, claims and turns, and the board with every place on
    // it, as the host's namespace has them.
    let take = |p: &Path, recursive: bool| {
        cuslice_state::host::clone_tree(p, recursive)
            .map_err(|e| format!("cannot take the slice's state at {}: {e}", p.display()))
    };
    let trees = Trees {
        space: take(&plan.mnt.join("slice"), false)?,
        ledger: take(&plan.mnt.join("slice/ledger"), false)?,
        claims: take(plan.claims, false)?,
        turns: take(&turns_beside(plan.claims), false)?,
        board: take(plan.node_dir, true)?,
        cover: plan.cover.map(|p| take(p, true)).transpose()?,
    };
    in_container(plan.pid, || {
        let r = Rootfs::open(plan.rootfs).map_err(|e| format!("{}: {e}", plan.rootfs.display()))?;
        let mut created = Vec::new();
        match mount_all(&r, plan, trees, &mut created) {
            Ok(()) => Ok(created),
            Err(e) => {
                for rel in created.iter().rev() {
                    r.remove_if_empty(rel);
                }
                Err(e)
            }
        }
    })
}

/// Detached clones of what the container gets from the host's namespace (`host::clone_tree`).
struct Trees {
    space: OwnedFd,
    ledger: OwnedFd,
    claims: OwnedFd,
    turns: OwnedFd,
    /// The board, with every place mounted on it.
    board: OwnedFd,
    cover: Option<OwnedFd>,
}

/// The turns file beside a claims file.
fn turns_beside(claims: &Path) -> PathBuf {
    claims.with_file_name(cuslice_state::board::turns::FILE)
}

fn mount_all(
    r: &Rootfs,
    plan: &Plan<'_>,
    trees: Trees,
    created: &mut Vec<String>,
) -> Result<(), String> {
    let cant_make = |what: &str, e: std::io::Error| {
        format!(
            "cannot make the mount point /{what} in the container's rootfs {} ({e}); an image with an empty /{what} would not need it",
            r.path.display()
        )
    };
    for d in DIRS {
        created.extend(r.ensure_dir(d).map_err(|e| cant_make(d, e))?);
    }
    // Made here, once (not first empty at `Root::create`): readable by every user, since the
    // dynamic loader of every process in the container reads it.
    if let Some(preload) = plan.preload {
        cuslice_state::fsio::write_new(&plan.mnt.join(PRELOAD_FILE), preload.as_bytes(), 0o644)
            .map_err(|e| format!("{}: {e}", plan.mnt.join(PRELOAD_FILE).display()))?;
    }
    if r.ensure_file(PRELOAD).map_err(|e| cant_make(PRELOAD, e))? {
        created.push(PRELOAD.to_string());
    }
    let own = |file: &str| {
        format!(
            "{}/{:016x}/{file}",
            in_rootfs(CONTAINER_NODE_DIR),
            plan.slice,
        )
    };
    let own_claims = own(cuslice_state::board::CLAIMS);
    let own_turns = own(cuslice_state::board::turns::FILE);
    bind(r, plan.skeleton, in_rootfs(CONTAINER_DIR), true).map_err(|e| {
        format!(
            "cannot mount {} at /{}: {e}",
            plan.skeleton.display(),
            in_rootfs(CONTAINER_DIR)
        )
    })?;
    // Read-only: every slice reads the board; the files of it this container writes are its
    // own claims and turns, mounted read-write over their place in it. The board is a slave of
    // the host's before anything is mounted on it here: nothing mounted in the container goes
    // back to the host or to other containers, while places made later come in.
    let Trees {
        space,
        ledger,
        claims,
        turns,
        board,
        cover,
    } = trees;
    let node_target = in_rootfs(CONTAINER_NODE_DIR);
    attach_slave(r, board, node_target).map_err(|e| {
        format!(
            "cannot mount {} at /{node_target}: {e}",
            plan.node_dir.display()
        )
    })?;
    let turns_path = turns_beside(plan.claims);
    for (tree, what, target, read_only) in [
        (
            space,
            plan.mnt.join("slice"),
            in_rootfs(CONTAINER_SLICE_DIR),
            true,
        ),
        (
            ledger,
            plan.mnt.join("slice/ledger"),
            in_rootfs(CONTAINER_LEDGER),
            false,
        ),
        (
            claims,
            plan.claims.to_path_buf(),
            own_claims.as_str(),
            false,
        ),
        (turns, turns_path, own_turns.as_str(), false),
    ] {
        attach(r, tree, target, read_only)
            .map_err(|e| format!("cannot mount {} at /{target}: {e}", what.display()))?;
    }
    let binds: [(PathBuf, &str, bool); 4] = [
        // Read-only, yet the agent's socket in it still connects: connect(2) needs write
        // permission on the socket file, and read-only mounts spare sockets (as they spare
        // device nodes and fifos); it writes nothing to the file system.
        (
            plan.agent_dir.to_path_buf(),
            in_rootfs(CONTAINER_AGENT_DIR),
            true,
        ),
        (
            plan.library.to_path_buf(),
            in_rootfs(CONTAINER_LIBRARY),
            true,
        ),
        (
            crate::hook::core_beside(plan.library),
            in_rootfs(CONTAINER_CORE),
            true,
        ),
        (plan.mnt.join(PRELOAD_FILE), PRELOAD, true),
    ];
    for (source, target, read_only) in &binds {
        bind(r, source, target, *read_only)
            .map_err(|e| format!("cannot mount {} at /{target}: {e}", source.display()))?;
    }
    if let (Some(path), Some(tree)) = (plan.cover, cover) {
        let target = path.to_string_lossy();
        let target = target.trim_start_matches('/');
        attach_slave(r, tree, target)
            .map_err(|e| format!("cannot mount {} read-only: {e}", path.display()))?;
    }
    Ok(())
}

/// Attaches `tree` (a recursive clone of the board) read-only at `target`, made a slave of the
/// host's board first: mounts on the host's board come in, none made here go out.
fn attach_slave(r: &Rootfs, tree: OwnedFd, target: &str) -> std::io::Result<()> {
    move_into(r, tree, target)?;
    let at = r.target(target)?;
    mount(
        None::<&str>,
        fd_path(&at).as_str(),
        None::<&str>,
        MsFlags::MS_SLAVE | MsFlags::MS_REC,
        None::<&str>,
    )?;
    limit(r, target, true)
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
    limit(r, target, read_only)
}

/// Attaches the detached mount `tree` (`host::clone_tree`) at `target` in the rootfs.
fn attach(r: &Rootfs, tree: OwnedFd, target: &str, read_only: bool) -> std::io::Result<()> {
    move_into(r, tree, target)?;
    limit(r, target, read_only)
}

/// Attaches the detached mount `tree` at `target` in the rootfs, as it is.
fn move_into(r: &Rootfs, tree: OwnedFd, target: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let at: OwnedFd = r.target(target)?;
    // SAFETY: move_mount(2) between two descriptors we hold, with empty paths (the descriptors
    // themselves), which outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            at.as_raw_fd(),
            c"".as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the mount at `target` nosuid, nodev and, where asked, read-only.
fn limit(r: &Rootfs, target: &str, read_only: bool) -> std::io::Result<()> {
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

/// Runs `work` in `pid`'s mount namespace: the hook enters it and goes back to its own after,
/// with the working directory it had (entering a mount namespace moves it to the root). No
/// child process: forking one for this cost about 0.3 ms of every container's creation.
/// setns into a mount namespace needs a single-threaded caller, which the hook is.
fn in_container<T>(pid: i32, work: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).map_err(|e| {
        format!("cannot open the container's mount namespace (/proc/{pid}/ns/mnt): {e}")
    })?;
    let home = std::fs::File::open("/proc/self/ns/mnt")
        .map_err(|e| format!("cannot open the hook's own mount namespace: {e}"))?;
    let cwd = std::fs::File::open(".").ok();
    setns(ns.as_fd(), CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("cannot enter the container's mount namespace: {e}"))?;
    let result = work();
    // Everything after (the record, a failure's clean-up) is on the host's paths.
    setns(home.as_fd(), CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("cannot go back to the hook's own mount namespace: {e}"))?;
    if let Some(cwd) = cwd {
        let _ = nix::unistd::fchdir(cwd.as_fd());
    }
    result
}
