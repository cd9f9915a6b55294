//! Who holds a lock of the state file: every open [`crate::State`] that takes a lock (a CUDA
//! process, an NVML reader, `simgpu show`; registered as a process or not) first takes a
//! **locker**: one of `MAX_LOCKERS` entries of the header, each a generation word and a
//! liveness lock (an OFD write lock on byte `LOCKER_LOCK_BASE + i` of the state file). The
//! locks' words hold the holder's locker token (entry and generation), which means the same in
//! every process and pid namespace, and a waiter tells a dead holder from a live one by that
//! liveness lock: the kernel drops it when the process dies, however it dies, and a process that
//! is stopped or frozen keeps it.
//!
//! The liveness lock is held through a descriptor of its own (its own open file description,
//! neither mapped nor shared with anything else), because an OFD lock lives as long as its open
//! file description, and a forked child shares its parent's: a child that lived on with its
//! parent's would make a parent killed inside a lock look alive (and everyone wait) for as long
//! as the child lives. So a forked child closes those descriptors at once (a `pthread_atfork`
//! handler, with the list below), and each State takes a new locker in the child when it next
//! locks (the fork count tells it that its locker is its parent's).

use std::sync::Once;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use cuslice_shm::OwnerTokens;

/// Lock tokens: the locker + 1 in the low 12 bits, the locker's generation above.
pub const TOKENS: OwnerTokens = OwnerTokens::new(12);

/// Forks this process has been the child of, since the library was loaded: a State whose locker
/// was taken before the last one must take a new one.
static FORKS: AtomicU32 = AtomicU32::new(0);

/// Descriptors of live lockers' liveness locks, for the child to close after a fork. -1: free.
const MAX_FDS: usize = 1024;
static FDS: [AtomicI32; MAX_FDS] = [const { AtomicI32::new(-1) }; MAX_FDS];

static ATFORK: Once = Once::new();

extern "C" fn in_child() {
    // Only this thread exists in the child; close is async-signal-safe.
    for f in FDS.iter() {
        let fd = f.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: closing a descriptor this library opened for a locker (the parent's
            // copy stays open in the parent).
            unsafe { libc::close(fd) };
        }
    }
    FORKS.fetch_add(1, Ordering::Release);
}

/// The fork count now (see [`FORKS`]).
#[inline]
pub fn forks() -> u32 {
    FORKS.load(Ordering::Acquire)
}

/// Lists `fd` to be closed in forked children. False when the list is full.
pub fn keep_out_of_children(fd: i32) -> bool {
    ATFORK.call_once(|| {
        // SAFETY: registering a plain extern "C" function with no preconditions.
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
    FDS.iter().any(|f| {
        f.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })
}

/// Takes `fd` off the list (before it is closed).
pub fn forget(fd: i32) {
    for f in FDS.iter() {
        if f.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}
