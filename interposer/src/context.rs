//! Memory no allocation call reveals: what creating a context takes (its local memory, its
//! stacks, the driver's bookkeeping) and what loading a module or library takes (code, constant
//! and global data). cuslice measures it where it appears:
//!
//! - a context: the slice's first context on a device is measured alone (racing first contexts
//!   wait for it), by what NVML's process list says this process holds there, less whatever it
//!   charged there meanwhile. Under its own pid where NVML's pid for it is known (its own, in the
//!   host's pid namespace; the host pid the node agent told it, in a container): exact, whatever
//!   other processes do at the same moment. Otherwise the entries that appeared or changed
//!   across the creation, less those under a pid listed before other than its own (this process
//!   was not listed: it had no context there); if more than one is left, more lists are taken
//!   until one figure is left (neighbours' figures change, this process's holds still), up to
//!   100 ms, and then the largest is charged: never less than the context takes. Only where
//!   NVML gives no figure for processes is it the rise in the device's used memory across the
//!   creation, which a neighbour freeing at that moment makes smaller (docs/interposer.md). The
//!   figure is kept in the ledger per device; every later context reserves and is charged that
//!   figure before it is created (measuring it again while other processes make or drop
//!   contexts would count theirs).
//! - a module or library: the drop in the device's free memory (cuMemGetInfo) across the load,
//!   less this process's own charges meanwhile, charged after the load; if it does not fit, the
//!   module is unloaded again and the load refused.
//!
//! For a module, other processes allocating at the same moment make the measurement larger (the
//! safe direction); one freeing at that moment makes it smaller. Destroying a context (or the
//! last release or a reset of a primary context) gives back everything made in it.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use cuda_abi::*;
use cuslice_policy::overhead::{self, Found};

use crate::membership::{self, Charge, Slice};
use crate::nvml_query;
use crate::real;

/// Creates a context on device `cudev` with `make`, charging its hidden memory.
fn create(cudev: CUdevice, out: *mut CUcontext, make: impl FnOnce() -> CUresult) -> CUresult {
    let s = match membership::active() {
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
        smaller_than_a_context(s, dev, estimate);
        return e;
    }
    // A context takes device memory too: beside a thaw under way, it waits as an allocation
    // does, and is measured from the moment it goes.
    let (mut before, mut procs_before, mut own0) = (None, None, 0);
    let mut make = Some(make);
    let r = crate::wants::take_room(&s.config, dev, estimate, true, &mut || {
        before = first.then(|| nvml_query::device_used(&uuid)).flatten();
        procs_before = first.then(|| nvml_query::process_memory(&uuid)).flatten();
        own0 = s.own_charged(dev);
        make.take()
            .map_or(CUresult::CUDA_ERROR_UNKNOWN, |make| make())
    });
    if !r.is_ok() {
        s.release(dev, estimate);
        return r;
    }
    // SAFETY: written by the driver on success.
    let ctx = unsafe { *out } as usize;
    if membership::local(|l| l.contexts.contains_key(&ctx)) {
        // Another thread made (and was charged for) this primary context first.
        s.release(dev, estimate);
        return r;
    }
    let charge = match (first, before) {
        (true, Some(used0)) => {
            let measured = measure(s, dev, &uuid, used0, procs_before.as_deref(), own0);
            s.ledger.set_context_overhead(index, measured);
            measured
        }
        _ => estimate,
    };
    if let Err(e) = s.settle(dev, estimate, charge) {
        smaller_than_a_context(s, dev, charge);
        if let Some(f) = real::cuCtxDestroy_v2() {
            // SAFETY: destroys the context just made, which the caller has not seen.
            unsafe { f(ctx as CUcontext) };
        }
        return e;
    }
    drop(measuring);
    crate::log::debug!("context on device {dev}: {charge} bytes of overhead");
    membership::local(|l| {
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

/// Where a context was refused because the cap cannot hold even one (`context` bytes, what one
/// takes on device `dev`), says so in one line with the context's size and a cap that would
/// do: the refusal (CUDA_ERROR_OUT_OF_MEMORY from creating a context) says nothing of it.
fn smaller_than_a_context(s: &Slice, dev: usize, context: u64) {
    let Some((Some(cap), _)) = s.cap_and_used(dev) else {
        return;
    };
    if context <= cap {
        return;
    }
    const GIB: u64 = 1 << 30;
    // Room for the context and at least half a GiB of the application's own, in whole GiB.
    let enough = (context + GIB / 2).div_ceil(GIB) * GIB;
    let setting = s
        .config
        .memory_setting(dev as u32)
        .map_or_else(|| "the memory cap".to_string(), |v| v.to_string());
    let name = setting
        .split_once('=')
        .map_or("CUSLICE_MEMORY_LIMIT", |(n, _)| n);
    crate::log::error!(
        "{setting} ({}) is smaller than one CUDA context on device {dev} ({}, what the slice's \
         first context there took); no context fits, so CUDA calls fail with \
         CUDA_ERROR_OUT_OF_MEMORY; write e.g. {name}={} (a cap covers the slice's contexts too)",
        cuslice_policy::format_size(cap),
        cuslice_policy::format_size(context),
        cuslice_policy::format_size(enough).replace(' ', "")
    );
}

/// How long a measurement that could not tell this process's entry goes on taking process lists,
/// and how far apart: a neighbour that allocates or frees shows in one of them, this process
/// holds still (it has no other context on the device, and its own later contexts wait for the
/// measurement).
const NARROW_FOR: std::time::Duration = std::time::Duration::from_millis(500);
const NARROW_EVERY: std::time::Duration = std::time::Duration::from_millis(2);

/// What the slice's first context on device `dev` (just made) takes: this process's own figure
/// in NVML's process list, where it can be told; else the device's rise since `used0` (module
/// header). Less what this process charged on the device since `own0`.
fn measure(
    s: &Slice,
    dev: usize,
    uuid: &[u8; 16],
    used0: u64,
    was: Option<&[(u32, u64)]>,
    own0: u64,
) -> u64 {
    let used1 = nvml_query::device_used(uuid).unwrap_or(used0);
    let now = nvml_query::process_memory(uuid);
    let found = match (was, now.as_deref()) {
        (Some(was), Some(now)) => overhead::identify(was, now, nvml_pid(s), std::process::id()),
        _ => Found::Unlisted,
    };
    let mut lists = 0;
    let (bytes, how) = match found {
        Found::Own(b) => (b, "this process's entry in NVML's process list"),
        Found::Unlisted => (
            used1.saturating_sub(used0),
            "the device's rise (NVML lists no figure for this process)",
        ),
        Found::Among(mut among) => {
            let until = std::time::Instant::now() + NARROW_FOR;
            let mut own = None;
            while overhead::settled(&among).is_none() && std::time::Instant::now() < until {
                std::thread::sleep(NARROW_EVERY);
                let Some(later) = nvml_query::process_memory(uuid) else {
                    break;
                };
                lists += 1;
                // The node agent may have told this process its host pid meanwhile (it does so
                // when the process joins its slice): then its own entry says.
                if let (Some(was), Some(pid)) = (was, nvml_pid(s))
                    && let Found::Own(b) =
                        overhead::identify(was, &later, Some(pid), std::process::id())
                {
                    own = Some(b);
                    break;
                }
                among = overhead::narrow(among, &later);
            }
            match (own, overhead::settled(&among)) {
                (Some(b), _) => (
                    b,
                    "this process's entry in NVML's process list, once its host pid was known",
                ),
                (None, Some(b)) => (
                    b,
                    "the one figure in NVML's process list that could be this process",
                ),
                (None, None) => {
                    crate::log::info!(
                        "context on device {dev}: {} entries of NVML's process list could be this \
                         process's after {lists} more lists; charged the largest",
                        among.len()
                    );
                    (
                        overhead::largest(&among),
                        "the largest figure in NVML's process list that could be this process",
                    )
                }
            }
        }
    };
    let measured = bytes.saturating_sub(s.own_charged(dev).saturating_sub(own0));
    crate::log::debug!("context on device {dev} measured by {how} ({lists} more lists)");
    measured
}

/// NVML's pid for this process, where it is known: the host pid the node agent told it, else its
/// own pid in the host's pid namespace (in another, such as a container's, NVML gives pids this
/// process cannot see).
fn nvml_pid(s: &Slice) -> Option<u32> {
    match s.ledger.host_pid(s.slot) {
        Some(p) => u32::try_from(p).ok(),
        None => initial_pid_namespace().then(std::process::id),
    }
}

/// The initial pid namespace's inode number (PROC_PID_INIT_INO, include/linux/proc_ns.h).
const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;

fn initial_pid_namespace() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").is_ok_and(|m| m.ino() == PROC_PID_INIT_INO)
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

/// Before `cuCtxDestroy`: the meter's events in the context go first (`turns::forget_ctx`), and
/// the charges made in it are named while the driver can still say which they are.
fn destroying(ctx: CUcontext) {
    crate::turns::forget_ctx(ctx as usize);
    if let Ok(Some(_)) = membership::active() {
        membership::ask_contexts(ctx as usize);
    }
}

fn destroyed(ctx: CUcontext, r: CUresult) -> CUresult {
    if r.is_ok()
        && let Ok(Some(s)) = membership::active()
    {
        membership::context_gone(s, ctx as usize);
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
    destroying(ctx);
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
    destroying(ctx);
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
    let Ok(Some(s)) = membership::active() else {
        return call();
    };
    let Some(o) = s.dev_by_cudev(dev) else {
        return call();
    };
    let live = membership::local(|l| l.primary.get(&o).is_some_and(|p| p.1 > 0));
    let r = if live { call() } else { create(dev, ctx, call) };
    if r.is_ok() {
        // SAFETY: written by the driver on success.
        let c = unsafe { *ctx } as usize;
        membership::local(|l| {
            let e = l.primary.entry(o).or_insert((c, 0));
            e.0 = c;
            e.1 += 1;
        });
    }
    r
}

/// The primary context of `dev` that a release (`reset`: a reset) is about to destroy, if any.
fn primary_going(s: &Slice, dev: CUdevice, reset: bool) -> Option<usize> {
    let o = s.dev_by_cudev(dev)?;
    membership::local(|l| l.primary.get(&o).filter(|p| reset || p.1 <= 1).map(|p| p.0))
}

fn primary_released(s: &Slice, dev: CUdevice, reset: bool) {
    let Some(o) = s.dev_by_cudev(dev) else { return };
    let gone = membership::local(|l| match l.primary.get_mut(&o) {
        Some(p) if reset || p.1 <= 1 => l.primary.remove(&o).map(|p| p.0),
        Some(p) => {
            p.1 -= 1;
            None
        }
        None => None,
    });
    if let Some(ctx) = gone {
        membership::context_gone(s, ctx);
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
            let s = membership::active().ok().flatten();
            // A release that destroys the primary context (its last, or a reset): the meter's
            // events in it go first (`turns::forget_ctx`).
            if let Some(ctx) = s.and_then(|s| primary_going(s, dev, $reset)) {
                crate::turns::forget_ctx(ctx);
                membership::ask_contexts(ctx);
            }
            // SAFETY: forwarded unchanged.
            let r = unsafe { f(dev) };
            if r.is_ok()
                && let Some(s) = s
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
    let s = match membership::active() {
        Err(e) => return e,
        Ok(None) => return load(),
        Ok(Some(s)) => s,
    };
    let Some((ctx, dev)) = membership::current(s) else {
        return load();
    };
    let (free0, own0) = (free_now(), s.own_charged(dev));
    let r = load();
    if !r.is_ok() {
        return r;
    }
    let (free1, own1) = (free_now(), s.own_charged(dev));
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
    membership::local(|l| {
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
    let Ok(Some(s)) = membership::active() else {
        return unload();
    };
    let charge = membership::local(|l| l.modules.remove(&(h as usize)));
    let r = unload();
    if let Some(c) = charge {
        if r.is_ok() {
            s.release(c.dev, c.bytes);
        } else {
            membership::local(|l| l.modules.insert(h as usize, c));
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
