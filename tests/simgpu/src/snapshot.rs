//! A consistent picture of the simulated machine: what `simgpu show` prints and what the tests
//! take as ground truth.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::clock::{self, MS};
use crate::engine::{busy_between, splitmix64};
use crate::layout::*;
use crate::state::{ProcessSamples, State};

#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    pub state: String,
    pub context_overhead: u64,
    pub timeslice_ns: u64,
    pub switch_ns: u64,
    pub util_sample_ns: u64,
    pub devices: Vec<DeviceSnap>,
    /// Processes the checkpoint API has locked or checkpointed.
    pub checkpoints: Vec<CheckpointSnap>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckpointSnap {
    pub pid: i32,
    pub ns_pid: i32,
    pub comm: String,
    /// "locked" or "checkpointed".
    pub state: &'static str,
    /// Device memory the process had when checkpointed, now in its host memory.
    pub host_bytes: u64,
    /// A restore failed for lack of device memory: the process stays checkpointed.
    pub stuck: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceSnap {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub pci_bus_id: String,
    pub sm_count: u32,
    pub total: u64,
    pub used: u64,
    pub free: u64,
    /// The most memory ever in use at once on the device, by all processes together.
    pub peak_used: u64,
    /// Percent of the last second during which the engine ran work.
    pub utilization: u32,
    pub busy_ns: u64,
    pub processes: Vec<ProcSnap>,
    pub exited: Vec<ExitedSnap>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProcSnap {
    /// Host PID when known (always, for processes outside containers).
    pub pid: i32,
    /// The PID inside the process's own PID namespace.
    pub ns_pid: i32,
    pub comm: String,
    /// Everything the process holds on the device, context overhead included.
    pub held: u64,
    pub peak: u64,
    /// Engine time the process's work used.
    pub device_time_ns: u64,
    pub contexts: u32,
    /// Events the process has created and not destroyed (the device has `MAX_EVENTS` in all).
    pub events: u32,
    pub oom_refusals: u64,
    /// `held` split by what holds it ("mem", "context", "pool", ...).
    pub by_kind: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ExitedSnap {
    pub pid: i32,
    pub ns_pid: i32,
    pub comm: String,
    pub peak: u64,
    pub device_time_ns: u64,
}

impl State {
    /// Reclaims dead processes, brings every engine up to now, and reads everything.
    pub fn snapshot(&self) -> Snapshot {
        self.sweep();
        self.resolve_host_pids();
        let c = self.config();
        let devices = (0..self.ndev()).map(|d| self.device_snapshot(d)).collect();
        let checkpoints = (0..MAX_PROCS as u32)
            .filter_map(|s| {
                let slot = &self.header().procs[s as usize];
                let state = match slot.ckpt_state.load(Ordering::Acquire) {
                    CKPT_LOCKED => "locked",
                    CKPT_CHECKPOINTED => "checkpointed",
                    CKPT_FAILED => "failed",
                    _ => return None,
                };
                (slot.state.load(Ordering::Acquire) == SLOT_LIVE).then(|| CheckpointSnap {
                    pid: self.reported_pid(s),
                    ns_pid: self.slot_ns_pid(s),
                    comm: self.slot_comm(s),
                    state,
                    host_bytes: slot.ckpt_host_bytes.load(Ordering::Acquire),
                    stuck: slot.ckpt_stuck.load(Ordering::Acquire) != 0,
                })
            })
            .collect();
        Snapshot {
            checkpoints,
            state: self.path().display().to_string(),
            context_overhead: c.context_overhead,
            timeslice_ns: c.timeslice_ns,
            switch_ns: c.switch_ns,
            util_sample_ns: c.util_sample_ns,
            devices,
        }
    }

    pub fn device_snapshot(&self, d: u32) -> DeviceSnap {
        let c = self.config();
        let mut g = self.lock_device(d);
        let now = g.advance_now();
        let dev = g.dev();
        let mut by_owner: BTreeMap<u32, BTreeMap<&'static str, u64>> = BTreeMap::new();
        for (_, r) in dev.allocations() {
            let kind = AllocKind::from_u32(r.kind).map_or("other", |k| k.name());
            *by_owner
                .entry(r.owner)
                .or_default()
                .entry(kind)
                .or_default() += r.ngran as u64 * GRANULE;
        }
        let processes = (0..MAX_PROCS as u32)
            .filter(|&s| {
                let p = &dev.b.procs[s as usize];
                p.contexts > 0 || p.held > 0
            })
            .map(|s| {
                let p = &dev.b.procs[s as usize];
                ProcSnap {
                    pid: self.reported_pid(s),
                    ns_pid: self.slot_ns_pid(s),
                    comm: self.slot_comm(s),
                    held: p.held,
                    peak: p.peak,
                    device_time_ns: p.device_time_ns,
                    contexts: p.contexts,
                    events: dev
                        .b
                        .events
                        .iter()
                        .filter(|e| e.state != EVENT_FREE && e.owner == s)
                        .count() as u32,
                    oom_refusals: p.oom_refusals,
                    by_kind: by_owner.remove(&s).unwrap_or_default(),
                }
            })
            .collect();
        let n = dev.b.exited_next;
        let exited = (n.saturating_sub(EXITED as u64)..n)
            .map(|k| {
                let e = &dev.b.exited[(k % EXITED as u64) as usize];
                ExitedSnap {
                    pid: if e.host_pid != 0 {
                        e.host_pid
                    } else {
                        e.ns_pid
                    },
                    ns_pid: e.ns_pid,
                    comm: field_str(&e.comm),
                    peak: e.peak,
                    device_time_ns: e.device_time_ns,
                }
            })
            .collect();
        let busy = busy_between(&dev.b.engine.util, now.saturating_sub(1000 * MS), now);
        DeviceSnap {
            index: d,
            uuid: self.uuid_string(d),
            name: field_str(&c.name),
            pci_bus_id: self.pci_bus_id(d),
            sm_count: c.sm_count,
            total: dev.total(),
            used: dev.used(),
            free: dev.free(),
            peak_used: dev.peak_used(),
            utilization: (busy * 100 / (1000 * MS)).min(100) as u32,
            busy_ns: dev.b.engine.busy_ns,
            processes,
            exited,
        }
    }

    /// The driver's latest per-process utilisation sample of device `d`, as NVML reports it:
    /// the sample period that ended last (every `util_sample_ns` of monotonic time), if it ended
    /// after `since` (monotonic ns). Returns the period's end and (slot, busy ns in the period):
    ///
    /// - `PerProcess`: one entry for each process that ran work in the period, its own busy time.
    /// - `OnePerPeriod` (what a real driver does): one entry, naming one process that ran, with a
    ///   chance in proportion to its busy time in the period (`one_per_period`), with the
    ///   device's busy time over the period (any process's work), not that process's own.
    pub fn process_utilization(
        &self,
        d: u32,
        since: u64,
        how: ProcessSamples,
    ) -> (u64, Vec<(u32, u64)>) {
        let period = self.config().util_sample_ns.max(UTIL_BUCKET_NS);
        let mut g = self.lock_device(d);
        let now = g.advance_now();
        let end = now / period * period;
        if end <= since || end < period {
            return (end, Vec::new());
        }
        let dev = g.dev();
        let samples: Vec<(u32, u64)> = (0..MAX_PROCS as u32)
            .filter_map(|s| {
                let p = &dev.b.procs[s as usize];
                if p.contexts == 0 {
                    return None;
                }
                let busy = busy_between(&p.util, end - period, end);
                (busy > 0).then_some((s, busy))
            })
            .collect();
        if how != ProcessSamples::OnePerPeriod {
            return (end, samples);
        }
        let device = busy_between(&dev.b.engine.util, end - period, end);
        // Each device draws apart from the others.
        (
            end,
            one_per_period(&samples, device, (end / period) ^ (u64::from(d) << 56)),
        )
    }

    /// Percent of the driver's last sample period (`util_sample_ns`, ended at a multiple of it)
    /// device `d` was busy: what `nvmlDeviceGetUtilizationRates` reports, "over the past sample
    /// period". The per-process samples of the same period carry the same figure.
    pub fn utilization(&self, d: u32) -> u32 {
        let period = self.config().util_sample_ns.max(UTIL_BUCKET_NS);
        let mut g = self.lock_device(d);
        let now = g.advance_now();
        let end = now / period * period;
        let busy = busy_between(&g.dev().b.engine.util, end.saturating_sub(period), end);
        (busy * 100 / period).min(100) as u32
    }

    pub fn now_wall_us() -> u64 {
        clock::wall_us()
    }
}

/// What a real driver reports of a period: one sample, with the device's busy time, naming one
/// of the processes that ran, as if the driver looked at a random instant of the period's busy
/// time and named whoever ran then: each is named with a chance in proportion to its busy time.
/// On an NVIDIA H100 and an H200 (driver 580), two throttled slices using 23% and 75% of the
/// device were named at 11 and 19 of 30 stamps; two using 32% and 53%, at 16 and 22 of 38. The
/// draw is a fixed function of `period_no`, so a run replays alike. `busy`: (slot, busy ns) of
/// each process that ran.
fn one_per_period(busy: &[(u32, u64)], device: u64, period_no: u64) -> Vec<(u32, u64)> {
    let total: u64 = busy.iter().map(|&(_, b)| b).sum();
    if total == 0 {
        return Vec::new();
    }
    let mut at = splitmix64(period_no) % total;
    for &(s, b) in busy {
        if at < b {
            return vec![(s, device)];
        }
        at -= b;
    }
    unreachable!("the draw is below the sum of the busy times")
}

#[cfg(test)]
mod tests {
    use super::one_per_period;

    #[test]
    fn one_sample_a_period_names_a_process_by_its_busy_time_with_the_device_busy_time() {
        // Alone: its own time is the device's.
        assert_eq!(one_per_period(&[(3, 40)], 40, 7), [(3, 40)]);
        // Idle: no sample.
        assert_eq!(one_per_period(&[], 0, 7), []);
        // 30 and 70 ms of a 100 ms period, the device busy 100 ms (time-sliced): one of them is
        // named, with the device's 100; over many periods, each about as often as its busy
        // time would have it, and neither always.
        let mut named = [0u32; 2];
        for period in 0..10_000 {
            let got = one_per_period(&[(0, 30), (1, 70)], 100, period);
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].1, 100);
            named[got[0].0 as usize] += 1;
        }
        assert!((2_800..=3_200).contains(&named[0]), "{named:?}");
        // The same period gives the same answer.
        assert_eq!(
            one_per_period(&[(0, 30), (1, 70)], 100, 42),
            one_per_period(&[(0, 30), (1, 70)], 100, 42)
        );
    }
}
