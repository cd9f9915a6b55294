//! cuMemAlloc, cuMemAllocPitch and cuMemAllocManaged (both ABIs of each) and cuMemFree.
//!
//! Every allocation is reserved in the ledger before the driver is asked, at the size the driver
//! really takes: the request rounded up to the device's allocation granularity; for pitched
//! memory the pitch the driver chose times the height (reserved first at a 512-byte-aligned
//! estimate, then settled to the real figure). Managed memory is charged in full to the current
//! device when allocated: it can live there whole, and charging it only when it migrates would
//! let a slice exceed its cap behind the cap's back. The driver backs it in steps, so a process's
//! managed memory on a device is charged at its sum rounded up to the step
//! (`cuslice_policy::managed`; the table is `membership::Managed`).
//!
//! At the cap (docs/interposer.md, "At the cap"): with `CUSLICE_MEMORY_SPILL` an allocation of
//! cuMemAlloc_v2 or cuMemAllocPitch_v2 that does not fit is served as managed memory that
//! prefers the host, charged to the slice's spill; with `CUSLICE_MEMORY_WAIT` one that still
//! does not fit waits for the slice's frees (`Slice::reserve_or_wait`). The 32-bit ABIs and
//! managed allocations never spill; managed allocations never wait (they hold the process's
//! managed table, which its frees need).

#![allow(non_snake_case)]

use std::ffi::c_uint;

use cuda_abi::*;

use crate::membership::{self, Charge};
use crate::real;

/// The allocation path shared by every family charged by pointer: reserve `estimate`, let the
/// driver allocate, settle the reservation to `actual(ptr)` (undoing the allocation with `undo`
/// if the difference does not fit), and record the charge against the pointer.
pub fn charged_alloc(
    estimate: u64,
    alloc: impl FnMut() -> CUresult,
    result: impl FnOnce() -> (u64, Option<u64>),
    undo: impl FnOnce(u64),
) -> CUresult {
    spillable_alloc(
        estimate,
        alloc,
        result,
        undo,
        None::<fn(u64, u64) -> CUresult>,
    )
}

/// `charged_alloc` for a family that may spill: `spill(bytes, ptr)` hands the caller the
/// managed allocation `ptr` of `bytes` made in its place, when the slice spills
/// (`CUSLICE_MEMORY_SPILL`) and the request does not fit under the cap.
pub fn spillable_alloc(
    estimate: u64,
    mut alloc: impl FnMut() -> CUresult,
    result: impl FnOnce() -> (u64, Option<u64>),
    undo: impl FnOnce(u64),
    spill: Option<impl FnOnce(u64, u64) -> CUresult>,
) -> CUresult {
    let s = match membership::active() {
        Err(e) => return e,
        Ok(None) => return alloc(),
        Ok(Some(s)) => s,
    };
    let Some((ctx, dev)) = membership::allocation_place(s) else {
        return alloc();
    };
    let reserved = s.rounded(dev, estimate);
    let fits = match spill.filter(|_| s.spills()) {
        None => s.reserve_or_wait(dev, reserved),
        Some(hand_out) => match s.reserve_quietly(dev, reserved) {
            Ok(()) => Ok(()),
            Err(_) => match spill_alloc(s, ctx, dev, reserved) {
                Ok(ptr) => return hand_out(reserved, ptr),
                Err(_) => s.reserve_or_wait(dev, reserved),
            },
        },
    };
    if let Err(e) = fits {
        return e;
    }
    let r = crate::wants::allocate(&s.config, dev, reserved, &mut alloc);
    if !r.is_ok() {
        s.release(dev, reserved);
        return r;
    }
    let (ptr, actual) = result();
    let bytes = actual.map_or(reserved, |a| s.rounded(dev, a));
    if let Err(e) = s.settle(dev, reserved, bytes) {
        undo(ptr);
        return e;
    }
    if let Some(stale) = membership::alloc_insert(ptr, Charge { dev, bytes, ctx }) {
        // Cannot happen while frees forget the pointer first (below); never leak a charge.
        s.release(stale.dev, stale.bytes);
    }
    r
}

/// Serves `bytes` past the cap from host memory: charged to the slice's spill, allocated as
/// managed memory attached to the host, advised to prefer the host and to be accessed by the
/// device (so the device maps it rather than migrating it). Returns the pointer.
fn spill_alloc(s: &membership::Slice, ctx: usize, dev: usize, bytes: u64) -> Result<u64, CUresult> {
    let (Some(managed), Some(advise)) = (real::cuMemAllocManaged(), real::cuMemAdvise()) else {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    };
    let cudev = s.devs().get(dev).map_or(0, |d| d.cudev);
    s.reserve_spill(dev, bytes)?;
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: a valid out-pointer; the size and flag are the driver's contract.
    let r = unsafe { managed(&mut ptr, bytes as usize, CU_MEM_ATTACH_HOST) };
    if !r.is_ok() {
        s.release_spill(dev, bytes);
        return Err(r);
    }
    // SAFETY: advice on the whole range the driver just handed out.
    let advised = unsafe {
        advise(
            ptr,
            bytes as usize,
            CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
            CU_DEVICE_CPU,
        )
        .is_ok()
            && advise(ptr, bytes as usize, CU_MEM_ADVISE_SET_ACCESSED_BY, cudev).is_ok()
    };
    if !advised {
        free_v2(ptr);
        s.release_spill(dev, bytes);
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    // Spilled charges are found by their context when it goes away: named now.
    let ctx = if ctx == membership::CTX_ASK {
        membership::current(s).map_or(0, |(c, _)| c)
    } else {
        ctx
    };
    membership::SPILL_USED.store(true, std::sync::atomic::Ordering::Relaxed);
    membership::SPILLED
        .lock()
        .get_or_insert_with(Default::default)
        .insert(ptr, Charge { dev, bytes, ctx });
    Ok(ptr)
}

/// The free path shared by every family charged by pointer. The pointer is forgotten before the
/// driver frees it: the moment it is free, another thread may get the same address back from
/// its own allocation and record it.
pub fn charged_free(ptr: u64, free: impl FnOnce() -> CUresult) -> CUresult {
    let Ok(Some(s)) = membership::active() else {
        return free();
    };
    let charge = membership::alloc_remove(ptr);
    if charge.is_none() && membership::SPILL_USED.load(std::sync::atomic::Ordering::Relaxed) {
        let spilled = membership::SPILLED
            .lock()
            .as_mut()
            .and_then(|t| t.remove(&ptr));
        if let Some(c) = spilled {
            let r = free();
            if r.is_ok() {
                s.release_spill(c.dev, c.bytes);
            } else if let Some(t) = membership::SPILLED.lock().as_mut() {
                t.insert(ptr, c);
            }
            return r;
        }
    }
    if charge.is_none() && membership::MANAGED_USED.load(std::sync::atomic::Ordering::Relaxed) {
        let mut table = membership::MANAGED.lock();
        if let Some((c, drop)) = table.as_mut().and_then(|m| m.remove(ptr)) {
            let r = free();
            if r.is_ok() {
                s.release(c.dev, drop);
            } else if let Some(m) = table.as_mut() {
                m.insert(ptr, c);
            }
            return r;
        }
    }
    let r = free();
    if let Some(c) = charge {
        if r.is_ok() {
            s.release(c.dev, c.bytes);
        } else {
            membership::alloc_insert(ptr, c);
        }
    }
    r
}

fn free_v2(ptr: CUdeviceptr) {
    if let Some(f) = real::cuMemFree_v2() {
        // SAFETY: frees the allocation just made, which nobody else has seen.
        unsafe { f(ptr) };
    }
}

/// # Safety
/// The CUDA driver API contract of cuMemAlloc_v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    let Some(f) = real::cuMemAlloc_v2() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    if dptr.is_null() {
        // SAFETY: forwarded unchanged; the driver refuses it.
        return unsafe { f(dptr, size) };
    }
    spillable_alloc(
        size as u64,
        // SAFETY: forwarded unchanged.
        || unsafe { f(dptr, size) },
        // SAFETY: the driver wrote *dptr on success.
        || (unsafe { *dptr }, None),
        free_v2,
        Some(|_, ptr| {
            // SAFETY: the caller's out-pointer, as the driver would have written it (a NULL one
            // never gets here: the driver refused it before the cap was reached).
            unsafe { *dptr = ptr };
            CUresult::CUDA_SUCCESS
        }),
    )
}

/// # Safety
/// The CUDA driver API contract of cuMemAlloc (the 32-bit pointer ABI).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut CUdeviceptr_v1, size: c_uint) -> CUresult {
    let Some(f) = real::cuMemAlloc() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    charged_alloc(
        size as u64,
        // SAFETY: forwarded unchanged.
        || unsafe { f(dptr, size) },
        // SAFETY: the driver wrote *dptr on success.
        || (unsafe { *dptr } as u64, None),
        free_v1,
    )
}

fn free_v1(ptr: u64) {
    if let Some(f) = real::cuMemFree() {
        // SAFETY: frees the allocation just made.
        unsafe { f(ptr as CUdeviceptr_v1) };
    }
}

/// Rows of a pitched allocation are padded at least this much by every driver we know of; the
/// real pitch replaces the estimate as soon as the driver has chosen it.
const PITCH_ESTIMATE_ALIGN: u64 = 512;

/// # Safety
/// The CUDA driver API contract of cuMemAllocPitch_v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    let Some(f) = real::cuMemAllocPitch_v2() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    let estimate = (width as u64)
        .next_multiple_of(PITCH_ESTIMATE_ALIGN)
        .saturating_mul(height as u64);
    if dptr.is_null() || pitch.is_null() {
        // SAFETY: forwarded unchanged; the driver refuses it.
        return unsafe { f(dptr, pitch, width, height, elem) };
    }
    spillable_alloc(
        estimate,
        // SAFETY: forwarded unchanged.
        || unsafe { f(dptr, pitch, width, height, elem) },
        // SAFETY: the driver wrote both on success.
        || unsafe { (*dptr, Some((*pitch as u64).saturating_mul(height as u64))) },
        free_v2,
        Some(|_, ptr| {
            // SAFETY: both checked non-NULL above. The rows are laid out at the estimate's
            // pitch, which is what was allocated (`height` rows of it, at least).
            unsafe {
                *dptr = ptr;
                *pitch = (width as u64).next_multiple_of(PITCH_ESTIMATE_ALIGN) as usize;
            }
            CUresult::CUDA_SUCCESS
        }),
    )
}

/// # Safety
/// The CUDA driver API contract of cuMemAllocPitch (the 32-bit ABI).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch(
    dptr: *mut CUdeviceptr_v1,
    pitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    elem: c_uint,
) -> CUresult {
    let Some(f) = real::cuMemAllocPitch() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    let estimate = (width as u64).next_multiple_of(PITCH_ESTIMATE_ALIGN) * height as u64;
    charged_alloc(
        estimate,
        // SAFETY: forwarded unchanged.
        || unsafe { f(dptr, pitch, width, height, elem) },
        // SAFETY: the driver wrote both on success.
        || unsafe { (*dptr as u64, Some(*pitch as u64 * height as u64)) },
        free_v1,
    )
}

/// # Safety
/// The CUDA driver API contract of cuMemAllocManaged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: c_uint,
) -> CUresult {
    let Some(f) = real::cuMemAllocManaged() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let alloc = || unsafe { f(dptr, size, flags) };
    let s = match membership::active() {
        Err(e) => return e,
        Ok(None) => return alloc(),
        Ok(Some(s)) => s,
    };
    let Some((ctx, dev)) = membership::current(s) else {
        return alloc();
    };
    let bytes = s.rounded(dev, size as u64);
    membership::MANAGED_USED.store(true, std::sync::atomic::Ordering::Relaxed);
    // Held across the driver's call: the process's managed allocations and frees on a device
    // change its rounded sum one at a time.
    let mut table = membership::MANAGED.lock();
    let m = table.get_or_insert_with(membership::Managed::default);
    let held = m.held(dev);
    let adds =
        membership::Managed::backed(held.saturating_add(bytes)) - membership::Managed::backed(held);
    if let Err(e) = s.reserve(dev, adds) {
        return e;
    }
    let r = alloc();
    if !r.is_ok() {
        s.release(dev, adds);
        return r;
    }
    // SAFETY: the driver wrote *dptr on success.
    let ptr = unsafe { *dptr };
    m.insert(ptr, Charge { dev, bytes, ctx });
    r
}

/// # Safety
/// The CUDA driver API contract of cuMemFree_v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    let Some(f) = real::cuMemFree_v2() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    charged_free(ptr, || unsafe { f(ptr) })
}

/// # Safety
/// The CUDA driver API contract of cuMemFree (the 32-bit ABI).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree(ptr: CUdeviceptr_v1) -> CUresult {
    let Some(f) = real::cuMemFree() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    charged_free(ptr as u64, || unsafe { f(ptr) })
}
