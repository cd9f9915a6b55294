//! What the driver saw each container slice use on each device: the node agent's evidence, read
//! by every slice's processes beside the compute board. A claim on the board is the slice's own
//! word; this file is not: the agent writes it from the driver's utilisation samples into its own
//! directory (`<state root>/agent/seen`, mounted read-only at `/run/cuslice/agent` in every
//! container), where no container can write.
//!
//! ```text
//! cuslice-seen 1
//! device GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
//! <board place, 16 hex digits> <ppm of the device's time the driver saw it use>
//! ...
//! ```
//!
//! A device is listed only where the driver gives per-process samples (one a period, or one per
//! process); under it, every container slice the agent knows that has a place on the board, with
//! what it used over the agent's window (`WINDOW_NS`). A slice not listed under a listed device
//! is one the agent does not know: a standalone slice (whose claims count as they are), or a
//! container newer than its last look (passed over until it is listed).
//! The file is rewritten every `EVERY_NS` (or, with the same figures, only marked fresh:
//! `touch`); older than `FRESH_NS` it says nothing (the agent stopped).

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use cuslice_policy::share::FULL;

/// The file's name in the agent's directory.
pub const FILE: &str = "seen";
/// The file's format (its first line names it).
pub const VERSION: u32 = 1;
/// Its first line.
const HEADER: &str = "cuslice-seen 1";
/// The span of samples each figure covers.
pub const WINDOW_NS: u64 = 3_000_000_000;
/// How often the agent rewrites the file.
pub const EVERY_NS: u64 = 500_000_000;
/// A file older than this says nothing: the agent is not running.
pub const FRESH_NS: u64 = 3_000_000_000;
/// The most of the file that is read.
const MAX_BYTES: u64 = 256 * 1024;

/// The agent's evidence: per device UUID, per board place, what the driver saw it use (ppm).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    pub devices: BTreeMap<String, BTreeMap<u64, u32>>,
}

impl Seen {
    /// What the driver saw slice `place` use on device `uuid` (ppm): None where the agent
    /// says nothing of it (the device gives no per-process samples, or the agent does not know
    /// the slice).
    pub fn used(&self, uuid: &str, place: u64) -> Option<u32> {
        self.devices.get(uuid)?.get(&place).copied()
    }

    /// Whether the agent has figures for device `uuid`.
    pub fn covers(&self, uuid: &str) -> bool {
        self.devices.contains_key(uuid)
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut out = format!("{HEADER}\n");
        for (uuid, places) in &self.devices {
            out.push_str(&format!("device {uuid}\n"));
            for (place, ppm) in places {
                out.push_str(&format!("{place:016x} {ppm}\n"));
            }
        }
        out
    }

    /// The text of a file, or None if it is not one the agent wrote (a bad header). Lines that
    /// do not parse are passed over; figures are cut to the whole device.
    pub fn parse(text: &str) -> Option<Seen> {
        let mut lines = text.lines();
        if lines.next()? != HEADER {
            return None;
        }
        let mut seen = Seen::default();
        let mut device: Option<&mut BTreeMap<u64, u32>> = None;
        for line in lines {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("device"), Some(uuid), None) => {
                    device = Some(seen.devices.entry(uuid.to_string()).or_default());
                }
                (Some(place), Some(ppm), None) if place.len() == 16 => {
                    if let (Some(d), Ok(place), Ok(ppm)) = (
                        device.as_deref_mut(),
                        u64::from_str_radix(place, 16),
                        ppm.parse::<u32>(),
                    ) {
                        d.insert(place, ppm.min(FULL));
                    }
                }
                _ => {}
            }
        }
        Some(seen)
    }
}

/// The agent's evidence in directory `dir`, if a fresh one is there that the reader can trust:
/// a regular file (not a link), not writable by group or others, not the reader's own (unless
/// the reader is root, as the agent is), written less than `FRESH_NS` ago.
pub fn read(dir: &Path) -> Option<Seen> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(dir.join(FILE))
        .ok()?;
    let m = f.metadata().ok()?;
    // SAFETY: geteuid takes no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if !m.is_file() || m.mode() & 0o022 != 0 || (m.uid() == euid && euid != 0) {
        return None;
    }
    let age = SystemTime::now()
        .duration_since(m.modified().ok()?)
        .unwrap_or(Duration::ZERO);
    if age > Duration::from_nanos(FRESH_NS) {
        return None;
    }
    let mut text = String::new();
    f.take(MAX_BYTES).read_to_string(&mut text).ok()?;
    Seen::parse(&text)
}

/// Reads the file at most this often per process.
const READ_EVERY_NS: u64 = 250_000_000;

/// The agent's evidence as a process last read it, read again when older than `READ_EVERY_NS`.
pub struct Cached {
    read_ns: Option<u64>,
    seen: Option<std::sync::Arc<Seen>>,
}

impl Cached {
    pub const fn new() -> Cached {
        Cached {
            read_ns: None,
            seen: None,
        }
    }

    /// The evidence in `dir` at `now` (monotonic ns).
    pub fn get(&mut self, dir: &Path, now: u64) -> Option<std::sync::Arc<Seen>> {
        if self
            .read_ns
            .is_none_or(|t| now.saturating_sub(t) >= READ_EVERY_NS)
        {
            self.seen = read(dir).map(std::sync::Arc::new);
            self.read_ns = Some(now);
        }
        self.seen.clone()
    }
}

impl Default for Cached {
    fn default() -> Self {
        Cached::new()
    }
}

/// The file's text written with the agent's one atomic write (0644).
pub fn write(dir: &Path, seen: &Seen) -> std::io::Result<()> {
    crate::fsio::write_atomic(
        &dir.join(FILE),
        seen.render().as_bytes(),
        0o644,
        crate::fsio::Durability::None,
    )
}

/// Marks the file in `dir` written now without writing it (its figures are what they were):
/// its modification time is what readers judge its freshness by. An error where it is not there;
/// the caller then writes it. Only the agent writes this directory.
pub fn touch(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.join(FILE).as_os_str().as_bytes())
        .map_err(std::io::Error::other)?;
    let now = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_NOW,
    };
    let times = [now, now];
    // SAFETY: `path` is a NUL-terminated string and `times` two timespecs, both alive for the
    // call; the call writes nothing of ours.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            path.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Takes the file away (the agent stops): its figures would go stale anyway.
pub fn remove(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(FILE));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::unix::fs::PermissionsExt;

    fn sample() -> Seen {
        let mut s = Seen::default();
        let d = s
            .devices
            .entry("GPU-00000000-0000-0000-0000-000000000001".into())
            .or_default();
        d.insert(0x0123_4567_89ab_cdef, 350_000);
        d.insert(7, 0);
        s.devices
            .entry("GPU-00000000-0000-0000-0000-000000000002".into())
            .or_default();
        s
    }

    #[test]
    fn the_header_names_the_version() {
        assert_eq!(HEADER, format!("cuslice-seen {VERSION}"));
    }

    #[test]
    fn the_text_reads_back_as_written() {
        let s = sample();
        assert_eq!(Seen::parse(&s.render()), Some(s.clone()));
        let uuid = "GPU-00000000-0000-0000-0000-000000000001";
        assert_eq!(s.used(uuid, 0x0123_4567_89ab_cdef), Some(350_000));
        assert_eq!(s.used(uuid, 7), Some(0));
        assert_eq!(s.used(uuid, 8), None);
        assert!(s.covers("GPU-00000000-0000-0000-0000-000000000002"));
        assert!(!s.covers("GPU-00000000-0000-0000-0000-000000000003"));
    }

    #[test]
    fn garbage_says_nothing_and_bad_lines_are_passed_over() {
        assert_eq!(Seen::parse(""), None);
        assert_eq!(Seen::parse("cuslice-seen 2\n"), None);
        let s = Seen::parse(
            "cuslice-seen 1\n0000000000000001 5\ndevice GPU-a\n000000000000000x 5\n\
             0000000000000002 99999999999\n0000000000000003 4000000\n",
        )
        .unwrap();
        // A place before any device, a bad id and a figure past u32 are passed over; a figure
        // past the device is cut to it.
        assert_eq!(s.devices["GPU-a"].len(), 1);
        assert_eq!(s.used("GPU-a", 3), Some(FULL));
    }

    #[test]
    fn only_a_fresh_file_nobody_else_could_write_is_read() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), None);
        write(dir.path(), &sample()).unwrap();
        let path = dir.path().join(FILE);
        // SAFETY: geteuid takes no arguments and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        assert_eq!(
            read(dir.path()).is_some(),
            root,
            "a file of the reader's own"
        );
        if root {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
            assert_eq!(read(dir.path()), None, "a file others may write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let old = SystemTime::now() - Duration::from_secs(10);
            File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(old)
                .unwrap();
            assert_eq!(read(dir.path()), None, "a stale file");
            remove(dir.path());
            std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
            assert_eq!(read(dir.path()), None, "a link");
        }
    }

    #[test]
    fn a_touched_file_is_fresh_again_with_the_same_figures() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        assert!(touch(dir.path()).is_err(), "no file to touch");
        write(dir.path(), &sample()).unwrap();
        let path = dir.path().join(FILE);
        let old = SystemTime::now() - Duration::from_secs(10);
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let ino = std::fs::metadata(&path).unwrap().ino();
        touch(dir.path()).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(m.ino(), ino, "the same file, not written again");
        let age = SystemTime::now()
            .duration_since(m.modified().unwrap())
            .unwrap_or(Duration::ZERO);
        assert!(age < Duration::from_secs(1), "{age:?} old");
        // SAFETY: geteuid takes no arguments and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            assert_eq!(read(dir.path()), Some(sample()));
        }
    }
}
