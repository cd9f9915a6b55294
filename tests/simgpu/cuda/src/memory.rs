//! Device memory: cuMemAlloc and friends (including the 32-bit CUDA 2.x entry points), managed
//! and host memory, copies and memsets, arrays, cuMemGetInfo, and what a context takes with it.

use std::ffi::{c_uint, c_void};

use cuda_abi::{
    CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY_MEMORY_REQUIREMENTS, CUDA_ARRAY3D_DESCRIPTOR, CUarray,
    CUdevice, CUdeviceptr, CUdeviceptr_v1, CUmipmappedArray, CUresult, CUstream, array_format,
};
use simgpu::layout::GRANULE;
use simgpu::{AllocId, AllocKind};

use crate::driver::*;
use crate::handles::{from_ptr, to_ptr};

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

fn unmap_host(va: u64, len: u64) {
    // SAFETY: restores our PROT_NONE reservation over a range we mapped in `map_host`.
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

/// Whether `len` bytes at `va` lie in managed memory resident on the host (where the host
/// pointer is the address itself).
fn host_resident(inner: &Inner, va: u64, len: u64) -> Option<Res<*mut u8>> {
    let (start, m) = inner.find(va)?;
    if !(m.host_mapped && m.id.is_none()) {
        return None;
    }
    if va + len > start + m.len {
        return Some(Err(E_INVALID_VALUE));
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

// ---- host memory ------------------------------------------------------------------------

fn host_alloc(pp: *mut *mut c_void, size: usize) -> Res {
    if pp.is_null() || size == 0 {
        return Err(E_INVALID_VALUE);
    }
    let d = drv()?;
    let mut inner = d.inner.lock();
    inner.cur()?;
    // SAFETY: plain allocation; checked for NULL.
    let p = unsafe { libc::calloc(1, size) };
    if p.is_null() {
        return Err(E_OOM);
    }
    inner.host.insert(p as u64, (size, true));
    // SAFETY: checked non-NULL.
    unsafe { pp.write(p) };
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    status(host_alloc(pp, size))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost(pp: *mut *mut c_void, size: c_uint) -> CUresult {
    status(host_alloc(pp, size as usize))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    size: usize,
    _flags: c_uint,
) -> CUresult {
    status(host_alloc(pp, size))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    status(
        drv().and_then(|d| match d.inner.lock().host.remove(&(p as u64)) {
            Some((_, true)) => {
                // SAFETY: allocated with calloc in `host_alloc`.
                unsafe { libc::free(p) };
                Ok(())
            }
            _ => Err(E_INVALID_VALUE),
        }),
    )
}

fn host_register(p: *mut c_void, size: usize) -> Res {
    if p.is_null() || size == 0 {
        return Err(E_INVALID_VALUE);
    }
    let d = drv()?;
    let mut inner = d.inner.lock();
    inner.cur()?;
    if inner.host.contains_key(&(p as u64)) {
        return Err(CUresult(712)); // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
    }
    inner.host.insert(p as u64, (size, false));
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    size: usize,
    _flags: c_uint,
) -> CUresult {
    status(host_register(p, size))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostRegister(
    p: *mut c_void,
    size: usize,
    _flags: c_uint,
) -> CUresult {
    status(host_register(p, size))
}

/// The device's address of page-locked host memory (allocated by the driver or registered with
/// it): with unified addressing, the host address itself. Any address inside such a range.
fn host_device_pointer(out: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) -> Res {
    if out.is_null() || flags != 0 {
        return Err(E_INVALID_VALUE);
    }
    let d = drv()?;
    let inner = d.inner.lock();
    inner.cur()?;
    let a = p as u64;
    if !inner
        .host
        .iter()
        .any(|(&s, &(len, _))| a >= s && a < s + len as u64)
    {
        return Err(E_INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { out.write(a) };
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    out: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    status(host_device_pointer(out, p, flags))
}

/// The same under the name `cuda.h` maps it to before the `_v2` ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer(
    out: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on.
    unsafe { cuMemHostGetDevicePointer_v2(out, p, flags) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    status(drv().and_then(|d| {
        let mut inner = d.inner.lock();
        match inner.host.get(&(p as u64)) {
            Some((_, false)) => {
                inner.host.remove(&(p as u64));
                Ok(())
            }
            _ => Err(CUresult(713)), // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        }
    }))
}

// ---- copies -----------------------------------------------------------------------------

/// Where `len` bytes of device memory at `va` live in the contents file: (file offset, length).
fn segments(d: &Driver, inner: &Inner, va: u64, len: u64) -> Res<Vec<(u64, u64)>> {
    let (start, m) = inner.find(va).ok_or(E_INVALID_VALUE)?;
    if va + len > start + m.len {
        return Err(E_INVALID_VALUE);
    }
    let id = m.id.ok_or(E_INVALID_VALUE)?;
    let granules = d
        .state
        .lock_device(m.dev)
        .dev()
        .granules_of(id)
        .ok_or(E_INVALID_VALUE)?;
    let data_off = d.state.device_info(m.dev).data_off;
    let mut out = Vec::new();
    let mut pos = m.offset + (va - start);
    let end = pos + len;
    while pos < end {
        let g = *granules
            .get((pos / GRANULE) as usize)
            .ok_or(E_INVALID_VALUE)?;
        let within = pos % GRANULE;
        let n = (GRANULE - within).min(end - pos);
        out.push((data_off + g as u64 * GRANULE + within, n));
        pos += n;
    }
    Ok(out)
}

enum Side {
    Host(*mut u8),
    Device(Vec<(u64, u64)>),
}

fn side(d: &Driver, inner: &Inner, p: u64, len: u64) -> Res<Side> {
    if let Some(host) = host_resident(inner, p, len) {
        Ok(Side::Host(host?))
    } else if inner.va.contains(p) || inner.va32.contains(p) {
        Ok(Side::Device(segments(d, inner, p, len)?))
    } else if p == 0 {
        Err(E_INVALID_VALUE)
    } else {
        Ok(Side::Host(p as *mut u8))
    }
}

/// Copies `len` bytes between any mix of host and device memory.
pub fn copy(dst: u64, src: u64, len: u64) -> Res {
    let d = drv()?;
    if len == 0 {
        return Ok(());
    }
    let (ds, ss) = {
        let inner = d.inner.lock();
        (side(d, &inner, dst, len)?, side(d, &inner, src, len)?)
    };
    let data = d.state.data().map_err(|e| {
        eprintln!("simgpu: {e}");
        CUresult::CUDA_ERROR_UNKNOWN
    })?;
    let flatten = |s: Side| -> Vec<(*mut u8, u64)> {
        match s {
            Side::Host(p) => vec![(p, len)],
            // Segments lie inside the contents file, which is mapped whole.
            Side::Device(segs) => segs
                .into_iter()
                .map(|(off, n)| (data.base.wrapping_add(off as usize), n))
                .collect(),
        }
    };
    let (mut dv, mut sv) = (flatten(ds).into_iter(), flatten(ss).into_iter());
    let (mut dcur, mut scur) = (dv.next(), sv.next());
    while let (Some((dp, dn)), Some((sp, sn))) = (dcur, scur) {
        let n = dn.min(sn);
        // SAFETY: host ranges are the caller's buffers of `len` bytes (the API contract);
        // device ranges were bounds-checked against their allocation. `copy` tolerates overlap.
        unsafe { std::ptr::copy(sp, dp, n as usize) };
        dcur = if dn > n {
            Some((dp.wrapping_add(n as usize), dn - n))
        } else {
            dv.next()
        };
        scur = if sn > n {
            Some((sp.wrapping_add(n as usize), sn - n))
        } else {
            sv.next()
        };
    }
    Ok(())
}

/// Fills `count` elements of `width` bytes with `value` at device address `dst`.
pub fn fill(dst: u64, value: u32, width: u64, count: u64) -> Res {
    let d = drv()?;
    let len = width * count;
    if len == 0 {
        return Ok(());
    }
    let segs = {
        let inner = d.inner.lock();
        if let Some(host) = host_resident(&inner, dst, len) {
            let host = host?;
            let pattern = value.to_le_bytes();
            for i in 0..len as usize {
                // SAFETY: inside the host-resident allocation, bounds-checked above.
                unsafe { host.add(i).write(pattern[i % width as usize]) };
            }
            return Ok(());
        }
        segments(d, &inner, dst, len)?
    };
    let data = d.state.data().map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)?;
    if value.to_le_bytes()[..width as usize]
        .iter()
        .all(|&b| b == 0)
    {
        for (off, n) in segs {
            // SAFETY: the segment lies inside the mapped contents file.
            unsafe { zero(data.base.add(off as usize), n as usize) };
        }
        return Ok(());
    }
    let pattern: Vec<u8> = (0..len)
        .map(|i| value.to_le_bytes()[(i % width) as usize])
        .collect();
    let mut pos = 0usize;
    for (off, n) in segs {
        // SAFETY: the segment lies inside the mapped contents file; pattern has len bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                pattern.as_ptr().add(pos),
                data.base.add(off as usize),
                n as usize,
            )
        };
        pos += n as usize;
    }
    Ok(())
}

/// Sets `n` bytes at `p` (inside the contents file's shared mapping) to zero: the whole pages
/// among them by punching them out of the file (they read as zeros, and a large memset costs
/// neither time nor disk), the rest, or all where the file system cannot punch, by writing.
///
/// # Safety
/// `p..p + n` must lie inside the contents file's mapping.
unsafe fn zero(p: *mut u8, n: usize) {
    let page = 4096;
    let start = (p as usize).next_multiple_of(page);
    let end = (p as usize + n) / page * page;
    let punched = end > start && {
        // SAFETY: [start, end) lies inside the caller's range, page-aligned, in a shared file
        // mapping, whose pages read as zeros once removed.
        unsafe { libc::madvise(start as *mut c_void, end - start, libc::MADV_REMOVE) == 0 }
    };
    if punched {
        // SAFETY: both edges lie inside the caller's range.
        unsafe {
            std::ptr::write_bytes(p, 0, start - p as usize);
            std::ptr::write_bytes(end as *mut u8, 0, p as usize + n - end);
        }
    } else {
        // SAFETY: the caller's range.
        unsafe { std::ptr::write_bytes(p, 0, n) };
    }
}

macro_rules! copies {
    ($($name:ident ($($arg:ident : $ty:ty),*) => $body:expr;)*) => {
        $(
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                status($body)
            }
        )*
    };
}

fn async_ok(stream: CUstream, ptsz: bool) -> Res {
    crate::stream::check_stream(stream, ptsz)
}

copies! {
    cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => copy(dst, src, n as u64);
    cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => copy(dst, src, n as u64);
    cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => async_ok(s, false).and_then(|_| copy(dst, src, n as u64));
    cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => async_ok(s, true).and_then(|_| copy(dst, src, n as u64));
    cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) => copy(dst, src as u64, n as u64);
    cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize) => copy(dst, src as u64, n as u64);
    cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) => copy(dst as u64, src, n as u64);
    cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize) => copy(dst as u64, src, n as u64);
    cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => copy(dst, src, n as u64);
    cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => copy(dst, src, n as u64);
    cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) => async_ok(s, false).and_then(|_| copy(dst, src as u64, n as u64));
    cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) => async_ok(s, true).and_then(|_| copy(dst, src as u64, n as u64));
    cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) => async_ok(s, false).and_then(|_| copy(dst as u64, src, n as u64));
    cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) => async_ok(s, true).and_then(|_| copy(dst as u64, src, n as u64));
    cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => async_ok(s, false).and_then(|_| copy(dst, src, n as u64));
    cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => async_ok(s, true).and_then(|_| copy(dst, src, n as u64));
    cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize) => fill(dst, v as u32, 1, n as u64);
    cuMemsetD8_v2_ptds(dst: CUdeviceptr, v: u8, n: usize) => fill(dst, v as u32, 1, n as u64);
    cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) => fill(dst, v, 4, n as u64);
    cuMemsetD32_v2_ptds(dst: CUdeviceptr, v: c_uint, n: usize) => fill(dst, v, 4, n as u64);
    cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, s: CUstream) => async_ok(s, false).and_then(|_| fill(dst, v as u32, 1, n as u64));
    cuMemsetD8Async_ptsz(dst: CUdeviceptr, v: u8, n: usize, s: CUstream) => async_ok(s, true).and_then(|_| fill(dst, v as u32, 1, n as u64));
    cuMemsetD32Async(dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) => async_ok(s, false).and_then(|_| fill(dst, v, 4, n as u64));
    cuMemsetD32Async_ptsz(dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) => async_ok(s, true).and_then(|_| fill(dst, v, 4, n as u64));
    cuStreamWriteValue32(s: CUstream, dst: CUdeviceptr, v: c_uint, flags: c_uint) => write_value(s, false, dst, v, flags);
    cuStreamWriteValue32_ptsz(s: CUstream, dst: CUdeviceptr, v: c_uint, flags: c_uint) => write_value(s, true, dst, v, flags);
    cuStreamWriteValue32_v2(s: CUstream, dst: CUdeviceptr, v: c_uint, flags: c_uint) => write_value(s, false, dst, v, flags);
    cuStreamWriteValue32_v2_ptsz(s: CUstream, dst: CUdeviceptr, v: c_uint, flags: c_uint) => write_value(s, true, dst, v, flags);
}

/// `cuStreamWriteValue32`: one 32-bit word, 4-byte aligned, written (like a memset) when called.
/// Flags: `CU_STREAM_WRITE_VALUE_DEFAULT` (0) or `_NO_MEMORY_BARRIER` (1).
fn write_value(s: CUstream, ptsz: bool, dst: CUdeviceptr, v: c_uint, flags: c_uint) -> Res {
    if flags > 1 || !dst.is_multiple_of(4) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    async_ok(s, ptsz).and_then(|_| fill(dst, v, 4, 1))
}

// ---- arrays -----------------------------------------------------------------------------

pub struct ArrayObj {
    pub dev: u32,
    pub ctx: u64,
    pub id: AllocId,
    /// Bytes the array needs (cuArrayGetMemoryRequirements).
    pub size: u64,
}

/// Bytes of a (layered) array: rows padded to 512 bytes, like a pitched allocation.
fn array_bytes(w: u64, h: u64, depth: u64, format: u32, channels: u32) -> Res<u64> {
    let per = array_format::bytes_per_channel(format).ok_or(E_INVALID_VALUE)?;
    if w == 0 || ![1, 2, 4].contains(&channels) {
        return Err(E_INVALID_VALUE);
    }
    let row = (w * per * channels as u64).next_multiple_of(512);
    Ok(row * h.max(1) * depth.max(1))
}

fn make_array(size: u64, mip: bool) -> Res<u64> {
    let d = drv()?;
    let mut inner = d.inner.lock();
    inner.refuse_if_capturing()?;
    let (ctx, c) = inner.cur()?;
    let dev = c.dev;
    let id = take(d, dev, AllocKind::Array, size)?;
    let obj = ArrayObj { dev, ctx, id, size };
    Ok(if mip {
        inner.mipmaps.insert(obj)
    } else {
        inner.arrays.insert(obj)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    out: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    status((|| {
        if out.is_null() || desc.is_null() {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; the caller passes a descriptor.
        let dsc = unsafe { *desc };
        let size = array_bytes(
            dsc.Width as u64,
            dsc.Height as u64,
            1,
            dsc.Format,
            dsc.NumChannels,
        )?;
        let h = make_array(size, false)?;
        // SAFETY: checked non-NULL.
        unsafe { out.write(to_ptr(h)) };
        Ok(())
    })())
}

/// CUDA 2.x descriptor: 32-bit width and height.
#[repr(C)]
pub struct ArrayDescriptorV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub format: c_uint,
    pub channels: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate(
    out: *mut CUarray,
    desc: *const ArrayDescriptorV1,
) -> CUresult {
    status((|| {
        if out.is_null() || desc.is_null() {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; the caller passes a v1 descriptor.
        let dsc = unsafe { &*desc };
        let size = array_bytes(
            dsc.width as u64,
            dsc.height as u64,
            1,
            dsc.format,
            dsc.channels,
        )?;
        let h = make_array(size, false)?;
        // SAFETY: checked non-NULL.
        unsafe { out.write(to_ptr(h)) };
        Ok(())
    })())
}

fn array3d_bytes(dsc: &CUDA_ARRAY3D_DESCRIPTOR) -> Res<u64> {
    let cubemap = dsc.Flags & 0x04 != 0; // CUDA_ARRAY3D_CUBEMAP: six faces per layer
    let depth = if cubemap { dsc.Depth.max(6) } else { dsc.Depth } as u64;
    array_bytes(
        dsc.Width as u64,
        dsc.Height as u64,
        depth,
        dsc.Format,
        dsc.NumChannels,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    out: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    status((|| {
        if out.is_null() || desc.is_null() {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; the caller passes a descriptor.
        let size = array3d_bytes(unsafe { &*desc })?;
        let h = make_array(size, false)?;
        // SAFETY: checked non-NULL.
        unsafe { out.write(to_ptr(h)) };
        Ok(())
    })())
}

#[repr(C)]
pub struct Array3DDescriptorV1 {
    pub width: c_uint,
    pub height: c_uint,
    pub depth: c_uint,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate(
    out: *mut CUarray,
    desc: *const Array3DDescriptorV1,
) -> CUresult {
    status((|| {
        if out.is_null() || desc.is_null() {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; the caller passes a v1 descriptor.
        let v = unsafe { &*desc };
        let dsc = CUDA_ARRAY3D_DESCRIPTOR {
            Width: v.width as usize,
            Height: v.height as usize,
            Depth: v.depth as usize,
            Format: v.format,
            NumChannels: v.channels,
            Flags: v.flags,
        };
        let h = make_array(array3d_bytes(&dsc)?, false)?;
        // SAFETY: checked non-NULL.
        unsafe { out.write(to_ptr(h)) };
        Ok(())
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    out: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    status((|| {
        if out.is_null() || desc.is_null() || levels == 0 {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; the caller passes a descriptor.
        let mut dsc = unsafe { *desc };
        let mut size = 0;
        for _ in 0..levels {
            size += array3d_bytes(&dsc)?;
            dsc.Width = (dsc.Width / 2).max(1);
            dsc.Height /= 2;
            dsc.Depth /= 2;
        }
        let h = make_array(size, true)?;
        // SAFETY: checked non-NULL.
        unsafe { out.write(to_ptr(h)) };
        Ok(())
    })())
}

fn destroy_array(h: u64, mip: bool) -> Res {
    let d = drv()?;
    let mut inner = d.inner.lock();
    let obj = if mip {
        inner.mipmaps.remove(h)
    } else {
        inner.arrays.remove(h)
    }
    .ok_or(E_INVALID_HANDLE)?;
    give(d, obj.dev, obj.id);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(a: CUarray) -> CUresult {
    status(destroy_array(from_ptr(a), false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(a: CUmipmappedArray) -> CUresult {
    status(destroy_array(from_ptr(a), true))
}

fn requirements(out: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS, h: u64, mip: bool, dev: CUdevice) -> Res {
    let d = drv()?;
    let inner = d.inner.lock();
    let obj = if mip {
        inner.mipmaps.get(h)
    } else {
        inner.arrays.get(h)
    }
    .ok_or(E_INVALID_HANDLE)?;
    if d.physical(dev)? != obj.dev {
        return Err(E_INVALID_DEVICE);
    }
    // SAFETY: out-pointer from the caller.
    unsafe {
        put(
            out,
            CUDA_ARRAY_MEMORY_REQUIREMENTS {
                size: obj.size as usize,
                alignment: 512,
                reserved: [0; 4],
            },
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayGetMemoryRequirements(
    out: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS,
    a: CUarray,
    dev: CUdevice,
) -> CUresult {
    status(requirements(out, from_ptr(a), false, dev))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayGetMemoryRequirements(
    out: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS,
    a: CUmipmappedArray,
    dev: CUdevice,
) -> CUresult {
    status(requirements(out, from_ptr(a), true, dev))
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
