//! simgpu's `libnvidia-ml.so.1`: NVML over the simulated device model. Like real NVML it sees
//! every device (CUDA_VISIBLE_DEVICES does not apply), reports memory and per-process usage as
//! the device holds it (context overhead included), and utilisation from engine busy time.
//! Processes are reported by host PID where known (see docs/simgpu.md).
//!
//! The entry points are grouped by query family: `devices` (count, handles, names, PCI info,
//! driver versions), `memory` (memory and the processes holding it), `utilisation`, `topology`
//! (NVLink, PCIe, peer-to-peer) and `tools` (what monitoring tools ask besides). This file holds
//! initialisation and the helpers they share.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_uint};
use std::sync::Mutex;
use std::sync::OnceLock;

use cuda_abi::*;
use simgpu::State;

mod devices;
mod memory;
mod tools;
mod topology;
mod utilisation;

/// The state stays open for the life of the process once NVML was initialised; `init_count`
/// counts nvmlInit calls not yet matched by nvmlShutdown.
static STATE: OnceLock<Result<State, String>> = OnceLock::new();
static INIT_COUNT: Mutex<u32> = Mutex::new(0);

const OK: nvmlReturn_t = nvmlReturn_t::NVML_SUCCESS;
const BAD_ARG: nvmlReturn_t = nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT;

fn state() -> Result<&'static State, nvmlReturn_t> {
    if *INIT_COUNT.lock().unwrap_or_else(|e| e.into_inner()) == 0 {
        return Err(nvmlReturn_t::NVML_ERROR_UNINITIALIZED);
    }
    STATE
        .get()
        .and_then(|r| r.as_ref().ok())
        .ok_or(nvmlReturn_t::NVML_ERROR_UNINITIALIZED)
}

fn status(r: Result<(), nvmlReturn_t>) -> nvmlReturn_t {
    r.err().unwrap_or(OK)
}

fn init() -> nvmlReturn_t {
    let r = STATE.get_or_init(simgpu::state_from_env);
    match r {
        Ok(_) => {
            *INIT_COUNT.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            OK
        }
        Err(e) => {
            eprintln!("{e}");
            nvmlReturn_t::NVML_ERROR_DRIVER_NOT_LOADED
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit() -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    let mut n = INIT_COUNT.lock().unwrap_or_else(|e| e.into_inner());
    if *n == 0 {
        return nvmlReturn_t::NVML_ERROR_UNINITIALIZED;
    }
    *n -= 1;
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(r: nvmlReturn_t) -> *const c_char {
    let s: &'static CStr = match r.0 {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        9 => c"Driver Not Loaded",
        13 => c"Function Not Found",
        15 => c"GPU is lost",
        25 => c"Argument Version Mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

// Device handles are index + 1 (never NULL).
fn dev_of(h: nvmlDevice_t) -> Result<(&'static State, u32), nvmlReturn_t> {
    let s = state()?;
    let i = (h as usize).checked_sub(1).ok_or(BAD_ARG)? as u32;
    if i >= s.ndev() {
        return Err(BAD_ARG);
    }
    if s.lost(i) {
        return Err(nvmlReturn_t::NVML_ERROR_GPU_IS_LOST);
    }
    Ok((s, i))
}

fn handle(i: u32) -> nvmlDevice_t {
    (i as usize + 1) as nvmlDevice_t
}

/// # Safety
/// `p` must be NULL or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> Result<(), nvmlReturn_t> {
    if p.is_null() {
        return Err(BAD_ARG);
    }
    // SAFETY: non-NULL and valid per the contract.
    unsafe { p.write(v) };
    Ok(())
}

fn put_str(dst: *mut c_char, len: c_uint, s: &str) -> Result<(), nvmlReturn_t> {
    if dst.is_null() {
        return Err(BAD_ARG);
    }
    if s.len() + 1 > len as usize {
        return Err(nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the caller gave `len` bytes at `dst`; we write s.len() + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), dst as *mut u8, s.len());
        *dst.add(s.len()) = 0;
    }
    Ok(())
}

/// A device query with two required out-parameters: `values` of the device's state, written
/// only when both pointers are given (NVML refuses a NULL one with INVALID_ARGUMENT).
fn put_two<A, B>(
    dev: nvmlDevice_t,
    a: *mut A,
    b: *mut B,
    values: impl FnOnce(&State) -> (A, B),
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|(s, _)| {
        if a.is_null() || b.is_null() {
            return Err(BAD_ARG);
        }
        let (va, vb) = values(s);
        // SAFETY: both out-pointers from the caller, checked non-NULL.
        unsafe {
            put(a, va)?;
            put(b, vb)
        }
    }))
}

/// NVML_ERROR_NOT_SUPPORTED for a valid device (its handle's own errors first).
fn not_supported(dev: nvmlDevice_t) -> nvmlReturn_t {
    status(dev_of(dev).and(Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED)))
}
