//! The host side of each container's slice, under the state root (`/run/cuslice` by default):
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
//!     slice/                        (0755)   mounted read-only at /run/cuslice/slice
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
//!                                            container, the only writable file it shares
//! ```
//!
//! A record whose init process is gone (a container that vanished without `poststop`) is swept
//! by the next hook that runs. A directory without a record is a hook that died half-way; since
//! every hook holds the lock from start to end, it is garbage too.

use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cuslice_policy::grant::Grant;
use cuslice_state::board;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::rootfs::Rootfs;

pub const DEFAULT_ROOT: &str = "/run/cuslice";
/// The skeleton's entries, parents first: (path in it, whether a directory).
const SKELETON: [(&str, bool); 7] = [
    ("", true),
    ("slice", true),
    ("node", true),
    ("agent", true),
    ("lib", true),
    ("lib/libcuslice.so", false),
    ("lib/libcuslice_core.so", false),
];
const RECORD: &str = "record.json";
/// In a container's directory: the path of its place on the compute board.
const BOARD: &str = "board";

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
    /// What people call the container, where the engine says (see `settings::display_name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Where the container belongs in Kubernetes, where the engine says (see
    /// `settings::kubernetes`), with the DRA claim it uses where the DRA plugin's container
    /// index names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<crate::settings::Kubernetes>,
    /// Mount points the hook made in the rootfs (relative to it, outermost first); removed when
    /// no live container uses the rootfs any more.
    pub created: Vec<String>,
}

pub struct Root {
    pub path: PathBuf,
}

/// Holds the state root's lock until dropped.
pub struct Locked {
    _lock: Flock<fs::File>,
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

/// Writes `path` through a temporary file renamed over it, so that a reader (the agent, `cuslice
/// status`, a hook of another container) sees the old file or the new one, never a part. No
/// fsync: this is per-boot runtime state under /run (tmpfs on a usual host, where fsync does
/// nothing), and on a host whose /run is a disk file system an fsync per file cost about a
/// millisecond of every container's creation to keep files that a reboot makes
/// meaningless anyway (their containers are gone; the next hook sweeps them).
fn write_atomic(path: &Path, text: &[u8], mode: u32) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    // A leftover of a hook that died with this pid would keep its own mode: start afresh.
    let _ = fs::remove_file(&tmp);
    let result = write_new(&tmp, text, mode).and_then(|()| fs::rename(&tmp, path));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The hook's umask, read once (from /proc/self/status, which reports it without changing it;
/// the umask(2) call would set it, process-wide). Unknown reads as "narrows everything".
fn umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                let line = s.lines().find_map(|l| l.strip_prefix("Umask:"))?;
                u32::from_str_radix(line.trim(), 8).ok()
            })
            .unwrap_or(0o777)
    })
}

/// Sets `path`'s mode to `mode` where the umask narrowed it at creation. Under the usual umask
/// (022) the paths the hook makes come out right at once, and every chmod saved is one
/// metadata update fewer on the container's creation path.
fn fix_mode(path: &Path, mode: u32) -> io::Result<()> {
    if umask() & mode != 0 {
        fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Makes the directory `path` (its parent must exist) with `mode`.
fn make_dir(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new().mode(mode).create(path)?;
    fix_mode(path, mode)
}

/// Makes the new file `path` holding `text`, with `mode`.
pub(crate) fn write_new(path: &Path, text: &[u8], mode: u32) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    f.write_all(text)?;
    fix_mode(path, mode)
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
        let lock = Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))?;
        Ok(Locked { _lock: lock })
    }

    pub fn read_record(&self, id: &str) -> Option<Record> {
        let text = fs::read_to_string(self.dir(id).join(RECORD)).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub fn write_record(&self, r: &Record) -> io::Result<()> {
        let text = serde_json::to_vec_pretty(r).map_err(io::Error::other)?;
        write_atomic(&self.dir(&r.id).join(RECORD), &text, 0o644)
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
        for (rel, dir) in SKELETON {
            let path = skel.join(rel);
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
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        let mnt = self.mnt(id);
        // Each path is made once with its final mode, and written once: nothing else can see
        // the directory before its record exists (a directory without one is a hook's half-made
        // work, see `sweep`), so no temporary files and renames are needed until the record.
        // Every path here is made again and deleted again for each container, which is why
        // the mount points all containers share live in the skeleton instead.
        let made = (|| {
            make_dir(&dir, 0o755)?;
            make_dir(&mnt, 0o755)?;
            make_dir(&mnt.join("slice"), 0o755)?;
            write_new(&mnt.join("slice/config"), config.as_bytes(), 0o644)?;
            // ld.so.preload is written when the mounts are made, from the image's own file
            // (inject.rs). Every process in the container updates the ledger and its claims,
            // whatever user it runs as.
            let slice =
                cuslice_state::ledger::Ledger::create_file(&mnt.join("slice/ledger"), 0o666)
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
            let claims = place.join(board::CLAIMS);
            board::create_claims(&claims, slice, 0o666)?;
            Ok((slice, claims))
        })();
        match made {
            Ok((slice, claims)) => Ok(Made { mnt, slice, claims }),
            Err(e) => {
                self.remove_place(id);
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
    pub fn remove(&self, id: &str, live: &[Record]) {
        self.remove_mount_points(id, live);
        self.remove_place(id);
        let _ = fs::remove_dir_all(self.dir(id));
    }

    /// `remove`, except that the container's directory is moved into `trash` (one rename)
    /// rather than deleted file by file: `poststop` answers at once and deletes it after
    /// (`empty_trash`). Where the state root is on a disk file system, deleting the files
    /// and directories of a slice took most of `poststop`'s time (1 to 30 ms on a busy disk,
    /// measured). The rootfs's mount points still go at once: the bundle is the engine's.
    /// Requires the lock.
    pub fn discard(&self, id: &str, live: &[Record]) {
        self.remove_mount_points(id, live);
        // At once: the other slices stop counting its claims.
        self.remove_place(id);
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
            let _ = fs::remove_dir_all(e.path());
        }
    }

    fn remove_mount_points(&self, id: &str, live: &[Record]) {
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
                None => {
                    if let Ok(rootfs) = Rootfs::open(&r.rootfs) {
                        for rel in r.created.iter().rev() {
                            rootfs.remove_if_empty(rel);
                        }
                    }
                }
            }
        }
    }

    /// Removes the state of every container whose init process is gone, and any directory a
    /// dead hook left half made. Requires the lock. Returns the ids it removed.
    pub fn sweep(&self) -> Vec<String> {
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
                Some(r) if start_time(r.pid) == Some(r.start) => live.push(r),
                _ => dead.push(id),
            }
        }
        for id in &dead {
            self.remove(id, &live);
        }
        dead
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

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
                .map(|(rel, _)| {
                    let m = fs::symlink_metadata(skel.join(rel)).unwrap();
                    (rel.to_string(), m.is_dir())
                })
                .collect()
        };
        let want: Vec<(String, bool)> = SKELETON.iter().map(|(r, d)| (r.to_string(), *d)).collect();
        assert_eq!(kinds(&skel), want);
        // The mount points inject.rs mounts the interposer on.
        assert!(skel.join("lib").join(crate::hook::CORE_FILE).is_file());
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
        root.sweep();
        root.empty_trash();
        assert!(skel.join("node").is_dir());
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
            })
            .unwrap();
        }
        let half = make(&root, "half", "", node.path());
        let mut gone = root.sweep();
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
        root.remove("live", &[]);
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
        })
        .unwrap();
        root.discard("c", &[]);
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
