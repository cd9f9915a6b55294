//! The ledger at the cap: allocations that wait for the slice's frees (`CUSLICE_MEMORY_WAIT`,
//! a first-come-first-served queue per device, asleep on a futex word in the mapping) and memory
//! spilled to the host (`CUSLICE_MEMORY_SPILL`), charged apart from device memory.

use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use cuslice_shm::futex::wait as futex_wait;

impl Ledger {
    /// Whether allocations wait on device `d` now: a newcomer that would go ahead of them
    /// queues behind them instead (first come, first served).
    pub fn queued(&self, d: u32) -> bool {
        self.dev(d)
            .is_some_and(|r| r.waiters.load(Ordering::Relaxed) > 0)
    }

    /// Queues an allocation of this process on device `d` to wait for the slice's frees.
    /// Returns its ticket, or None when `WAIT_SLOTS` allocations wait there already.
    pub fn wait_enter(&self, d: u32) -> Option<u64> {
        let rec = self.dev(d)?;
        let token = self.token.load(Ordering::Relaxed);
        let _g = self.lock_dev(rec, d as usize);
        self.clear_dead_waiters(rec);
        let e = rec
            .queue
            .iter()
            .find(|e| e.token.load(Ordering::Relaxed) == 0)?;
        let ticket = rec.wait_next.load(Ordering::Relaxed);
        rec.wait_next.store(ticket + 1, Ordering::Relaxed);
        e.ticket.store(ticket, Ordering::Relaxed);
        e.token.store(token, Ordering::Relaxed);
        rec.waiters.fetch_add(1, Ordering::Relaxed);
        Some(ticket)
    }

    /// The waiting allocation `ticket` of process `me` on device `d` tries to reserve `bytes`:
    /// only when no live allocation queued before it still waits, and the bytes fit. On success
    /// it leaves the queue (and the next one is woken to try). Otherwise the futex value to
    /// sleep on with `wait_sleep` (read under the lock, so a free after it changes it).
    pub fn wait_try(&self, me: u32, d: u32, bytes: u64, ticket: u64) -> Result<(), u32> {
        let (Some(rec), Some(p)) = (self.dev(d), self.header().procs.get(me as usize)) else {
            return Err(0);
        };
        let Some(charge) = p.charged.get(d as usize) else {
            return Err(0);
        };
        let token = self.token.load(Ordering::Relaxed);
        let more = {
            let _g = self.lock_dev(rec, d as usize);
            self.clear_dead_waiters(rec);
            let seq = rec.wake.load(Ordering::Relaxed);
            let ahead = rec.queue.iter().any(|e| {
                let t = e.token.load(Ordering::Relaxed);
                t != 0 && e.ticket.load(Ordering::Relaxed) < ticket
            });
            let used = rec.used.load(Ordering::Relaxed);
            let after = used.saturating_add(bytes);
            if ahead || after > rec.limit.load(Ordering::Relaxed) {
                return Err(seq);
            }
            charge.store(charge.load(Ordering::Relaxed) + bytes, Ordering::Relaxed);
            rec.used.store(after, Ordering::Relaxed);
            if after > rec.peak.load(Ordering::Relaxed) {
                rec.peak.store(after, Ordering::Relaxed);
            }
            self.leave_locked(rec, token, ticket)
        };
        if more {
            wake_all(&rec.wake);
        }
        Ok(())
    }

    /// The waiting allocation `ticket` gives up (its time is out): it leaves the queue, and the
    /// ones behind it are woken (one of them may now be first).
    pub fn wait_leave(&self, d: u32, ticket: u64) {
        let Some(rec) = self.dev(d) else { return };
        let token = self.token.load(Ordering::Relaxed);
        let more = {
            let _g = self.lock_dev(rec, d as usize);
            self.leave_locked(rec, token, ticket)
        };
        if more {
            wake_all(&rec.wake);
        }
    }

    /// Sleeps until a free on device `d` changes its futex word from `seq`, or `timeout`
    /// passes. Holds no lock.
    pub fn wait_sleep(&self, d: u32, seq: u32, timeout: std::time::Duration) {
        if let Some(rec) = self.dev(d) {
            futex_wait(&rec.wake, seq, timeout);
        }
    }

    /// Takes the entry (`token`, `ticket`) out of the queue; whether others still wait. Under
    /// the device's lock.
    fn leave_locked(&self, rec: &DeviceRec, token: u32, ticket: u64) -> bool {
        for e in rec.queue.iter() {
            if e.token.load(Ordering::Relaxed) == token
                && e.ticket.load(Ordering::Relaxed) == ticket
            {
                e.token.store(0, Ordering::Relaxed);
                let _ = rec
                    .waiters
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| w.checked_sub(1));
                break;
            }
        }
        rec.waiters.load(Ordering::Relaxed) > 0
    }

    /// Clears the queue entries of processes that died waiting. Under the device's lock.
    fn clear_dead_waiters(&self, rec: &DeviceRec) {
        if rec.waiters.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mine = self.token.load(Ordering::Relaxed);
        let my_slot = self.me.load(Ordering::Relaxed);
        let mut live = 0;
        for e in rec.queue.iter() {
            let t = e.token.load(Ordering::Relaxed);
            if t == 0 {
                continue;
            }
            // An entry of this process's slot under another registration is a dead process's
            // whose slot this one took since.
            let stale = t != mine && token_owner(t).is_some_and(|(slot, _)| slot == my_slot);
            if stale || self.owner_dead(t) {
                e.token.store(0, Ordering::Relaxed);
            } else {
                live += 1;
            }
        }
        rec.waiters.store(live, Ordering::Relaxed);
    }

    /// Records the slice's spill on device `d` (bytes it may hold in host memory past its cap),
    /// unless a process of the slice recorded one already. Returns the slice's.
    pub fn set_spill_limit(&self, d: u32, bytes: u64) -> u64 {
        let Some(rec) = self.dev(d) else { return 0 };
        match rec.spill_limit.compare_exchange(
            LIMIT_UNSET,
            bytes,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => bytes,
            Err(recorded) => recorded,
        }
    }

    /// Checks and reserves `bytes` of spill for process `me` on device `d` in one step.
    pub fn reserve_spill(&self, me: u32, d: u32, bytes: u64) -> Result<(), OverCap> {
        let (Some(rec), Some(p)) = (self.dev(d), self.header().procs.get(me as usize)) else {
            return Err(OverCap { used: 0, limit: 0 });
        };
        let Some(charge) = p.spilled.get(d as usize) else {
            return Err(OverCap { used: 0, limit: 0 });
        };
        let _g = self.lock_dev(rec, d as usize);
        let used = rec.spilled.load(Ordering::Relaxed);
        let limit = match rec.spill_limit.load(Ordering::Relaxed) {
            LIMIT_UNSET => 0,
            l => l,
        };
        let after = used.saturating_add(bytes);
        if after > limit {
            return Err(OverCap { used, limit });
        }
        charge.store(charge.load(Ordering::Relaxed) + bytes, Ordering::Relaxed);
        rec.spilled.store(after, Ordering::Relaxed);
        if after > rec.spill_peak.load(Ordering::Relaxed) {
            rec.spill_peak.store(after, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Gives back `bytes` of spill process `me` held on device `d`.
    pub fn release_spill(&self, me: u32, d: u32, bytes: u64) {
        let (Some(rec), Some(p)) = (self.dev(d), self.header().procs.get(me as usize)) else {
            return;
        };
        let Some(charge) = p.spilled.get(d as usize) else {
            return;
        };
        let _g = self.lock_dev(rec, d as usize);
        let n = bytes.min(charge.load(Ordering::Relaxed));
        charge.store(charge.load(Ordering::Relaxed) - n, Ordering::Relaxed);
        rec.spilled.store(
            rec.spilled.load(Ordering::Relaxed).saturating_sub(n),
            Ordering::Relaxed,
        );
    }

    /// What the whole slice holds in host memory past its cap on device `d`.
    pub fn spilled(&self, d: u32) -> u64 {
        self.dev(d).map_or(0, |r| r.spilled.load(Ordering::Relaxed))
    }
}

/// Wakes every thread sleeping on the futex word `w` (in any process: the word is in a shared
/// mapping), after moving it on so that one about to sleep does not.
pub(super) fn wake_all(w: &AtomicU32) {
    w.fetch_add(1, Ordering::Release);
    cuslice_shm::futex::wake_all(w);
}
