//! What CUDA applications read back about memory: for a capped device, the total is
//! min(cap, physical) and free is that total less everything the slice holds (never more than
//! the device really has free, never below zero). Devices without a cap report the driver's
//! figures untouched. Both ABIs of each call (the 32-bit ones clamp to 4 GiB - 1, as a 32-bit
//! field must). cuMemGetInfo's out-pointers are each optional, as the driver's are: whichever is
//! given gets the slice's figure. Reading the figures first brings this process's pools up to
//! what the driver reserves for them (see `pool`).

#![allow(non_snake_case)]

use std::ffi::c_uint;

use cuda_abi::*;
use cuslice_policy::virtual_mem_info;

use crate::membership;
use crate::real;

/// (free, total) as this slice reports them for the current context's device.
fn virtual_info(free: u64, total: u64) -> (u64, u64) {
    let Ok(Some(s)) = membership::active() else {
        return (free, total);
    };
    let Some((_, dev)) = membership::current(s) else {
        return (free, total);
    };
    membership::refresh_pools(s);
    match s.cap_and_used(dev) {
        Some((cap, used)) => virtual_mem_info(free, total, cap, used),
        None => (free, total),
    }
}

fn virtual_total(total: u64, cudev: CUdevice) -> u64 {
    let Ok(Some(s)) = membership::active() else {
        return total;
    };
    let cap = s
        .dev_by_cudev(cudev)
        .and_then(|o| s.devs().get(o))
        .and_then(|d| s.ledger.limit(d.index));
    cap.map_or(total, |c| c.min(total))
}

/// Writes `v` through `p` unless it is NULL.
///
/// # Safety
/// `p` is NULL or valid for a write.
unsafe fn put_optional<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: non-NULL, and writable per the caller's contract.
        unsafe { p.write(v) };
    }
}

/// # Safety
/// The CUDA driver API contract of cuMemGetInfo_v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let Some(f) = real::cuMemGetInfo_v2() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    if free.is_null() && total.is_null() {
        // SAFETY: forwarded unchanged: nothing to rewrite, the driver answers for itself.
        return unsafe { f(free, total) };
    }
    // Both figures into our own variables (the free figure is capped by the total), then
    // whichever the caller asked for.
    let (mut fr, mut t) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    let r = unsafe { f(&mut fr, &mut t) };
    if r.is_ok() {
        let (fr, t) = virtual_info(fr as u64, t as u64);
        // SAFETY: the caller's out-pointers, each NULL or writable.
        unsafe {
            put_optional(free, fr as usize);
            put_optional(total, t as usize);
        }
    }
    r
}

/// # Safety
/// The CUDA driver API contract of cuMemGetInfo (the 32-bit ABI).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    let Some(v1) = real::cuMemGetInfo() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    let (Some(f), false) = (real::cuMemGetInfo_v2(), free.is_null() && total.is_null()) else {
        // SAFETY: forwarded unchanged (nothing to rewrite, or no full-width call to cap with).
        return unsafe { v1(free, total) };
    };
    // The full-width figures, so the cap applies before the clamp to 32 bits.
    let (mut fr, mut t) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    let r = unsafe { f(&mut fr, &mut t) };
    if !r.is_ok() {
        // SAFETY: forwarded unchanged, so the caller gets the v1 call's own status.
        return unsafe { v1(free, total) };
    }
    let (fr, t) = virtual_info(fr as u64, t as u64);
    // SAFETY: the caller's out-pointers, each NULL or writable.
    unsafe {
        put_optional(free, fr.min(u32::MAX as u64) as c_uint);
        put_optional(total, t.min(u32::MAX as u64) as c_uint);
    }
    r
}

/// # Safety
/// The CUDA driver API contract of cuDeviceTotalMem_v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    let Some(f) = real::cuDeviceTotalMem_v2() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(bytes, dev) };
    if r.is_ok() && !bytes.is_null() {
        // SAFETY: non-NULL and written by the driver.
        unsafe { *bytes = virtual_total(*bytes as u64, dev) as usize };
    }
    r
}

/// # Safety
/// The CUDA driver API contract of cuDeviceTotalMem (the 32-bit ABI).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    let Some(v1) = real::cuDeviceTotalMem() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let r = unsafe { v1(bytes, dev) };
    if r.is_ok() && !bytes.is_null() {
        let mut full = 0usize;
        let wide = real::cuDeviceTotalMem_v2()
            // SAFETY: valid out-pointer.
            .filter(|f| unsafe { f(&mut full, dev) }.is_ok())
            .map_or(
                u64::from(
                    // SAFETY: non-NULL and written by the driver.
                    unsafe { *bytes },
                ),
                |_| full as u64,
            );
        // SAFETY: non-NULL.
        unsafe { *bytes = virtual_total(wide, dev).min(u32::MAX as u64) as c_uint };
    }
    r
}
