//! Locked access to a device: the guard that hands out the device model and reclaims what dead
//! processes held on it.

use super::State;
use crate::clock::{self, MS};
use crate::dev::{Dev, Reclaimed};
use crate::layout::*;
use cuslice_shm::Locked;

/// How often device-level code looks for dead processes while the device is in use.
const SCAN_INTERVAL_NS: u64 = 100 * MS;

impl State {
    /// Locks device `d`. If the last holder died mid-update, repairs the device first.
    #[inline]
    pub fn lock_device(&self, d: u32) -> DevGuard<'_> {
        let block = self.block_ptr(d);
        // SAFETY: the lock lives in the mapping for our lifetime.
        let lock = unsafe { &(*block).lock };
        let how = lock.lock(self.token(), |t| self.locker_dead(t));
        let mut g = DevGuard {
            state: self,
            block,
            d,
            taken_over: how == Locked::OwnerDied,
        };
        if g.taken_over {
            g.dev().repair();
        }
        g
    }
}

/// A locked device. Dropping it unlocks.
pub struct DevGuard<'a> {
    state: &'a State,
    block: *mut DeviceBlock,
    d: u32,
    taken_over: bool,
}

impl DevGuard<'_> {
    pub fn index(&self) -> u32 {
        self.d
    }

    /// Whether the lock was taken over from a holder that died holding it (the device was
    /// repaired before this guard was handed out).
    pub fn taken_over(&self) -> bool {
        self.taken_over
    }

    pub fn dev(&mut self) -> Dev<'_> {
        let s = self.state;
        let info = *s.device_info(self.d);
        let n = info.ngran as usize;
        // SAFETY: we hold the device lock, so nothing else reads or writes this device's block or
        // granule arrays (the immutable DeviceInfo lives in the header); `validate` checked that
        // they lie inside the mapping.
        unsafe {
            Dev {
                total: info.total,
                ngran: info.ngran,
                granules: std::slice::from_raw_parts_mut(
                    s.base.add(info.granules_off as usize) as *mut Granule,
                    n,
                ),
                allocs: std::slice::from_raw_parts_mut(
                    s.base.add(info.allocs_off as usize) as *mut AllocRec,
                    n,
                ),
                bitmap: std::slice::from_raw_parts_mut(
                    s.base.add(info.bitmap_off as usize) as *mut u64,
                    n.div_ceil(64),
                ),
                b: &mut *self.block,
            }
        }
    }

    /// Brings the engine up to now (and, every 100 ms while work is queued, reclaims dead
    /// processes on this device so their queued work stops competing; an idle engine has none
    /// to stop, and what the dead held is reclaimed before any refusal and any memory answer).
    /// Returns now.
    pub fn advance_now(&mut self) -> u64 {
        let now = clock::now_ns();
        let c = self.state.config();
        let sched = crate::engine::Sched {
            timeslice_ns: c.timeslice_ns,
            switch_ns: c.switch_ns,
        };
        let last_scan = self.dev().b.engine.last_scan_ns;
        if now.saturating_sub(last_scan) >= SCAN_INTERVAL_NS && !self.dev().engine_idle() {
            self.dev().b.engine.last_scan_ns = now;
            self.reclaim_dead();
        }
        self.dev().advance(now, sched);
        now
    }

    /// Releases what dead processes hold on this device (their slots are freed later by
    /// `State::sweep`). Called before refusing an allocation, so a dead process's memory never
    /// causes a refusal.
    pub fn reclaim_dead(&mut self) -> Reclaimed {
        let mut total = Reclaimed::default();
        let owners: Vec<u32> = {
            let d = self.dev();
            (0..MAX_PROCS as u32)
                .filter(|&s| {
                    d.b.procs[s as usize].contexts > 0
                        || d.b.procs[s as usize].held > 0
                        || d.b.procs[s as usize].device_time_ns > 0
                })
                .collect()
        };
        for s in owners {
            if !self.state.slot_alive(s) {
                let who = self.state.exited_record(s);
                let r = self.dev().reclaim_owner(s, &who);
                total.allocations += r.allocations;
                total.bytes += r.bytes;
                total.contexts += r.contexts;
                total.events += r.events;
            }
        }
        total
    }
}

impl Drop for DevGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the lock lives in the mapping, and we hold it.
        unsafe { (*self.block).lock.unlock() };
    }
}
