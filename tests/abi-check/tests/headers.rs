//! Compiles a C program against NVIDIA's `cuda.h` (12.9 and 13.0) and `nvml.h` that prints the
//! size, alignment and field offsets/sizes of every struct in `cuda-abi` and the value of every
//! constant, and compares each line with the Rust definitions.

use abi_check::{Headers, headers_or_skip};
use cuda_abi::*;
use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};
use std::process::Command;

/// One value both sides compute: `key` names it in the C program's output.
struct Check {
    key: String,
    c_expr: String,
    rust: i64,
    /// Compare only against this CUDA version.
    only: Option<&'static str>,
}

/// Size of a field, named through a projection (works for any field type).
fn field_size<T, F>(_project: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

macro_rules! layout {
    ($checks:ident, $ty:ident { $($cfield:literal => $rfield:ident),* $(,)? }) => {{
        let t = stringify!($ty);
        $checks.push(Check {
            key: format!("sizeof({t})"),
            c_expr: format!("sizeof({t})"),
            rust: size_of::<$ty>() as i64,
            only: None,
        });
        $checks.push(Check {
            key: format!("alignof({t})"),
            c_expr: format!("_Alignof({t})"),
            rust: align_of::<$ty>() as i64,
            only: None,
        });
        $(
            $checks.push(Check {
                key: format!("offsetof({t}, {})", $cfield),
                c_expr: format!("offsetof({t}, {})", $cfield),
                rust: offset_of!($ty, $rfield) as i64,
                only: None,
            });
            $checks.push(Check {
                key: format!("sizeof({t}.{})", $cfield),
                c_expr: format!("sizeof((({t} *)0)->{})", $cfield),
                rust: field_size(|s: &$ty| &s.$rfield) as i64,
                only: None,
            });
        )*
    }};
}

/// `constants!(checks, "C_PREFIX", { NAME, ... })` or `constants!(checks, "C_PREFIX", module {
/// NAME, ... })`: the C name is prefix + NAME, the Rust value `NAME` or `module::NAME`.
macro_rules! constants {
    ($checks:ident, $prefix:literal, { $($name:ident),* $(,)? }) => {
        $(
            $checks.push(Check {
                key: concat!($prefix, stringify!($name)).to_string(),
                c_expr: concat!($prefix, stringify!($name)).to_string(),
                rust: $name as i64,
                only: None,
            });
        )*
    };
    ($checks:ident, $prefix:literal, $module:ident { $($name:ident),* $(,)? }) => {
        $(
            $checks.push(Check {
                key: concat!($prefix, stringify!($name)).to_string(),
                c_expr: concat!($prefix, stringify!($name)).to_string(),
                rust: $module::$name as i64,
                only: None,
            });
        )*
    };
}

/// Status codes: `codes!(checks, Type { NAME, ... })` compares `Type::NAME.0`.
macro_rules! codes {
    ($checks:ident, $ty:ident { $($name:ident),* $(,)? }) => {
        $(
            $checks.push(Check {
                key: stringify!($name).to_string(),
                c_expr: stringify!($name).to_string(),
                rust: $ty::$name.0 as i64,
                only: None,
            });
        )*
    };
}

fn checks() -> Vec<Check> {
    let mut c = Vec::new();

    // ---- CUDA structs ----
    layout!(c, CUuuid { "bytes" => bytes });
    layout!(c, CUlaunchConfig {
        "gridDimX" => gridDimX,
        "gridDimY" => gridDimY,
        "gridDimZ" => gridDimZ,
        "blockDimX" => blockDimX,
        "blockDimY" => blockDimY,
        "blockDimZ" => blockDimZ,
        "sharedMemBytes" => sharedMemBytes,
        "hStream" => hStream,
        "attrs" => attrs,
        "numAttrs" => numAttrs,
    });
    layout!(c, CUmemLocation { "type" => type_, "id" => id });
    layout!(c, CUmemAllocationProp {
        "type" => type_,
        "requestedHandleTypes" => requestedHandleTypes,
        "location" => location,
        "win32HandleMetaData" => win32HandleMetaData,
        "allocFlags.compressionType" => compressionType,
        "allocFlags.gpuDirectRDMACapable" => gpuDirectRDMACapable,
        "allocFlags.usage" => usage,
        "allocFlags.reserved" => reserved,
    });
    layout!(c, CUmemAccessDesc { "location" => location, "flags" => flags });
    layout!(c, CUmemPoolProps {
        "allocType" => allocType,
        "handleTypes" => handleTypes,
        "location" => location,
        "win32SecurityAttributes" => win32SecurityAttributes,
        "maxSize" => maxSize,
        "usage" => usage,
        "reserved" => reserved,
    });
    layout!(c, CUDA_ARRAY_DESCRIPTOR {
        "Width" => Width,
        "Height" => Height,
        "Format" => Format,
        "NumChannels" => NumChannels,
    });
    layout!(c, CUDA_ARRAY3D_DESCRIPTOR {
        "Width" => Width,
        "Height" => Height,
        "Depth" => Depth,
        "Format" => Format,
        "NumChannels" => NumChannels,
        "Flags" => Flags,
    });
    layout!(c, CUDA_ARRAY_MEMORY_REQUIREMENTS {
        "size" => size,
        "alignment" => alignment,
        "reserved" => reserved,
    });
    layout!(c, CUipcMemHandle { "reserved" => reserved });

    // ---- NVML structs ----
    layout!(c, nvmlMemory_t { "total" => total, "free" => free, "used" => used });
    layout!(c, nvmlMemory_v2_t {
        "version" => version,
        "total" => total,
        "reserved" => reserved,
        "free" => free,
        "used" => used,
    });
    layout!(c, nvmlProcessInfo_v1_t { "pid" => pid, "usedGpuMemory" => usedGpuMemory });
    layout!(c, nvmlProcessInfo_v2_t {
        "pid" => pid,
        "usedGpuMemory" => usedGpuMemory,
        "gpuInstanceId" => gpuInstanceId,
        "computeInstanceId" => computeInstanceId,
    });
    layout!(c, nvmlUtilization_t { "gpu" => gpu, "memory" => memory });
    layout!(c, nvmlBAR1Memory_t {
        "bar1Total" => bar1Total,
        "bar1Free" => bar1Free,
        "bar1Used" => bar1Used,
    });
    layout!(c, nvmlProcessUtilizationSample_t {
        "pid" => pid,
        "timeStamp" => timeStamp,
        "smUtil" => smUtil,
        "memUtil" => memUtil,
        "encUtil" => encUtil,
        "decUtil" => decUtil,
    });
    layout!(c, nvmlPciInfo_t {
        "busIdLegacy" => busIdLegacy,
        "domain" => domain,
        "bus" => bus,
        "device" => device,
        "pciDeviceId" => pciDeviceId,
        "pciSubSystemId" => pciSubSystemId,
        "busId" => busId,
    });

    // ---- status codes ----
    codes!(
        c,
        CUresult {
            CUDA_SUCCESS,
            CUDA_ERROR_INVALID_VALUE,
            CUDA_ERROR_OUT_OF_MEMORY,
            CUDA_ERROR_NOT_INITIALIZED,
            CUDA_ERROR_DEINITIALIZED,
            CUDA_ERROR_NO_DEVICE,
            CUDA_ERROR_INVALID_DEVICE,
            CUDA_ERROR_INVALID_IMAGE,
            CUDA_ERROR_INVALID_CONTEXT,
            CUDA_ERROR_CONTEXT_ALREADY_CURRENT,
            CUDA_ERROR_ALREADY_MAPPED,
            CUDA_ERROR_NO_BINARY_FOR_GPU,
            CUDA_ERROR_NOT_MAPPED,
            CUDA_ERROR_INVALID_PTX,
            CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
            CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
            CUDA_ERROR_JIT_COMPILATION_DISABLED,
            CUDA_ERROR_INVALID_SOURCE,
            CUDA_ERROR_FILE_NOT_FOUND,
            CUDA_ERROR_INVALID_HANDLE,
            CUDA_ERROR_ILLEGAL_STATE,
            CUDA_ERROR_NOT_FOUND,
            CUDA_ERROR_NOT_READY,
            CUDA_ERROR_ILLEGAL_ADDRESS,
            CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
            CUDA_ERROR_CONTEXT_IS_DESTROYED,
            CUDA_ERROR_NOT_PERMITTED,
            CUDA_ERROR_NOT_SUPPORTED,
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
            CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
            CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
            CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
            CUDA_ERROR_UNKNOWN,
        }
    );
    codes!(
        c,
        nvmlReturn_t {
            NVML_SUCCESS,
            NVML_ERROR_UNINITIALIZED,
            NVML_ERROR_INVALID_ARGUMENT,
            NVML_ERROR_NOT_SUPPORTED,
            NVML_ERROR_NO_PERMISSION,
            NVML_ERROR_NOT_FOUND,
            NVML_ERROR_INSUFFICIENT_SIZE,
            NVML_ERROR_DRIVER_NOT_LOADED,
            NVML_ERROR_FUNCTION_NOT_FOUND,
            NVML_ERROR_GPU_IS_LOST,
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
            NVML_ERROR_UNKNOWN,
        }
    );

    // ---- constants ----
    constants!(c, "", {
        CU_STREAM_LEGACY,
        CU_STREAM_PER_THREAD,
        CU_STREAM_DEFAULT,
        CU_STREAM_NON_BLOCKING,
        CU_LAUNCH_PARAM_END_AS_INT,
        CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT,
        CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT,
        CU_EVENT_DEFAULT,
        CU_EVENT_BLOCKING_SYNC,
        CU_EVENT_DISABLE_TIMING,
        CU_EVENT_INTERPROCESS,
        CU_GET_PROC_ADDRESS_DEFAULT,
        CU_GET_PROC_ADDRESS_LEGACY_STREAM,
        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
        CU_GET_PROC_ADDRESS_SUCCESS,
        CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
        CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
        CU_MEM_LOCATION_TYPE_INVALID,
        CU_MEM_LOCATION_TYPE_DEVICE,
        CU_MEM_LOCATION_TYPE_HOST,
        CU_MEM_LOCATION_TYPE_HOST_NUMA,
        CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT,
        CU_MEM_ALLOCATION_TYPE_PINNED,
        CU_MEM_HANDLE_TYPE_NONE,
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        CU_MEM_ACCESS_FLAGS_PROT_NONE,
        CU_MEM_ACCESS_FLAGS_PROT_READ,
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
        CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
        CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
        CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
        CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
        CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
        CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        CU_POINTER_ATTRIBUTE_CONTEXT,
        CU_MEM_ATTACH_GLOBAL,
        CU_MEM_ATTACH_HOST,
        CU_MEM_ADVISE_SET_READ_MOSTLY,
        CU_MEM_ADVISE_UNSET_READ_MOSTLY,
        CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
        CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION,
        CU_MEM_ADVISE_SET_ACCESSED_BY,
        CU_MEM_ADVISE_UNSET_ACCESSED_BY,
        CU_DEVICE_CPU,
        CU_STREAM_CAPTURE_MODE_GLOBAL,
        CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        CU_STREAM_CAPTURE_MODE_RELAXED,
        CU_STREAM_CAPTURE_STATUS_NONE,
        CU_STREAM_CAPTURE_STATUS_ACTIVE,
        CU_STREAM_CAPTURE_STATUS_INVALIDATED,
        NVML_VALUE_NOT_AVAILABLE,
    });
    constants!(
        c,
        "CU_DEVICE_ATTRIBUTE_",
        attr {
            MAX_THREADS_PER_BLOCK,
            MAX_BLOCK_DIM_X,
            MAX_BLOCK_DIM_Y,
            MAX_BLOCK_DIM_Z,
            MAX_GRID_DIM_X,
            MAX_GRID_DIM_Y,
            MAX_GRID_DIM_Z,
            MAX_SHARED_MEMORY_PER_BLOCK,
            TOTAL_CONSTANT_MEMORY,
            WARP_SIZE,
            MAX_PITCH,
            MAX_REGISTERS_PER_BLOCK,
            CLOCK_RATE,
            TEXTURE_ALIGNMENT,
            MULTIPROCESSOR_COUNT,
            INTEGRATED,
            CAN_MAP_HOST_MEMORY,
            COMPUTE_MODE,
            CONCURRENT_KERNELS,
            ECC_ENABLED,
            PCI_BUS_ID,
            PCI_DEVICE_ID,
            MEMORY_CLOCK_RATE,
            GLOBAL_MEMORY_BUS_WIDTH,
            L2_CACHE_SIZE,
            MAX_THREADS_PER_MULTIPROCESSOR,
            ASYNC_ENGINE_COUNT,
            UNIFIED_ADDRESSING,
            PCI_DOMAIN_ID,
            TEXTURE_PITCH_ALIGNMENT,
            COMPUTE_CAPABILITY_MAJOR,
            COMPUTE_CAPABILITY_MINOR,
            MANAGED_MEMORY,
            MULTI_GPU_BOARD,
            CONCURRENT_MANAGED_ACCESS,
            COOPERATIVE_LAUNCH,
            MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            MAX_BLOCKS_PER_MULTIPROCESSOR,
            MEMORY_POOLS_SUPPORTED,
        }
    );
    // CU_DEVICE_ATTRIBUTE_MAX grows with every release; cuda-abi pins the 13.0 value.
    c.push(Check {
        key: "CU_DEVICE_ATTRIBUTE_MAX".into(),
        c_expr: "CU_DEVICE_ATTRIBUTE_MAX".into(),
        rust: attr::MAX as i64,
        only: Some("13.0"),
    });
    constants!(
        c,
        "CU_AD_FORMAT_",
        array_format {
            UNSIGNED_INT8,
            UNSIGNED_INT16,
            UNSIGNED_INT32,
            SIGNED_INT8,
            SIGNED_INT16,
            SIGNED_INT32,
            HALF,
            FLOAT,
        }
    );
    c.push(Check {
        key: "nvmlMemory_v2".into(),
        c_expr: "nvmlMemory_v2".into(),
        rust: NVML_MEMORY_V2 as i64,
        only: None,
    });
    c.push(Check {
        key: "NVML_TEMPERATURE_GPU".into(),
        c_expr: "NVML_TEMPERATURE_GPU".into(),
        rust: NVML_TEMPERATURE_GPU as i64,
        only: None,
    });
    c
}

/// The C program: one `key value` line per check, values as 64-bit integers (pointer constants
/// such as `CU_STREAM_LEGACY` go through `uintptr_t`; `-1` prints as -1, like `u64::MAX as i64`).
fn c_program(checks: &[Check], version: &str) -> String {
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdint.h>\n#include <stdio.h>\n\
         #include <cuda.h>\n#include <nvml.h>\n\nint main(void) {\n",
    );
    for check in checks
        .iter()
        .filter(|c| c.only.is_none_or(|v| v == version))
    {
        src.push_str(&format!(
            "    printf(\"%s %lld\\n\", \"{}\", (long long)(uintptr_t)({}));\n",
            check.key, check.c_expr
        ));
    }
    src.push_str("    return 0;\n}\n");
    src
}

/// Compiles and runs the program against one CUDA version; returns `key -> value`.
fn c_values(
    headers: &Headers,
    checks: &[Check],
    version: &str,
    dir: &std::path::Path,
) -> Result<BTreeMap<String, i64>, String> {
    let src = dir.join(format!("abi-{version}.c"));
    let exe = dir.join(format!("abi-{version}"));
    std::fs::write(&src, c_program(checks, version)).map_err(|e| e.to_string())?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-std=gnu11")
        .arg("-I")
        .arg(headers.cuda_include(version))
        .arg("-I")
        .arg(headers.nvml_include())
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| format!("running {cc}: {e} (a C compiler is needed for this check)"))?;
    if !out.status.success() {
        return Err(format!(
            "CUDA {version}: {cc} failed on {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let run = Command::new(&exe)
        .output()
        .map_err(|e| format!("running {}: {e}", exe.display()))?;
    if !run.status.success() {
        return Err(format!(
            "CUDA {version}: {} exited with {}",
            exe.display(),
            run.status
        ));
    }
    let text = String::from_utf8(run.stdout).map_err(|e| e.to_string())?;
    let mut values = BTreeMap::new();
    for line in text.lines() {
        let (key, value) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("bad line {line:?}"))?;
        let value = value
            .parse()
            .map_err(|e| format!("bad value in {line:?}: {e}"))?;
        values.insert(key.to_string(), value);
    }
    Ok(values)
}

#[test]
fn cuda_abi_matches_nvidia_headers() {
    let Some(headers) = headers_or_skip("cuda_abi_matches_nvidia_headers") else {
        return;
    };
    let checks = checks();
    let mut keys = std::collections::HashSet::new();
    for check in &checks {
        assert!(
            keys.insert((&check.key, check.only)),
            "duplicate check {}",
            check.key
        );
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let mut problems = Vec::new();
    let mut compared = 0;
    for version in abi_check::CUDA_VERSIONS {
        let values = match c_values(&headers, &checks, version, dir.path()) {
            Ok(values) => values,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        for check in checks
            .iter()
            .filter(|c| c.only.is_none_or(|v| v == version))
        {
            match values.get(&check.key) {
                Some(&c) if c == check.rust => compared += 1,
                Some(&c) => problems.push(format!(
                    "CUDA {version}: {}: header says {c}, cuda-abi says {}",
                    check.key, check.rust
                )),
                None => problems.push(format!(
                    "CUDA {version}: {}: no output from the C program",
                    check.key
                )),
            }
        }
    }
    eprintln!(
        "compared {compared} values ({} checks x {} CUDA versions)",
        checks.len(),
        abi_check::CUDA_VERSIONS.len()
    );
    assert!(
        problems.is_empty(),
        "{} mismatch(es) between cuda-abi and NVIDIA's headers at {}:\n{}",
        problems.len(),
        headers.root.display(),
        problems.join("\n")
    );
}
