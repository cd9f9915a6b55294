//! Devices and the system: the device count, handles by index, UUID and PCI bus id, names,
//! compute capability, PCI info and the driver versions.

use std::ffi::{CStr, c_char, c_int, c_uint};

use cuda_abi::*;
use simgpu::State;
use simgpu::layout::field_str;

use super::*;

fn count(out: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(state().and_then(|s| unsafe { put(out, s.ndev()) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(out: *mut c_uint) -> nvmlReturn_t {
    count(out)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(out: *mut c_uint) -> nvmlReturn_t {
    count(out)
}

fn by_index(i: c_uint, out: *mut nvmlDevice_t) -> nvmlReturn_t {
    status(state().and_then(|s| {
        if i >= s.ndev() {
            return Err(BAD_ARG);
        }
        if s.lost(i) {
            return Err(nvmlReturn_t::NVML_ERROR_GPU_IS_LOST);
        }
        // SAFETY: out-pointer from the caller.
        unsafe { put(out, handle(i)) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    i: c_uint,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    by_index(i, out)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    i: c_uint,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    by_index(i, out)
}

/// The device whose `f` is `key` (`same` decides, given `key` and a device's `f`).
fn find(
    key: *const c_char,
    f: impl Fn(&State, u32) -> String,
    same: impl Fn(&str, &str) -> bool,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    status(state().and_then(|s| {
        if key.is_null() {
            return Err(BAD_ARG);
        }
        // SAFETY: the caller passes a NUL-terminated string.
        let want = unsafe { CStr::from_ptr(key) }.to_string_lossy();
        let i = (0..s.ndev())
            .find(|&i| same(&want, &f(s, i)))
            .ok_or(nvmlReturn_t::NVML_ERROR_NOT_FOUND)?;
        if s.lost(i) {
            return Err(nvmlReturn_t::NVML_ERROR_GPU_IS_LOST);
        }
        // SAFETY: out-pointer from the caller.
        unsafe { put(out, handle(i)) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    find(
        uuid,
        |s, i| s.uuid_string(i),
        |a, b| a.eq_ignore_ascii_case(b),
        out,
    )
}

/// A PCI bus id as numbers (domain, bus, device, function): NVML takes both its own form
/// (`00000000:18:00.0`) and CUDA's (`0000:18:00.0`), and a bare `18:00.0` as domain 0.
fn bus_id_numbers(s: &str) -> Option<(u64, u64, u64, u64)> {
    let (rest, function) = s.trim().rsplit_once('.')?;
    let mut parts: Vec<&str> = rest.split(':').collect();
    if parts.len() == 2 {
        parts.insert(0, "0");
    }
    let [domain, bus, device] = parts[..] else {
        return None;
    };
    let hex = |x: &str| u64::from_str_radix(x, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let same = |a: &str, b: &str| bus_id_numbers(a).is_some_and(|a| Some(a) == bus_id_numbers(b));
    find(bus, |s, i| s.pci_bus_id(i), same, out)
}

/// The same under the name `nvml.h` maps it to before the `_v2` ABI (NCCL asks for it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's arguments, passed on.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(bus, out) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(dev: nvmlDevice_t, out: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|(_, i)| unsafe { put(out, i) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    dev: nvmlDevice_t,
    out: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|(s, i)| put_str(out, len, &s.uuid_string(i))))
}

/// The device's minor number: N of /dev/nvidiaN. simgpu's devices are numbered as they are
/// listed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    dev: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|(_, i)| unsafe { put(out, i) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    dev: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    put_two(dev, major, minor, |s| {
        let c = s.config();
        (c.cc_major as c_int, c.cc_minor as c_int)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    dev: nvmlDevice_t,
    out: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|(s, _)| put_str(out, len, &field_str(&s.config().name))))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    dev: nvmlDevice_t,
    out: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|(s, i)| {
        let id = s.pci_bus_id(i);
        let mut info = nvmlPciInfo_t {
            busIdLegacy: [0; 16],
            domain: 0,
            bus: s.device_info(i).pci_bus,
            device: 0,
            pciDeviceId: 0x2330_10de,
            pciSubSystemId: 0x16c1_10de,
            busId: [0; 32],
        };
        info.busId[..id.len()].copy_from_slice(id.as_bytes());
        let legacy = &id[4..];
        info.busIdLegacy[..legacy.len()].copy_from_slice(legacy.as_bytes());
        // SAFETY: out-pointer from the caller.
        unsafe { put(out, info) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(out: *mut c_char, len: c_uint) -> nvmlReturn_t {
    status(state().and_then(|s| put_str(out, len, &field_str(&s.config().nvml_driver_version))))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(out: *mut i32) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(state().and_then(|s| unsafe { put(out, s.config().driver_version) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(out: *mut i32) -> nvmlReturn_t {
    // SAFETY: forwarding the caller's out-pointer.
    unsafe { nvmlSystemGetCudaDriverVersion(out) }
}
