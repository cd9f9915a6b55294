//! Freezing an idle process (`CUSLICE_MEMORY_FREEZE_IDLE`): after that long without a CUDA call,
//! the process's device memory goes to its own host memory through the driver's checkpoint API
//! (`cuCheckpointProcessLock`, then `cuCheckpointProcessCheckpoint`), and the device has it back.
//! Its next CUDA call, on any thread, thaws it: waits until the devices have room for what it
//! held, restores it (same addresses, same bytes) and unlocks it, then goes on.
//!
//! On demand: a process quiet for a second (or its idle time, if shorter) is frozen sooner when
//! another slice waits for room on a device where it holds memory: an allocation the other's cap
//! allows but the device cannot serve (`CUSLICE_MEMORY_WAIT`, `wants::wait_for_room`), or a
//! thaw that waits for room. Each posts what it waits for in its own slice's claims on the node's
//! board (`Board::want_memory`); the freezer believes a want only where NVML shows the device
//! short of it.
//!
//! - The freezer is a thread of the process (`cuslice-freeze`). It arms the `gate` every tick and
//!   looks whether a call opened it since; once none has for the idle time, it shuts the gate
//!   (only if still armed: a call that came meanwhile wins), makes sure no call waits inside
//!   cuslice (at the cap, for a compute turn, in a synchronize) and that the process has no work
//!   queued on a device, and asks the driver to lock the process with a short timeout: the driver
//!   answers NOT_READY while a call of the process is under way in it, and the process is left
//!   running.
//! - A thaw is the gate's hold: the first call at the shut gate takes the freeze lock, restores,
//!   unlocks, opens the gate; the others wait for the same lock and go on. The freezer thaws the
//!   process itself if, while it is frozen, it loads an object linked against libcuda (or NCCL
//!   in a rank of several), and then never freezes it again.
//! - The slice's cap is unchanged: what the process holds stays charged to the slice in the
//!   ledger while it is frozen, so a thaw never finds its own slice's cap taken. Room on the
//!   device is another matter (the slice's neighbours may have used what it gave back): a thaw
//!   waits until NVML says the device has what the process held free, because a restore that
//!   meets OUT_OF_MEMORY leaves the process stuck for good (driver 580).
//! - Never frozen, each said once in one line (`CUSLICE_LOG=info`), the process left running: a
//!   process linked against libcuda.so (its calls to the driver's exports reach the driver
//!   without passing a stub, and would wait there for good), one rank of a distributed job with
//!   NCCL loaded (the checkpoint API hangs NCCL jobs), one on a MIG instance (not supported),
//!   one whose driver lacks the checkpoint API, and one the driver refuses to checkpoint
//!   (managed memory, memory shared through IPC or VMM handles): those it unlocks at once, and
//!   tries again at its next idle spell.

use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuda_abi::CUresult;
use parking_lot::Mutex;

use crate::membership::Slice;
use crate::{gate, nvml_query, real, turns};
use cuslice_policy::duration::format_duration;
use cuslice_policy::format_size;
use cuslice_policy::room;
use cuslice_state::board::{ROOM_AHEAD_NS, give_way, now_ns};

/// How long the driver's lock may wait for a call under way before the freeze gives up.
const LOCK_TIMEOUT_MS: u32 = 100;
/// How often a thaw that waits for room looks again.
const ROOM_POLL: Duration = Duration::from_millis(20);
/// A thaw that waits for room posts what it waits for to hold this long, and again as it waits.
const WANT_NS: u64 = 1_000_000_000;
/// A thaw's post of the room it restores holds this long, and a second more per GiB.
const RESTORE_HOLD_NS: u64 = 10_000_000_000;
/// A process quiet this long (or its idle time, if shorter) is frozen when another slice waits
/// for room on a device where it holds memory: a want posted by a slice that lies costs the
/// processes it freezes a thaw, never sooner than this.
const ON_DEMAND_QUIET: Duration = Duration::from_secs(1);

/// Held for a whole freeze and a whole thaw.
static FREEZE: Mutex<()> = Mutex::new(());
static FROZEN: AtomicBool = AtomicBool::new(false);
/// Per device (the slice's ordinal): what the process held when it was frozen.
static HELD: [AtomicU64; cuslice_state::ledger::MAX_DEVICES] =
    [const { AtomicU64::new(0) }; cuslice_state::ledger::MAX_DEVICES];
/// The slice, for the thaw.
static SLICE: std::sync::OnceLock<&'static Slice> = std::sync::OnceLock::new();
/// Reasons already said (bits of `Refusal`), so each is said once.
static SAID: AtomicU32 = AtomicU32::new(0);

/// `CUcheckpointLockArgs`.
#[repr(C)]
struct LockArgs {
    timeout_ms: u32,
    reserved0: u32,
    reserved1: [u64; 7],
}

/// Why a process is not frozen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// For good.
    Linked,
    Nccl,
    Mig,
    NoApi,
    Stubs,
    /// This time: the driver refused (managed memory, IPC, VMM export).
    Driver(CUresult),
}

impl Refusal {
    fn bit(self) -> u32 {
        match self {
            Refusal::Linked => 1,
            Refusal::Nccl => 2,
            Refusal::Mig => 4,
            Refusal::NoApi => 8,
            Refusal::Stubs => 16,
            Refusal::Driver(_) => 32,
        }
    }
    fn for_good(self) -> bool {
        !matches!(self, Refusal::Driver(_))
    }
}

/// Starts the freezer when the slice sets an idle time (once per process).
pub fn start(s: &'static Slice) {
    let Some(idle) = s.config.memory_freeze_idle else {
        return;
    };
    if SLICE.set(s).is_err() {
        return;
    }
    gate::set_hold(thaw_hold);
    if let Err(e) = std::thread::Builder::new()
        .name("cuslice-freeze".into())
        .spawn(move || freezer(s, idle))
    {
        crate::log::error!(
            "cannot start the freeze thread: {e}; this process's memory is never frozen"
        );
    }
}

/// The freezer thread: arms the gate, and looks every tick whether a call came since.
fn freezer(s: &'static Slice, idle: Duration) {
    let tick = (idle / 4).clamp(Duration::from_millis(100), Duration::from_millis(250));
    let on_demand = idle.min(ON_DEMAND_QUIET);
    let mut quiet_since = Instant::now();
    gate::arm();
    loop {
        std::thread::sleep(tick);
        if FROZEN.load(Ordering::Acquire) {
            // Loaded while frozen: an object linked against libcuda, whose first call to a
            // function cuslice does not wrap would wait in the driver, where no gate sees it
            // (until this thaw); or NCCL in a rank of several.
            let gone = if linked_object().is_some() {
                Some(Refusal::Linked)
            } else if nccl_in_use() {
                Some(Refusal::Nccl)
            } else {
                None
            };
            if let Some(r) = gone {
                thaw();
                say(r);
                return;
            }
        }
        // A call that waits inside cuslice (for room, at the cap, for a turn) makes no call
        // through a stub meanwhile: the process was not quiet.
        if FROZEN.load(Ordering::Acquire) || !gate::quiet() || gate::busy() {
            quiet_since = Instant::now();
            gate::arm();
            continue;
        }
        let quiet = quiet_since.elapsed();
        let why = if quiet >= idle {
            format!("{} idle", format_duration(idle))
        } else if quiet < on_demand {
            continue;
        } else if let Some((i, wanted, free)) = wanted_here(s) {
            format!(
                "{} quiet: another slice waits for {} on device {i}, where {} is free",
                format_duration(quiet),
                format_size(wanted),
                format_size(free)
            )
        } else {
            continue;
        };
        match freeze(s, &why) {
            Ok(true) => {}
            // Not idle after all: a call came, waits inside cuslice or the driver, or work is
            // queued.
            Ok(false) => quiet_since = Instant::now(),
            Err(r) => {
                say(r);
                if r.for_good() {
                    return;
                }
                quiet_since = Instant::now();
            }
        }
        gate::arm();
    }
}

/// Says once why the process is not frozen.
fn say(r: Refusal) {
    if SAID.fetch_or(r.bit(), Ordering::Relaxed) & r.bit() != 0 {
        return;
    }
    let why = match r {
        Refusal::Linked => linked_object()
            .map(|o| format!("{o} is linked against libcuda.so, and its calls to the driver cannot be held while the process is frozen"))
            .unwrap_or_default(),
        Refusal::Nccl => "NCCL is loaded and the process is one rank of several (WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS or MASTER_ADDR), and the driver's checkpoint hangs NCCL jobs".into(),
        Refusal::Mig => "it runs on a MIG instance (or one NVML cannot tell is not), which the driver's checkpoint does not support".into(),
        Refusal::NoApi => "the driver lacks the checkpoint API (cuCheckpointProcess*, CUDA 12.8, driver 550 or later)".into(),
        Refusal::Stubs => format!("every one of the {} gate stubs is taken", gate::STUBS),
        Refusal::Driver(e) => format!(
            "the driver refused to checkpoint it ({e:?}: managed memory, or memory shared through IPC or VMM handles); tried again at its next idle spell"
        ),
    };
    crate::log::info!("not frozen: {why}");
}

/// A device where this process holds memory and another slice waits for more than is free there
/// (`wants::wanted`): (its ordinal, what is wanted, what is free). A want is believed
/// only as far as NVML bears it out: a device with room for it needs nobody frozen.
fn wanted_here(s: &Slice) -> Option<(usize, u64, u64)> {
    s.devs().iter().enumerate().find_map(|(i, d)| {
        if s.own_charged(i) == 0 {
            return None;
        }
        let wanted = crate::wants::wanted(i);
        let free = free_on(d)?;
        (wanted > free).then_some((i, wanted, free))
    })
}

/// What NVML says is free on device `d` now.
fn free_on(d: &crate::membership::Dev) -> Option<u64> {
    nvml_query::device_free(&d.uuid, d.physical)
}

/// Tries to freeze the process, which has made no call since the gate was armed (`why`: for how
/// long, and why now). Ok(false): it is not idle after all.
fn freeze(s: &'static Slice, why: &str) -> Result<bool, Refusal> {
    if !gate::complete() {
        return Err(Refusal::Stubs);
    }
    if linked_object().is_some() {
        return Err(Refusal::Linked);
    }
    if nccl_in_use() {
        return Err(Refusal::Nccl);
    }
    if s.devs()
        .iter()
        .any(|d| nvml_query::mig_enabled(&d.uuid) != Some(false))
    {
        return Err(Refusal::Mig);
    }
    let (Some(lock), Some(checkpoint), Some(unlock)) = (
        real::cuCheckpointProcessLock(),
        real::cuCheckpointProcessCheckpoint(),
        real::cuCheckpointProcessUnlock(),
    ) else {
        return Err(Refusal::NoApi);
    };
    let held: Vec<u64> = (0..s.devs().len()).map(|i| s.own_charged(i)).collect();
    if held.iter().all(|&b| b == 0) {
        // Nothing on any device: nothing to give back.
        return Ok(false);
    }
    if work_queued(s, &held) {
        return Ok(false);
    }
    let _g = FREEZE.lock();
    // A call since the gate was armed opened it, and then this fails; a call from now on waits
    // at the shut gate.
    if !gate::shut_if_quiet() {
        return Ok(false);
    }
    if gate::busy() || turns::any_involved() {
        gate::open();
        return Ok(false);
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let args = LockArgs {
        timeout_ms: LOCK_TIMEOUT_MS,
        reserved0: 0,
        reserved1: [0; 7],
    };
    let started = Instant::now();
    // SAFETY: the driver's prototype; a CUcheckpointLockArgs with its reserved words zero.
    let r = unsafe { lock(pid, (&args as *const LockArgs).cast()) };
    if r == CUresult::CUDA_ERROR_NOT_READY {
        gate::open();
        return Ok(false);
    }
    if !r.is_ok() {
        gate::open();
        return Err(Refusal::Driver(r));
    }
    // SAFETY: the driver's prototype; NULL arguments are all-reserved ones.
    let r = unsafe { checkpoint(pid, std::ptr::null()) };
    if !r.is_ok() {
        // SAFETY: as above.
        unsafe { unlock(pid, std::ptr::null()) };
        gate::open();
        return Err(Refusal::Driver(r));
    }
    for (h, b) in HELD.iter().zip(&held) {
        h.store(*b, Ordering::Relaxed);
    }
    FROZEN.store(true, Ordering::Release);
    // The node's tools show what it held as frozen, apart from the device's (still charged).
    s.ledger
        .set_frozen(s.slot, cuslice_state::board::now_ns().max(1));
    crate::log::info!(
        "frozen after {why}: {} of device memory went to the host in {} ms",
        format_size(held.iter().sum()),
        started.elapsed().as_millis()
    );
    Ok(true)
}

/// Whether the process still has work on a device: its primary context there takes more than
/// `QUEUED` to synchronise. A thread of the process may be waiting inside the driver for that
/// work (a synchronous copy behind a long kernel), where no count sees it; locked, it would wait
/// there for good.
fn work_queued(s: &Slice, held: &[u64]) -> bool {
    const QUEUED: Duration = Duration::from_millis(20);
    let (Some(state), Some(retain), Some(release), Some(set), Some(sync)) = (
        real::cuDevicePrimaryCtxGetState(),
        real::cuDevicePrimaryCtxRetain(),
        real::cuDevicePrimaryCtxRelease_v2(),
        real::cuCtxSetCurrent(),
        real::cuCtxSynchronize(),
    ) else {
        return true;
    };
    for (d, _) in s.devs().iter().zip(held).filter(|(_, b)| **b > 0) {
        let (mut flags, mut active) = (0, 0);
        // SAFETY: valid out-pointers and a device of the process.
        if !unsafe { state(d.cudev, &mut flags, &mut active) }.is_ok() || active == 0 {
            continue;
        }
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the device's primary context, already active (retaining it takes nothing).
        if !unsafe { retain(&mut ctx, d.cudev) }.is_ok() {
            return true;
        }
        let started = Instant::now();
        // SAFETY: this thread's own current context, set and cleared around one synchronise.
        let r = unsafe {
            set(ctx);
            let r = sync();
            set(std::ptr::null_mut());
            release(d.cudev);
            r
        };
        if !r.is_ok() || started.elapsed() > QUEUED {
            return true;
        }
    }
    false
}

/// The gate's hold: a call of a frozen process thaws it first.
extern "C" fn thaw_hold() {
    thaw();
}

fn thaw() {
    let _g = FREEZE.lock();
    if !FROZEN.load(Ordering::Acquire) {
        // Not frozen (a freeze that gave up, or another thread thawed it meanwhile).
        gate::open();
        return;
    }
    let Some(s) = SLICE.get() else {
        return;
    };
    let started = Instant::now();
    let posts = loop {
        wait_for_room(s);
        if let Some(posts) = hold_room(s) {
            break posts;
        }
    };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let (Some(restore), Some(unlock)) = (
        real::cuCheckpointProcessRestore(),
        real::cuCheckpointProcessUnlock(),
    ) else {
        release_room(&posts);
        return;
    };
    // SAFETY: the driver's prototype; NULL arguments are all-reserved ones.
    let r = unsafe { restore(pid, std::ptr::null()) };
    release_room(&posts);
    if !r.is_ok() {
        static SAID_STUCK: AtomicBool = AtomicBool::new(false);
        if !SAID_STUCK.swap(true, Ordering::Relaxed) {
            crate::log::error!(
                "the driver could not restore this process's device memory ({r:?}); its CUDA calls cannot go on"
            );
        }
        return;
    }
    // SAFETY: as above.
    let r = unsafe { unlock(pid, std::ptr::null()) };
    if !r.is_ok() {
        crate::log::error!("the driver could not unlock this process after its restore ({r:?})");
    }
    FROZEN.store(false, Ordering::Release);
    s.ledger.set_frozen(s.slot, 0);
    let took = started.elapsed();
    crate::log::info!(
        "thawed: {} back on the device in {} ms",
        format_size(HELD.iter().map(|h| h.load(Ordering::Relaxed)).sum()),
        took.as_millis()
    );
    gate::open();
}

/// Waits until every device has room for what the process held there (NVML's free memory).
/// Meanwhile it posts what it waits for on the node's board, as an allocation that finds no room
/// does: idle processes of other slices that freeze give theirs back.
fn wait_for_room(s: &Slice) {
    let mut said = false;
    let mut posted: Option<usize> = None;
    loop {
        let short = s.devs().iter().enumerate().find_map(|(i, d)| {
            let need = HELD.get(i)?.load(Ordering::Relaxed);
            let free = free_on(d)?;
            (free < need).then_some((i, need, free))
        });
        let Some((i, need, free)) = short else {
            if let Some(p) = posted {
                crate::wants::post(p, 0, 0);
            }
            return;
        };
        if let Some(p) = posted.filter(|&p| p != i) {
            crate::wants::post(p, 0, 0);
        }
        if !said {
            said = true;
            crate::log::info!(
                "thaw waits for room on device {i}: it needs {}, {} is free",
                format_size(need),
                format_size(free)
            );
        }
        crate::wants::post_for(i, need, WANT_NS);
        posted = Some(i);
        std::thread::sleep(ROOM_POLL);
    }
}

/// Makes the room the restore needs its own: posts on the node's board what it restores on
/// each device, waits for the allocations under way there to end (`ALLOCATIONS_WAIT_NS` at
/// most), and looks again. An allocation that posts after this post sees it and waits for the
/// restore (`wants::take_room`); one that posted before is over, and NVML counts it, or is
/// waited for. Some(the posts) if every device has room for this thaw beside the others under
/// way; else the posts are taken back, and None after a random moment (two thaws that see
/// each other do not go on seeing each other).
fn hold_room(s: &Slice) -> Option<Vec<(usize, u64)>> {
    let now = now_ns();
    let posts: Vec<(usize, u64)> = (0..s.devs().len())
        .filter_map(|i| Some((i, HELD.get(i)?.load(Ordering::Relaxed))))
        .filter(|(_, need)| *need > 0)
        .collect();
    for &(i, need) in &posts {
        // Restores run at gigabytes a second; a post lapses if this process dies meanwhile.
        let until = now + RESTORE_HOLD_NS + need / (1 << 30) * 1_000_000_000;
        crate::wants::post_thaw(i, need, until.min(now + ROOM_AHEAD_NS), true);
    }
    let end = now + room::ALLOCATIONS_WAIT_NS;
    let mut fits = true;
    for &(i, need) in &posts {
        let mut rescan = true;
        let thawing = loop {
            let (thawing, allocating) = crate::wants::beside_thaw(i, need, rescan);
            rescan = false;
            if allocating == 0 || now_ns() >= end {
                break thawing;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let free = s.devs().get(i).and_then(free_on);
        fits &= free.is_none_or(|f| room::may_restore(f, thawing, need));
    }
    if fits {
        return Some(posts);
    }
    release_room(&posts);
    give_way(now, 20);
    None
}

/// Takes back what `hold_room` posted.
fn release_room(posts: &[(usize, u64)]) {
    for &(i, need) in posts {
        crate::wants::post_thaw(i, need, 0, false);
    }
}

/// The loaded object (other than libcuda itself) that lists libcuda.so.1 as needed, if any.
fn linked_object() -> Option<String> {
    let mut found: Option<String> = None;
    objects(|name, needed| {
        if found.is_none()
            && needed.iter().any(|n| n.starts_with(b"libcuda.so"))
            && !name.ends_with(b"libcuda.so.1")
        {
            found = Some(if name.is_empty() {
                "the program".into()
            } else {
                String::from_utf8_lossy(name).into_owned()
            });
        }
    });
    found
}

/// Whether the process may hold NCCL communicators: NCCL is loaded (PyTorch loads it at import,
/// communicators or not) and the process is one rank of several, by what every launcher of
/// distributed jobs sets (torchrun, mpirun, srun, PMI) or what `init_process_group` needs
/// (`MASTER_ADDR`).
fn nccl_in_use() -> bool {
    let mut loaded = false;
    objects(|name, _| {
        let base = name.rsplit(|&c| c == b'/').next().unwrap_or(name);
        loaded |= base.starts_with(b"libnccl");
    });
    loaded && ranks_of_several(|k| std::env::var(k).ok())
}

/// Whether the environment (`var`) says the process is one rank of a distributed job.
fn ranks_of_several(var: impl Fn(&str) -> Option<String>) -> bool {
    const SIZES: [&str; 5] = [
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "SLURM_NTASKS",
    ];
    SIZES.iter().any(|k| {
        var(k)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 1)
    }) || var("MASTER_ADDR").is_some_and(|v| !v.is_empty())
}

/// An entry of an ELF64 dynamic section.
#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}
const DT_NULL: i64 = 0;
const DT_NEEDED: i64 = 1;
const DT_STRTAB: i64 = 5;

/// What `objects` calls for each loaded object.
type EachObject<'a> = dyn FnMut(&[u8], Vec<&[u8]>) + 'a;

/// Calls `f(name, needed)` for each object loaded in the process: its file name (empty for the
/// program) and the names in its DT_NEEDED entries.
fn objects(mut f: impl FnMut(&[u8], Vec<&[u8]>)) {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the closure below, for the length of dl_iterate_phdr's call.
        let f = unsafe { &mut *(data as *mut &mut EachObject) };
        // SAFETY: glibc's description of a loaded object, valid during the callback.
        let info = unsafe { &*info };
        let name = if info.dlpi_name.is_null() {
            &b""[..]
        } else {
            // SAFETY: a NUL-terminated name that lives as long as the object.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes()
        };
        // SAFETY: the object's program headers, `dlpi_phnum` of them.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let mut needed = Vec::new();
        if let Some(dynamic) = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC) {
            let base = info.dlpi_addr as usize;
            let dyns = (base + dynamic.p_vaddr as usize) as *const Dyn;
            let (mut strtab, mut offsets) = (0usize, Vec::new());
            let mut i = 0;
            loop {
                // SAFETY: the object's dynamic section, mapped, ending with DT_NULL.
                let d = unsafe { &*dyns.add(i) };
                match d.tag {
                    DT_NULL => break,
                    DT_NEEDED => offsets.push(d.val as usize),
                    DT_STRTAB => strtab = d.val as usize,
                    _ => {}
                }
                i += 1;
            }
            // glibc relocates DT_STRTAB in place for most objects; not for all.
            if strtab != 0 && strtab < base {
                strtab += base;
            }
            if strtab != 0 {
                for o in offsets {
                    // SAFETY: a NUL-terminated string in the object's mapped string table.
                    needed.push(unsafe { CStr::from_ptr((strtab + o) as *const _) }.to_bytes());
                }
            }
        }
        f(name, needed);
        0
    }
    let mut f: &mut EachObject = &mut f;
    // SAFETY: `each` reads only what glibc hands it and calls `f`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut f as *mut &mut EachObject).cast()) };
}

/// In a forked child: not frozen (its parent's freezer thread is not there).
pub fn child_after_fork() {
    FROZEN.store(false, Ordering::Relaxed);
    gate::open();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_of_several_is_told_by_its_launchers_variables() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(!ranks_of_several(env(&[])));
        assert!(!ranks_of_several(env(&[
            ("WORLD_SIZE", "1"),
            ("SLURM_NTASKS", "x")
        ])));
        assert!(ranks_of_several(env(&[("WORLD_SIZE", "2")])));
        assert!(ranks_of_several(env(&[("OMPI_COMM_WORLD_SIZE", " 8")])));
        assert!(ranks_of_several(env(&[("SLURM_NTASKS", "4")])));
        assert!(ranks_of_several(env(&[("MASTER_ADDR", "10.0.0.1")])));
        assert!(!ranks_of_several(env(&[("MASTER_ADDR", "")])));
    }

    #[test]
    fn this_test_program_is_linked_against_no_libcuda_and_loads_no_nccl() {
        assert_eq!(linked_object(), None);
        let mut names = 0;
        objects(|_, needed| names += needed.len());
        assert!(names > 0, "the program's own DT_NEEDED entries are read");
        assert!(!nccl_in_use());
    }
}
