//! One device's model, operated on under its lock: memory (2 MiB granules), contexts, events and
//! per-process accounting. The engine's scheduling lives in `engine.rs`.

use crate::layout::*;

/// A locked device: its block and its granule arrays.
pub struct Dev<'a> {
    /// Device memory in bytes, and in granules.
    pub total: u64,
    pub ngran: u32,
    pub b: &'a mut DeviceBlock,
    pub granules: &'a mut [Granule],
    pub allocs: &'a mut [AllocRec],
    pub bitmap: &'a mut [u64],
}

/// Names an allocation: its first granule and the generation it was made with, so a stale id
/// (freed, then the granule reused) is recognised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllocId {
    pub head: u32,
    pub generation: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory;

/// What reclaiming a dead process released on one device.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reclaimed {
    pub allocations: u32,
    pub bytes: u64,
    pub contexts: u32,
    pub events: u32,
}

impl Dev<'_> {
    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn used(&self) -> u64 {
        self.b.mem.used_gran as u64 * GRANULE
    }

    pub fn peak_used(&self) -> u64 {
        self.b.mem.peak_gran as u64 * GRANULE
    }

    pub fn free(&self) -> u64 {
        self.total().saturating_sub(self.used())
    }

    /// Takes whole granules for `size` bytes (at least one) and charges them to `owner`.
    pub fn alloc(
        &mut self,
        owner: u32,
        kind: AllocKind,
        size: u64,
    ) -> Result<AllocId, OutOfMemory> {
        let need = size.max(1).div_ceil(GRANULE);
        let ngran = self.ngran;
        if need > (ngran - self.b.mem.used_gran) as u64 {
            self.b.procs[owner as usize].oom_refusals += 1;
            return Err(OutOfMemory);
        }
        let need = need as u32;
        let words = self.bitmap.len();
        let mut picked = Vec::with_capacity(need as usize);
        let start = (self.b.mem.cursor as usize / 64) % words.max(1);
        'scan: for step in 0..words {
            let w = (start + step) % words;
            let mut free = !self.bitmap[w];
            while free != 0 {
                let bit = free.trailing_zeros();
                free &= free - 1;
                let g = w as u32 * 64 + bit;
                if g >= ngran {
                    break;
                }
                picked.push(g);
                if picked.len() == need as usize {
                    break 'scan;
                }
            }
        }
        assert_eq!(
            picked.len(),
            need as usize,
            "granule bitmap disagrees with used_gran"
        );
        let head = picked[0];
        // Granules first, the record last: a crash in between leaves granules whose record is
        // invalid, which `repair` frees.
        for (i, &g) in picked.iter().enumerate() {
            let next = picked.get(i + 1).map_or(0, |n| n + 1);
            self.granules[g as usize] = Granule {
                head: head + 1,
                next,
            };
            self.bitmap[g as usize / 64] |= 1 << (g % 64);
        }
        self.b.mem.next_generation = self.b.mem.next_generation.wrapping_add(1).max(1);
        let generation = self.b.mem.next_generation;
        self.allocs[head as usize] = AllocRec {
            valid: 1,
            kind: kind as u32,
            owner,
            generation,
            size,
            ngran: need,
            refs: 0,
        };
        self.b.mem.used_gran += need;
        self.b.mem.peak_gran = self.b.mem.peak_gran.max(self.b.mem.used_gran);
        self.b.mem.cursor = picked[need as usize - 1] + 1;
        let p = &mut self.b.procs[owner as usize];
        p.held += need as u64 * GRANULE;
        p.peak = p.peak.max(p.held);
        Ok(AllocId { head, generation })
    }

    /// The allocation record if `id` still names a live allocation.
    pub fn record(&self, id: AllocId) -> Option<AllocRec> {
        let r = *self.allocs.get(id.head as usize)?;
        (r.valid == 1 && r.generation == id.generation).then_some(r)
    }

    /// Releases an allocation; false if `id` is stale.
    pub fn release(&mut self, id: AllocId) -> bool {
        let Some(rec) = self.record(id) else {
            return false;
        };
        self.allocs[id.head as usize].valid = 0;
        let mut g = id.head;
        let mut n = 0;
        loop {
            let gr = self.granules[g as usize];
            self.granules[g as usize] = Granule::default();
            self.bitmap[g as usize / 64] &= !(1 << (g % 64));
            n += 1;
            if gr.next == 0 || n >= rec.ngran {
                break;
            }
            g = gr.next - 1;
        }
        self.b.mem.used_gran -= n;
        let p = &mut self.b.procs[rec.owner as usize];
        p.held = p.held.saturating_sub(n as u64 * GRANULE);
        true
    }

    /// The granules of an allocation, in address order.
    pub fn granules_of(&self, id: AllocId) -> Option<Vec<u32>> {
        let rec = self.record(id)?;
        let mut out = Vec::with_capacity(rec.ngran as usize);
        let mut g = id.head;
        loop {
            out.push(g);
            let next = self.granules[g as usize].next;
            if next == 0 || out.len() >= rec.ngran as usize {
                break;
            }
            g = next - 1;
        }
        Some(out)
    }

    /// Every live allocation, as (id, record).
    pub fn allocations(&self) -> impl Iterator<Item = (AllocId, AllocRec)> + '_ {
        self.allocs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.valid == 1)
            .map(|(i, r)| {
                (
                    AllocId {
                        head: i as u32,
                        generation: r.generation,
                    },
                    *r,
                )
            })
    }

    /// Releases everything `owner` holds on this device (its process is gone) and remembers it
    /// among the exited processes.
    pub fn reclaim_owner(&mut self, owner: u32, who: &ExitedProc) -> Reclaimed {
        let mut out = Reclaimed::default();
        let ids: Vec<_> = self
            .allocations()
            .filter(|(_, r)| r.owner == owner)
            .collect();
        for (id, r) in ids {
            out.allocations += 1;
            out.bytes += r.ngran as u64 * GRANULE;
            self.release(id);
        }
        for c in 0..MAX_CTXS {
            if self.b.ctxs[c].state == CTX_LIVE && self.b.ctxs[c].owner == owner {
                self.drop_ctx(c as u32);
                out.contexts += 1;
            }
        }
        for e in self.b.events.iter_mut() {
            if e.state != EVENT_FREE && e.owner == owner {
                e.state = EVENT_FREE;
                out.events += 1;
            }
        }
        let p = &mut self.b.procs[owner as usize];
        if p.peak > 0 || p.device_time_ns > 0 || out != Reclaimed::default() {
            let mut rec = *who;
            rec.peak = p.peak;
            rec.device_time_ns = p.device_time_ns;
            let i = (self.b.exited_next % EXITED as u64) as usize;
            self.b.exited[i] = rec;
            self.b.exited_next += 1;
        }
        // SAFETY: ProcDev is plain integers; all-zero is its initial state.
        *p = unsafe { std::mem::zeroed() };
        out
    }

    /// Rebuilds everything derivable after a process died holding the device lock: the bitmap,
    /// the used count, per-process holdings, half-made allocations and the engine's bookkeeping.
    pub fn repair(&mut self) {
        let n = self.ngran as usize;
        let mut keep = vec![false; n];
        for head in 0..n {
            let r = self.allocs[head];
            if r.valid != 1 {
                continue;
            }
            // Keep an allocation only if its chain is whole.
            let mut chain = Vec::new();
            let mut g = head;
            let whole = loop {
                if self.granules[g].head as usize != head + 1 || chain.len() >= r.ngran as usize {
                    break false;
                }
                chain.push(g);
                let next = self.granules[g].next as usize;
                if next == 0 {
                    break chain.len() == r.ngran as usize;
                }
                if next > n {
                    break false;
                }
                g = next - 1;
            };
            if whole {
                for g in chain {
                    keep[g] = true;
                }
            } else {
                self.allocs[head].valid = 0;
            }
        }
        self.bitmap.iter_mut().for_each(|w| *w = 0);
        for (g, k) in keep.iter().enumerate() {
            if *k {
                self.bitmap[g / 64] |= 1 << (g % 64);
            } else {
                self.granules[g] = Granule::default();
            }
        }
        self.b.mem.used_gran = keep.iter().filter(|k| **k).count() as u32;
        for p in self.b.procs.iter_mut() {
            p.held = 0;
        }
        let held: Vec<_> = self
            .allocations()
            .map(|(_, r)| (r.owner, r.ngran))
            .collect();
        for (owner, ngran) in held {
            let p = &mut self.b.procs[owner as usize];
            p.held += ngran as u64 * GRANULE;
            p.peak = p.peak.max(p.held);
        }
        for c in 0..MAX_CTXS {
            let ctx = &mut self.b.ctxs[c];
            if ctx.completed > ctx.submitted || ctx.submitted - ctx.completed > RING as u64 {
                ctx.completed = ctx.submitted;
            }
            let active = ctx.state == CTX_LIVE && ctx.submitted > ctx.completed;
            self.set_active(c as u32, active);
        }
        if self.b.engine.current != NONE && self.b.engine.current as usize >= MAX_CTXS {
            self.b.engine.current = NONE;
        }
        if self.b.engine.loaded != NONE && self.b.engine.loaded as usize >= MAX_CTXS {
            self.b.engine.loaded = NONE;
        }
    }

    // ---- contexts -------------------------------------------------------------------------

    /// Makes a context owned by `owner`, charging `overhead` bytes of hidden device memory.
    pub fn create_ctx(
        &mut self,
        owner: u32,
        flags: u32,
        overhead: u64,
    ) -> Result<(u32, u32), CtxError> {
        let c = self
            .b
            .ctxs
            .iter()
            .position(|c| c.state == CTX_FREE)
            .ok_or(CtxError::TooMany)? as u32;
        let oh = if overhead > 0 {
            Some(
                self.alloc(owner, AllocKind::Context, overhead)
                    .map_err(|_| CtxError::OutOfMemory)?,
            )
        } else {
            None
        };
        let ctx = &mut self.b.ctxs[c as usize];
        ctx.generation = ctx.generation.wrapping_add(1).max(1);
        ctx.owner = owner;
        ctx.flags = flags;
        ctx.completed = ctx.submitted;
        ctx.device_time_ns = 0;
        ctx.overhead = oh.map_or(NONE, |id| id.head);
        ctx.state = CTX_LIVE;
        let generation = ctx.generation;
        self.b.procs[owner as usize].contexts += 1;
        Ok((c, generation))
    }

    pub fn ctx_valid(&self, c: u32, generation: u32) -> bool {
        self.b
            .ctxs
            .get(c as usize)
            .is_some_and(|x| x.state == CTX_LIVE && x.generation == generation)
    }

    /// Destroys a context: its queued work is dropped and its overhead released.
    pub fn drop_ctx(&mut self, c: u32) {
        let ctx = &mut self.b.ctxs[c as usize];
        if ctx.state != CTX_LIVE {
            return;
        }
        let (owner, overhead) = (ctx.owner, ctx.overhead);
        ctx.completed = ctx.submitted;
        ctx.state = CTX_FREE;
        self.set_active(c, false);
        if self.b.engine.current == c {
            self.b.engine.current = NONE;
        }
        if self.b.engine.loaded == c {
            self.b.engine.loaded = NONE;
        }
        if overhead != NONE {
            let generation = self.allocs[overhead as usize].generation;
            self.release(AllocId {
                head: overhead,
                generation,
            });
        }
        let p = &mut self.b.procs[owner as usize];
        p.contexts = p.contexts.saturating_sub(1);
    }

    pub(crate) fn set_active(&mut self, c: u32, on: bool) {
        let (w, bit) = (c as usize / 64, 1u64 << (c % 64));
        if on {
            self.b.engine.active[w] |= bit;
        } else {
            self.b.engine.active[w] &= !bit;
        }
    }

    // ---- events ---------------------------------------------------------------------------

    pub fn create_event(&mut self, owner: u32) -> Option<(u32, u32)> {
        let i = self.b.events.iter().position(|e| e.state == EVENT_FREE)?;
        let e = &mut self.b.events[i];
        e.generation = e.generation.wrapping_add(1).max(1);
        e.owner = owner;
        e.state = EVENT_CREATED;
        e.ts = 0;
        Some((i as u32, e.generation))
    }

    pub fn event(&self, i: u32, generation: u32) -> Option<&Event> {
        self.b
            .events
            .get(i as usize)
            .filter(|e| e.state != EVENT_FREE && e.generation == generation)
    }

    pub fn destroy_event(&mut self, i: u32, generation: u32) -> bool {
        match self.b.events.get_mut(i as usize) {
            Some(e) if e.state != EVENT_FREE && e.generation == generation => {
                e.state = EVENT_FREE;
                true
            }
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtxError {
    TooMany,
    OutOfMemory,
}

#[cfg(test)]
pub(crate) mod testdev {
    //! A device on the heap, for unit tests of the model without a state file.
    use super::*;
    use std::alloc::{Layout, alloc_zeroed, dealloc};

    pub struct TestDevice {
        total: u64,
        ngran: u32,
        block: *mut DeviceBlock,
        granules: Vec<Granule>,
        allocs: Vec<AllocRec>,
        bitmap: Vec<u64>,
    }

    impl TestDevice {
        pub fn new(total: u64) -> TestDevice {
            let ngran = (total / GRANULE) as u32;
            let layout = Layout::new::<DeviceBlock>();
            // SAFETY: DeviceBlock is plain data for which all-zero is a valid value.
            let block = unsafe { alloc_zeroed(layout) } as *mut DeviceBlock;
            assert!(!block.is_null());
            // SAFETY: block was just allocated and zeroed, and is exclusively ours.
            let b = unsafe { &mut *block };
            b.engine.current = NONE;
            b.engine.loaded = NONE;
            for c in b.ctxs.iter_mut() {
                c.overhead = NONE;
            }
            TestDevice {
                total,
                ngran,
                block,
                granules: vec![Granule::default(); ngran as usize],
                allocs: vec![AllocRec::default(); ngran as usize],
                bitmap: vec![0; (ngran as usize).div_ceil(64)],
            }
        }

        pub fn dev(&mut self) -> Dev<'_> {
            Dev {
                total: self.total,
                ngran: self.ngran,
                // SAFETY: block is owned by self and borrowed mutably through &mut self.
                b: unsafe { &mut *self.block },
                granules: &mut self.granules,
                allocs: &mut self.allocs,
                bitmap: &mut self.bitmap,
            }
        }
    }

    impl Drop for TestDevice {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.block as *mut u8, Layout::new::<DeviceBlock>()) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testdev::TestDevice;
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn allocations_take_whole_granules() {
        let mut t = TestDevice::new(64 * MIB);
        let mut d = t.dev();
        let a = d.alloc(0, AllocKind::Mem, 1).unwrap();
        assert_eq!(d.used(), 2 * MIB);
        let b = d.alloc(0, AllocKind::Mem, 5 * MIB).unwrap();
        assert_eq!(d.used(), 8 * MIB);
        assert_eq!(d.b.procs[0].held, 8 * MIB);
        assert!(d.release(a));
        assert!(!d.release(a), "a second release of the same id is refused");
        assert_eq!(d.used(), 6 * MIB);
        assert_eq!(d.granules_of(b).unwrap().len(), 3);
        assert_eq!(d.b.procs[0].peak, 8 * MIB);
    }

    #[test]
    fn full_device_refuses_and_fragmentation_does_not() {
        let mut t = TestDevice::new(16 * MIB);
        let mut d = t.dev();
        let ids: Vec<_> = (0..8)
            .map(|_| d.alloc(1, AllocKind::Mem, 2 * MIB).unwrap())
            .collect();
        assert_eq!(d.alloc(1, AllocKind::Mem, 1), Err(OutOfMemory));
        assert_eq!(d.b.procs[1].oom_refusals, 1);
        // Free every other granule: 8 MiB free in 4 holes; an 8 MiB request still fits.
        for id in ids.iter().step_by(2) {
            d.release(*id);
        }
        let big = d.alloc(1, AllocKind::Mem, 8 * MIB).unwrap();
        assert_eq!(d.granules_of(big).unwrap().len(), 4);
        assert_eq!(d.free(), 0);
    }

    #[test]
    fn reclaim_releases_everything_of_the_owner_only() {
        let mut t = TestDevice::new(64 * MIB);
        let mut d = t.dev();
        d.alloc(1, AllocKind::Mem, 10 * MIB).unwrap();
        d.create_ctx(1, 0, 4 * MIB).unwrap();
        d.create_event(1).unwrap();
        let other = d.alloc(2, AllocKind::Mem, 2 * MIB).unwrap();
        let who = ExitedProc {
            ns_pid: 7,
            host_pid: 7,
            peak: 0,
            device_time_ns: 0,
            exited_ns: 1,
            comm: [0; 16],
        };
        let r = d.reclaim_owner(1, &who);
        assert_eq!(
            r,
            Reclaimed {
                allocations: 2,
                bytes: 14 * MIB,
                contexts: 1,
                events: 1
            }
        );
        assert_eq!(d.used(), 2 * MIB);
        assert!(d.record(other).is_some());
        assert_eq!(d.b.exited[0].peak, 14 * MIB);
        assert_eq!(d.b.procs[1].held, 0);
    }

    #[test]
    fn repair_frees_half_made_allocations_and_recounts() {
        let mut t = TestDevice::new(64 * MIB);
        let mut d = t.dev();
        let keep = d.alloc(3, AllocKind::Mem, 4 * MIB).unwrap();
        let broken = d.alloc(4, AllocKind::Mem, 6 * MIB).unwrap();
        // A process died after writing the granules of a new allocation but not its record:
        d.allocs[broken.head as usize].valid = 0;
        d.b.procs[3].held = 999;
        d.repair();
        assert_eq!(d.used(), 4 * MIB);
        assert_eq!(d.b.procs[3].held, 4 * MIB);
        assert_eq!(d.b.procs[4].held, 0);
        assert!(d.record(keep).is_some());
        // and the freed granules are usable again
        d.alloc(5, AllocKind::Mem, 60 * MIB).unwrap();
        assert_eq!(d.free(), 0);
    }
}
