//! `cuGetProcAddress` (11.3) and `cuGetProcAddress_v2` (12.0): the driver picks the variant of
//! `symbol` for (`cudaVersion`, `flags`); cuslice asks the real driver with the caller's exact
//! arguments, recognises the variant by its address among the ones it resolved by name, and
//! hands back its wrapper of exactly that variant. Result, status and every other pointer are
//! the driver's, untouched. Asking for "cuGetProcAddress" thereby yields cuslice's wrapper too,
//! and `cudaGetDriverEntryPoint[ByVersion]` (which goes through here) is covered.

use std::ffi::{c_char, c_int, c_void};

use cuda_abi::CUresult;

use crate::hooks::{self, Lib, real};

/// # Safety
/// `pfn` must be NULL or writable, per the API.
unsafe fn substitute(r: CUresult, pfn: *mut *mut c_void) {
    if r.is_ok() && !pfn.is_null() {
        // SAFETY: non-NULL and written by the driver just now.
        let p = unsafe { *pfn };
        if let Some(w) = hooks::wrapper_for_real(Lib::Cuda, p) {
            // SAFETY: as above.
            unsafe { *pfn = w };
        }
    }
}

/// # Safety
/// The CUDA driver API contract of cuGetProcAddress.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    let Some(f) = real::cuGetProcAddress() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged to the real function of the same prototype.
    let r = unsafe { f(symbol, pfn, version, flags) };
    // SAFETY: `pfn` is the caller's, as the API requires.
    unsafe { substitute(r, pfn) };
    r
}

/// # Safety
/// The CUDA driver API contract of cuGetProcAddress_v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    let Some(f) = real::cuGetProcAddress_v2() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged to the real function of the same prototype.
    let r = unsafe { f(symbol, pfn, version, flags, status) };
    // SAFETY: `pfn` is the caller's, as the API requires.
    unsafe { substitute(r, pfn) };
    r
}
