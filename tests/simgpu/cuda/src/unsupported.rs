//! Entry points of features the simulator does not model, exported as the real driver exports
//! them and answering `CUDA_ERROR_NOT_SUPPORTED`: multicast objects (as on a GPU without
//! NVSwitch multicast, `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED` 0) and green contexts (SM
//! partitions). PyTorch resolves them at start-up as optional; a lookup that failed instead would
//! leave the runtime's last error set (`cudaErrorSymbolNotFound`), which its next check reports.

use std::ffi::{c_uint, c_void};

use cuda_abi::*;

use crate::driver::*;

/// NOT_SUPPORTED once the driver is initialised (its own errors first).
fn not_supported() -> CUresult {
    status(drv().and(Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)))
}

macro_rules! unsupported {
    ($($name:ident ($($arg:ident : $ty:ty),*);)*) => {
        $(
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                $(let _ = $arg;)*
                not_supported()
            }
        )*
    };
}

unsupported! {
    cuMulticastCreate(handle: *mut u64, prop: *const c_void);
    cuMulticastAddDevice(handle: u64, dev: CUdevice);
    cuMulticastBindMem(mc: u64, mc_offset: usize, mem: u64, mem_offset: usize, size: usize, flags: u64);
    cuMulticastUnbind(mc: u64, dev: CUdevice, mc_offset: usize, size: usize);
    cuDeviceGetDevResource(dev: CUdevice, out: *mut c_void, kind: c_uint);
    cuDevSmResourceSplitByCount(out: *mut c_void, groups: *mut c_uint, input: *const c_void, rest: *mut c_void, flags: c_uint, min: c_uint);
    cuDevResourceGenerateDesc(desc: *mut *mut c_void, resources: *mut c_void, n: c_uint);
    cuGreenCtxCreate(out: *mut *mut c_void, desc: *mut c_void, dev: CUdevice, flags: c_uint);
    cuGreenCtxDestroy(ctx: *mut c_void);
    cuCtxFromGreenCtx(out: *mut CUcontext, ctx: *mut c_void);
    cuGreenCtxStreamCreate(out: *mut CUstream, ctx: *mut c_void, flags: c_uint, priority: i32);
}
