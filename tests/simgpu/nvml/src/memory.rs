//! Memory and processes: total and used memory per device (after reclaiming what dead
//! processes held), the compute processes running on it with what each holds, BAR1, and the
//! (empty) graphics process lists.

use std::ffi::c_uint;

use cuda_abi::*;
use simgpu::State;

use super::*;

/// (total, used) of device `i`, after reclaiming what dead processes held.
fn memory(s: &State, i: u32) -> (u64, u64) {
    let mut g = s.lock_device(i);
    g.reclaim_dead();
    let d = g.dev();
    (d.total(), d.used())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    dev: nvmlDevice_t,
    out: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|(s, i)| {
        // A real driver always knows host pids; a reader on the host lets simgpu learn them.
        s.resolve_host_pids();
        let (total, used) = memory(s, i);
        // SAFETY: out-pointer from the caller.
        unsafe {
            put(
                out,
                nvmlMemory_t {
                    total,
                    free: total - used,
                    used,
                },
            )
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    dev: nvmlDevice_t,
    out: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|(s, i)| {
        s.resolve_host_pids();
        if out.is_null() {
            return Err(BAD_ARG);
        }
        // SAFETY: checked non-NULL; the caller passes an nvmlMemory_v2_t with its version set.
        if unsafe { (*out).version } != NVML_MEMORY_V2 {
            return Err(nvmlReturn_t::NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, used) = memory(s, i);
        // SAFETY: checked non-NULL.
        unsafe {
            out.write(nvmlMemory_v2_t {
                version: NVML_MEMORY_V2,
                total,
                reserved: 0,
                free: total - used,
                used,
            })
        };
        Ok(())
    }))
}

/// Compute processes of device `i`: (PID, bytes held).
fn processes(s: &State, i: u32) -> Vec<(u32, u64)> {
    s.sweep();
    s.resolve_host_pids();
    s.device_snapshot(i)
        .processes
        .iter()
        .filter(|p| p.contexts > 0)
        .map(|p| (p.pid as u32, p.held))
        .collect()
}

/// NVML's list protocol: report the count, and fill `infos` if it has room.
fn list<T>(
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(u32, u64) -> T,
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|(s, i)| {
        if count.is_null() {
            return Err(BAD_ARG);
        }
        let procs = processes(s, i);
        // SAFETY: checked non-NULL; the caller's capacity.
        let room = unsafe { *count } as usize;
        // SAFETY: checked non-NULL.
        unsafe { count.write(procs.len() as c_uint) };
        if procs.len() > room {
            return Err(nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE);
        }
        if !procs.is_empty() && infos.is_null() {
            return Err(BAD_ARG);
        }
        for (k, (pid, held)) in procs.into_iter().enumerate() {
            // SAFETY: k < room, the capacity the caller gave for `infos`.
            unsafe { infos.add(k).write(make(pid, held)) };
        }
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    list(dev, count, infos, |pid, used| nvmlProcessInfo_v1_t {
        pid,
        usedGpuMemory: used,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    list(dev, count, infos, |pid, used| nvmlProcessInfo_v2_t {
        pid,
        usedGpuMemory: used,
        gpuInstanceId: NVML_NO_INSTANCE,
        computeInstanceId: NVML_NO_INSTANCE,
    })
}

/// Same struct as `_v2` (`nvmlProcessInfo_t` is `nvmlProcessInfo_v2_t`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    dev: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    // SAFETY: forwarding the caller's arguments to the identical `_v2` call.
    unsafe { nvmlDeviceGetComputeRunningProcesses_v2(dev, count, infos) }
}

/// BAR1 (the host's window onto device memory): resizable BAR sized to the next power of two
/// of device memory (an H100 80GB has 128 GiB), with 1 MiB in use, as an idle node shows.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBAR1MemoryInfo(
    dev: nvmlDevice_t,
    out: *mut nvmlBAR1Memory_t,
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|(s, i)| {
        let (total, _) = memory(s, i);
        let bar1 = total.next_power_of_two();
        let used = 1 << 20;
        // SAFETY: out-pointer from the caller.
        unsafe {
            put(
                out,
                nvmlBAR1Memory_t {
                    bar1Total: bar1,
                    bar1Free: bar1 - used,
                    bar1Used: used,
                },
            )
        }
    }))
}

/// Graphics processes: none. simgpu's devices run compute contexts only, as a data-centre GPU
/// without a display does; the list protocol is NVML's (count 0, success).
fn no_graphics(dev: nvmlDevice_t, count: *mut c_uint) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|_| {
        // SAFETY: out-pointer from the caller.
        unsafe { put(count, 0) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    dev: nvmlDevice_t,
    count: *mut c_uint,
    _infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    no_graphics(dev, count)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    dev: nvmlDevice_t,
    count: *mut c_uint,
    _infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    no_graphics(dev, count)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    dev: nvmlDevice_t,
    count: *mut c_uint,
    _infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    no_graphics(dev, count)
}
