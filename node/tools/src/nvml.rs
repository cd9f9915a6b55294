//! The GPUs as NVML describes them (name, total and used memory), for `cuslice status` and the
//! exporter. NVML is opened at run time: a node tool must work, and say so, where no driver is
//! installed. Only the calls every NVML since 2013 has are used.

use std::ffi::{CStr, c_char, c_uint};

use cuda_abi::{nvmlDevice_t, nvmlMemory_t, nvmlReturn_t};
use libloading::{Library, Symbol};

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    pub uuid: String,
    pub name: String,
    pub total: u64,
    pub used: u64,
}

const LIBRARY: &str = "libnvidia-ml.so.1";

type Init = unsafe extern "C" fn() -> nvmlReturn_t;
type Count = unsafe extern "C" fn(*mut c_uint) -> nvmlReturn_t;
type ByIndex = unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> nvmlReturn_t;
type Text = unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t;
type Memory = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t;

fn check(call: &str, r: nvmlReturn_t) -> Result<(), String> {
    if r == nvmlReturn_t::NVML_SUCCESS {
        Ok(())
    } else {
        Err(format!("{LIBRARY}: {call} returned {}", r.0))
    }
}

/// Every GPU NVML lists, or one line saying why there is no answer.
pub fn gpus() -> Result<Vec<Gpu>, String> {
    // SAFETY: loading NVML runs its initialisers, which have no preconditions.
    let lib = unsafe { Library::new(LIBRARY) }.map_err(|e| {
        format!("{e}; device names and totals are not shown (is the NVIDIA driver installed?)")
    })?;
    // SAFETY: the symbols are NVML's, with the C signatures of nvml.h that the types spell.
    unsafe {
        let init: Symbol<Init> = lib.get(b"nvmlInit_v2\0").map_err(|e| e.to_string())?;
        let shutdown: Symbol<Init> = lib.get(b"nvmlShutdown\0").map_err(|e| e.to_string())?;
        let count: Symbol<Count> = lib
            .get(b"nvmlDeviceGetCount_v2\0")
            .map_err(|e| e.to_string())?;
        let by_index: Symbol<ByIndex> = lib
            .get(b"nvmlDeviceGetHandleByIndex_v2\0")
            .map_err(|e| e.to_string())?;
        let uuid: Symbol<Text> = lib.get(b"nvmlDeviceGetUUID\0").map_err(|e| e.to_string())?;
        let name: Symbol<Text> = lib.get(b"nvmlDeviceGetName\0").map_err(|e| e.to_string())?;
        let memory: Symbol<Memory> = lib
            .get(b"nvmlDeviceGetMemoryInfo\0")
            .map_err(|e| e.to_string())?;
        check("nvmlInit_v2", init())?;
        let result = (|| {
            let mut n: c_uint = 0;
            check("nvmlDeviceGetCount_v2", count(&mut n))?;
            let mut out = Vec::with_capacity(n as usize);
            for i in 0..n {
                let mut h: nvmlDevice_t = std::ptr::null_mut();
                check("nvmlDeviceGetHandleByIndex_v2", by_index(i, &mut h))?;
                let text = |f: &Symbol<Text>, what: &str| -> Result<String, String> {
                    let mut buf = [0 as c_char; 96];
                    check(what, f(h, buf.as_mut_ptr(), buf.len() as c_uint))?;
                    Ok(CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned())
                };
                let mut m = nvmlMemory_t::default();
                check("nvmlDeviceGetMemoryInfo", memory(h, &mut m))?;
                out.push(Gpu {
                    uuid: text(&uuid, "nvmlDeviceGetUUID")?,
                    name: text(&name, "nvmlDeviceGetName")?,
                    total: m.total,
                    used: m.used,
                });
            }
            Ok(out)
        })();
        shutdown();
        result
    }
}
