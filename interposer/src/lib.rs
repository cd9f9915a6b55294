//! libcuslice.so: the interposer between CUDA applications and `libcuda.so.1` /
//! `libnvidia-ml.so.1`. It holds every process of a slice to the slice's memory cap per device,
//! counting every allocation family and the memory no call reveals, and reports the capped
//! figures back to CUDA and NVML readers.
//!
//! Routes in (all reach the same wrappers): the exported symbols (programs linked with -lcuda),
//! the `dlsym` override ([`dlsym`]), and `cuGetProcAddress` v1/_v2 ([`procaddr`]). The table of
//! entry points is [`hooks`]; the accounting is [`slice`] over the shared ledger (`cuslice-state`); the policy
//! arithmetic and the configuration live in the pure `cuslice-policy` crate. See
//! docs/interposer.md.
//!
//! Every export returns an error code rather than panicking: the FFI layer uses no
//! `unwrap`/`expect`/`panic!` (denied below), and the release profile aborts rather than
//! unwinding into C should anything panic all the same.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod log;

pub mod agent;
pub mod array;
pub mod compute;
pub mod context;
pub mod count;

pub mod dlmopen;
pub mod dlsym;
pub mod hooks;
pub mod info;
pub mod memory;
pub mod nvml;
pub mod pool;
pub mod procaddr;
pub mod slice;
pub mod vmm;

/// Runs when the process exits (and if the library were ever unloaded): what a slice's last
/// process leaves behind on the node goes with it. Nothing here may unwind into the C runtime.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(compute::at_exit);
}

#[used]
#[cfg_attr(not(test), unsafe(link_section = ".fini_array"))]
static AT_EXIT: extern "C" fn() = at_exit;
