//! Topology: NVLink (links, their state and capabilities, the remote device's PCI info),
//! PCIe link generation and width, the platform and fabric queries, peer-to-peer status and
//! field values.

use std::ffi::{c_int, c_uint};

use cuda_abi::*;
use simgpu::State;

use crate::devices::nvmlDeviceGetPciInfo_v3;

use super::*;

// ---- NVLink ---------------------------------------------------------------------------------
// Without `simgpu init --nvlink` the devices have no NVLink: every link query answers
// NVML_ERROR_NOT_SUPPORTED, as NVML does on a GPU without NVLink (a PCIe card). PyTorch looks
// these up when NVML loads and asserts only that they exist; it reads the answers to find NVLink
// peers, and finds none. With it, device `a` has one link to each other device, link `l` to the
// `l`-th of them in index order, each active, GPU to GPU, with peer access and atomics over it.

/// The device link `link` of device `a` reaches, on a machine made with `--nvlink`.
fn remote(dev: nvmlDevice_t, link: c_uint) -> Result<(&'static State, u32), nvmlReturn_t> {
    let (s, a) = dev_of(dev)?;
    if !s.linked(a, (a + 1) % s.ndev().max(1)) {
        return Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED);
    }
    let b = (0..s.ndev())
        .filter(|&b| b != a)
        .nth(link as usize)
        .ok_or(BAD_ARG)?;
    Ok((s, b))
}

/// `NVML_FEATURE_ENABLED`.
const FEATURE_ENABLED: c_uint = 1;
/// `nvmlNvLinkCapability_t`: P2P_SUPPORTED, SYSMEM_ACCESS, P2P_ATOMICS, SYSMEM_ATOMICS,
/// SLI_BRIDGE, VALID; a GPU-to-GPU link has the first, third and last.
const NVLINK_CAPABILITIES: [c_uint; 6] = [1, 0, 1, 0, 0, 1];

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    dev: nvmlDevice_t,
    link: c_uint,
    active: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(remote(dev, link).and_then(|_| unsafe { put(active, FEATURE_ENABLED) }))
}

/// `NVML_NVLINK_DEVICE_TYPE_GPU`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    dev: nvmlDevice_t,
    link: c_uint,
    kind: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(remote(dev, link).and_then(|_| unsafe { put(kind, 0) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkCapability(
    dev: nvmlDevice_t,
    link: c_uint,
    capability: c_uint,
    result: *mut c_uint,
) -> nvmlReturn_t {
    status(remote(dev, link).and_then(|_| {
        let v = *NVLINK_CAPABILITIES
            .get(capability as usize)
            .ok_or(BAD_ARG)?;
        // SAFETY: out-pointer from the caller.
        unsafe { put(result, v) }
    }))
}

/// The PCI information of the device at the link's other end.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo(
    dev: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    match remote(dev, link) {
        // SAFETY: the other device's handle (index + 1) and the caller's out-pointer.
        Ok((_, b)) => unsafe { nvmlDeviceGetPciInfo_v3((b as usize + 1) as nvmlDevice_t, pci) },
        Err(e) => e,
    }
}

// ---- PCIe and the platform -------------------------------------------------------------------
// NCCL calls these while it builds its topology (through pointers it does not check for NULL): the
// link of an H100 SXM's PCIe 5 x16, and no fabric, platform or confidential computing answers.

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    dev: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|_| unsafe { put(out, 5) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    dev: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|_| unsafe { put(out, 5) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(
    dev: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|_| unsafe { put(out, 16) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(
    dev: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|_| unsafe { put(out, 16) }))
}

/// `NVML_PCIE_LINK_MAX_SPEED_32000MBPS`: PCIe 5, per lane.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieLinkMaxSpeed(
    dev: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|_| unsafe { put(out, 32000) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfoExt(
    dev: nvmlDevice_t,
    _out: *mut std::ffi::c_void,
) -> nvmlReturn_t {
    not_supported(dev)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    dev: nvmlDevice_t,
    _out: *mut std::ffi::c_void,
) -> nvmlReturn_t {
    not_supported(dev)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPlatformInfo(
    dev: nvmlDevice_t,
    _out: *mut std::ffi::c_void,
) -> nvmlReturn_t {
    not_supported(dev)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlSystemGetConfComputeState(_out: *mut std::ffi::c_void) -> nvmlReturn_t {
    status(state().and(Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED)))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlSystemGetConfComputeSettings(_out: *mut std::ffi::c_void) -> nvmlReturn_t {
    status(state().and(Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED)))
}

/// `NVML_P2P_STATUS_NOT_SUPPORTED`: as `cuDeviceCanAccessPeer`, no device reaches another.
const P2P_STATUS_NOT_SUPPORTED: c_uint = 5;
const P2P_STATUS_OK: c_uint = 0;

/// A device reaches itself. Between two different devices every peer capability (read, write,
/// atomics, NVLink, ...) is OK where they are linked (`simgpu init --nvlink`, as
/// `cuDeviceCanAccessPeer` says 1), and not supported otherwise, as on PCIe cards without peer
/// access.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetP2PStatus(
    dev1: nvmlDevice_t,
    dev2: nvmlDevice_t,
    _index: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    status(dev_of(dev1).and_then(|(s, a)| {
        let (_, b) = dev_of(dev2)?;
        let answer = if a == b || s.linked(a, b) {
            P2P_STATUS_OK
        } else {
            P2P_STATUS_NOT_SUPPORTED
        };
        // SAFETY: out-pointer from the caller.
        unsafe { put(out, answer) }
    }))
}

/// `nvmlFieldValue_t`.
#[repr(C)]
pub struct FieldValue {
    pub field_id: c_uint,
    pub scope_id: c_uint,
    pub timestamp: i64,
    pub latency_usec: i64,
    pub value_type: c_uint,
    pub nvml_return: nvmlReturn_t,
    pub value: u64,
}

/// No field is known: each one's own return is NOT_SUPPORTED, the call itself succeeds (as NVML
/// answers for fields a device does not have).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    dev: nvmlDevice_t,
    count: c_int,
    values: *mut FieldValue,
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|_| {
        if count < 0 || (count > 0 && values.is_null()) {
            return Err(BAD_ARG);
        }
        for k in 0..count as usize {
            // SAFETY: the caller passes `count` field values to fill.
            let v = unsafe { &mut *values.add(k) };
            v.timestamp = 0;
            v.latency_usec = 0;
            v.nvml_return = nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED;
        }
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    dev: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    // SAFETY: forwarding the caller's arguments.
    unsafe { nvmlDeviceGetNvLinkRemotePciInfo(dev, link, pci) }
}
