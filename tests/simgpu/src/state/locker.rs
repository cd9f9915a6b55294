//! This state's locker (see `lockers.rs`): the token it writes into the locks it takes, taken
//! once per state and again after a fork, and whether the state behind a token is gone.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::Ordering;

use super::State;
use crate::clock;
use crate::layout::*;
use crate::lockers::{self, TOKENS};
use cuslice_shm::liveness;

/// `State::locker`'s token while a thread of the state takes a locker.
const CLAIMING: u32 = u32::MAX;

impl State {
    /// The token this state writes into the locks it takes.
    #[inline]
    pub(super) fn token(&self) -> u32 {
        let v = self.locker.load(Ordering::Acquire);
        let token = v as u32;
        if (v >> 32) as u32 == lockers::forks() && token != 0 && token != CLAIMING {
            return token;
        }
        self.claim_locker()
    }

    #[cold]
    fn claim_locker(&self) -> u32 {
        loop {
            let forks = lockers::forks();
            let v = self.locker.load(Ordering::Acquire);
            let (at, token) = ((v >> 32) as u32, v as u32);
            if at == forks && token != 0 && token != CLAIMING {
                return token;
            }
            if at == forks && token == CLAIMING {
                std::thread::yield_now();
                continue;
            }
            // None yet, or the parent's (this is a forked child, whose copy of the parent's
            // descriptor was closed): take one.
            let mine = (forks as u64) << 32;
            if self
                .locker
                .compare_exchange(
                    v,
                    mine | CLAIMING as u64,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
            {
                continue;
            }
            let token = self.take_locker();
            self.locker.store(mine | token as u64, Ordering::Release);
            return token;
        }
    }

    /// Opens a description of the state file of its own and takes a free locker through it.
    fn take_locker(&self) -> u32 {
        let warn = |why: String| {
            eprintln!(
                "simgpu: {why}; this process's locks of {} will never be taken over if it dies holding one",
                self.path.display()
            );
            TOKENS.unknown()
        };
        let reopened = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
            .or_else(|_| {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(&self.path)
            });
        let fd = match reopened {
            Ok(f) => std::os::fd::IntoRawFd::into_raw_fd(f),
            Err(e) => return warn(format!("cannot open {} again: {e}", self.path.display())),
        };
        if !lockers::keep_out_of_children(fd) {
            // SAFETY: closing the descriptor opened just above.
            unsafe { libc::close(fd) };
            return warn("too many simgpu states are open in this process".into());
        }
        self.locker_fd.store(fd, Ordering::Relaxed);
        // Start the search somewhere else in each process, so that many starting at once do not
        // all try the same lockers first.
        let start = (clock::now_ns() ^ std::process::id() as u64) as usize;
        for k in 0..MAX_LOCKERS {
            let i = (start + k) % MAX_LOCKERS;
            if liveness::hold(fd, LOCKER_LOCK_BASE + i as i64).is_ok() {
                let generation = self.header().lockers[i]
                    .fetch_add(1, Ordering::AcqRel)
                    .wrapping_add(1);
                return TOKENS.make(i as u32, generation);
            }
        }
        warn(format!("all {MAX_LOCKERS} lockers are taken"))
    }

    /// Whether the state that wrote `token` into a lock is gone: its locker was taken by another
    /// since (the generation differs), or nobody holds the locker's liveness lock. Never says so
    /// of a token it cannot place.
    pub(super) fn locker_dead(&self, token: u32) -> bool {
        let Some((i, generation)) = TOKENS.owner(token) else {
            return false;
        };
        let Some(g) = self.header().lockers.get(i as usize) else {
            return false;
        };
        let mine = self.locker.load(Ordering::Acquire);
        if (mine >> 32) as u32 == lockers::forks() && mine as u32 == token {
            // Another thread of this state: slow, not dead (we are alive).
            return false;
        }
        g.load(Ordering::Acquire) & TOKENS.generation_mask() != generation
            || !liveness::held_by_other(self.file.as_raw_fd(), LOCKER_LOCK_BASE + i as i64)
    }
}
