//! Virtual memory management: physical handles (cuMemCreate, counted on the device only when
//! located on a device), address reservations and mappings, and POSIX-fd export/import.
//! A handle's memory is freed when it has been released and is no longer mapped.
//!
//! A host-located handle (NCCL's shared-memory buffers) is real host memory that other processes
//! can share: a memory file (`HostMem`) that cuMemMap maps into the device address space (a
//! PROT_NONE reservation of this process, `driver::VaSpace`), that the CPU reaches where
//! cuMemSetAccess grants a host location access, and that an exported descriptor hands to the
//! importer, whose mapping shows the same bytes.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use cuda_abi::*;
use simgpu::layout::GRANULE;
use simgpu::{AllocId, AllocKind};

use crate::driver::*;
use crate::memory::{give, take, unmap_host};

/// What a handle's bytes are.
pub enum Backing {
    /// Device memory: the physical device and the allocation, counted on that device.
    Device(u32, AllocId),
    /// Host memory, counted on no device.
    Host(HostMem),
}

pub struct VmmHandle {
    pub backing: Backing,
    pub size: u64,
    pub released: bool,
    pub maps: u32,
    /// Imported from another process: its device memory is the exporter's (host memory is
    /// shared by the memory file, which each importer holds open).
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
        && let (Backing::Device(dev, id), false) = (&v.backing, v.imported)
    {
        give(d, *dev, *id);
    }
    // A host handle's memory file is closed and its view unmapped as the handle drops here; the
    // memory goes with the last process that holds the file open or mapped.
}

/// Where a host handle's bytes start in its memory file: after a header (`Exported`, kind
/// host) padded to 64 KiB, the largest page size of x86-64 and arm64 Linux, so that the bytes
/// can be mapped at any offset the handle can be mapped at.
const HOST_DATA_OFFSET: u64 = 64 << 10;

/// The host memory behind a host-located handle: a sealed memory file (its size fixed) holding
/// a header and then the handle's bytes, and the driver's own view of those bytes.
pub struct HostMem {
    fd: OwnedFd,
    /// The bytes mapped read-write outside the device address space: copies and memsets use it,
    /// whatever access cuMemSetAccess gave the CPU at the mapped addresses (the device's own
    /// access to host memory, in the model).
    view: usize,
    size: u64,
    /// The location the memory was made for (a host NUMA node, or the host).
    pub location: CUmemLocation,
}

impl Drop for HostMem {
    fn drop(&mut self) {
        // SAFETY: `view` is the mapping of `size` bytes made in `HostMem::view`, unmapped once
        // here; no mapping of the device address space refers to it.
        unsafe { libc::munmap(self.view as *mut c_void, self.size as usize) };
    }
}

impl HostMem {
    /// New zeroed host memory of `size` bytes for `location`, in a memory file of its own.
    fn create(size: u64, location: CUmemLocation, machine: u64) -> Res<HostMem> {
        // SAFETY: creating an anonymous memory file; the name is a valid C string.
        let raw = unsafe {
            libc::memfd_create(
                c"simgpu-host-memory".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(E_OOM);
        }
        // SAFETY: `raw` is a fresh descriptor we own from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let header = Exported {
            magic: EXPORT_MAGIC,
            machine,
            dev: location.type_,
            head: location.id as u32,
            generation: 0,
            kind: KIND_HOST,
            size,
        };
        let len = (HOST_DATA_OFFSET + size) as libc::off_t;
        // SAFETY: sizing the file we just made; it reads as zeros and takes no memory until
        // touched.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
            return Err(E_OOM);
        }
        // SAFETY: writing our plain record at the start of the file we made.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                &header as *const Exported as *const c_void,
                std::mem::size_of::<Exported>(),
                0,
            )
        };
        // SAFETY: sealing the file's size, so that no process that shares it can shrink it
        // under another's mapping.
        let sealed = unsafe {
            libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            )
        };
        if n != std::mem::size_of::<Exported>() as isize || sealed != 0 {
            return Err(CUresult::CUDA_ERROR_UNKNOWN);
        }
        HostMem::view(fd, size, location)
    }

    /// The host memory an exported descriptor names, `header` having been read from it: the
    /// file must be sealed against shrinking and hold the header's bytes.
    fn import(fd: OwnedFd, header: &Exported) -> Res<HostMem> {
        // SAFETY: asking the seals of a descriptor we own.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
        // SAFETY: fstat of a descriptor we own into a zeroed stat.
        let statted = unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } == 0;
        // SAFETY: zero-initialised plain data, filled in by fstat when it succeeded.
        let st = unsafe { st.assume_init() };
        if seals < 0
            || seals & libc::F_SEAL_SHRINK == 0
            || !statted
            || header.size == 0
            || !header.size.is_multiple_of(GRANULE)
            || (st.st_size as u64) < HOST_DATA_OFFSET.saturating_add(header.size)
        {
            return Err(E_INVALID_VALUE);
        }
        let location = CUmemLocation {
            type_: header.dev,
            id: header.head as i32,
        };
        HostMem::view(fd, header.size, location)
    }

    /// Maps the driver's view of the bytes of `fd`.
    fn view(fd: OwnedFd, size: u64, location: CUmemLocation) -> Res<HostMem> {
        // SAFETY: a new shared mapping of the file's bytes at an address the kernel picks; it
        // overwrites nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                HOST_DATA_OFFSET as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(E_OOM);
        }
        Ok(HostMem {
            fd,
            view: p as usize,
            size,
            location,
        })
    }

    /// The driver's view of byte `offset` of the memory.
    pub fn at(&self, offset: u64) -> *mut u8 {
        (self.view as *mut u8).wrapping_add(offset as usize)
    }

    /// Maps `len` bytes from `offset` at `va`, inaccessible to the CPU until cuMemSetAccess
    /// grants a host location access. `va` must lie in the device address space.
    fn map_at(&self, va: u64, len: u64, offset: u64) -> Res {
        // SAFETY: MAP_FIXED over a range of our own PROT_NONE reservation that cuMemMap checked
        // is reserved by cuMemAddressReserve and mapped by nothing else.
        let p = unsafe {
            libc::mmap(
                va as *mut c_void,
                len as usize,
                libc::PROT_NONE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.fd.as_raw_fd(),
                (HOST_DATA_OFFSET + offset) as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(E_OOM);
        }
        Ok(())
    }

    /// A new descriptor of the memory file, for another process to import.
    fn export(&self) -> Res<c_int> {
        // SAFETY: duplicating a descriptor we own; the caller owns the copy.
        let fd = unsafe { libc::dup(self.fd.as_raw_fd()) };
        if fd < 0 {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(fd)
    }
}

/// The driver's view of host memory at `va` in `m`, a mapping of a host-located handle that
/// starts at `start`, or None if the handle is gone.
pub fn host_bytes(inner: &Inner, start: u64, m: &Mapping, va: u64) -> Option<*mut u8> {
    match &inner.vmm.get(m.handle)?.backing {
        Backing::Host(host) => Some(host.at(m.offset + (va - start))),
        Backing::Device(..) => None,
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
                Backing::Device(dev, take(d, dev, AllocKind::Vmm, size as u64)?)
            }
            CU_MEM_LOCATION_TYPE_HOST
            | CU_MEM_LOCATION_TYPE_HOST_NUMA
            | CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => Backing::Host(HostMem::create(
                size as u64,
                p.location,
                d.state.header().machine_id,
            )?),
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
/// process) or on the host (the location it was made for), and the handle types it may be
/// exported as.
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
        let location = match &v.backing {
            Backing::Device(dev, _) => CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: d
                    .visible
                    .iter()
                    .position(|p| p == dev)
                    .map_or(-1, |o| o as i32),
            },
            Backing::Host(host) => host.location,
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
        // Reservations come from the device address space; host memory is mapped with
        // MAP_FIXED only there, so this is checked again rather than assumed.
        let in_device_space = inner.va.contains(ptr) && inner.va.contains(ptr + size - 1);
        let v = inner
            .vmm
            .get_mut(handle)
            .filter(|v| !v.released)
            .ok_or(E_INVALID_HANDLE)?;
        if offset.checked_add(size).is_none_or(|end| end > v.size) {
            return Err(E_INVALID_VALUE);
        }
        let (dev, id) = match &v.backing {
            Backing::Device(dev, id) => (*dev, Some(*id)),
            Backing::Host(host) => {
                if !in_device_space {
                    return Err(E_INVALID_VALUE);
                }
                host.map_at(ptr, size, offset)?;
                (NO_DEVICE, None)
            }
        };
        v.maps += 1;
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

/// Unmaps every mapping that starts in `[ptr, ptr + size)`. Where host memory was mapped, the
/// addresses go back to the PROT_NONE reservation, so they stay reserved and a later cuMemMap
/// can map there again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    status(drv().and_then(|d| {
        let mut inner = d.inner.lock();
        let inside: Vec<u64> = inner
            .maps
            .range(ptr..ptr.saturating_add(size as u64))
            .filter(|(_, m)| m.kind == MapKind::Vmm)
            .map(|(s, _)| *s)
            .collect();
        if inside.is_empty() {
            return Err(E_INVALID_VALUE);
        }
        for s in inside {
            if let Some(m) = inner.maps.remove(&s) {
                if m.on_host() {
                    unmap_host(s, m.len);
                }
                if let Some(v) = inner.vmm.get_mut(m.handle) {
                    v.maps -= 1;
                }
                finish_if_unused(d, &mut inner, m.handle);
            }
        }
        Ok(())
    }))
}

/// The CPU protection an access descriptor's flags give host memory.
fn cpu_protection(flags: u32) -> Res<c_int> {
    match flags {
        CU_MEM_ACCESS_FLAGS_PROT_NONE => Ok(libc::PROT_NONE),
        CU_MEM_ACCESS_FLAGS_PROT_READ => Ok(libc::PROT_READ),
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE => Ok(libc::PROT_READ | libc::PROT_WRITE),
        _ => Err(E_INVALID_VALUE),
    }
}

/// Access to a mapped range. The range must be mapped whole. A descriptor for the host (a host
/// location: the CPU) sets what the CPU may do at the addresses of host memory mapped there; by
/// default, as on the driver, the CPU may not touch host-located memory at its mapped address
/// (Ref: open-mpi/ompi#12751, CPU loads and stores fault without cuMemSetAccess for the host).
/// Device access is not modelled (every device reaches every mapping; copies and memsets work
/// whatever access was set).
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
        let end = ptr.checked_add(size as u64).ok_or(E_INVALID_VALUE)?;
        let mut cpu = None;
        for i in 0..count {
            // SAFETY: the caller passes `count` descriptors.
            let a = unsafe { desc.add(i).read() };
            let prot = cpu_protection(a.flags)?;
            match a.location.type_ {
                CU_MEM_LOCATION_TYPE_DEVICE => {
                    d.physical(a.location.id)?;
                }
                CU_MEM_LOCATION_TYPE_HOST
                | CU_MEM_LOCATION_TYPE_HOST_NUMA
                | CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => cpu = Some(prot),
                _ => return Err(E_INVALID_VALUE),
            }
        }
        let inner = d.inner.lock();
        let mapped: u64 = inner.maps.range(ptr..end).map(|(_, m)| m.len).sum();
        if mapped != size as u64 {
            return Err(E_INVALID_VALUE);
        }
        let Some(prot) = cpu else {
            return Ok(());
        };
        for (&s, m) in inner.maps.range(ptr..end) {
            if !(m.kind == MapKind::Vmm && m.on_host()) {
                continue;
            }
            let len = (s + m.len).min(end) - s;
            // SAFETY: changes the protection of host memory this process mapped there with
            // cuMemMap (a shared mapping of its memory file, inside the device address space).
            if unsafe { libc::mprotect(s as *mut c_void, len as usize, prot) } != 0 {
                return Err(CUresult::CUDA_ERROR_UNKNOWN);
            }
        }
        Ok(())
    }))
}

/// What an exported fd starts with: enough to find the memory on the same simulated machine.
/// Device memory is exported as a memory file holding only this record; host memory as its own
/// memory file, which starts with this record (`HOST_DATA_OFFSET`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Exported {
    magic: u64,
    machine: u64,
    /// Device memory: the physical device. Host memory: the `CUmemLocationType` it was made for.
    dev: u32,
    /// Device memory: the allocation's head. Host memory: the location's id (a NUMA node).
    head: u32,
    /// Device memory: the allocation's generation. Host memory: 0.
    generation: u32,
    /// `KIND_DEVICE` or `KIND_HOST`.
    kind: u32,
    size: u64,
}

const EXPORT_MAGIC: u64 = 0x5349_4d47_5055_4644; // "SIMGPUFD"
/// Device memory, counted on a device (the record's only kind before host memory could be
/// exported, when this field was padding and always 0).
const KIND_DEVICE: u32 = 0;
/// Host memory: the descriptor is the memory file itself.
const KIND_HOST: u32 = 1;

/// A memory file holding only `rec`, for device memory.
fn export_record(rec: &Exported) -> Res<c_int> {
    // SAFETY: creating an anonymous memory file; the name is a valid C string.
    let fd = unsafe { libc::memfd_create(c"simgpu-export".as_ptr(), 0) };
    if fd < 0 {
        return Err(CUresult::CUDA_ERROR_UNKNOWN);
    }
    // SAFETY: writing our plain record into the fd we just made.
    let n = unsafe {
        libc::write(
            fd,
            rec as *const Exported as *const c_void,
            std::mem::size_of::<Exported>(),
        )
    };
    if n != std::mem::size_of::<Exported>() as isize {
        // SAFETY: closing the fd we made.
        unsafe { libc::close(fd) };
        return Err(CUresult::CUDA_ERROR_UNKNOWN);
    }
    Ok(fd)
}

/// A POSIX file descriptor another process of the same simulated machine imports: for device
/// memory, a record naming the allocation; for host memory, the memory file itself, so that
/// the importer maps the same bytes.
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
        let fd = match &v.backing {
            Backing::Device(dev, id) => export_record(&Exported {
                magic: EXPORT_MAGIC,
                machine: d.state.header().machine_id,
                dev: *dev,
                head: id.head,
                generation: id.generation,
                kind: KIND_DEVICE,
                size: v.size,
            })?,
            Backing::Host(host) => host.export()?,
        };
        crate::checkpoint::EXPORTED.store(true, std::sync::atomic::Ordering::Relaxed);
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
        {
            return Err(E_INVALID_VALUE);
        }
        let backing = match rec.kind {
            KIND_DEVICE if rec.dev < d.state.ndev() => {
                let id = AllocId {
                    head: rec.head,
                    generation: rec.generation,
                };
                if d.state.lock_device(rec.dev).dev().record(id).is_none() {
                    return Err(E_INVALID_VALUE);
                }
                Backing::Device(rec.dev, id)
            }
            KIND_HOST => Backing::Host(HostMem::import(owned, &rec)?),
            _ => return Err(E_INVALID_VALUE),
        };
        let h = d.inner.lock().vmm.insert(VmmHandle {
            backing,
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
