//! simgpu's `libnvidia-ml.so.1`: NVML over the simulated device model. Like real NVML it sees
//! every device (CUDA_VISIBLE_DEVICES does not apply), reports memory and per-process usage as
//! the device holds it (context overhead included), and utilisation from engine busy time.
//! Processes are reported by host PID where known (see docs/simgpu.md).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_int, c_uint};
use std::sync::Mutex;
use std::sync::OnceLock;

use cuda_abi::*;
use simgpu::State;
use simgpu::layout::field_str;

/// The state stays open for the life of the process once NVML was initialised; `init_count`
/// counts nvmlInit calls not yet matched by nvmlShutdown.
static STATE: OnceLock<Result<State, String>> = OnceLock::new();
static INIT_COUNT: Mutex<u32> = Mutex::new(0);

const OK: nvmlReturn_t = nvmlReturn_t::NVML_SUCCESS;
const BAD_ARG: nvmlReturn_t = nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT;

fn state() -> Result<&'static State, nvmlReturn_t> {
    if *INIT_COUNT.lock().unwrap_or_else(|e| e.into_inner()) == 0 {
        return Err(nvmlReturn_t::NVML_ERROR_UNINITIALIZED);
    }
    STATE
        .get()
        .and_then(|r| r.as_ref().ok())
        .ok_or(nvmlReturn_t::NVML_ERROR_UNINITIALIZED)
}

fn status(r: Result<(), nvmlReturn_t>) -> nvmlReturn_t {
    r.err().unwrap_or(OK)
}

fn init() -> nvmlReturn_t {
    let r = STATE.get_or_init(simgpu::state_from_env);
    match r {
        Ok(_) => {
            *INIT_COUNT.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            OK
        }
        Err(e) => {
            eprintln!("{e}");
            nvmlReturn_t::NVML_ERROR_DRIVER_NOT_LOADED
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit() -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    let mut n = INIT_COUNT.lock().unwrap_or_else(|e| e.into_inner());
    if *n == 0 {
        return nvmlReturn_t::NVML_ERROR_UNINITIALIZED;
    }
    *n -= 1;
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(r: nvmlReturn_t) -> *const c_char {
    let s: &'static CStr = match r.0 {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        9 => c"Driver Not Loaded",
        13 => c"Function Not Found",
        15 => c"GPU is lost",
        25 => c"Argument Version Mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

// Device handles are index + 1 (never NULL).
fn dev_of(h: nvmlDevice_t) -> Result<(&'static State, u32), nvmlReturn_t> {
    let s = state()?;
    let i = (h as usize).checked_sub(1).ok_or(BAD_ARG)? as u32;
    if i >= s.ndev() {
        return Err(BAD_ARG);
    }
    if s.lost(i) {
        return Err(nvmlReturn_t::NVML_ERROR_GPU_IS_LOST);
    }
    Ok((s, i))
}

fn handle(i: u32) -> nvmlDevice_t {
    (i as usize + 1) as nvmlDevice_t
}

/// # Safety
/// `p` must be NULL or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> Result<(), nvmlReturn_t> {
    if p.is_null() {
        return Err(BAD_ARG);
    }
    // SAFETY: non-NULL and valid per the contract.
    unsafe { p.write(v) };
    Ok(())
}

fn put_str(dst: *mut c_char, len: c_uint, s: &str) -> Result<(), nvmlReturn_t> {
    if dst.is_null() {
        return Err(BAD_ARG);
    }
    if s.len() + 1 > len as usize {
        return Err(nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the caller gave `len` bytes at `dst`; we write s.len() + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), dst as *mut u8, s.len());
        *dst.add(s.len()) = 0;
    }
    Ok(())
}

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

/// A device query with two required out-parameters: `values` of the device's state, written
/// only when both pointers are given (NVML refuses a NULL one with INVALID_ARGUMENT).
fn put_two<A, B>(
    dev: nvmlDevice_t,
    a: *mut A,
    b: *mut B,
    values: impl FnOnce(&State) -> (A, B),
) -> nvmlReturn_t {
    status(dev_of(dev).and_then(|(s, _)| {
        if a.is_null() || b.is_null() {
            return Err(BAD_ARG);
        }
        let (va, vb) = values(s);
        // SAFETY: both out-pointers from the caller, checked non-NULL.
        unsafe {
            put(a, va)?;
            put(b, vb)
        }
    }))
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

// ---- what monitoring tools ask besides (gpustat, nvitop): H100-like answers ------------------

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

/// Engine utilisation (percent of the last second busy) of device `i`.
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

/// NVML_ERROR_NOT_SUPPORTED for a valid device (its handle's own errors first).
fn not_supported(dev: nvmlDevice_t) -> nvmlReturn_t {
    status(dev_of(dev).and(Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED)))
}

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
