//! The core requests `cuslice set` has set on this node, and the lock that makes its check of a
//! new request and the writing of it one step.
//!
//! A request `cuslice set` writes reaches the compute board only at the slice's meters' next
//! period, when they post it as the slice's claim. Checked against the claims alone, two changes
//! made within that time (at once, or one just after the other) would each see the other's old
//! request, and together take a device past 100%. So every `cuslice set --core-request` takes
//! this lock for its check and its writes, and records here each request it set (slice, device
//! UUID); a check counts another slice's request as the larger of what it claims and what was set
//! for it, each within its grant, and only while it claims the device at all (a slice whose
//! processes are all gone claims nothing).
//!
//! The file is beside the node directory, not in it (`/dev/shm/cuslice.requests` for
//! `/dev/shm/cuslice`): the node directory is mounted into every container, and nothing a
//! container can open may hold up the node's tools. Like the node directory, which standalone
//! slices of different users share, it is writable by every user of the node. A `cuslice set`
//! that cannot have the lock within `WAIT` says so in one line and changes nothing.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cuslice_state::board::{self, ClaimOn};
use cuslice_state::uuid_string;

/// How long `cuslice set` waits for another one to finish.
pub const WAIT: Duration = Duration::from_secs(10);

/// The most of the record that is read: far more than any node's slices take (about 60 bytes a
/// device each). A larger record (any account of the node can write it) is started afresh, as
/// one cut short is.
const MOST: u64 = 1 << 20;

/// The record: slice id (16 hex digits) -> device UUID -> the request set there (ppm).
type Set = BTreeMap<String, BTreeMap<String, u32>>;

/// The record, locked: the lock is held until this is dropped.
pub struct Requests {
    path: PathBuf,
    file: File,
    set: Set,
}

/// Where the record of node directory `node` is.
pub fn path(node: &Path) -> PathBuf {
    match node.file_name() {
        Some(name) => node.with_file_name(format!("{}.requests", name.to_string_lossy())),
        None => node.join(".requests"),
    }
}

impl Requests {
    /// Takes the lock (waiting up to `WAIT` for another `cuslice set`) and reads the record.
    /// Err: one line.
    pub fn lock(node: &Path) -> Result<Requests, String> {
        let path = path(node);
        let name = path.display().to_string();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| format!("{name}: {e}"))?;
        let meta = file.metadata().map_err(|e| format!("{name}: {e}"))?;
        if !meta.is_file() {
            return Err(format!("{name} is not a regular file; remove it"));
        }
        // The umask may have narrowed the mode of a file this process made.
        // SAFETY: geteuid(2) has no preconditions.
        if meta.uid() == unsafe { libc::geteuid() } && meta.mode() & 0o777 != 0o666 {
            let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
        }
        let deadline = Instant::now() + WAIT;
        loop {
            // SAFETY: flock(2) on a descriptor `file` owns and keeps open for the call.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Some(libc::EWOULDBLOCK) => {
                    return Err(format!(
                        "another cuslice set has held {name} for {} s, so the core requests on \
                         this node cannot be checked; nothing was changed; try again once it is \
                         done",
                        WAIT.as_secs()
                    ));
                }
                _ => return Err(format!("{name}: {e}")),
            }
        }
        let mut r = Requests {
            path,
            file,
            set: Set::new(),
        };
        let mut text = String::new();
        // A record that cannot be read or parsed (cut short by a killed `cuslice set`) is
        // started afresh: the claims on the board stay, and they are what a check counts first.
        if (&r.file)
            .take(MOST + 1)
            .read_to_string(&mut text)
            .is_ok_and(|n| n as u64 <= MOST)
        {
            r.set = serde_json::from_str(&text).unwrap_or_default();
        }
        Ok(r)
    }

    /// What slices other than `except` request on device `uuid` (ppm): each one that claims it
    /// now counts the larger of its claim and the request set for it here, within its grant.
    pub fn taken(&self, node: &Path, uuid: &[u8; 16], except: u64) -> u32 {
        let claims = board::claims_on(node, uuid, except);
        taken(&claims, |slice| {
            self.set
                .get(&format!("{slice:016x}"))
                .and_then(|d| d.get(&uuid_string(uuid)))
                .copied()
        })
    }

    /// Records `request` (ppm) as set for slice `slice` on device `uuid`.
    pub fn note(&mut self, slice: u64, uuid: &[u8; 16], request: u32) {
        self.set
            .entry(format!("{slice:016x}"))
            .or_default()
            .insert(uuid_string(uuid), request);
    }

    /// Writes the record, without the slices whose place on the board under `node` is gone.
    pub fn save(mut self, node: &Path) -> Result<(), String> {
        self.set.retain(|slice, _| {
            u64::from_str_radix(slice, 16).is_ok_and(|id| board::slice_dir(node, id).is_dir())
        });
        let text = serde_json::to_vec_pretty(&self.set).map_err(|e| e.to_string())?;
        let io = |e: io::Error| format!("{}: {e}", self.path.display());
        self.file.set_len(0).map_err(io)?;
        self.file.rewind().map_err(io)?;
        self.file.write_all(&text).map_err(io)?;
        Ok(())
    }
}

/// The sum over `claims` of each slice's request: the larger of its claim and what `set_for`
/// says was set for it, the latter within its grant.
pub fn taken(claims: &[ClaimOn], set_for: impl Fn(u64) -> Option<u32>) -> u32 {
    claims.iter().fold(0u32, |sum, c| {
        let set = set_for(c.slice).map_or(0, |r| r.min(c.grant.request));
        sum.saturating_add(c.request.max(set))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuslice_policy::grant::{Grant, Origin};
    use cuslice_policy::priority::Priority;

    fn claim(slice: u64, request: u32, granted: u32) -> ClaimOn {
        ClaimOn {
            slice,
            request,
            grant: Grant {
                request: granted,
                limit: 1_000_000,
                priority: Priority::Normal,
                memory: None,
                freezes: false,
                origin: Origin::Standalone,
            },
        }
    }

    #[test]
    fn a_request_set_counts_before_it_is_claimed_and_within_its_grant() {
        let claims = [
            claim(1, 0, 600_000),
            claim(2, 300_000, 300_000),
            claim(3, 0, 200_000),
        ];
        // Nothing set: the claims.
        assert_eq!(taken(&claims, |_| None), 300_000);
        // Slice 1 was set to 60% and has not claimed it yet; slice 3 was set to 50% but its
        // grant says 20%; slice 2 was lowered to 10% and still claims 30%.
        let set = |s: u64| match s {
            1 => Some(600_000),
            2 => Some(100_000),
            3 => Some(500_000),
            _ => None,
        };
        assert_eq!(taken(&claims, set), 600_000 + 300_000 + 200_000);
    }

    #[test]
    fn a_record_larger_than_any_node_needs_is_started_afresh() {
        let tmp = tempfile::tempdir().unwrap();
        let node = tmp.path().join("cuslice");
        let uuid = [7u8; 16];
        // A request of the whole device recorded for slice 1, then 2 MiB more of the record.
        let write = |pad: usize| {
            let text = format!(
                r#"{{"0000000000000001":{{"{}":1000000}},"{}":{{}}}}"#,
                uuid_string(&uuid),
                "f".repeat(pad)
            );
            std::fs::write(path(&node), text).unwrap();
        };
        let set_for_1 = |r: &Requests| {
            r.set
                .get("0000000000000001")
                .and_then(|d| d.get(&uuid_string(&uuid)))
                .copied()
        };
        write(16);
        assert_eq!(set_for_1(&Requests::lock(&node).unwrap()), Some(1_000_000));
        write(2 << 20);
        assert_eq!(set_for_1(&Requests::lock(&node).unwrap()), None);
    }

    #[test]
    fn the_record_is_beside_the_node_directory() {
        assert_eq!(
            path(Path::new("/dev/shm/cuslice")),
            Path::new("/dev/shm/cuslice.requests")
        );
        assert_eq!(
            path(Path::new("/dev/shm/cuslice/")),
            Path::new("/dev/shm/cuslice.requests")
        );
    }

    #[test]
    fn the_record_round_trips_and_forgets_slices_that_are_gone() {
        let parent = tempfile::tempdir().unwrap();
        let node = parent.path().join("node");
        std::fs::create_dir(&node).unwrap();
        std::fs::create_dir(board::slice_dir(&node, 7)).unwrap();
        let mut r = Requests::lock(&node).unwrap();
        r.note(7, &[1; 16], 400_000);
        r.note(8, &[1; 16], 500_000);
        r.save(&node).unwrap();
        let r = Requests::lock(&node).unwrap();
        assert_eq!(r.set.len(), 1, "{:?}", r.set);
        assert_eq!(r.set["0000000000000007"][&uuid_string(&[1; 16])], 400_000);
        // Held: a second one waits (here: it is only tried, from another open file).
        let other = File::open(path(&node)).unwrap();
        // SAFETY: flock(2) on a descriptor `other` owns.
        let got = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(got, -1, "the lock was not held");
        drop(r);
        // SAFETY: as above.
        let got = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(got, 0, "the lock was not given back");
    }
}
