//! A ledger as the node's tools see it: a [`Snapshot`] of every device and process.

use super::*;

pub(super) fn uuid_of(rec: &DeviceRec) -> [u8; 16] {
    let mut u = [0u8; 16];
    let (a, b) = u.split_at_mut(8);
    a.copy_from_slice(&rec.uuid[0].load(Ordering::Relaxed).to_be_bytes());
    b.copy_from_slice(&rec.uuid[1].load(Ordering::Relaxed).to_be_bytes());
    u
}

/// What ledger `h` holds, copied out; `alive(slot)` says whether a process slot's process lives.
pub(super) fn snapshot_of(h: &Header, alive: impl Fn(usize) -> bool) -> Snapshot {
    let mut devices: Vec<(usize, DeviceSnapshot)> = h
        .devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.state.load(Ordering::Acquire) == LIVE)
        .map(|(i, d)| (i, device_snapshot(uuid_of(d), d)))
        .collect();
    // Only the slots ever taken (slots are taken lowest first; the rest are free): a copy read
    // with `read_copy_used` holds nothing past them, and each slot is a record a kilobyte long.
    let used = (h.procs_used.load(Ordering::Acquire) as usize).min(MAX_PROCS);
    let procs: Vec<ProcSnapshot> = h.procs[..used]
        .iter()
        .enumerate()
        .filter(|(_, p)| p.state.load(Ordering::Acquire) == LIVE)
        .map(|(s, p)| ProcSnapshot {
            pid: p.pid.load(Ordering::Relaxed),
            host_pid: Some(p.host_pid.load(Ordering::Relaxed)).filter(|&h| h > 0),
            alive: alive(s),
            charged: devices
                .iter()
                .map(|(i, _)| p.charged.get(*i).map_or(0, |c| c.load(Ordering::Relaxed)))
                .collect(),
            spilled: devices
                .iter()
                .map(|(i, _)| p.spilled.get(*i).map_or(0, |c| c.load(Ordering::Relaxed)))
                .collect(),
            frozen_ns: Some(p.frozen_ns.load(Ordering::Relaxed)).filter(|&t| t > 0),
        })
        .collect();
    // What frozen processes have charged is in their host memory, not on the device.
    for (k, (_, d)) in devices.iter_mut().enumerate() {
        d.frozen = procs
            .iter()
            .filter(|p| p.frozen_ns.is_some())
            .map(|p| p.charged[k])
            // The slice's processes write these: a sum past u64 would panic a debug build.
            .fold(0, u64::saturating_add);
    }
    Snapshot {
        version: VERSION,
        slice_id: h.slice_id,
        devices: devices.into_iter().map(|(_, d)| d).collect(),
        procs,
    }
}

/// Copies device record `r` out, its marks read consistently (see `note_device_time`).
fn device_snapshot(uuid: [u8; 16], r: &DeviceRec) -> DeviceSnapshot {
    let mut marks = Vec::new();
    for _ in 0..100 {
        let s1 = r.marks_seq.load(Ordering::Acquire);
        marks.clear();
        for m in r.marks.iter() {
            let at = m.at_ns.load(Ordering::Relaxed);
            if at != 0 {
                marks.push(crate::snapshot::Mark {
                    at_ns: at,
                    device_ns: m.device_ns.load(Ordering::Relaxed),
                    throttled_ns: m.throttled_ns.load(Ordering::Relaxed),
                });
            }
        }
        std::sync::atomic::fence(Ordering::Acquire);
        if s1.is_multiple_of(2) && r.marks_seq.load(Ordering::Relaxed) == s1 {
            break;
        }
        // A writer is at work, or was killed at work: only the marks after it can be trusted
        // once it is done; until then there is no history to show.
        marks.clear();
        std::thread::yield_now();
    }
    marks.sort_by_key(|m| m.at_ns);
    let limit = r.limit.load(Ordering::Relaxed);
    let spill_limit = r.spill_limit.load(Ordering::Relaxed);
    DeviceSnapshot {
        uuid,
        limit: (limit != LIMIT_UNSET).then_some(limit),
        spill_limit: (spill_limit != LIMIT_UNSET).then_some(spill_limit),
        spilled: r.spilled.load(Ordering::Relaxed),
        spill_peak: r.spill_peak.load(Ordering::Relaxed),
        waiting: r.waiters.load(Ordering::Relaxed),
        used: r.used.load(Ordering::Relaxed),
        frozen: 0,
        peak: r.peak.load(Ordering::Relaxed),
        refusals: r.refusals.load(Ordering::Relaxed),
        context_overhead: r.context_overhead.load(Ordering::Relaxed),
        core_request: r.core_request.load(Ordering::Relaxed),
        core_limit: r.core_limit.load(Ordering::Relaxed),
        priority: r.priority.load(Ordering::Relaxed),
        live: r.live.load(Ordering::Relaxed),
        allotted: r.share.load(Ordering::Relaxed),
        device_ns: r.device_ns.load(Ordering::Relaxed),
        throttled_ns: r.throttled_ns.load(Ordering::Relaxed),
        metered_by: MeteredBy::from_code(r.estimated.load(Ordering::Relaxed)),
        metered_ns: r.metered_ns.load(Ordering::Relaxed),
        marks,
    }
}
