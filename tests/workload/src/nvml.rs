//! What NVML reports, read the way pynvml and nvidia-smi read it: `dlopen("libnvidia-ml.so.1")`
//! and `dlsym` of each function.

use std::ffi::{CStr, c_char, c_void};

use cuda_abi::*;
use serde_json::{Value, json};

use crate::driver::Library;

pub const LIBNVML: &CStr = c"libnvidia-ml.so.1";

/// NVML_DEVICE_UUID_V2_BUFFER_SIZE and NVML_DEVICE_NAME_V2_BUFFER_SIZE.
const STRING_BUFFER: usize = 96;

macro_rules! nvml_functions {
    ($( $name:ident ( $($t:ty),* ); )*) => {
        /// The NVML entry points used; `None` where the library lacks one.
        #[allow(non_snake_case)]
        struct Nvml {
            $( $name: Option<unsafe extern "C" fn($($t),*) -> nvmlReturn_t>, )*
        }

        impl Nvml {
            fn load(lib: &Library) -> Nvml {
                Nvml {
                    $( $name: {
                        let p = lib.sym(stringify!($name));
                        // SAFETY: a nullable pointer to the function `nvml.h` declares with this
                        // signature.
                        unsafe {
                            std::mem::transmute::<*mut c_void, Option<unsafe extern "C" fn($($t),*) -> nvmlReturn_t>>(p)
                        }
                    }, )*
                }
            }
        }
    };
}

nvml_functions! {
    nvmlInit_v2();
    nvmlShutdown();
    nvmlDeviceGetCount_v2(*mut u32);
    nvmlDeviceGetHandleByIndex_v2(u32, *mut nvmlDevice_t);
    nvmlDeviceGetUUID(nvmlDevice_t, *mut c_char, u32);
    nvmlDeviceGetName(nvmlDevice_t, *mut c_char, u32);
    nvmlDeviceGetMemoryInfo(nvmlDevice_t, *mut nvmlMemory_t);
    nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, *mut nvmlMemory_v2_t);
    nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t, *mut u32, *mut nvmlProcessInfo_v2_t);
    nvmlDeviceGetUtilizationRates(nvmlDevice_t, *mut nvmlUtilization_t);
}

/// An NVML call that did not succeed, as JSON: `{"error": name, "code": n, "call": ...}`
/// (`code` -1 and `missing` when the library does not export the function).
fn error(call: &str, rc: Option<nvmlReturn_t>) -> Value {
    match rc {
        Some(rc) => json!({ "call": call, "code": rc.0, "error": rc.name() }),
        None => json!({ "call": call, "code": -1, "missing": true }),
    }
}

/// Calls `$nvml.$f(args)`, evaluating to `Ok(())` or `Err(json error)`.
macro_rules! call {
    ($nvml:expr, $f:ident ( $($a:expr),* )) => {
        match $nvml.$f {
            // SAFETY: arguments are valid out-pointers/buffers of the sizes passed, and handles
            // NVML itself returned (checked at each call site).
            Some(f) => match unsafe { f($($a),*) } {
                rc if rc == nvmlReturn_t::NVML_SUCCESS => Ok(()),
                rc => Err(error(stringify!($f), Some(rc))),
            },
            None => Err(error(stringify!($f), None)),
        }
    };
}

fn string_of(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn either(r: Result<Value, Value>) -> Value {
    r.unwrap_or_else(|e| e)
}

/// Memory in bytes, or null for NVML's "not available" marker.
fn bytes_or_null(v: u64) -> Value {
    if v == NVML_VALUE_NOT_AVAILABLE {
        Value::Null
    } else {
        json!(v)
    }
}

fn device(nvml: &Nvml, dev: nvmlDevice_t, index: u32) -> Value {
    let mut uuid = [0u8; STRING_BUFFER];
    let uuid = call!(
        nvml,
        nvmlDeviceGetUUID(dev, uuid.as_mut_ptr().cast(), STRING_BUFFER as u32)
    )
    .map(|()| json!(string_of(&uuid)));
    let mut name = [0u8; STRING_BUFFER];
    let name = call!(
        nvml,
        nvmlDeviceGetName(dev, name.as_mut_ptr().cast(), STRING_BUFFER as u32)
    )
    .map(|()| json!(string_of(&name)));
    let mut m1 = nvmlMemory_t::default();
    let memory = call!(nvml, nvmlDeviceGetMemoryInfo(dev, &mut m1))
        .map(|()| json!({"total": m1.total, "free": m1.free, "used": m1.used}));
    let mut m2 = nvmlMemory_v2_t {
        version: NVML_MEMORY_V2,
        ..Default::default()
    };
    let memory_v2 = call!(nvml, nvmlDeviceGetMemoryInfo_v2(dev, &mut m2)).map(
        |()| json!({"total": m2.total, "reserved": m2.reserved, "free": m2.free, "used": m2.used}),
    );
    let mut util = nvmlUtilization_t::default();
    let utilization = call!(nvml, nvmlDeviceGetUtilizationRates(dev, &mut util))
        .map(|()| json!({"gpu": util.gpu, "memory": util.memory}));
    json!({
        "index": index,
        "uuid": either(uuid),
        "name": either(name),
        "memory": either(memory),
        "memory_v2": either(memory_v2),
        "processes": either(processes(nvml, dev)),
        "utilization": either(utilization),
    })
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`: first with count 0 to learn the size.
fn processes(nvml: &Nvml, dev: nvmlDevice_t) -> Result<Value, Value> {
    let mut count: u32 = 0;
    let Some(f) = nvml.nvmlDeviceGetComputeRunningProcesses_v3 else {
        return Err(error("nvmlDeviceGetComputeRunningProcesses_v3", None));
    };
    // SAFETY: count 0 with a null array is the documented size query.
    let rc = unsafe { f(dev, &mut count, std::ptr::null_mut()) };
    if rc == nvmlReturn_t::NVML_SUCCESS && count == 0 {
        return Ok(json!([]));
    }
    if rc != nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE {
        return Err(error("nvmlDeviceGetComputeRunningProcesses_v3", Some(rc)));
    }
    // Room for a few processes that start between the two calls.
    let mut infos = vec![nvmlProcessInfo_v2_t::default(); count as usize + 8];
    let mut count = infos.len() as u32;
    // SAFETY: `infos` holds `count` elements of the _v3 struct.
    let rc = unsafe { f(dev, &mut count, infos.as_mut_ptr()) };
    if rc != nvmlReturn_t::NVML_SUCCESS {
        return Err(error("nvmlDeviceGetComputeRunningProcesses_v3", Some(rc)));
    }
    let list: Vec<Value> = infos
        .iter()
        .take(count as usize)
        .map(|p| json!({"pid": p.pid, "used": bytes_or_null(p.usedGpuMemory)}))
        .collect();
    Ok(Value::Array(list))
}

/// Everything NVML says about every device: `null` when the library cannot be loaded,
/// `{"error": ...}` when `nvmlInit_v2` fails, otherwise `{"devices": [...]}`.
pub fn report() -> Value {
    let lib = match Library::open(LIBNVML) {
        Ok(lib) => lib,
        Err(e) => {
            eprintln!("cuda-workload: {e}");
            return Value::Null;
        }
    };
    let nvml = Nvml::load(&lib);
    if let Err(e) = call!(nvml, nvmlInit_v2()) {
        return json!({ "error": e });
    }
    let mut count: u32 = 0;
    let devices = call!(nvml, nvmlDeviceGetCount_v2(&mut count)).map(|()| {
        let list: Vec<Value> = (0..count)
            .map(|i| {
                let mut dev: nvmlDevice_t = std::ptr::null_mut();
                match call!(nvml, nvmlDeviceGetHandleByIndex_v2(i, &mut dev)) {
                    Ok(()) => device(&nvml, dev, i),
                    Err(e) => json!({ "index": i, "error": e }),
                }
            })
            .collect();
        Value::Array(list)
    });
    if let Err(e) = call!(nvml, nvmlShutdown()) {
        eprintln!("cuda-workload: {e}");
    }
    json!({ "devices": either(devices) })
}
