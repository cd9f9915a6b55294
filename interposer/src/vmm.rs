//! Virtual memory management. Physical memory exists from cuMemCreate to the moment its handle
//! is both released (every cuMemRelease matching cuMemCreate and each cuMemRetainAllocationHandle)
//! and unmapped everywhere; that is when the charge goes. Only device-located handles are
//! charged (NCCL creates host-located ones). cuMemMap and cuMemAddressReserve are never charged:
//! a handle may be mapped many times, and a reservation is address space only. Handles imported
//! from another process (cuMemImportFromShareableHandle) are unknown here and so never charged
//! twice: the exporter's slice pays for them.

#![allow(non_snake_case)]

use std::ffi::c_void;

use cuda_abi::*;

use crate::membership::{self, Charge, Slice, VmmHandle};
use crate::real;

/// # Safety
/// The CUDA driver API contract of cuMemCreate.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    let Some(f) = real::cuMemCreate() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let mut call = || unsafe { f(handle, size, prop, flags) };
    let s = match membership::active() {
        Err(e) => return e,
        Ok(None) => return call(),
        Ok(Some(s)) => s,
    };
    // SAFETY: the caller's property struct, if non-NULL.
    let Some(loc) = (unsafe { prop.as_ref() }).map(|p| p.location) else {
        return call();
    };
    if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return call();
    }
    let Some(dev) = s.dev_by_cudev(loc.id) else {
        return call();
    };
    let bytes = s.rounded(dev, size as u64);
    if let Err(e) = s.reserve_or_wait(dev, bytes) {
        return e;
    }
    let r = crate::wants::allocate(&s.config, dev, bytes, &mut call);
    if !r.is_ok() {
        s.release(dev, bytes);
        return r;
    }
    // SAFETY: written by the driver on success.
    let h = unsafe { *handle };
    membership::local(|l| {
        l.vmm.insert(
            h,
            VmmHandle {
                charge: Charge { dev, bytes, ctx: 0 },
                refs: 1,
                maps: 0,
            },
        )
    });
    r
}

/// Drops the handle's charge if nothing keeps its memory any more.
fn settle_handle(s: &Slice, h: u64) {
    let gone = membership::local(|l| match l.vmm.get(&h) {
        Some(v) if v.refs == 0 && v.maps == 0 => l.vmm.remove(&h).map(|v| v.charge),
        _ => None,
    });
    if let Some(c) = gone {
        s.release(c.dev, c.bytes);
    }
}

/// # Safety
/// The CUDA driver API contract of cuMemRelease.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(h: CUmemGenericAllocationHandle) -> CUresult {
    let Some(f) = real::cuMemRelease() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    let Ok(Some(s)) = membership::active() else {
        // SAFETY: forwarded unchanged.
        return unsafe { f(h) };
    };
    // The reference goes before the driver drops it (from then on the driver may reuse the
    // handle value for another thread's cuMemCreate); the charge goes after, once the memory is
    // really free, so the slice never holds more than its ledger says.
    enum Ref {
        Unknown,
        Kept,
        Last(VmmHandle),
    }
    let dropped = membership::local(|l| match l.vmm.get_mut(&h) {
        None => Ref::Unknown,
        Some(v) => {
            v.refs = v.refs.saturating_sub(1);
            match (v.refs, v.maps) {
                (0, 0) => l.vmm.remove(&h).map_or(Ref::Unknown, Ref::Last),
                _ => Ref::Kept,
            }
        }
    });
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(h) };
    match dropped {
        Ref::Last(v) if r.is_ok() => s.release(v.charge.dev, v.charge.bytes),
        // The driver kept it after all: nothing was freed.
        Ref::Last(mut v) => {
            v.refs += 1;
            membership::local(|l| l.vmm.insert(h, v));
        }
        Ref::Kept if !r.is_ok() => membership::local(|l| {
            if let Some(v) = l.vmm.get_mut(&h) {
                v.refs += 1;
            }
        }),
        _ => {}
    }
    r
}

/// # Safety
/// The CUDA driver API contract of cuMemRetainAllocationHandle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    let Some(f) = real::cuMemRetainAllocationHandle() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(handle, addr) };
    if r.is_ok() && !handle.is_null() {
        // SAFETY: written by the driver on success.
        let h = unsafe { *handle };
        membership::local(|l| {
            if let Some(v) = l.vmm.get_mut(&h) {
                v.refs += 1;
            }
        });
    }
    r
}

/// # Safety
/// The CUDA driver API contract of cuMemMap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    h: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    let Some(f) = real::cuMemMap() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(ptr, size, offset, h, flags) };
    if r.is_ok() && matches!(membership::active(), Ok(Some(_))) {
        membership::local(|l| {
            if let Some(v) = l.vmm.get_mut(&h) {
                v.maps += 1;
                l.mappings.insert(ptr, (size as u64, h));
            }
        });
    }
    r
}

/// # Safety
/// The CUDA driver API contract of cuMemUnmap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    let Some(f) = real::cuMemUnmap() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    let Ok(Some(s)) = membership::active() else {
        // SAFETY: forwarded unchanged.
        return unsafe { f(ptr, size) };
    };
    // The mappings go before the driver unmaps: from then on another thread may map the same
    // addresses again.
    let end = ptr.saturating_add(size as u64);
    let gone: Vec<(u64, (u64, u64))> = membership::local(|l| {
        let starts: Vec<u64> = l.mappings.range(ptr..end).map(|(k, _)| *k).collect();
        starts
            .into_iter()
            .filter_map(|k| l.mappings.remove(&k).map(|m| (k, m)))
            .collect()
    });
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(ptr, size) };
    if !r.is_ok() {
        membership::local(|l| l.mappings.extend(gone));
        return r;
    }
    for (_, (_, h)) in gone {
        membership::local(|l| {
            if let Some(v) = l.vmm.get_mut(&h) {
                v.maps = v.maps.saturating_sub(1);
            }
        });
        settle_handle(s, h);
    }
    r
}
