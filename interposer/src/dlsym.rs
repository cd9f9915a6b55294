//! The `dlsym` override. libcudart, PyTorch, CuPy, Triton, pynvml and nvidia-smi reach the driver
//! with `dlopen("libcuda.so.1")` / `dlopen("libnvidia-ml.so.1")` and `dlsym(handle, name)`, which
//! searches only that handle's scope: a preloaded library's exports are never found that way.
//!
//! cuslice answers a lookup only when all of these hold: the name is exactly one cuslice wraps;
//! the handle is a real handle (RTLD_DEFAULT and RTLD_NEXT already find cuslice's exports, as
//! cuslice is preloaded ahead of the driver); and the lookup, done for real, yields the driver's
//! own definition of that name (so the handle is libcuda/libnvidia-ml or a library whose scope
//! reaches them). Every other lookup goes to the real `dlsym` through shim-c's trampoline with
//! the caller's return address intact, so `RTLD_NEXT` stays relative to the caller.
//!
//! This code runs inside every `dlsym` of the process, including Rust std's own weak-symbol
//! lookups before `main`: it allocates nothing and takes no lock.

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::hooks;

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

unsafe extern "C" {
    /// shim-c/dlsym_*.S
    fn cuslice_dlsym_trampoline();
    /// Where the trampoline jumps to forward a lookup; set by `real_dlsym`.
    static cuslice_real_dlsym: AtomicPtr<c_void>;
}

/// The exported `dlsym`: a jump into the trampoline, so the caller's frame is untouched.
///
/// # Safety
/// glibc's dlsym contract: a valid handle and a NUL-terminated name.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!("jmp {t}", t = sym cuslice_dlsym_trampoline)
}

/// As on x86_64.
///
/// # Safety
/// glibc's dlsym contract: a valid handle and a NUL-terminated name.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!("b {t}", t = sym cuslice_dlsym_trampoline)
}

#[cfg(target_arch = "x86_64")]
const DLSYM_BASE_VERSION: &CStr = c"GLIBC_2.2.5";
#[cfg(target_arch = "aarch64")]
const DLSYM_BASE_VERSION: &CStr = c"GLIBC_2.17";

/// Answers every lookup with "not found" if glibc's dlsym cannot be found at all (it always
/// can on glibc; this only keeps the trampoline from jumping to NULL).
unsafe extern "C" fn no_dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// glibc's own dlsym: `dlvsym(RTLD_NEXT, "dlsym", ...)`, newest version first (`_dl_sym` and
/// `__libc_dlsym` are no longer exported by glibc 2.36).
pub fn real_dlsym() -> Option<DlsymFn> {
    // SAFETY: an extern static of atomic type, defined in shim-c, zero-initialised.
    let slot = unsafe { &cuslice_real_dlsym };
    let p = slot.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: only ever set below, to glibc's dlsym or `no_dlsym`, both of this type.
        return Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) });
    }
    for version in [c"GLIBC_2.34", DLSYM_BASE_VERSION] {
        // SAFETY: dlvsym (not overridden by cuslice) with NUL-terminated strings.
        let f = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !f.is_null() {
            slot.store(f, Ordering::Release);
            // SAFETY: glibc's dlsym has exactly this prototype.
            return Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(f) });
        }
    }
    slot.store(no_dlsym as *mut c_void, Ordering::Release);
    None
}

/// Called by the trampoline: cuslice's wrapper for this lookup, or NULL to forward it.
///
/// # Safety
/// Called only by the trampoline with the caller's `dlsym` arguments.
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
