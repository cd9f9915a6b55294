//! Kernel launches: every variant queues one item of engine time on the stream's context (or
//! records a kernel node while the stream is capturing); `Kernel::launch_cost` says how much.

use std::ffi::{c_uint, c_void};

use cuda_abi::{CUfunction, CUlaunchConfig, CUresult, CUstream};

use crate::driver::*;
use crate::handles::from_ptr;
use crate::module::Args;
use crate::stream::resolve;

fn launch(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    s: CUstream,
    ptsz: bool,
    args: Args,
) -> Res {
    if grid.contains(&0)
        || block.contains(&0)
        || block.iter().map(|&b| b as u64).product::<u64>() > 1024
    {
        return Err(E_INVALID_VALUE);
    }
    let d = drv()?;
    let mut inner = d.inner.lock();
    let sref = resolve(&inner, s, ptsz)?;
    let blocks = grid.iter().map(|&g| g as u64).product::<u64>();
    let sms = u64::from(d.state.config().sm_count);
    let cost = inner
        .funcs
        .get(from_ptr(f))
        .ok_or(E_INVALID_HANDLE)?
        .kernel
        .launch_cost(blocks, sms, args)?;
    crate::stream::queue_kernel(d, &mut inner, sref, cost)
}

macro_rules! launch_kernel {
    ($name:ident, $ptsz:expr) => {
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            f: CUfunction,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            _shared: c_uint,
            s: CUstream,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CUresult {
            let args = Args { params, extra };
            status(launch(f, [gx, gy, gz], [bx, by, bz], s, $ptsz, args))
        }
    };
}

launch_kernel!(cuLaunchKernel, false);
launch_kernel!(cuLaunchKernel_ptsz, true);

macro_rules! launch_cooperative {
    ($name:ident, $ptsz:expr) => {
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            f: CUfunction,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            _shared: c_uint,
            s: CUstream,
            params: *mut *mut c_void,
        ) -> CUresult {
            let args = Args {
                params,
                extra: std::ptr::null_mut(),
            };
            status(launch(f, [gx, gy, gz], [bx, by, bz], s, $ptsz, args))
        }
    };
}

launch_cooperative!(cuLaunchCooperativeKernel, false);
launch_cooperative!(cuLaunchCooperativeKernel_ptsz, true);

fn launch_ex(config: *const CUlaunchConfig, f: CUfunction, ptsz: bool, args: Args) -> Res {
    if config.is_null() {
        return Err(E_INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the caller passes a launch configuration.
    let c = unsafe { *config };
    launch(
        f,
        [c.gridDimX, c.gridDimY, c.gridDimZ],
        [c.blockDimX, c.blockDimY, c.blockDimZ],
        c.hStream,
        ptsz,
        args,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    status(launch_ex(config, f, false, Args { params, extra }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    status(launch_ex(config, f, true, Args { params, extra }))
}
