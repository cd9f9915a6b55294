//! The GPUs as NVML describes them: name, total and used memory (for `cuslice status` and the
//! exporter), and, for the agent's checks, each device's compute processes with the memory the
//! driver says each holds, and the driver's per-process utilisation samples (for doctor: whether
//! it gives them at all). NVML is opened at run time: a node tool must work, and say so, where no
//! driver is installed. Only calls every NVML since 2013 has are required; the `_v2`/`_v3`
//! process lists are used where present.

use std::ffi::{CStr, c_char, c_int, c_uint};

use cuda_abi::{
    NVML_VALUE_NOT_AVAILABLE, nvmlDevice_t, nvmlMemory_t, nvmlProcessInfo_v1_t,
    nvmlProcessInfo_v2_t, nvmlProcessUtilizationSample_t, nvmlReturn_t, nvmlUtilization_t,
};
use libloading::Library;

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    pub uuid: String,
    pub name: String,
    pub total: u64,
    pub used: u64,
}

/// What the DRA plugin publishes of a GPU: everything a scheduler or a claim's selector may ask
/// about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// NVML's index of the device.
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// Total device memory in bytes.
    pub total: u64,
    /// N of the device node /dev/nvidiaN; None where this NVML cannot say.
    pub minor: Option<u32>,
    /// CUDA compute capability (major, minor); None where this NVML cannot say.
    pub compute_capability: Option<(i32, i32)>,
}

/// A compute process on a device, as the driver counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    /// The pid in the pid namespace NVML was asked from (the host's, for the agent).
    pub pid: u32,
    /// Device memory the driver says the process holds; None where the driver does not say.
    pub used: Option<u64>,
}

/// One per-process utilisation sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub pid: u32,
    /// When the driver took it (wall clock, µs since the epoch).
    pub time_us: u64,
    /// Percent of the sample period the process had a kernel running (whole percent, rounded
    /// down).
    pub sm: u32,
}

const LIBRARY: &str = "libnvidia-ml.so.1";

type Init = unsafe extern "C" fn() -> nvmlReturn_t;
type Count = unsafe extern "C" fn(*mut c_uint) -> nvmlReturn_t;
type ByIndex = unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> nvmlReturn_t;
type Text = unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t;
type Memory = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t;
type Minor = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t;
type Capability = unsafe extern "C" fn(nvmlDevice_t, *mut c_int, *mut c_int) -> nvmlReturn_t;
type SystemText = unsafe extern "C" fn(*mut c_char, c_uint) -> nvmlReturn_t;
type ProcsV1 =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t;
type ProcsV2 =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_v2_t) -> nvmlReturn_t;
type DeviceUtil = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlUtilization_t) -> nvmlReturn_t;
type Util = unsafe extern "C" fn(
    nvmlDevice_t,
    *mut nvmlProcessUtilizationSample_t,
    *mut c_uint,
    u64,
) -> nvmlReturn_t;

fn check(call: &str, r: nvmlReturn_t) -> Result<(), String> {
    if r == nvmlReturn_t::NVML_SUCCESS {
        Ok(())
    } else {
        Err(format!("{LIBRARY}: {call} returned {}", r.0))
    }
}

/// NVML, initialised, until dropped.
pub struct Nvml {
    shutdown: Init,
    count: Count,
    by_index: ByIndex,
    uuid: Text,
    name: Text,
    memory: Memory,
    procs_v1: Option<ProcsV1>,
    procs_v2: Option<ProcsV2>,
    utilisation: Option<Util>,
    device_utilisation: Option<DeviceUtil>,
    minor: Option<Minor>,
    capability: Option<Capability>,
    driver_version: SystemText,
    nvml_version: Option<SystemText>,
    /// Keeps the entry points above valid; dropped last.
    _lib: Library,
}

// SAFETY: NVML is thread-safe (nvml.h: "all NVML functions are thread-safe"), and the struct
// holds only its entry points and the library handle.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

/// A device of this NVML session (its index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device(pub u32);

impl Nvml {
    /// Loads and initialises NVML, or one line saying why not.
    pub fn open() -> Result<Nvml, String> {
        // SAFETY: loading NVML runs its initialisers, which have no preconditions.
        let lib = unsafe { Library::new(LIBRARY) }
            .map_err(|e| format!("{e} (is the NVIDIA driver installed?)"))?;
        fn get<T: Copy>(lib: &Library, name: &[u8]) -> Result<T, String> {
            // SAFETY: every caller names an NVML entry point with the C signature of nvml.h
            // that `T` spells.
            unsafe { lib.get::<T>(name).map(|s| *s).map_err(|e| e.to_string()) }
        }
        let init: Init = get(&lib, b"nvmlInit_v2\0")?;
        let n = Nvml {
            shutdown: get(&lib, b"nvmlShutdown\0")?,
            count: get(&lib, b"nvmlDeviceGetCount_v2\0")?,
            by_index: get(&lib, b"nvmlDeviceGetHandleByIndex_v2\0")?,
            uuid: get(&lib, b"nvmlDeviceGetUUID\0")?,
            name: get(&lib, b"nvmlDeviceGetName\0")?,
            memory: get(&lib, b"nvmlDeviceGetMemoryInfo\0")?,
            procs_v1: get(&lib, b"nvmlDeviceGetComputeRunningProcesses\0").ok(),
            procs_v2: get(&lib, b"nvmlDeviceGetComputeRunningProcesses_v3\0")
                .or_else(|_| get(&lib, b"nvmlDeviceGetComputeRunningProcesses_v2\0"))
                .ok(),
            utilisation: get(&lib, b"nvmlDeviceGetProcessUtilization\0").ok(),
            device_utilisation: get(&lib, b"nvmlDeviceGetUtilizationRates\0").ok(),
            minor: get(&lib, b"nvmlDeviceGetMinorNumber\0").ok(),
            capability: get(&lib, b"nvmlDeviceGetCudaComputeCapability\0").ok(),
            driver_version: get(&lib, b"nvmlSystemGetDriverVersion\0")?,
            nvml_version: get(&lib, b"nvmlSystemGetNVMLVersion\0").ok(),
            _lib: lib,
        };
        // SAFETY: nvmlInit_v2 takes no arguments.
        check("nvmlInit_v2", unsafe { init() })?;
        Ok(n)
    }

    fn handle(&self, d: Device) -> Result<nvmlDevice_t, String> {
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; any index is accepted (an error for a bad one).
        check("nvmlDeviceGetHandleByIndex_v2", unsafe {
            (self.by_index)(d.0, &mut h)
        })?;
        Ok(h)
    }

    /// The devices NVML lists, in its order.
    pub fn devices(&self) -> Result<Vec<Device>, String> {
        let mut n: c_uint = 0;
        // SAFETY: an out-pointer to a local.
        check("nvmlDeviceGetCount_v2", unsafe { (self.count)(&mut n) })?;
        Ok((0..n).map(Device).collect())
    }

    fn text(&self, f: Text, d: Device, what: &str) -> Result<String, String> {
        let h = self.handle(d)?;
        let mut buf = [0 as c_char; 96];
        // SAFETY: a handle from NVML and a buffer of the size passed.
        check(what, unsafe { f(h, buf.as_mut_ptr(), buf.len() as c_uint) })?;
        buf[buf.len() - 1] = 0;
        // SAFETY: NUL-terminated within the buffer (the last byte is forced to NUL).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// The kernel driver's version, e.g. `580.95.05`.
    pub fn driver_version(&self) -> Result<String, String> {
        Self::system_text(self.driver_version, "nvmlSystemGetDriverVersion")
    }

    /// NVML's own version, e.g. `13.580.95.05`.
    pub fn nvml_version(&self) -> Result<String, String> {
        let f = self.nvml_version.ok_or_else(|| {
            format!("{LIBRARY} has no nvmlSystemGetNVMLVersion: too old a driver")
        })?;
        Self::system_text(f, "nvmlSystemGetNVMLVersion")
    }

    fn system_text(f: SystemText, call: &str) -> Result<String, String> {
        let mut buf = [0 as c_char; 96];
        // SAFETY: a buffer of the size passed.
        check(call, unsafe { f(buf.as_mut_ptr(), buf.len() as c_uint) })?;
        buf[buf.len() - 1] = 0;
        // SAFETY: NUL-terminated within the buffer (the last byte is forced to NUL).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// N of the device's node /dev/nvidiaN; None where this NVML cannot say.
    pub fn minor(&self, d: Device) -> Result<Option<u32>, String> {
        let Some(f) = self.minor else {
            return Ok(None);
        };
        let h = self.handle(d)?;
        let mut n: c_uint = 0;
        // SAFETY: a handle from NVML and an out-pointer to a local.
        check("nvmlDeviceGetMinorNumber", unsafe { f(h, &mut n) })?;
        Ok(Some(n))
    }

    /// One device as the DRA plugin publishes it, or one line saying why NVML cannot describe
    /// it (a GPU that fell off the bus answers GPU_IS_LOST, 15).
    pub fn describe(&self, d: Device) -> Result<Description, String> {
        let h = self.handle(d)?;
        let mut m = nvmlMemory_t::default();
        // SAFETY: a handle from NVML and an out-pointer to a local.
        check("nvmlDeviceGetMemoryInfo", unsafe {
            (self.memory)(h, &mut m)
        })?;
        let minor = self.minor(d)?;
        let compute_capability = match self.capability {
            Some(f) => {
                let (mut major, mut minor): (c_int, c_int) = (0, 0);
                // SAFETY: a handle from NVML and two out-pointers to locals.
                check("nvmlDeviceGetCudaComputeCapability", unsafe {
                    f(h, &mut major, &mut minor)
                })?;
                Some((major, minor))
            }
            None => None,
        };
        Ok(Description {
            index: d.0,
            uuid: self.uuid(d)?,
            name: self.text(self.name, d, "nvmlDeviceGetName")?,
            total: m.total,
            minor,
            compute_capability,
        })
    }

    pub fn uuid(&self, d: Device) -> Result<String, String> {
        self.text(self.uuid, d, "nvmlDeviceGetUUID")
    }

    /// Every GPU with its name and memory.
    pub fn gpus(&self) -> Result<Vec<Gpu>, String> {
        self.devices()?
            .into_iter()
            .map(|d| {
                let h = self.handle(d)?;
                let mut m = nvmlMemory_t::default();
                // SAFETY: a handle from NVML and an out-pointer to a local.
                check("nvmlDeviceGetMemoryInfo", unsafe {
                    (self.memory)(h, &mut m)
                })?;
                Ok(Gpu {
                    uuid: self.uuid(d)?,
                    name: self.text(self.name, d, "nvmlDeviceGetName")?,
                    total: m.total,
                    used: m.used,
                })
            })
            .collect()
    }

    /// The device's compute processes and what the driver says each holds.
    pub fn processes(&self, d: Device) -> Result<Vec<ProcessMemory>, String> {
        let h = self.handle(d)?;
        let used = |u: u64| (u != NVML_VALUE_NOT_AVAILABLE).then_some(u);
        let failed = |r: nvmlReturn_t| {
            format!(
                "{LIBRARY}: nvmlDeviceGetComputeRunningProcesses returned {}",
                r.0
            )
        };
        if let Some(f) = self.procs_v2 {
            // SAFETY: a handle from NVML; `fetch_all` passes buffers of the room it names.
            let list = |c: *mut c_uint, i: *mut nvmlProcessInfo_v2_t| unsafe { f(h, c, i) };
            let all = fetch_all(list).map_err(failed)?;
            return Ok(all
                .iter()
                .map(|p| ProcessMemory {
                    pid: p.pid,
                    used: used(p.usedGpuMemory),
                })
                .collect());
        }
        let f = self.procs_v1.ok_or_else(|| {
            format!("{LIBRARY} has no nvmlDeviceGetComputeRunningProcesses: too old a driver")
        })?;
        // SAFETY: as above, with the v1 entry layout.
        let list = |c: *mut c_uint, i: *mut nvmlProcessInfo_v1_t| unsafe { f(h, c, i) };
        let all = fetch_all(list).map_err(failed)?;
        Ok(all
            .iter()
            .map(|p| ProcessMemory {
                pid: p.pid,
                used: used(p.usedGpuMemory),
            })
            .collect())
    }

    /// The driver's per-process utilisation samples newer than `since_us` (wall clock µs; 0:
    /// what the driver still has). Empty when nothing ran since.
    pub fn samples(&self, d: Device, since_us: u64) -> Result<Vec<Sample>, String> {
        self.utilisation(d, since_us).map_err(|e| e.to_string())
    }

    /// The device's utilisation: percent of the driver's last sample period with a kernel
    /// running, any process's (`nvmlDeviceGetUtilizationRates`).
    pub fn device_utilisation(&self, d: Device) -> Result<u32, String> {
        let f = self
            .device_utilisation
            .ok_or_else(|| format!("{LIBRARY} has no nvmlDeviceGetUtilizationRates"))?;
        let h = self.handle(d)?;
        let mut u = nvmlUtilization_t { gpu: 0, memory: 0 };
        // SAFETY: a handle from NVML and a struct to write.
        check("nvmlDeviceGetUtilizationRates", unsafe { f(h, &mut u) })?;
        Ok(u.gpu.min(100))
    }

    /// Whether the driver gives per-process utilisation samples on the device, which decides
    /// how compute limits are metered there (docs/compute.md); Err: it could not be asked.
    pub fn process_samples(&self, d: Device) -> Result<ProcessSamples, String> {
        match self.utilisation(d, 0) {
            Ok(_) => Ok(ProcessSamples::Given),
            Err(UtilError::Returned(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED)) => {
                Ok(ProcessSamples::NotSupported)
            }
            Err(e) => Err(e.to_string()),
        }
    }

    fn utilisation(&self, d: Device, since_us: u64) -> Result<Vec<Sample>, UtilError> {
        let f = self.utilisation.ok_or(UtilError::Missing)?;
        let h = self.handle(d).map_err(UtilError::Device)?;
        let mut out: Vec<nvmlProcessUtilizationSample_t> = Vec::new();
        loop {
            out.reserve(32);
            let mut n = out.capacity() as c_uint;
            // SAFETY: a handle from NVML and a buffer with room for `n` samples.
            let r = unsafe { f(h, out.as_mut_ptr(), &mut n, since_us) };
            match r {
                nvmlReturn_t::NVML_SUCCESS => {
                    // SAFETY: NVML wrote `n` samples, within the room it was given.
                    unsafe { out.set_len((n as usize).min(out.capacity())) };
                    break;
                }
                nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE if n as usize > out.capacity() => {
                    out.reserve(n as usize + 32);
                }
                // No sample newer than `since_us`.
                nvmlReturn_t::NVML_ERROR_NOT_FOUND => break,
                r => return Err(UtilError::Returned(r)),
            }
        }
        Ok(out
            .iter()
            .filter(|s| s.timeStamp > since_us)
            .map(|s| Sample {
                pid: s.pid,
                time_us: s.timeStamp,
                sm: s.smUtil,
            })
            .collect())
    }
}

/// Whether `nvmlDeviceGetProcessUtilization` gives per-process samples on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessSamples {
    /// It answers (SUCCESS, or NOT_FOUND: no sample since the time asked): compute meters read
    /// the driver's samples.
    Given,
    /// It answers NOT_SUPPORTED (MIG instances, some virtual GPUs): compute meters time
    /// launches themselves.
    NotSupported,
}

/// Why `nvmlDeviceGetProcessUtilization` gave no samples.
enum UtilError {
    /// This NVML has no such entry point.
    Missing,
    /// The device's handle could not be had.
    Device(String),
    Returned(nvmlReturn_t),
}

impl std::fmt::Display for UtilError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UtilError::Missing => write!(
                f,
                "{LIBRARY} has no nvmlDeviceGetProcessUtilization: too old a driver"
            ),
            UtilError::Device(e) => f.write_str(e),
            UtilError::Returned(r) => write!(
                f,
                "{LIBRARY}: nvmlDeviceGetProcessUtilization returned {}",
                r.0
            ),
        }
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: balances the nvmlInit_v2 of `open`.
        unsafe { (self.shutdown)() };
    }
}

/// The list protocol: `count` holds the caller's room on entry and the number of entries on
/// return; too little room gives INSUFFICIENT_SIZE with the number needed.
fn fetch_all<T>(
    list: impl Fn(*mut c_uint, *mut T) -> nvmlReturn_t,
) -> Result<Vec<T>, nvmlReturn_t> {
    let mut all: Vec<T> = Vec::new();
    loop {
        all.reserve(16);
        let mut n = all.capacity() as c_uint;
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

/// Every GPU NVML lists, or one line saying why there is no answer.
pub fn gpus() -> Result<Vec<Gpu>, String> {
    Nvml::open()
        .map_err(|e| format!("{e}; device names and totals are not shown"))?
        .gpus()
}
