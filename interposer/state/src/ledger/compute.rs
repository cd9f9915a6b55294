//! What the slice's compute meters write in the ledger (usage, device time, time held back) and
//! what `cuslice set` changes while it runs (core request and limit, priority, the cap).

use super::*;

impl Ledger {
    /// Records process slot `s`'s share of device `d` in its meter's last period (ppm), at
    /// `now_ns`, and returns the slice's: the sum over its processes that reported within
    /// `fresh_ns` (a process that died or stopped reporting drops out of it).
    pub fn note_usage(&self, s: u32, d: u32, usage: u32, now_ns: u64, fresh_ns: u64) -> u32 {
        let procs = &self.header().procs;
        if let Some(p) = procs.get(s as usize)
            && let Some(u) = p.usage.get(d as usize)
        {
            u.store(usage, Ordering::Relaxed);
            p.beat_ns.store(now_ns, Ordering::Relaxed);
        }
        let mut sum = 0u32;
        for (i, p) in self.slots().iter().enumerate() {
            if p.state.load(Ordering::Acquire) != LIVE {
                continue;
            }
            let beat = p.beat_ns.load(Ordering::Relaxed);
            if i as u32 != s && beat.saturating_add(fresh_ns) < now_ns {
                continue;
            }
            let u = p
                .usage
                .get(d as usize)
                .map_or(0, |u| u.load(Ordering::Relaxed));
            sum = sum.saturating_add(u);
        }
        sum.min(cuslice_policy::share::FULL)
    }

    /// Records the core request and limit (ppm) the slice runs with on device `d`.
    pub fn set_core(&self, d: u32, request: u32, limit: u32) {
        if let Some(r) = self.dev(d) {
            r.core_request.store(request, Ordering::Relaxed);
            r.core_limit.store(limit, Ordering::Relaxed);
        }
    }

    /// Records the priority (`Priority::code`) the slice runs with on device `d`, unless the
    /// node changed it while the slice ran.
    pub fn set_priority(&self, d: u32, code: u32) {
        if let Some(r) = self.dev(d)
            && r.live.load(Ordering::Relaxed) & LIVE_PRIORITY == 0
        {
            r.priority.store(code, Ordering::Relaxed);
        }
    }

    /// The priority (`Priority::code`) on device `d` if the node changed it while the slice ran
    /// (`cuslice set --priority`): then it wins over a process's own configuration.
    pub fn live_priority(&self, d: u32) -> Option<u32> {
        let r = self.dev(d)?;
        (r.live.load(Ordering::Relaxed) & LIVE_PRIORITY != 0)
            .then(|| r.priority.load(Ordering::Relaxed))
    }

    /// The core request and limit (ppm) the slice runs with on device `d` now.
    pub fn core(&self, d: u32) -> Option<(u32, u32)> {
        self.dev(d).map(|r| {
            (
                r.core_request.load(Ordering::Relaxed),
                r.core_limit.load(Ordering::Relaxed),
            )
        })
    }

    /// The core request and limit (ppm) on device `d` if the node changed them while the slice
    /// ran (`cuslice set`): then they win over a joining process's own configuration.
    pub fn live_core(&self, d: u32) -> Option<(u32, u32)> {
        let r = self.dev(d)?;
        (r.live.load(Ordering::Relaxed) & LIVE_CORE != 0).then(|| {
            (
                r.core_request.load(Ordering::Relaxed),
                r.core_limit.load(Ordering::Relaxed),
            )
        })
    }

    /// The node side of `cuslice set`: writes `change` into the record of device `uuid` in the
    /// ledger at `path`, for the slice's processes to use at their next allocation (the cap) or
    /// meter period (the core request and limit). Nothing is freed: a cap below what the slice
    /// holds refuses allocations until it is under it. Err(NoDevice) when no process of the
    /// slice has used the device yet.
    pub fn set_live(path: &Path, uuid: &[u8; 16], change: &LiveChange) -> Result<(), LedgerError> {
        // Written with `pwrite` into the file, never through a mapping, and without the device's
        // lock: the slice's processes may have truncated the file or hold its locks, and the
        // node's tool must neither die nor wait for them. Each field is one aligned word.
        // The previous version's device records are this one's, at the same offsets: only the
        // process table after them differs, which this does not touch.
        let (f, version) = open_checked(path, true)?;
        let mut copy = zeroed_header();
        read_copy_used(&f, &mut copy, version);
        let d = copy
            .devices
            .iter()
            .position(|r| r.state.load(Ordering::Relaxed) == LIVE && r.has_uuid(uuid))
            .ok_or_else(|| LedgerError::NoDevice {
                path: path.to_path_buf(),
                uuid: crate::uuid_string(uuid),
            })?;
        let mut live = copy.devices[d].live.load(Ordering::Relaxed);
        let io = |err| LedgerError::Io {
            path: path.to_path_buf(),
            err,
        };
        if let Some(bytes) = change.memory {
            write_at(&f, dev_at!(d, limit), &bytes.to_ne_bytes()).map_err(io)?;
            live |= LIVE_MEMORY;
        }
        if let Some((request, limit)) = change.core {
            write_at(&f, dev_at!(d, core_request), &request.to_ne_bytes()).map_err(io)?;
            write_at(&f, dev_at!(d, core_limit), &limit.to_ne_bytes()).map_err(io)?;
            live |= LIVE_CORE;
        }
        if let Some(code) = change.priority {
            write_at(&f, dev_at!(d, priority), &code.to_ne_bytes()).map_err(io)?;
            live |= LIVE_PRIORITY;
        }
        // Last: a process that sees the bit finds the values in place.
        write_at(&f, dev_at!(d, live), &live.to_ne_bytes()).map_err(io)?;
        Ok(())
    }

    /// A meter's report for one period: `ns` more device time used by this process on device
    /// `d` (`by`: what measured it), at `now_ns`
    /// (CLOCK_MONOTONIC). The first report of each second takes that second's mark, under the
    /// device's lock and a sequence count that readers check (a seqlock), so a reader never
    /// mixes two marks and a writer killed mid-mark leaves nothing a reader would trust.
    pub fn note_device_time(&self, d: u32, ns: u64, by: MeteredBy, now_ns: u64) {
        let Some(r) = self.dev(d) else { return };
        if ns > 0 {
            r.estimated.store(by.code(), Ordering::Relaxed);
        }
        r.device_ns.fetch_add(ns, Ordering::Relaxed);
        r.metered_ns.store(now_ns, Ordering::Relaxed);
        let second = now_ns / 1_000_000_000;
        let m = &r.marks[(second % MARKS as u64) as usize];
        let current = |m: &Mark| {
            let at = m.at_ns.load(Ordering::Relaxed);
            at != 0 && at / 1_000_000_000 == second
        };
        if current(m) {
            return;
        }
        let _g = self.lock_dev(r, d as usize);
        if current(m) {
            return;
        }
        // Odd while writing (a writer killed here left it odd already: the same).
        let seq = r.marks_seq.load(Ordering::Relaxed) | 1;
        r.marks_seq.store(seq, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        m.at_ns.store(now_ns, Ordering::Relaxed);
        m.device_ns
            .store(r.device_ns.load(Ordering::Relaxed), Ordering::Relaxed);
        m.throttled_ns
            .store(r.throttled_ns.load(Ordering::Relaxed), Ordering::Relaxed);
        r.marks_seq.store(seq + 1, Ordering::Release);
    }

    /// Device time the slice's processes used on device `d` so far (ns), as their meters
    /// measured it.
    pub fn device_ns(&self, d: u32) -> u64 {
        self.dev(d)
            .map_or(0, |r| r.device_ns.load(Ordering::Relaxed))
    }

    /// Adds `ns` of time a launching thread was held back on device `d`.
    pub fn note_throttled(&self, d: u32, ns: u64) {
        if let Some(r) = self.dev(d) {
            r.throttled_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }
}
