//! Memory this slice waits for on a full device, and what other slices wait for (freezing on
//! demand, `freeze`): each slice posts its want in its own claims on the node's compute board
//! (`Board::want_memory`) and reads the others' there. The board and each device's UUID are
//! set once the process joined the node's board (`compute::join`), by the slice's ordinal.

use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, Ordering};

use cuslice_state::board::{Board, now_ns};

/// One device of the slice: its place on the board (None: no board) and its UUID.
pub struct Place {
    pub board: Option<Arc<Board>>,
    pub uuid: [u8; 16],
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
        }) => b.memory_wanted(uuid, now_ns()),
        _ => 0,
    }
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
