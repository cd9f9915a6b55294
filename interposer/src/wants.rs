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

/// In a forked child: the parent's places are not its own (it joins afresh at its cuInit).
pub fn child_after_fork() {
    PLACES.store(std::ptr::null_mut(), Ordering::Relaxed);
}
