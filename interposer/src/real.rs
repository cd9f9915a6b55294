//! The real entry points: the one table of driver and NVML functions cuslice wraps or calls, each
//! with its C prototype, and glibc's `dlsym` that resolves them. From the table come the typed
//! pointers to the real functions (`real::cuMemAlloc_v2()`), their prototypes as types
//! (`real::sig::cuMemAlloc_v2`, which the wrapper registry checks each wrapper against), and the
//! lookups by name and by address.
//!
//! Every variant is its own entry: `cuMemAlloc` (the 32-bit ABI) and `cuMemAlloc_v2`,
//! `cuMemAllocAsync` and `cuMemAllocAsync_ptsz`, each with a prototype of its own. Which of them
//! cuslice wraps is not this module's business (see `registry` and src/wrapped.txt): it depends
//! on nothing else in the crate, and every other module may use it.

#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use cuda_abi::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lib {
    Cuda,
    Nvml,
}

impl Lib {
    fn soname(self) -> &'static CStr {
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
}

impl SymInfo {
    pub fn name(&self) -> &'static str {
        self.name.strip_suffix('\0').unwrap_or(self.name)
    }
}

type CUdev = CUdevice;
type Nvdev = *mut c_void;

macro_rules! table {
    ($( $lib:ident $name:ident ( $($ty:ty),* ) -> $ret:ty ; )*) => {
        /// An entry of the table.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        #[repr(u16)]
        pub enum Sym { $($name),* }

        pub static SYMS: &[SymInfo] = &[ $(
            SymInfo {
                name: concat!(stringify!($name), "\0"),
                lib: Lib::$lib,
            },
        )* ];

        /// How many entries the table has.
        pub const COUNT: usize = [$(stringify!($name)),*].len();

        static REAL: [AtomicPtr<()>; COUNT] = [const { AtomicPtr::new(std::ptr::null_mut()) }; COUNT];

        /// The C prototype of each entry, as a function pointer type.
        pub mod sig {
            #![allow(non_camel_case_types, clippy::type_complexity)]
            use super::*;
            $(
                pub type $name = unsafe extern "C" fn($($ty),*) -> $ret;
            )*
        }

        $(
            /// The real function (None where the library lacks the symbol).
            #[inline]
            pub fn $name() -> Option<sig::$name> {
                let p = get(Sym::$name);
                // `p` is null or what the real dlsym returned for exactly this name, whose C
                // prototype is this function type (checked against cuda.h/nvml.h by the
                // signatures in this table).
                // SAFETY: so the types match; Option<fn> has the null niche.
                unsafe { std::mem::transmute::<*mut (), Option<sig::$name>>(p) }
            }
        )*
    };
}

table! {
    // --- initialisation and resolution
    Cuda cuInit(c_uint) -> CUresult;
    Cuda cuGetProcAddress(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
    Cuda cuGetProcAddress_v2(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
    // --- plain allocations
    Cuda cuMemAlloc(*mut CUdeviceptr_v1, c_uint) -> CUresult;
    Cuda cuMemAlloc_v2(*mut CUdeviceptr, usize) -> CUresult;
    Cuda cuMemAllocPitch(*mut CUdeviceptr_v1, *mut c_uint, c_uint, c_uint, c_uint) -> CUresult;
    Cuda cuMemAllocPitch_v2(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult;
    Cuda cuMemAllocManaged(*mut CUdeviceptr, usize, c_uint) -> CUresult;
    Cuda cuMemAdvise(CUdeviceptr, usize, c_int, CUdevice) -> CUresult;
    Cuda cuMemFree(CUdeviceptr_v1) -> CUresult;
    Cuda cuMemFree_v2(CUdeviceptr) -> CUresult;
    // --- stream-ordered allocation and pools
    Cuda cuMemAllocAsync(*mut CUdeviceptr, usize, CUstream) -> CUresult;
    Cuda cuMemAllocAsync_ptsz(*mut CUdeviceptr, usize, CUstream) -> CUresult;
    Cuda cuMemAllocFromPoolAsync(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;
    Cuda cuMemAllocFromPoolAsync_ptsz(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;
    Cuda cuMemFreeAsync(CUdeviceptr, CUstream) -> CUresult;
    Cuda cuMemFreeAsync_ptsz(CUdeviceptr, CUstream) -> CUresult;
    Cuda cuMemPoolCreate(*mut CUmemoryPool, *const CUmemPoolProps) -> CUresult;
    Cuda cuMemPoolDestroy(CUmemoryPool) -> CUresult;
    Cuda cuMemPoolTrimTo(CUmemoryPool, usize) -> CUresult;
    Cuda cuDeviceGetDefaultMemPool(*mut CUmemoryPool, CUdev) -> CUresult;
    Cuda cuDeviceGetMemPool(*mut CUmemoryPool, CUdev) -> CUresult;
    Cuda cuDeviceSetMemPool(CUdev, CUmemoryPool) -> CUresult;
    Cuda cuMemPoolGetAttribute(CUmemoryPool, c_uint, *mut c_void) -> CUresult;
    Cuda cuStreamIsCapturing(CUstream, *mut c_uint) -> CUresult;
    // synchronising calls: where the driver gives pool memory back
    Cuda cuStreamSynchronize(CUstream) -> CUresult;
    Cuda cuStreamSynchronize_ptsz(CUstream) -> CUresult;
    Cuda cuEventSynchronize(CUevent) -> CUresult;
    Cuda cuCtxSynchronize() -> CUresult;
    Cuda cuCtxSynchronize_v2(CUcontext) -> CUresult;
    Cuda cuStreamIsCapturing_ptsz(CUstream, *mut c_uint) -> CUresult;
    // streams the compute thread drains, forgotten before they are destroyed
    Cuda cuStreamDestroy(CUstream) -> CUresult;
    Cuda cuStreamDestroy_v2(CUstream) -> CUresult;
    // --- arrays
    Cuda cuArrayCreate(*mut CUarray, *const c_void) -> CUresult;
    Cuda cuArrayCreate_v2(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR) -> CUresult;
    Cuda cuArray3DCreate(*mut CUarray, *const c_void) -> CUresult;
    Cuda cuArray3DCreate_v2(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult;
    Cuda cuMipmappedArrayCreate(*mut CUmipmappedArray, *const CUDA_ARRAY3D_DESCRIPTOR, c_uint) -> CUresult;
    Cuda cuArrayDestroy(CUarray) -> CUresult;
    Cuda cuMipmappedArrayDestroy(CUmipmappedArray) -> CUresult;
    Cuda cuArrayGetMemoryRequirements(*mut CUDA_ARRAY_MEMORY_REQUIREMENTS, CUarray, CUdev) -> CUresult;
    Cuda cuMipmappedArrayGetMemoryRequirements(*mut CUDA_ARRAY_MEMORY_REQUIREMENTS, CUmipmappedArray, CUdev) -> CUresult;
    // --- virtual memory management
    Cuda cuMemCreate(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, u64) -> CUresult;
    Cuda cuMemRelease(CUmemGenericAllocationHandle) -> CUresult;
    Cuda cuMemMap(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64) -> CUresult;
    Cuda cuMemUnmap(CUdeviceptr, usize) -> CUresult;
    Cuda cuMemRetainAllocationHandle(*mut CUmemGenericAllocationHandle, *mut c_void) -> CUresult;
    Cuda cuMemGetAllocationGranularity(*mut usize, *const CUmemAllocationProp, c_uint) -> CUresult;
    // --- contexts and modules (memory no allocation call reveals)
    Cuda cuCtxCreate(*mut CUcontext, c_uint, CUdev) -> CUresult;
    Cuda cuCtxCreate_v2(*mut CUcontext, c_uint, CUdev) -> CUresult;
    Cuda cuCtxCreate_v3(*mut CUcontext, *mut c_void, c_int, c_uint, CUdev) -> CUresult;
    Cuda cuCtxCreate_v4(*mut CUcontext, *mut c_void, c_uint, CUdev) -> CUresult;
    Cuda cuCtxDestroy(CUcontext) -> CUresult;
    Cuda cuCtxDestroy_v2(CUcontext) -> CUresult;
    Cuda cuDevicePrimaryCtxRetain(*mut CUcontext, CUdev) -> CUresult;
    Cuda cuDevicePrimaryCtxRelease(CUdev) -> CUresult;
    Cuda cuDevicePrimaryCtxRelease_v2(CUdev) -> CUresult;
    Cuda cuDevicePrimaryCtxReset(CUdev) -> CUresult;
    Cuda cuDevicePrimaryCtxReset_v2(CUdev) -> CUresult;
    Cuda cuModuleLoad(*mut CUmodule, *const c_char) -> CUresult;
    Cuda cuModuleLoadData(*mut CUmodule, *const c_void) -> CUresult;
    Cuda cuModuleLoadDataEx(*mut CUmodule, *const c_void, c_uint, *mut c_int, *mut *mut c_void) -> CUresult;
    Cuda cuModuleLoadFatBinary(*mut CUmodule, *const c_void) -> CUresult;
    Cuda cuModuleUnload(CUmodule) -> CUresult;
    Cuda cuLibraryLoadData(*mut CUlibrary, *const c_void, *mut c_int, *mut *mut c_void, c_uint, *mut c_int, *mut *mut c_void, c_uint) -> CUresult;
    Cuda cuLibraryLoadFromFile(*mut CUlibrary, *const c_char, *mut c_int, *mut *mut c_void, c_uint, *mut c_int, *mut *mut c_void, c_uint) -> CUresult;
    Cuda cuLibraryUnload(CUlibrary) -> CUresult;
    // --- launches (compute time-share)
    Cuda cuLaunchKernel(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    Cuda cuLaunchKernel_ptsz(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    Cuda cuLaunchKernelEx(*const CUlaunchConfig, CUfunction, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    Cuda cuLaunchKernelEx_ptsz(*const CUlaunchConfig, CUfunction, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    Cuda cuLaunchCooperativeKernel(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void) -> CUresult;
    Cuda cuLaunchCooperativeKernel_ptsz(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void) -> CUresult;
    Cuda cuGraphLaunch(CUgraphExec, CUstream) -> CUresult;
    Cuda cuGraphLaunch_ptsz(CUgraphExec, CUstream) -> CUresult;
    Cuda cuCtxGetCurrent(*mut CUcontext) -> CUresult;
    Cuda cuCtxGetDevice(*mut CUdev) -> CUresult;
    // the context an allocation was made in, asked when a context goes away (`membership`)
    Cuda cuPointerGetAttribute(*mut c_void, c_uint, CUdeviceptr) -> CUresult;
    // turns: the compute thread drains a closed turn's streams with events
    Cuda cuCtxSetCurrent(CUcontext) -> CUresult;
    Cuda cuEventCreate(*mut CUevent, c_uint) -> CUresult;
    Cuda cuEventRecord(CUevent, CUstream) -> CUresult;
    Cuda cuEventRecord_ptsz(CUevent, CUstream) -> CUresult;
    Cuda cuEventQuery(CUevent) -> CUresult;
    Cuda cuEventElapsedTime(*mut f32, CUevent, CUevent) -> CUresult;
    Cuda cuThreadExchangeStreamCaptureMode(*mut c_uint) -> CUresult;
    // --- what applications read back
    Cuda cuMemGetInfo(*mut c_uint, *mut c_uint) -> CUresult;
    Cuda cuMemGetInfo_v2(*mut usize, *mut usize) -> CUresult;
    Cuda cuDeviceTotalMem(*mut c_uint, CUdev) -> CUresult;
    Cuda cuDeviceTotalMem_v2(*mut usize, CUdev) -> CUresult;
    Cuda cuDeviceGet(*mut CUdev, c_int) -> CUresult;
    Cuda cuDeviceGetCount(*mut c_int) -> CUresult;
    Cuda cuDeviceGetUuid(*mut CUuuid, CUdev) -> CUresult;
    Cuda cuDeviceGetUuid_v2(*mut CUuuid, CUdev) -> CUresult;
    Cuda cuDevicePrimaryCtxGetState(CUdev, *mut c_uint, *mut c_int) -> CUresult;
    Cuda cuCheckpointProcessLock(c_int, *const c_void) -> CUresult;
    Cuda cuCheckpointProcessCheckpoint(c_int, *const c_void) -> CUresult;
    Cuda cuCheckpointProcessRestore(c_int, *const c_void) -> CUresult;
    Cuda cuCheckpointProcessUnlock(c_int, *const c_void) -> CUresult;
    // --- NVML
    Nvml nvmlInit_v2() -> nvmlReturn_t;
    Nvml nvmlDeviceGetUUID(Nvdev, *mut c_char, c_uint) -> nvmlReturn_t;
    Nvml nvmlDeviceGetMinorNumber(Nvdev, *mut c_uint) -> nvmlReturn_t;
    Nvml nvmlDeviceGetHandleByUUID(*const c_char, *mut Nvdev) -> nvmlReturn_t;
    Nvml nvmlDeviceGetCount_v2(*mut c_uint) -> nvmlReturn_t;
    Nvml nvmlDeviceGetHandleByIndex_v2(c_uint, *mut Nvdev) -> nvmlReturn_t;
    Nvml nvmlDeviceGetProcessUtilization(Nvdev, *mut nvmlProcessUtilizationSample_t, *mut c_uint, u64) -> nvmlReturn_t;
    Nvml nvmlDeviceGetUtilizationRates(Nvdev, *mut nvmlUtilization_t) -> nvmlReturn_t;
    Nvml nvmlDeviceGetMemoryInfo(Nvdev, *mut nvmlMemory_t) -> nvmlReturn_t;
    Nvml nvmlDeviceGetMigMode(Nvdev, *mut c_uint, *mut c_uint) -> nvmlReturn_t;
    Nvml nvmlDeviceGetMemoryInfo_v2(Nvdev, *mut nvmlMemory_v2_t) -> nvmlReturn_t;
    Nvml nvmlDeviceGetComputeRunningProcesses(Nvdev, *mut c_uint, *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t;
    Nvml nvmlDeviceGetComputeRunningProcesses_v2(Nvdev, *mut c_uint, *mut nvmlProcessInfo_v2_t) -> nvmlReturn_t;
    Nvml nvmlDeviceGetComputeRunningProcesses_v3(Nvdev, *mut c_uint, *mut nvmlProcessInfo_v2_t) -> nvmlReturn_t;
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

/// The first entry of `lib` whose real function is exactly `p` (after `ensure`).
pub fn by_real(lib: Lib, p: *mut c_void) -> Option<usize> {
    SYMS.iter()
        .zip(REAL.iter())
        .position(|(s, r)| s.lib == lib && r.load(Ordering::Relaxed) == p.cast())
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
    let Some(dlsym) = dlsym() else {
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

// ---- glibc's dlsym ---------------------------------------------------------------------------

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's dlsym, handed over by the loader (`cuslice_core_attach`, in `dlsym`).
static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

#[cfg(target_arch = "x86_64")]
const DLSYM_BASE_VERSION: &CStr = c"GLIBC_2.2.5";
#[cfg(target_arch = "aarch64")]
const DLSYM_BASE_VERSION: &CStr = c"GLIBC_2.17";

/// Takes glibc's `dlsym` as the loader found it (ignored if NULL).
pub fn set_dlsym(p: *mut c_void) {
    if !p.is_null() {
        REAL_DLSYM.store(p, Ordering::Release);
    }
}

/// glibc's own dlsym: the loader's, else (the core preloaded by itself, as some tests do)
/// `dlvsym(RTLD_NEXT, "dlsym", ...)`, newest version first.
pub fn dlsym() -> Option<DlsymFn> {
    let p = REAL_DLSYM.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: only ever set to glibc's dlsym, which has exactly this prototype.
        return Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) });
    }
    for version in [c"GLIBC_2.34", DLSYM_BASE_VERSION] {
        // SAFETY: dlvsym (not overridden by cuslice) with NUL-terminated strings.
        let f = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !f.is_null() {
            REAL_DLSYM.store(f, Ordering::Release);
            // SAFETY: glibc's dlsym has exactly this prototype.
            return Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(f) });
        }
    }
    None
}
