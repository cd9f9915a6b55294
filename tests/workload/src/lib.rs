//! `cuda-workload`: drives a CUDA driver (`libcuda.so.1`, and `libnvidia-ml.so.1` for NVML) the
//! ways real software does, runs one scenario and prints the results as JSON lines.
//!
//! - [`driver`]: the `Driver` struct of typed entry points and the routes that fill it.
//! - [`requests`]: the recorded libcudart `cuGetProcAddress_v2` request lists.
//! - [`kernels`]: the spin kernel (PTX, or the simulator's text image) launching scenarios use.
//! - [`nvml`]: what NVML reports.
//! - [`scenarios`]: info, fill, hold, launch, memcpy, churn, bench-alloc.
//! - [`share`]: memory shared between processes (CUDA IPC, exported VMM handles) and the peer
//!   queries, as multi-process jobs make them.
//! - [`tamper`]: a hostile tenant attacking cuslice's state from inside a container.
//! - [`cli`]: the command line shared by `cuda-workload` and `cuda-workload-linked`.

mod functions;

pub mod cli;
pub mod driver;
pub mod kernels;
pub mod nvml;
pub mod out;
pub mod requests;
pub mod scenarios;
pub mod share;
pub mod tamper;
