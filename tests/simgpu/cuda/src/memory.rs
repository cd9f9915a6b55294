//! Device memory: cuMemAlloc and friends (including the 32-bit CUDA 2.x entry points), managed
//! and host memory, copies and memsets, arrays, cuMemGetInfo, and what a context takes with it.
//! Host memory is in `host`, copies and memsets in `copies`, arrays in `arrays`.

use std::ffi::{c_uint, c_void};

use cuda_abi::{CUdevice, CUdeviceptr, CUdeviceptr_v1, CUresult};
use simgpu::layout::GRANULE;
use simgpu::{AllocId, AllocKind};

use crate::driver::*;

mod arrays;
mod copies;
mod host;

pub use arrays::*;
pub use copies::*;
pub use host::*;

/// Takes device memory for this process on `dev`, refusing with CUDA_ERROR_OUT_OF_MEMORY only
/// after dead processes' memory has been reclaimed.
pub fn take(d: &Driver, dev: u32, kind: AllocKind, size: u64) -> Res<AllocId> {
    let slot = d
        .state
        .my_slot()
        .ok_or(CUresult::CUDA_ERROR_NOT_INITIALIZED)?;
    let mut g = d.state.lock_device(dev);
    match g.dev().alloc(slot, kind, size) {
        Ok(id) => Ok(id),
        Err(_) => {
            if g.reclaim_dead().bytes > 0 {
                g.dev().alloc(slot, kind, size).map_err(|_| E_OOM)
            } else {
                Err(E_OOM)
            }
        }
    }
}

pub fn give(d: &Driver, dev: u32, id: AllocId) {
    d.state.lock_device(dev).dev().release(id);
}

/// The step in which a real driver backs a process's managed memory on a device: on an NVIDIA
/// H100 with driver 580, one 64 MiB managed allocation set to zero raised the device's used
/// memory by 128 MiB, ten of them by 640 MiB. The model holds a process's managed memory on a
/// device at its sum rounded up to the step, from allocation on (it models managed memory as
/// resident from allocation).
pub const MANAGED_STEP: u64 = 128 << 20;

/// Moves the sum of this process's managed allocations on `dev` by `by` bytes (added, taken
/// away, or 0 to back the sum again after `managed_unback`) and holds what the step adds beyond
/// it. What backed the old sum beyond it is given back first, so the device never holds both.
/// Growing, a step that does not fit is refused with CUDA_ERROR_OUT_OF_MEMORY, the sum unchanged
/// and nothing held beyond it (the caller gives back what it took, then backs the sum again).
/// Otherwise what does not fit backs less, never more than before.
fn managed_backing(d: &Driver, inner: &mut Inner, dev: u32, by: i64) -> Res {
    let (sum, held) = inner.managed.get(&dev).copied().unwrap_or((0, None));
    if let Some(old) = held {
        give(d, dev, old);
    }
    let now = sum.saturating_add_signed(by);
    let beyond = now.next_multiple_of(MANAGED_STEP) - now;
    let taken = match (beyond > 0).then(|| take(d, dev, AllocKind::Managed, beyond)) {
        None => None,
        Some(Ok(id)) => Some(id),
        Some(Err(e)) if by > 0 => {
            inner.managed.insert(dev, (sum, None));
            return Err(e);
        }
        Some(Err(_)) => None,
    };
    inner.managed.insert(dev, (now, taken));
    Ok(())
}

/// Gives back what backs this process's managed memory on `dev` beyond its sum, before a new
/// managed allocation takes its own memory: a step already held covers the allocation, and the
/// device must not hold both at once.
fn managed_unback(d: &Driver, inner: &mut Inner, dev: u32) {
    if let Some((sum, Some(old))) = inner.managed.get(&dev).copied() {
        give(d, dev, old);
        inner.managed.insert(dev, (sum, None));
    }
}

/// cuMemAlloc / cuMemAllocPitch / cuMemAllocManaged: memory owned by the current context.
fn alloc_owned(size: u64, kind: AllocKind, low32: bool) -> Res<u64> {
    if size == 0 {
        return Err(E_INVALID_VALUE);
    }
    let d = drv()?;
    let mut inner = d.inner.lock();
    inner.refuse_if_capturing()?;
    let (ctx, c) = inner.cur()?;
    let dev = c.dev;
    let len = size.next_multiple_of(GRANULE);
    let va = if low32 {
        inner.va32.take(len, GRANULE)?
    } else {
        inner.va.take(len, GRANULE)?
    };
    if kind == AllocKind::Managed {
        managed_unback(d, &mut inner, dev);
    }
    let id = match take(d, dev, kind, size) {
        Ok(id) => id,
        Err(e) => {
            if kind == AllocKind::Managed {
                let _ = managed_backing(d, &mut inner, dev, 0);
            }
            if low32 {
                inner.va32.give(va, len)
            } else {
                inner.va.give(va, len)
            }
            return Err(e);
        }
    };
    let mut m = Mapping {
        len,
        dev,
        ctx,
        id: Some(id),
        offset: 0,
        kind: MapKind::Owned,
        size,
        host_mapped: false,
        handle: 0,
    };
    if kind == AllocKind::Managed {
        // A call that fails leaves nothing held: not the memory, not the step's backing.
        let backed = managed_backing(d, &mut inner, dev, len as i64);
        let mapped = backed.and_then(|()| map_host(d, &m, va));
        if let Err(e) = mapped {
            give(d, dev, id);
            // Back to the sum before: less this allocation if it was counted, else as it was.
            let undo = if backed.is_ok() { -(len as i64) } else { 0 };
            let _ = managed_backing(d, &mut inner, dev, undo);
            if low32 {
                inner.va32.give(va, len)
            } else {
                inner.va.give(va, len)
            }
            return Err(e);
        }
        m.host_mapped = true;
    }
    inner.maps.insert(va, m);
    Ok(va)
}

/// Maps the granules of a managed allocation at its device address, so the host can use the
/// pointer directly (unified memory).
fn map_host(d: &Driver, m: &Mapping, va: u64) -> Res {
    let Some(id) = m.id else {
        return Err(E_INVALID_VALUE);
    };
    let granules = d
        .state
        .lock_device(m.dev)
        .dev()
        .granules_of(id)
        .ok_or(E_INVALID_VALUE)?;
    let data_off = d.state.device_info(m.dev).data_off;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.state.data_fd_path())
        .map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)?;
    for (i, g) in granules.iter().enumerate() {
        use std::os::fd::AsRawFd;
        // SAFETY: MAP_FIXED over our own PROT_NONE reservation at an address we handed out for
        // this allocation; nothing else lives there.
        let p = unsafe {
            libc::mmap(
                (va + i as u64 * GRANULE) as *mut c_void,
                GRANULE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_raw_fd(),
                (data_off + *g as u64 * GRANULE) as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CUresult::CUDA_ERROR_UNKNOWN);
        }
    }
    Ok(())
}

/// Puts the PROT_NONE reservation back over `[va, va + len)`, a range of the device address
/// space where host memory was mapped (managed memory, or a host-located VMM handle), so that
/// the addresses stay reserved.
pub fn unmap_host(va: u64, len: u64) {
    // SAFETY: restores our PROT_NONE reservation over a range of the device address space we
    // mapped host memory at (`map_host`, `alloc_host_resident`, `vmm::cuMemMap`).
    unsafe {
        libc::mmap(
            va as *mut c_void,
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        );
    }
}

/// Removes a mapping this process owns and releases what is behind it.
pub fn drop_mapping(d: &Driver, inner: &mut Inner, va: u64) {
    let Some(m) = inner.maps.remove(&va) else {
        return;
    };
    if m.host_mapped {
        unmap_host(va, m.len);
    }
    if let (MapKind::Owned, Some(id)) = (m.kind, m.id) {
        give(d, m.dev, id);
        if m.host_mapped {
            // Managed: what backs the rest shrinks with it.
            let _ = managed_backing(d, inner, m.dev, -(m.len as i64));
        }
    }
    if inner.va32.contains(va) {
        inner.va32.give(va, m.len)
    } else {
        inner.va.give(va, m.len)
    }
}

fn free_owned(ptr: u64) -> Res {
    let d = drv()?;
    let mut inner = d.inner.lock();
    if ptr == 0 {
        return Ok(());
    }
    if inner
        .maps
        .get(&ptr)
        .is_some_and(|m| m.kind == MapKind::Owned)
    {
        drop_mapping(d, &mut inner, ptr);
        Ok(())
    } else if crate::pool::free_block(d, &mut inner, ptr) {
        Ok(())
    } else {
        Err(E_INVALID_VALUE)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    if dptr.is_null() {
        return E_INVALID_VALUE;
    }
    // SAFETY: checked non-NULL; the caller provides a CUdeviceptr.
    status(alloc_owned(size as u64, AllocKind::Mem, false).map(|va| unsafe { dptr.write(va) }))
}

/// CUDA 2.x ABI: 32-bit size and pointer (served from a low address window).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut CUdeviceptr_v1, size: c_uint) -> CUresult {
    if dptr.is_null() {
        return E_INVALID_VALUE;
    }
    status(alloc_owned(size as u64, AllocKind::Mem, true).map(|va| {
        // SAFETY: checked non-NULL; the caller provides a 32-bit CUdeviceptr.
        unsafe { dptr.write(va as u32) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    status(free_owned(dptr))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree(dptr: CUdeviceptr_v1) -> CUresult {
    status(free_owned(dptr as u64))
}

/// cuMemAllocPitch: rows padded to 512 bytes; returns (address, pitch).
fn alloc_pitch(width: u64, height: u64, elem: u32, low32: bool) -> Res<(u64, u64)> {
    if width == 0 || height == 0 || ![4, 8, 16].contains(&elem) {
        return Err(E_INVALID_VALUE);
    }
    let pitch = width.next_multiple_of(512);
    Ok((alloc_owned(pitch * height, AllocKind::Pitch, low32)?, pitch))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    if dptr.is_null() || pitch.is_null() {
        return E_INVALID_VALUE;
    }
    status(
        alloc_pitch(width as u64, height as u64, elem, false).map(|(va, p)| {
            // SAFETY: both checked non-NULL.
            unsafe {
                dptr.write(va);
                pitch.write(p as usize);
            }
        }),
    )
}

/// CUDA 2.x ABI: 32-bit sizes and pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch(
    dptr: *mut CUdeviceptr_v1,
    pitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    elem: c_uint,
) -> CUresult {
    if dptr.is_null() || pitch.is_null() {
        return E_INVALID_VALUE;
    }
    status(
        alloc_pitch(width as u64, height as u64, elem, true).map(|(va, p)| {
            // SAFETY: both checked non-NULL.
            unsafe {
                dptr.write(va as u32);
                pitch.write(p as u32);
            }
        }),
    )
}

/// Managed memory attached globally (`CU_MEM_ATTACH_GLOBAL`) is modelled as resident on the
/// device from allocation (it counts in full, and the process's managed memory on the device is
/// backed in steps: `MANAGED_STEP`) and mapped for the host at the same address. Managed memory
/// attached to the host (`CU_MEM_ATTACH_HOST`) is modelled as resident in host memory: it is
/// the process's own memory at that address and counts as none of the device's, whatever advice
/// it is given later (see `cuMemAdvise`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: c_uint,
) -> CUresult {
    if dptr.is_null()
        || !(flags == cuda_abi::CU_MEM_ATTACH_GLOBAL || flags == cuda_abi::CU_MEM_ATTACH_HOST)
    {
        return E_INVALID_VALUE;
    }
    let made = if flags == cuda_abi::CU_MEM_ATTACH_HOST {
        alloc_host_resident(size as u64)
    } else {
        alloc_owned(size as u64, AllocKind::Managed, false)
    };
    // SAFETY: checked non-NULL.
    status(made.map(|va| unsafe { dptr.write(va) }))
}

/// Managed memory resident on the host: an address in the device range, backed by fresh memory
/// of this process (zero, as the driver's), with no device memory behind it.
fn alloc_host_resident(size: u64) -> Res<u64> {
    if size == 0 {
        return Err(E_INVALID_VALUE);
    }
    let d = drv()?;
    let mut inner = d.inner.lock();
    inner.refuse_if_capturing()?;
    let (ctx, c) = inner.cur()?;
    let dev = c.dev;
    let len = size.next_multiple_of(GRANULE);
    let va = inner.va.take(len, GRANULE)?;
    // SAFETY: MAP_FIXED over our own PROT_NONE reservation at an address just handed out for
    // this allocation; nothing else lives there.
    let p = unsafe {
        libc::mmap(
            va as *mut c_void,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        inner.va.give(va, len);
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    inner.maps.insert(
        va,
        Mapping {
            len,
            dev,
            ctx,
            id: None,
            offset: 0,
            kind: MapKind::Owned,
            size,
            host_mapped: true,
            handle: 0,
        },
    );
    Ok(va)
}

/// Whether `len` bytes at `va` lie in host memory mapped in the device address space, and
/// where the driver reaches them: managed memory resident on the host (the address itself) or
/// a host-located VMM handle (the driver's own view of it, which works whatever access the CPU
/// was given at the address).
fn host_resident(inner: &Inner, va: u64, len: u64) -> Option<Res<*mut u8>> {
    let (start, m) = inner.find(va)?;
    if !m.on_host() {
        return None;
    }
    if va.checked_add(len).is_none_or(|end| end > start + m.len) {
        return Some(Err(E_INVALID_VALUE));
    }
    if m.kind == MapKind::Vmm {
        return Some(crate::vmm::host_bytes(inner, start, &m, va).ok_or(E_INVALID_VALUE));
    }
    Some(Ok(va as *mut u8))
}

/// cuMemAdvise (CUDA 8.0's, the device as an ordinal or `CU_DEVICE_CPU`): checked as the driver
/// checks it (a managed range, a known advice, a device or the host) and otherwise not
/// modelled: an allocation stays where it was made (see `cuMemAllocManaged`); nothing migrates
/// on advice, on access or on prefetch.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAdvise(
    ptr: CUdeviceptr,
    count: usize,
    advice: i32,
    device: CUdevice,
) -> CUresult {
    status(advise(
        ptr,
        count as u64,
        advice,
        device == cuda_abi::CU_DEVICE_CPU,
        device,
    ))
}

/// cuMemAdvise_v2 (CUDA 12.2's, the location as a `CUmemLocation`; what CUDA 13's headers
/// call cuMemAdvise): as `cuMemAdvise`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAdvise_v2(
    ptr: CUdeviceptr,
    count: usize,
    advice: i32,
    location: cuda_abi::CUmemLocation,
) -> CUresult {
    let host = matches!(
        location.type_,
        cuda_abi::CU_MEM_LOCATION_TYPE_HOST
            | cuda_abi::CU_MEM_LOCATION_TYPE_HOST_NUMA
            | cuda_abi::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT
    );
    if !host && location.type_ != cuda_abi::CU_MEM_LOCATION_TYPE_DEVICE {
        return E_INVALID_VALUE;
    }
    status(advise(ptr, count as u64, advice, host, location.id))
}

fn advise(ptr: u64, count: u64, advice: i32, host: bool, device: CUdevice) -> Res {
    let d = drv()?;
    if !(cuda_abi::CU_MEM_ADVISE_SET_READ_MOSTLY..=cuda_abi::CU_MEM_ADVISE_UNSET_ACCESSED_BY)
        .contains(&advice)
        || count == 0
    {
        return Err(E_INVALID_VALUE);
    }
    if !host && (device < 0 || device as u32 >= d.state.ndev()) {
        return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
    }
    let inner = d.inner.lock();
    let (start, m) = inner.find(ptr).ok_or(E_INVALID_VALUE)?;
    if !m.host_mapped || ptr + count > start + m.len {
        return Err(E_INVALID_VALUE);
    }
    Ok(())
}

fn mem_info() -> Res<(u64, u64)> {
    let d = drv()?;
    let dev = d.inner.lock().cur()?.1.dev;
    let mut g = d.state.lock_device(dev);
    g.reclaim_dead();
    let dv = g.dev();
    Ok((dv.free(), dv.total()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    status(mem_info().map(|(f, t)| {
        // SAFETY: out-pointers from the caller, each NULL or writable.
        unsafe {
            put_optional(free, f as usize);
            put_optional(total, t as usize);
        }
    }))
}

/// Writes `v` through `p` unless it is NULL: cuMemGetInfo's out-pointers are each optional (the
/// driver accepts `(NULL, &total)` and `(&free, NULL)` and writes the other).
///
/// # Safety
/// `p` is NULL or valid for a write.
unsafe fn put_optional<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: non-NULL, and writable per the contract.
        unsafe { p.write(v) };
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    let clamp = |v: u64| v.min(u32::MAX as u64) as c_uint;
    status(mem_info().map(|(f, t)| {
        // SAFETY: out-pointers from the caller, each NULL or writable.
        unsafe {
            put_optional(free, clamp(f));
            put_optional(total, clamp(t));
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    status(drv().and_then(|d| {
        let inner = d.inner.lock();
        let (start, m) = inner.find(dptr).ok_or(CUresult::CUDA_ERROR_NOT_FOUND)?;
        let len = if m.kind == MapKind::Owned {
            m.size
        } else {
            m.len
        };
        // SAFETY: out-pointers from the caller; either may be NULL.
        unsafe {
            if !base.is_null() {
                base.write(start);
            }
            if !size.is_null() {
                size.write(len as usize);
            }
        }
        Ok(())
    }))
}

// ---- context teardown -------------------------------------------------------------------

/// Releases everything made in context `ctx` (it is being destroyed).
pub fn release_ctx_resources(d: &Driver, inner: &mut Inner, ctx: u64) {
    let owned: Vec<u64> = inner
        .maps
        .iter()
        .filter(|(_, m)| m.ctx == ctx && matches!(m.kind, MapKind::Owned | MapKind::Ipc))
        .map(|(va, _)| *va)
        .collect();
    for va in owned {
        drop_mapping(d, inner, va);
    }
    for mip in [false, true] {
        let reg = if mip {
            &mut inner.mipmaps
        } else {
            &mut inner.arrays
        };
        let hs: Vec<u64> = reg
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(h, _)| h)
            .collect();
        for h in hs {
            if let Some(a) = reg.remove(h) {
                give(d, a.dev, a.id);
            }
        }
    }
    crate::module::release_ctx(d, inner, ctx);
    crate::stream::release_ctx(d, inner, ctx);
    crate::graph::release_ctx(d, inner, ctx);
}
