//! Stream-ordered allocation. A pool holds device memory in reserve beyond what its blocks use
//! (PyTorch's async backend sets the release threshold to UINT64_MAX, so freed blocks never go
//! back), and gives memory back on its own: at a stream, event or context synchronisation the
//! driver releases what a pool reserves above its release threshold (0 for a default pool, so
//! all of it once its blocks are freed). What a pool costs the slice is therefore exactly its
//! reserved memory, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, as the driver reports it, not the sum
//! of the requests.
//!
//! Each allocation reserves its rounded size in the ledger first (an upper bound on what the
//! pool grows by for it), then the pool's charge is set to what it really reserves now. After
//! every synchronising call (cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize and their
//! variants) and whenever the slice's figures are read (cuMemGetInfo, NVML memory info), every
//! pool's charge is brought to what it reserves then: down as soon as the driver has given memory
//! back, and never below what it holds. Before refusing anything, the slice trims its own pools
//! of idle memory, as the driver itself does when a device runs full. Allocations made during
//! stream capture become graph memory nodes and allocate nothing at that point: they pass through
//! uncounted.

#![allow(non_snake_case)]

use std::ffi::c_void;

use cuda_abi::*;

use crate::hooks::real;
use crate::slice::{self, PoolRec, Slice};

fn reserved_now(pool: CUmemoryPool) -> Option<u64> {
    let f = real::cuMemPoolGetAttribute()?;
    let mut v: u64 = 0;
    // SAFETY: a u64 out-value for a u64-valued attribute.
    let r = unsafe {
        f(
            pool,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            (&mut v as *mut u64).cast::<c_void>(),
        )
    };
    r.is_ok().then_some(v)
}

/// Brings the pool's charge to what it reserves now; returns the change (+ grown, - shrunk).
/// The driver is asked under the table's lock, so two threads bringing the same pool up to date
/// apply their readings in the order they were taken (a stale reading never lands last).
fn sync_pool(pool: CUmemoryPool, dev: usize) -> i128 {
    slice::local(|l| {
        let Some(now) = reserved_now(pool) else {
            return 0;
        };
        let rec = l
            .pools
            .entry(pool as usize)
            .or_insert(PoolRec { dev, charged: 0 });
        let delta = now as i128 - rec.charged as i128;
        rec.charged = now;
        delta
    })
}

/// Brings every pool this process knows to what the driver reserves for it now: what the driver
/// gave back (at a synchronisation, above the release threshold) is released to the slice, and
/// growth no allocation charged yet is charged, even past the cap (the driver holds it).
pub fn refresh(s: &Slice) {
    let pools: Vec<(usize, usize)> =
        slice::local(|l| l.pools.iter().map(|(k, p)| (*k, p.dev)).collect());
    for (p, dev) in pools {
        apply_held(s, dev, sync_pool(p as CUmemoryPool, dev));
    }
}

/// Applies a change in what a pool holds that no allocation call is settling: shrinkage is
/// released, growth (another thread's allocation, read first here) is charged as held.
fn apply_held(s: &Slice, dev: usize, delta: i128) {
    match delta {
        d if d < 0 => s.release(dev, d.unsigned_abs() as u64),
        d if d > 0 => s.charge_held(dev, d as u64),
        _ => {}
    }
}

/// After a synchronising call that succeeded: the driver may have released pool memory.
fn after_sync(r: CUresult) -> CUresult {
    if r.is_ok()
        && let Ok(Some(s)) = slice::active()
    {
        refresh(s);
    }
    r
}

macro_rules! sync_wrappers {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        /// # Safety
        /// The CUDA driver API contract of the function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            let Some(f) = real::$name() else {
                return CUresult::CUDA_ERROR_NOT_INITIALIZED;
            };
            // SAFETY: forwarded unchanged.
            after_sync(unsafe { f($($arg),*) })
        }
    )*};
}

sync_wrappers! {
    cuStreamSynchronize(stream: CUstream);
    cuStreamSynchronize_ptsz(stream: CUstream);
    cuEventSynchronize(event: CUevent);
    cuCtxSynchronize();
    cuCtxSynchronize_v2(ctx: CUcontext);
}

/// Applies a pool's change in size to the ledger, given `reserved` bytes already set aside for it.
fn settle_pool(s: &Slice, dev: usize, reserved: u64, delta: i128) -> Result<(), CUresult> {
    let grown = delta.max(0) as u64;
    s.settle(dev, reserved, grown)?;
    if delta < 0 {
        s.release(dev, (-delta) as u64);
    }
    Ok(())
}

/// The device a pool belongs to (pools are remembered when created or looked up); `fallback`
/// (the current device) for one this process has not seen.
fn pool_dev(pool: CUmemoryPool, fallback: usize) -> usize {
    slice::local(|l| l.pools.get(&(pool as usize)).map(|p| p.dev)).unwrap_or(fallback)
}

fn capturing(stream: CUstream, ptsz: bool) -> bool {
    let f = if ptsz {
        real::cuStreamIsCapturing_ptsz()
    } else {
        real::cuStreamIsCapturing()
    };
    let Some(f) = f else { return false };
    let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: valid out-pointer; `stream` is the caller's stream.
    let r = unsafe { f(stream, &mut status) };
    r.is_ok() && status != CU_STREAM_CAPTURE_STATUS_NONE
}

fn alloc_async(
    pool: Option<CUmemoryPool>,
    size: usize,
    stream: CUstream,
    ptsz: bool,
    alloc: impl FnOnce() -> CUresult,
    undo: impl FnOnce(),
) -> CUresult {
    let s = match slice::active() {
        Err(e) => return e,
        Ok(None) => return alloc(),
        Ok(Some(s)) => s,
    };
    if capturing(stream, ptsz) {
        return alloc();
    }
    let Some((_, cur)) = slice::current(s) else {
        return alloc();
    };
    let pool = match pool {
        Some(p) => p,
        None => {
            let (Some(get), Some(d)) = (real::cuDeviceGetMemPool(), s.devs().get(cur)) else {
                return alloc();
            };
            let mut p: CUmemoryPool = std::ptr::null_mut();
            // SAFETY: valid out-pointer and device handle.
            if !unsafe { get(&mut p, d.cudev) }.is_ok() {
                return alloc();
            }
            p
        }
    };
    let dev = pool_dev(pool, cur);
    let reserved = s.rounded(dev, size as u64);
    if let Err(e) = s.reserve(dev, reserved) {
        return e;
    }
    let r = alloc();
    let delta = sync_pool(pool, dev);
    if !r.is_ok() {
        let _ = settle_pool(s, dev, reserved, delta);
        return r;
    }
    if let Err(e) = settle_pool(s, dev, reserved, delta) {
        // The pool grew by more than the request and the slice has no room for the rest.
        undo();
        return e;
    }
    r
}

fn free_async(ptr: CUdeviceptr, stream: CUstream, ptsz: bool) {
    let f = if ptsz {
        real::cuMemFreeAsync_ptsz()
    } else {
        real::cuMemFreeAsync()
    };
    if let Some(f) = f {
        // SAFETY: returns the block just allocated on the same stream.
        unsafe { f(ptr, stream) };
    }
}

macro_rules! async_wrappers {
    ($($name:ident($($pool:ident)?) ptsz=$ptsz:expr;)*) => {$(
        /// # Safety
        /// The CUDA driver API contract of the function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dptr: *mut CUdeviceptr,
            size: usize,
            $($pool: CUmemoryPool,)?
            stream: CUstream,
        ) -> CUresult {
            let Some(f) = real::$name() else {
                return CUresult::CUDA_ERROR_NOT_INITIALIZED;
            };
            alloc_async(
                async_wrappers!(@pool $($pool)?),
                size,
                stream,
                $ptsz,
                // SAFETY: forwarded unchanged.
                || unsafe { f(dptr, size, $($pool,)? stream) },
                // SAFETY: the driver wrote *dptr on success.
                || free_async(unsafe { *dptr }, stream, $ptsz),
            )
        }
    )*};
    (@pool) => { None };
    (@pool $p:ident) => { Some($p) };
}

async_wrappers! {
    cuMemAllocAsync() ptsz=false;
    cuMemAllocAsync_ptsz() ptsz=true;
    cuMemAllocFromPoolAsync(pool) ptsz=false;
    cuMemAllocFromPoolAsync_ptsz(pool) ptsz=true;
}

/// Trims this process's pools on device `dev` down to what their blocks use and gives the
/// difference back to the slice (called before any refusal).
pub fn give_back_idle(s: &Slice, dev: usize) {
    let Some(trim) = real::cuMemPoolTrimTo() else {
        return;
    };
    let pools: Vec<usize> = slice::local(|l| {
        l.pools
            .iter()
            .filter(|(_, p)| p.dev == dev && p.charged > 0)
            .map(|(k, _)| *k)
            .collect()
    });
    for p in pools {
        // SAFETY: a pool handle this process obtained from the driver.
        unsafe { trim(p as CUmemoryPool, 0) };
        apply_held(s, dev, sync_pool(p as CUmemoryPool, dev));
    }
}

fn remember(pool: CUmemoryPool, cudev: CUdevice) {
    if let Ok(Some(s)) = slice::active()
        && let Some(dev) = s.dev_by_cudev(cudev)
    {
        slice::local(|l| {
            l.pools
                .entry(pool as usize)
                .or_insert(PoolRec { dev, charged: 0 });
        });
    }
}

/// # Safety
/// The CUDA driver API contract of cuMemPoolCreate.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    let Some(f) = real::cuMemPoolCreate() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(pool, props) };
    if r.is_ok() && !props.is_null() {
        // SAFETY: non-NULL, and the driver accepted it; *pool was written on success.
        let (loc, p) = unsafe { ((*props).location, *pool) };
        if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
            remember(p, loc.id);
        }
    }
    r
}

/// # Safety
/// The CUDA driver API contract of cuMemPoolDestroy.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    let Some(f) = real::cuMemPoolDestroy() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(pool) };
    if r.is_ok()
        && let Ok(Some(s)) = slice::active()
        && let Some(rec) = slice::local(|l| l.pools.remove(&(pool as usize)))
    {
        s.release(rec.dev, rec.charged);
    }
    r
}

/// # Safety
/// The CUDA driver API contract of cuMemPoolTrimTo.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult {
    let Some(f) = real::cuMemPoolTrimTo() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(pool, keep) };
    if r.is_ok()
        && let Ok(Some(s)) = slice::active()
        && let Some(dev) = slice::local(|l| l.pools.get(&(pool as usize)).map(|p| p.dev))
    {
        apply_held(s, dev, sync_pool(pool, dev));
    }
    r
}

/// # Safety
/// The CUDA driver API contract of cuDeviceGetDefaultMemPool.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    let Some(f) = real::cuDeviceGetDefaultMemPool() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(pool, dev) };
    if r.is_ok() {
        // SAFETY: written by the driver on success.
        remember(unsafe { *pool }, dev);
    }
    r
}

/// # Safety
/// The CUDA driver API contract of cuDeviceSetMemPool.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    let Some(f) = real::cuDeviceSetMemPool() else {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(dev, pool) };
    if r.is_ok() {
        remember(pool, dev);
    }
    r
}
