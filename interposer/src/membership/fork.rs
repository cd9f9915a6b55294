//! Fork: the process-local tables' locks taken before a fork and given back after it, and what a
//! forked child forgets.

use super::*;

/// Before a fork: takes every lock of the process-local tables (after `startup`'s own), so that
/// the child finds none held by a thread it does not have.
pub fn before_fork() {
    std::mem::forget(MANAGED.lock());
    std::mem::forget(SPILLED.lock());
    std::mem::forget(LOCAL.lock());
    for sh in ALLOCS.iter() {
        sh.lock();
    }
}

/// After a fork, in parent and child: gives back what `before_fork` took.
///
/// # Safety
/// Only after `before_fork`, in the thread that called it (in the child: its one thread).
pub unsafe fn unlock_after_fork() {
    // SAFETY: all locked by before_fork in this thread, with their guards forgotten.
    unsafe {
        for sh in ALLOCS.iter() {
            sh.unlock();
        }
        LOCAL.force_unlock();
        SPILLED.force_unlock();
        MANAGED.force_unlock();
    }
}

/// In a forked child (one thread, locks given back): the child has no CUDA state of its own and
/// must not pass for its parent in the ledger. Forgets the tables and the slice (a fresh
/// registration comes at its own cuInit) and drops the parent's liveness lock. Returns whether
/// the parent had joined a slice.
pub fn child_after_fork() -> bool {
    *LOCAL.lock() = None;
    *MANAGED.lock() = None;
    MANAGED_USED.store(false, Ordering::Relaxed);
    *SPILLED.lock() = None;
    SPILL_USED.store(false, Ordering::Relaxed);
    for mine in MINE_SPILLED.iter() {
        mine.store(0, Ordering::Relaxed);
    }
    for sh in ALLOCS.iter() {
        sh.with(|m| m.clear());
    }
    let p = SLICE.swap(std::ptr::null_mut(), Ordering::AcqRel);
    // SAFETY: the old slice is leaked on purpose (the parent's memory image); only its file
    // descriptor is closed, and nothing else in the child refers to it any more.
    let joined = match unsafe { p.as_mut() } {
        Some(s) => {
            s.ledger.forget_in_child();
            true
        }
        None => false,
    };
    if MODE.load(Ordering::Relaxed) == ON {
        MODE.store(UNINIT, Ordering::Release);
    }
    contexts_changed();
    joined
}
