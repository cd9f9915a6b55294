//! NVML as applications read it (nvidia-smi, pynvml, PyTorch): for a device the slice caps,
//! memory info (v1 and `_v2`) reports total = min(cap, physical), free = min(total - what the
//! slice holds, physical free) (what cuMemGetInfo reports, so a device physically fuller than the
//! cap shows the same free figure to NVML and CUDA) and used = total - free; the per-process
//! lists show the slice's own processes only. Devices without a cap report NVML's figures
//! untouched. NVML wrappers work without cuInit (nvidia-smi never calls it): the process joins
//! its slice at its first wrapped NVML call (`startup::prepare`), and the device is found in the
//! ledger by UUID, or registered with the cap configured for the CUDA ordinal it has in this
//! process (CUDA_VISIBLE_DEVICES order, else NVML's).
//!
//! cuslice's own NVML queries (what creating a context takes, the compute meter's samples) are
//! `nvml_query`.

#![allow(non_snake_case)]

use std::ffi::c_uint;

use cuda_abi::*;
use cuslice_policy::virtual_mem_info;

use crate::membership::{self, Slice, State};
use crate::nvml_query::{Nvdev, device_limits, fetch_all, in_own_query, ordinal_of, uuid_of};
use crate::real;
use crate::startup;

/// (cap, what the slice holds) for an NVML device the slice caps.
fn capped(dev: Nvdev) -> Option<(u64, u64)> {
    if in_own_query() || !startup::prepare() {
        return None;
    }
    let State::On(s) = membership::state() else {
        return None;
    };
    let uuid = uuid_of(dev)?;
    if let Ok(Some(s)) = membership::active() {
        // This process's pools may have given memory back since they were last charged.
        membership::refresh_pools(s);
    }
    let index = match s.ledger.find(&uuid) {
        Some(i) => i,
        None => register(s, uuid)?,
    };
    s.sweep();
    Some((s.ledger.limit(index)?, s.ledger.used(index)))
}

fn register(s: &Slice, uuid: [u8; 16]) -> Option<u32> {
    let cap = match s.config.gpus() {
        Some(_) => device_limits(&s.config, 0, &uuid).memory,
        None => ordinal_of(&uuid).and_then(|o| s.config.limits(o).memory),
    };
    match s.ledger.device(uuid, cap) {
        Ok((i, _)) => Some(i),
        Err(e) => {
            crate::log::error!("{e}");
            None
        }
    }
}

/// # Safety
/// The NVML API contract of nvmlDeviceGetMemoryInfo.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    dev: Nvdev,
    mem: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    let Some(f) = real::nvmlDeviceGetMemoryInfo() else {
        return nvmlReturn_t::NVML_ERROR_UNINITIALIZED;
    };
    // SAFETY: forwarded unchanged.
    let r = unsafe { f(dev, mem) };
    if r == nvmlReturn_t::NVML_SUCCESS
        // SAFETY: the caller's struct (or NULL), just filled in by NVML.
        && let Some(m) = unsafe { mem.as_mut() }
        && let Some((cap, used)) = capped(dev)
    {
        let (free, total) = virtual_mem_info(m.free, m.total, Some(cap), used);
        m.total = total;
        m.free = free;
        m.used = total - free;
    }
    r
}

/// # Safety
/// The NVML API contract of nvmlDeviceGetMemoryInfo_v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    dev: Nvdev,
    mem: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    let Some(f) = real::nvmlDeviceGetMemoryInfo_v2() else {
        return nvmlReturn_t::NVML_ERROR_UNINITIALIZED;
    };
    // SAFETY: forwarded unchanged (NVML checks the version field).
    let r = unsafe { f(dev, mem) };
    if r == nvmlReturn_t::NVML_SUCCESS
        // SAFETY: the caller's struct (or NULL), just filled in by NVML.
        && let Some(m) = unsafe { mem.as_mut() }
        && let Some((cap, used)) = capped(dev)
    {
        // The driver's reservation lies outside any slice: a slice sees its cap as all there is.
        let (free, total) = virtual_mem_info(m.free, m.total, Some(cap), used);
        m.total = total;
        m.reserved = 0;
        m.free = free;
        m.used = total - free;
    }
    r
}

/// The per-process list protocol: `count` holds the caller's capacity on entry and the number of
/// entries on return; too small a capacity gives INSUFFICIENT_SIZE with the number needed.
fn filtered<T: Copy>(
    dev: Nvdev,
    count: *mut c_uint,
    infos: *mut T,
    pid_of: impl Fn(&T) -> u32,
    list: impl Fn(*mut c_uint, *mut T) -> nvmlReturn_t,
) -> nvmlReturn_t {
    let capped = !count.is_null() && capped(dev).is_some();
    let Some(State::On(s)) = capped.then(membership::state) else {
        return list(count, infos);
    };
    let all = match fetch_all(list) {
        Ok(all) => all,
        Err(r) => return r,
    };
    let pids = listed_as(&s.ledger.pids_with_host());
    let mine: Vec<T> = all
        .into_iter()
        .filter(|p| pids.contains(&(pid_of(p) as i32)))
        .collect();
    // SAFETY: non-NULL (checked above); the caller's capacity.
    let room = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = mine.len() as c_uint };
    if mine.len() > room {
        return nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if !mine.is_empty() {
        if infos.is_null() {
            return nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: the caller's buffer holds `room` >= mine.len() entries.
        unsafe { std::ptr::copy_nonoverlapping(mine.as_ptr(), infos, mine.len()) };
    }
    nvmlReturn_t::NVML_SUCCESS
}

/// The pids NVML lists the slice's processes under: a driver names processes by host pid, so
/// each process's host pid where the agent (or a node tool) told it, else its own pid (outside a
/// container they are the same). Not both: in a container, the container's pids are other
/// processes' pids on the host.
fn listed_as(procs: &[(i32, Option<i32>)]) -> Vec<i32> {
    procs.iter().map(|&(p, h)| h.unwrap_or(p)).collect()
}

/// # Safety
/// The NVML API contract of nvmlDeviceGetComputeRunningProcesses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    dev: Nvdev,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    let Some(f) = real::nvmlDeviceGetComputeRunningProcesses() else {
        return nvmlReturn_t::NVML_ERROR_UNINITIALIZED;
    };
    // SAFETY: forwarded with our own buffers or the caller's unchanged.
    filtered(dev, count, infos, |p| p.pid, |c, i| unsafe { f(dev, c, i) })
}

/// # Safety
/// The NVML API contract of nvmlDeviceGetComputeRunningProcesses_v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    dev: Nvdev,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    let Some(f) = real::nvmlDeviceGetComputeRunningProcesses_v2() else {
        return nvmlReturn_t::NVML_ERROR_UNINITIALIZED;
    };
    // SAFETY: forwarded with our own buffers or the caller's unchanged.
    filtered(dev, count, infos, |p| p.pid, |c, i| unsafe { f(dev, c, i) })
}

/// # Safety
/// The NVML API contract of nvmlDeviceGetComputeRunningProcesses_v3.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    dev: Nvdev,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    let Some(f) = real::nvmlDeviceGetComputeRunningProcesses_v3() else {
        return nvmlReturn_t::NVML_ERROR_UNINITIALIZED;
    };
    // SAFETY: forwarded with our own buffers or the caller's unchanged.
    filtered(dev, count, infos, |p| p.pid, |c, i| unsafe { f(dev, c, i) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_are_listed_by_host_pid_where_known() {
        // A container's processes 1 and 7, the first told its host pid 40123.
        assert_eq!(listed_as(&[(1, Some(40123)), (7, None)]), [40123, 7]);
        // Outside a container nobody is told: the own pids.
        assert_eq!(listed_as(&[(500, None), (501, None)]), [500, 501]);
    }
}
