//! The node's compute board: what each slice claims on each device and what it uses there, from
//! which every process works out its own slice's allotment (`cuslice_policy::share`). One
//! directory per slice under the node directory (`$CUSLICE_NODE_DIR`, the hook's `--node-dir`;
//! by default `/dev/shm/cuslice`):
//!
//! ```text
//! <node dir>/<slice id, 16 hex digits>/
//!   grant    what the node granted the slice: the most it may claim (text, `cuslice_policy::grant`);
//!            a container's is written by the hook and `cuslice set` and is read-only to every
//!            container; a standalone slice's first process writes its own
//!   claims   the slice's claims and use on each device (fixed size, binary): written by the
//!            slice's own processes alone. A container's is mounted read-write into it, with its
//!            turns; the directory itself is read-only there.
//!   turns    the slice's turn on each device, and what its processes share within one (`turns`)
//! ```
//!
//! So no slice can write anything another slice reads, and what a slice says is bounded by what
//! it was granted. Reading another slice's claims never trusts them: they are read with `pread`
//! into a copy (never mapped: a slice may truncate its own file, and a mapping of it would fault),
//! nothing of theirs is ever locked or waited for, a FIFO or link where a file belongs is passed
//! over, a claim nobody refreshed for `STALE_NS` counts as gone, and every figure is cut to the
//! grant. A slice that corrupts, truncates, locks or floods its own files harms its own processes
//! alone.
//!
//! Within a slice, the claims file has one entry per device (the device's index in the slice's
//! ledger). Each process of the slice refreshes the entry every meter period with the slice's
//! request, limit, priority and usage, and posts the slice's turn there (`cuslice_policy::turn`:
//! idle, waiting since when, or holding until when), which the other slices on the device read
//! while they wait for it. The entry's `Gate` is how the slice's own processes share a turn.
//!
//! Admission: a slice's first process on a device claims its request there only if the requests
//! of the slices on the device leave room. With no lock shared between slices, it posts its claim
//! as pending, then reads everybody's (a full fence in between): of two slices that post at once,
//! at least one sees the other. A slice that sees only claims already held that leave no room is
//! refused; one that sees no room only because of other pending claims withdraws, waits a
//! random moment and tries again.
//!
//! One concern, kept in one file: the claims file's layout and every operation on it (create,
//! open, admit, post, read the others, leave, sweep), so that what the board trusts and what it
//! never does to another slice's file can be checked in one place.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use cuslice_policy::grant::{Grant, Origin};
use cuslice_policy::priority::Priority;
use cuslice_policy::share::{Demand, FULL};
use cuslice_policy::turn::{Rival, Turn};

use crate::ledger::MAX_DEVICES;

pub mod turns;
pub use turns::Gate;

pub const DEFAULT_DIR: &str = "/dev/shm/cuslice";
pub const CLAIMS: &str = "claims";
pub const GRANT: &str = "grant";
pub const MAGIC: [u8; 8] = *b"CUSLCLMS";
pub const VERSION: u32 = 1;
/// A claim that no process of its slice refreshed for this long is gone: its processes died.
pub const STALE_NS: u64 = 3_000_000_000;
/// A time another process posts this far ahead of the reader's clock is believed; further is not
/// (an honest process's clock is the reader's: CLOCK_MONOTONIC is the machine's).
pub const AHEAD_NS: u64 = 1_000_000_000;
/// A want of memory (`Board::want_memory`) further ahead than this counts for nothing.
pub const WANT_AHEAD_NS: u64 = 2_000_000_000;
/// A standalone slice whose processes all died leaves its directory behind; the next standalone
/// process (or the hook's sweep) removes it once its claims are this old.
pub const LEFTOVER_NS: u64 = 60_000_000_000;
/// A grant is read again at most this often.
const GRANT_EVERY_NS: u64 = 1_000_000_000;
/// The most of a grant file that is read.
const GRANT_MAX: usize = 4096;
/// Attempts to post a claim while other slices post theirs.
const ATTEMPTS: u32 = 40;

const FREE: u32 = 0;
const PENDING: u32 = 1;
const HELD: u32 = 2;

#[repr(C)]
struct Header {
    magic: [u8; 8],
    version: u32,
    size: u32,
    slice: u64,
    /// When a process of the slice last refreshed any entry (CLOCK_MONOTONIC ns).
    beat_ns: AtomicU64,
    /// Memory the slice waits for on a device that has no room (`want_memory`): until when the
    /// want holds (CLOCK_MONOTONIC ns, 0: none), how many bytes, and the device's UUID as two
    /// big-endian words. These were reserved words (zero) in earlier releases, which ignore them.
    wanted_until: AtomicU64,
    wanted_bytes: AtomicU64,
    wanted_uuid: [AtomicU64; 2],
}

/// The slice's claim on one device.
#[repr(C)]
struct Entry {
    /// The device's UUID, as two big-endian words.
    uuid: [AtomicU64; 2],
    /// FREE, PENDING (being admitted) or HELD.
    state: AtomicU32,
    /// Core request and limit (ppm).
    request: AtomicU32,
    limit: AtomicU32,
    /// `Priority::code`.
    priority: AtomicU32,
    /// The slice's share of the device over its processes' last periods (ppm).
    usage: AtomicU32,
    /// Written 0 by this release, read by the previous one (the time its launches were in
    /// flight, by which its meter apportioned periods the driver reported for the whole device).
    launched: AtomicU32,
    /// When a process of the slice last refreshed the entry (CLOCK_MONOTONIC ns).
    beat_ns: AtomicU64,
    /// When the slice last launched work on the device, or wanted to.
    active_ns: AtomicU64,
    /// The slice counts as wanting more than it uses until then.
    hungry_until: AtomicU64,
    /// Written 0 by this release, read by the previous one (when high-priority work it launched
    /// was expected done: slices below it held their launches until then).
    high_until: AtomicU64,
}

#[repr(C)]
struct Claims {
    header: Header,
    entries: [Entry; MAX_DEVICES],
}

/// The size of a claims file.
pub const SIZE: usize = std::mem::size_of::<Claims>();

fn words(u: &[u8; 16]) -> (u64, u64) {
    let (a, b) = u.split_at(8);
    let w = |x: &[u8]| x.iter().fold(0u64, |acc, b| acc << 8 | *b as u64);
    (w(a), w(b))
}

impl Entry {
    fn is(&self, u: (u64, u64)) -> bool {
        self.uuid[0].load(Ordering::Relaxed) == u.0 && self.uuid[1].load(Ordering::Relaxed) == u.1
    }
}

/// A slice's claim on device `w` as others read it at `now`: the first entry of its claims file
/// naming the device that a process of it refreshed within `STALE_NS`, with its index. An honest
/// slice has one entry per device; a second naming the same device counts for nothing, so one
/// claim is counted once by every reader, whatever the slice wrote.
fn entry_on(c: &Claims, w: (u64, u64), now: u64) -> Option<(usize, &Entry)> {
    c.entries
        .iter()
        .enumerate()
        .find(|(_, e)| e.is(w) && recent(e.beat_ns.load(Ordering::Relaxed), now, STALE_NS))
}

/// Whether a time another process posted is recent at `now`: not older than `age`, and not
/// further ahead than `AHEAD_NS`.
fn recent(t: u64, now: u64, age: u64) -> bool {
    t != 0 && t.saturating_add(age) >= now && t <= now.saturating_add(AHEAD_NS)
}

/// The directory of slice `slice` under the node directory.
pub fn slice_dir(node: &Path, slice: u64) -> PathBuf {
    node.join(format!("{slice:016x}"))
}

#[derive(Debug, thiserror::Error)]
pub enum BoardError {
    #[error("cannot use the compute board {path}: {err}")]
    Io { path: PathBuf, err: io::Error },
    #[error(
        "{path} is missing: the OCI hook makes each container's place on the node's compute board when it starts the container (is the hook of the same cuslice as this library?)"
    )]
    Missing { path: PathBuf },
    #[error(
        "{path} is not a cuslice claims file of version {VERSION} for this slice (remove it once no process of the slice runs)"
    )]
    Foreign { path: PathBuf },
    #[error(
        "CUSLICE_CORE_REQUEST: device {uuid} has {taken}% requested by other slices, so a request of {asked}% would promise more than the whole device; ask for at most {left}% (e.g. CUSLICE_CORE_REQUEST={left})"
    )]
    Oversubscribed {
        uuid: String,
        taken: u32,
        asked: u32,
        left: u32,
    },
}

fn pct(ppm: u32) -> u32 {
    ppm.div_ceil(FULL / 100)
}

fn oversubscribed(uuid: &[u8; 16], taken: u32, asked: u32) -> BoardError {
    BoardError::Oversubscribed {
        uuid: crate::uuid_string(uuid),
        taken: pct(taken),
        asked: pct(asked),
        left: 100u32.saturating_sub(pct(taken)),
    }
}

/// Who is opening a slice's place on the board.
pub enum Maker {
    /// A process of a container: the hook made the place; the process only opens its claims.
    Hooked,
    /// A standalone process: makes the slice's place if it is missing, with this grant.
    Standalone(Grant),
}

/// What one slice on a device is doing, as another reads it (bounded by its grant).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SliceView {
    pub slice: u64,
    /// Whether the hook made its place (a container's slice), as its grant says: the node
    /// agent lists every container slice it knows in what the driver saw (`crate::seen`).
    pub hooked: bool,
    pub demand: Demand,
    pub priority: Priority,
}

/// What a process posts for its slice on a device every meter period.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Post {
    pub request: u32,
    pub limit: u32,
    pub priority: Priority,
    pub usage: u32,
    pub hungry_until: u64,
    pub active_ns: u64,
}

/// What a slice is taking of a device's memory at the moment it is read (`Board::rooms`):
/// bytes its processes are bringing back from the host (thaws' restores) and bytes they are
/// allocating. A thaw that posts what it restores before it looks for room, and an allocation
/// that posts what it takes before it looks for thaws, cannot both miss each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub slice: u64,
    pub thawing: u64,
    pub allocating: u64,
}

/// Where another slice posts its room on a device, and whether its grant lets it freeze.
struct RoomRef {
    slice: u64,
    file: Arc<File>,
    index: usize,
    freezes: bool,
}

/// The other slices' entries on one device (by ledger index), and when they were looked for.
type RoomRefs = (u32, u64, Arc<Vec<RoomRef>>);

/// A post of room counts until the time it gives (`Board::begin_room`), at most this far ahead
/// of the reader's clock: a process that dies half-way leaves a post that lapses.
pub const ROOM_AHEAD_NS: u64 = 60_000_000_000;
/// The slices on a device are looked for again at most this often for an allocation (a slice
/// posts a thaw only after a second of holding memory quiet on the device, so none is missed).
const ROOM_RESCAN_NS: u64 = 250_000_000;

/// Another slice's place, as this process keeps it open.
struct Other {
    id: u64,
    claims: Arc<File>,
    /// Its turns file, once it could be opened.
    turns: Option<Arc<File>>,
    grant: Grant,
    grant_read_ns: u64,
}

/// This process's slice's place on the board, and what it knows of the others'.
pub struct Board {
    node: PathBuf,
    dir: PathBuf,
    slice: u64,
    /// The slice's own claims, mapped read-write.
    own: *mut Claims,
    _file: File,
    /// The slice's own turns, mapped read-write.
    turns: *mut turns::Turns,
    _turns_file: File,
    /// Whether a standalone process made the place (so a standalone process removes it).
    standalone: bool,
    others: parking_lot::Mutex<Vec<Other>>,
    /// The other slices' entries for each device (by ledger index), as the last `views` found
    /// them: where the slice reads their turns while it waits for one.
    rivals: parking_lot::Mutex<Vec<(u32, Arc<Vec<RivalRef>>)>>,
    /// The slices with an entry on each device (by ledger index), and when they were looked
    /// for: where `rooms` reads what they post of room.
    room_refs: parking_lot::Mutex<Vec<RoomRefs>>,
}

/// Where another slice posts its turn on a device (its turns file, the entry), and the
/// priority its grant allows it.
#[derive(Clone)]
pub struct RivalRef {
    slice: u64,
    file: Arc<File>,
    index: usize,
    priority: Priority,
}

// SAFETY: the mapping is shared memory touched only through atomics.
unsafe impl Send for Board {}
// SAFETY: as above.
unsafe impl Sync for Board {}

impl Drop for Board {
    fn drop(&mut self) {
        // SAFETY: our own mapping of SIZE bytes; nothing borrowed from it outlives `self`.
        unsafe { libc::munmap(self.own.cast(), SIZE) };
        turns::unmap(self.turns);
    }
}

fn map(file: &File) -> io::Result<*mut Claims> {
    // SAFETY: maps the whole (validated or freshly sized) file shared; checked for failure.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// The header a claims file of slice `slice` starts with, as bytes.
fn header_bytes(slice: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(std::mem::size_of::<Header>());
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_ne_bytes());
    b.extend_from_slice(&(SIZE as u32).to_ne_bytes());
    b.extend_from_slice(&slice.to_ne_bytes());
    b.resize(std::mem::size_of::<Header>(), 0);
    b
}

/// Makes slice `slice`'s claims file at `path` (the hook, for a container), mode `mode`; its
/// turns file goes beside it (`turns::create`).
pub fn create_claims(path: &Path, slice: u64, mode: u32) -> io::Result<()> {
    create_sized(path, &header_bytes(slice), SIZE, mode)
}

/// Makes a new file at `path` holding `header`, `size` bytes in all, mode `mode` (removed again
/// if any step fails).
pub(crate) fn create_sized(path: &Path, header: &[u8], size: usize, mode: u32) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    let made = f
        .write_all(header)
        .and_then(|()| f.set_len(size as u64))
        .and_then(|()| f.set_permissions(std::fs::Permissions::from_mode(mode)));
    if made.is_err() {
        let _ = std::fs::remove_file(path);
    }
    made
}

/// Writes `grant` to `path` atomically (readers see the old or the new, never a part), with
/// `mode`. Per-boot state under /run: no fsync.
pub fn write_grant(path: &Path, grant: &Grant, mode: u32) -> io::Result<()> {
    crate::fsio::write_atomic(
        path,
        grant.format().as_bytes(),
        mode,
        crate::fsio::Durability::None,
    )
}

/// Opens a file another slice wrote, for reading only, if it is a regular file: never a FIFO
/// (whose open or read could wait), a device or a link.
fn open_theirs(path: &Path) -> Option<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    f.metadata().ok()?.is_file().then_some(f)
}

/// A grant file as it is now (the least, if it cannot be read).
pub fn read_grant(path: &Path) -> Grant {
    let mut buf = vec![0u8; GRANT_MAX];
    let n = open_theirs(path)
        .and_then(|f| f.read_at(&mut buf, 0).ok())
        .unwrap_or(0);
    Grant::parse(&String::from_utf8_lossy(&buf[..n]))
}

/// A copy of a claims file as it is now (zeros past what could be read).
fn read_claims(f: &File) -> Box<Claims> {
    // SAFETY: `Claims` is atomics and integers only, for which all-zero is a valid value.
    let mut c: Box<Claims> = unsafe { Box::<Claims>::new_zeroed().assume_init() };
    // SAFETY: the box is SIZE bytes we own; `Claims` has no invalid bit patterns.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut((&mut *c as *mut Claims).cast::<u8>(), SIZE) };
    let mut done = 0;
    while done < SIZE {
        match f.read_at(&mut bytes[done..], done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    c
}

fn valid(c: &Claims, slice: u64) -> bool {
    c.header.magic == MAGIC
        && c.header.version == VERSION
        && c.header.size as usize == SIZE
        && c.header.slice == slice
}

/// The places under the board's directory `node`: (slice id, its directory). None when the
/// directory cannot be read.
pub(crate) fn places(node: &Path) -> Option<impl Iterator<Item = (u64, PathBuf)> + '_> {
    let dir = std::fs::read_dir(node).ok()?;
    Some(dir.flatten().filter_map(move |entry| {
        let id = entry
            .file_name()
            .to_str()
            .filter(|n| n.len() == 16)
            .and_then(|n| u64::from_str_radix(n, 16).ok())?;
        Some((id, node.join(entry.file_name())))
    }))
}

impl Board {
    /// Opens this process's slice's place on the board under `node` (making it for a
    /// standalone slice).
    pub fn open(node: &Path, slice: u64, maker: Maker) -> Result<Board, BoardError> {
        let dir = slice_dir(node, slice);
        let path = dir.join(CLAIMS);
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |err| BoardError::Io { path: p, err }
        };
        let standalone = matches!(maker, Maker::Standalone(_));
        let file = match maker {
            Maker::Hooked => match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
            {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(BoardError::Missing { path });
                }
                Err(e) => return Err(io(&path)(e)),
            },
            Maker::Standalone(grant) => {
                if !node.exists() {
                    std::fs::create_dir_all(node).map_err(io(node))?;
                    use std::os::unix::fs::PermissionsExt;
                    // Like /tmp: slices of different users share a node.
                    let _ = std::fs::set_permissions(node, std::fs::Permissions::from_mode(0o1777));
                }
                sweep(node, None, &remove_place);
                match std::fs::DirBuilder::new().create(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io(&dir)(e)),
                }
                let g = dir.join(GRANT);
                if !g.exists() {
                    write_grant(&g, &grant, 0o644).map_err(io(&g))?;
                }
                // The turns first: a slice that finds the claims finds the turns beside them.
                turns::open(&dir, slice, true).map_err(io(&dir.join(turns::FILE)))?;
                cuslice_shm::file::open_or_create(&dir, CLAIMS, SIZE as u64, 0o644, |f, _| {
                    use std::io::Write;
                    (&mut &*f).write_all(&header_bytes(slice))
                })
                .map_err(io(&path))?
            }
        };
        let meta = file.metadata().map_err(io(&path))?;
        if !meta.is_file() || meta.len() != SIZE as u64 {
            return Err(BoardError::Foreign { path });
        }
        let turns_path = dir.join(turns::FILE);
        let turns_file = match turns::open(&dir, slice, standalone) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(BoardError::Missing { path: turns_path });
            }
            Err(e) => return Err(io(&turns_path)(e)),
        };
        let Some(own_turns) = turns::map(&turns_file, slice) else {
            return Err(BoardError::Foreign { path: turns_path });
        };
        let own = match map(&file) {
            Ok(own) => own,
            Err(e) => {
                turns::unmap(own_turns);
                return Err(io(&path)(e));
            }
        };
        let board = Board {
            node: node.to_path_buf(),
            dir,
            slice,
            own,
            _file: file,
            turns: own_turns,
            _turns_file: turns_file,
            standalone,
            others: parking_lot::Mutex::new(Vec::new()),
            rivals: parking_lot::Mutex::new(Vec::new()),
            room_refs: parking_lot::Mutex::new(Vec::new()),
        };
        let h = &board.claims().header;
        if h.magic != MAGIC || h.version != VERSION || h.size as usize != SIZE || h.slice != slice {
            return Err(BoardError::Foreign { path });
        }
        Ok(board)
    }

    /// The slice's own turn on device `d`.
    fn turn_entry(&self, d: u32) -> Option<&turns::Entry> {
        // SAFETY: the mapping lives as long as `self` and is turns::SIZE bytes.
        unsafe { &*self.turns }.entries.get(d as usize)
    }

    fn claims(&self) -> &Claims {
        // SAFETY: the mapping lives as long as `self` and is SIZE bytes.
        unsafe { &*self.own }
    }

    fn entry(&self, d: u32) -> Option<&Entry> {
        self.claims().entries.get(d as usize)
    }

    /// The slice's id on the board.
    pub fn slice(&self) -> u64 {
        self.slice
    }

    /// The slice's directory on the board.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Claims `request` and `limit` (ppm) at `priority` on device `uuid` (the slice's ledger
    /// index `d`) for the slice, if the requests of the slices on the device leave room; once
    /// per slice and device (a later process of the slice finds the claim held).
    pub fn claim(
        &self,
        d: u32,
        uuid: &[u8; 16],
        request: u32,
        limit: u32,
        priority: Priority,
    ) -> Result<(), BoardError> {
        let Some(e) = self.entry(d) else {
            return Ok(());
        };
        let w = words(uuid);
        for attempt in 0..ATTEMPTS {
            let now = now_ns();
            let state = e.state.load(Ordering::Acquire);
            let fresh = recent(e.beat_ns.load(Ordering::Relaxed), now, STALE_NS);
            if state == HELD && fresh && e.is(w) {
                return Ok(());
            }
            if state == PENDING && fresh && e.is(w) {
                // Another process of this slice is being admitted: wait for its answer.
                std::thread::sleep(std::time::Duration::from_millis(2));
                continue;
            }
            if e.state
                .compare_exchange(state, PENDING, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            e.uuid[0].store(w.0, Ordering::Relaxed);
            e.uuid[1].store(w.1, Ordering::Relaxed);
            if let Some(t) = self.turn_entry(d) {
                t.uuid[0].store(w.0, Ordering::Relaxed);
                t.uuid[1].store(w.1, Ordering::Relaxed);
            }
            e.request.store(request, Ordering::Relaxed);
            e.limit.store(limit, Ordering::Relaxed);
            e.priority.store(priority.code(), Ordering::Relaxed);
            e.usage.store(0, Ordering::Relaxed);
            e.hungry_until.store(0, Ordering::Relaxed);
            e.high_until.store(0, Ordering::Relaxed);
            e.launched.store(0, Ordering::Relaxed);
            e.active_ns.store(0, Ordering::Relaxed);
            e.beat_ns.store(now, Ordering::Relaxed);
            if request == 0 {
                e.state.store(HELD, Ordering::Release);
                return Ok(());
            }
            // The claim is visible before anybody's is read.
            fence(Ordering::SeqCst);
            let (held, pending) = self.requests_on(w, now);
            if held.saturating_add(request) > FULL {
                e.state.store(FREE, Ordering::Release);
                return Err(oversubscribed(uuid, held, request));
            }
            if held.saturating_add(pending).saturating_add(request) > FULL {
                e.state.store(FREE, Ordering::Release);
                if attempt + 1 == ATTEMPTS {
                    return Err(oversubscribed(uuid, held.saturating_add(pending), request));
                }
                // Somebody else is posting at this moment: one of us gives way for a random
                // moment (1 to 16 ms).
                give_way(now, 16);
                continue;
            }
            e.state.store(HELD, Ordering::Release);
            return Ok(());
        }
        Err(oversubscribed(uuid, 0, request))
    }

    /// The requests other slices hold and are being admitted for on device `w` (ppm, each
    /// bounded by its grant).
    fn requests_on(&self, w: (u64, u64), now: u64) -> (u32, u32) {
        let (mut held, mut pending) = (0u32, 0u32);
        self.each_other(now, |o, c| {
            let Some((_, e)) = entry_on(c, w, now) else {
                return;
            };
            let (request, _, _) = o.grant.bound(
                e.request.load(Ordering::Relaxed),
                e.limit.load(Ordering::Relaxed),
                Priority::Low,
            );
            match e.state.load(Ordering::Relaxed) {
                HELD => held = held.saturating_add(request),
                PENDING => pending = pending.saturating_add(request),
                _ => {}
            }
        });
        (held, pending)
    }

    /// Posts what this process did on device `d` in its last period, for the slice.
    pub fn post(&self, d: u32, uuid: &[u8; 16], p: &Post, now: u64) {
        let Some(e) = self.entry(d) else { return };
        let w = words(uuid);
        if !e.is(w) {
            e.uuid[0].store(w.0, Ordering::Relaxed);
            e.uuid[1].store(w.1, Ordering::Relaxed);
        }
        e.request.store(p.request, Ordering::Relaxed);
        e.limit.store(p.limit, Ordering::Relaxed);
        e.priority.store(p.priority.code(), Ordering::Relaxed);
        e.usage.store(p.usage, Ordering::Relaxed);
        e.hungry_until.fetch_max(p.hungry_until, Ordering::Relaxed);
        e.active_ns.fetch_max(p.active_ns, Ordering::Relaxed);
        e.beat_ns.fetch_max(now, Ordering::Relaxed);
        if e.state.load(Ordering::Relaxed) != HELD {
            // Admitted at joining; a claim left FREE by a process of the slice that died
            // half-way, or changed by `cuslice set` (which checked the device), is held again.
            e.state.store(HELD, Ordering::Release);
        }
        self.claims()
            .header
            .beat_ns
            .fetch_max(now, Ordering::Relaxed);
    }

    /// The slice's gate on device `d`, in its own turns (mapped): what its processes share
    /// within a turn.
    pub fn gate(&self, d: u32) -> Option<&Gate> {
        self.turn_entry(d).map(|e| &e.gate)
    }

    /// The slice's turn on device `d`, as posted.
    pub fn turn(&self, d: u32) -> Turn {
        self.turn_entry(d).map_or(Turn::Idle, turns::Entry::turn)
    }

    /// Posts the slice's turn on device `d` (its times first, then the state, so that a reader
    /// that sees the state sees its times).
    pub fn post_turn(&self, d: u32, turn: Turn) {
        let Some(e) = self.turn_entry(d) else { return };
        let (state, since, until) = turn.words();
        e.since.store(since, Ordering::Relaxed);
        e.until.store(until, Ordering::Relaxed);
        e.turn.store(state, Ordering::Release);
    }

    /// Moves the slice's turn on device `d` from `from` (a state code) to `to`, if it is still
    /// `from`: of several processes of the slice, one takes the turn (or ends it).
    pub fn swap_turn(&self, d: u32, from: u32, to: Turn) -> bool {
        let Some(e) = self.turn_entry(d) else {
            return false;
        };
        let (state, since, until) = to.words();
        // A state no process of the slice ever posts marks the words being written.
        const BUSY: u32 = u32::MAX;
        if e.turn
            .compare_exchange(from, BUSY, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        e.since.store(since, Ordering::Relaxed);
        e.until.store(until, Ordering::Relaxed);
        e.turn.store(state, Ordering::Release);
        true
    }

    /// Moves the planned end of the slice's holding turn on device `d` to `until`.
    pub fn renew_turn(&self, d: u32, until: u64) {
        if let Some(e) = self.turn_entry(d) {
            e.until.store(until, Ordering::Release);
        }
    }

    /// Posts that a process of the slice waits for `bytes` on device `uuid`, which has no room
    /// for them, until `until` (0: it no longer waits). Processes of other slices that freeze
    /// when idle read it (`memory_wanted`). One want per slice: the last posted.
    pub fn want_memory(&self, uuid: &[u8; 16], bytes: u64, until: u64) {
        let h = &self.claims().header;
        let w = words(uuid);
        h.wanted_until.store(0, Ordering::Relaxed);
        h.wanted_bytes.store(bytes, Ordering::Relaxed);
        h.wanted_uuid[0].store(w.0, Ordering::Relaxed);
        h.wanted_uuid[1].store(w.1, Ordering::Relaxed);
        h.wanted_until.store(until, Ordering::Release);
    }

    /// The most another slice on the board waits for on device `uuid` now (`want_memory`), 0 if
    /// none: a want counts while it holds and is at most `WANT_AHEAD_NS` ahead (a waiter posts it
    /// again as it waits, so a want of a slice whose processes died lapses within that). What it
    /// says is not trusted beyond that: it counts up to the wanter's memory cap (its grant's;
    /// no process waits for more than its cap lets it allocate), and the reader checks that the
    /// device is short of it.
    pub fn memory_wanted(&self, uuid: &[u8; 16], now: u64) -> u64 {
        let w = words(uuid);
        let mut most = 0;
        self.each_other(now, |o, c| {
            let h = &c.header;
            let until = h.wanted_until.load(Ordering::Relaxed);
            if until >= now
                && until <= now.saturating_add(WANT_AHEAD_NS)
                && h.wanted_uuid[0].load(Ordering::Relaxed) == w.0
                && h.wanted_uuid[1].load(Ordering::Relaxed) == w.1
            {
                let cap = o.grant.memory.unwrap_or(u64::MAX);
                most = most.max(h.wanted_bytes.load(Ordering::Relaxed).min(cap));
            }
        });
        most
    }

    /// Marks the slice active on device `d` at `now` (it launched, or wants to).
    pub fn touch(&self, d: u32, now: u64) {
        if let Some(e) = self.entry(d) {
            e.active_ns.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// The turns of the other slices on device `d` (as the last `views` found them), read now:
    /// one `pread` of each one's entry, never a mapping or a lock. An entry that no longer names
    /// the device, or that nobody of its slice refreshed for `STALE_NS`, is left out.
    pub fn rivals(&self, d: u32, uuid: &[u8; 16]) -> Vec<Rival> {
        let refs = {
            let r = self.rivals.lock();
            match r.iter().find(|(i, _)| *i == d) {
                Some((_, refs)) => refs.clone(),
                None => return Vec::new(),
            }
        };
        let w = words(uuid);
        let mut out = Vec::with_capacity(refs.len());
        for r in refs.iter() {
            let e = turns::read_entry(&r.file, r.index);
            if !e.is(w) {
                continue;
            }
            out.push(Rival {
                slice: r.slice,
                turn: e.turn(),
                priority: r.priority,
            });
        }
        out
    }

    /// Calls `f` with each other slice on the board and a copy of its claims, valid ones only.
    fn each_other(&self, now: u64, mut f: impl FnMut(&Other, &Claims)) {
        let mut others = self.others.lock();
        self.rescan(&mut others, now);
        for o in others.iter() {
            let c = read_claims(&o.claims);
            if valid(&c, o.id) {
                f(o, &c);
            }
        }
    }

    /// Brings the list of other slices up to date with the board's directory.
    fn rescan(&self, others: &mut Vec<Other>, now: u64) {
        let Some(places) = places(&self.node) else {
            others.clear();
            return;
        };
        let mut seen = Vec::new();
        for (id, place) in places {
            if id == self.slice {
                continue;
            }
            seen.push(id);
            match others.iter_mut().find(|o| o.id == id) {
                Some(o) => {
                    if o.turns.is_none() {
                        // Found while being made: its turns file may be there by now.
                        o.turns = open_theirs(&place.join(turns::FILE)).map(Arc::new);
                    }
                    if now.saturating_sub(o.grant_read_ns) >= GRANT_EVERY_NS {
                        o.grant = read_grant(&place.join(GRANT));
                        o.grant_read_ns = now;
                    }
                }
                None => {
                    if let Some(f) = open_theirs(&place.join(CLAIMS)) {
                        others.push(Other {
                            id,
                            claims: Arc::new(f),
                            turns: open_theirs(&place.join(turns::FILE)).map(Arc::new),
                            grant: read_grant(&place.join(GRANT)),
                            grant_read_ns: now,
                        });
                    }
                }
            }
        }
        others.retain(|o| seen.contains(&o.id));
    }

    /// The slices on device `uuid` (this process's slice's ledger index `d`) that launched
    /// work (or wanted to) since `since_ns`, this process's own slice first (always), each
    /// bounded by its grant. It also finds where every other slice on the device posts its turn
    /// (`rivals`), active lately or not.
    pub fn views(&self, d: u32, uuid: &[u8; 16], now: u64, since_ns: u64) -> Vec<SliceView> {
        let w = words(uuid);
        let mut out = Vec::new();
        if let Some(e) = self.entry(d) {
            out.push(SliceView {
                slice: self.slice,
                hooked: !self.standalone,
                demand: Demand {
                    request: e.request.load(Ordering::Relaxed),
                    limit: e.limit.load(Ordering::Relaxed),
                    hungry: e.hungry_until.load(Ordering::Relaxed) > now,
                    usage: e.usage.load(Ordering::Relaxed),
                },
                priority: Priority::from_code(e.priority.load(Ordering::Relaxed)),
            });
        }
        let mut rivals = Vec::new();
        self.each_other(now, |o, c| {
            if let Some((i, e)) = entry_on(c, w, now)
                && e.state.load(Ordering::Relaxed) == HELD
            {
                let (request, limit, priority) = o.grant.bound(
                    e.request.load(Ordering::Relaxed),
                    e.limit.load(Ordering::Relaxed),
                    Priority::from_code(e.priority.load(Ordering::Relaxed)),
                );
                if let Some(file) = &o.turns {
                    rivals.push(RivalRef {
                        slice: o.id,
                        file: file.clone(),
                        index: i,
                        priority,
                    });
                }
                if recent(
                    e.active_ns.load(Ordering::Relaxed),
                    now,
                    now - since_ns.min(now),
                ) {
                    out.push(SliceView {
                        slice: o.id,
                        hooked: matches!(o.grant.origin, Origin::Hook { .. }),
                        demand: Demand {
                            request,
                            limit,
                            hungry: e.hungry_until.load(Ordering::Relaxed) > now,
                            usage: e.usage.load(Ordering::Relaxed).min(FULL),
                        },
                        priority,
                    });
                }
            }
        });
        let mut r = self.rivals.lock();
        let rivals = Arc::new(rivals);
        match r.iter_mut().find(|(i, _)| *i == d) {
            Some(slot) => slot.1 = rivals,
            None => r.push((d, rivals)),
        }
        out
    }

    /// Posts that a process of the slice is about to take `bytes` of device memory on device
    /// `d` (its ledger index), by a thaw's restore (`thaw`) or by an allocation, until `until`
    /// at the latest; then a full fence. A process that posts and then reads the others'
    /// (`rooms`) sees every post made before its own, and whoever posts after it sees its own.
    pub fn begin_room(&self, d: u32, thaw: bool, bytes: u64, until: u64) {
        if let Some(e) = self.turn_entry(d) {
            let sum = if thaw { &e.thawing } else { &e.allocating };
            sum.fetch_add(bytes, Ordering::SeqCst);
            e.room_until.fetch_max(until, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
    }

    /// Takes back a post of `begin_room`: the restore or the allocation is done, or given up.
    pub fn end_room(&self, d: u32, thaw: bool, bytes: u64) {
        if let Some(e) = self.turn_entry(d) {
            let sum = if thaw { &e.thawing } else { &e.allocating };
            let _ = sum.fetch_update(Ordering::SeqCst, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(bytes))
            });
        }
    }

    /// What every slice with an entry on device `uuid` (this slice's ledger index `d`) is taking
    /// of its memory now, this slice's own first: its own from the mapping, each other's by one
    /// `pread` of its turns entry, never a mapping or a lock. A post counts until its time, at
    /// most `ROOM_AHEAD_NS` ahead; slices taking nothing are left out. With `rescan` the board's
    /// directory is read first, for a slice that joined since the last look (else the list is at
    /// most `ROOM_RESCAN_NS` old). What another slice posts is only a figure it wrote: a thaw
    /// counts only from a slice whose grant lets it freeze, and the caller bounds what it
    /// believes of that (`cuslice_policy::room`).
    pub fn rooms(&self, d: u32, uuid: &[u8; 16], now: u64, rescan: bool) -> Vec<Room> {
        let w = words(uuid);
        let counts = |until: u64| until >= now && until <= now.saturating_add(ROOM_AHEAD_NS);
        let mut out = Vec::new();
        let mut push = |slice: u64, e: &turns::Entry, freezes: bool| {
            let (thawing, allocating) = (
                if freezes {
                    e.thawing.load(Ordering::SeqCst)
                } else {
                    0
                },
                e.allocating.load(Ordering::SeqCst),
            );
            if e.is(w) && counts(e.room_until.load(Ordering::SeqCst)) && thawing | allocating != 0 {
                out.push(Room {
                    slice,
                    thawing,
                    allocating,
                });
            }
        };
        if let Some(e) = self.turn_entry(d) {
            push(self.slice, e, true);
        }
        for r in self.room_refs_on(d, w, now, rescan).iter() {
            push(r.slice, &turns::read_entry(&r.file, r.index), r.freezes);
        }
        out
    }

    /// Whether another slice with an entry on device `uuid` (this slice's ledger index `d`) may
    /// be frozen when idle, by its grant (the list at most `ROOM_RESCAN_NS` old). None is
    /// missed that could be thawing: a slice freezes after a second quiet on the device.
    pub fn freezers_on(&self, d: u32, uuid: &[u8; 16], now: u64) -> bool {
        self.room_refs_on(d, words(uuid), now, false)
            .iter()
            .any(|r| r.freezes)
    }

    /// The other slices' entries on device `w` (this slice's ledger index `d`), looked for again
    /// when asked or when the last look is `ROOM_RESCAN_NS` old.
    fn room_refs_on(&self, d: u32, w: (u64, u64), now: u64, rescan: bool) -> Arc<Vec<RoomRef>> {
        {
            let r = self.room_refs.lock();
            if let Some((_, at, refs)) = r.iter().find(|(i, _, _)| *i == d)
                && !rescan
                && now.saturating_sub(*at) < ROOM_RESCAN_NS
            {
                return refs.clone();
            }
        }
        let mut refs = Vec::new();
        // Whether or not its claim there is fresh: a slice that only holds memory may refresh
        // none, and what it posts of room says how long that holds.
        self.each_other(now, |o, c| {
            if let (Some(i), Some(file)) = (c.entries.iter().position(|e| e.is(w)), &o.turns) {
                refs.push(RoomRef {
                    slice: o.id,
                    file: file.clone(),
                    index: i,
                    freezes: o.grant.freezes,
                });
            }
        });
        let refs = Arc::new(refs);
        let mut r = self.room_refs.lock();
        match r.iter_mut().find(|(i, _, _)| *i == d) {
            Some(slot) => *slot = (d, now, refs.clone()),
            None => r.push((d, now, refs.clone())),
        }
        refs
    }

    /// Removes the slice's place from the board: for a standalone slice's last process.
    pub fn leave(&self) {
        if self.standalone {
            remove_place(&self.dir);
        }
    }
}

/// The core requests (ppm) that slices other than `except` hold or are being admitted for on
/// device `uuid`, each bounded by its grant: for `cuslice set`, which checks a new request
/// against them.
pub fn requested(node: &Path, uuid: &[u8; 16], except: u64) -> u32 {
    claims_on(node, uuid, except)
        .iter()
        .fold(0u32, |sum, c| sum.saturating_add(c.request))
}

/// One slice's claim on a device, as another reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimOn {
    pub slice: u64,
    /// The request it claims (ppm), bounded by its grant.
    pub request: u32,
    pub grant: Grant,
}

/// The slices other than `except` that hold or are being admitted for a claim on device `uuid`
/// (refreshed within `STALE_NS`: some process of theirs lives), each with its request bounded
/// by its grant, and the grant.
pub fn claims_on(node: &Path, uuid: &[u8; 16], except: u64) -> Vec<ClaimOn> {
    let now = now_ns();
    let w = words(uuid);
    let Some(places) = places(node) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (id, place) in places {
        if id == except {
            continue;
        }
        let Some(f) = open_theirs(&place.join(CLAIMS)) else {
            continue;
        };
        let c = read_claims(&f);
        if !valid(&c, id) {
            continue;
        }
        let grant = read_grant(&place.join(GRANT));
        if let Some((_, e)) = entry_on(&c, w, now)
            && matches!(e.state.load(Ordering::Relaxed), HELD | PENDING)
        {
            let (request, _, _) = grant.bound(
                e.request.load(Ordering::Relaxed),
                e.limit.load(Ordering::Relaxed),
                Priority::Low,
            );
            out.push(ClaimOn {
                slice: id,
                request,
                grant,
            });
        }
    }
    out
}

/// What is wrong in slice `slice`'s claims file at `path` (the slice writes it alone, so this is
/// its own processes' doing), one line each: entries naming a device that an earlier entry names
/// (they count for nothing), figures past the whole device or past the slice's grant (cut to it),
/// a state no process posts, or a file that is not the slice's claims file (none of it counts).
/// Entries nobody refreshed for `STALE_NS` are passed over. Empty when there is nothing to say
/// or the file cannot be read.
pub fn faults(path: &Path, slice: u64, grant: &Grant) -> Vec<String> {
    let Some(f) = open_theirs(path) else {
        return Vec::new();
    };
    let c = read_claims(&f);
    if !valid(&c, slice) {
        return vec![format!(
            "{} is not a claims file of version {VERSION} for slice {slice:016x}: none of its claims count",
            path.display()
        )];
    }
    let now = now_ns();
    let mut out = Vec::new();
    let mut named: Vec<((u64, u64), usize, Vec<usize>)> = Vec::new();
    for (i, e) in c.entries.iter().enumerate() {
        if !recent(e.beat_ns.load(Ordering::Relaxed), now, STALE_NS) {
            continue;
        }
        let w = (
            e.uuid[0].load(Ordering::Relaxed),
            e.uuid[1].load(Ordering::Relaxed),
        );
        match named.iter_mut().find(|(u, ..)| *u == w) {
            Some((_, _, later)) => later.push(i),
            None => named.push((w, i, Vec::new())),
        }
        let state = e.state.load(Ordering::Relaxed);
        if !matches!(state, FREE | PENDING | HELD) {
            out.push(format!(
                "entry {i} is in state {state}, which no process posts"
            ));
        }
        for (what, v, bound) in [
            ("request", e.request.load(Ordering::Relaxed), grant.request),
            ("limit", e.limit.load(Ordering::Relaxed), grant.limit),
        ] {
            if v > FULL {
                out.push(format!(
                    "entry {i} claims a core {what} of {} ppm, more than the whole device ({FULL})",
                    v
                ));
            } else if v > bound {
                out.push(format!(
                    "entry {i} claims a core {what} of {}%, more than the {}% granted (counted as {}%)",
                    pct(v),
                    pct(bound),
                    pct(bound)
                ));
            }
        }
    }
    // A want of memory past the slice's cap: no process of it waits for that.
    let h = &c.header;
    let until = h.wanted_until.load(Ordering::Relaxed);
    let bytes = h.wanted_bytes.load(Ordering::Relaxed);
    if until >= now
        && let Some(cap) = grant.memory
        && bytes > cap
    {
        out.push(format!(
            "it says it waits for {} of device memory, more than its cap of {} (counted as {})",
            cuslice_policy::format_size(bytes),
            cuslice_policy::format_size(cap),
            cuslice_policy::format_size(cap)
        ));
    }
    for ((a, b), first, later) in named {
        if later.is_empty() {
            continue;
        }
        let mut uuid = [0u8; 16];
        uuid[..8].copy_from_slice(&a.to_be_bytes());
        uuid[8..].copy_from_slice(&b.to_be_bytes());
        let list: Vec<String> = later.iter().map(|i| i.to_string()).collect();
        out.push(format!(
            "entries {} name device {} as entry {first} does: only entry {first} counts",
            list.join(", "),
            crate::uuid_string(&uuid)
        ));
    }
    out
}

/// Removes a slice's place: its files, then the directory (which stays if anything else is in
/// it). The files are removed through the directory itself, opened without following a link:
/// any account may put a link to a directory of its choice on the board, where a sweep run as
/// root would otherwise remove files of those names there.
pub fn remove_place(dir: &Path) {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(d) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
    else {
        return;
    };
    for name in [CLAIMS, turns::FILE, GRANT] {
        let Ok(name) = std::ffi::CString::new(name) else {
            continue;
        };
        // SAFETY: `d` is an open directory for the call; `name` is NUL-terminated and outlives it.
        unsafe { libc::unlinkat(d.as_raw_fd(), name.as_ptr(), 0) };
    }
    drop(d);
    let _ = std::fs::remove_dir(dir);
}

/// A hook's state root, and whether a container of its is live (by id).
pub type HookRoot<'a> = (&'a Path, &'a dyn Fn(&str) -> bool);

/// The places of standalone slices under `node` that no process refreshed for `LEFTOVER_NS`
/// (their processes died without removing them), and those of containers of the hook's state
/// root `root` for which `live` says no (the container is gone): removed where this process may,
/// with `remove` (`remove_place`, or the hook's, which takes a mounted place off first).
pub fn sweep(node: &Path, root: Option<HookRoot<'_>>, remove: &dyn Fn(&Path)) {
    let now = now_ns();
    let Some(places) = places(node) else {
        return;
    };
    for (id, place) in places {
        let grant = read_grant(&place.join(GRANT));
        let gone = match (&grant.origin, root) {
            (Origin::Standalone, _) => {
                // A place being made (its directory changed lately) is never a leftover: its
                // grant or claims may not be there yet.
                let young = std::fs::metadata(&place)
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|t| t.elapsed().ok())
                    .is_none_or(|age| (age.as_nanos() as u64) < LEFTOVER_NS);
                let beat = open_theirs(&place.join(CLAIMS))
                    .map(|f| read_claims(&f))
                    .filter(|c| valid(c, id))
                    .map_or(0, |c| c.header.beat_ns.load(Ordering::Relaxed));
                !young && !recent(beat, now, LEFTOVER_NS)
            }
            (Origin::Hook { id, root: r }, Some((root, live))) => r == root && !live(id),
            (Origin::Hook { .. }, None) => false,
        };
        if gone {
            remove(&place);
        }
    }
}

/// Sleeps a moment of 1 to `most` ms, picked from `now` and this process's id: two processes that
/// found each other in the way at the same moment (both posting claims, both restoring) give way
/// for different moments, so they do not go on finding each other.
pub fn give_way(now: u64, most: u64) {
    let ms = 1 + (now ^ u64::from(std::process::id()).wrapping_mul(0x9e37_79b9)) % most.max(1);
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests;
