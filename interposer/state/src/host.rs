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
//!       ledger                      (0666)   the slice's memory ledger (the one writable file)
//!     ld.so.preload                 (0644)   bind-mounted read-only at /etc/ld.so.preload
//!
//! <node dir>/                                the node's compute board (`--node-dir`, default
//!                                            /dev/shm/cuslice), mounted read-only at
//!                                            /run/cuslice/node in every container
//!   <slice id>/                     (0755)   the container's place on it (`cuslice_state::board`)
//!     grant                         (0644)   what the container may claim (from its settings)
//!     claims                        (0666)   what it claims and uses: mounted read-write at
//!                                            /run/cuslice/node/<slice id>/claims in its own
//!                                            container
//!     turns                         (0666)   its turn on each device (`board::turns`), mounted
//!                                            read-write beside its claims: with them, the only
//!                                            writable files it shares
//! ```
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

/// How much of the host's memory a container's own directory `mnt/slice` (its config and its
/// ledger, the one file of it the container writes) may take: it is a tmpfs of its own this
/// large, the ledger's size rounded up to a MiB and a MiB more. A tenant that writes past its
/// ledger's end, or reserves space past it, fills its own space and nobody else's: the state
/// root's file system, which the agent and every new container's start use, is not touched.
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

/// Detaches whatever is mounted at `dir` (a container's `mnt/slice`), if anything: before its
/// directory is deleted or moved.
fn unmount_space(dir: &Path) {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let Ok(target) = CString::new(dir.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: a NUL-terminated path that outlives the call. Not a mount point (a container of a
    // release before the slice's own space), or gone: EINVAL or ENOENT, and nothing to do.
    unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
}

/// What `Root::create` made for a container.
pub struct Made {
    /// `containers/<id>/mnt`.
    pub mnt: PathBuf,
    /// The slice's id (its ledger's), which names its place on the compute board.
    pub slice: u64,
    /// Its claims file on the board (mounted read-write in the container).
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

/// Holds the state root's lock until dropped (closing the file releases the flock).
pub struct Locked {
    _file: fs::File,
}

/// The start time of process `pid` (field 22 of /proc/PID/stat), or `None` if it is gone.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
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
    /// `grant`, replacing any leftover of the same id. Requires the lock.
    pub fn create(&self, id: &str, config: &str, node: &Path, grant: &Grant) -> io::Result<Made> {
        let dir = self.dir(id);
        let mnt = self.mnt(id);
        if dir.exists() {
            unmount_space(&mnt.join("slice"));
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
            // ld.so.preload is written when the mounts are made, from the image's own file
            // (the hook's inject.rs). Every process in the container updates the ledger and its claims,
            // whatever user it runs as.
            let slice = crate::ledger::Ledger::create_file(&mnt.join("slice/ledger"), 0o666)
                .map_err(|e| io::Error::other(e.to_string()))?;
            // Where the place will be, before it is made: whoever removes the directory (this
            // container's poststop, or a sweep of a hook that died half-way) removes it too.
            let place = board::slice_dir(node, slice);
            write_new(
                &dir.join(BOARD),
                place.as_os_str().as_encoded_bytes(),
                0o600,
            )?;
            make_dir(&place, 0o755)?;
            write_new(&place.join(board::GRANT), grant.format().as_bytes(), 0o644)?;
            // The turns first: a slice that finds the claims finds the turns beside them.
            board::turns::create(&place.join(board::turns::FILE), slice, 0o666)?;
            let claims = place.join(board::CLAIMS);
            board::create_claims(&claims, slice, 0o666)?;
            Ok((slice, claims))
        })();
        match made {
            Ok((slice, claims)) => Ok(Made { mnt, slice, claims }),
            Err(e) => {
                self.remove_place(id);
                unmount_space(&mnt.join("slice"));
                let _ = fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// Takes container `id`'s place off the compute board.
    fn remove_place(&self, id: &str) {
        if let Ok(path) = fs::read(self.dir(id).join(BOARD)) {
            let path = PathBuf::from(std::ffi::OsString::from_vec(path));
            board::remove_place(&path);
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
        unmount_space(&self.mnt(id).join("slice"));
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
        unmount_space(&self.mnt(id).join("slice"));
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
            unmount_space(&e.path().join("mnt/slice"));
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
            origin: cuslice_policy::grant::Origin::Hook {
                id: id.to_string(),
                root: root.path.clone(),
            },
        };
        root.create(id, config, node, &grant).unwrap()
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
            let made = make(&root, id, "CUSLICE_MEMORY_LIMIT=1GiB\n", node.path());
            places.push(made.claims.parent().unwrap().to_path_buf());
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
        let half = make(&root, "half", "", node.path());
        let mut gone = root.sweep(&unmake);
        gone.sort();
        assert_eq!(gone, ["dead", "half"]);
        assert!(root.dir("live").join("mnt/slice/ledger").exists());
        // Their places on the compute board went with them; the live one's stays.
        assert!(places[0].join("claims").is_file());
        assert!(places[0].join("grant").is_file());
        assert!(!places[1].exists());
        assert!(!half.claims.parent().unwrap().exists());
        // The live container shares the rootfs: it inherits the dead one's mount point.
        assert!(rootfs.path().join("made").exists());
        assert_eq!(root.read_record("live").unwrap().created, ["made", "made"]);
        root.remove("live", &[], &unmake);
        assert!(!rootfs.path().join("made").exists());
        assert!(!root.dir("live").exists());
        assert!(!places[0].exists());
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
        let made = make(&root, "c", "CUSLICE_MEMORY_LIMIT=1GiB\n", node.path());
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
        assert!(!made.claims.parent().unwrap().exists());
        assert!(!rootfs.path().join("made").exists());
        assert!(root.records().is_empty());
        assert_eq!(std::fs::read_dir(root.trash()).unwrap().count(), 1);
        root.empty_trash();
        assert_eq!(std::fs::read_dir(root.trash()).unwrap().count(), 0);
    }
}
