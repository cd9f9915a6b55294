//! CUDA arrays (1D/2D, 3D/layered, mipmapped; both descriptor ABIs). The driver lays arrays out
//! in its own way, so each is reserved at an estimate from its descriptor first (rows padded like
//! pitched memory, levels summed), then charged at what the driver says it needs
//! (cuArrayGetMemoryRequirements / cuMipmappedArrayGetMemoryRequirements, CUDA 11.6+). If the
//! real figure is larger and does not fit, the array is destroyed again and the call refused.

#![allow(non_snake_case)]

use std::ffi::{c_uint, c_void};

use cuda_abi::*;

use crate::membership::{self, Charge};
use crate::real;

/// CUDA_ARRAY_DESCRIPTOR as cuArrayCreate (the pre-3.2 ABI) takes it: 32-bit sizes.
#[repr(C)]
struct ArrayDescV1 {
    width: c_uint,
    height: c_uint,
    format: c_uint,
    channels: c_uint,
}

/// CUDA_ARRAY3D_DESCRIPTOR as cuArray3DCreate (the pre-3.2 ABI) takes it.
#[repr(C)]
struct Array3dDescV1 {
    width: c_uint,
    height: c_uint,
    depth: c_uint,
    format: c_uint,
    channels: c_uint,
    /// Part of the ABI; the estimate does not depend on it.
    #[allow(dead_code)]
    flags: c_uint,
}

const ROW_ALIGN: u64 = 512;

fn estimate(w: u64, h: u64, d: u64, format: u32, channels: u32) -> u64 {
    let per = array_format::bytes_per_channel(format).unwrap_or(4);
    let row = w
        .saturating_mul(per)
        .saturating_mul(channels as u64)
        .next_multiple_of(ROW_ALIGN);
    row.saturating_mul(h.max(1)).saturating_mul(d.max(1))
}

fn mip_estimate(dsc: &CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> u64 {
    let (mut w, mut h, mut d) = (dsc.Width as u64, dsc.Height as u64, dsc.Depth as u64);
    let mut total = 0u64;
    for _ in 0..levels.min(64) {
        total = total.saturating_add(estimate(w, h, d, dsc.Format, dsc.NumChannels));
        w = (w / 2).max(1);
        h /= 2;
        d /= 2;
    }
    total
}

enum Kind {
    Array,
    Mipmapped,
}

/// What the driver says the array needs on the current device, if it says.
fn requirement(kind: &Kind, handle: *mut c_void, cudev: CUdevice) -> Option<u64> {
    let mut req = CUDA_ARRAY_MEMORY_REQUIREMENTS {
        size: 0,
        alignment: 0,
        reserved: [0; 4],
    };
    // SAFETY: a writable requirements struct and a handle the driver just returned.
    let r = unsafe {
        match kind {
            Kind::Array => real::cuArrayGetMemoryRequirements()?(&mut req, handle, cudev),
            Kind::Mipmapped => {
                real::cuMipmappedArrayGetMemoryRequirements()?(&mut req, handle, cudev)
            }
        }
    };
    (r.is_ok() && req.size > 0).then_some(req.size as u64)
}

fn destroy(kind: &Kind, handle: *mut c_void) {
    // SAFETY: destroys the array just made, which nobody else has seen.
    unsafe {
        match kind {
            Kind::Array => real::cuArrayDestroy().map(|f| f(handle)),
            Kind::Mipmapped => real::cuMipmappedArrayDestroy().map(|f| f(handle)),
        };
    }
}

/// Reserve `est`, create, settle to the driver's figure; `out` receives the handle.
fn create(
    kind: Kind,
    est: u64,
    out: *mut *mut c_void,
    mut make: impl FnMut() -> CUresult,
) -> CUresult {
    let s = match membership::active() {
        Err(e) => return e,
        Ok(None) => return make(),
        Ok(Some(s)) => s,
    };
    let Some((ctx, dev)) = membership::current(s) else {
        return make();
    };
    let reserved = s.rounded(dev, est);
    if let Err(e) = s.reserve_or_wait(dev, reserved) {
        return e;
    }
    let r = crate::wants::allocate(&s.config, dev, reserved, &mut make);
    if !r.is_ok() {
        s.release(dev, reserved);
        return r;
    }
    // SAFETY: the driver wrote the handle on success.
    let handle = unsafe { *out };
    let cudev = s.devs().get(dev).map_or(0, |d| d.cudev);
    let bytes = requirement(&kind, handle, cudev).map_or(reserved, |b| s.rounded(dev, b));
    if let Err(e) = s.settle(dev, reserved, bytes) {
        destroy(&kind, handle);
        return e;
    }
    membership::local(|l| l.arrays.insert(handle as usize, Charge { dev, bytes, ctx }));
    r
}

/// Destroys with `destroy`, forgetting the handle first (once destroyed, the driver may hand the
/// same handle to another thread's new array).
fn destroy_counted(handle: *mut c_void, destroy: impl FnOnce() -> CUresult) -> CUresult {
    let Ok(Some(s)) = membership::active() else {
        return destroy();
    };
    let charge = membership::local(|l| l.arrays.remove(&(handle as usize)));
    let r = destroy();
    if let Some(c) = charge {
        if r.is_ok() {
            s.release(c.dev, c.bytes);
        } else {
            membership::local(|l| l.arrays.insert(handle as usize, c));
        }
    }
    r
}

/// # Safety
/// The CUDA driver API contract of cuArrayCreate_v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    out: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    let Some(f) = real::cuArrayCreate_v2() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the caller's descriptor, if non-NULL (NULL is the driver's error to report).
    let est = unsafe { desc.as_ref() }.map_or(0, |d| {
        estimate(d.Width as u64, d.Height as u64, 1, d.Format, d.NumChannels)
    });
    // SAFETY: forwarded unchanged.
    create(Kind::Array, est, out, || unsafe { f(out, desc) })
}

/// # Safety
/// The CUDA driver API contract of cuArrayCreate (the 32-bit descriptor ABI).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate(out: *mut CUarray, desc: *const c_void) -> CUresult {
    let Some(f) = real::cuArrayCreate() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the caller's v1 descriptor, if non-NULL.
    let est = unsafe { desc.cast::<ArrayDescV1>().as_ref() }.map_or(0, |d| {
        estimate(d.width as u64, d.height as u64, 1, d.format, d.channels)
    });
    // SAFETY: forwarded unchanged.
    create(Kind::Array, est, out, || unsafe { f(out, desc) })
}

/// # Safety
/// The CUDA driver API contract of cuArray3DCreate_v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    out: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    let Some(f) = real::cuArray3DCreate_v2() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the caller's descriptor, if non-NULL.
    let est = unsafe { desc.as_ref() }.map_or(0, |d| {
        estimate(
            d.Width as u64,
            d.Height as u64,
            d.Depth as u64,
            d.Format,
            d.NumChannels,
        )
    });
    // SAFETY: forwarded unchanged.
    create(Kind::Array, est, out, || unsafe { f(out, desc) })
}

/// # Safety
/// The CUDA driver API contract of cuArray3DCreate (the 32-bit descriptor ABI).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate(out: *mut CUarray, desc: *const c_void) -> CUresult {
    let Some(f) = real::cuArray3DCreate() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the caller's v1 descriptor, if non-NULL.
    let est = unsafe { desc.cast::<Array3dDescV1>().as_ref() }.map_or(0, |d| {
        estimate(
            d.width as u64,
            d.height as u64,
            d.depth as u64,
            d.format,
            d.channels,
        )
    });
    // SAFETY: forwarded unchanged.
    create(Kind::Array, est, out, || unsafe { f(out, desc) })
}

/// # Safety
/// The CUDA driver API contract of cuMipmappedArrayCreate.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    out: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    let Some(f) = real::cuMipmappedArrayCreate() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the caller's descriptor, if non-NULL.
    let est = unsafe { desc.as_ref() }.map_or(0, |d| mip_estimate(d, levels));
    // SAFETY: forwarded unchanged.
    create(Kind::Mipmapped, est, out, || unsafe {
        f(out, desc, levels)
    })
}

/// # Safety
/// The CUDA driver API contract of cuArrayDestroy.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(a: CUarray) -> CUresult {
    let Some(f) = real::cuArrayDestroy() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    destroy_counted(a, || unsafe { f(a) })
}

/// # Safety
/// The CUDA driver API contract of cuMipmappedArrayDestroy.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(a: CUmipmappedArray) -> CUresult {
    let Some(f) = real::cuMipmappedArrayDestroy() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    destroy_counted(a, || unsafe { f(a) })
}
