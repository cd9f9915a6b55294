//! What `cuslice status --json` prints and the exporter serves: the node's GPUs, and on each the
//! slices using it with what they hold and get. Built by `collect`; plain data.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Node {
    /// When the view was taken (Unix seconds).
    pub time: f64,
    pub devices: Vec<Device>,
    /// One line per thing that could not be read (a damaged ledger, no NVML, no permission).
    pub problems: Vec<String>,
    /// What the node agent found checking the slices against the driver (its findings.json);
    /// None when no agent is running under this state root.
    pub findings: Option<crate::findings::Findings>,
    pub agent: Agent,
}

/// Whether the node agent answers on its socket (docs/agent.md).
#[derive(Debug, Clone, Serialize)]
pub struct Agent {
    /// `<state root>/agent/agent.sock`.
    pub socket: String,
    pub running: bool,
    /// When it is not running and the node has container slices to care: what that means and
    /// how to start it (one line).
    pub note: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Device {
    pub uuid: String,
    /// From NVML; None where NVML could not be asked.
    pub name: Option<String>,
    pub memory_total: Option<u64>,
    /// All memory in use on the device, by any process, as NVML reports it.
    pub memory_used: Option<u64>,
    pub slices: Vec<Slice>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Slice {
    /// The container id, or the standalone slice's state directory.
    pub slice: String,
    /// "container" or "standalone".
    pub kind: &'static str,
    /// What people call the container, where the engine says.
    pub name: Option<String>,
    /// Where the container belongs in Kubernetes (`namespace`, `pod`, `container`, `pod_uid`,
    /// and `claim`: the DRA claim it uses), as the hook recorded it from the engine's
    /// annotations; None: not a pod's container.
    pub kubernetes: Option<cuslice_state::host::Kubernetes>,
    /// The ledger the figures come from.
    pub ledger: String,
    /// The ledger's format, which says which release's library the slice runs: this release's
    /// (`cuslice --version` names it), or the previous release's for a slice started before an
    /// upgrade (docs/upgrades.md).
    pub ledger_version: u32,
    pub memory: Memory,
    pub compute: Compute,
    pub processes: Vec<Process>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    /// Bytes the slice's processes hold on the device (contexts included).
    pub used: u64,
    /// Bytes of processes frozen to the host when idle (`CUSLICE_MEMORY_FREEZE_IDLE`): in their
    /// host memory now, back on the device at their next CUDA call, and counted against the cap
    /// all the while (`used + frozen` is what the cap holds).
    pub frozen: u64,
    /// The cap; None: no cap on this device.
    pub limit: Option<u64>,
    pub peak: u64,
    /// Allocations refused at the cap.
    pub refusals: u64,
    /// The cap was changed while the slice ran (`cuslice set`).
    pub set_live: bool,
    /// Bytes the slice holds in host memory past its cap (`CUSLICE_MEMORY_SPILL`), the most it
    /// may (None: it does not spill) and the most it held there at once.
    pub spilled: u64,
    pub spill_limit: Option<u64>,
    pub spill_peak: u64,
    /// Allocations waiting now for the slice's frees (`CUSLICE_MEMORY_WAIT`).
    pub waiting: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct Compute {
    pub request_pct: Option<f64>,
    pub limit_pct: Option<f64>,
    /// What the slice may use now, as its meters last worked it out.
    pub allotted_pct: f64,
    /// Share of the device used over the last 1 s and 10 s; None: no history that far back.
    pub share_1s_pct: Option<f64>,
    pub share_10s_pct: Option<f64>,
    /// Device time used since the slice began, and time its launches were held back (summed
    /// over launching threads).
    pub device_seconds: f64,
    pub throttled_seconds: f64,
    /// The latest device time was launch estimates (a slice of the previous release whose
    /// process NVML did not report; docs/status.md). The same as `metered_by` being `estimates`,
    /// for readers written before it.
    pub estimated: bool,
    /// What the slice's device time is measured by: `turns` (its turns' spans); for a slice of
    /// an earlier release `samples` (the driver's per-process utilisation), `self-timing` (the
    /// library's own timing with CUDA events) or `estimates` (launch estimates alone); None before
    /// the slice launched any work under a meter.
    pub metered_by: Option<String>,
    /// The core request and limit were changed while the slice ran (`cuslice set`).
    pub set_live: bool,
    /// `high`, `normal` or `low` (`CUSLICE_PRIORITY`, docs/compute.md).
    pub priority: String,
    /// The priority was changed while the slice ran (`cuslice set --priority`).
    pub priority_set_live: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Process {
    /// The host's pid; None if the process is gone or cannot be found from here.
    pub pid: Option<i32>,
    /// The pid the process has in its container (containers only).
    pub container_pid: Option<i32>,
    /// Whether it is running (a process that exited while the device still held its memory is
    /// listed until that memory is freed).
    pub alive: bool,
    /// Bytes charged to it on this device.
    pub memory: u64,
    /// Whether it is frozen to the host (its `memory` is then in its host memory).
    pub frozen: bool,
}

/// A slice on a device with nothing held, no limits and no launches yet, for tests to change.
#[cfg(test)]
pub(crate) fn idle_slice(slice: &str) -> Slice {
    Slice {
        slice: slice.into(),
        kind: "standalone",
        name: None,
        kubernetes: None,
        ledger: String::new(),
        ledger_version: cuslice_state::ledger::VERSION,
        memory: Memory {
            used: 0,
            frozen: 0,
            limit: None,
            peak: 0,
            refusals: 0,
            set_live: false,
            spilled: 0,
            spill_limit: None,
            spill_peak: 0,
            waiting: 0,
        },
        compute: Compute {
            request_pct: None,
            limit_pct: None,
            allotted_pct: 100.0,
            share_1s_pct: None,
            share_10s_pct: None,
            device_seconds: 0.0,
            throttled_seconds: 0.0,
            estimated: false,
            metered_by: None,
            set_live: false,
            priority: "normal".into(),
            priority_set_live: false,
        },
        processes: Vec::new(),
    }
}
