//! The host side of each container's slice, under the state root (`/run/cuslice` by default),
//! which the OCI hook writes and the node tools and agent read: [`Root`] (the layout and the
//! operations on it), [`Record`] (what the hook records of each container), [`start_time`]
//! (which tells a live container from one whose pid was reused). Paths inside the container are
//! in [`crate::paths`].
//!
//! ```text
//! /run/cuslice/lock                          serialises the hooks of concurrent containers
//! /run/cuslice/agent/               (0755)   the node agent's socket (agent.sock), mounted
//!                                            read-only at /run/cuslice/agent in containers
//! /run/cuslice/skel/                (0755)   mounted read-only at /run/cuslice in every
//!                                            container; made once, shared, never deleted
//!   slice/                                   mount point: the container's mnt/slice
//!   node/                                    mount point: the node's compute board
//!   agent/                                   mount point: the node agent's directory
//!   lib/libcuslice.so               (0644)   mount point: the interposer's loader
//!   lib/libcuslice_core.so          (0644)   mount point: the interposer's core
//! /run/cuslice/trash/               (0700)   removed containers' directories, deleted after
//!                                            `poststop` has answered (`Root::discard`)
//! /run/cuslice/containers/          (0700)
//!   <id>/record.json                         the hook's record: init pid + start time, rootfs,
//!                                            the mount points it had to make in the rootfs
//!   <id>/board                               the path of the container's place on the node's
//!                                            compute board (below), removed with the container
//!   <id>/mnt/                       (0755)
//!     slice/                        (0755)   a tmpfs of its own (`slice_space`), mounted
//!                                            read-only at /run/cuslice/slice
//!       config                      (0644)   the authoritative limits
//!       init                        (0644)   the container's first process (`init`)
//!       ledger                      (0666)   the slice's memory ledger (written by its processes)
//!       board/                      (0755)   its place on the compute board (`OWN_PLACE`)
//!         grant                     (0644)   what the container may claim (from its settings)
//!         claims                    (0666)   what it claims and uses: mounted read-write at
//!                                            /run/cuslice/node/<slice id>/claims in its own
//!                                            container
//!         turns                     (0666)   its turn on each device (`board::turns`), mounted
//!                                            read-write beside its claims
//!     ld.so.preload                 (0644)   bind-mounted read-only at /etc/ld.so.preload
//!
//! <node dir>/                                the node's compute board (`--node-dir`, default
//!                                            /dev/shm/cuslice): a shared mount (`share_board`),
//!                                            mounted read-only at /run/cuslice/node in every
//!                                            container as a slave of it
//!   <slice id>/                              a container's place: its `mnt/slice/board`, mounted
//!                                            read-only (`mount_place`); every container's view
//!                                            of the board gets it, also one started before
//! <node dir>.lock                   (0600)   root's: serialises changes to the board's mounts
//!                                            between the hooks of every state root
//! ```
//!
//! So every file a container's processes write is in its own space: what they write past the
//! end of the ledger, the claims or the turns fills that space and no other.
//!
//! A record whose init process is gone (a container that vanished without `poststop`) is swept
//! by the next hook that runs. A directory without a record is a hook that died half-way; since
//! every hook holds the lock from start to end, it is garbage too. Removing what a container
//! made in its rootfs is the hook's (it resolves paths inside a rootfs safely): the operations
//! that remove containers take it as a function, [`Unmake`].

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cuslice_policy::grant::Grant;
use serde::{Deserialize, Serialize};

use crate::board;
use crate::fsio::{Durability, make_dir, write_atomic, write_new};
use crate::paths;

pub const DEFAULT_ROOT: &str = paths::DEFAULT_STATE_ROOT;
/// The skeleton's entries, parents first: (the container path each stands for, whether a
/// directory). Each is at its container path below [`paths::CONTAINER_DIR`] in the skeleton.
const SKELETON: [(&str, bool); 7] = [
    (paths::CONTAINER_DIR, true),
    (paths::CONTAINER_SLICE_DIR, true),
    (paths::CONTAINER_NODE_DIR, true),
    (paths::CONTAINER_AGENT_DIR, true),
    (paths::CONTAINER_LIB_DIR, true),
    (paths::CONTAINER_LIBRARY, false),
    (paths::CONTAINER_CORE, false),
];

/// A skeleton entry's path relative to the skeleton: `/run/cuslice/lib` -> `lib`.
fn in_skeleton(container_path: &str) -> &str {
    container_path
        .strip_prefix(paths::CONTAINER_DIR)
        .unwrap_or(container_path)
        .trim_start_matches('/')
}

/// Removes the mount points a container made in its rootfs: called with the rootfs and
/// [`Record::created`] (outermost first), it removes each that is still an empty file or an empty
/// directory, innermost first, and leaves anything else alone. The hook's (see its `rootfs`).
pub type Unmake<'a> = &'a dyn Fn(&Path, &[String]);
const RECORD: &str = "record.json";
/// In a container's directory: the path of its place on the compute board.
const BOARD: &str = "board";

/// How much of the host's memory a container's own directory `mnt/slice` (its config, its
/// ledger and its place on the compute board: every file of it the container writes) may take:
/// it is a tmpfs of its own this large, the ledger's size rounded up to a MiB and a MiB more
/// (the claims and the turns take a few pages of it). A tenant that writes past the end of its
/// files, or reserves space past it, fills its own space and nobody else's: the state root's
/// and the board's file systems, which the agent, every other slice and every new container's
/// start use, are not touched.
pub fn slice_space() -> u64 {
    const MIB: u64 = 1 << 20;
    crate::ledger::file_size().next_multiple_of(MIB) + MIB
}

/// Mounts a tmpfs of `slice_space()` at `dir` (the container's `mnt/slice`).
fn mount_space(dir: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let target = CString::new(dir.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let options = CString::new(format!("size={},nr_inodes=16,mode=0755", slice_space()))
        .map_err(io::Error::other)?;
    // SAFETY: NUL-terminated strings that outlive the call; no data pointer beyond the options.
    let rc = unsafe {
        libc::mount(
            c"cuslice-slice".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            options.as_ptr().cast(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        Err(io::Error::new(
            e.kind(),
            format!(
                "cannot mount the slice's own space (a tmpfs) at {}: {e}",
                dir.display()
            ),
        ))
    }
}

/// In a container's `mnt`: its place on the compute board (grant, claims and turns), in its
/// own space, mounted read-only at `<node dir>/<slice id>`.
pub const OWN_PLACE: &str = "slice/board";

/// Makes the compute board `node` a mount of its own that propagates: each slice's place is a
/// mount on it (`mount_place`), which every container's view of the board, a slave of it
/// (the hook's `inject`), then shows, also for slices that come after the container. A
/// directory that is not a mount yet is bound onto itself (`unshare_board_if_empty` takes that
/// off again once the board is empty).
fn share_board(node: &Path) -> io::Result<()> {
    let fail = |what: &str, e: io::Error| {
        io::Error::new(
            e.kind(),
            format!(
                "cannot {what} the compute board {} ({e}): the hook makes it a mount of its \
                 own that propagates to every container's view of it, which needs root",
                node.display()
            ),
        )
    };
    if !mount_root(node).map_err(|e| fail("look at", e))? {
        mount_at(Some(node), node, libc::MS_BIND).map_err(|e| fail("bind-mount", e))?;
    }
    if !shared(node).map_err(|e| fail("look at", e))? {
        mount_at(None, node, libc::MS_SHARED).map_err(|e| fail("share", e))?;
    }
    Ok(())
}

/// Takes the place at `place` off the compute board (out of every container's view of it too),
/// and the board's own mount once no place is left on it.
pub fn take_off(place: &Path) {
    // Without the lock (an account that cannot have it makes no mounts to take off), as before.
    let _board = place.parent().map(lock_board);
    detach(place);
    board::remove_place(place);
    if let Some(node) = place.parent() {
        unshare_board_if_empty(node);
    }
}

/// Beside the node directory (`/dev/shm/cuslice.lock`): the lock that serialises changes to the
/// board's mounts (its own, and the places on it) between the hooks of every state root that
/// shares the board, each of which holds only its own root's lock. Not in the node directory:
/// every container sees that (read-only, yet a read-only descriptor takes a `flock`), and a
/// tenant holding the lock would hold up every container's start. Root's, 0600: no other host
/// account can open it, so none can hold it.
pub fn board_lock_path(node: &Path) -> PathBuf {
    let mut name = node.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    node.with_file_name(name)
}

/// Holds the board's lock ([`board_lock_path`]) until dropped. Without it, one hook could find
/// the board empty and take its mount off while another's place was being mounted on it, taking
/// that place with it: the other container then started without its files on the board, or
/// failed to. Whatever another account put at the lock's path first (any account may make files
/// in `/dev/shm`) is moved aside, and root's own made in its place.
fn lock_board(node: &Path) -> io::Result<Locked> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let path = board_lock_path(node);
    let fail = |e: io::Error| {
        io::Error::new(
            e.kind(),
            format!(
                "cannot lock the compute board at {} ({e}): the hook, as root, keeps a file of \
                 its own there",
                path.display()
            ),
        )
    };
    for round in 0..8 {
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path);
        let ours = f.as_ref().is_ok_and(|f| {
            f.metadata().is_ok_and(|m| {
                m.file_type().is_file() && m.uid() == 0 && m.nlink() == 1 && m.mode() & 0o077 == 0
            })
        });
        if !ours {
            // Another account's file, link, FIFO or directory: root may move it within its
            // sticky directory (a directory could not be removed while it holds files), and
            // the next round makes its own.
            let mut aside = path.as_os_str().to_os_string();
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            aside.push(format!(".{}.{now}.{round}.not-cuslice", std::process::id()));
            fs::rename(&path, &aside).map_err(fail)?;
            continue;
        }
        return f.and_then(Locked::exclusive).map_err(fail);
    }
    Err(fail(io::Error::other(
        "another account makes it again as fast as it is moved aside",
    )))
}

/// Takes the board's own mount off again once no place is left on it, where it is the
/// directory bound onto itself (`share_board`): a mount an operator made there stays. Called
/// with the board's lock held.
fn unshare_board_if_empty(node: &Path) {
    let empty = fs::read_dir(node).is_ok_and(|mut d| d.next().is_none());
    let parent = node.join("..");
    let same_fs = match (fs::metadata(node), fs::metadata(&parent)) {
        (Ok(a), Ok(b)) => {
            use std::os::unix::fs::MetadataExt;
            a.dev() == b.dev()
        }
        _ => false,
    };
    if empty && same_fs && mount_root(node).unwrap_or(false) {
        detach(node);
    }
}

/// Mounts `own` (a slice's place in its own space) read-only at `place` on the board. Read-only
/// from the start: the mount propagates to every container's view of the board as it is made,
/// and a remount after it would change the host's mount alone, leaving the place writable in
/// every other container. So it is made detached (`open_tree`), made read-only there
/// (`mount_setattr`), and only then attached (`move_mount`).
fn mount_place(own: &Path, place: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    /// `struct mount_attr` of <linux/mount.h>.
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const MOUNT_ATTR_NOSUID: u64 = 0x2;
    const MOUNT_ATTR_NODEV: u64 = 0x4;
    const MOUNT_ATTR_NOEXEC: u64 = 0x8;
    let fail = |e: io::Error| {
        let need = if e.raw_os_error() == Some(libc::ENOSYS) {
            " (cuslice-hook needs Linux 5.12 or later: open_tree, mount_setattr, move_mount)"
        } else {
            ""
        };
        io::Error::new(
            e.kind(),
            format!(
                "cannot mount the slice's place {} at {}: {e}{need}",
                own.display(),
                place.display()
            ),
        )
    };
    let target = CString::new(place.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let tree = clone_tree(own, false).map_err(fail)?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr(2) on a descriptor we hold, with an empty path (the descriptor
    // itself) and a `struct mount_attr` of the size passed, all outliving the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            std::os::fd::AsRawFd::as_raw_fd(&tree),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    // SAFETY: move_mount(2) from a descriptor we hold (empty path) to a NUL-terminated path,
    // both outliving the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            std::os::fd::AsRawFd::as_raw_fd(&tree),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    Ok(())
}

/// A detached clone of the mount at `path` (a bind mount of it, for a file or a directory inside
/// a mount), as the caller's mount namespace has it, with the mounts below it where `recursive`:
/// to be attached elsewhere with `move_mount`, in this namespace or another.
pub fn clone_tree(path: &Path, recursive: bool) -> io::Result<std::os::fd::OwnedFd> {
    use std::ffi::CString;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let p = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | if recursive {
            libc::AT_RECURSIVE as libc::c_uint
        } else {
            0
        };
    // SAFETY: open_tree(2) with a NUL-terminated path that outlives the call; it returns a new
    // file descriptor, or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, p.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor open_tree just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// mount(2) without a file system type or data: binds, remounts and propagation changes.
fn mount_at(source: Option<&Path>, target: &Path, flags: libc::c_ulong) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other);
    let source = source.map(c).transpose()?;
    let target = c(target)?;
    // SAFETY: NUL-terminated strings (or NULL) that outlive the call; no type and no data.
    let rc = unsafe {
        libc::mount(
            source.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Detaches whatever is mounted at `path`, if anything (lazily: a reader's open file keeps its
/// mount until it closes it).
fn detach(path: &Path) {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let Ok(target) = CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: a NUL-terminated path that outlives the call. Not a mount point, or gone: EINVAL
    // or ENOENT, and nothing to do.
    unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
}

/// The id of the mount `path` is on (statx's `stx_mnt_id`).
fn mount_id(path: &Path) -> io::Result<u64> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let p = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: statx is plain data; all-zero is a valid value for the kernel to fill in.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statx buffer, both outliving the call.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            p.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID,
            &mut stx,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if stx.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(io::Error::other(
            "the kernel gives no mount ids (Linux 5.8 or later does)",
        ));
    }
    Ok(stx.stx_mnt_id)
}

/// Whether `path` is the root of a mount (a mount point), not a directory inside one.
fn mount_root(path: &Path) -> io::Result<bool> {
    Ok(mount_id(path)? != mount_id(&path.join(".."))?)
}

/// Whether the mount `path` is on propagates (`shared:` in its line of /proc/self/mountinfo).
fn shared(path: &Path) -> io::Result<bool> {
    let id = mount_id(path)?.to_string();
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info.lines().any(|l| {
        let mut f = l.split(' ');
        f.next() == Some(id.as_str())
            && f.skip(5)
                .take_while(|o| *o != "-")
                .any(|o| o.starts_with("shared:"))
    }))
}

/// What `Root::create` made for a container.
pub struct Made {
    /// `containers/<id>/mnt`.
    pub mnt: PathBuf,
    /// The slice's id (its ledger's), which names its place on the compute board.
    pub slice: u64,
    /// Its claims file, in its own space (mounted read-write at its place in the container's
    /// view of the board).
    pub claims: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Record {
    pub id: String,
    /// The container's init process (host pid) and its start time in clock ticks since boot:
    /// together they name the process even after its pid is reused.
    pub pid: i32,
    pub start: u64,
    pub rootfs: PathBuf,
    /// What people call the container, where the engine says (the hook's
    /// `settings::display_name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Where the container belongs in Kubernetes, where the engine says (the hook's
    /// `settings::kubernetes`), with the DRA claim it uses where the DRA plugin's container
    /// index names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<Kubernetes>,
    /// Mount points the hook made in the rootfs (relative to it, outermost first); removed when
    /// no live container uses the rootfs any more.
    pub created: Vec<String>,
    /// The format of the ledger the hook made (`ledger::VERSION` of its release), which the
    /// container cannot change, unlike its ledger's header: the agent trusts this one
    /// (docs/upgrades.md). None in a record of a release before it (whose ledgers are
    /// `ledger::PREVIOUS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_version: Option<u32>,
    /// The Slurm job whose slice this is (the hook's `slurm-task` stage), where it is one: it
    /// lives from the job's first task on the node to the job's epilog, not with a process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmJob>,
}

/// A Slurm job's slice: part of its [`Record`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmJob {
    pub job: u32,
    pub user: String,
    pub uid: u32,
    /// The kernel's boot id when the slice was made: a slice of an earlier boot is gone.
    pub boot: String,
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
pub fn boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

impl Record {
    /// Whether the slice is still in use: a container's init process is the same process, a
    /// Slurm job's slice was made in this boot (its epilog removes it).
    pub fn alive(&self) -> bool {
        match &self.slurm {
            Some(j) => boot_id().as_deref() == Some(j.boot.as_str()),
            None => start_time(self.pid) == Some(self.start),
        }
    }
}

/// Where a container belongs in Kubernetes, from the annotations its engine passes in the spec
/// (the hook's `settings::kubernetes`); part of its [`Record`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kubernetes {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// The pod's uid (`None` where the engine does not say): tells a pod from one of the same
    /// name made again.
    #[serde(default)]
    pub pod_uid: Option<String>,
    /// The name of the DRA claim whose device the container uses, from the DRA plugin's
    /// container index (`None`: not a DRA claim's container, or not known).
    #[serde(default)]
    pub claim: Option<String>,
}

pub struct Root {
    pub path: PathBuf,
}

/// Holds the state root's lock, or the board's, until dropped (closing the file releases the
/// flock).
pub struct Locked {
    _file: fs::File,
}

impl Locked {
    /// Waits for an exclusive `flock` on `f`, through signals.
    fn exclusive(f: fs::File) -> io::Result<Locked> {
        loop {
            // SAFETY: flock(2) on a descriptor `f` owns and keeps open for the call.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Locked { _file: f });
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// The start time of process `pid` (field 22 of /proc/PID/stat), or `None` if it is gone.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = String::from_utf8(crate::fsio::read_proc(&format!("/proc/{pid}/stat"))?).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// A container id as runc accepts it; anything else could name a path outside the state root.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 1024
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_+-.".contains(&b))
}

impl Root {
    pub fn new(path: impl Into<PathBuf>) -> Root {
        Root { path: path.into() }
    }

    pub fn containers(&self) -> PathBuf {
        self.path.join("containers")
    }

    pub fn dir(&self, id: &str) -> PathBuf {
        self.containers().join(id)
    }

    /// The node agent's directory (its socket, `agent.sock`), mounted read-only at
    /// /run/cuslice/agent in every container.
    pub fn agent(&self) -> PathBuf {
        self.path.join("agent")
    }

    /// The directory mounted at /run/cuslice in the container.
    pub fn mnt(&self, id: &str) -> PathBuf {
        self.dir(id).join("mnt")
    }

    pub fn lock(&self) -> io::Result<Locked> {
        fs::create_dir_all(&self.path)?;
        match fs::create_dir(self.containers()) {
            Ok(()) => fs::set_permissions(self.containers(), fs::Permissions::from_mode(0o700))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.path.join("lock"))?;
        Locked::exclusive(f)
    }

    pub fn read_record(&self, id: &str) -> Option<Record> {
        let text = fs::read_to_string(self.dir(id).join(RECORD)).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub fn write_record(&self, r: &Record) -> io::Result<()> {
        let text = serde_json::to_vec_pretty(r).map_err(io::Error::other)?;
        // Atomic, so that a reader (the agent, `cuslice status`, a hook of another container)
        // sees the old record or the new one. No fsync: per-boot runtime state under /run, which
        // a reboot makes meaningless anyway (its containers are gone; the next hook sweeps it).
        write_atomic(
            &self.dir(&r.id).join(RECORD),
            &text,
            0o644,
            Durability::None,
        )
    }

    /// Records of every container the state root knows, live or not.
    pub fn records(&self) -> Vec<Record> {
        let Ok(dir) = fs::read_dir(self.containers()) else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|id| self.read_record(&id))
            .collect()
    }

    /// The tree mounted read-only at /run/cuslice in every container: empty mount points for the
    /// slice's own directory and the node's shared files, the same for every container.
    pub fn skeleton(&self) -> PathBuf {
        self.path.join("skel")
    }

    /// Makes what is missing of the skeleton (see the layout above) and returns its path. It is
    /// made once per node and never deleted: its entries are mount points in running
    /// containers. Requires the lock.
    pub fn make_skeleton(&self) -> io::Result<PathBuf> {
        let skel = self.skeleton();
        for (container_path, dir) in SKELETON {
            let path = skel.join(in_skeleton(container_path));
            match fs::symlink_metadata(&path) {
                Ok(found) if found.is_dir() == dir && (dir || found.is_file()) => {}
                Ok(_) => {
                    let want = if dir { "a directory" } else { "a regular file" };
                    return Err(io::Error::other(format!(
                        "{} is not {want}; remove it and the next hook makes it again",
                        path.display()
                    )));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if dir {
                        make_dir(&path, 0o755)?;
                    } else {
                        write_new(&path, b"", 0o644)?;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(skel)
    }

    /// Makes the container's own state (everything under `containers/<id>/` in the layout above
    /// but the record and `ld.so.preload`) and its place on the compute board under `node` with
    /// `grant`, replacing any leftover of the same id; `init`, the container's first process,
    /// where the hook could see it. Requires the lock.
    pub fn create(
        &self,
        id: &str,
        config: &str,
        init: Option<&crate::init::Init>,
        node: &Path,
        grant: &Grant,
    ) -> io::Result<Made> {
        let dir = self.dir(id);
        let mnt = self.mnt(id);
        if dir.exists() {
            self.remove_place(id);
            detach(&mnt.join("slice"));
            fs::remove_dir_all(&dir)?;
        }
        // Each path is made once with its final mode, and written once: nothing else can see
        // the directory before its record exists (a directory without one is a hook's half-made
        // work, see `sweep`), so no temporary files and renames are needed until the record.
        // Every path here is made again and deleted again for each container, which is why
        // the mount points all containers share live in the skeleton instead.
        let made = (|| {
            make_dir(&dir, 0o755)?;
            make_dir(&mnt, 0o755)?;
            make_dir(&mnt.join("slice"), 0o755)?;
            mount_space(&mnt.join("slice"))?;
            write_new(&mnt.join("slice/config"), config.as_bytes(), 0o644)?;
            if let Some(i) = init {
                write_new(
                    &mnt.join("slice").join(crate::init::FILE),
                    i.format().as_bytes(),
                    0o644,
                )?;
            }
            // ld.so.preload is written when the mounts are made, from the image's own file
            // (the hook's inject.rs). Every process in the container updates the ledger and its claims,
            // whatever user it runs as.
            let slice = crate::ledger::Ledger::create_file(&mnt.join("slice/ledger"), 0o666)
                .map_err(|e| io::Error::other(e.to_string()))?;
            // Its place on the board, in its own space: what it writes past its claims and
            // turns fills that space alone (`slice_space`).
            let own = mnt.join(OWN_PLACE);
            make_dir(&own, 0o755)?;
            write_new(&own.join(board::GRANT), grant.format().as_bytes(), 0o644)?;
            board::turns::create(&own.join(board::turns::FILE), slice, 0o666)?;
            let claims = own.join(board::CLAIMS);
            board::create_claims(&claims, slice, 0o666)?;
            // Where the place will be, before it is made: whoever removes the directory (this
            // container's poststop, or a sweep of a hook that died half-way) removes it too.
            let place = board::slice_dir(node, slice);
            write_new(
                &dir.join(BOARD),
                place.as_os_str().as_encoded_bytes(),
                0o600,
            )?;
            // Under the board's lock: another root's hook taking the board's mount off as its
            // last place goes would take this place with it.
            let board = lock_board(node)?;
            share_board(node)?;
            make_dir(&place, 0o755)?;
            // Its three files appear on the board at once, read-only there.
            mount_place(&own, &place)?;
            drop(board);
            Ok((slice, claims))
        })();
        match made {
            Ok((slice, claims)) => Ok(Made { mnt, slice, claims }),
            Err(e) => {
                self.remove_place(id);
                detach(&mnt.join("slice"));
                let _ = fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// Where container `id`'s place on the compute board is (`<node dir>/<slice id>`), as its
    /// hook recorded it.
    pub fn place(&self, id: &str) -> Option<PathBuf> {
        let path = fs::read(self.dir(id).join(BOARD)).ok()?;
        Some(PathBuf::from(std::ffi::OsString::from_vec(path)))
    }

    /// Takes container `id`'s place off the compute board (out of every container's view of
    /// it too), and the board's own mount once no place is left on it.
    fn remove_place(&self, id: &str) {
        if let Some(path) = self.place(id) {
            take_off(&path);
        }
    }

    /// Where `discard` puts the state of removed containers until `empty_trash` deletes it.
    pub fn trash(&self) -> PathBuf {
        self.path.join("trash")
    }

    /// Removes a container's state. The mount points it made in the rootfs go too, unless another
    /// live container uses the same rootfs: then that one inherits them. Requires the lock.
    pub fn remove(&self, id: &str, live: &[Record], unmake: Unmake<'_>) {
        self.remove_mount_points(id, live, unmake);
        self.remove_place(id);
        detach(&self.mnt(id).join("slice"));
        let _ = fs::remove_dir_all(self.dir(id));
    }

    /// `remove`, except that the container's directory is moved into `trash` (one rename)
    /// rather than deleted file by file: `poststop` answers at once and deletes it after
    /// (`empty_trash`). Where the state root is on a disk file system, deleting the files
    /// and directories of a slice took most of `poststop`'s time (1 to 30 ms on a busy disk,
    /// measured). The rootfs's mount points still go at once: the bundle is the engine's.
    /// Requires the lock.
    pub fn discard(&self, id: &str, live: &[Record], unmake: Unmake<'_>) {
        self.remove_mount_points(id, live, unmake);
        // At once: the other slices stop counting its claims.
        self.remove_place(id);
        detach(&self.mnt(id).join("slice"));
        let dir = self.dir(id);
        let to = self.trash().join(format!("{id}.{}", std::process::id()));
        let moved = make_dir(&self.trash(), 0o700)
            .or_else(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => Ok(()),
                _ => Err(e),
            })
            .and_then(|()| fs::rename(&dir, &to));
        if moved.is_err() {
            let _ = fs::remove_dir_all(&dir);
        }
    }

    /// Deletes what `discard` put in the trash (by any hook: emptying it twice at once is
    /// harmless). Needs no lock: nothing else uses the trash.
    pub fn empty_trash(&self) {
        let Ok(dir) = fs::read_dir(self.trash()) else {
            return;
        };
        for e in dir.flatten() {
            detach(&e.path().join("mnt/slice"));
            let _ = fs::remove_dir_all(e.path());
        }
    }

    fn remove_mount_points(&self, id: &str, live: &[Record], unmake: Unmake<'_>) {
        if let Some(r) = self.read_record(id) {
            let heir = live
                .iter()
                .find(|o| o.id != id && o.rootfs == r.rootfs && self.read_record(&o.id).is_some());
            match heir {
                Some(h) if !r.created.is_empty() => {
                    let mut h = h.clone();
                    h.created.extend(r.created.iter().cloned());
                    let _ = self.write_record(&h);
                }
                Some(_) => {}
                None => unmake(&r.rootfs, &r.created),
            }
        }
    }

    /// Removes the state of every container whose init process is gone, and any directory a
    /// dead hook left half made. Requires the lock. Returns the ids it removed.
    pub fn sweep(&self, unmake: Unmake<'_>) -> Vec<String> {
        let Ok(dir) = fs::read_dir(self.containers()) else {
            return Vec::new();
        };
        let ids: Vec<String> = dir
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        let mut live = Vec::new();
        let mut dead = Vec::new();
        for id in ids {
            match self.read_record(&id) {
                Some(r) if r.alive() => live.push(r),
                _ => dead.push(id),
            }
        }
        for id in &dead {
            self.remove(id, &live, unmake);
        }
        dead
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// What the hook's rootfs removal does, without its safe resolution.
    fn unmake(rootfs: &Path, created: &[String]) {
        for rel in created.iter().rev() {
            let p = rootfs.join(rel);
            let _ = fs::remove_file(&p).or_else(|_| fs::remove_dir(&p));
        }
    }

    /// Makes container `id`'s state under `root`, its place on the board under `node`.
    fn make(root: &Root, id: &str, config: &str, node: &Path) -> Made {
        let grant = cuslice_policy::grant::Grant {
            request: 0,
            limit: cuslice_policy::share::FULL,
            priority: cuslice_policy::Priority::Normal,
            memory: None,
            freezes: false,
            origin: cuslice_policy::grant::Origin::Hook {
                id: id.to_string(),
                root: root.path.clone(),
            },
        };
        root.create(id, config, None, node, &grant).unwrap()
    }

    #[test]
    fn ids() {
        assert!(valid_id("abc-123_x.y+z"));
        for bad in ["", ".", "..", "a/b", "../x", "a b", "a\nb"] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn own_start_time() {
        let me = std::process::id() as i32;
        assert!(start_time(me).is_some());
        assert_eq!(start_time(me), start_time(me));
        assert_eq!(start_time(i32::MAX), None);
    }

    #[test]
    fn the_skeleton_is_made_once_mended_where_missing_and_never_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Root::new(tmp.path());
        let _l = root.lock().unwrap();
        let skel = root.make_skeleton().unwrap();
        let kinds = |skel: &Path| -> Vec<(String, bool)> {
            SKELETON
                .iter()
                .map(|(path, _)| {
                    let m = fs::symlink_metadata(skel.join(in_skeleton(path))).unwrap();
                    (in_skeleton(path).to_string(), m.is_dir())
                })
                .collect()
        };
        let want: Vec<(String, bool)> = SKELETON
            .iter()
            .map(|(p, d)| (in_skeleton(p).to_string(), *d))
            .collect();
        assert_eq!(want[0], (String::new(), true));
        assert_eq!(want[5], ("lib/libcuslice.so".to_string(), false));
        assert_eq!(kinds(&skel), want);
        // The mount points the hook mounts the interposer on.
        assert!(skel.join("lib").join(paths::CORE_FILE).is_file());
        // A missing entry is made again; the others are left as they are.
        fs::remove_file(skel.join("lib/libcuslice.so")).unwrap();
        let node = fs::metadata(skel.join("node")).unwrap().ino();
        root.make_skeleton().unwrap();
        assert_eq!(kinds(&skel), want);
        assert_eq!(fs::metadata(skel.join("node")).unwrap().ino(), node);
        // An entry of the wrong kind is refused with one line, not replaced: it may be a mount
        // point in a running container.
        fs::remove_dir(skel.join("agent")).unwrap();
        fs::write(skel.join("agent"), "").unwrap();
        let err = root.make_skeleton().unwrap_err().to_string();
        assert!(err.contains("agent is not a directory"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        // Sweeping and emptying the trash leave it alone.
        root.sweep(&unmake);
        root.empty_trash();
        assert!(skel.join("node").is_dir());
    }

    #[test]
    fn a_slurm_jobs_slice_lives_for_its_boot_whatever_its_first_task() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Root::new(tmp.path());
        let _l = root.lock().unwrap();
        let node = tempfile::tempdir().unwrap();
        for (id, boot) in [
            ("slurm-1", boot_id().unwrap()),
            ("slurm-2", "earlier".into()),
        ] {
            make(&root, id, "CUSLICE_MEMORY_LIMIT=1GiB\n", node.path());
            root.write_record(&Record {
                name: None,
                kubernetes: None,
                id: id.into(),
                // Its first task, long gone.
                pid: std::process::id() as i32,
                start: 1,
                rootfs: "/".into(),
                created: Vec::new(),
                ledger_version: None,
                slurm: Some(SlurmJob {
                    job: 1,
                    user: "nobody".into(),
                    uid: 65534,
                    boot,
                }),
            })
            .unwrap();
        }
        assert_eq!(root.sweep(&unmake), ["slurm-2"]);
        assert!(root.read_record("slurm-1").unwrap().alive());
        root.remove("slurm-1", &[], &unmake);
    }

    #[test]
    fn sweep_removes_the_dead_and_the_half_made() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Root::new(tmp.path());
        let _l = root.lock().unwrap();
        let rootfs = tempfile::tempdir().unwrap();
        std::fs::write(rootfs.path().join("made"), "").unwrap();
        let node = tempfile::tempdir().unwrap();
        let me = std::process::id() as i32;
        let mut places = Vec::new();
        for (id, pid, start) in [("live", me, start_time(me).unwrap()), ("dead", me, 1)] {
            make(&root, id, "CUSLICE_MEMORY_LIMIT=1GiB\n", node.path());
            places.push(root.place(id).unwrap());
            root.write_record(&Record {
                name: None,
                kubernetes: None,
                id: id.into(),
                pid,
                start,
                rootfs: rootfs.path().into(),
                created: vec!["made".into()],
                ledger_version: None,
                slurm: None,
            })
            .unwrap();
        }
        make(&root, "half", "", node.path());
        let half = root.place("half").unwrap();
        let mut gone = root.sweep(&unmake);
        gone.sort();
        assert_eq!(gone, ["dead", "half"]);
        assert!(root.dir("live").join("mnt/slice/ledger").exists());
        // Their places on the compute board went with them; the live one's stays.
        assert!(places[0].join("claims").is_file());
        assert!(places[0].join("grant").is_file());
        assert!(!places[1].exists());
        assert!(!half.exists());
        // The live container shares the rootfs: it inherits the dead one's mount point.
        assert!(rootfs.path().join("made").exists());
        assert_eq!(root.read_record("live").unwrap().created, ["made", "made"]);
        root.remove("live", &[], &unmake);
        assert!(!rootfs.path().join("made").exists());
        assert!(!root.dir("live").exists());
        assert!(!places[0].exists());
        // The board's own mount went with its last place.
        assert!(!mount_root(node.path()).unwrap());
    }

    #[test]
    fn discarded_state_is_gone_at_once_and_deleted_from_the_trash() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Root::new(tmp.path());
        let _l = root.lock().unwrap();
        let rootfs = tempfile::tempdir().unwrap();
        std::fs::create_dir(rootfs.path().join("made")).unwrap();
        let me = std::process::id() as i32;
        let node = tempfile::tempdir().unwrap();
        make(&root, "c", "CUSLICE_MEMORY_LIMIT=1GiB\n", node.path());
        let place = root.place("c").unwrap();
        root.write_record(&Record {
            name: None,
            kubernetes: None,
            id: "c".into(),
            pid: me,
            start: start_time(me).unwrap(),
            rootfs: rootfs.path().into(),
            created: vec!["made".into()],
            ledger_version: None,
            slurm: None,
        })
        .unwrap();
        root.discard("c", &[], &unmake);
        assert!(!root.dir("c").exists());
        // Off the board at once, not when the trash is emptied.
        assert!(place.parent() == Some(node.path()) && !place.exists());
        assert!(!rootfs.path().join("made").exists());
        assert!(root.records().is_empty());
        assert_eq!(std::fs::read_dir(root.trash()).unwrap().count(), 1);
        root.empty_trash();
        assert_eq!(std::fs::read_dir(root.trash()).unwrap().count(), 0);
    }

    /// Hooks of two state roots (the agent's tests beside the engines', or Slurm's beside a
    /// container engine's) share one board, each under its own root's lock. One makes and removes
    /// a container over and over; the other's place, made meanwhile, is on the board each time,
    /// a mount with its files, until the other removes it: the last place to go takes the
    /// board's own mount off, never a place made while it went.
    #[test]
    fn hooks_of_two_state_roots_never_take_each_others_places_off_the_board() {
        const ROUNDS: usize = 200;
        let node = tempfile::tempdir().unwrap();
        let node = node.path();
        let churn = |id: &str, watch: bool| -> Vec<String> {
            let tmp = tempfile::tempdir().unwrap();
            let root = Root::new(tmp.path());
            let mut lost = Vec::new();
            for round in 0..ROUNDS {
                let l = root.lock().unwrap();
                make(&root, id, "CUSLICE_MEMORY_LIMIT=1GiB\n", node);
                drop(l);
                let place = root.place(id).unwrap();
                for look in 0..if watch { 3 } else { 0 } {
                    let on_board =
                        mount_root(&place).unwrap_or(false) && place.join(board::CLAIMS).is_file();
                    if !on_board {
                        lost.push(format!("round {round}, look {look}"));
                    }
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                let _l = root.lock().unwrap();
                root.remove(id, &[], &unmake);
            }
            lost
        };
        let lost = std::thread::scope(|s| {
            s.spawn(|| churn("a", false));
            churn("b", true)
        });
        assert!(lost.is_empty(), "the place was off the board: {lost:?}");
        // Both gone: the board's own mount went with the last place.
        assert!(!mount_root(node).unwrap());
        assert!(board::places(node).is_some_and(|mut p| p.next().is_none()));
    }

    /// The board's lock is beside the node directory, not in it (every container sees that).
    /// Any account may make files there, at the lock's path too: a file of another account, a
    /// link, a FIFO or a directory full of files is moved aside for root's own, which no other
    /// account can open (so none can hold the lock); what a link pointed at is untouched.
    #[test]
    fn the_boards_lock_is_roots_own_whoever_made_the_file_first() {
        use std::os::unix::fs::PermissionsExt;
        let shm = tempfile::tempdir().unwrap();
        fs::set_permissions(shm.path(), fs::Permissions::from_mode(0o1777)).unwrap();
        let node = shm.path().join("cuslice");
        make_dir(&node, 0o1777).unwrap();
        let lock = board_lock_path(&node);
        assert_eq!(lock, shm.path().join("cuslice.lock"));
        let target = shm.path().join("elsewhere");
        fs::write(&target, b"keep").unwrap();
        let theirs = |p: &Path| std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        let planted: [&dyn Fn(); 4] = [
            &|| {
                fs::write(&lock, b"").unwrap();
                fs::set_permissions(&lock, fs::Permissions::from_mode(0o666)).unwrap();
                theirs(&lock);
            },
            &|| std::os::unix::fs::symlink(&target, &lock).unwrap(),
            &|| {
                use std::os::unix::ffi::OsStrExt;
                let p = std::ffi::CString::new(lock.as_os_str().as_bytes()).unwrap();
                // SAFETY: mkfifo(3) with a NUL-terminated path that outlives the call.
                assert_eq!(unsafe { libc::mkfifo(p.as_ptr(), 0o666) }, 0);
            },
            &|| {
                make_dir(&lock, 0o777).unwrap();
                fs::write(lock.join("full"), b"x").unwrap();
                theirs(&lock);
            },
        ];
        for plant in planted {
            plant();
            let held = lock_board(&node).unwrap();
            let m = fs::symlink_metadata(&lock).unwrap();
            assert!(m.file_type().is_file(), "{:?}", m.file_type());
            assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600));
            // Held: another open description of it cannot have it.
            let other = fs::File::open(&lock).unwrap();
            // SAFETY: flock(2) on a descriptor `other` owns.
            let rc = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            assert_eq!(rc, -1);
            drop(held);
            assert_eq!(fs::read(&target).unwrap(), b"keep");
            // Nothing of it in the node directory, which every container sees.
            assert_eq!(fs::read_dir(&node).unwrap().count(), 0);
            fs::remove_file(&lock).unwrap();
        }
    }

    #[test]
    fn a_place_is_the_slices_own_space_read_only_on_a_shared_board() {
        use std::io::Write;
        let tmp = tempfile::tempdir().unwrap();
        let root = Root::new(tmp.path());
        let _l = root.lock().unwrap();
        let node = tempfile::tempdir().unwrap();
        // A container's view of the board: a slave of it, made before the slice.
        share_board(node.path()).unwrap();
        let view = tempfile::tempdir().unwrap();
        mount_at(Some(node.path()), view.path(), libc::MS_BIND).unwrap();
        mount_at(None, view.path(), libc::MS_SLAVE).unwrap();
        let made = make(&root, "c", "CUSLICE_MEMORY_LIMIT=1GiB\n", node.path());
        let place = root.place("c").unwrap();
        // The board is a mount of its own that propagates; the place is a mount on it.
        assert!(mount_root(node.path()).unwrap() && shared(node.path()).unwrap());
        assert!(mount_root(&place).unwrap());
        let seen = view.path().join(place.file_name().unwrap());
        for f in [board::GRANT, board::CLAIMS, board::turns::FILE] {
            assert!(place.join(f).is_file(), "{f}");
            // The view got the place as it was made: read-only there too.
            let e = fs::OpenOptions::new()
                .write(true)
                .open(seen.join(f))
                .unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{f} in the view: {e}");
        }
        // Read-only on the board; written where the slice's processes get it.
        let e = fs::OpenOptions::new()
            .write(true)
            .open(place.join(board::CLAIMS))
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
        assert!(!place.join("more").exists() && fs::write(place.join("more"), b"x").is_err());
        // Past its end, its claims fill the slice's own space and no more.
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&made.claims)
            .unwrap();
        let mib = vec![0u8; 1 << 20];
        let written = (0..64).take_while(|_| f.write_all(&mib).is_ok()).count() as u64;
        assert!(written < slice_space() >> 20, "{written} MiB written");
        drop(f);
        root.remove("c", &[], &unmake);
        assert!(!place.exists());
        // Out of the view too.
        assert!(!seen.exists());
        detach(view.path());
        assert!(!mount_root(node.path()).unwrap());
    }
}
