//! simgpu's `libcuda.so.1`: the CUDA driver API over the simulated device model in the state
//! file named by `SIMGPU_STATE`. A test instrument; see docs/simgpu.md for what it models.
//!
//! Every entry point is exported under its real, versioned name (`cuMemAlloc_v2`,
//! `cuLaunchKernel_ptsz`, ...), and `cuGetProcAddress` / `_v2` answer by symbol, version and
//! flags from the table in `symbols.rs`, which tests/abi-check checks against NVIDIA's headers.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use cuda_abi::*;

mod checkpoint;
mod context;
mod device;
mod driver;
mod export;
mod graph;
mod handles;
mod info;
mod integrity;
mod ipc;
mod launch;
mod limits;
mod memory;
mod module;
mod pointer;
mod pool;
mod ptx;
mod ranges;
mod stream;
/// The `cuGetProcAddress` table, public so that tests/abi-check can check it against NVIDIA's
/// headers (only `#[no_mangle]` entry points are exported from the shared library).
pub mod symbols;
mod unsupported;
mod vmm;

use checkpoint::*;
use context::*;
use device::*;
use graph::*;
use info::*;
use ipc::*;
use launch::*;
use limits::*;
use memory::*;
use module::*;
use pointer::*;
use pool::*;
use stream::*;
use unsupported::*;
use vmm::*;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    if flags != 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    driver::init()
}

fn error_text(e: CUresult) -> Option<(&'static CStr, &'static CStr)> {
    Some(match e.0 {
        0 => (c"CUDA_SUCCESS", c"no error"),
        1 => (c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
        2 => (c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
        3 => (c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
        4 => (c"CUDA_ERROR_DEINITIALIZED", c"driver shutting down"),
        100 => (
            c"CUDA_ERROR_NO_DEVICE",
            c"no CUDA-capable device is detected",
        ),
        101 => (c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
        200 => (
            c"CUDA_ERROR_INVALID_IMAGE",
            c"device kernel image is invalid",
        ),
        201 => (c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
        301 => (c"CUDA_ERROR_FILE_NOT_FOUND", c"file not found"),
        400 => (c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
        500 => (c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
        600 => (c"CUDA_ERROR_NOT_READY", c"device not ready"),
        700 => (
            c"CUDA_ERROR_ILLEGAL_ADDRESS",
            c"an illegal memory access was encountered",
        ),
        215 => (
            c"CUDA_ERROR_UNSUPPORTED_LIMIT",
            c"limit is not supported on this architecture",
        ),
        217 => (
            c"CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
            c"peer access is not supported between these two devices",
        ),
        705 => (
            c"CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
            c"peer access has not been enabled",
        ),
        712 => (
            c"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
            c"part or all of the requested memory range is already mapped",
        ),
        713 => (
            c"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
            c"pointer does not correspond to a registered memory region",
        ),
        800 => (c"CUDA_ERROR_NOT_PERMITTED", c"operation not permitted"),
        801 => (c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
        900 => (
            c"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            c"operation not permitted when stream is capturing",
        ),
        901 => (
            c"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
            c"operation failed due to a previous error during capture",
        ),
        999 => (c"CUDA_ERROR_UNKNOWN", c"unknown error"),
        _ => return None,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(e: CUresult, out: *mut *const c_char) -> CUresult {
    let text = error_text(e);
    // SAFETY: out-pointer from the caller (NULL refused by `put`).
    let r = unsafe { driver::put(out, text.map_or(std::ptr::null(), |t| t.0.as_ptr())) };
    driver::status(r.and(text.map(|_| ()).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(e: CUresult, out: *mut *const c_char) -> CUresult {
    let text = error_text(e);
    // SAFETY: out-pointer from the caller (NULL refused by `put`).
    let r = unsafe { driver::put(out, text.map_or(std::ptr::null(), |t| t.1.as_ptr())) };
    driver::status(r.and(text.map(|_| ()).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)))
}

/// The private tables of NVIDIA's runtime (`export.rs`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    id: *const CUuuid,
) -> CUresult {
    export::get(table, id)
}

fn proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    found: *mut c_int,
) -> CUresult {
    if symbol.is_null() || pfn.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes a NUL-terminated symbol name.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let (ptr, st) = match symbols::lookup(name, version, flags) {
        symbols::Lookup::Found(export) => match exports().get(export) {
            Some(&p) => (p, CU_GET_PROC_ADDRESS_SUCCESS),
            None => (0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
        },
        symbols::Lookup::NotFound => (0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
        symbols::Lookup::VersionNotSufficient => (0, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT),
    };
    // SAFETY: checked non-NULL above; `found` may be NULL.
    unsafe {
        pfn.write(ptr as *mut c_void);
        if !found.is_null() {
            found.write(st);
        }
    }
    if st == CU_GET_PROC_ADDRESS_SUCCESS {
        CUresult::CUDA_SUCCESS
    } else {
        CUresult::CUDA_ERROR_NOT_FOUND
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    proc_address(symbol, pfn, version, flags, std::ptr::null_mut())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    found: *mut c_int,
) -> CUresult {
    proc_address(symbol, pfn, version, flags, found)
}

macro_rules! export_table {
    ($($f:ident),* $(,)?) => {
        /// Every exported entry point by name, for cuGetProcAddress.
        fn exports() -> &'static HashMap<&'static str, usize> {
            static TABLE: OnceLock<HashMap<&'static str, usize>> = OnceLock::new();
            TABLE.get_or_init(|| HashMap::from([$((stringify!($f), $f as *const () as usize)),*]))
        }
    };
}

export_table![
    cuInit,
    cuDriverGetVersion,
    cuGetErrorName,
    cuGetErrorString,
    cuGetProcAddress,
    cuGetProcAddress_v2,
    cuGetExportTable,
    cuLogsRegisterCallback,
    cuLogsUnregisterCallback,
    cuDeviceGet,
    cuDeviceGetCount,
    cuDeviceGetName,
    cuDeviceGetUuid,
    cuDeviceGetUuid_v2,
    cuDeviceTotalMem,
    cuDeviceTotalMem_v2,
    cuDeviceGetAttribute,
    cuDeviceGetPCIBusId,
    cuDeviceGetByPCIBusId,
    cuDeviceComputeCapability,
    cuDeviceGetDefaultMemPool,
    cuDeviceGetMemPool,
    cuDeviceSetMemPool,
    cuDevicePrimaryCtxRetain,
    cuDevicePrimaryCtxRelease,
    cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxGetState,
    cuDevicePrimaryCtxSetFlags,
    cuDevicePrimaryCtxSetFlags_v2,
    cuDevicePrimaryCtxReset,
    cuDevicePrimaryCtxReset_v2,
    cuCtxCreate,
    cuCtxCreate_v2,
    cuCtxCreate_v3,
    cuCtxCreate_v4,
    cuCtxDestroy,
    cuCtxDestroy_v2,
    cuCtxGetCurrent,
    cuCtxSetCurrent,
    cuCtxPushCurrent,
    cuCtxPushCurrent_v2,
    cuCtxPopCurrent,
    cuCtxPopCurrent_v2,
    cuCtxGetDevice,
    cuCtxGetDevice_v2,
    cuCtxSynchronize,
    cuCtxSynchronize_v2,
    cuCtxGetApiVersion,
    cuCtxGetFlags,
    cuMemGetInfo,
    cuMemGetInfo_v2,
    cuMemAlloc,
    cuMemAlloc_v2,
    cuMemAllocPitch,
    cuMemAllocPitch_v2,
    cuMemFree,
    cuMemFree_v2,
    cuMemAllocManaged,
    cuMemAdvise,
    cuMemAdvise_v2,
    cuMemGetAddressRange_v2,
    cuMemAllocHost,
    cuMemAllocHost_v2,
    cuMemFreeHost,
    cuMemHostAlloc,
    cuMemHostRegister,
    cuMemHostRegister_v2,
    cuMemHostUnregister,
    cuMemHostGetDevicePointer,
    cuMemHostGetDevicePointer_v2,
    cuMemcpy,
    cuMemcpy_ptds,
    cuMemcpyAsync,
    cuMemcpyAsync_ptsz,
    cuMemcpyHtoD_v2,
    cuMemcpyHtoD_v2_ptds,
    cuMemcpyDtoH_v2,
    cuMemcpyDtoH_v2_ptds,
    cuMemcpyDtoD_v2,
    cuMemcpyDtoD_v2_ptds,
    cuMemcpyHtoDAsync_v2,
    cuMemcpyHtoDAsync_v2_ptsz,
    cuMemcpyDtoHAsync_v2,
    cuMemcpyDtoHAsync_v2_ptsz,
    cuMemcpyDtoDAsync_v2,
    cuMemcpyDtoDAsync_v2_ptsz,
    cuMemcpyPeer,
    cuMemcpyPeer_ptds,
    cuMemcpyPeerAsync,
    cuMemcpyPeerAsync_ptsz,
    cuMemsetD8_v2,
    cuMemsetD8_v2_ptds,
    cuMemsetD32_v2,
    cuMemsetD32_v2_ptds,
    cuMemsetD8Async,
    cuMemsetD8Async_ptsz,
    cuMemsetD32Async,
    cuMemsetD32Async_ptsz,
    cuArrayCreate,
    cuArrayCreate_v2,
    cuArray3DCreate,
    cuArray3DCreate_v2,
    cuArrayDestroy,
    cuMipmappedArrayCreate,
    cuMipmappedArrayDestroy,
    cuArrayGetMemoryRequirements,
    cuMipmappedArrayGetMemoryRequirements,
    cuMemAllocAsync,
    cuMemAllocAsync_ptsz,
    cuMemAllocFromPoolAsync,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemFreeAsync,
    cuMemFreeAsync_ptsz,
    cuMemPoolCreate,
    cuMemPoolDestroy,
    cuMemPoolGetAttribute,
    cuMemPoolSetAttribute,
    cuMemPoolTrimTo,
    cuMemCreate,
    cuMemRelease,
    cuMemMap,
    cuMemUnmap,
    cuMemAddressReserve,
    cuMemAddressFree,
    cuMemSetAccess,
    cuMemGetAllocationGranularity,
    cuMemExportToShareableHandle,
    cuMemImportFromShareableHandle,
    cuMemGetAllocationPropertiesFromHandle,
    cuMemRetainAllocationHandle,
    cuMulticastCreate,
    cuMulticastAddDevice,
    cuMulticastBindMem,
    cuMulticastUnbind,
    cuDeviceGetDevResource,
    cuDevSmResourceSplitByCount,
    cuDevResourceGenerateDesc,
    cuGreenCtxCreate,
    cuGreenCtxDestroy,
    cuCtxFromGreenCtx,
    cuGreenCtxStreamCreate,
    cuDeviceGetGraphMemAttribute,
    cuDeviceSetGraphMemAttribute,
    cuDeviceGraphMemTrim,
    cuIpcGetMemHandle,
    cuIpcOpenMemHandle,
    cuIpcOpenMemHandle_v2,
    cuIpcCloseMemHandle,
    cuModuleLoad,
    cuModuleLoadData,
    cuModuleLoadDataEx,
    cuModuleLoadFatBinary,
    cuModuleUnload,
    cuModuleGetFunction,
    cuLibraryLoadData,
    cuLibraryUnload,
    cuLibraryGetKernel,
    cuKernelGetFunction,
    cuLibraryGetModule,
    cuKernelGetAttribute,
    cuKernelSetAttribute,
    cuModuleGetLoadingMode,
    cuFuncGetAttribute,
    cuFuncSetAttribute,
    cuStreamCreate,
    cuStreamCreateWithPriority,
    cuCtxGetStreamPriorityRange,
    cuCtxGetLimit,
    cuCtxSetLimit,
    cuCtxGetCacheConfig,
    cuCtxSetCacheConfig,
    cuCtxGetSharedMemConfig,
    cuCtxSetSharedMemConfig,
    cuFuncSetCacheConfig,
    cuFuncSetSharedMemConfig,
    cuDeviceCanAccessPeer,
    cuDeviceGetP2PAttribute,
    cuCtxEnablePeerAccess,
    cuCtxDisablePeerAccess,
    cuOccupancyMaxActiveBlocksPerMultiprocessor,
    cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
    cuOccupancyAvailableDynamicSMemPerBlock,
    cuOccupancyMaxActiveClusters,
    cuOccupancyMaxPotentialClusterSize,
    cuPointerGetAttribute,
    cuPointerGetAttributes,
    cuStreamGetPriority,
    cuStreamGetPriority_ptsz,
    cuStreamGetFlags,
    cuStreamGetFlags_ptsz,
    cuThreadExchangeStreamCaptureMode,
    cuStreamGetCaptureInfo,
    cuStreamGetCaptureInfo_ptsz,
    cuStreamGetCaptureInfo_v2,
    cuStreamGetCaptureInfo_v2_ptsz,
    cuStreamGetCaptureInfo_v3,
    cuStreamGetCaptureInfo_v3_ptsz,
    cuStreamDestroy,
    cuStreamDestroy_v2,
    cuStreamSynchronize,
    cuStreamSynchronize_ptsz,
    cuStreamQuery,
    cuStreamQuery_ptsz,
    cuStreamWriteValue32,
    cuStreamWriteValue32_ptsz,
    cuStreamWriteValue32_v2,
    cuStreamWriteValue32_v2_ptsz,
    cuStreamWaitEvent,
    cuStreamWaitEvent_ptsz,
    cuEventCreate,
    cuEventRecord,
    cuEventRecord_ptsz,
    cuEventRecordWithFlags,
    cuEventRecordWithFlags_ptsz,
    cuEventQuery,
    cuGraphGetNodes,
    cuEventSynchronize,
    cuEventElapsedTime,
    cuEventElapsedTime_v2,
    cuEventDestroy,
    cuEventDestroy_v2,
    cuLaunchKernel,
    cuLaunchKernel_ptsz,
    cuLaunchKernelEx,
    cuLaunchKernelEx_ptsz,
    cuLaunchCooperativeKernel,
    cuLaunchCooperativeKernel_ptsz,
    cuLaunchHostFunc,
    cuLaunchHostFunc_ptsz,
    cuStreamBeginCapture,
    cuStreamBeginCapture_ptsz,
    cuStreamBeginCapture_v2,
    cuStreamBeginCapture_v2_ptsz,
    cuStreamEndCapture,
    cuStreamEndCapture_ptsz,
    cuStreamIsCapturing,
    cuStreamIsCapturing_ptsz,
    cuGraphInstantiate,
    cuGraphInstantiate_v2,
    cuGraphInstantiateWithFlags,
    cuGraphLaunch,
    cuGraphLaunch_ptsz,
    cuGraphExecDestroy,
    cuGraphDestroy,
    cuGraphUpload,
    cuGraphUpload_ptsz,
    cuCheckpointProcessGetRestoreThreadId,
    cuCheckpointProcessGetState,
    cuCheckpointProcessLock,
    cuCheckpointProcessCheckpoint,
    cuCheckpointProcessRestore,
    cuCheckpointProcessUnlock,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_an_entry_point_and_every_entry_point_a_variant() {
        let table = exports();
        for v in symbols::VARIANTS {
            assert!(
                table.contains_key(v.export),
                "{} has no entry point",
                v.export
            );
        }
        for name in table.keys() {
            assert!(
                symbols::VARIANTS.iter().any(|v| v.export == *name),
                "{name} is in no variant"
            );
        }
    }
}
