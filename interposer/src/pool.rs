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
//!
//! The pools' records and what brings their charges up to date are `membership`'s
//! (`sync_pool`, `refresh_pools`, `give_back_idle`): reading the slice's figures and refusing a
//! reservation need them too.

#![allow(non_snake_case)]

use cuda_abi::*;

use crate::membership::{self, PoolRec, Slice, apply_held, refresh_pools, sync_pool};
use crate::real;

/// After a synchronising call that succeeded: the driver may have released pool memory.
fn after_sync(r: CUresult) -> CUresult {
    if r.is_ok()
        && let Ok(Some(s)) = membership::active()
    {
        refresh_pools(s);
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
            // However long it waits for the device, the process is not idle (`freeze`).
            let busy = crate::gate::busy_while();
            // SAFETY: forwarded unchanged.
            let r = unsafe { f($($arg),*) };
            drop(busy);
            after_sync(r)
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
    membership::local(|l| l.pools.get(&(pool as usize)).map(|p| p.dev)).unwrap_or(fallback)
}

fn alloc_async(
    pool: Option<CUmemoryPool>,
    size: usize,
    stream: CUstream,
    ptsz: bool,
    mut alloc: impl FnMut() -> CUresult,
    undo: impl FnOnce(),
) -> CUresult {
    let s = match membership::active() {
        Err(e) => return e,
        Ok(None) => return alloc(),
        Ok(Some(s)) => s,
    };
    if crate::stream::capturing(stream, ptsz) == Some(true) {
        return alloc();
    }
    let Some((_, cur)) = membership::current(s) else {
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
    let r = crate::wants::allocate(&s.config, dev, reserved, &mut alloc);
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

fn remember(pool: CUmemoryPool, cudev: CUdevice) {
    if let Ok(Some(s)) = membership::active()
        && let Some(dev) = s.dev_by_cudev(cudev)
    {
        membership::local(|l| {
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
        && let Ok(Some(s)) = membership::active()
        && let Some(rec) = membership::local(|l| l.pools.remove(&(pool as usize)))
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
        && let Ok(Some(s)) = membership::active()
        && let Some(dev) = membership::local(|l| l.pools.get(&(pool as usize)).map(|p| p.dev))
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
