//! Memory this slice waits for on a full device, and what other slices wait for (freezing on
//! demand, `freeze`): each slice posts its want in its own claims on the node's compute board
//! (`Board::want_memory`) and reads the others' there. The board and each device's UUID are
//! set once the process joined the node's board (`compute::join`), by the slice's ordinal.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use cuda_abi::CUresult;
use cuslice_policy::room::{self, Belief};
use cuslice_state::board::{Board, now_ns};

use cuslice_policy::config::Config;

/// One device of the slice: its place on the board (None: no board), its UUID and its index in
/// the slice's ledger (its entry on the board).
pub struct Place {
    pub board: Option<Arc<Board>>,
    pub uuid: [u8; 16],
    pub index: u32,
    /// Its memory (bytes).
    pub physical: u64,
    /// Whether another slice on the device may be frozen, as last looked (`freezers`), and when
    /// (CLOCK_MONOTONIC_COARSE ns).
    pub freezers: AtomicBool,
    pub looked: AtomicU64,
}

impl Place {
    pub fn new(board: Option<Arc<Board>>, uuid: [u8; 16], index: u32, physical: u64) -> Place {
        Place {
            board,
            uuid,
            index,
            physical,
            freezers: AtomicBool::new(false),
            looked: AtomicU64::new(0),
        }
    }

    /// Whether another slice on the device may be frozen (`Board::freezers_on`), looked at again
    /// at most every `LOOK_NS`: a slice freezes after a second quiet on the device, so none that
    /// could be thawing is missed. An allocation's cheapest path: a clock read and two loads.
    fn freezers(&self, b: &Board) -> bool {
        const LOOK_NS: u64 = 200_000_000;
        let now = coarse_ns();
        let looked = self.looked.load(Ordering::Relaxed);
        if looked != 0 && now.saturating_sub(looked) < LOOK_NS {
            return self.freezers.load(Ordering::Relaxed);
        }
        let f = b.freezers_on(self.index, &self.uuid, now_ns());
        self.freezers.store(f, Ordering::Relaxed);
        self.looked.store(now.max(1), Ordering::Relaxed);
        f
    }
}

/// CLOCK_MONOTONIC_COARSE in ns: a few ns to read, a few ms coarse.
fn coarse_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC_COARSE exists on every kernel this runs on.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The slice's devices, by ordinal (leaked once set: a forked child sets its own).
static PLACES: AtomicPtr<Vec<Place>> = AtomicPtr::new(std::ptr::null_mut());

fn places() -> &'static [Place] {
    let p = PLACES.load(Ordering::Acquire);
    if p.is_null() {
        return &[];
    }
    // SAFETY: set once from a leaked Box (`set`), never freed.
    unsafe { &*p }
}

/// Sets the slice's devices' places (at joining).
pub fn set(places: Vec<Place>) {
    let p: &'static mut Vec<Place> = Box::leak(Box::new(places));
    PLACES.store(p, Ordering::Release);
}

/// Posts that this slice waits for `bytes` on device `ordinal`, which has no room, until `until`
/// (monotonic ns; 0: it no longer waits).
pub fn post(ordinal: usize, bytes: u64, until: u64) {
    if let Some(Place {
        board: Some(b),
        uuid,
        ..
    }) = places().get(ordinal)
    {
        b.want_memory(uuid, bytes, until);
    }
}

/// Posts a want of `bytes` on device `ordinal` that holds for `for_ns` from now.
pub fn post_for(ordinal: usize, bytes: u64, for_ns: u64) {
    post(ordinal, bytes, now_ns() + for_ns);
}

/// The most another slice on the node waits for on device `ordinal` now (0: none, or no board).
pub fn wanted(ordinal: usize) -> u64 {
    match places().get(ordinal) {
        Some(Place {
            board: Some(b),
            uuid,
            ..
        }) => b.memory_wanted(uuid, now_ns()),
        _ => 0,
    }
}

/// Allocates `bytes` on device `ordinal` by `alloc`, which the slice's cap allows: beside the
/// thaws under way there (`take_room`), and, where the device has no room, as `wait_for_room`
/// says. Every family of device memory the slice is charged for comes here (`memory`, `vmm`,
/// `pool`, `array`).
pub fn allocate(
    config: &Config,
    ordinal: usize,
    bytes: u64,
    alloc: &mut impl FnMut() -> CUresult,
) -> CUresult {
    let mut beside = || take_room(config, ordinal, bytes, false, alloc);
    let r = beside();
    if r == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return wait_for_room(config.memory_wait, ordinal, bytes, &mut beside);
    }
    r
}

/// What this process believes of other slices' thaws (`cuslice_policy::room`).
static BELIEF: parking_lot::Mutex<Belief> = parking_lot::Mutex::new(Belief::new());

/// Makes an allocation of `bytes` on device `ordinal` by `alloc` (called once), leaving the
/// thaws under way there their room: it posts what it takes on the node's board, then reads what
/// every slice restores there, and goes only if the device has room for both; else it takes its
/// post back and waits. The thaw posts first and looks after (`freeze`), so one of the two sees
/// the other. A context's creation comes here too (`context`), with what one takes.
pub fn take_room(
    config: &Config,
    ordinal: usize,
    bytes: u64,
    context: bool,
    alloc: &mut impl FnMut() -> CUresult,
) -> CUresult {
    /// An allocation's post holds this long at most (a process that dies in the driver call).
    const HOLD_NS: u64 = 5_000_000_000;
    const RETRY: std::time::Duration = std::time::Duration::from_millis(5);
    let Some(
        place @ Place {
            board: Some(b),
            uuid,
            index,
            physical,
            ..
        },
    ) = places().get(ordinal)
    else {
        return alloc();
    };
    // Where no slice may be frozen, none thaws: nothing to post or look at.
    if config.memory_freeze_idle.is_none() && !place.freezers(b) {
        return alloc();
    }
    let mut said = false;
    loop {
        let now = now_ns();
        b.begin_room(*index, false, bytes, now + HOLD_NS);
        let rooms = b.rooms(*index, uuid, now, false);
        let thawing = if rooms.iter().any(|r| r.thawing != 0) {
            BELIEF
                .lock()
                .thawing(rooms.iter().map(|r| (r.slice, r.thawing)), now)
        } else {
            0
        };
        let go = thawing == 0
            || crate::nvml_query::device_free(uuid, *physical)
                .is_none_or(|free| room::may_allocate(free, thawing, bytes));
        if go {
            let r = alloc();
            b.end_room(*index, false, bytes);
            return r;
        }
        b.end_room(*index, false, bytes);
        if !said {
            said = true;
            let what = if context {
                "a new context".to_string()
            } else {
                format!("an allocation of {}", cuslice_policy::format_size(bytes))
            };
            crate::log::info!(
                "device {ordinal}: {what} waits while {} comes back to the device from a frozen process",
                cuslice_policy::format_size(thawing)
            );
        }
        std::thread::sleep(RETRY);
    }
}

/// Posts on the node's board that this process restores `bytes` on device `ordinal` until
/// `until` at the latest (`take_room` on the other side); `begin` false takes such a post back.
pub fn post_thaw(ordinal: usize, bytes: u64, until: u64, begin: bool) {
    if let Some(Place {
        board: Some(b),
        index,
        ..
    }) = places().get(ordinal)
    {
        if begin {
            b.begin_room(*index, true, bytes, until);
        } else {
            b.end_room(*index, true, bytes);
        }
    }
}

/// What the slices on device `ordinal` are taking there now, as a thaw counts it: the bytes
/// other thaws restore (as this process believes them) and the bytes being allocated. `rescan`:
/// look for slices that joined the board since the last look.
pub fn beside_thaw(ordinal: usize, own: u64, rescan: bool) -> (u64, u64) {
    let Some(Place {
        board: Some(b),
        uuid,
        index,
        ..
    }) = places().get(ordinal)
    else {
        return (0, 0);
    };
    let now = now_ns();
    let rooms = b.rooms(*index, uuid, now, rescan);
    let allocating = rooms
        .iter()
        .fold(0u64, |a, r| a.saturating_add(r.allocating));
    // This slice's own post holds this thaw's bytes too.
    let posts = rooms.iter().map(|r| {
        let t = if r.slice == b.slice() {
            r.thawing.saturating_sub(own)
        } else {
            r.thawing
        };
        (r.slice, t)
    });
    (BELIEF.lock().thawing(posts, now), allocating)
}

/// The device has no room for an allocation the slice's cap allows (the driver said
/// OUT_OF_MEMORY: the caps of the slices on it add up past it). With `CUSLICE_MEMORY_WAIT`
/// (`wait`), the slice posts what it waits for on the node's board, where the freezers of other
/// slices' idle processes see it and give their memory back (`freeze`), and the allocation is
/// tried again until it fits or the wait is over; without it, the driver's answer stands. Every
/// family of device memory the slice is charged for comes here (`memory`, `vmm`, `pool`).
pub fn wait_for_room(
    wait: Option<std::time::Duration>,
    dev: usize,
    bytes: u64,
    alloc: &mut impl FnMut() -> cuda_abi::CUresult,
) -> cuda_abi::CUresult {
    const RETRY: std::time::Duration = std::time::Duration::from_millis(20);
    /// A want is posted to hold this long, and again at each retry.
    const WANT_NS: u64 = 1_000_000_000;
    let oom = cuda_abi::CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    let Some(wait) = wait else {
        return oom;
    };
    // However long it waits, the process is not idle (`freeze`).
    let _busy = crate::gate::busy_while();
    let started = std::time::Instant::now();
    crate::log::info!(
        "device {dev} has no room for {}: waiting up to {} while idle processes of other slices give theirs back",
        cuslice_policy::format_size(bytes),
        cuslice_policy::duration::format_duration(wait)
    );
    loop {
        post_for(dev, bytes, WANT_NS);
        std::thread::sleep(RETRY);
        let r = alloc();
        if r != oom || started.elapsed() >= wait {
            post(dev, bytes, 0);
            if r == oom {
                crate::log::info!(
                    "device {dev} had no room for {} within {}",
                    cuslice_policy::format_size(bytes),
                    cuslice_policy::duration::format_duration(wait)
                );
            } else {
                crate::log::info!(
                    "device {dev} had room for {} after {} ms",
                    cuslice_policy::format_size(bytes),
                    started.elapsed().as_millis()
                );
            }
            return r;
        }
    }
}

/// In a forked child: the parent's places are not its own (it joins afresh at its cuInit).
pub fn child_after_fork() {
    PLACES.store(std::ptr::null_mut(), Ordering::Relaxed);
}
