//! Memory no allocation call reveals: what creating a context takes (its local memory, its
//! stacks, the driver's bookkeeping) and what loading a module or library takes (code, constant
//! and global data). cuslice measures it where it appears:
//!
//! - a context: the slice's first context on a device is measured alone (racing first contexts
//!   wait for it): what NVML says the process that appeared on the device across the creation
//!   holds (this process, the only one new there; its pid may be a host pid cuslice does not
//!   know), less whatever this process charged meanwhile. Where not exactly one process appeared
//!   (NVML lists no processes, or another slice's first context was made at the same moment),
//!   the rise in the device's used memory across the creation, less the same. (The rise alone
//!   counted a neighbour's allocations made meanwhile, which refused a container's first context
//!   while the container beside it filled its cap.) The figure is kept in the ledger per device; every later
//!   context reserves and is charged that figure before it is created (measuring it again while
//!   other processes make or drop contexts would count theirs).
//! - a module or library: the drop in the device's free memory (cuMemGetInfo) across the load,
//!   less this process's own charges meanwhile, charged after the load; if it does not fit, the
//!   module is unloaded again and the load refused.
//!
//! Other processes allocating at the same moment can only make a measurement larger (the safe
//! direction); one freeing at that moment can make it smaller. Destroying a context (or the last
//! release or a reset of a primary context) gives back everything made in it.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use cuda_abi::*;

use crate::hooks::real;
use crate::slice::{self, Charge, Slice};

/// Creates a context on device `cudev` with `make`, charging its hidden memory.
fn create(cudev: CUdevice, out: *mut CUcontext, make: impl FnOnce() -> CUresult) -> CUresult {
    let s = match slice::active() {
        Err(e) => return e,
        Ok(None) => return make(),
        Ok(Some(s)) => s,
    };
    let Some(dev) = s.dev_by_cudev(cudev) else {
        return make();
    };
    let Some(d) = s.devs().get(dev) else {
        return make();
    };
    let (index, uuid) = (d.index, d.uuid);
    // The slice's first context on the device is measured alone; every later one is charged
    // that figure (a measurement taken while other processes make contexts counts theirs too).
    let mut estimate = s.ledger.context_overhead(index);
    let measuring = match estimate {
        0 => s.ledger.measuring(index),
        _ => None,
    };
    if measuring.is_some() {
        estimate = s.ledger.context_overhead(index);
    }
    let first = measuring.is_some() && estimate == 0;
    if let Err(e) = s.reserve(dev, estimate) {
        return e;
    }
    let before = first.then(|| crate::nvml::device_used(&uuid)).flatten();
    let procs_before = first.then(|| crate::nvml::process_memory(&uuid)).flatten();
    let own0 = s.own_charged();
    let r = make();
    if !r.is_ok() {
        s.release(dev, estimate);
        return r;
    }
    // SAFETY: written by the driver on success.
    let ctx = unsafe { *out } as usize;
    if slice::local(|l| l.contexts.contains_key(&ctx)) {
        // Another thread made (and was charged for) this primary context first.
        s.release(dev, estimate);
        return r;
    }
    let charge = match (first, before) {
        (true, Some(b)) => {
            let after = crate::nvml::device_used(&uuid).unwrap_or(b);
            let procs_after = crate::nvml::process_memory(&uuid);
            let own1 = s.own_charged();
            let seen = match (&procs_before, &procs_after) {
                (Some(was), Some(now)) => appeared(was, now),
                _ => None,
            };
            let measured = seen
                .unwrap_or_else(|| after.saturating_sub(b))
                .saturating_sub(own1.saturating_sub(own0));
            s.ledger.set_context_overhead(index, measured);
            measured
        }
        _ => estimate,
    };
    if let Err(e) = s.settle(dev, estimate, charge) {
        if let Some(f) = real::cuCtxDestroy_v2() {
            // SAFETY: destroys the context just made, which the caller has not seen.
            unsafe { f(ctx as CUcontext) };
        }
        return e;
    }
    drop(measuring);
    crate::log::debug!("context on device {dev}: {charge} bytes of overhead");
    slice::local(|l| {
        l.contexts.insert(
            ctx,
            Charge {
                dev,
                bytes: charge,
                ctx,
            },
        )
    });
    r
}

/// What the one process listed in `now` and not in `was` holds; None unless exactly one appeared.
fn appeared(was: &[(u32, u64)], now: &[(u32, u64)]) -> Option<u64> {
    let mut new = now
        .iter()
        .filter(|(pid, _)| !was.iter().any(|(p, _)| p == pid));
    match (new.next(), new.next()) {
        (Some(&(_, bytes)), None) => Some(bytes),
        _ => None,
    }
}

/// # Safety
/// The CUDA driver API contract of cuCtxCreate (the pre-3.2 ABI).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate(
    ctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let Some(f) = real::cuCtxCreate() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    create(dev, ctx, || unsafe { f(ctx, flags, dev) })
}

/// # Safety
/// The CUDA driver API contract of cuCtxCreate_v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    ctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let Some(f) = real::cuCtxCreate_v2() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    create(dev, ctx, || unsafe { f(ctx, flags, dev) })
}

/// # Safety
/// The CUDA driver API contract of cuCtxCreate_v3.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    ctx: *mut CUcontext,
    params: *mut c_void,
    n: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let Some(f) = real::cuCtxCreate_v3() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    create(dev, ctx, || unsafe { f(ctx, params, n, flags, dev) })
}

/// # Safety
/// The CUDA driver API contract of cuCtxCreate_v4.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    ctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let Some(f) = real::cuCtxCreate_v4() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    create(dev, ctx, || unsafe { f(ctx, params, flags, dev) })
}

fn destroyed(ctx: CUcontext, r: CUresult) -> CUresult {
    if r.is_ok()
        && let Ok(Some(s)) = slice::active()
    {
        slice::context_gone(s, ctx as usize);
    }
    r
}

/// # Safety
/// The CUDA driver API contract of cuCtxDestroy.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    let Some(f) = real::cuCtxDestroy() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    destroyed(ctx, unsafe { f(ctx) })
}

/// # Safety
/// The CUDA driver API contract of cuCtxDestroy_v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    let Some(f) = real::cuCtxDestroy_v2() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    destroyed(ctx, unsafe { f(ctx) })
}

/// # Safety
/// The CUDA driver API contract of cuDevicePrimaryCtxRetain.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    let Some(f) = real::cuDevicePrimaryCtxRetain() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let call = || unsafe { f(ctx, dev) };
    let Ok(Some(s)) = slice::active() else {
        return call();
    };
    let Some(o) = s.dev_by_cudev(dev) else {
        return call();
    };
    let live = slice::local(|l| l.primary.get(&o).is_some_and(|p| p.1 > 0));
    let r = if live { call() } else { create(dev, ctx, call) };
    if r.is_ok() {
        // SAFETY: written by the driver on success.
        let c = unsafe { *ctx } as usize;
        slice::local(|l| {
            let e = l.primary.entry(o).or_insert((c, 0));
            e.0 = c;
            e.1 += 1;
        });
    }
    r
}

fn primary_released(s: &Slice, dev: CUdevice, reset: bool) {
    let Some(o) = s.dev_by_cudev(dev) else { return };
    let gone = slice::local(|l| match l.primary.get_mut(&o) {
        Some(p) if reset || p.1 <= 1 => l.primary.remove(&o).map(|p| p.0),
        Some(p) => {
            p.1 -= 1;
            None
        }
        None => None,
    });
    if let Some(ctx) = gone {
        slice::context_gone(s, ctx);
    }
}

macro_rules! primary_wrappers {
    ($($name:ident reset=$reset:expr;)*) => {$(
        /// # Safety
        /// The CUDA driver API contract of the function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dev: CUdevice) -> CUresult {
            let Some(f) = real::$name() else {
                return CUresult::CUDA_ERROR_NOT_INITIALIZED;
            };
            // SAFETY: forwarded unchanged.
            let r = unsafe { f(dev) };
            if r.is_ok()
                && let Ok(Some(s)) = slice::active()
            {
                primary_released(s, dev, $reset);
            }
            r
        }
    )*};
}

primary_wrappers! {
    cuDevicePrimaryCtxRelease reset=false;
    cuDevicePrimaryCtxRelease_v2 reset=false;
    cuDevicePrimaryCtxReset reset=true;
    cuDevicePrimaryCtxReset_v2 reset=true;
}

// ---- modules and libraries -------------------------------------------------------------------

fn free_now() -> Option<u64> {
    let f = real::cuMemGetInfo_v2()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    (unsafe { f(&mut free, &mut total) })
        .is_ok()
        .then_some(free as u64)
}

/// Loads with `load` (which writes the handle to `out`), charging what the load took.
/// `per_context`: a module lives in the current context; a library in none.
fn load(
    out: *mut *mut c_void,
    per_context: bool,
    load: impl FnOnce() -> CUresult,
    unload: impl FnOnce(*mut c_void),
) -> CUresult {
    let s = match slice::active() {
        Err(e) => return e,
        Ok(None) => return load(),
        Ok(Some(s)) => s,
    };
    let Some((ctx, dev)) = slice::current(s) else {
        return load();
    };
    let (free0, own0) = (free_now(), s.own_charged());
    let r = load();
    if !r.is_ok() {
        return r;
    }
    let (free1, own1) = (free_now(), s.own_charged());
    let took = match (free0, free1) {
        (Some(a), Some(b)) => a
            .saturating_sub(b)
            .saturating_sub(own1.saturating_sub(own0)),
        _ => 0,
    };
    // SAFETY: written by the driver on success.
    let h = unsafe { *out };
    if let Err(e) = s.reserve(dev, took) {
        unload(h);
        return e;
    }
    let ctx = if per_context { ctx } else { 0 };
    slice::local(|l| {
        l.modules.insert(
            h as usize,
            Charge {
                dev,
                bytes: took,
                ctx,
            },
        )
    });
    r
}

fn unload_module(m: *mut c_void) {
    if let Some(f) = real::cuModuleUnload() {
        // SAFETY: unloads the module just loaded.
        unsafe { f(m) };
    }
}

fn unload_library(l: *mut c_void) {
    if let Some(f) = real::cuLibraryUnload() {
        // SAFETY: unloads the library just loaded.
        unsafe { f(l) };
    }
}

/// Unloads with `unload`, forgetting the handle first (it may be reused at once).
fn unload_counted(h: *mut c_void, unload: impl FnOnce() -> CUresult) -> CUresult {
    let Ok(Some(s)) = slice::active() else {
        return unload();
    };
    let charge = slice::local(|l| l.modules.remove(&(h as usize)));
    let r = unload();
    if let Some(c) = charge {
        if r.is_ok() {
            s.release(c.dev, c.bytes);
        } else {
            slice::local(|l| l.modules.insert(h as usize, c));
        }
    }
    r
}

/// # Safety
/// The CUDA driver API contract of cuModuleLoad.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoad(m: *mut CUmodule, path: *const c_char) -> CUresult {
    let Some(f) = real::cuModuleLoad() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    load(m, true, || unsafe { f(m, path) }, unload_module)
}

/// # Safety
/// The CUDA driver API contract of cuModuleLoadData.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(m: *mut CUmodule, image: *const c_void) -> CUresult {
    let Some(f) = real::cuModuleLoadData() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    load(m, true, || unsafe { f(m, image) }, unload_module)
}

/// # Safety
/// The CUDA driver API contract of cuModuleLoadDataEx.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    m: *mut CUmodule,
    image: *const c_void,
    n: c_uint,
    opts: *mut c_int,
    vals: *mut *mut c_void,
) -> CUresult {
    let Some(f) = real::cuModuleLoadDataEx() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let call = || unsafe { f(m, image, n, opts, vals) };
    load(m, true, call, unload_module)
}

/// # Safety
/// The CUDA driver API contract of cuModuleLoadFatBinary.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadFatBinary(m: *mut CUmodule, image: *const c_void) -> CUresult {
    let Some(f) = real::cuModuleLoadFatBinary() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    load(m, true, || unsafe { f(m, image) }, unload_module)
}

/// # Safety
/// The CUDA driver API contract of cuModuleUnload.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleUnload(m: CUmodule) -> CUresult {
    let Some(f) = real::cuModuleUnload() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    unload_counted(m, || unsafe { f(m) })
}

/// # Safety
/// The CUDA driver API contract of cuLibraryLoadData.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryLoadData(
    lib: *mut CUlibrary,
    code: *const c_void,
    jit_opts: *mut c_int,
    jit_vals: *mut *mut c_void,
    n_jit: c_uint,
    lib_opts: *mut c_int,
    lib_vals: *mut *mut c_void,
    n_lib: c_uint,
) -> CUresult {
    let Some(f) = real::cuLibraryLoadData() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let call = || unsafe {
        f(
            lib, code, jit_opts, jit_vals, n_jit, lib_opts, lib_vals, n_lib,
        )
    };
    load(lib, false, call, unload_library)
}

/// # Safety
/// The CUDA driver API contract of cuLibraryLoadFromFile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    lib: *mut CUlibrary,
    path: *const c_char,
    jit_opts: *mut c_int,
    jit_vals: *mut *mut c_void,
    n_jit: c_uint,
    lib_opts: *mut c_int,
    lib_vals: *mut *mut c_void,
    n_lib: c_uint,
) -> CUresult {
    let Some(f) = real::cuLibraryLoadFromFile() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let call = || unsafe {
        f(
            lib, path, jit_opts, jit_vals, n_jit, lib_opts, lib_vals, n_lib,
        )
    };
    load(lib, false, call, unload_library)
}

/// # Safety
/// The CUDA driver API contract of cuLibraryUnload.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryUnload(lib: CUlibrary) -> CUresult {
    let Some(f) = real::cuLibraryUnload() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    unload_counted(lib, || unsafe { f(lib) })
}

#[cfg(test)]
mod tests {
    use super::appeared;

    #[test]
    fn the_one_process_that_appeared_is_measured_and_no_other() {
        let was = [(10, 5 << 30)];
        // The neighbour grew while this process appeared with its context: the context only.
        assert_eq!(
            appeared(&was, &[(10, 7 << 30), (11, 300 << 20)]),
            Some(300 << 20)
        );
        // Two appeared (another slice's first context at the same moment): cannot tell.
        assert_eq!(appeared(&was, &[(10, 5 << 30), (11, 1), (12, 2)]), None);
        // None appeared (this process was listed already, or NVML lists nothing).
        assert_eq!(appeared(&was, &was), None);
        assert_eq!(appeared(&[], &[]), None);
    }
}
