//! The core's half of the `dlsym` override (the exported `dlsym` itself is the loader's,
//! interposer/loader). libcudart, PyTorch, CuPy, Triton, pynvml and nvidia-smi reach the driver
//! with `dlopen("libcuda.so.1")` / `dlopen("libnvidia-ml.so.1")` and `dlsym(handle, name)`, which
//! searches only that handle's scope: a preloaded library's exports are never found that way.
//!
//! cuslice answers a lookup only when all of these hold: the name is exactly one cuslice wraps;
//! the handle is a real handle (RTLD_DEFAULT and RTLD_NEXT already find cuslice's exports, as
//! cuslice is preloaded ahead of the driver); and the lookup, done for real, yields the driver's
//! own definition of that name (so the handle is libcuda/libnvidia-ml or a library whose scope
//! reaches them). Every other lookup goes to the real `dlsym` through shim-c's trampoline (in the
//! loader) with the caller's return address intact, so `RTLD_NEXT` stays relative to the caller.
//!
//! This code runs inside `dlsym` calls of the process: it allocates nothing and takes no lock.

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::hooks;

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's dlsym, handed over by the loader (`cuslice_core_attach`).
static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

#[cfg(target_arch = "x86_64")]
const DLSYM_BASE_VERSION: &CStr = c"GLIBC_2.2.5";
#[cfg(target_arch = "aarch64")]
const DLSYM_BASE_VERSION: &CStr = c"GLIBC_2.17";

/// The loader/core interface version; `interposer/loader` passes the same number.
pub const CORE_ABI: u32 = 1;

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
        if !dlsym.is_null() {
            REAL_DLSYM.store(dlsym, Ordering::Release);
        }
        crate::dlmopen::attach(dlmopen);
    }
    CORE_ABI
}

/// glibc's own dlsym: the loader's, else (the core preloaded by itself, as some tests do)
/// `dlvsym(RTLD_NEXT, "dlsym", ...)`, newest version first.
pub fn real_dlsym() -> Option<DlsymFn> {
    let p = REAL_DLSYM.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: only ever set to glibc's dlsym, which has exactly this prototype.
        return Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) });
    }
    for version in [c"GLIBC_2.34", DLSYM_BASE_VERSION] {
        // SAFETY: dlvsym (not overridden by cuslice) with NUL-terminated strings.
        let f = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !f.is_null() {
            REAL_DLSYM.store(f, Ordering::Release);
            // SAFETY: glibc's dlsym has exactly this prototype.
            return Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(f) });
        }
    }
    None
}

/// Called by the loader's `dlsym` for `cu*`/`nvml*` names: cuslice's wrapper for this lookup, or
/// NULL to let glibc answer it.
///
/// # Safety
/// Called only by the loader with its caller's `dlsym` arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuslice_dlsym_route(
    handle: *mut c_void,
    name: *const c_char,
) -> *mut c_void {
    let Some(real) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    if name.is_null() || handle == libc::RTLD_DEFAULT || handle == libc::RTLD_NEXT {
        return std::ptr::null_mut();
    }
    // SAFETY: dlsym's contract: `name` is a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    let Some(i) = hooks::by_name(bytes) else {
        return std::ptr::null_mut();
    };
    let Some(info) = hooks::SYMS.get(i) else {
        return std::ptr::null_mut();
    };
    let Some(wrapper) = info.wrapper else {
        return std::ptr::null_mut();
    };
    let Some(lib) = hooks::loaded_handle(info.lib) else {
        return std::ptr::null_mut();
    };
    // SAFETY: the real dlsym with live handles and the caller's NUL-terminated name.
    let driver_def = unsafe { real(lib, name) };
    if driver_def.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: as above; `handle` is the caller's handle, valid per dlsym's contract.
    if handle != lib && unsafe { real(handle, name) } != driver_def {
        return std::ptr::null_mut();
    }
    if !hooks::ensure(info.lib) {
        return std::ptr::null_mut();
    }
    crate::log::debug!("dlsym {}: cuslice's wrapper", info.name());
    wrapper as *mut c_void
}
