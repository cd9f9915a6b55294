//! The simulated driver's symbol-version table: which exported entry point
//! `cuGetProcAddress(symbol, &pfn, cudaVersion, flags)` hands back.
//!
//! Facts come from NVIDIA's `cudaTypedefs.h` (the union of CUDA 12.9 and 13.0):
//! every `PFN_<base>_v<version>` typedef is one ordinary ("legacy stream")
//! variant and every `PFN_<base>_v<version>_ptds|_ptsz` one per-thread
//! default-stream variant. The exported name of the ordinary variants is the
//! base name for the oldest, then `<base>_v2`, `<base>_v3`, ... in version
//! order (as `cuda.h`'s `#define cuX cuX_vN` lines confirm for the newest); a
//! per-thread variant at version V exports the name of the ordinary variant
//! current at V plus `_ptds` / `_ptsz`.
//!
//! Only the entry points the simulator implements are listed.
//!
//! Deliberate omissions: the oldest (CUDA 2.x/3.0, 32-bit `CUdeviceptr` ABI)
//! variants of these bases are left out, because the simulator does not
//! export them: `cuMemGetAddressRange` v2000, `cuMemcpyHtoD` v2000,
//! `cuMemcpyDtoH` v2000, `cuMemcpyDtoD` v2000, `cuMemcpyHtoDAsync` v2000,
//! `cuMemcpyDtoHAsync` v2000, `cuMemcpyDtoDAsync` v3000, `cuMemsetD8` v2000 and
//! `cuMemsetD32` v2000. A request for one of those bases at a version older
//! than 3020 therefore answers [`Lookup::VersionNotSufficient`] here, where
//! the real driver would hand back the 32-bit entry point.

use Stream::{Legacy, PerThread};

/// Which default-stream semantics a variant has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The ordinary variant (legacy default stream).
    Legacy,
    /// The `_ptds` / `_ptsz` variant (per-thread default stream).
    PerThread,
}

/// One exported variant of a driver entry point.
#[derive(Debug)]
pub struct Variant {
    /// The base name callers pass to `cuGetProcAddress` ("cuMemAlloc").
    pub base: &'static str,
    /// The CUDA version that introduced this variant (`PFN_<base>_v<version>`).
    pub version: i32,
    /// Legacy or per-thread default stream.
    pub stream: Stream,
    /// The symbol the library exports for this variant ("cuMemAlloc_v2").
    pub export: &'static str,
}

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD_DEFAULT_STREAM: u64 = 2;

const fn v(base: &'static str, version: i32, stream: Stream, export: &'static str) -> Variant {
    Variant {
        base,
        version,
        stream,
        export,
    }
}

/// Every variant the simulator exports, grouped by base name, oldest first.
#[rustfmt::skip]
pub static VARIANTS: &[Variant] = &[
    v("cuInit", 2000, Legacy, "cuInit"),
    v("cuDriverGetVersion", 2020, Legacy, "cuDriverGetVersion"),
    v("cuGetErrorName", 6000, Legacy, "cuGetErrorName"),
    v("cuGetErrorString", 6000, Legacy, "cuGetErrorString"),
    v("cuGetProcAddress", 11030, Legacy, "cuGetProcAddress"),
    v("cuGetProcAddress", 12000, Legacy, "cuGetProcAddress_v2"),
    v("cuGetExportTable", 3000, Legacy, "cuGetExportTable"),
    v("cuLogsRegisterCallback", 12090, Legacy, "cuLogsRegisterCallback"),
    v("cuLogsUnregisterCallback", 12090, Legacy, "cuLogsUnregisterCallback"),
    v("cuDeviceGet", 2000, Legacy, "cuDeviceGet"),
    v("cuDeviceGetCount", 2000, Legacy, "cuDeviceGetCount"),
    v("cuDeviceGetName", 2000, Legacy, "cuDeviceGetName"),
    v("cuDeviceGetUuid", 9020, Legacy, "cuDeviceGetUuid"),
    v("cuDeviceGetUuid", 11040, Legacy, "cuDeviceGetUuid_v2"),
    v("cuDeviceTotalMem", 2000, Legacy, "cuDeviceTotalMem"),
    v("cuDeviceTotalMem", 3020, Legacy, "cuDeviceTotalMem_v2"),
    v("cuDeviceGetAttribute", 2000, Legacy, "cuDeviceGetAttribute"),
    v("cuDeviceGetPCIBusId", 4010, Legacy, "cuDeviceGetPCIBusId"),
    v("cuDeviceGetByPCIBusId", 4010, Legacy, "cuDeviceGetByPCIBusId"),
    v("cuDeviceComputeCapability", 2000, Legacy, "cuDeviceComputeCapability"),
    v("cuDeviceGetDefaultMemPool", 11020, Legacy, "cuDeviceGetDefaultMemPool"),
    v("cuDeviceGetMemPool", 11020, Legacy, "cuDeviceGetMemPool"),
    v("cuDeviceSetMemPool", 11020, Legacy, "cuDeviceSetMemPool"),
    v("cuDevicePrimaryCtxRetain", 7000, Legacy, "cuDevicePrimaryCtxRetain"),
    v("cuDevicePrimaryCtxRelease", 7000, Legacy, "cuDevicePrimaryCtxRelease"),
    v("cuDevicePrimaryCtxRelease", 11000, Legacy, "cuDevicePrimaryCtxRelease_v2"),
    v("cuDevicePrimaryCtxGetState", 7000, Legacy, "cuDevicePrimaryCtxGetState"),
    v("cuDevicePrimaryCtxSetFlags", 7000, Legacy, "cuDevicePrimaryCtxSetFlags"),
    v("cuDevicePrimaryCtxSetFlags", 11000, Legacy, "cuDevicePrimaryCtxSetFlags_v2"),
    v("cuDevicePrimaryCtxReset", 7000, Legacy, "cuDevicePrimaryCtxReset"),
    v("cuDevicePrimaryCtxReset", 11000, Legacy, "cuDevicePrimaryCtxReset_v2"),
    v("cuCtxCreate", 2000, Legacy, "cuCtxCreate"),
    v("cuCtxCreate", 3020, Legacy, "cuCtxCreate_v2"),
    v("cuCtxCreate", 11040, Legacy, "cuCtxCreate_v3"),
    v("cuCtxCreate", 12050, Legacy, "cuCtxCreate_v4"),
    v("cuCtxDestroy", 2000, Legacy, "cuCtxDestroy"),
    v("cuCtxDestroy", 4000, Legacy, "cuCtxDestroy_v2"),
    v("cuCtxGetCurrent", 4000, Legacy, "cuCtxGetCurrent"),
    v("cuCtxSetCurrent", 4000, Legacy, "cuCtxSetCurrent"),
    v("cuCtxPushCurrent", 2000, Legacy, "cuCtxPushCurrent"),
    v("cuCtxPushCurrent", 4000, Legacy, "cuCtxPushCurrent_v2"),
    v("cuCtxPopCurrent", 2000, Legacy, "cuCtxPopCurrent"),
    v("cuCtxPopCurrent", 4000, Legacy, "cuCtxPopCurrent_v2"),
    v("cuCtxGetDevice", 2000, Legacy, "cuCtxGetDevice"),
    v("cuCtxGetDevice", 13000, Legacy, "cuCtxGetDevice_v2"),
    v("cuCtxSynchronize", 2000, Legacy, "cuCtxSynchronize"),
    v("cuCtxSynchronize", 13000, Legacy, "cuCtxSynchronize_v2"),
    v("cuCtxGetApiVersion", 3020, Legacy, "cuCtxGetApiVersion"),
    v("cuCtxGetFlags", 7000, Legacy, "cuCtxGetFlags"),
    v("cuMemGetInfo", 2000, Legacy, "cuMemGetInfo"),
    v("cuMemGetInfo", 3020, Legacy, "cuMemGetInfo_v2"),
    v("cuMemAlloc", 2000, Legacy, "cuMemAlloc"),
    v("cuMemAlloc", 3020, Legacy, "cuMemAlloc_v2"),
    v("cuMemAllocPitch", 2000, Legacy, "cuMemAllocPitch"),
    v("cuMemAllocPitch", 3020, Legacy, "cuMemAllocPitch_v2"),
    v("cuMemFree", 2000, Legacy, "cuMemFree"),
    v("cuMemFree", 3020, Legacy, "cuMemFree_v2"),
    v("cuMemAllocManaged", 6000, Legacy, "cuMemAllocManaged"),
    v("cuMemAdvise", 8000, Legacy, "cuMemAdvise"),
    v("cuMemAdvise", 12020, Legacy, "cuMemAdvise_v2"),
    // Omitted: cuMemGetAddressRange v2000 (export "cuMemGetAddressRange", 32-bit ABI);
    // requests below 3020 answer VersionNotSufficient.
    v("cuMemGetAddressRange", 3020, Legacy, "cuMemGetAddressRange_v2"),
    v("cuMemAllocHost", 2000, Legacy, "cuMemAllocHost"),
    v("cuMemAllocHost", 3020, Legacy, "cuMemAllocHost_v2"),
    v("cuMemFreeHost", 2000, Legacy, "cuMemFreeHost"),
    v("cuMemHostAlloc", 2020, Legacy, "cuMemHostAlloc"),
    v("cuMemHostRegister", 4000, Legacy, "cuMemHostRegister"),
    v("cuMemHostRegister", 6050, Legacy, "cuMemHostRegister_v2"),
    v("cuMemHostUnregister", 4000, Legacy, "cuMemHostUnregister"),
    v("cuMemHostGetDevicePointer", 2020, Legacy, "cuMemHostGetDevicePointer"),
    v("cuMemHostGetDevicePointer", 3020, Legacy, "cuMemHostGetDevicePointer_v2"),
    v("cuMemcpy", 4000, Legacy, "cuMemcpy"),
    v("cuMemcpy", 7000, PerThread, "cuMemcpy_ptds"),
    v("cuMemcpyAsync", 4000, Legacy, "cuMemcpyAsync"),
    v("cuMemcpyAsync", 7000, PerThread, "cuMemcpyAsync_ptsz"),
    // Omitted: the 32-bit-ABI originals cuMemcpyHtoD/DtoH/DtoD/HtoDAsync/DtoHAsync
    // (v2000), cuMemcpyDtoDAsync (v3000), cuMemsetD8/D32 (v2000). Requests for these
    // bases below 3020 answer VersionNotSufficient.
    v("cuMemcpyHtoD", 3020, Legacy, "cuMemcpyHtoD_v2"),
    v("cuMemcpyHtoD", 7000, PerThread, "cuMemcpyHtoD_v2_ptds"),
    v("cuMemcpyDtoH", 3020, Legacy, "cuMemcpyDtoH_v2"),
    v("cuMemcpyDtoH", 7000, PerThread, "cuMemcpyDtoH_v2_ptds"),
    v("cuMemcpyDtoD", 3020, Legacy, "cuMemcpyDtoD_v2"),
    v("cuMemcpyDtoD", 7000, PerThread, "cuMemcpyDtoD_v2_ptds"),
    v("cuMemcpyHtoDAsync", 3020, Legacy, "cuMemcpyHtoDAsync_v2"),
    v("cuMemcpyHtoDAsync", 7000, PerThread, "cuMemcpyHtoDAsync_v2_ptsz"),
    v("cuMemcpyDtoHAsync", 3020, Legacy, "cuMemcpyDtoHAsync_v2"),
    v("cuMemcpyDtoHAsync", 7000, PerThread, "cuMemcpyDtoHAsync_v2_ptsz"),
    v("cuMemcpyDtoDAsync", 3020, Legacy, "cuMemcpyDtoDAsync_v2"),
    v("cuMemcpyDtoDAsync", 7000, PerThread, "cuMemcpyDtoDAsync_v2_ptsz"),
    v("cuMemcpyPeer", 4000, Legacy, "cuMemcpyPeer"),
    v("cuMemcpyPeer", 7000, PerThread, "cuMemcpyPeer_ptds"),
    v("cuMemcpyPeerAsync", 4000, Legacy, "cuMemcpyPeerAsync"),
    v("cuMemcpyPeerAsync", 7000, PerThread, "cuMemcpyPeerAsync_ptsz"),
    v("cuMemsetD8", 3020, Legacy, "cuMemsetD8_v2"),
    v("cuMemsetD8", 7000, PerThread, "cuMemsetD8_v2_ptds"),
    v("cuMemsetD32", 3020, Legacy, "cuMemsetD32_v2"),
    v("cuMemsetD32", 7000, PerThread, "cuMemsetD32_v2_ptds"),
    v("cuMemsetD8Async", 3020, Legacy, "cuMemsetD8Async"),
    v("cuMemsetD8Async", 7000, PerThread, "cuMemsetD8Async_ptsz"),
    v("cuMemsetD32Async", 3020, Legacy, "cuMemsetD32Async"),
    v("cuMemsetD32Async", 7000, PerThread, "cuMemsetD32Async_ptsz"),
    v("cuArrayCreate", 2000, Legacy, "cuArrayCreate"),
    v("cuArrayCreate", 3020, Legacy, "cuArrayCreate_v2"),
    v("cuArray3DCreate", 2000, Legacy, "cuArray3DCreate"),
    v("cuArray3DCreate", 3020, Legacy, "cuArray3DCreate_v2"),
    v("cuArrayDestroy", 2000, Legacy, "cuArrayDestroy"),
    v("cuMipmappedArrayCreate", 5000, Legacy, "cuMipmappedArrayCreate"),
    v("cuMipmappedArrayDestroy", 5000, Legacy, "cuMipmappedArrayDestroy"),
    v("cuArrayGetMemoryRequirements", 11060, Legacy, "cuArrayGetMemoryRequirements"),
    v("cuMipmappedArrayGetMemoryRequirements", 11060, Legacy, "cuMipmappedArrayGetMemoryRequirements"),
    v("cuMemAllocAsync", 11020, Legacy, "cuMemAllocAsync"),
    v("cuMemAllocAsync", 11020, PerThread, "cuMemAllocAsync_ptsz"),
    v("cuMemAllocFromPoolAsync", 11020, Legacy, "cuMemAllocFromPoolAsync"),
    v("cuMemAllocFromPoolAsync", 11020, PerThread, "cuMemAllocFromPoolAsync_ptsz"),
    v("cuMemFreeAsync", 11020, Legacy, "cuMemFreeAsync"),
    v("cuMemFreeAsync", 11020, PerThread, "cuMemFreeAsync_ptsz"),
    v("cuMemPoolCreate", 11020, Legacy, "cuMemPoolCreate"),
    v("cuMemPoolDestroy", 11020, Legacy, "cuMemPoolDestroy"),
    v("cuMemPoolGetAttribute", 11020, Legacy, "cuMemPoolGetAttribute"),
    v("cuMemPoolSetAttribute", 11020, Legacy, "cuMemPoolSetAttribute"),
    v("cuMemPoolTrimTo", 11020, Legacy, "cuMemPoolTrimTo"),
    v("cuMemCreate", 10020, Legacy, "cuMemCreate"),
    v("cuMemRelease", 10020, Legacy, "cuMemRelease"),
    v("cuMemMap", 10020, Legacy, "cuMemMap"),
    v("cuMemUnmap", 10020, Legacy, "cuMemUnmap"),
    v("cuMemAddressReserve", 10020, Legacy, "cuMemAddressReserve"),
    v("cuMemAddressFree", 10020, Legacy, "cuMemAddressFree"),
    v("cuMemSetAccess", 10020, Legacy, "cuMemSetAccess"),
    v("cuMemGetAllocationGranularity", 10020, Legacy, "cuMemGetAllocationGranularity"),
    v("cuMemExportToShareableHandle", 10020, Legacy, "cuMemExportToShareableHandle"),
    v("cuMemImportFromShareableHandle", 10020, Legacy, "cuMemImportFromShareableHandle"),
    v("cuMemGetAllocationPropertiesFromHandle", 10020, Legacy, "cuMemGetAllocationPropertiesFromHandle"),
    v("cuMemRetainAllocationHandle", 11000, Legacy, "cuMemRetainAllocationHandle"),
    v("cuMulticastCreate", 12010, Legacy, "cuMulticastCreate"),
    v("cuMulticastAddDevice", 12010, Legacy, "cuMulticastAddDevice"),
    v("cuMulticastBindMem", 12010, Legacy, "cuMulticastBindMem"),
    v("cuMulticastUnbind", 12010, Legacy, "cuMulticastUnbind"),
    v("cuDeviceGetDevResource", 12040, Legacy, "cuDeviceGetDevResource"),
    v("cuDevSmResourceSplitByCount", 12040, Legacy, "cuDevSmResourceSplitByCount"),
    v("cuDevResourceGenerateDesc", 12040, Legacy, "cuDevResourceGenerateDesc"),
    v("cuGreenCtxCreate", 12040, Legacy, "cuGreenCtxCreate"),
    v("cuGreenCtxDestroy", 12040, Legacy, "cuGreenCtxDestroy"),
    v("cuCtxFromGreenCtx", 12040, Legacy, "cuCtxFromGreenCtx"),
    v("cuGreenCtxStreamCreate", 12050, Legacy, "cuGreenCtxStreamCreate"),
    v("cuDeviceGetGraphMemAttribute", 11040, Legacy, "cuDeviceGetGraphMemAttribute"),
    v("cuDeviceSetGraphMemAttribute", 11040, Legacy, "cuDeviceSetGraphMemAttribute"),
    v("cuDeviceGraphMemTrim", 11040, Legacy, "cuDeviceGraphMemTrim"),
    v("cuIpcGetMemHandle", 4010, Legacy, "cuIpcGetMemHandle"),
    v("cuIpcOpenMemHandle", 4010, Legacy, "cuIpcOpenMemHandle"),
    v("cuIpcOpenMemHandle", 11000, Legacy, "cuIpcOpenMemHandle_v2"),
    v("cuIpcCloseMemHandle", 4010, Legacy, "cuIpcCloseMemHandle"),
    v("cuModuleLoad", 2000, Legacy, "cuModuleLoad"),
    v("cuModuleLoadData", 2000, Legacy, "cuModuleLoadData"),
    v("cuModuleLoadDataEx", 2010, Legacy, "cuModuleLoadDataEx"),
    v("cuModuleLoadFatBinary", 2000, Legacy, "cuModuleLoadFatBinary"),
    v("cuModuleUnload", 2000, Legacy, "cuModuleUnload"),
    v("cuModuleGetFunction", 2000, Legacy, "cuModuleGetFunction"),
    v("cuLibraryLoadData", 12000, Legacy, "cuLibraryLoadData"),
    v("cuLibraryUnload", 12000, Legacy, "cuLibraryUnload"),
    v("cuLibraryGetKernel", 12000, Legacy, "cuLibraryGetKernel"),
    v("cuKernelGetFunction", 12000, Legacy, "cuKernelGetFunction"),
    v("cuLibraryGetModule", 12000, Legacy, "cuLibraryGetModule"),
    v("cuKernelGetAttribute", 12000, Legacy, "cuKernelGetAttribute"),
    v("cuKernelSetAttribute", 12000, Legacy, "cuKernelSetAttribute"),
    v("cuModuleGetLoadingMode", 11070, Legacy, "cuModuleGetLoadingMode"),
    v("cuFuncGetAttribute", 2020, Legacy, "cuFuncGetAttribute"),
    v("cuFuncSetAttribute", 9000, Legacy, "cuFuncSetAttribute"),
    v("cuStreamCreate", 2000, Legacy, "cuStreamCreate"),
    v("cuStreamCreateWithPriority", 5050, Legacy, "cuStreamCreateWithPriority"),
    v("cuCtxGetStreamPriorityRange", 5050, Legacy, "cuCtxGetStreamPriorityRange"),
    v("cuCtxGetLimit", 3010, Legacy, "cuCtxGetLimit"),
    v("cuCtxSetLimit", 3010, Legacy, "cuCtxSetLimit"),
    v("cuCtxGetCacheConfig", 3020, Legacy, "cuCtxGetCacheConfig"),
    v("cuCtxSetCacheConfig", 3020, Legacy, "cuCtxSetCacheConfig"),
    v("cuCtxGetSharedMemConfig", 4020, Legacy, "cuCtxGetSharedMemConfig"),
    v("cuCtxSetSharedMemConfig", 4020, Legacy, "cuCtxSetSharedMemConfig"),
    v("cuFuncSetCacheConfig", 3000, Legacy, "cuFuncSetCacheConfig"),
    v("cuFuncSetSharedMemConfig", 4020, Legacy, "cuFuncSetSharedMemConfig"),
    v("cuDeviceCanAccessPeer", 4000, Legacy, "cuDeviceCanAccessPeer"),
    v("cuDeviceGetP2PAttribute", 8000, Legacy, "cuDeviceGetP2PAttribute"),
    v("cuCtxEnablePeerAccess", 4000, Legacy, "cuCtxEnablePeerAccess"),
    v("cuCtxDisablePeerAccess", 4000, Legacy, "cuCtxDisablePeerAccess"),
    v("cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050, Legacy, "cuOccupancyMaxActiveBlocksPerMultiprocessor"),
    v("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000, Legacy, "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"),
    v("cuOccupancyAvailableDynamicSMemPerBlock", 10020, Legacy, "cuOccupancyAvailableDynamicSMemPerBlock"),
    v("cuOccupancyMaxActiveClusters", 11070, Legacy, "cuOccupancyMaxActiveClusters"),
    v("cuOccupancyMaxPotentialClusterSize", 11070, Legacy, "cuOccupancyMaxPotentialClusterSize"),
    v("cuPointerGetAttribute", 4000, Legacy, "cuPointerGetAttribute"),
    v("cuPointerGetAttributes", 7000, Legacy, "cuPointerGetAttributes"),
    v("cuStreamGetPriority", 5050, Legacy, "cuStreamGetPriority"),
    v("cuStreamGetPriority", 7000, PerThread, "cuStreamGetPriority_ptsz"),
    v("cuStreamGetFlags", 5050, Legacy, "cuStreamGetFlags"),
    v("cuStreamGetFlags", 7000, PerThread, "cuStreamGetFlags_ptsz"),
    v("cuThreadExchangeStreamCaptureMode", 10010, Legacy, "cuThreadExchangeStreamCaptureMode"),
    v("cuStreamGetCaptureInfo", 10010, Legacy, "cuStreamGetCaptureInfo"),
    v("cuStreamGetCaptureInfo", 10010, PerThread, "cuStreamGetCaptureInfo_ptsz"),
    v("cuStreamGetCaptureInfo", 11030, Legacy, "cuStreamGetCaptureInfo_v2"),
    v("cuStreamGetCaptureInfo", 11030, PerThread, "cuStreamGetCaptureInfo_v2_ptsz"),
    v("cuStreamGetCaptureInfo", 12030, Legacy, "cuStreamGetCaptureInfo_v3"),
    v("cuStreamGetCaptureInfo", 12030, PerThread, "cuStreamGetCaptureInfo_v3_ptsz"),
    v("cuStreamDestroy", 2000, Legacy, "cuStreamDestroy"),
    v("cuStreamDestroy", 4000, Legacy, "cuStreamDestroy_v2"),
    v("cuStreamSynchronize", 2000, Legacy, "cuStreamSynchronize"),
    v("cuStreamSynchronize", 7000, PerThread, "cuStreamSynchronize_ptsz"),
    v("cuStreamQuery", 2000, Legacy, "cuStreamQuery"),
    v("cuStreamQuery", 7000, PerThread, "cuStreamQuery_ptsz"),
    v("cuStreamWriteValue32", 8000, Legacy, "cuStreamWriteValue32"),
    v("cuStreamWriteValue32", 8000, PerThread, "cuStreamWriteValue32_ptsz"),
    v("cuStreamWriteValue32", 11070, Legacy, "cuStreamWriteValue32_v2"),
    v("cuStreamWriteValue32", 11070, PerThread, "cuStreamWriteValue32_v2_ptsz"),
    v("cuStreamWaitEvent", 3020, Legacy, "cuStreamWaitEvent"),
    v("cuStreamWaitEvent", 7000, PerThread, "cuStreamWaitEvent_ptsz"),
    v("cuEventCreate", 2000, Legacy, "cuEventCreate"),
    v("cuEventRecord", 2000, Legacy, "cuEventRecord"),
    v("cuEventRecord", 7000, PerThread, "cuEventRecord_ptsz"),
    v("cuEventRecordWithFlags", 11010, Legacy, "cuEventRecordWithFlags"),
    v("cuEventRecordWithFlags", 11010, PerThread, "cuEventRecordWithFlags_ptsz"),
    v("cuEventQuery", 2000, Legacy, "cuEventQuery"),
    v("cuGraphGetNodes", 10000, Legacy, "cuGraphGetNodes"),
    v("cuEventSynchronize", 2000, Legacy, "cuEventSynchronize"),
    v("cuEventElapsedTime", 2000, Legacy, "cuEventElapsedTime"),
    v("cuEventElapsedTime", 12080, Legacy, "cuEventElapsedTime_v2"),
    v("cuEventDestroy", 2000, Legacy, "cuEventDestroy"),
    v("cuEventDestroy", 4000, Legacy, "cuEventDestroy_v2"),
    v("cuLaunchKernel", 4000, Legacy, "cuLaunchKernel"),
    v("cuLaunchKernel", 7000, PerThread, "cuLaunchKernel_ptsz"),
    v("cuLaunchKernelEx", 11060, Legacy, "cuLaunchKernelEx"),
    v("cuLaunchKernelEx", 11060, PerThread, "cuLaunchKernelEx_ptsz"),
    v("cuLaunchCooperativeKernel", 9000, Legacy, "cuLaunchCooperativeKernel"),
    v("cuLaunchCooperativeKernel", 9000, PerThread, "cuLaunchCooperativeKernel_ptsz"),
    v("cuLaunchHostFunc", 10000, Legacy, "cuLaunchHostFunc"),
    v("cuLaunchHostFunc", 10000, PerThread, "cuLaunchHostFunc_ptsz"),
    v("cuStreamBeginCapture", 10000, Legacy, "cuStreamBeginCapture"),
    v("cuStreamBeginCapture", 10000, PerThread, "cuStreamBeginCapture_ptsz"),
    v("cuStreamBeginCapture", 10010, Legacy, "cuStreamBeginCapture_v2"),
    v("cuStreamBeginCapture", 10010, PerThread, "cuStreamBeginCapture_v2_ptsz"),
    v("cuStreamEndCapture", 10000, Legacy, "cuStreamEndCapture"),
    v("cuStreamEndCapture", 10000, PerThread, "cuStreamEndCapture_ptsz"),
    v("cuStreamIsCapturing", 10000, Legacy, "cuStreamIsCapturing"),
    v("cuStreamIsCapturing", 10000, PerThread, "cuStreamIsCapturing_ptsz"),
    // The CUDA 10/11 ABI (error node and log buffer); cuda.h 12+ maps the name to
    // cuGraphInstantiateWithFlags, a base of its own.
    v("cuGraphInstantiate", 10000, Legacy, "cuGraphInstantiate"),
    v("cuGraphInstantiate", 11000, Legacy, "cuGraphInstantiate_v2"),
    v("cuGraphInstantiateWithFlags", 11040, Legacy, "cuGraphInstantiateWithFlags"),
    v("cuGraphLaunch", 10000, Legacy, "cuGraphLaunch"),
    v("cuGraphLaunch", 10000, PerThread, "cuGraphLaunch_ptsz"),
    v("cuGraphExecDestroy", 10000, Legacy, "cuGraphExecDestroy"),
    v("cuGraphDestroy", 10000, Legacy, "cuGraphDestroy"),
    v("cuGraphUpload", 11010, Legacy, "cuGraphUpload"),
    v("cuGraphUpload", 11010, PerThread, "cuGraphUpload_ptsz"),
    v("cuCheckpointProcessGetRestoreThreadId", 12080, Legacy, "cuCheckpointProcessGetRestoreThreadId"),
    v("cuCheckpointProcessGetState", 12080, Legacy, "cuCheckpointProcessGetState"),
    v("cuCheckpointProcessLock", 12080, Legacy, "cuCheckpointProcessLock"),
    v("cuCheckpointProcessCheckpoint", 12080, Legacy, "cuCheckpointProcessCheckpoint"),
    v("cuCheckpointProcessRestore", 12080, Legacy, "cuCheckpointProcessRestore"),
    v("cuCheckpointProcessUnlock", 12080, Legacy, "cuCheckpointProcessUnlock"),
];

/// The answer of [`lookup`].
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The exported symbol to hand back.
    Found(&'static str),
    /// Unknown base name (`CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`).
    NotFound,
    /// Known base name, but every variant is newer than the requested version
    /// (`CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`).
    VersionNotSufficient,
}

/// Resolves a `cuGetProcAddress` request: the newest variant of `symbol`
/// introduced at or before `cuda_version`; with
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` in `flags`, the newest
/// per-thread variant at or before `cuda_version` if there is one, otherwise
/// the ordinary one.
pub fn lookup(symbol: &str, cuda_version: i32, flags: u64) -> Lookup {
    let per_thread = flags & PER_THREAD_DEFAULT_STREAM != 0;
    let mut known = false;
    let mut legacy: Option<&Variant> = None;
    let mut threaded: Option<&Variant> = None;
    for var in VARIANTS.iter().filter(|var| var.base == symbol) {
        known = true;
        if var.version > cuda_version {
            continue;
        }
        let slot = match var.stream {
            Stream::Legacy => &mut legacy,
            Stream::PerThread => &mut threaded,
        };
        if slot.is_none_or(|best| var.version > best.version) {
            *slot = Some(var);
        }
    }
    let chosen = if per_thread {
        threaded.or(legacy)
    } else {
        legacy
    };
    match chosen {
        Some(var) => Lookup::Found(var.export),
        None if known => Lookup::VersionNotSufficient,
        None => Lookup::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const REQUESTS: [(&str, &str); 2] = [
        (
            "cudart-12.9",
            include_str!("../../../data/cudart-12.9-getprocaddress.txt"),
        ),
        (
            "cudart-13.0",
            include_str!("../../../data/cudart-13.0-getprocaddress.txt"),
        ),
    ];

    /// Parses a request list: a comment line, then `symbol version flags`
    /// (the first request has an empty symbol, so its line has two fields).
    fn requests(text: &str) -> Vec<(&str, i32, u64)> {
        text.lines()
            .skip(1)
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let (symbol, rest) = match fields.len() {
                    3 => (fields[0], &fields[1..]),
                    2 => ("", &fields[..]),
                    _ => panic!("malformed request line {line:?}"),
                };
                (
                    symbol,
                    rest[0].parse().expect("version"),
                    rest[1].parse().expect("flags"),
                )
            })
            .collect()
    }

    #[test]
    fn cudart_requests_resolve() {
        let bases: HashSet<&str> = VARIANTS.iter().map(|var| var.base).collect();
        for (name, text) in REQUESTS {
            let reqs = requests(text);
            assert!(reqs.len() > 400, "{name}: only {} requests", reqs.len());
            assert_eq!(reqs[0], ("", 0, 0), "{name}: first request");
            let mut found = 0;
            for &(symbol, version, flags) in &reqs {
                let answer = lookup(symbol, version, flags);
                if bases.contains(symbol) {
                    assert!(
                        matches!(answer, Lookup::Found(_)),
                        "{name}: ({symbol:?}, {version}, {flags}) -> {answer:?}"
                    );
                    found += 1;
                } else {
                    assert_eq!(answer, Lookup::NotFound, "{name}: {symbol:?}");
                }
            }
            eprintln!("{name}: {found} of {} requests resolved", reqs.len());
        }
    }

    #[test]
    fn known_answers() {
        let cases: &[(&str, i32, u64, Lookup)] = &[
            ("cuMemAlloc", 3020, 0, Lookup::Found("cuMemAlloc_v2")),
            ("cuMemAlloc", 2000, 0, Lookup::Found("cuMemAlloc")),
            ("cuCtxCreate", 12050, 0, Lookup::Found("cuCtxCreate_v4")),
            ("cuCtxCreate", 11040, 0, Lookup::Found("cuCtxCreate_v3")),
            ("cuCtxCreate", 3020, 0, Lookup::Found("cuCtxCreate_v2")),
            (
                "cuCtxGetDevice",
                13000,
                0,
                Lookup::Found("cuCtxGetDevice_v2"),
            ),
            ("cuCtxGetDevice", 12090, 0, Lookup::Found("cuCtxGetDevice")),
            (
                "cuLaunchKernel",
                7000,
                2,
                Lookup::Found("cuLaunchKernel_ptsz"),
            ),
            ("cuLaunchKernel", 7000, 0, Lookup::Found("cuLaunchKernel")),
            ("cuLaunchKernel", 6050, 2, Lookup::Found("cuLaunchKernel")),
            (
                "cuMemcpyHtoD",
                7000,
                2,
                Lookup::Found("cuMemcpyHtoD_v2_ptds"),
            ),
            ("cuMemcpyHtoD", 13000, 0, Lookup::Found("cuMemcpyHtoD_v2")),
            ("cuMemcpyHtoD", 2000, 0, Lookup::VersionNotSufficient),
            ("cuMemcpyPeer", 4000, 0, Lookup::Found("cuMemcpyPeer")),
            ("cuMemcpyPeer", 7000, 2, Lookup::Found("cuMemcpyPeer_ptds")),
            ("cuMemcpyPeer", 3020, 0, Lookup::VersionNotSufficient),
            (
                "cuMemcpyPeerAsync",
                13000,
                0,
                Lookup::Found("cuMemcpyPeerAsync"),
            ),
            (
                "cuMemcpyPeerAsync",
                12090,
                2,
                Lookup::Found("cuMemcpyPeerAsync_ptsz"),
            ),
            (
                "cuStreamBeginCapture",
                10000,
                2,
                Lookup::Found("cuStreamBeginCapture_ptsz"),
            ),
            (
                "cuStreamBeginCapture",
                12000,
                2,
                Lookup::Found("cuStreamBeginCapture_v2_ptsz"),
            ),
            (
                "cuGetProcAddress",
                11030,
                0,
                Lookup::Found("cuGetProcAddress"),
            ),
            (
                "cuGetProcAddress",
                12000,
                0,
                Lookup::Found("cuGetProcAddress_v2"),
            ),
            ("cuGetProcAddress", 11020, 0, Lookup::VersionNotSufficient),
            ("cuMemAllocAsync", 11010, 0, Lookup::VersionNotSufficient),
            (
                "cuMemAllocAsync",
                11020,
                2,
                Lookup::Found("cuMemAllocAsync_ptsz"),
            ),
            (
                "cuGraphInstantiate",
                11000,
                0,
                Lookup::Found("cuGraphInstantiate_v2"),
            ),
            (
                "cuGraphInstantiate",
                10000,
                0,
                Lookup::Found("cuGraphInstantiate"),
            ),
            (
                "cuGraphInstantiateWithFlags",
                11040,
                0,
                Lookup::Found("cuGraphInstantiateWithFlags"),
            ),
            ("cuNoSuchThing", 13000, 0, Lookup::NotFound),
            ("", 0, 0, Lookup::NotFound),
        ];
        for (symbol, version, flags, want) in cases {
            let got = lookup(symbol, *version, *flags);
            eprintln!("({symbol:?}, {version}, {flags}) -> {got:?}");
            assert_eq!(&got, want, "({symbol:?}, {version}, {flags})");
        }
    }

    #[test]
    fn table_is_consistent() {
        let mut keys = HashSet::new();
        let mut exports = HashSet::new();
        for var in VARIANTS {
            assert!(
                keys.insert((var.base, var.version, var.stream == Stream::PerThread)),
                "duplicate variant {var:?}"
            );
            assert!(exports.insert(var.export), "duplicate export {var:?}");
            assert!(var.export.starts_with(var.base), "{var:?}");
            let per_thread = var.export.ends_with("_ptds") || var.export.ends_with("_ptsz");
            assert_eq!(per_thread, var.stream == Stream::PerThread, "{var:?}");
        }
    }
}
