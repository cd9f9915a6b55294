//! A counter that every launch under a core limit adds one to, without a locked instruction in
//! the usual case.
//!
//! A locked read-modify-write (`fetch_add`) costs about 7 ns a launch on the 2-core CI machine
//! (the launch under a limit went from +15.8 to +8.8 ns without it), most of it the
//! store buffer drained behind the driver's own writes. Most processes launch from one thread
//! per device (PyTorch's launching thread), so the first thread to count owns a word it alone
//! writes (a plain load and store); any other thread counts in a second word with `fetch_add`.
//! The total is the sum: exact, whichever threads launch.
//!
//! Threads are told apart by the thread pointer (the TCB's address, one register read): two
//! live threads never share one. A thread that reuses an exited owner's TCB becomes the owner,
//! which is still one writer at a time (the exit happens before the reuse).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[derive(Default)]
pub struct Count {
    /// The thread pointer of the thread that counts in `own`; 0 while none has.
    owner: AtomicUsize,
    own: AtomicU64,
    shared: AtomicU64,
}

impl Count {
    pub const fn new() -> Count {
        Count {
            owner: AtomicUsize::new(0),
            own: AtomicU64::new(0),
            shared: AtomicU64::new(0),
        }
    }

    #[inline(always)]
    pub fn add_one(&self) {
        let me = thread_pointer();
        let owner = self.owner.load(Ordering::Relaxed);
        let mine = me != 0
            && (owner == me
                || (owner == 0
                    && self
                        .owner
                        .compare_exchange(0, me, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()));
        if mine {
            // Only the owner writes `own`: no other thread can lose this update.
            self.own
                .store(self.own.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        } else {
            self.shared.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every addition so far (one made at the same moment may be seen at the next read).
    pub fn total(&self) -> u64 {
        self.own.load(Ordering::Relaxed) + self.shared.load(Ordering::Relaxed)
    }
}

/// The calling thread's thread pointer (never 0 for a live thread), or 0 where it is not read
/// here: then every addition takes `fetch_add`.
#[inline(always)]
fn thread_pointer() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        let tp: usize;
        // SAFETY: on x86_64 Linux the first word of the TCB, at %fs:0, is the TCB's own address
        // (glibc and musl set it for every thread); reading it has no side effect.
        unsafe {
            std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags, pure))
        };
        tp
    }
    #[cfg(target_arch = "aarch64")]
    {
        let tp: usize;
        // SAFETY: TPIDR_EL0 holds the thread pointer on aarch64 Linux; reading it has no side
        // effect.
        unsafe {
            std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags, pure))
        };
        tp
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_each_have_their_own_pointer() {
        let main = thread_pointer();
        let other = std::thread::spawn(thread_pointer).join().unwrap();
        assert_ne!(main, 0);
        assert_ne!(main, other);
        assert_eq!(main, thread_pointer());
    }

    #[test]
    fn no_addition_is_lost_whichever_threads_count() {
        let c = Count::new();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..100_000 {
                        c.add_one();
                    }
                });
            }
            for _ in 0..100_000 {
                c.add_one();
            }
        });
        assert_eq!(c.total(), 900_000);
        // One thread owned the plain word; the rest went through fetch_add.
        assert!(c.own.load(Ordering::Relaxed) >= 100_000);
        assert!(c.shared.load(Ordering::Relaxed) > 0);
    }
}
