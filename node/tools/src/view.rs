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
    /// The latest device time was launch estimates: NVML did not report the process (see
    /// docs/status.md).
    pub estimated: bool,
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
}
