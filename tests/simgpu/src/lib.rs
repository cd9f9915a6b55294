//! simgpu: a simulated GPU driver, a test instrument for machines without a GPU.
//!
//! The device model lives in a state file shared by every process that uses it (and by
//! containers that have it mounted): devices with memory in 2 MiB granules, contexts with hidden
//! overhead, and one time-sliced compute engine per device. `libcuda.so.1` and
//! `libnvidia-ml.so.1` (the `simgpu-cuda` and `simgpu-nvml` crates) are thin API layers over it;
//! the `simgpu` command makes state files, runs programs against them and shows the ground truth.
//! See docs/simgpu.md.

pub mod clock;
pub mod dev;
pub mod engine;
pub mod layout;
mod lockers;
pub mod snapshot;
pub mod state;

pub use dev::{AllocId, Dev, OutOfMemory};
pub use layout::{AllocKind, GRANULE};
pub use snapshot::{DeviceSnap, ProcSnap, Snapshot};
pub use state::{CreateOptions, DevGuard, GpuKind, ProcessSamples, ProcsGuard, State, StateError};

/// The variable through which the simulated driver finds its state file.
pub const STATE_ENV: &str = "SIMGPU_STATE";

/// Opens the state named by `SIMGPU_STATE`.
pub fn state_from_env() -> Result<State, String> {
    let path = std::env::var_os(STATE_ENV).ok_or_else(|| {
        format!("simgpu: {STATE_ENV} is not set; run the program under `simgpu run -- CMD`, or set {STATE_ENV} to a file made by `simgpu init --state FILE`")
    })?;
    State::open(std::path::Path::new(&path)).map_err(|e| format!("simgpu: {e}"))
}
