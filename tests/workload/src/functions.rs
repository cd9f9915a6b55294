// The driver entry points the workload calls: the one list every route, the link stub and the
// direct route are generated from. Included three ways: as a module of the library, by
// `bin/linked.rs` through the exported macro, and textually by `build.rs` (which only reads the
// names), so it holds nothing but the macro.
//
// Each entry: `{ versioned_name, "base name", abi_since, ["ptds name", ...], (arg: Type, ...) }`.
// - `versioned_name` is the symbol `cuda.h` maps the call to (what `dlsym` and `-lcuda` use).
// - `"base name"` is what `cuGetProcAddress` is asked for.
// - `abi_since` is the lowest cudaVersion at which the base name yields an entry point with this
//   signature (3020 for the `size_t`/64-bit `_v2` memory ABI, 10010 for the capture mode
//   argument); a pointer obtained at a lower version is discarded rather than called with the
//   wrong ABI.
// - the ptds names are the per-thread-default-stream exports (`_ptsz`/`_ptds`) the `dlsym` route
//   looks up under `--ptds`.
// Every function returns `CUresult`. The types must be in scope where the callback expands.

/// Calls `$callback! { ... }` with the table of driver functions (see `functions.rs`).
#[macro_export]
macro_rules! cuda_functions {
    ($callback:ident) => {
        $callback! {
            { cuInit, "cuInit", 2000, [], (flags: u32) }
            { cuDriverGetVersion, "cuDriverGetVersion", 2020, [], (version: *mut i32) }
            { cuDeviceGet, "cuDeviceGet", 2000, [], (device: *mut CUdevice, ordinal: i32) }
            { cuDeviceGetCount, "cuDeviceGetCount", 2000, [], (count: *mut i32) }
            { cuDeviceGetName, "cuDeviceGetName", 2000, [], (name: *mut c_char, len: i32, dev: CUdevice) }
            { cuDeviceGetUuid_v2, "cuDeviceGetUuid", 9020, [], (uuid: *mut CUuuid, dev: CUdevice) }
            { cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, [], (bytes: *mut usize, dev: CUdevice) }
            { cuDeviceGetAttribute, "cuDeviceGetAttribute", 2000, [], (value: *mut i32, attrib: i32, dev: CUdevice) }
            { cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, [], (pctx: *mut CUcontext, dev: CUdevice) }
            { cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 7000, [], (dev: CUdevice) }
            { cuCtxSetCurrent, "cuCtxSetCurrent", 4000, [], (ctx: CUcontext) }
            { cuMemGetInfo_v2, "cuMemGetInfo", 3020, [], (free: *mut usize, total: *mut usize) }
            { cuMemAlloc_v2, "cuMemAlloc", 3020, [], (dptr: *mut CUdeviceptr, bytesize: usize) }
            { cuMemFree_v2, "cuMemFree", 3020, [], (dptr: CUdeviceptr) }
            { cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, [],
                (dptr: *mut CUdeviceptr, pitch: *mut usize, width_bytes: usize, height: usize, element_size: u32) }
            { cuMemAllocManaged, "cuMemAllocManaged", 6000, [], (dptr: *mut CUdeviceptr, bytesize: usize, flags: u32) }
            { cuArrayCreate_v2, "cuArrayCreate", 3020, [], (array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) }
            { cuArray3DCreate_v2, "cuArray3DCreate", 3020, [],
                (array: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) }
            { cuArrayDestroy, "cuArrayDestroy", 2000, [], (array: CUarray) }
            { cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, [],
                (array: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: u32) }
            { cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, [], (array: CUmipmappedArray) }
            { cuStreamCreate, "cuStreamCreate", 2000, [], (stream: *mut CUstream, flags: u32) }
            { cuStreamDestroy_v2, "cuStreamDestroy", 2000, [], (stream: CUstream) }
            { cuStreamSynchronize, "cuStreamSynchronize", 2000, ["cuStreamSynchronize_ptsz"], (stream: CUstream) }
            { cuMemAllocAsync, "cuMemAllocAsync", 11020, ["cuMemAllocAsync_ptsz"],
                (dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) }
            { cuMemFreeAsync, "cuMemFreeAsync", 11020, ["cuMemFreeAsync_ptsz"], (dptr: CUdeviceptr, stream: CUstream) }
            { cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, [],
                (pool: *mut CUmemoryPool, dev: CUdevice) }
            { cuMemPoolSetAttribute, "cuMemPoolSetAttribute", 11020, [],
                (pool: CUmemoryPool, attr: u32, value: *mut c_void) }
            { cuMemPoolGetAttribute, "cuMemPoolGetAttribute", 11020, [],
                (pool: CUmemoryPool, attr: u32, value: *mut c_void) }
            { cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, ["cuMemAllocFromPoolAsync_ptsz"],
                (dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) }
            { cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", 10020, [],
                (granularity: *mut usize, prop: *const CUmemAllocationProp, option: u32) }
            { cuMemAddressReserve, "cuMemAddressReserve", 10020, [],
                (ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: u64) }
            { cuMemAddressFree, "cuMemAddressFree", 10020, [], (ptr: CUdeviceptr, size: usize) }
            { cuMemCreate, "cuMemCreate", 10020, [],
                (handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) }
            { cuMemRelease, "cuMemRelease", 10020, [], (handle: CUmemGenericAllocationHandle) }
            { cuMemMap, "cuMemMap", 10020, [],
                (ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) }
            { cuMemUnmap, "cuMemUnmap", 10020, [], (ptr: CUdeviceptr, size: usize) }
            { cuMemSetAccess, "cuMemSetAccess", 10020, [],
                (ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) }
            { cuModuleLoadData, "cuModuleLoadData", 2000, [], (module: *mut CUmodule, image: *const c_void) }
            { cuModuleUnload, "cuModuleUnload", 2000, [], (module: CUmodule) }
            { cuModuleGetFunction, "cuModuleGetFunction", 2000, [],
                (function: *mut CUfunction, module: CUmodule, name: *const c_char) }
            { cuLaunchKernel, "cuLaunchKernel", 4000, ["cuLaunchKernel_ptsz"],
                (f: CUfunction, grid_x: u32, grid_y: u32, grid_z: u32, block_x: u32, block_y: u32, block_z: u32,
                 shared_mem_bytes: u32, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) }
            { cuLaunchKernelEx, "cuLaunchKernelEx", 11060, ["cuLaunchKernelEx_ptsz"],
                (config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) }
            { cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, ["cuLaunchCooperativeKernel_ptsz"],
                (f: CUfunction, grid_x: u32, grid_y: u32, grid_z: u32, block_x: u32, block_y: u32, block_z: u32,
                 shared_mem_bytes: u32, stream: CUstream, params: *mut *mut c_void) }
            { cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, ["cuStreamBeginCapture_v2_ptsz"],
                (stream: CUstream, mode: u32) }
            { cuStreamEndCapture, "cuStreamEndCapture", 10000, ["cuStreamEndCapture_ptsz"],
                (stream: CUstream, graph: *mut CUgraph) }
            { cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040, [],
                (exec: *mut CUgraphExec, graph: CUgraph, flags: u64) }
            { cuGraphLaunch, "cuGraphLaunch", 10000, ["cuGraphLaunch_ptsz"], (exec: CUgraphExec, stream: CUstream) }
            { cuGraphExecDestroy, "cuGraphExecDestroy", 10000, [], (exec: CUgraphExec) }
            { cuGraphDestroy, "cuGraphDestroy", 10000, [], (graph: CUgraph) }
            { cuEventCreate, "cuEventCreate", 2000, [], (event: *mut CUevent, flags: u32) }
            { cuEventRecord, "cuEventRecord", 2000, ["cuEventRecord_ptsz"], (event: CUevent, stream: CUstream) }
            { cuEventSynchronize, "cuEventSynchronize", 2000, [], (event: CUevent) }
            { cuEventQuery, "cuEventQuery", 2000, [], (event: CUevent) }
            { cuEventElapsedTime, "cuEventElapsedTime", 2000, [], (ms: *mut f32, start: CUevent, end: CUevent) }
            { cuEventDestroy_v2, "cuEventDestroy", 2000, [], (event: CUevent) }
            { cuMemcpyHtoD_v2, "cuMemcpyHtoD", 3020, ["cuMemcpyHtoD_v2_ptds"],
                (dst: CUdeviceptr, src: *const c_void, bytes: usize) }
            { cuMemcpyDtoH_v2, "cuMemcpyDtoH", 3020, ["cuMemcpyDtoH_v2_ptds"],
                (dst: *mut c_void, src: CUdeviceptr, bytes: usize) }
            { cuMemcpyDtoD_v2, "cuMemcpyDtoD", 3020, ["cuMemcpyDtoD_v2_ptds"],
                (dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) }
            { cuMemsetD8_v2, "cuMemsetD8", 3020, ["cuMemsetD8_v2_ptds"], (dst: CUdeviceptr, value: u8, bytes: usize) }
            { cuMemcpyPeer, "cuMemcpyPeer", 4000, ["cuMemcpyPeer_ptds"],
                (dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, bytes: usize) }
            { cuMemcpyPeerAsync, "cuMemcpyPeerAsync", 4000, ["cuMemcpyPeerAsync_ptsz"],
                (dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, bytes: usize,
                 stream: CUstream) }
            { cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 10020, [],
                (shareable: *mut c_void, handle: CUmemGenericAllocationHandle, kind: u32, flags: u64) }
            { cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020, [],
                (handle: *mut CUmemGenericAllocationHandle, shareable: *mut c_void, kind: u32) }
            { cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010, [], (handle: *mut CUipcMemHandle, dptr: CUdeviceptr) }
            { cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", 11000, [],
                (dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: u32) }
            { cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 4010, [], (dptr: CUdeviceptr) }
            { cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", 4000, [], (can: *mut i32, dev: CUdevice, peer: CUdevice) }
            { cuDeviceGetP2PAttribute, "cuDeviceGetP2PAttribute", 8000, [],
                (value: *mut i32, attrib: i32, src: CUdevice, dst: CUdevice) }
            { cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", 4000, [], (peer: CUcontext, flags: u32) }
            { cuMulticastCreate, "cuMulticastCreate", 12010, [], (handle: *mut u64, prop: *const c_void) }
        }
    };
}
