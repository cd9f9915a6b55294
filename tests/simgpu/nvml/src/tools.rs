//! What monitoring tools (gpustat, nvitop) ask besides: H100-like answers for the NVML
//! version, temperature, fans, power, encoder and decoder, performance state, modes, ECC and
//! the driver model.

use std::ffi::{c_char, c_uint};

use cuda_abi::*;
use simgpu::State;
use simgpu::layout::field_str;

use super::*;

/// NVML's own version: the CUDA major version, then the driver version ("13.580.95.05").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(out: *mut c_char, len: c_uint) -> nvmlReturn_t {
    status(state().and_then(|s| {
        let c = s.config();
        let v = format!(
            "{}.{}",
            c.driver_version / 1000,
            field_str(&c.nvml_driver_version)
        );
        put_str(out, len, &v)
    }))
}

/// Engine utilisation (percent of the last sample period busy) of device `i`.
fn busy(s: &State, i: u32) -> u32 {
    s.utilization(i).min(100)
}

/// The GPU core temperature (`NVML_TEMPERATURE_GPU`, the only sensor): 30 C idle, rising with
/// utilisation to 75 C at 100%. Another sensor: NVML_ERROR_INVALID_ARGUMENT.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    dev: nvmlDevice_t,
    sensor: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|(s, i)| {
        if sensor != NVML_TEMPERATURE_GPU {
            return Err(BAD_ARG);
        }
        // SAFETY: out-pointer from the caller.
        unsafe { put(out, 30 + busy(s, i) * 45 / 100) }
    }))
}

/// An H100 SXM is cooled by the chassis: no fans of its own. NVML says so as on such a node:
/// zero fans, and fan speed NVML_ERROR_NOT_SUPPORTED (tools print N/A).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumFans(dev: nvmlDevice_t, out: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|_| unsafe { put(out, 0) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(
    dev: nvmlDevice_t,
    _out: *mut c_uint,
) -> nvmlReturn_t {
    not_supported(dev)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed_v2(
    dev: nvmlDevice_t,
    _fan: c_uint,
    _out: *mut c_uint,
) -> nvmlReturn_t {
    not_supported(dev)
}

/// The board's power limit: 700 W (H100 SXM), in milliwatts.
const POWER_LIMIT_MW: c_uint = 700_000;

/// Power draw in milliwatts: 70 W idle, rising with utilisation to the 700 W limit.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    dev: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|(s, i)| {
        let mw = 70_000 + busy(s, i) * (POWER_LIMIT_MW - 70_000) / 100;
        // SAFETY: out-pointer from the caller.
        unsafe { put(out, mw) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    dev: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|_| unsafe { put(out, POWER_LIMIT_MW) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    dev: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|_| unsafe { put(out, POWER_LIMIT_MW) }))
}

/// Video encoder and decoder: idle (simgpu runs no video work), sampled over one second.
fn codec_idle(dev: nvmlDevice_t, util: *mut c_uint, period_us: *mut c_uint) -> nvmlReturn_t {
    put_two(dev, util, period_us, |_| (0, 1_000_000))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    dev: nvmlDevice_t,
    util: *mut c_uint,
    period_us: *mut c_uint,
) -> nvmlReturn_t {
    codec_idle(dev, util, period_us)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    dev: nvmlDevice_t,
    util: *mut c_uint,
    period_us: *mut c_uint,
) -> nvmlReturn_t {
    codec_idle(dev, util, period_us)
}

/// Performance state P0 (maximum performance), as a data-centre GPU with a context reports.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    dev: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|_| unsafe { put(out, 0) }))
}

/// Persistence mode enabled (1), as on a node that runs nvidia-persistenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    dev: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|_| unsafe { put(out, 1) }))
}

/// Compute mode DEFAULT (0): several processes may use the device at once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    dev: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|_| unsafe { put(out, 0) }))
}

/// No display attached or initialised (0), as on a data-centre GPU.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDisplayActive(
    dev: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|_| unsafe { put(out, 0) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDisplayMode(
    dev: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: out-pointer from the caller.
    status(dev_of(dev).and_then(|_| unsafe { put(out, 0) }))
}

/// ECC enabled, now and after the next reboot (1, 1), as on an H100.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    dev: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    put_two(dev, current, pending, |_| (1, 1))
}

/// ECC error counts (any error type, volatile or aggregate): none; simgpu's memory has no errors.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    dev: nvmlDevice_t,
    error_type: c_uint,
    counter_type: c_uint,
    out: *mut u64,
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|_| {
        // nvmlMemoryErrorType_t: corrected (0), uncorrected (1); nvmlEccCounterType_t:
        // volatile (0), aggregate (1).
        if error_type > 1 || counter_type > 1 {
            return Err(BAD_ARG);
        }
        // SAFETY: out-pointer from the caller.
        unsafe { put(out, 0) }
    }))
}

/// The driver model (WDDM/TCC) exists on Windows only: NVML_ERROR_NOT_SUPPORTED on Linux.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDriverModel(
    dev: nvmlDevice_t,
    _current: *mut c_uint,
    _pending: *mut c_uint,
) -> nvmlReturn_t {
    not_supported(dev)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDriverModel_v2(
    dev: nvmlDevice_t,
    _current: *mut c_uint,
    _pending: *mut c_uint,
) -> nvmlReturn_t {
    not_supported(dev)
}
