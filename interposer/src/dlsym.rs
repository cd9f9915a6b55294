//! The core's half of the `dlsym` override (the exported `dlsym` itself is the loader's,
//! interposer/loader). libcudart, PyTorch, CuPy, Triton, pynvml and nvidia-smi reach the driver
//! with `dlopen("libcuda.so.1")` / `dlopen("libnvidia-ml.so.1")` and `dlsym(handle, name)`, which
//! searches only that handle's scope: a preloaded library's exports are never found that way.
//!
//! cuslice answers a lookup only when all of these hold: the name is exactly one cuslice wraps,
//! or any other driver function's (`cu*`, handed out behind its `gate` stub); the handle is a
//! real handle, or RTLD_DEFAULT for a driver function cuslice does not wrap (RTLD_DEFAULT already
//! finds cuslice's exports of the wrapped ones, as cuslice is preloaded ahead of the driver, and
//! RTLD_NEXT is relative to a caller this code cannot see); and the lookup, done for real, yields
//! the driver's own definition of that name (so the handle is libcuda/libnvidia-ml or a library whose scope
//! reaches them). Every other lookup goes to the real `dlsym` through shim-c's trampoline (in the
//! loader) with the caller's return address intact, so `RTLD_NEXT` stays relative to the caller.
//!
//! This code runs inside `dlsym` calls of the process: it allocates nothing and takes no lock.

use std::ffi::{CStr, c_char, c_void};

use crate::{real, registry};

/// The loader/core interface version; `interposer/loader` passes the same number.
pub const CORE_ABI: u32 = 2;

/// Called once by the loader (libcuslice.so) right after it opens the core: glibc's own `dlsym`
/// and `dlmopen`, which the loader (preloaded, so `RTLD_NEXT` from it is well defined) found.
/// Returns the core's interface version; on a mismatch nothing is taken.
///
/// # Safety
/// `dlsym` and `dlmopen` are glibc's functions of those names, or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuslice_core_attach(
    abi: u32,
    dlsym: *mut c_void,
    dlmopen: *mut c_void,
) -> u32 {
    if abi == CORE_ABI {
        real::set_dlsym(dlsym);
        crate::dlmopen::attach(dlmopen);
    }
    CORE_ABI
}

/// Called by the loader's `dlsym` for `cu*`/`nvml*` names: cuslice's wrapper (or the driver's own
/// function, behind its gate stub) for this lookup, or NULL to let glibc answer it.
///
/// # Safety
/// Called only by the loader with its caller's `dlsym` arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuslice_dlsym_route(
    handle: *mut c_void,
    name: *const c_char,
) -> *mut c_void {
    let Some(real_dlsym) = real::dlsym() else {
        return std::ptr::null_mut();
    };
    if name.is_null() || handle == libc::RTLD_NEXT {
        return std::ptr::null_mut();
    }
    // SAFETY: dlsym's contract: `name` is a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    let entry = real::by_name(bytes).and_then(|i| Some((i, real::SYMS.get(i)?)));
    let wrapper = entry.and_then(|(i, _)| registry::wrapper_at(i));
    let lib = match entry {
        Some((_, info)) => info.lib,
        None if bytes.starts_with(b"cu") => real::Lib::Cuda,
        None => return std::ptr::null_mut(),
    };
    // RTLD_DEFAULT finds the loader's exports of the wrapped names (gated there); only the
    // driver's other functions are answered here.
    if (wrapper.is_none() && lib != real::Lib::Cuda)
        || (wrapper.is_some() && handle == libc::RTLD_DEFAULT)
    {
        return std::ptr::null_mut();
    }
    let Some(lib_handle) = real::loaded_handle(lib) else {
        return std::ptr::null_mut();
    };
    // SAFETY: the real dlsym with live handles and the caller's NUL-terminated name.
    let driver_def = unsafe { real_dlsym(lib_handle, name) };
    if driver_def.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: as above; `handle` is the caller's handle (or RTLD_DEFAULT), valid per dlsym's
    // contract.
    if handle != lib_handle && unsafe { real_dlsym(handle, name) } != driver_def {
        return std::ptr::null_mut();
    }
    let Some(wrapper) = wrapper else {
        // A driver function cuslice does not wrap goes out behind its gate stub.
        return crate::gate::stub(driver_def);
    };
    if !real::ensure(lib) {
        return std::ptr::null_mut();
    }
    crate::log::debug!(
        "dlsym {}: cuslice's wrapper",
        String::from_utf8_lossy(bytes)
    );
    match lib {
        real::Lib::Cuda => crate::gate::stub(wrapper),
        real::Lib::Nvml => wrapper,
    }
}
