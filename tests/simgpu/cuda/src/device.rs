//! Devices: enumeration, names, UUIDs, memory size, attributes.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use cuda_abi::{CUdevice, CUresult, CUuuid, attr};
use simgpu::layout::field_str;

use crate::driver::*;

fn attribute(d: &Driver, dev: u32, a: c_int) -> Res<c_int> {
    let c = d.state.config();
    let info = d.state.device_info(dev);
    Ok(match a {
        attr::MAX_THREADS_PER_BLOCK => 1024,
        attr::MAX_BLOCK_DIM_X | attr::MAX_BLOCK_DIM_Y => 1024,
        attr::MAX_BLOCK_DIM_Z => 64,
        attr::MAX_GRID_DIM_X => i32::MAX,
        attr::MAX_GRID_DIM_Y | attr::MAX_GRID_DIM_Z => 65535,
        attr::MAX_SHARED_MEMORY_PER_BLOCK => 48 << 10,
        attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => 227 << 10,
        attr::TOTAL_CONSTANT_MEMORY => 64 << 10,
        attr::WARP_SIZE => 32,
        attr::MAX_PITCH => i32::MAX,
        attr::MAX_REGISTERS_PER_BLOCK => 65536,
        attr::CLOCK_RATE => 1_980_000,
        attr::TEXTURE_ALIGNMENT => 512,
        attr::TEXTURE_PITCH_ALIGNMENT => 32,
        attr::MULTIPROCESSOR_COUNT => c.sm_count as c_int,
        attr::INTEGRATED => 0,
        attr::CAN_MAP_HOST_MEMORY | attr::CONCURRENT_KERNELS | attr::UNIFIED_ADDRESSING => 1,
        attr::COMPUTE_MODE | attr::ECC_ENABLED | attr::MULTI_GPU_BOARD => 0,
        attr::PCI_BUS_ID => info.pci_bus as c_int,
        attr::PCI_DEVICE_ID | attr::PCI_DOMAIN_ID => 0,
        attr::MEMORY_CLOCK_RATE => 2_619_000,
        attr::GLOBAL_MEMORY_BUS_WIDTH => 5120,
        attr::L2_CACHE_SIZE => 50 << 20,
        attr::MAX_THREADS_PER_MULTIPROCESSOR => 2048,
        attr::MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
        attr::ASYNC_ENGINE_COUNT => 2,
        attr::COMPUTE_CAPABILITY_MAJOR => c.cc_major as c_int,
        attr::COMPUTE_CAPABILITY_MINOR => c.cc_minor as c_int,
        attr::MANAGED_MEMORY | attr::CONCURRENT_MANAGED_ACCESS | attr::COOPERATIVE_LAUNCH => 1,
        attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED | attr::MEMORY_POOLS_SUPPORTED => 1,
        // An H100's SM: what the occupancy calculator (limits.rs) assumes, and what cuBLAS sizes
        // its work by (with 0 here, cublasCreate failed).
        attr::MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => 228 << 10,
        attr::MAX_REGISTERS_PER_MULTIPROCESSOR => 65536,
        attr::RESERVED_SHARED_MEMORY_PER_BLOCK => 1024,
        attr::STREAM_PRIORITIES_SUPPORTED | attr::GLOBAL_L1_CACHE_SUPPORTED => 1,
        attr::LOCAL_L1_CACHE_SUPPORTED | attr::COMPUTE_PREEMPTION_SUPPORTED => 1,
        attr::CLUSTER_LAUNCH | attr::TENSOR_MAP_ACCESS_SUPPORTED => 1,
        attr::MEM_SYNC_DOMAIN_COUNT => 4,
        a if (1..attr::MAX).contains(&a) => 0,
        _ => return Err(E_INVALID_VALUE),
    })
}

fn copy_cstr(dst: *mut c_char, len: c_int, s: &str) -> Res {
    if dst.is_null() || len <= 0 {
        return Err(E_INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: the caller gave `len` writable bytes at `dst`; we write n + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), dst as *mut u8, n);
        *dst.add(n) = 0;
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    // Answers before cuInit, like the real driver; needs the state for the configured version.
    let version = match drv() {
        Ok(d) => d.state.config().driver_version,
        Err(_) => simgpu::state_from_env()
            .map(|s| s.config().driver_version)
            .unwrap_or(13000),
    };
    // SAFETY: v is an out-pointer from the caller (NULL refused by `put`).
    status(unsafe { put(v, version) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    // SAFETY: out-pointer from the caller.
    status(drv().and_then(|d| unsafe { put(count, d.visible.len() as c_int) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    status(drv().and_then(|d| {
        d.physical(ordinal)?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(device, ordinal) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    status(drv().and_then(|d| {
        d.physical(dev)?;
        copy_cstr(name, len, &field_str(&d.state.config().name))
    }))
}

fn uuid(dev: CUdevice) -> Res<CUuuid> {
    let d = drv()?;
    Ok(CUuuid {
        bytes: d.state.device_info(d.physical(dev)?).uuid,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(out: *mut CUuuid, dev: CUdevice) -> CUresult {
    // SAFETY: out-pointer from the caller.
    status(uuid(dev).and_then(|u| unsafe { put(out, u) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(out: *mut CUuuid, dev: CUdevice) -> CUresult {
    // SAFETY: out-pointer from the caller.
    status(uuid(dev).and_then(|u| unsafe { put(out, u) }))
}

fn total_mem(dev: CUdevice) -> Res<u64> {
    let d = drv()?;
    Ok(d.state.device_info(d.physical(dev)?).total)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    // SAFETY: out-pointer from the caller.
    status(total_mem(dev).and_then(|t| unsafe { put(bytes, t as usize) }))
}

/// The CUDA 2.x entry point: a 32-bit size, clamped.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: out-pointer from the caller.
    status(total_mem(dev).and_then(|t| unsafe { put(bytes, t.min(u32::MAX as u64) as c_uint) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(pi: *mut c_int, a: c_int, dev: CUdevice) -> CUresult {
    status(drv().and_then(|d| {
        let v = attribute(d, d.physical(dev)?, a)?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(pi, v) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> CUresult {
    status(drv().and_then(|d| {
        d.physical(dev)?;
        let c = d.state.config();
        // SAFETY: out-pointers from the caller.
        unsafe {
            put(major, c.cc_major as c_int)?;
            put(minor, c.cc_minor as c_int)
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    out: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    status(drv().and_then(|d| {
        let bus = d.state.device_info(d.physical(dev)?).pci_bus;
        copy_cstr(out, len, &cuda_bus_id(bus))
    }))
}

/// The driver's form of a PCI bus id, `DDDD:BB:DD.F` in upper-case hex: 12 characters, so the
/// 13 bytes the documentation asks for hold it (NVML's `busId` has an 8-digit domain).
fn cuda_bus_id(bus: u32) -> String {
    format!("{:04X}:{:02X}:{:02X}.{:X}", 0, bus, 0, 0)
}

/// (domain, bus, device, function) of a PCI bus id in one of the forms
/// `cuDeviceGetByPCIBusId` documents, every number hexadecimal: `domain:bus:device.function`,
/// `domain:bus:device` or `bus:device.function`. None for anything else.
fn parse_bus_id(s: &str) -> Option<(u64, u32, u32, u32)> {
    let hex = |t: &str| {
        u64::from_str_radix(t, 16)
            .ok()
            .filter(|_| !t.is_empty() && t.len() <= 8)
    };
    let (head, function) = match s.rsplit_once('.') {
        Some((h, f)) => (h, Some(hex(f)?)),
        None => (s, None),
    };
    let parts: Vec<&str> = head.split(':').collect();
    let (domain, bus, device) = match (parts.as_slice(), function) {
        ([d, b, v], _) => (hex(d)?, hex(b)?, hex(v)?),
        ([b, v], Some(_)) => (0, hex(b)?, hex(v)?),
        _ => return None,
    };
    let small = |v: u64| u32::try_from(v).ok();
    Some((
        domain,
        small(bus)?,
        small(device)?,
        small(function.unwrap_or(0))?,
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(
    dev: *mut CUdevice,
    bus_id: *const c_char,
) -> CUresult {
    status(drv().and_then(|d| {
        if bus_id.is_null() {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: the caller passes a NUL-terminated string.
        let want = unsafe { CStr::from_ptr(bus_id) }.to_string_lossy();
        let want = parse_bus_id(want.trim()).ok_or(E_INVALID_VALUE)?;
        let ordinal = d
            .visible
            .iter()
            .position(|&p| want == (0, d.state.device_info(p).pci_bus, 0, 0))
            .ok_or(E_INVALID_DEVICE)?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(dev, ordinal as CUdevice) }
    }))
}

/// Registered log callbacks (`cuLogsRegisterCallback`), by handle. The simulated driver writes
/// no log entries, so none is ever called; they are kept so that unregistering is checked.
static LOG_CALLBACKS: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsRegisterCallback(
    callback: Option<unsafe extern "C" fn(*mut c_void, c_uint, *mut c_char, usize)>,
    _user: *mut c_void,
    out: *mut *mut c_void,
) -> CUresult {
    if callback.is_none() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let mut all = LOG_CALLBACKS.lock().unwrap_or_else(|e| e.into_inner());
    // An opaque, never dereferenced, non-NULL handle.
    let h = all.iter().max().map_or(1, |m| m + 1);
    all.push(h);
    if !out.is_null() {
        // SAFETY: out-pointer from the caller (optional in cuda.h).
        unsafe { out.write(h as *mut c_void) };
    }
    CUresult::CUDA_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsUnregisterCallback(h: *mut c_void) -> CUresult {
    let mut all = LOG_CALLBACKS.lock().unwrap_or_else(|e| e.into_inner());
    match all.iter().position(|&x| x == h as usize) {
        Some(i) => {
            all.swap_remove(i);
            CUresult::CUDA_SUCCESS
        }
        None => CUresult::CUDA_ERROR_INVALID_VALUE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_in_the_driver_s_form_and_every_documented_one_parse() {
        assert_eq!(cuda_bus_id(0x18), "0000:18:00.0");
        assert_eq!(cuda_bus_id(0xAB).len() + 1, 13);
        for (text, want) in [
            ("0000:18:00.0", Some((0, 0x18, 0, 0))),
            ("00000000:18:00.0", Some((0, 0x18, 0, 0))),
            ("0000:3b:00.0", Some((0, 0x3B, 0, 0))),
            ("0001:3B:01", Some((1, 0x3B, 1, 0))),
            ("18:00.0", Some((0, 0x18, 0, 0))),
            ("18:00", None),
            ("18", None),
            ("", None),
            ("0000:zz:00.0", None),
            ("0000:18:00.", None),
        ] {
            assert_eq!(parse_bus_id(text), want, "{text:?}");
        }
    }
}
