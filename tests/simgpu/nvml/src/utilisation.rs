//! Utilisation: the device's engine busy time over the last second, and per-process
//! utilisation samples as the state's `ProcessSamples` model says.

use std::ffi::c_uint;

use cuda_abi::*;

use super::*;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    dev: nvmlDevice_t,
    out: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|(s, i)| {
        let gpu = s.utilization(i);
        // SAFETY: out-pointer from the caller.
        unsafe { put(out, nvmlUtilization_t { gpu, memory: 0 }) }
    }))
}

/// Per-process SM utilisation since `last_seen` (wall-clock microseconds; 0: the last second).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    dev: nvmlDevice_t,
    out: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: u64,
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|(s, i)| {
        if count.is_null() {
            return Err(BAD_ARG);
        }
        let how = s.process_samples();
        if how == simgpu::ProcessSamples::Off {
            return Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED);
        }
        s.resolve_host_pids();
        // Time stamps are wall-clock microseconds, the period ends turned into wall time with
        // the offset fixed when the state was made, so every process stamps a period alike.
        let c = s.config();
        let since = last_seen
            .saturating_sub(c.wall_at_mono_zero_us)
            .saturating_mul(1000);
        let (end, busy) = s.process_utilization(i, since, how);
        let period = c.util_sample_ns.max(1);
        let samples: Vec<_> = busy
            .into_iter()
            .map(|(slot, busy)| nvmlProcessUtilizationSample_t {
                pid: s.reported_pid(slot) as u32,
                timeStamp: c.wall_at_mono_zero_us + end / 1000,
                smUtil: (busy * 100 / period).min(100) as u32,
                memUtil: 0,
                encUtil: 0,
                decUtil: 0,
            })
            .collect();
        // SAFETY: checked non-NULL.
        let room = unsafe { *count } as usize;
        // SAFETY: checked non-NULL.
        unsafe { count.write(samples.len() as c_uint) };
        if out.is_null() || samples.len() > room {
            return Err(nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (k, v) in samples.into_iter().enumerate() {
            // SAFETY: k < room.
            unsafe { out.add(k).write(v) };
        }
        Ok(())
    }))
}
