//! The core of the `dlmopen` override (the loader exports `dlmopen` and calls `cuslice_dlmopen`). `dlmopen(LM_ID_NEWLM, "libcuda.so.1", ...)` loads the driver into a
//! new link-map namespace, where no preloaded library applies: measured before this existed, a
//! process opened that way allocated 7.5 GiB under a 1 GiB cap and saw the whole device.
//!
//! cuslice opens the driver (or NVML) in the main namespace instead, where its wrappers apply,
//! and returns that handle: the caller's `dlsym` on it then reaches cuslice as for any `dlopen`.
//! A library is taken for the driver when its name is `libcuda.so*` / `libnvidia-ml.so*`, or,
//! once loaded in the new namespace, when its scope defines `cuInit` or `nvmlInit_v2` (a copy
//! under another name, or a library that pulls the driver in): that namespace is closed again
//! and the library opened in the main one. Every other `dlmopen` is passed through unchanged.
//! A driver opened in the main namespace under another name is not caught here: the node agent
//! sees it by the driver's own counts (docs/agent.md).

use std::ffi::{CStr, c_char, c_int, c_long, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::log::info;

type DlmopenFn = unsafe extern "C" fn(c_long, *const c_char, c_int) -> *mut c_void;

/// glibc's `LM_ID_BASE`: the main namespace.
const LM_ID_BASE: c_long = 0;

#[cfg(target_arch = "x86_64")]
const DLMOPEN_BASE_VERSION: &CStr = c"GLIBC_2.3.4";
#[cfg(target_arch = "aarch64")]
const DLMOPEN_BASE_VERSION: &CStr = c"GLIBC_2.17";

/// glibc's dlmopen, handed over by the loader (`cuslice_core_attach`).
static REAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

pub(crate) fn attach(real: *mut c_void) {
    if !real.is_null() {
        REAL.store(real, Ordering::Release);
    }
}

fn real_dlmopen() -> Option<DlmopenFn> {
    let mut p = REAL.load(Ordering::Acquire);
    if p.is_null() {
        for version in [c"GLIBC_2.34", DLMOPEN_BASE_VERSION] {
            // SAFETY: dlvsym (not overridden by cuslice) with NUL-terminated strings.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlmopen".as_ptr(), version.as_ptr()) };
            if !p.is_null() {
                break;
            }
        }
        if p.is_null() {
            return None;
        }
        REAL.store(p, Ordering::Release);
    }
    // SAFETY: glibc's dlmopen, which has exactly this prototype.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlmopenFn>(p) })
}

/// Whether the file name (its last component) names the driver or NVML.
fn names_driver(file: &[u8]) -> bool {
    let base = file.rsplit(|&b| b == b'/').next().unwrap_or(file);
    base.starts_with(b"libcuda.so") || base.starts_with(b"libnvidia-ml.so")
}

/// Whether the scope of `handle` defines the driver's or NVML's entry point.
fn defines_driver(handle: *mut c_void) -> bool {
    let Some(real) = crate::real::dlsym() else {
        return false;
    };
    [c"cuInit", c"nvmlInit_v2"].iter().any(|name| {
        // SAFETY: glibc's dlsym on a live handle with a NUL-terminated name.
        !unsafe { real(handle, name.as_ptr()) }.is_null()
    })
}

/// What the loader's exported `dlmopen` calls for every `dlmopen` into another namespace.
///
/// # Safety
/// glibc's dlmopen contract: a valid namespace id, and NULL or a NUL-terminated file name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuslice_dlmopen(
    lmid: c_long,
    file: *const c_char,
    mode: c_int,
) -> *mut c_void {
    let Some(real) = real_dlmopen() else {
        return std::ptr::null_mut();
    };
    if lmid == LM_ID_BASE || file.is_null() {
        // SAFETY: forwarded unchanged.
        return unsafe { real(lmid, file, mode) };
    }
    // SAFETY: non-NULL, NUL-terminated per the contract.
    let name = unsafe { CStr::from_ptr(file) };
    if !names_driver(name.to_bytes()) {
        // SAFETY: forwarded unchanged.
        let handle = unsafe { real(lmid, file, mode) };
        if handle.is_null() || !defines_driver(handle) {
            return handle;
        }
        // SAFETY: a handle dlmopen just returned, closed once.
        unsafe { libc::dlclose(handle) };
    }
    info!(
        "dlmopen of {} into another link-map namespace: opened in the main namespace instead, \
         where the slice's caps apply",
        name.to_string_lossy()
    );
    // SAFETY: dlopen with the caller's NUL-terminated name and flags (dlmopen takes dlopen's).
    unsafe { libc::dlopen(file, mode) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_are_recognised_by_their_last_component() {
        assert!(names_driver(b"libcuda.so.1"));
        assert!(names_driver(b"/usr/lib/x86_64-linux-gnu/libcuda.so"));
        assert!(names_driver(b"libnvidia-ml.so.1"));
        assert!(!names_driver(b"libcudart.so.12"));
        assert!(!names_driver(b"/opt/libcuda.so.1/libfoo.so"));
    }
}
