//! Host memory: page-locked allocations, registered host ranges and their device pointers.

use std::ffi::{c_uint, c_void};

use cuda_abi::{CUdeviceptr, CUresult};

use crate::driver::*;

fn host_alloc(pp: *mut *mut c_void, size: usize) -> Res {
    if pp.is_null() || size == 0 {
        return Err(E_INVALID_VALUE);
    }
    let d = drv()?;
    let mut inner = d.inner.lock();
    inner.cur()?;
    // SAFETY: plain allocation; checked for NULL.
    let p = unsafe { libc::calloc(1, size) };
    if p.is_null() {
        return Err(E_OOM);
    }
    inner.host.insert(p as u64, (size, true));
    // SAFETY: checked non-NULL.
    unsafe { pp.write(p) };
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    status(host_alloc(pp, size))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost(pp: *mut *mut c_void, size: c_uint) -> CUresult {
    status(host_alloc(pp, size as usize))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    size: usize,
    _flags: c_uint,
) -> CUresult {
    status(host_alloc(pp, size))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    status(
        drv().and_then(|d| match d.inner.lock().host.remove(&(p as u64)) {
            Some((_, true)) => {
                // SAFETY: allocated with calloc in `host_alloc`.
                unsafe { libc::free(p) };
                Ok(())
            }
            _ => Err(E_INVALID_VALUE),
        }),
    )
}

fn host_register(p: *mut c_void, size: usize) -> Res {
    if p.is_null() || size == 0 {
        return Err(E_INVALID_VALUE);
    }
    let d = drv()?;
    let mut inner = d.inner.lock();
    inner.cur()?;
    if inner.host.contains_key(&(p as u64)) {
        return Err(CUresult(712)); // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
    }
    inner.host.insert(p as u64, (size, false));
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    size: usize,
    _flags: c_uint,
) -> CUresult {
    status(host_register(p, size))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostRegister(
    p: *mut c_void,
    size: usize,
    _flags: c_uint,
) -> CUresult {
    status(host_register(p, size))
}

/// The device's address of page-locked host memory (allocated by the driver or registered with
/// it): with unified addressing, the host address itself. Any address inside such a range.
fn host_device_pointer(out: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) -> Res {
    if out.is_null() || flags != 0 {
        return Err(E_INVALID_VALUE);
    }
    let d = drv()?;
    let inner = d.inner.lock();
    inner.cur()?;
    let a = p as u64;
    if !inner
        .host
        .iter()
        .any(|(&s, &(len, _))| a >= s && a < s + len as u64)
    {
        return Err(E_INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { out.write(a) };
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    out: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    status(host_device_pointer(out, p, flags))
}

/// The same under the name `cuda.h` maps it to before the `_v2` ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer(
    out: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on.
    unsafe { cuMemHostGetDevicePointer_v2(out, p, flags) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    status(drv().and_then(|d| {
        let mut inner = d.inner.lock();
        match inner.host.get(&(p as u64)) {
            Some((_, false)) => {
                inner.host.remove(&(p as u64));
                Ok(())
            }
            _ => Err(CUresult(713)), // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        }
    }))
}
