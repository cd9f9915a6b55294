//! The one table of driver and NVML entry points cuslice touches: the ones it wraps (with the
//! wrapper) and the ones it only calls. From it come the typed pointers to the real functions
//! (`real::cuMemAlloc_v2()`), the name lookup the `dlsym` override uses, and the pointer lookup
//! `cuGetProcAddress` uses to tell which exact variant the driver handed out.
//!
//! Every variant is its own entry: `cuMemAlloc` (the 32-bit ABI) and `cuMemAlloc_v2`,
//! `cuMemAllocAsync` and `cuMemAllocAsync_ptsz`, each with a wrapper of its own ABI.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use cuda_abi::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lib {
    Cuda,
    Nvml,
}

impl Lib {
    fn soname(self) -> &'static std::ffi::CStr {
        match self {
            Lib::Cuda => c"libcuda.so.1",
            Lib::Nvml => c"libnvidia-ml.so.1",
        }
    }
    fn index(self) -> usize {
        self as usize
    }
}

pub struct SymInfo {
    /// The exported name with a trailing NUL.
    pub name: &'static str,
    pub lib: Lib,
    /// cuslice's wrapper, for entries cuslice wraps.
    pub wrapper: Option<*const ()>,
}

// SAFETY: the table is immutable; the pointers are addresses of functions, never written through.
unsafe impl Sync for SymInfo {}

impl SymInfo {
    pub fn name(&self) -> &'static str {
        self.name.strip_suffix('\0').unwrap_or(self.name)
    }
}

type CUdev = CUdevice;
type Nvdev = *mut c_void;

macro_rules! table {
    ($( $lib:ident $name:ident ( $($ty:ty),* ) -> $ret:ty $(= $wrap:path)? ; )*) => {
        /// An entry of the table.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        #[repr(u16)]
        pub enum Sym { $($name),* }

        pub static SYMS: &[SymInfo] = &[ $(
            SymInfo {
                name: concat!(stringify!($name), "\0"),
                lib: Lib::$lib,
                wrapper: table!(@wrap ($($ty),*) $ret $(, $wrap)?),
            },
        )* ];

        static REAL: [AtomicPtr<()>; SYMS.len()] = [const { AtomicPtr::new(std::ptr::null_mut()) }; SYMS.len()];

        /// Typed pointers to the real functions (None where the library lacks the symbol).
        pub mod real {
            #![allow(non_snake_case, clippy::type_complexity)]
            use super::*;
            $(
                #[inline]
                pub fn $name() -> Option<unsafe extern "C" fn($($ty),*) -> $ret> {
                    let p = get(Sym::$name);
                    // `p` is null or what the real dlsym returned for exactly this name, whose C
                    // prototype is this function type (checked against cuda.h/nvml.h by the
                    // signatures in this table).
                    // SAFETY: so the types match; Option<fn> has the null niche.
                    unsafe { std::mem::transmute::<*mut (), Option<unsafe extern "C" fn($($ty),*) -> $ret>>(p) }
                }
            )*
        }
    };
    (@wrap ($($ty:ty),*) $ret:ty) => { None };
    (@wrap ($($ty:ty),*) $ret:ty, $wrap:path) => {
        Some({ let f: unsafe extern "C" fn($($ty),*) -> $ret = $wrap; f } as *const ())
    };
}

table! {
    // --- initialisation and resolution
    Cuda cuInit(c_uint) -> CUresult = crate::slice::cuInit;
    Cuda cuGetProcAddress(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult = crate::procaddr::cuGetProcAddress;
    Cuda cuGetProcAddress_v2(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult = crate::procaddr::cuGetProcAddress_v2;
    // --- plain allocations
    Cuda cuMemAlloc(*mut CUdeviceptr_v1, c_uint) -> CUresult = crate::memory::cuMemAlloc;
    Cuda cuMemAlloc_v2(*mut CUdeviceptr, usize) -> CUresult = crate::memory::cuMemAlloc_v2;
    Cuda cuMemAllocPitch(*mut CUdeviceptr_v1, *mut c_uint, c_uint, c_uint, c_uint) -> CUresult = crate::memory::cuMemAllocPitch;
    Cuda cuMemAllocPitch_v2(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult = crate::memory::cuMemAllocPitch_v2;
    Cuda cuMemAllocManaged(*mut CUdeviceptr, usize, c_uint) -> CUresult = crate::memory::cuMemAllocManaged;
    Cuda cuMemFree(CUdeviceptr_v1) -> CUresult = crate::memory::cuMemFree;
    Cuda cuMemFree_v2(CUdeviceptr) -> CUresult = crate::memory::cuMemFree_v2;
    // --- stream-ordered allocation and pools
    Cuda cuMemAllocAsync(*mut CUdeviceptr, usize, CUstream) -> CUresult = crate::pool::cuMemAllocAsync;
    Cuda cuMemAllocAsync_ptsz(*mut CUdeviceptr, usize, CUstream) -> CUresult = crate::pool::cuMemAllocAsync_ptsz;
    Cuda cuMemAllocFromPoolAsync(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult = crate::pool::cuMemAllocFromPoolAsync;
    Cuda cuMemAllocFromPoolAsync_ptsz(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult = crate::pool::cuMemAllocFromPoolAsync_ptsz;
    Cuda cuMemFreeAsync(CUdeviceptr, CUstream) -> CUresult;
    Cuda cuMemFreeAsync_ptsz(CUdeviceptr, CUstream) -> CUresult;
    Cuda cuMemPoolCreate(*mut CUmemoryPool, *const CUmemPoolProps) -> CUresult = crate::pool::cuMemPoolCreate;
    Cuda cuMemPoolDestroy(CUmemoryPool) -> CUresult = crate::pool::cuMemPoolDestroy;
    Cuda cuMemPoolTrimTo(CUmemoryPool, usize) -> CUresult = crate::pool::cuMemPoolTrimTo;
    Cuda cuDeviceGetDefaultMemPool(*mut CUmemoryPool, CUdev) -> CUresult = crate::pool::cuDeviceGetDefaultMemPool;
    Cuda cuDeviceGetMemPool(*mut CUmemoryPool, CUdev) -> CUresult;
    Cuda cuDeviceSetMemPool(CUdev, CUmemoryPool) -> CUresult = crate::pool::cuDeviceSetMemPool;
    Cuda cuMemPoolGetAttribute(CUmemoryPool, c_uint, *mut c_void) -> CUresult;
    Cuda cuStreamIsCapturing(CUstream, *mut c_uint) -> CUresult;
    // synchronising calls: where the driver gives pool memory back
    Cuda cuStreamSynchronize(CUstream) -> CUresult = crate::pool::cuStreamSynchronize;
    Cuda cuStreamSynchronize_ptsz(CUstream) -> CUresult = crate::pool::cuStreamSynchronize_ptsz;
    Cuda cuEventSynchronize(CUevent) -> CUresult = crate::pool::cuEventSynchronize;
    Cuda cuCtxSynchronize() -> CUresult = crate::pool::cuCtxSynchronize;
    Cuda cuCtxSynchronize_v2(CUcontext) -> CUresult = crate::pool::cuCtxSynchronize_v2;
    Cuda cuStreamIsCapturing_ptsz(CUstream, *mut c_uint) -> CUresult;
    // whether a stream has work left (the priority gate of a slice below a high one)
    Cuda cuStreamQuery(CUstream) -> CUresult;
    Cuda cuStreamQuery_ptsz(CUstream) -> CUresult;
    // --- arrays
    Cuda cuArrayCreate(*mut CUarray, *const c_void) -> CUresult = crate::array::cuArrayCreate;
    Cuda cuArrayCreate_v2(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR) -> CUresult = crate::array::cuArrayCreate_v2;
    Cuda cuArray3DCreate(*mut CUarray, *const c_void) -> CUresult = crate::array::cuArray3DCreate;
    Cuda cuArray3DCreate_v2(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult = crate::array::cuArray3DCreate_v2;
    Cuda cuMipmappedArrayCreate(*mut CUmipmappedArray, *const CUDA_ARRAY3D_DESCRIPTOR, c_uint) -> CUresult = crate::array::cuMipmappedArrayCreate;
    Cuda cuArrayDestroy(CUarray) -> CUresult = crate::array::cuArrayDestroy;
    Cuda cuMipmappedArrayDestroy(CUmipmappedArray) -> CUresult = crate::array::cuMipmappedArrayDestroy;
    Cuda cuArrayGetMemoryRequirements(*mut CUDA_ARRAY_MEMORY_REQUIREMENTS, CUarray, CUdev) -> CUresult;
    Cuda cuMipmappedArrayGetMemoryRequirements(*mut CUDA_ARRAY_MEMORY_REQUIREMENTS, CUmipmappedArray, CUdev) -> CUresult;
    // --- virtual memory management
    Cuda cuMemCreate(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, u64) -> CUresult = crate::vmm::cuMemCreate;
    Cuda cuMemRelease(CUmemGenericAllocationHandle) -> CUresult = crate::vmm::cuMemRelease;
    Cuda cuMemMap(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64) -> CUresult = crate::vmm::cuMemMap;
    Cuda cuMemUnmap(CUdeviceptr, usize) -> CUresult = crate::vmm::cuMemUnmap;
    Cuda cuMemRetainAllocationHandle(*mut CUmemGenericAllocationHandle, *mut c_void) -> CUresult = crate::vmm::cuMemRetainAllocationHandle;
    Cuda cuMemGetAllocationGranularity(*mut usize, *const CUmemAllocationProp, c_uint) -> CUresult;
    // --- contexts and modules (memory no allocation call reveals)
    Cuda cuCtxCreate(*mut CUcontext, c_uint, CUdev) -> CUresult = crate::context::cuCtxCreate;
    Cuda cuCtxCreate_v2(*mut CUcontext, c_uint, CUdev) -> CUresult = crate::context::cuCtxCreate_v2;
    Cuda cuCtxCreate_v3(*mut CUcontext, *mut c_void, c_int, c_uint, CUdev) -> CUresult = crate::context::cuCtxCreate_v3;
    Cuda cuCtxCreate_v4(*mut CUcontext, *mut c_void, c_uint, CUdev) -> CUresult = crate::context::cuCtxCreate_v4;
    Cuda cuCtxDestroy(CUcontext) -> CUresult = crate::context::cuCtxDestroy;
    Cuda cuCtxDestroy_v2(CUcontext) -> CUresult = crate::context::cuCtxDestroy_v2;
    Cuda cuDevicePrimaryCtxRetain(*mut CUcontext, CUdev) -> CUresult = crate::context::cuDevicePrimaryCtxRetain;
    Cuda cuDevicePrimaryCtxRelease(CUdev) -> CUresult = crate::context::cuDevicePrimaryCtxRelease;
    Cuda cuDevicePrimaryCtxRelease_v2(CUdev) -> CUresult = crate::context::cuDevicePrimaryCtxRelease_v2;
    Cuda cuDevicePrimaryCtxReset(CUdev) -> CUresult = crate::context::cuDevicePrimaryCtxReset;
    Cuda cuDevicePrimaryCtxReset_v2(CUdev) -> CUresult = crate::context::cuDevicePrimaryCtxReset_v2;
    Cuda cuModuleLoad(*mut CUmodule, *const c_char) -> CUresult = crate::context::cuModuleLoad;
    Cuda cuModuleLoadData(*mut CUmodule, *const c_void) -> CUresult = crate::context::cuModuleLoadData;
    Cuda cuModuleLoadDataEx(*mut CUmodule, *const c_void, c_uint, *mut c_int, *mut *mut c_void) -> CUresult = crate::context::cuModuleLoadDataEx;
    Cuda cuModuleLoadFatBinary(*mut CUmodule, *const c_void) -> CUresult = crate::context::cuModuleLoadFatBinary;
    Cuda cuModuleUnload(CUmodule) -> CUresult = crate::context::cuModuleUnload;
    Cuda cuLibraryLoadData(*mut CUlibrary, *const c_void, *mut c_int, *mut *mut c_void, c_uint, *mut c_int, *mut *mut c_void, c_uint) -> CUresult = crate::context::cuLibraryLoadData;
    Cuda cuLibraryLoadFromFile(*mut CUlibrary, *const c_char, *mut c_int, *mut *mut c_void, c_uint, *mut c_int, *mut *mut c_void, c_uint) -> CUresult = crate::context::cuLibraryLoadFromFile;
    Cuda cuLibraryUnload(CUlibrary) -> CUresult = crate::context::cuLibraryUnload;
    // --- launches (compute time-share)
    Cuda cuLaunchKernel(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult = crate::compute::cuLaunchKernel;
    Cuda cuLaunchKernel_ptsz(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult = crate::compute::cuLaunchKernel_ptsz;
    Cuda cuLaunchKernelEx(*const CUlaunchConfig, CUfunction, *mut *mut c_void, *mut *mut c_void) -> CUresult = crate::compute::cuLaunchKernelEx;
    Cuda cuLaunchKernelEx_ptsz(*const CUlaunchConfig, CUfunction, *mut *mut c_void, *mut *mut c_void) -> CUresult = crate::compute::cuLaunchKernelEx_ptsz;
    Cuda cuLaunchCooperativeKernel(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void) -> CUresult = crate::compute::cuLaunchCooperativeKernel;
    Cuda cuLaunchCooperativeKernel_ptsz(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void) -> CUresult = crate::compute::cuLaunchCooperativeKernel_ptsz;
    Cuda cuGraphLaunch(CUgraphExec, CUstream) -> CUresult = crate::compute::cuGraphLaunch;
    Cuda cuGraphLaunch_ptsz(CUgraphExec, CUstream) -> CUresult = crate::compute::cuGraphLaunch_ptsz;
    Cuda cuCtxGetCurrent(*mut CUcontext) -> CUresult;
    Cuda cuCtxGetDevice(*mut CUdev) -> CUresult;
    // --- what applications read back
    Cuda cuMemGetInfo(*mut c_uint, *mut c_uint) -> CUresult = crate::info::cuMemGetInfo;
    Cuda cuMemGetInfo_v2(*mut usize, *mut usize) -> CUresult = crate::info::cuMemGetInfo_v2;
    Cuda cuDeviceTotalMem(*mut c_uint, CUdev) -> CUresult = crate::info::cuDeviceTotalMem;
    Cuda cuDeviceTotalMem_v2(*mut usize, CUdev) -> CUresult = crate::info::cuDeviceTotalMem_v2;
    Cuda cuDeviceGet(*mut CUdev, c_int) -> CUresult;
    Cuda cuDeviceGetCount(*mut c_int) -> CUresult;
    Cuda cuDeviceGetUuid(*mut CUuuid, CUdev) -> CUresult;
    Cuda cuDeviceGetUuid_v2(*mut CUuuid, CUdev) -> CUresult;
    // --- NVML
    Nvml nvmlInit_v2() -> nvmlReturn_t;
    Nvml nvmlDeviceGetUUID(Nvdev, *mut c_char, c_uint) -> nvmlReturn_t;
    Nvml nvmlDeviceGetHandleByUUID(*const c_char, *mut Nvdev) -> nvmlReturn_t;
    Nvml nvmlDeviceGetCount_v2(*mut c_uint) -> nvmlReturn_t;
    Nvml nvmlDeviceGetHandleByIndex_v2(c_uint, *mut Nvdev) -> nvmlReturn_t;
    Nvml nvmlDeviceGetProcessUtilization(Nvdev, *mut nvmlProcessUtilizationSample_t, *mut c_uint, u64) -> nvmlReturn_t;
    Nvml nvmlDeviceGetUtilizationRates(Nvdev, *mut nvmlUtilization_t) -> nvmlReturn_t;
    Nvml nvmlDeviceGetMemoryInfo(Nvdev, *mut nvmlMemory_t) -> nvmlReturn_t = crate::nvml::nvmlDeviceGetMemoryInfo;
    Nvml nvmlDeviceGetMemoryInfo_v2(Nvdev, *mut nvmlMemory_v2_t) -> nvmlReturn_t = crate::nvml::nvmlDeviceGetMemoryInfo_v2;
    Nvml nvmlDeviceGetComputeRunningProcesses(Nvdev, *mut c_uint, *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t = crate::nvml::nvmlDeviceGetComputeRunningProcesses;
    Nvml nvmlDeviceGetComputeRunningProcesses_v2(Nvdev, *mut c_uint, *mut nvmlProcessInfo_v2_t) -> nvmlReturn_t = crate::nvml::nvmlDeviceGetComputeRunningProcesses_v2;
    Nvml nvmlDeviceGetComputeRunningProcesses_v3(Nvdev, *mut c_uint, *mut nvmlProcessInfo_v2_t) -> nvmlReturn_t = crate::nvml::nvmlDeviceGetComputeRunningProcesses_v3;
}

impl Sym {
    pub fn info(self) -> &'static SymInfo {
        // The enum is generated from the same list as SYMS, in the same order.
        &SYMS[self as usize]
    }
}

/// The entry named exactly `name` (no prefix matching: `cudnnCreate` is nobody's business).
pub fn by_name(name: &[u8]) -> Option<usize> {
    if !(name.starts_with(b"cu") || name.starts_with(b"nvml")) {
        return None;
    }
    SYMS.iter().position(|s| s.name().as_bytes() == name)
}

static LIB_HANDLE: [AtomicPtr<c_void>; 2] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 2];
static RESOLVED: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];

/// The library's handle if the process has loaded it (never loads it).
pub fn loaded_handle(lib: Lib) -> Option<*mut c_void> {
    let slot = &LIB_HANDLE[lib.index()];
    let h = slot.load(Ordering::Acquire);
    if !h.is_null() {
        return Some(h);
    }
    // SAFETY: dlopen with a NUL-terminated name; RTLD_NOLOAD never loads anything new.
    let h = unsafe { libc::dlopen(lib.soname().as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return None;
    }
    slot.store(h, Ordering::Release);
    Some(h)
}

/// Loads the library if needed and resolves every table entry of it (idempotent; racing threads
/// resolve the same values). False if the library cannot be loaded.
pub fn ensure(lib: Lib) -> bool {
    if RESOLVED[lib.index()].load(Ordering::Acquire) {
        return true;
    }
    let h = match loaded_handle(lib) {
        Some(h) => h,
        None => {
            // SAFETY: as above; this time the library is loaded (the application uses it).
            let h = unsafe { libc::dlopen(lib.soname().as_ptr(), libc::RTLD_NOW) };
            if h.is_null() {
                return false;
            }
            LIB_HANDLE[lib.index()].store(h, Ordering::Release);
            h
        }
    };
    let Some(dlsym) = crate::dlsym::real_dlsym() else {
        return false;
    };
    for (i, s) in SYMS.iter().enumerate() {
        if s.lib == lib {
            // SAFETY: the real dlsym with a live handle and a NUL-terminated name.
            let p = unsafe { dlsym(h, s.name.as_ptr().cast()) };
            REAL[i].store(p.cast(), Ordering::Release);
        }
    }
    RESOLVED[lib.index()].store(true, Ordering::Release);
    true
}

// Inlined: every wrapper calls it on every call (a load and a test once resolved).
#[inline]
fn get(s: Sym) -> *mut () {
    let p = REAL[s as usize].load(Ordering::Acquire);
    if p.is_null() && !RESOLVED[s.info().lib.index()].load(Ordering::Acquire) {
        ensure(s.info().lib);
        return REAL[s as usize].load(Ordering::Acquire);
    }
    p
}

/// The real function's address for table entry `i` (after `ensure`).
pub fn real_at(i: usize) -> *mut () {
    REAL.get(i)
        .map_or(std::ptr::null_mut(), |p| p.load(Ordering::Acquire))
}

/// cuslice's wrapper for the exact real function `p`, if cuslice wraps it.
pub fn wrapper_for_real(lib: Lib, p: *mut c_void) -> Option<*mut c_void> {
    if p.is_null() || !ensure(lib) {
        return None;
    }
    SYMS.iter()
        .zip(REAL.iter())
        .find(|(s, r)| s.lib == lib && r.load(Ordering::Relaxed) == p.cast())
        .and_then(|(s, _)| s.wrapper.map(|w| w as *mut c_void))
}
