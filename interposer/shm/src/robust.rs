//! A process-shared, robust pthread mutex that lives in the state file.
//!
//! Robust means: when the owner dies (SIGKILL at any instruction), the kernel marks the lock and
//! the next locker gets it with [`Locked::OwnerDied`], repairs what the dead owner may have left
//! half-written, and marks the mutex consistent. No lock is ever held forever by a dead process.

use std::cell::UnsafeCell;
use std::io;

pub use crate::lock::Locked;

#[repr(C, align(64))]
pub struct RobustMutex {
    raw: UnsafeCell<libc::pthread_mutex_t>,
}

impl RobustMutex {
    /// Initialises the mutex in place.
    ///
    /// # Safety
    /// `self` must be in memory no other thread or process uses yet (a freshly made state file).
    pub unsafe fn init(&self) -> io::Result<()> {
        // SAFETY: attr is a local initialised by pthread_mutexattr_init before any other use; the
        // mutex memory is exclusively ours per this function's contract.
        unsafe {
            let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
            check(libc::pthread_mutexattr_init(&mut attr))?;
            check(libc::pthread_mutexattr_setpshared(
                &mut attr,
                libc::PTHREAD_PROCESS_SHARED,
            ))?;
            check(libc::pthread_mutexattr_setrobust(
                &mut attr,
                libc::PTHREAD_MUTEX_ROBUST,
            ))?;
            let r = libc::pthread_mutex_init(self.raw.get(), &attr);
            libc::pthread_mutexattr_destroy(&mut attr);
            check(r)
        }
    }

    /// Blocks until the lock is held. `OwnerDied` obliges the caller to repair, then call
    /// [`RobustMutex::mark_consistent`] before unlocking.
    pub fn lock(&self) -> io::Result<Locked> {
        // SAFETY: the mutex was initialised by `init` when the state file was made, and the
        // mapping outlives `self`.
        match unsafe { libc::pthread_mutex_lock(self.raw.get()) } {
            0 => Ok(Locked::Clean),
            libc::EOWNERDEAD => Ok(Locked::OwnerDied),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }

    pub fn mark_consistent(&self) {
        // SAFETY: called only by the thread that got EOWNERDEAD from `lock`, as the API requires.
        unsafe { libc::pthread_mutex_consistent(self.raw.get()) };
    }

    pub fn unlock(&self) {
        // SAFETY: called only by the thread holding the lock (the guards in state.rs ensure it).
        unsafe { libc::pthread_mutex_unlock(self.raw.get()) };
    }
}

fn check(r: i32) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}
