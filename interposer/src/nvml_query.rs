//! cuslice's own NVML queries, no wrappers: the device's and the processes' memory as the
//! driver reports it, whether a pid is still listed, and the CUDA ordinal of an NVML device. It
//! uses the real entry points only (`real`), so that the membership's sweep and the context
//! measurement can ask NVML without depending on the NVML wrappers (`nvml`).

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_uint, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use cuda_abi::*;
use cuslice_policy::config::gpus::{Gpus, NvmlGpu};
use cuslice_policy::config::{Config, Limits};
use cuslice_state::uuid_string;

use crate::real::{self, Lib};

pub type Nvdev = *mut c_void;

fn init() -> bool {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.load(Ordering::Acquire) {
        return true;
    }
    if !real::ensure(Lib::Nvml) {
        return false;
    }
    let Some(f) = real::nvmlInit_v2() else {
        return false;
    };
    // SAFETY: nvmlInit_v2 takes no arguments; NVML counts initialisations.
    let ok = unsafe { f() } == nvmlReturn_t::NVML_SUCCESS;
    DONE.store(ok, Ordering::Release);
    ok
}

thread_local! {
    /// Set while cuslice itself queries NVML: should the driver's NVML call one of its own
    /// exported functions (which the preload interposes), the wrapper answers untouched instead of
    /// re-entering the slice (whose table lock the query may hold).
    static INTERNAL: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is inside one of cuslice's own NVML queries (the NVML wrappers then
/// answer untouched).
pub(crate) fn in_own_query() -> bool {
    INTERNAL.with(|c| c.get())
}

/// Runs cuslice's own NVML query `f`.
fn internal<R>(f: impl FnOnce() -> R) -> R {
    let was = INTERNAL.with(|c| c.replace(true));
    let r = f();
    INTERNAL.with(|c| c.set(was));
    r
}

fn handle_by_uuid(uuid: &[u8; 16]) -> Option<Nvdev> {
    let f = real::nvmlDeviceGetHandleByUUID()?;
    let s = std::ffi::CString::new(uuid_string(uuid)).ok()?;
    let mut h: Nvdev = std::ptr::null_mut();
    // SAFETY: NUL-terminated UUID string and a valid out-pointer.
    (unsafe { f(s.as_ptr(), &mut h) } == nvmlReturn_t::NVML_SUCCESS).then_some(h)
}

/// What is free on device `uuid` of `physical` bytes, by NVML's used memory.
pub fn device_free(uuid: &[u8; 16], physical: u64) -> Option<u64> {
    Some(physical.saturating_sub(device_used(uuid)?))
}

/// The device's used memory as NVML reports it (all processes), for measuring hidden memory.
pub fn device_used(uuid: &[u8; 16]) -> Option<u64> {
    if !init() {
        return None;
    }
    let h = handle_by_uuid(uuid)?;
    let f = real::nvmlDeviceGetMemoryInfo()?;
    let mut m = nvmlMemory_t {
        total: 0,
        free: 0,
        used: 0,
    };
    // SAFETY: a device handle from NVML and a writable struct of the v1 layout.
    (internal(|| unsafe { f(h, &mut m) }) == nvmlReturn_t::NVML_SUCCESS).then_some(m.used)
}

/// Whether MIG is on for the device (None: NVML cannot say, or does not know the device by
/// this UUID, as for a MIG instance's).
pub fn mig_enabled(uuid: &[u8; 16]) -> Option<bool> {
    if !init() {
        return None;
    }
    let h = handle_by_uuid(uuid)?;
    let Some(f) = real::nvmlDeviceGetMigMode() else {
        // An NVML older than MIG.
        return Some(false);
    };
    let (mut current, mut pending) = (0, 0);
    // SAFETY: a device handle from NVML and two writable words.
    match internal(|| unsafe { f(h, &mut current, &mut pending) }) {
        nvmlReturn_t::NVML_SUCCESS => Some(current != 0),
        // A device without MIG.
        nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED => Some(false),
        _ => None,
    }
}

fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s
        .strip_prefix("GPU-")?
        .bytes()
        .filter(|b| *b != b'-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let pair = std::str::from_utf8(hex.get(2 * i..2 * i + 2)?).ok()?;
        *o = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

/// The UUID of an NVML device.
pub(crate) fn uuid_of(dev: Nvdev) -> Option<[u8; 16]> {
    let f = real::nvmlDeviceGetUUID()?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: a writable buffer of the stated length.
    if unsafe { f(dev, buf.as_mut_ptr(), buf.len() as c_uint) } != nvmlReturn_t::NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML NUL-terminates within the buffer on success.
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().ok()?;
    parse_uuid(s)
}

/// NVML's device handles, in its order.
fn nvml_handles() -> Vec<Nvdev> {
    let (Some(count), Some(by_index)) = (
        real::nvmlDeviceGetCount_v2(),
        real::nvmlDeviceGetHandleByIndex_v2(),
    ) else {
        return Vec::new();
    };
    let mut n: c_uint = 0;
    // SAFETY: valid out-pointer.
    if unsafe { count(&mut n) } != nvmlReturn_t::NVML_SUCCESS {
        return Vec::new();
    }
    (0..n)
        .filter_map(|i| {
            let mut h: Nvdev = std::ptr::null_mut();
            // SAFETY: valid out-pointer; i below the count.
            (unsafe { by_index(i, &mut h) } == nvmlReturn_t::NVML_SUCCESS).then_some(h)
        })
        .collect()
}

/// UUIDs of the devices in NVML's order.
fn nvml_uuids() -> Vec<[u8; 16]> {
    nvml_handles().into_iter().filter_map(uuid_of).collect()
}

/// NVML's GPUs in its order, each with its device node's minor number where NVML says.
fn nvml_gpus() -> Vec<NvmlGpu> {
    let minor_of = real::nvmlDeviceGetMinorNumber();
    nvml_handles()
        .into_iter()
        .filter_map(|h| {
            let uuid = uuid_string(&uuid_of(h)?);
            let minor = minor_of.and_then(|f| {
                let mut m: c_uint = 0;
                // SAFETY: a handle NVML gave and a valid out-pointer.
                (unsafe { f(h, &mut m) } == nvmlReturn_t::NVML_SUCCESS).then_some(m)
            });
            Some(NvmlGpu { uuid, minor })
        })
        .collect()
}

/// The container's GPUs (UUIDs) in the order its per-device settings number them, from the
/// hook's record of them and this process's NVML (which lists the container's GPUs): computed
/// once. Empty where NVML lists none; every GPU then gets the strictest per-device settings.
fn container_order(gpus: &Gpus) -> &'static [String] {
    static ORDER: OnceLock<Vec<String>> = OnceLock::new();
    ORDER.get_or_init(|| {
        let listed = internal(|| if init() { nvml_gpus() } else { Vec::new() });
        let order = gpus.order(&listed, false);
        if order.is_empty() {
            crate::log::warning!(
                "NVML lists none of the container's GPUs, so the slice's per-device settings \
                 cannot be told apart: each GPU is held to the strictest of them"
            );
        }
        order
    })
}

/// The limits for the GPU `uuid`, which this process sees as CUDA ordinal `ordinal`. In a
/// container whose settings name devices by ordinal, by the container's numbering of its GPUs
/// (the hook's record, [`Gpus`]), whatever `CUDA_VISIBLE_DEVICES` this process set for itself;
/// elsewhere by this process's own ordinals.
pub(crate) fn device_limits(config: &Config, ordinal: u32, uuid: &[u8; 16]) -> Limits {
    match config.gpus() {
        Some(g) if !config.mentioned_ordinals().is_empty() => {
            config.limits_of_gpu(&uuid_string(uuid), container_order(g))
        }
        _ => config.limits(ordinal),
    }
}

/// The CUDA ordinal `uuid` has in this process, without asking CUDA: its place in
/// CUDA_VISIBLE_DEVICES (UUIDs, UUID prefixes or NVML indices), or its NVML index.
pub(crate) fn ordinal_of(uuid: &[u8; 16]) -> Option<u32> {
    let all = nvml_uuids();
    let visible: Vec<[u8; 16]> = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) => v
            .split(',')
            .map(str::trim)
            .map_while(|e| {
                if let Ok(i) = e.parse::<usize>() {
                    all.get(i).copied()
                } else {
                    all.iter()
                        .copied()
                        .find(|u| uuid_string(u).starts_with(e) && e.starts_with("GPU-"))
                }
            })
            .collect(),
        Err(_) => all,
    };
    visible.iter().position(|u| u == uuid).map(|i| i as u32)
}

/// The whole per-process list, in a buffer grown until NVML has room for every entry.
pub(crate) fn fetch_all<T>(
    list: impl Fn(*mut c_uint, *mut T) -> nvmlReturn_t,
) -> Result<Vec<T>, nvmlReturn_t> {
    let mut all: Vec<T> = Vec::new();
    loop {
        let mut n = all.capacity().max(16) as c_uint;
        all.reserve(n as usize);
        let r = list(&mut n, all.as_mut_ptr());
        if r == nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE {
            all.reserve(n as usize + 16);
            continue;
        }
        if r != nvmlReturn_t::NVML_SUCCESS {
            return Err(r);
        }
        // SAFETY: NVML initialised `n` entries, within the capacity it was given.
        unsafe { all.set_len((n as usize).min(all.capacity())) };
        return Ok(all);
    }
}

/// Whether the device still lists `pid` among its compute processes: a process that has exited
/// keeps its memory until the driver has torn its contexts down, and NVML lists it until then.
/// None when NVML cannot say (no NVML, or the query failed).
pub fn lists_pid(uuid: &[u8; 16], pid: i32) -> Option<bool> {
    if !init() {
        return None;
    }
    let h = handle_by_uuid(uuid)?;
    let listed =
        |pids: Result<Vec<u32>, nvmlReturn_t>| pids.ok().map(|p| p.contains(&(pid as u32)));
    internal(|| {
        if let Some(f) = real::nvmlDeviceGetComputeRunningProcesses_v3() {
            // SAFETY: a device handle from NVML; `fetch_all` passes buffers of the room it names.
            let all = fetch_all(|c, i: *mut nvmlProcessInfo_v2_t| unsafe { f(h, c, i) });
            listed(all.map(|v| v.iter().map(|p| p.pid).collect()))
        } else {
            let f = real::nvmlDeviceGetComputeRunningProcesses()?;
            // SAFETY: as above, with the v1 entry layout.
            let all = fetch_all(|c, i: *mut nvmlProcessInfo_v1_t| unsafe { f(h, c, i) });
            listed(all.map(|v| v.iter().map(|p| p.pid).collect()))
        }
    })
}

/// The device's compute processes with the memory NVML says each holds: (pid, bytes). None when
/// NVML cannot say.
pub fn process_memory(uuid: &[u8; 16]) -> Option<Vec<(u32, u64)>> {
    if !init() {
        return None;
    }
    let h = handle_by_uuid(uuid)?;
    internal(|| {
        if let Some(f) = real::nvmlDeviceGetComputeRunningProcesses_v3() {
            // SAFETY: a device handle from NVML; `fetch_all` passes buffers of the room it names.
            let all = fetch_all(|c, i: *mut nvmlProcessInfo_v2_t| unsafe { f(h, c, i) });
            all.ok()
                .map(|v| v.iter().map(|p| (p.pid, p.usedGpuMemory)).collect())
        } else {
            let f = real::nvmlDeviceGetComputeRunningProcesses()?;
            // SAFETY: as above, with the v1 entry layout.
            let all = fetch_all(|c, i: *mut nvmlProcessInfo_v1_t| unsafe { f(h, c, i) });
            all.ok()
                .map(|v| v.iter().map(|p| (p.pid, p.usedGpuMemory)).collect())
        }
    })
}
