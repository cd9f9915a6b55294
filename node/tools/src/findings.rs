//! What the node agent found checking slices against the driver's own counts
//! (`<state root>/agent-state/findings.json`, written by `cuslice agent` every period,
//! atomically), and reading it back for `cuslice status` and the exporter. See docs/agent.md.
//! Not in `<state root>/agent/`: that directory is mounted into every slice's container, and a
//! tenant has no business reading what the agent found about other tenants.

use std::io;
use std::path::{Path, PathBuf};

use cuslice_state::fsio::Durability;
use serde::{Deserialize, Serialize};

pub const FILE_NAME: &str = "findings.json";

/// Findings older than this many agent periods (and at least `STALE_MIN_S`) are not shown as
/// current: the agent that wrote them is not running.
pub const STALE_PERIODS: f64 = 5.0;
pub const STALE_MIN_S: f64 = 10.0;

/// The file: one agent's view at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Findings {
    /// When written (Unix seconds).
    pub time: f64,
    /// The agent's period (seconds) and what it does about a finding: "report" or "stop".
    pub period_s: f64,
    pub enforce: String,
    /// Slices over their cap or limit by the driver's count, or whose ledger does not match the
    /// driver, now.
    pub findings: Vec<Finding>,
    /// What the agent has done since it started.
    pub actions: Actions,
    /// What keeps the agent from checking everything now (no NVML, a slice whose config cannot
    /// be read), one line each.
    #[serde(default)]
    pub problems: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// The container id.
    pub slice: String,
    pub name: Option<String>,
    /// The device (NVML's UUID).
    pub uuid: String,
    /// "memory", "compute", "ledger", "files" or "claims".
    pub kind: String,
    /// When the agent first saw it (Unix seconds).
    pub since: f64,
    /// One line for people.
    pub message: String,
    /// Host pids of the slice's processes on the device (memory, ledger) or running kernels
    /// (compute), by the driver's count.
    pub pids: Vec<i32>,
    /// memory / ledger: what the driver says the slice holds, its cap, what its ledger says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_bytes: Option<u64>,
    /// compute: the share of the device (percent) the slice used over the window, the share of
    /// the time it was not frozen, and its limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_pct: Option<f64>,
    /// compute: the time the shares cover, ending at the agent's last look at the driver's
    /// samples; memory: the window over which the time over the cap adds up (seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<f64>,
    /// memory: the time the slice was over its cap, in total, within the window (seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over_s: Option<f64>,
    /// What the agent is doing about it ("none (--enforce report)", a freeze, a kill).
    pub action: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Actions {
    /// Processes killed: over a memory cap, or owing more device time than freezing holds.
    pub kills: u64,
    /// Times a slice's cgroup was frozen, and the time they stayed frozen.
    pub freezes: u64,
    pub frozen_seconds: f64,
}

/// The agent's own files: `<state root>/agent-state` (0700).
pub fn dir(state_root: &Path) -> PathBuf {
    state_root.join("agent-state")
}

/// `<state root>/agent-state/findings.json`.
pub fn path(state_root: &Path) -> PathBuf {
    dir(state_root).join(FILE_NAME)
}

impl Findings {
    /// Whether findings written at `self.time` are too old to be current at `now`.
    pub fn stale(&self, now: f64) -> bool {
        now - self.time > (STALE_PERIODS * self.period_s).max(STALE_MIN_S)
    }
}

/// The agent's latest findings. Ok(None): no agent has written any under this state root.
pub fn read(state_root: &Path) -> Result<Option<Findings>, String> {
    let p = path(state_root);
    match std::fs::read_to_string(&p) {
        Ok(t) => serde_json::from_str(&t)
            .map(Some)
            .map_err(|e| format!("{}: {e}; the agent rewrites it every period", p.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", p.display())),
    }
}

/// Writes `f` to `path` atomically (a temporary file beside it, then rename), readable by all.
pub fn write(path: &Path, f: &Findings) -> io::Result<()> {
    let text = serde_json::to_vec_pretty(f).map_err(io::Error::other)?;
    // Rewritten every period: no fsync.
    cuslice_state::fsio::write_atomic(path, &text, 0o644, Durability::None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), Ok(None));
        std::fs::create_dir(super::dir(dir.path())).unwrap();
        let f = Findings {
            time: 100.0,
            period_s: 1.0,
            enforce: "report".into(),
            findings: vec![Finding {
                slice: "abc".into(),
                name: None,
                uuid: "GPU-1".into(),
                kind: "memory".into(),
                since: 99.0,
                message: "over".into(),
                pids: vec![7],
                driver_bytes: Some(2),
                cap_bytes: Some(1),
                ledger_bytes: None,
                share_pct: None,
                demand_pct: None,
                limit_pct: None,
                window_s: None,
                over_s: None,
                action: "none (report)".into(),
            }],
            actions: Actions::default(),
            problems: vec!["no NVML".into()],
        };
        write(&path(dir.path()), &f).unwrap();
        assert_eq!(read(dir.path()), Ok(Some(f.clone())));
        assert!(!f.stale(105.0));
        assert!(f.stale(111.0));
        std::fs::write(path(dir.path()), "{").unwrap();
        let e = read(dir.path()).unwrap_err();
        assert!(e.contains("findings.json"), "{e}");
    }
}
