//! The CUDA driver API and NVML ABI subset shared by cuslice and the simulated driver.
//!
//! Values are plain integers in `#[repr(transparent)]` newtypes, never Rust enums: a driver newer
//! than these definitions returns values no enum would list. Layouts follow `cuda.h` and `nvml.h`
//! of CUDA 12.9 / 13.0 on x86_64 (identical for everything here); `tests/abi-check` compiles a C
//! program against NVIDIA's headers and compares every size, offset and constant below.
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::c_void;
use std::fmt;

/// `CUresult`: a driver status code.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CUresult(pub i32);

macro_rules! codes {
    ($ty:ident { $($name:ident = $val:expr),* $(,)? }) => {
        impl $ty {
            $(pub const $name: $ty = $ty($val);)*
            /// The constant's name as the header spells it, if this is a known value.
            pub fn name(self) -> Option<&'static str> {
                match self.0 { $($val => Some(stringify!($name)),)* _ => None }
            }
        }
        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.name() { Some(n) => write!(f, "{n}({})", self.0), None => write!(f, "{}({})", stringify!($ty), self.0) }
            }
        }
    };
}

codes!(CUresult {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT = 202,
    CUDA_ERROR_ALREADY_MAPPED = 208,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_NOT_MAPPED = 211,
    CUDA_ERROR_UNSUPPORTED_LIMIT = 215,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    CUDA_ERROR_JIT_COMPILATION_DISABLED = 223,
    CUDA_ERROR_INVALID_SOURCE = 300,
    CUDA_ERROR_FILE_NOT_FOUND = 301,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705,
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
    CUDA_ERROR_UNKNOWN = 999,
});

impl CUresult {
    pub fn is_ok(self) -> bool {
        self.0 == 0
    }
}

pub type CUdevice = i32;
pub type CUdeviceptr = u64;
/// 32-bit device pointer of the CUDA 2.x ABI (`cuMemAlloc`, `cuMemFree` without `_v2`).
pub type CUdeviceptr_v1 = u32;
pub type CUcontext = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUlibrary = *mut c_void;
pub type CUkernel = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;
pub type CUhostFn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;
pub type CUstreamCallback =
    Option<unsafe extern "C" fn(stream: CUstream, status: CUresult, user_data: *mut c_void)>;

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`: the special stream handles.
pub const CU_STREAM_LEGACY: usize = 0x1;
pub const CU_STREAM_PER_THREAD: usize = 0x2;
pub const CU_STREAM_DEFAULT: u32 = 0x0;
pub const CU_STREAM_NON_BLOCKING: u32 = 0x1;

// cuLaunchKernel's `extra` array: key/value pairs ending with END (cuda.h's `..._AS_INT` values).
pub const CU_LAUNCH_PARAM_END_AS_INT: usize = 0x00;
pub const CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT: usize = 0x01;
pub const CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT: usize = 0x02;

pub const CU_EVENT_DEFAULT: u32 = 0x0;
pub const CU_EVENT_BLOCKING_SYNC: u32 = 0x1;
pub const CU_EVENT_DISABLE_TIMING: u32 = 0x2;
pub const CU_EVENT_INTERPROCESS: u32 = 0x4;

/// `cuGetProcAddress` flags.
pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CUdriverProcAddressQueryResult`.
pub const CU_GET_PROC_ADDRESS_SUCCESS: i32 = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: i32 = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: i32 = 2;

/// `CUdevice_attribute` values simgpu models.
pub mod attr {
    pub const MAX_THREADS_PER_BLOCK: i32 = 1;
    pub const MAX_BLOCK_DIM_X: i32 = 2;
    pub const MAX_BLOCK_DIM_Y: i32 = 3;
    pub const MAX_BLOCK_DIM_Z: i32 = 4;
    pub const MAX_GRID_DIM_X: i32 = 5;
    pub const MAX_GRID_DIM_Y: i32 = 6;
    pub const MAX_GRID_DIM_Z: i32 = 7;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: i32 = 8;
    pub const TOTAL_CONSTANT_MEMORY: i32 = 9;
    pub const WARP_SIZE: i32 = 10;
    pub const MAX_PITCH: i32 = 11;
    pub const MAX_REGISTERS_PER_BLOCK: i32 = 12;
    pub const CLOCK_RATE: i32 = 13;
    pub const TEXTURE_ALIGNMENT: i32 = 14;
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    pub const INTEGRATED: i32 = 18;
    pub const CAN_MAP_HOST_MEMORY: i32 = 19;
    pub const COMPUTE_MODE: i32 = 20;
    pub const CONCURRENT_KERNELS: i32 = 31;
    pub const ECC_ENABLED: i32 = 32;
    pub const PCI_BUS_ID: i32 = 33;
    pub const PCI_DEVICE_ID: i32 = 34;
    pub const MEMORY_CLOCK_RATE: i32 = 36;
    pub const GLOBAL_MEMORY_BUS_WIDTH: i32 = 37;
    pub const L2_CACHE_SIZE: i32 = 38;
    pub const MAX_THREADS_PER_MULTIPROCESSOR: i32 = 39;
    pub const ASYNC_ENGINE_COUNT: i32 = 40;
    pub const UNIFIED_ADDRESSING: i32 = 41;
    pub const PCI_DOMAIN_ID: i32 = 50;
    pub const TEXTURE_PITCH_ALIGNMENT: i32 = 51;
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    pub const STREAM_PRIORITIES_SUPPORTED: i32 = 78;
    pub const GLOBAL_L1_CACHE_SUPPORTED: i32 = 79;
    pub const LOCAL_L1_CACHE_SUPPORTED: i32 = 80;
    pub const MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: i32 = 81;
    pub const MAX_REGISTERS_PER_MULTIPROCESSOR: i32 = 82;
    pub const MANAGED_MEMORY: i32 = 83;
    pub const MULTI_GPU_BOARD: i32 = 84;
    pub const CONCURRENT_MANAGED_ACCESS: i32 = 89;
    pub const COMPUTE_PREEMPTION_SUPPORTED: i32 = 90;
    pub const COOPERATIVE_LAUNCH: i32 = 95;
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: i32 = 97;
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: i32 = 102;
    pub const MAX_BLOCKS_PER_MULTIPROCESSOR: i32 = 106;
    pub const RESERVED_SHARED_MEMORY_PER_BLOCK: i32 = 111;
    pub const MEMORY_POOLS_SUPPORTED: i32 = 115;
    pub const CLUSTER_LAUNCH: i32 = 120;
    pub const MEM_SYNC_DOMAIN_COUNT: i32 = 126;
    pub const TENSOR_MAP_ACCESS_SUPPORTED: i32 = 127;
    /// `CU_DEVICE_ATTRIBUTE_MAX` of CUDA 13.0: attributes at or above it are invalid.
    pub const MAX: i32 = 148;
}

/// `CUmemLocationType`.
pub const CU_MEM_LOCATION_TYPE_INVALID: u32 = 0;
pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
pub const CU_MEM_LOCATION_TYPE_HOST: u32 = 2;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA: u32 = 3;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: u32 = 4;
/// `CUmemAllocationType`.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: u32 = 1;
/// `CUmemAllocationHandleType`.
pub const CU_MEM_HANDLE_TYPE_NONE: u32 = 0;
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: u32 = 1;
/// `CUmemAllocationGranularity_flags`.
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: u32 = 0;
pub const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: u32 = 1;
/// `CUmemAccess_flags`.
pub const CU_MEM_ACCESS_FLAGS_PROT_NONE: u32 = 0;
pub const CU_MEM_ACCESS_FLAGS_PROT_READ: u32 = 1;
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: u32 = 3;

/// `CUmemPool_attribute`.
pub const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: u32 = 1;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: u32 = 2;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: u32 = 3;
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: u32 = 4;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: u32 = 5;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: u32 = 6;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: u32 = 7;
pub const CU_MEMPOOL_ATTR_USED_MEM_HIGH: u32 = 8;

/// `CUpointer_attribute` for `cuPointerGetAttribute`: the context an allocation is in.
pub const CU_POINTER_ATTRIBUTE_CONTEXT: u32 = 1;

/// `CUmemAttach_flags` for `cuMemAllocManaged`.
pub const CU_MEM_ATTACH_GLOBAL: u32 = 0x1;
pub const CU_MEM_ATTACH_HOST: u32 = 0x2;

/// `CUmem_advise` for `cuMemAdvise`, and the device that names the host there.
pub const CU_MEM_ADVISE_SET_READ_MOSTLY: i32 = 1;
pub const CU_MEM_ADVISE_UNSET_READ_MOSTLY: i32 = 2;
pub const CU_MEM_ADVISE_SET_PREFERRED_LOCATION: i32 = 3;
pub const CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION: i32 = 4;
pub const CU_MEM_ADVISE_SET_ACCESSED_BY: i32 = 5;
pub const CU_MEM_ADVISE_UNSET_ACCESSED_BY: i32 = 6;
pub const CU_DEVICE_CPU: i32 = -1;

/// `CUstreamCaptureMode` and `CUstreamCaptureStatus`.
pub const CU_STREAM_CAPTURE_MODE_GLOBAL: u32 = 0;
pub const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: u32 = 1;
pub const CU_STREAM_CAPTURE_MODE_RELAXED: u32 = 2;
pub const CU_STREAM_CAPTURE_STATUS_NONE: u32 = 0;
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: u32 = 1;
pub const CU_STREAM_CAPTURE_STATUS_INVALIDATED: u32 = 2;

/// `CUarray_format` values with a fixed element size.
pub mod array_format {
    pub const UNSIGNED_INT8: u32 = 0x01;
    pub const UNSIGNED_INT16: u32 = 0x02;
    pub const UNSIGNED_INT32: u32 = 0x03;
    pub const SIGNED_INT8: u32 = 0x08;
    pub const SIGNED_INT16: u32 = 0x09;
    pub const SIGNED_INT32: u32 = 0x0a;
    pub const HALF: u32 = 0x10;
    pub const FLOAT: u32 = 0x20;

    /// Bytes per channel of a plain format, `None` for formats simgpu does not model.
    pub fn bytes_per_channel(format: u32) -> Option<u64> {
        match format {
            UNSIGNED_INT8 | SIGNED_INT8 => Some(1),
            UNSIGNED_INT16 | SIGNED_INT16 | HALF => Some(2),
            UNSIGNED_INT32 | SIGNED_INT32 | FLOAT => Some(4),
            _ => None,
        }
    }
}

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUlaunchConfig` (56 bytes; `hStream` at 32, `attrs` at 40, `numAttrs` at 48).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUlaunchConfig {
    pub gridDimX: u32,
    pub gridDimY: u32,
    pub gridDimZ: u32,
    pub blockDimX: u32,
    pub blockDimY: u32,
    pub blockDimZ: u32,
    pub sharedMemBytes: u32,
    pub hStream: CUstream,
    pub attrs: *mut c_void,
    pub numAttrs: u32,
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemLocation {
    pub type_: u32,
    pub id: i32,
}

/// `CUmemAllocationProp` (32 bytes; `location` at 8).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    pub type_: u32,
    pub requestedHandleTypes: u32,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub compressionType: u8,
    pub gpuDirectRDMACapable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: u32,
}

/// `CUmemPoolProps` (88 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    pub allocType: u32,
    pub handleTypes: u32,
    pub location: CUmemLocation,
    pub win32SecurityAttributes: *mut c_void,
    pub maxSize: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Format: u32,
    pub NumChannels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Depth: usize,
    pub Format: u32,
    pub NumChannels: u32,
    pub Flags: u32,
}

/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUDA_ARRAY_MEMORY_REQUIREMENTS {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [u32; 4],
}

/// `CUipcMemHandle` and `CUipcEventHandle`: 64 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUipcMemHandle {
    pub reserved: [u8; 64],
}

// ---------------------------------------------------------------------------------------------
// NVML
// ---------------------------------------------------------------------------------------------

/// `nvmlReturn_t`.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct nvmlReturn_t(pub u32);

codes!(nvmlReturn_t {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
});

pub type nvmlDevice_t = *mut c_void;

/// `nvmlMemory_t` (v1, 24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlMemory_v2_t {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2`: `sizeof(nvmlMemory_v2_t) | 2 << 24`.
pub const NVML_MEMORY_V2: u32 = 0x0200_0028;

/// `nvmlProcessInfo_v1_t` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: u32,
    pub usedGpuMemory: u64,
}

/// `nvmlProcessInfo_v2_t`, also `nvmlProcessInfo_t` of the `_v3` call (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessInfo_v2_t {
    pub pid: u32,
    pub usedGpuMemory: u64,
    pub gpuInstanceId: u32,
    pub computeInstanceId: u32,
}

/// `nvmlBAR1Memory_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlBAR1Memory_t {
    pub bar1Total: u64,
    pub bar1Free: u64,
    pub bar1Used: u64,
}

/// `NVML_TEMPERATURE_GPU`, the one `nvmlTemperatureSensors_t` value.
pub const NVML_TEMPERATURE_GPU: u32 = 0;

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlUtilization_t {
    pub gpu: u32,
    pub memory: u32,
}

/// `nvmlProcessUtilizationSample_t` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: u32,
    pub timeStamp: u64,
    pub smUtil: u32,
    pub memUtil: u32,
    pub encUtil: u32,
    pub decUtil: u32,
}

/// `nvmlPciInfo_t` (the `_v3` struct).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [u8; 16],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pciDeviceId: u32,
    pub pciSubSystemId: u32,
    pub busId: [u8; 32],
}

/// NVML's "not available" marker for per-process memory.
pub const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;
/// `gpuInstanceId`/`computeInstanceId` when MIG is off.
pub const NVML_NO_INSTANCE: u32 = 0xFFFF_FFFF;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_brief() {
        assert_eq!(size_of::<CUlaunchConfig>(), 56);
        assert_eq!(offset_of!(CUlaunchConfig, hStream), 32);
        assert_eq!(offset_of!(CUlaunchConfig, attrs), 40);
        assert_eq!(offset_of!(CUlaunchConfig, numAttrs), 48);
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(offset_of!(CUmemAllocationProp, location), 8);
        assert_eq!(size_of::<nvmlMemory_t>(), 24);
        assert_eq!(size_of::<nvmlMemory_v2_t>(), 40);
        assert_eq!(offset_of!(nvmlMemory_v2_t, total), 8);
        assert_eq!(offset_of!(nvmlMemory_v2_t, used), 32);
        assert_eq!(
            NVML_MEMORY_V2,
            size_of::<nvmlMemory_v2_t>() as u32 | 2 << 24
        );
    }

    #[test]
    fn unknown_codes_still_print() {
        assert_eq!(format!("{:?}", CUresult(2)), "CUDA_ERROR_OUT_OF_MEMORY(2)");
        assert_eq!(format!("{:?}", CUresult(12345)), "CUresult(12345)");
    }
}
