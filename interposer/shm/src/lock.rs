//! A lock in shared memory that names its holder: one word holding the holder's token, taken
//! with one compare-and-swap and given back with a plain store (a glibc robust mutex costs about
//! four times that: a second atomic operation, and the robust list kept on both sides).
//!
//! The token says who holds the lock in terms every process sharing the file understands,
//! whatever its pid namespace: a slot of a table in the file plus the generation of that slot's
//! current user (see [`OwnerTokens`]). Whether that user is still alive is the caller's business,
//! answered by the `dead` function a locker passes in, usually through the slot's liveness lock
//! (an OFD lock on a byte of the file, see [`crate::liveness`]), which the kernel drops when
//! the process dies however it dies, and which a process that is only slow, descheduled,
//! stopped (SIGSTOP) or frozen (cgroup freezer) keeps.
//!
//! A thread that waits long enough to wonder ([`DEAD_CHECK`]) asks whether the holder is dead;
//! if so it takes the lock over with one compare-and-swap from exactly that token, and learns
//! [`Locked::OwnerDied`]: it repairs what the dead holder may have left half-done. A live
//! holder is waited for as long as it lives. Nothing of the lock lives outside the shared word:
//! no thread or process keeps pointers into it, and no kernel list refers to it, so no process
//! can corrupt another's memory through it, and a process killed while waiting leaves nothing
//! behind.
//!
//! The lock is held for short stretches (a few dozen to a few thousand instructions), so
//! waiters do not sleep in the kernel (that would take an atomic swap at every unlock to learn
//! whether to wake anyone): they spin briefly, then yield the CPU (to the holder, if it was
//! preempted), then nap.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A lock between processes that needs no token, for what is taken rarely or before a process
/// has a token (a process registering): an OFD write lock on one byte of the shared file, waited
/// for in the kernel (F_OFD_SETLKW), plus a mutex of this process, since an OFD lock does not
/// exclude threads that share its open file description. The kernel drops the byte's lock when
/// its holder dies, however it dies, whatever its pid namespace; a stopped or frozen holder keeps
/// it. Taking and giving it back costs two system calls. Nothing of it is in the shared memory,
/// so it cannot tell its taker that the last holder died: what it guards must never be left
/// half-done in a way the next holder could trip on.
pub struct ByteLock {
    byte: i64,
    local: std::sync::Mutex<()>,
}

/// A held [`ByteLock`]; dropping it gives the lock back.
pub struct ByteGuard<'a> {
    fd: Option<RawFd>,
    byte: i64,
    _local: std::sync::MutexGuard<'a, ()>,
}

impl ByteLock {
    /// The lock on byte `byte` of a file (OFD locks need no bytes there: it may lie past the end).
    pub const fn new(byte: i64) -> ByteLock {
        ByteLock {
            byte,
            local: std::sync::Mutex::new(()),
        }
    }

    /// Takes the lock through `fd`, this process's descriptor of the shared file (None: the
    /// memory is this process's alone, and the mutex is enough). If the kernel refuses the byte's
    /// lock for another reason than a conflict (it cannot: the arguments are valid), only this
    /// process's threads are kept out.
    pub fn lock(&self, fd: Option<RawFd>) -> ByteGuard<'_> {
        // A thread that panicked holding it left nothing half-done that the mutex protects.
        let local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        let fd = fd.filter(|&fd| crate::liveness::wait_hold(fd, self.byte).is_ok());
        ByteGuard {
            fd,
            byte: self.byte,
            _local: local,
        }
    }
}

impl Drop for ByteGuard<'_> {
    fn drop(&mut self) {
        if let Some(fd) = self.fd {
            let _ = crate::liveness::release(fd, self.byte);
        }
    }
}

/// How a lock was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Locked {
    Clean,
    /// The previous holder died holding it; the protected data may be half-updated.
    OwnerDied,
}

/// How long a waiter waits before it asks whether the holder died (and again after each such
/// period).
pub const DEAD_CHECK: Duration = Duration::from_millis(20);
/// A waiter spins this many times, then yields; after `YIELD_FOR` it sleeps `NAP` between tries.
const SPINS: u32 = 64;
const YIELD_FOR: Duration = Duration::from_millis(1);
const NAP: Duration = Duration::from_micros(50);

/// The lock word. All-zero bytes are a free lock, so a freshly made (zero-filled) file needs no
/// initialisation.
#[repr(C)]
pub struct OwnerLock {
    word: AtomicU32,
}

impl Default for OwnerLock {
    fn default() -> Self {
        OwnerLock::new()
    }
}

impl OwnerLock {
    pub const fn new() -> OwnerLock {
        OwnerLock {
            word: AtomicU32::new(0),
        }
    }

    /// Takes the lock for `token` (never 0). `dead(holder)` answers whether the process whose
    /// token is `holder` is gone; it must never say so of a live process, and must answer
    /// "alive" for a token it cannot place.
    #[inline]
    pub fn lock(&self, token: u32, dead: impl Fn(u32) -> bool) -> Locked {
        debug_assert_ne!(token, 0);
        if self
            .word
            .compare_exchange(0, token, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return Locked::Clean;
        }
        self.lock_contended(token, dead)
    }

    #[cold]
    fn lock_contended(&self, token: u32, dead: impl Fn(u32) -> bool) -> Locked {
        let mut spins = 0;
        let mut since: Option<Instant> = None;
        let mut checked: Option<Instant> = None;
        loop {
            let w = self.word.load(Ordering::Relaxed);
            if w == 0 {
                if self
                    .word
                    .compare_exchange(0, token, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return Locked::Clean;
                }
                continue;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let since = *since.get_or_insert(now);
            let last = *checked.get_or_insert(now);
            if now.duration_since(last) >= DEAD_CHECK {
                checked = Some(now);
                // Only exactly the token found dead is replaced: if the holder gave the lock
                // back meanwhile (and someone else took it), the exchange fails.
                if dead(w)
                    && self
                        .word
                        .compare_exchange(w, token, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                {
                    return Locked::OwnerDied;
                }
            }
            if now.duration_since(since) < YIELD_FOR {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP);
            }
        }
    }

    /// Gives the lock back. Only its holder may call this.
    #[inline]
    pub fn unlock(&self) {
        self.word.store(0, Ordering::Release);
    }

    /// The token of whoever holds the lock now, if anyone (for diagnostics and tests).
    pub fn holder(&self) -> Option<u32> {
        match self.word.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }
}

/// How a lock word names its holder: the holder's slot + 1 in the low `slot_bits` bits, the
/// generation of the slot's current user above (so a slot that a dead process left and another
/// took since never passes for the dead one). A token is never 0 (a free lock), and a slot field
/// of all ones is [`OwnerTokens::unknown`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnerTokens {
    slot_bits: u32,
}

impl OwnerTokens {
    pub const fn new(slot_bits: u32) -> OwnerTokens {
        assert!(slot_bits >= 2 && slot_bits < 32);
        OwnerTokens { slot_bits }
    }

    const fn slot_mask(self) -> u32 {
        (1 << self.slot_bits) - 1
    }

    /// The bits of a generation a token keeps.
    pub const fn generation_mask(self) -> u32 {
        (1 << (32 - self.slot_bits)) - 1
    }

    /// The token of a holder with no slot: never taken for dead.
    pub const fn unknown(self) -> u32 {
        self.slot_mask()
    }

    /// How many slots tokens can name (slots 0 to `slots() - 1`).
    pub const fn slots(self) -> u32 {
        self.slot_mask() - 1
    }

    pub const fn make(self, slot: u32, generation: u32) -> u32 {
        (slot + 1) | (generation & self.generation_mask()) << self.slot_bits
    }

    /// (slot, generation) of a token; None for [`OwnerTokens::unknown`] and for 0.
    pub const fn owner(self, token: u32) -> Option<(u32, u32)> {
        let slot = token & self.slot_mask();
        if slot == 0 || slot == self.slot_mask() {
            None
        } else {
            Some((slot - 1, (token >> self.slot_bits) & self.generation_mask()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    const T: OwnerTokens = OwnerTokens::new(11);

    #[test]
    fn tokens_name_their_slot_and_generation() {
        assert_eq!(T.owner(T.make(0, 1)), Some((0, 1)));
        assert_eq!(T.owner(T.make(2045, 7)), Some((2045, 7)));
        assert_eq!(T.slots(), 2046);
        let wrapped = T.generation_mask() + 3;
        assert_eq!(T.owner(T.make(5, wrapped)), Some((5, 2)));
        assert_eq!(T.owner(T.unknown()), None);
        assert_eq!(T.owner(0), None);
        assert_ne!(T.make(0, 0), 0);
    }

    #[test]
    fn threads_take_turns() {
        let lock = Arc::new(OwnerLock::new());
        let inside = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..4u32)
            .map(|i| {
                let (lock, inside, count) =
                    (Arc::clone(&lock), Arc::clone(&inside), Arc::clone(&count));
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        assert_eq!(lock.lock(T.make(i, 1), |_| false), Locked::Clean);
                        assert!(!inside.swap(true, Ordering::Relaxed), "two holders at once");
                        count.store(count.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                        inside.store(false, Ordering::Relaxed);
                        lock.unlock();
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(count.load(Ordering::Relaxed), 80_000);
        assert_eq!(lock.holder(), None);
    }

    #[test]
    fn a_dead_holder_is_taken_over_after_a_check_and_a_live_one_never() {
        let lock = OwnerLock::new();
        let dead_one = T.make(3, 9);
        assert_eq!(lock.lock(dead_one, |_| false), Locked::Clean);
        let asked = AtomicU32::new(0);
        let start = Instant::now();
        let how = lock.lock(T.make(4, 1), |t| {
            asked.fetch_add(1, Ordering::Relaxed);
            assert_eq!(t, dead_one, "asked about the holder, nobody else");
            true
        });
        assert_eq!(how, Locked::OwnerDied);
        assert!(start.elapsed() >= DEAD_CHECK);
        assert_eq!(asked.load(Ordering::Relaxed), 1);
        assert_eq!(lock.holder(), Some(T.make(4, 1)));
        lock.unlock();

        // A holder said to be alive keeps the lock, however long the waiter waits.
        let lock = Arc::new(OwnerLock::new());
        assert_eq!(lock.lock(dead_one, |_| false), Locked::Clean);
        let asked = Arc::new(AtomicU32::new(0));
        let waiter = {
            let (lock, asked) = (Arc::clone(&lock), Arc::clone(&asked));
            std::thread::spawn(move || {
                lock.lock(T.make(4, 1), |_| {
                    asked.fetch_add(1, Ordering::Relaxed);
                    false
                })
            })
        };
        std::thread::sleep(DEAD_CHECK * 5);
        assert!(!waiter.is_finished());
        assert!(asked.load(Ordering::Relaxed) >= 2, "the waiter kept asking");
        lock.unlock();
        assert_eq!(waiter.join().unwrap(), Locked::Clean);
    }

    #[test]
    fn a_byte_lock_keeps_other_descriptions_out_until_given_back_or_closed() {
        let file =
            std::env::temp_dir().join(format!("cuslice-shm-bytelock-{}", std::process::id()));
        std::fs::write(&file, b"").unwrap();
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&file)
                .unwrap()
        };
        use std::os::fd::AsRawFd;
        // Two "processes": each its own open file description and its own ByteLock.
        let (a, b) = (open(), Arc::new(open()));
        let (la, lb) = (ByteLock::new(5), Arc::new(ByteLock::new(5)));
        let g = la.lock(Some(a.as_raw_fd()));
        let taker = |b: &Arc<std::fs::File>, lb: &Arc<ByteLock>| {
            let (b, lb) = (Arc::clone(b), Arc::clone(lb));
            std::thread::spawn(move || drop(lb.lock(Some(b.as_raw_fd()))))
        };
        let t = taker(&b, &lb);
        std::thread::sleep(Duration::from_millis(100));
        assert!(!t.is_finished(), "taken while held");
        drop(g);
        t.join().unwrap();
        // A holder that goes away holding it (its description closed, as at death).
        std::mem::forget(la.lock(Some(a.as_raw_fd())));
        let t = taker(&b, &lb);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "taken while held");
        drop(a);
        t.join().unwrap();
        // Threads sharing one description take turns through the mutex.
        let g = lb.lock(Some(b.as_raw_fd()));
        let t = taker(&b, &lb);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "taken by a second thread while held");
        drop(g);
        t.join().unwrap();
        std::fs::remove_file(&file).unwrap();
    }
}
