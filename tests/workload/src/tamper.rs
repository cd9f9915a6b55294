//! `tamper`: a hostile tenant. A process in a container that attacks whatever cuslice state it
//! can reach under `/run/cuslice`, the way someone who has read cuslice's source would, so that
//! tests can check it changes nothing for the other containers on the node. It reports every
//! attempt as a JSON line (`tampered`, with `ok` and the error where the kernel refused), then
//! `ready`, and keeps what it did in place for `--secs`.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use crate::out::emit;
use crate::scenarios::Session;

#[derive(Clone, Debug, Args)]
pub struct TamperArgs {
    /// Report every file and directory under --root that this process can write (a `writable`
    /// line each, with its device and inode), and every socket (a `socket` line)
    #[arg(long)]
    pub survey: bool,
    /// Claim the whole of every device the node arbitrates, with high priority and high
    /// priority work always in flight, and keep the claims fresh
    #[arg(long)]
    pub forge: bool,
    /// With --forge: also say its launches took the whole device (what a shared period is
    /// apportioned by, where the driver names one process a sample), instead of none
    #[arg(long)]
    pub forge_launched: bool,
    /// With --forge: flicker, in every 16 ms, between holding the turn for 2 ms and waiting
    /// for it since the start of time, so that each hold starts a neighbour's count of how long
    /// it sat first in the queue of a free device afresh, and each wait breaks its holding
    #[arg(long)]
    pub forge_flicker: bool,
    /// Post the slice's one granted core request on its first device in this many entries of
    /// its claims file, and keep them fresh
    #[arg(long, default_value_t = 0)]
    pub duplicate_claims: u32,
    /// Start this many more processes that initialise CUDA and stay (each takes whatever place
    /// a process takes in the node's compute arbitration)
    #[arg(long, default_value_t = 0)]
    pub flood: u32,
    /// Replace every file it can under --root/node with a FIFO and every directory entry it
    /// can with a dangling symlink, and hold an exclusive lock on every file it can open
    #[arg(long)]
    pub replace: bool,
    /// Write this many MiB past the end of every file it can write under --root (its ledger,
    /// its claims): the host's memory, where those files live
    #[arg(long, default_value_t = 0)]
    pub grow_mib: u64,
    /// Allocate this many MiB past the end of every file it can write under --root without
    /// changing the file's size (`fallocate` with `FALLOC_FL_KEEP_SIZE`)
    #[arg(long, default_value_t = 0)]
    pub fallocate_mib: u64,
    /// Find its slice's spill bound in its ledger (the 8-byte word holding this many MiB, the
    /// slice's `CUSLICE_MEMORY_SPILL`) and keep it at 1 TiB, and the spilled count after it at 0,
    /// rewriting both every millisecond
    #[arg(long, default_value_t = 0)]
    pub spill_words_mib: u64,
    /// Say, in its own claims, that it waits for this many GiB on every device it has (room
    /// the device cannot have), and keep saying it: what makes quiet processes of other slices
    /// that freeze give their memory back
    #[arg(long, default_value_t = 0)]
    pub forge_want_gib: u64,
    /// Say, in its own turns, that it brings this many GiB back to every device it has from a
    /// frozen process (a thaw it never does), and keep saying it: what allocations of other
    /// slices leave room for
    #[arg(long, default_value_t = 0)]
    pub forge_thaw_gib: u64,
    /// How long to keep it up after `ready`
    #[arg(long, value_parser = parse_secs, default_value = "0")]
    pub secs: f64,
    /// Where cuslice's state is mounted in the container
    #[arg(long, default_value = "/run/cuslice")]
    pub root: PathBuf,
    /// (A flood process: initialise CUDA, say so, and sleep.)
    #[arg(long, hide = true)]
    pub init_only: bool,
}

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds >= 0")),
    }
}

fn attempt(what: &str, path: &Path, r: std::io::Result<()>) -> bool {
    emit(
        "tampered",
        json!({
            "what": what,
            "path": path.display().to_string(),
            "ok": r.is_ok(),
            "error": r.as_ref().err().map(|e| e.to_string()),
        }),
    );
    r.is_ok()
}

/// Everything under `root` (not following symlinks), at most `depth` levels down.
fn walk(root: &Path, depth: u32, out: &mut Vec<(PathBuf, std::fs::Metadata)>) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let Ok(m) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let dir = m.is_dir();
        out.push((path.clone(), m));
        if dir && depth > 0 {
            walk(&path, depth - 1, out);
        }
    }
}

fn everything(root: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let mut out = Vec::new();
    if let Ok(m) = std::fs::symlink_metadata(root) {
        out.push((root.to_path_buf(), m));
    }
    walk(root, 6, &mut out);
    out
}

/// Whether this process can write `path` (opening a file for writing changes nothing; a
/// directory is tried by making and removing an entry in it).
fn can_write(path: &Path, m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    if m.is_dir() {
        let probe = path.join(format!(".tamper-{}", std::process::id()));
        let made = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .is_ok();
        if made {
            let _ = std::fs::remove_file(&probe);
        }
        return made;
    }
    if m.file_type().is_fifo() || m.file_type().is_socket() || m.file_type().is_symlink() {
        return false;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .is_ok()
}

pub fn survey(root: &Path) {
    for (path, m) in everything(root) {
        let kind = if m.is_dir() {
            "dir"
        } else if m.file_type().is_socket() {
            emit(
                "socket",
                json!({"path": path.display().to_string(), "dev": m.dev(), "ino": m.ino()}),
            );
            continue;
        } else {
            "file"
        };
        if can_write(&path, &m) {
            emit(
                "writable",
                json!({
                    "path": path.display().to_string(),
                    "kind": kind,
                    "dev": m.dev(),
                    "ino": m.ino(),
                }),
            );
        }
    }
}

fn mkfifo(path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated path that outlives the call.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o666) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Writes `mib` MiB past the end of every regular file under `root` this process can write.
fn grow(root: &Path, mib: u64) {
    use std::os::unix::fs::FileExt;
    let chunk = vec![0x5au8; 1 << 20];
    for (path, m) in everything(root) {
        if !m.is_file() || !can_write(&path, &m) {
            continue;
        }
        let r = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| (0..mib).try_for_each(|i| f.write_all_at(&chunk, m.len() + (i << 20))));
        attempt("grow", &path, r);
    }
}

/// Allocates `mib` MiB past the end of every regular file under `root` this process can write,
/// keeping each file's size.
fn fallocate_past_end(root: &Path, mib: u64) {
    use std::os::fd::AsRawFd;
    for (path, m) in everything(root) {
        if !m.is_file() || !can_write(&path, &m) {
            continue;
        }
        let r = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| {
                // SAFETY: fallocate on a file descriptor we own, with plain integer arguments.
                let rc = unsafe {
                    libc::fallocate(
                        f.as_raw_fd(),
                        libc::FALLOC_FL_KEEP_SIZE,
                        m.len() as libc::off_t,
                        (mib << 20) as libc::off_t,
                    )
                };
                if rc == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        attempt("fallocate", &path, r);
    }
}

/// Replaces what it can under `root/node` and locks the rest: the attacks that hung other
/// containers' processes when the node's compute state was shared.
fn replace(root: &Path, held: &mut Vec<std::fs::File>) {
    let node = root.join("node");
    for (path, m) in everything(&node) {
        if path == node {
            continue;
        }
        if m.is_file() {
            // An exclusive lock of every kind a reader might wait on.
            if let Ok(f) = std::fs::OpenOptions::new().read(true).open(&path) {
                use std::os::fd::AsRawFd;
                // SAFETY: flock on a descriptor we own.
                let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
                attempt(
                    "flock",
                    &path,
                    if r == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    },
                );
                held.push(f);
            }
            let fifo = path.with_extension(format!("fifo{}", std::process::id()));
            let made = mkfifo(&fifo).and_then(|()| std::fs::rename(&fifo, &path));
            let _ = std::fs::remove_file(&fifo);
            attempt("fifo-over", &path, made);
        } else if m.is_dir() {
            let link = path.join(format!("link{}", std::process::id()));
            let made = std::os::unix::fs::symlink("/nonexistent/cuslice", &link);
            attempt("dangling-symlink", &link, made);
        }
    }
    let link = node.join(format!("GPU-{}", std::process::id()));
    attempt(
        "dangling-symlink",
        &link,
        std::os::unix::fs::symlink("/nonexistent/cuslice", &link),
    );
}

/// The forged claims, kept fresh until `until`: the slice's own place on the node's compute
/// board (the one place it can write) claims the whole of every device the container sees, with
/// high priority, always wanting more, and waiting for the turn since the start of time; with
/// `launched`, holding the turn instead, a fresh turn posted every 20 ms; with `flicker`,
/// holding it 2 ms of every 16 and waiting since the start of time the rest, posted every 200 µs.
fn forge(
    s: &Session<'_>,
    root: &Path,
    until: Instant,
    launched: bool,
    flicker: bool,
) -> Vec<std::thread::JoinHandle<()>> {
    use cuslice_policy::priority::Priority;
    use cuslice_policy::share::FULL;
    use cuslice_policy::turn::{self, Turn};
    use cuslice_state::board::Post;
    let Some(board) = own_board(root, "forge") else {
        return Vec::new();
    };
    let uuids = devices(s);
    let place = board.dir().join("claims");
    for (d, uuid) in uuids.iter().enumerate() {
        // Through the front door first, then whatever the door said.
        let r = board.claim(d as u32, uuid, FULL, FULL, Priority::High);
        attempt(
            "claim-whole-device",
            &place,
            r.map_err(|e| std::io::Error::other(e.to_string())),
        );
    }
    attempt("forge-claims", &place, Ok(()));
    vec![std::thread::spawn(move || {
        while Instant::now() < until {
            let now = crate::scenarios::monotonic_ns();
            for (d, uuid) in uuids.iter().enumerate() {
                let post = Post {
                    request: FULL,
                    limit: FULL,
                    priority: Priority::High,
                    usage: FULL,
                    hungry_until: u64::MAX,
                    active_ns: now,
                };
                board.post(d as u32, uuid, &post, now);
                let ms = now / 1_000_000;
                board.post_turn(
                    d as u32,
                    if flicker && ms % 16 < 2 {
                        Turn::Holding {
                            since: (ms - ms % 16) * 1_000_000,
                            until: (ms - ms % 16 + 2) * 1_000_000,
                        }
                    } else if launched {
                        Turn::Holding {
                            since: now,
                            until: now + turn::MAX_TURN_NS,
                        }
                    } else {
                        Turn::Waiting { since: 1 }
                    },
                );
            }
            std::thread::sleep(if flicker {
                Duration::from_micros(200)
            } else {
                Duration::from_millis(20)
            });
        }
    })]
}

/// Posts a want of `bytes` on each of its devices in its own claims, again every 100 ms, as a
/// process waiting for room does.
fn forge_want(
    s: &Session<'_>,
    root: &Path,
    bytes: u64,
    until: Instant,
) -> Vec<std::thread::JoinHandle<()>> {
    let Some(board) = own_board(root, "forge-want") else {
        return Vec::new();
    };
    let uuids = devices(s);
    attempt("forge-want", &board.dir().join("claims"), Ok(()));
    vec![std::thread::spawn(move || {
        while Instant::now() < until {
            let now = crate::scenarios::monotonic_ns();
            for uuid in &uuids {
                board.want_memory(uuid, bytes, now + 1_000_000_000);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })]
}

/// Posts a thaw of `bytes` on each of its devices in its own turns, and keeps the post fresh.
fn forge_thaw(
    s: &Session<'_>,
    root: &Path,
    bytes: u64,
    until: Instant,
) -> Vec<std::thread::JoinHandle<()>> {
    let Some(board) = own_board(root, "forge-thaw") else {
        return Vec::new();
    };
    let devices = devices(s).len() as u32;
    attempt("forge-thaw", &board.dir().join("turns"), Ok(()));
    let hold = |now: u64| now + 30_000_000_000;
    let now = crate::scenarios::monotonic_ns();
    for d in 0..devices {
        board.begin_room(d, true, bytes, hold(now));
    }
    vec![std::thread::spawn(move || {
        while Instant::now() < until {
            let now = crate::scenarios::monotonic_ns();
            for d in 0..devices {
                board.begin_room(d, true, 0, hold(now));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })]
}

/// The container's own place on the node's board, as its processes open it (its slice's id from
/// its ledger); None, reported as attempt `what`, when it cannot be opened.
fn own_board(root: &Path, what: &str) -> Option<cuslice_state::board::Board> {
    use cuslice_state::board::{Board, Maker};
    let ledger = root.join("slice/ledger");
    let slice = match cuslice_state::ledger::Ledger::read(&ledger) {
        Ok(l) => l.slice_id,
        Err(e) => {
            attempt(what, &ledger, Err(std::io::Error::other(e.to_string())));
            return None;
        }
    };
    let node = root.join("node");
    match Board::open(&node, slice, Maker::Hooked) {
        Ok(b) => Some(b),
        Err(e) => {
            attempt(what, &node, Err(std::io::Error::other(e.to_string())));
            None
        }
    }
}

/// Posts the slice's granted request on its first device in `n` entries of its claims file,
/// through the board's own door (each entry is admitted alone), and keeps them fresh.
fn duplicate(
    s: &Session<'_>,
    root: &Path,
    n: u32,
    until: Instant,
) -> Vec<std::thread::JoinHandle<()>> {
    use cuslice_policy::priority::Priority;
    use cuslice_state::board::{Post, read_grant};
    let Some(board) = own_board(root, "duplicate") else {
        return Vec::new();
    };
    let Some(uuid) = devices(s).first().copied() else {
        return Vec::new();
    };
    let grant = read_grant(&board.dir().join("grant"));
    let place = board.dir().join("claims");
    for d in 0..n {
        let r = board.claim(d, &uuid, grant.request, grant.limit, Priority::Normal);
        attempt(
            "duplicate-claim",
            &place,
            r.map_err(|e| std::io::Error::other(e.to_string())),
        );
    }
    vec![std::thread::spawn(move || {
        while Instant::now() < until {
            let now = crate::scenarios::monotonic_ns();
            for d in 0..n {
                let post = Post {
                    request: grant.request,
                    limit: grant.limit,
                    priority: Priority::Normal,
                    usage: 0,
                    hungry_until: 0,
                    active_ns: now,
                };
                board.post(d, &uuid, &post, now);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })]
}

/// The UUIDs of the devices the process sees.
fn devices(s: &Session<'_>) -> Vec<[u8; 16]> {
    let d = s.d;
    let mut n = 0;
    // SAFETY: out-pointer to a local.
    if unsafe { d.cuDeviceGetCount(&mut n) }.is_err() {
        return Vec::new();
    }
    (0..n)
        .filter_map(|i| {
            let mut dev = 0;
            let mut uuid = cuda_abi::CUuuid::default();
            // SAFETY: out-pointers to locals; `i` is below the device count.
            unsafe { d.cuDeviceGet(&mut dev, i) }.ok()?;
            // SAFETY: as above.
            unsafe { d.cuDeviceGetUuid_v2(&mut uuid, dev) }.ok()?;
            Some(uuid.bytes)
        })
        .collect()
}

/// Starts `n` processes of this program that initialise CUDA and stay until `secs` are up;
/// returns them once every one has said it is ready.
fn flood(n: u32, secs: f64) -> Vec<std::process::Child> {
    use std::io::BufRead;
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("cuda-workload"));
    let mut kids = Vec::new();
    for _ in 0..n {
        match std::process::Command::new(&exe)
            .args(["tamper", "--init-only", "--secs", &secs.to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            Ok(c) => kids.push(c),
            Err(e) => {
                attempt("flood", &exe, Err(e));
                break;
            }
        }
    }
    let mut ready = 0;
    for c in kids.iter_mut() {
        let mut line = String::new();
        if let Some(out) = c.stdout.take()
            && std::io::BufReader::new(out).read_line(&mut line).is_ok()
            && line.contains("\"initialised\"")
        {
            ready += 1;
        }
    }
    emit(
        "flooded",
        json!({"processes": kids.len(), "initialised": ready}),
    );
    kids
}

/// Raises the slice's spill bound and clears its spilled count in the ledger, as one who has
/// read the ledger's layout would: the bound is the word that holds the configured spill.
fn spill_words(root: &Path, mib: u64, until: Instant) -> Option<std::thread::JoinHandle<()>> {
    let path = root.join("slice/ledger");
    let found = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .and_then(|f| {
            let bytes = std::fs::read(&path)?;
            let want = (mib << 20).to_le_bytes();
            let at = bytes
                .chunks_exact(8)
                .position(|w| w == want)
                .ok_or_else(|| std::io::Error::other(format!("no word holds {mib} MiB")))?;
            let at = at as u64 * 8;
            rewrite(&f, at)?;
            Ok((f, at))
        });
    let ok = found
        .as_ref()
        .map(|_| ())
        .map_err(|e| std::io::Error::other(e.to_string()));
    attempt("spill-words", &path, ok);
    let (f, at) = found.ok()?;
    Some(std::thread::spawn(move || {
        while Instant::now() < until {
            let _ = rewrite(&f, at);
            std::thread::sleep(Duration::from_millis(1));
        }
    }))
}

/// The spill bound at `at` to 1 TiB, the spilled count after it to 0.
fn rewrite(f: &std::fs::File, at: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    f.write_all_at(&(1u64 << 40).to_le_bytes(), at)?;
    f.write_all_at(&0u64.to_le_bytes(), at + 8)
}

/// A flood process: cuInit (which is where a process joins the compute arbitration), then wait.
pub fn init_only(d: &crate::driver::Driver, secs: f64) -> u8 {
    // SAFETY: plain flags argument.
    let r = unsafe { d.cuInit(0) };
    emit("initialised", json!({"ok": r.is_ok()}));
    std::thread::sleep(Duration::from_secs_f64(secs));
    0
}

/// The attack, after the process's own CUDA session is open.
pub fn tamper(s: &Session<'_>, a: &TamperArgs) {
    let until = Instant::now() + Duration::from_secs_f64(a.secs);
    if a.survey {
        survey(&a.root);
    }
    let mut held = Vec::new();
    let mut forgers = if a.forge {
        forge(s, &a.root, until, a.forge_launched, a.forge_flicker)
    } else {
        Vec::new()
    };
    if a.duplicate_claims > 0 {
        forgers.extend(duplicate(s, &a.root, a.duplicate_claims, until));
    }
    let mut kids = if a.flood > 0 {
        flood(a.flood, a.secs + 5.0)
    } else {
        Vec::new()
    };
    if a.replace {
        replace(&a.root, &mut held);
    }
    if a.grow_mib > 0 {
        grow(&a.root, a.grow_mib);
    }
    if a.fallocate_mib > 0 {
        fallocate_past_end(&a.root, a.fallocate_mib);
    }
    if a.spill_words_mib > 0 {
        forgers.extend(spill_words(&a.root, a.spill_words_mib, until));
    }
    if a.forge_want_gib > 0 {
        forgers.extend(forge_want(s, &a.root, a.forge_want_gib << 30, until));
    }
    if a.forge_thaw_gib > 0 {
        forgers.extend(forge_thaw(s, &a.root, a.forge_thaw_gib << 30, until));
    }
    emit("ready", json!({}));
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
    for f in forgers {
        let _ = f.join();
    }
    for k in kids.iter_mut() {
        let _ = k.kill();
        let _ = k.wait();
    }
    drop(held);
}

#[derive(Clone, Debug, Args)]
pub struct DropPreloadArgs {
    /// The preload file to hide
    #[arg(long, default_value = "/etc/ld.so.preload")]
    pub file: PathBuf,
    /// Also put SOURCE over TARGET (`TARGET=SOURCE`, a bind mount), e.g. a FIFO, or a file of
    /// the process's own, over its slice's config file
    #[arg(long, value_name = "TARGET=SOURCE")]
    pub over: Vec<String>,
    /// The command to run without it
    #[arg(trailing_var_arg = true, required = true)]
    pub command: Vec<String>,
}

/// Runs a command with the preload file hidden, as any unprivileged process can: a user
/// namespace of its own (with a mount namespace it owns), `/dev/null` bind-mounted over the
/// file, then exec. A `dropped` line says whether the file is hidden; returns only on failure.
pub fn drop_preload(a: &DropPreloadArgs) -> u8 {
    use std::ffi::CString;
    let step = |what: &str, r: std::io::Result<()>| -> bool {
        if let Err(e) = &r {
            emit(
                "dropped",
                json!({"ok": false, "step": what, "error": e.to_string()}),
            );
            eprintln!("cuda-workload drop-preload: {what}: {e}");
        }
        r.is_ok()
    };
    let os = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: flags only.
    let unshared = unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) };
    if !step("unshare", os(unshared)) {
        return 1;
    }
    // No id maps: the bind mount below needs only the namespace's own CAP_SYS_ADMIN, which
    // unshare gives; mapping ids takes capabilities a container's root lacks (CAP_SETFCAP for
    // root inside). Unmapped, the process keeps its ids outside, so it reads what it read before.
    let (Ok(null), Ok(target), Ok(root)) = (
        CString::new("/dev/null"),
        CString::new(a.file.as_os_str().as_encoded_bytes()),
        CString::new("/"),
    ) else {
        step(
            "paths",
            Err(std::io::Error::other("a path holds a NUL byte")),
        );
        return 1;
    };
    // SAFETY: NUL-terminated paths that outlive the calls; no data argument.
    let private = os(unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    });
    let bind = |source: &CString, target: &CString| {
        // SAFETY: NUL-terminated paths that outlive the call; no data argument.
        os(unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        })
    };
    let bound = private.and_then(|()| bind(&null, &target));
    if !step("bind mount", bound) {
        return 1;
    }
    for over in &a.over {
        let Some((Ok(target), Ok(source))) = over
            .split_once('=')
            .map(|(t, s)| (CString::new(t), CString::new(s)))
        else {
            step(
                "--over",
                Err(std::io::Error::other(format!("{over}: not TARGET=SOURCE"))),
            );
            return 1;
        };
        if !step(&format!("bind mount over {over}"), bind(&source, &target)) {
            return 1;
        }
    }
    let left = std::fs::read(&a.file).map_or(0, |b| b.len());
    emit(
        "dropped",
        json!({"ok": left == 0, "file": a.file, "bytes_left": left}),
    );
    use std::os::unix::process::CommandExt;
    let e = std::process::Command::new(&a.command[0])
        .args(&a.command[1..])
        .exec();
    step("exec", Err(e));
    1
}
