//! Kernel launches: every variant queues one item of `ns_per_block x blocks` engine time on the
//! stream's context (or records a kernel node while the stream is capturing).

use std::ffi::{c_uint, c_void};

use cuda_abi::{CUfunction, CUlaunchConfig, CUresult, CUstream};

use crate::driver::*;
use crate::handles::from_ptr;
use crate::stream::resolve;

#[allow(clippy::too_many_arguments)]
fn launch(f: CUfunction, grid: [c_uint; 3], block: [c_uint; 3], s: CUstream, ptsz: bool) -> Res {
    if grid.contains(&0)
        || block.contains(&0)
        || block.iter().map(|&b| b as u64).product::<u64>() > 1024
    {
        return Err(E_INVALID_VALUE);
    }
    let d = drv()?;
    let mut inner = d.inner.lock();
    let sref = resolve(&inner, s, ptsz)?;
    let per_block = inner
        .funcs
        .get(from_ptr(f))
        .ok_or(E_INVALID_HANDLE)?
        .ns_per_block;
    let blocks = grid.iter().map(|&g| g as u64).product::<u64>();
    let ns = per_block.saturating_mul(blocks);
    crate::stream::queue_kernel(d, &mut inner, sref, ns)
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
            _params: *mut *mut c_void,
            _extra: *mut *mut c_void,
        ) -> CUresult {
            status(launch(f, [gx, gy, gz], [bx, by, bz], s, $ptsz))
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
            _params: *mut *mut c_void,
        ) -> CUresult {
            status(launch(f, [gx, gy, gz], [bx, by, bz], s, $ptsz))
        }
    };
}

launch_cooperative!(cuLaunchCooperativeKernel, false);
launch_cooperative!(cuLaunchCooperativeKernel_ptsz, true);

fn launch_ex(config: *const CUlaunchConfig, f: CUfunction, ptsz: bool) -> Res {
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
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    _p: *mut *mut c_void,
    _e: *mut *mut c_void,
) -> CUresult {
    status(launch_ex(config, f, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    _p: *mut *mut c_void,
    _e: *mut *mut c_void,
) -> CUresult {
    status(launch_ex(config, f, true))
}
