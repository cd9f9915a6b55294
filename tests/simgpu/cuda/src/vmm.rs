//! Virtual memory management: physical handles (cuMemCreate, counted on the device only when
//! located on a device), address reservations and mappings, and POSIX-fd export/import.
//! A handle's memory is freed when it has been released and is no longer mapped.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use cuda_abi::*;
use simgpu::layout::GRANULE;
use simgpu::{AllocId, AllocKind};

use crate::driver::*;
use crate::memory::{give, take};

pub struct VmmHandle {
    /// Physical device and allocation; None for host-located memory.
    pub backing: Option<(u32, AllocId)>,
    pub size: u64,
    pub released: bool,
    pub maps: u32,
    /// Imported from another process: its memory is the exporter's.
    pub imported: bool,
    /// References taken by cuMemRetainAllocationHandle, each given back by a cuMemRelease.
    pub retains: u32,
    /// The handle types it may be exported as (`CUmemAllocationProp::requestedHandleTypes`).
    pub handle_types: u32,
}

fn finish_if_unused(d: &Driver, inner: &mut Inner, h: u64) {
    let done = inner
        .vmm
        .get(h)
        .is_some_and(|v| v.released && v.retains == 0 && v.maps == 0);
    if done
        && let Some(v) = inner.vmm.remove(h)
        && let (Some((dev, id)), false) = (v.backing, v.imported)
    {
        give(d, dev, id);
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    gran: *mut usize,
    prop: *const CUmemAllocationProp,
    option: u32,
) -> CUresult {
    status(drv().and_then(|_| {
        if prop.is_null() || option > CU_MEM_ALLOC_GRANULARITY_RECOMMENDED {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL.
        let p = unsafe { *prop };
        if p.location.type_ == CU_MEM_LOCATION_TYPE_INVALID {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: out-pointer from the caller.
        unsafe { put(gran, GRANULE as usize) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    status((|| {
        let d = drv()?;
        if handle.is_null()
            || prop.is_null()
            || flags != 0
            || size == 0
            || !(size as u64).is_multiple_of(GRANULE)
        {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL.
        let p = unsafe { *prop };
        if p.type_ != CU_MEM_ALLOCATION_TYPE_PINNED {
            return Err(E_INVALID_VALUE);
        }
        let backing = match p.location.type_ {
            CU_MEM_LOCATION_TYPE_DEVICE => {
                let dev = d.physical(p.location.id)?;
                d.inner.lock().refuse_if_capturing()?;
                Some((dev, take(d, dev, AllocKind::Vmm, size as u64)?))
            }
            CU_MEM_LOCATION_TYPE_HOST
            | CU_MEM_LOCATION_TYPE_HOST_NUMA
            | CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => None,
            _ => return Err(E_INVALID_VALUE),
        };
        let h = d.inner.lock().vmm.insert(VmmHandle {
            backing,
            size: size as u64,
            released: false,
            maps: 0,
            imported: false,
            retains: 0,
            handle_types: p.requestedHandleTypes,
        });
        // SAFETY: checked non-NULL.
        unsafe { handle.write(h) };
        Ok(())
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    status(drv().and_then(|d| {
        let mut inner = d.inner.lock();
        let v = inner
            .vmm
            .get_mut(handle)
            .filter(|v| !v.released || v.retains > 0)
            .ok_or(E_INVALID_VALUE)?;
        if v.retains > 0 {
            v.retains -= 1;
        } else {
            v.released = true;
        }
        finish_if_unused(d, &mut inner, handle);
        Ok(())
    }))
}

/// The handle of the VMM mapping that covers `addr` (any address inside it), with one more
/// reference, which a cuMemRelease gives back. An address no cuMemMap covers:
/// CUDA_ERROR_INVALID_VALUE.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    status(drv().and_then(|d| {
        if handle.is_null() {
            return Err(E_INVALID_VALUE);
        }
        let addr = addr as u64;
        let mut inner = d.inner.lock();
        let h = inner
            .maps
            .range(..=addr)
            .next_back()
            .filter(|(s, m)| m.kind == MapKind::Vmm && addr < *s + m.len)
            .map(|(_, m)| m.handle)
            .ok_or(E_INVALID_VALUE)?;
        let v = inner.vmm.get_mut(h).ok_or(E_INVALID_VALUE)?;
        v.retains += 1;
        // SAFETY: checked non-NULL.
        unsafe { handle.write(h) };
        Ok(())
    }))
}

/// The properties a handle was made with: pinned memory on the device (its ordinal in this
/// process) or on the host, and the handle types it may be exported as.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut CUmemAllocationProp,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    status(drv().and_then(|d| {
        if prop.is_null() {
            return Err(E_INVALID_VALUE);
        }
        let inner = d.inner.lock();
        let v = inner
            .vmm
            .get(handle)
            .filter(|v| !v.released || v.retains > 0)
            .ok_or(E_INVALID_VALUE)?;
        let location = match v.backing {
            Some((dev, _)) => CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: d
                    .visible
                    .iter()
                    .position(|&p| p == dev)
                    .map_or(-1, |o| o as i32),
            },
            None => CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_HOST,
                id: 0,
            },
        };
        let out = CUmemAllocationProp {
            type_: CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: v.handle_types,
            location,
            win32HandleMetaData: std::ptr::null_mut(),
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        };
        // SAFETY: checked non-NULL.
        unsafe { prop.write(out) };
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    align: usize,
    addr: CUdeviceptr,
    _flags: u64,
) -> CUresult {
    status(drv().and_then(|d| {
        if ptr.is_null() || size == 0 || !(size as u64).is_multiple_of(GRANULE) {
            return Err(E_INVALID_VALUE);
        }
        let mut inner = d.inner.lock();
        let va = match (addr != 0)
            .then(|| inner.va.take_at(addr, size as u64))
            .flatten()
        {
            Some(va) => va,
            None => inner.va.take(size as u64, align as u64)?,
        };
        inner.reserved.insert(va, size as u64);
        // SAFETY: checked non-NULL.
        unsafe { ptr.write(va) };
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    status(drv().and_then(|d| {
        let mut inner = d.inner.lock();
        if inner.reserved.get(&ptr) != Some(&(size as u64))
            || inner.maps.range(ptr..ptr + size as u64).next().is_some()
        {
            return Err(E_INVALID_VALUE);
        }
        inner.reserved.remove(&ptr);
        inner.va.give(ptr, size as u64);
        Ok(())
    }))
}

fn in_reservation(inner: &Inner, ptr: u64, size: u64) -> bool {
    inner
        .reserved
        .range(..=ptr)
        .next_back()
        .is_some_and(|(s, l)| ptr + size <= s + l)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    status(drv().and_then(|d| {
        let (size, offset) = (size as u64, offset as u64);
        let mut inner = d.inner.lock();
        if flags != 0 || size == 0 || size % GRANULE != 0 || !in_reservation(&inner, ptr, size) {
            return Err(E_INVALID_VALUE);
        }
        if inner
            .maps
            .range(..ptr + size)
            .next_back()
            .is_some_and(|(s, m)| s + m.len > ptr)
        {
            return Err(E_INVALID_VALUE);
        }
        let v = inner
            .vmm
            .get_mut(handle)
            .filter(|v| !v.released)
            .ok_or(E_INVALID_HANDLE)?;
        if offset + size > v.size {
            return Err(E_INVALID_VALUE);
        }
        v.maps += 1;
        let (dev, id) = match v.backing {
            Some((dev, id)) => (dev, Some(id)),
            None => (u32::MAX, None),
        };
        inner.maps.insert(
            ptr,
            Mapping {
                len: size,
                dev,
                ctx: 0,
                id,
                offset,
                kind: MapKind::Vmm,
                size,
                host_mapped: false,
                handle,
            },
        );
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    status(drv().and_then(|d| {
        let mut inner = d.inner.lock();
        let inside: Vec<u64> = inner
            .maps
            .range(ptr..ptr + size as u64)
            .filter(|(_, m)| m.kind == MapKind::Vmm)
            .map(|(s, _)| *s)
            .collect();
        if inside.is_empty() {
            return Err(E_INVALID_VALUE);
        }
        for s in inside {
            if let Some(m) = inner.maps.remove(&s) {
                if let Some(v) = inner.vmm.get_mut(m.handle) {
                    v.maps -= 1;
                }
                finish_if_unused(d, &mut inner, m.handle);
            }
        }
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    status(drv().and_then(|d| {
        if desc.is_null() || count == 0 {
            return Err(E_INVALID_VALUE);
        }
        let inner = d.inner.lock();
        let mapped: u64 = inner
            .maps
            .range(ptr..ptr + size as u64)
            .map(|(_, m)| m.len)
            .sum();
        if mapped != size as u64 {
            return Err(E_INVALID_VALUE);
        }
        Ok(())
    }))
}

/// What an exported fd carries: enough to find the allocation on the same simulated machine.
#[repr(C)]
#[derive(Clone, Copy)]
struct Exported {
    magic: u64,
    machine: u64,
    dev: u32,
    head: u32,
    generation: u32,
    _pad: u32,
    size: u64,
}

const EXPORT_MAGIC: u64 = 0x5349_4d47_5055_4644; // "SIMGPUFD"

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    out: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    kind: u32,
    _flags: u64,
) -> CUresult {
    status(drv().and_then(|d| {
        if out.is_null() {
            return Err(E_INVALID_VALUE);
        }
        if kind != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        let inner = d.inner.lock();
        let v = inner.vmm.get(handle).ok_or(E_INVALID_HANDLE)?;
        let (dev, id) = v.backing.ok_or(CUresult::CUDA_ERROR_NOT_SUPPORTED)?;
        let rec = Exported {
            magic: EXPORT_MAGIC,
            machine: d.state.header().machine_id,
            dev,
            head: id.head,
            generation: id.generation,
            _pad: 0,
            size: v.size,
        };
        // SAFETY: creating an anonymous memory file; the name is a valid C string.
        let fd = unsafe { libc::memfd_create(c"simgpu-export".as_ptr(), 0) };
        if fd < 0 {
            return Err(CUresult::CUDA_ERROR_UNKNOWN);
        }
        // SAFETY: writing our plain record into the fd we just made.
        let n = unsafe {
            libc::write(
                fd,
                &rec as *const Exported as *const c_void,
                std::mem::size_of::<Exported>(),
            )
        };
        if n != std::mem::size_of::<Exported>() as isize {
            // SAFETY: closing the fd we made.
            unsafe { libc::close(fd) };
            return Err(CUresult::CUDA_ERROR_UNKNOWN);
        }
        // SAFETY: for POSIX fds the shareable handle is an int (cuda.h).
        unsafe { (out as *mut c_int).write(fd) };
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    kind: u32,
) -> CUresult {
    status(drv().and_then(|d| {
        if handle.is_null() {
            return Err(E_INVALID_VALUE);
        }
        if kind != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        let fd = os_handle as usize as c_int;
        // SAFETY: dup of the caller's fd, owned by us from here on; the caller keeps theirs.
        let dup = unsafe { libc::dup(fd) };
        if dup < 0 {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: `dup` is a fresh fd we own.
        let owned = unsafe { OwnedFd::from_raw_fd(dup) };
        let mut rec = std::mem::MaybeUninit::<Exported>::zeroed();
        // SAFETY: reading at most size_of::<Exported>() bytes into the record.
        let n = unsafe {
            libc::pread(
                owned.as_raw_fd(),
                rec.as_mut_ptr() as *mut c_void,
                std::mem::size_of::<Exported>(),
                0,
            )
        };
        // SAFETY: zero-initialised and plain data, whatever was read.
        let rec = unsafe { rec.assume_init() };
        if n != std::mem::size_of::<Exported>() as isize
            || rec.magic != EXPORT_MAGIC
            || rec.machine != d.state.header().machine_id
            || rec.dev >= d.state.ndev()
        {
            return Err(E_INVALID_VALUE);
        }
        let id = AllocId {
            head: rec.head,
            generation: rec.generation,
        };
        if d.state.lock_device(rec.dev).dev().record(id).is_none() {
            return Err(E_INVALID_VALUE);
        }
        let h = d.inner.lock().vmm.insert(VmmHandle {
            backing: Some((rec.dev, id)),
            size: rec.size,
            released: false,
            maps: 0,
            imported: true,
            retains: 0,
            handle_types: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        });
        // SAFETY: checked non-NULL.
        unsafe { handle.write(h) };
        Ok(())
    }))
}
