//! The wrapper registry: which entry points cuslice wraps, with which function, and the two
//! lookups that hand the wrappers out to applications that do not call the exports directly: by
//! name (the `dlsym` override, `dlsym`) and by the real function's address (`cuGetProcAddress`,
//! whose wrappers are here because asking for "cuGetProcAddress" must yield cuslice's own).
//!
//! The list is src/wrapped.txt (name and module of each wrapper); interposer/build.rs turns it
//! into the table below, and the loader's build script makes libcuslice.so export the same
//! names. This is the only module that names the wrappers: the modules that define them use the
//! real entry points (`real`) and never this one.
//!
//! `cuGetProcAddress` (11.3) and `cuGetProcAddress_v2` (12.0): the driver picks the variant of
//! `symbol` for (`cudaVersion`, `flags`); cuslice asks the real driver with the caller's exact
//! arguments, recognises the variant by its address among the ones it resolved by name, and
//! hands back its wrapper of exactly that variant; every other pointer is the driver's own. Each
//! goes out behind its `gate` stub. Result and status are the driver's, untouched.
//! `cudaGetDriverEntryPoint[ByVersion]` (which goes through here) is thereby covered.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_void};

use cuda_abi::CUresult;

use crate::real::{self, Lib, Sym};

/// The address of a wrapper.
#[derive(Clone, Copy)]
struct Wrapper(*const ());

// SAFETY: the address of a function, never written through; the table is immutable.
unsafe impl Sync for Wrapper {}

/// Makes `WRAPPERS` from the list `module name;` generated from src/wrapped.txt.
macro_rules! wrapped {
    ($($module:ident $name:ident;)*) => {
        /// cuslice's wrapper of each entry of the table of real entry points (in `real::Sym`
        /// order), where it wraps it.
        static WRAPPERS: [Option<Wrapper>; real::COUNT] = {
            let mut w = [None; real::COUNT];
            $(
                // Of the real function's prototype, or this does not compile.
                let f: real::sig::$name = crate::$module::$name;
                w[Sym::$name as usize] = Some(Wrapper(f as *const ()));
            )*
            w
        };
    };
}

include!(concat!(env!("OUT_DIR"), "/wrapped.rs"));

/// cuslice's wrapper of table entry `i` (`real::by_name`, `real::by_real`), if it wraps it.
pub fn wrapper_at(i: usize) -> Option<*mut c_void> {
    WRAPPERS
        .get(i)
        .copied()
        .flatten()
        .map(|w| w.0 as *mut c_void)
}

/// cuslice's wrapper for the exact real function `p`, if cuslice wraps it.
pub fn wrapper_for_real(lib: Lib, p: *mut c_void) -> Option<*mut c_void> {
    if p.is_null() || !real::ensure(lib) {
        return None;
    }
    real::by_real(lib, p).and_then(wrapper_at)
}

/// # Safety
/// `pfn` must be NULL or writable, per the API.
unsafe fn substitute(r: CUresult, pfn: *mut *mut c_void) {
    if r.is_ok() && !pfn.is_null() {
        // SAFETY: non-NULL and written by the driver just now.
        let p = unsafe { *pfn };
        let w = wrapper_for_real(Lib::Cuda, p).unwrap_or(p);
        // SAFETY: as above.
        unsafe { *pfn = crate::gate::stub(w) };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_entry_point_has_its_wrapper_and_no_other_has_one() {
        let listed: Vec<&str> = include_str!("wrapped.txt")
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        for (i, s) in real::SYMS.iter().enumerate() {
            assert_eq!(
                wrapper_at(i).is_some(),
                listed.contains(&s.name()),
                "{}",
                s.name()
            );
        }
        assert_eq!(WRAPPERS.iter().flatten().count(), listed.len());
        assert!(wrapper_at(real::COUNT).is_none());
    }
}
