//! Stream-ordered allocation (cuMemAllocAsync) from memory pools. A pool reserves device memory
//! in chunks (whole granules, counted on the device as "pool") and hands out blocks from them;
//! freed blocks stay reserved until a synchronisation releases chunks above the pool's release
//! threshold, or cuMemPoolTrimTo. PyTorch sets the threshold to UINT64_MAX, so what a pool holds
//! on the device is its reserved memory, not the sum of live requests.

use std::collections::BTreeMap;
use std::ffi::c_void;

use cuda_abi::*;
use simgpu::layout::GRANULE;
use simgpu::{AllocId, AllocKind};

use crate::driver::*;
use crate::handles::{from_ptr, to_ptr};
use crate::memory::{give, take};
use crate::ranges::FreeRanges;
use crate::stream::{StreamRef, resolve};

const BLOCK_ALIGN: u64 = 512;

pub struct Chunk {
    pub va: u64,
    pub len: u64,
    pub id: AllocId,
    /// Free ranges inside the chunk, by offset.
    pub free: FreeRanges,
}

pub struct Pool {
    pub dev: u32,
    pub ordinal: i32,
    pub threshold: u64,
    pub chunks: Vec<Chunk>,
    /// Live blocks: address -> length.
    pub blocks: BTreeMap<u64, u64>,
    pub used_high: u64,
    pub reserved_high: u64,
    pub reuse: [i32; 3],
}

impl Pool {
    fn new(dev: u32, ordinal: i32) -> Pool {
        Pool {
            dev,
            ordinal,
            threshold: 0,
            chunks: Vec::new(),
            blocks: BTreeMap::new(),
            used_high: 0,
            reserved_high: 0,
            reuse: [1, 1, 1],
        }
    }

    pub fn reserved(&self) -> u64 {
        self.chunks.iter().map(|c| c.len).sum()
    }

    pub fn used(&self) -> u64 {
        self.blocks.values().sum()
    }

    fn carve(&mut self, size: u64) -> Option<u64> {
        let (va, _) = self
            .chunks
            .iter_mut()
            .find_map(|c| c.free.take(size, 1).map(|off| (c.va + off, ())))?;
        self.blocks.insert(va, size);
        Some(va)
    }

    fn uncarve(&mut self, va: u64) -> bool {
        let Some(size) = self.blocks.remove(&va) else {
            return false;
        };
        match self
            .chunks
            .iter_mut()
            .find(|c| va >= c.va && va < c.va + c.len)
        {
            Some(c) => {
                c.free.give(va - c.va, size);
                true
            }
            None => false,
        }
    }
}

/// The default pool of CUDA device `ordinal`, made on first use.
fn default_pool(d: &Driver, inner: &mut Inner, ordinal: i32) -> Res<u64> {
    let dev = d.physical(ordinal)?;
    let o = ordinal as usize;
    if inner.pools.get(inner.default_pool[o]).is_none() {
        inner.default_pool[o] = inner.pools.insert(Pool::new(dev, ordinal));
    }
    Ok(inner.default_pool[o])
}

fn current_pool(d: &Driver, inner: &mut Inner, ordinal: i32) -> Res<u64> {
    let o = ordinal as usize;
    match inner.current_pool.get(o) {
        Some(&h) if inner.pools.get(h).is_some() => Ok(h),
        _ => default_pool(d, inner, ordinal),
    }
}

/// Releases fully free chunks of `pool` while it reserves more than `keep`.
fn trim(
    d: &Driver,
    pool: &mut Pool,
    inner_maps: &mut BTreeMap<u64, Mapping>,
    va: &mut VaSpace,
    keep: u64,
) {
    let mut i = 0;
    while i < pool.chunks.len() && pool.reserved() > keep {
        let c = &pool.chunks[i];
        let whole = c.free.is_whole(0, c.len);
        if whole {
            let c = pool.chunks.remove(i);
            give(d, pool.dev, c.id);
            inner_maps.remove(&c.va);
            va.give(c.va, c.len);
        } else {
            i += 1;
        }
    }
}

/// At a synchronisation: every pool on `dev` gives back chunks above its release threshold.
pub fn release_to_thresholds(d: &Driver, dev: u32) {
    let mut inner = d.inner.lock();
    let inner = &mut *inner;
    for h in inner.pools.handles() {
        let Some(p) = inner.pools.get_mut(h) else {
            continue;
        };
        if p.dev == dev {
            let keep = p.threshold;
            trim(d, p, &mut inner.maps, &mut inner.va, keep);
        }
    }
}

/// Allocates from pool `ph`, growing it (and, if the device is full, first trimming every pool
/// of this process on that device) as needed.
pub fn alloc_from(d: &Driver, inner: &mut Inner, ph: u64, size: u64) -> Res<u64> {
    if size == 0 {
        return Err(E_INVALID_VALUE);
    }
    let size = size.next_multiple_of(BLOCK_ALIGN);
    let inner = &mut *inner;
    let pool = inner.pools.get_mut(ph).ok_or(E_INVALID_HANDLE)?;
    if let Some(va) = pool.carve(size) {
        pool.used_high = pool.used_high.max(pool.used());
        return Ok(va);
    }
    let (dev, chunk_len) = (pool.dev, size.next_multiple_of(GRANULE));
    let id = match take(d, dev, AllocKind::Pool, chunk_len) {
        Ok(id) => id,
        Err(_) => {
            for h in inner.pools.handles() {
                if let Some(p) = inner.pools.get_mut(h).filter(|p| p.dev == dev) {
                    trim(d, p, &mut inner.maps, &mut inner.va, 0);
                }
            }
            take(d, dev, AllocKind::Pool, chunk_len)?
        }
    };
    let va = match inner.va.take(chunk_len, GRANULE) {
        Ok(va) => va,
        Err(e) => {
            give(d, dev, id);
            return Err(e);
        }
    };
    inner.maps.insert(
        va,
        Mapping {
            len: chunk_len,
            dev,
            ctx: 0,
            id: Some(id),
            offset: 0,
            kind: MapKind::PoolChunk,
            size: chunk_len,
            host_mapped: false,
            handle: 0,
        },
    );
    let pool = inner.pools.get_mut(ph).ok_or(E_INVALID_HANDLE)?;
    pool.chunks.push(Chunk {
        va,
        len: chunk_len,
        id,
        free: FreeRanges::new(0, chunk_len),
    });
    pool.reserved_high = pool.reserved_high.max(pool.reserved());
    let va = pool.carve(size).ok_or(E_OOM)?;
    pool.used_high = pool.used_high.max(pool.used());
    Ok(va)
}

/// Returns a pool block; false if `va` is no pool block of this process.
pub fn free_block(_d: &Driver, inner: &mut Inner, va: u64) -> bool {
    for h in inner.pools.handles() {
        if let Some(p) = inner.pools.get_mut(h)
            && p.uncarve(va)
        {
            return true;
        }
    }
    false
}

fn alloc_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Option<CUmemoryPool>,
    stream: CUstream,
    ptsz: bool,
) -> Res {
    if dptr.is_null() {
        return Err(E_INVALID_VALUE);
    }
    let d = drv()?;
    let mut inner = d.inner.lock();
    let sref = resolve(&inner, stream, ptsz)?;
    let ordinal = inner.ctx(sref.ctx())?.ordinal;
    if let StreamRef::Real(sh, _) = sref
        && inner.streams.get(sh).is_some_and(|s| s.capture.is_some())
    {
        let va = crate::graph::capture_alloc(d, &mut inner, sh, size as u64)?;
        // SAFETY: checked non-NULL.
        unsafe { dptr.write(va) };
        return Ok(());
    }
    let ph = match pool {
        Some(p) => from_ptr(p),
        None => current_pool(d, &mut inner, ordinal)?,
    };
    let va = alloc_from(d, &mut inner, ph, size as u64)?;
    // SAFETY: checked non-NULL.
    unsafe { dptr.write(va) };
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    s: CUstream,
) -> CUresult {
    status(alloc_async(dptr, size, None, s, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    s: CUstream,
) -> CUresult {
    status(alloc_async(dptr, size, None, s, true))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> CUresult {
    status(alloc_async(dptr, size, Some(pool), s, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> CUresult {
    status(alloc_async(dptr, size, Some(pool), s, true))
}

fn free_async(va: CUdeviceptr, stream: CUstream, ptsz: bool) -> Res {
    let d = drv()?;
    let mut inner = d.inner.lock();
    let sref = resolve(&inner, stream, ptsz)?;
    if let StreamRef::Real(sh, _) = sref
        && inner.streams.get(sh).is_some_and(|s| s.capture.is_some())
    {
        return crate::graph::capture_free(&mut inner, sh, va);
    }
    if free_block(d, &mut inner, va) {
        return Ok(());
    }
    match inner.maps.get(&va) {
        Some(m) if m.kind == MapKind::Owned => {
            crate::memory::drop_mapping(d, &mut inner, va);
            Ok(())
        }
        _ => Err(E_INVALID_VALUE),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, s: CUstream) -> CUresult {
    status(free_async(dptr, s, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, s: CUstream) -> CUresult {
    status(free_async(dptr, s, true))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    out: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    status(drv().and_then(|d| {
        let h = default_pool(d, &mut d.inner.lock(), dev)?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(out, to_ptr(h)) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(out: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    status(drv().and_then(|d| {
        let h = current_pool(d, &mut d.inner.lock(), dev)?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(out, to_ptr(h)) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    status(drv().and_then(|d| {
        let mut inner = d.inner.lock();
        let p = inner.pools.get(from_ptr(pool)).ok_or(E_INVALID_HANDLE)?;
        if p.ordinal != dev {
            return Err(E_INVALID_DEVICE);
        }
        inner.current_pool[dev as usize] = from_ptr(pool);
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    out: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    status(drv().and_then(|d| {
        if out.is_null() || props.is_null() {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; the caller passes pool properties.
        let p = unsafe { *props };
        if p.allocType != CU_MEM_ALLOCATION_TYPE_PINNED
            || p.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
        {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        let dev = d.physical(p.location.id)?;
        let h = d.inner.lock().pools.insert(Pool::new(dev, p.location.id));
        // SAFETY: checked non-NULL.
        unsafe { out.write(to_ptr(h)) };
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    status(drv().and_then(|d| {
        let mut inner = d.inner.lock();
        let inner = &mut *inner;
        let mut p = inner.pools.remove(from_ptr(pool)).ok_or(E_INVALID_HANDLE)?;
        for c in p.chunks.drain(..) {
            give(d, p.dev, c.id);
            inner.maps.remove(&c.va);
            inner.va.give(c.va, c.len);
        }
        for o in 0..inner.default_pool.len() {
            if inner.current_pool[o] == from_ptr(pool) {
                inner.current_pool[o] = 0;
            }
        }
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult {
    status(drv().and_then(|d| {
        let mut inner = d.inner.lock();
        let inner = &mut *inner;
        let p = inner
            .pools
            .get_mut(from_ptr(pool))
            .ok_or(E_INVALID_HANDLE)?;
        trim(d, p, &mut inner.maps, &mut inner.va, keep as u64);
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    a: u32,
    value: *mut c_void,
) -> CUresult {
    status(drv().and_then(|d| {
        let inner = d.inner.lock();
        let p = inner.pools.get(from_ptr(pool)).ok_or(E_INVALID_HANDLE)?;
        let u64v = |v: u64| {
            // SAFETY: for these attributes the value is a cuuint64_t (cuda.h).
            unsafe { put(value as *mut u64, v) }
        };
        match a {
            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
                ..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                // SAFETY: for these attributes the value is an int (cuda.h).
                unsafe { put(value as *mut i32, p.reuse[(a - 1) as usize]) }
            }
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => u64v(p.threshold),
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => u64v(p.reserved()),
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => u64v(p.reserved_high),
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT => u64v(p.used()),
            CU_MEMPOOL_ATTR_USED_MEM_HIGH => u64v(p.used_high),
            _ => Err(E_INVALID_VALUE),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    a: u32,
    value: *mut c_void,
) -> CUresult {
    status(drv().and_then(|d| {
        if value.is_null() {
            return Err(E_INVALID_VALUE);
        }
        let mut inner = d.inner.lock();
        let p = inner
            .pools
            .get_mut(from_ptr(pool))
            .ok_or(E_INVALID_HANDLE)?;
        // SAFETY: non-NULL; the value's type per attribute is fixed by cuda.h.
        unsafe {
            match a {
                CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
                    ..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                    p.reuse[(a - 1) as usize] = *(value as *const i32)
                }
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.threshold = *(value as *const u64),
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH if *(value as *const u64) == 0 => {
                    p.reserved_high = p.reserved()
                }
                CU_MEMPOOL_ATTR_USED_MEM_HIGH if *(value as *const u64) == 0 => {
                    p.used_high = p.used()
                }
                _ => return Err(E_INVALID_VALUE),
            }
        }
        Ok(())
    }))
}
