//! What a context and its kernels are configured with, and what fits on an SM: context limits
//! (`cuCtxGetLimit`/`cuCtxSetLimit`), cache and shared-memory bank configuration, peer access,
//! and the occupancy calculator (blocks per SM, dynamic shared memory, clusters). NVIDIA's
//! runtime reaches these through `cudaDeviceGetLimit`, `cudaDeviceCanAccessPeer`,
//! `cudaOccupancyMaxActiveBlocksPerMultiprocessor` (which CUB's sorts call, so CuPy's
//! `cupy.sort` needs it), `cudaOccupancyMaxActiveClusters` (which cuBLAS calls for each cluster
//! size when it starts) and the like.
//!
//! The simulator times kernels and never runs them, so these settings are recorded and reported
//! back and change nothing it models. Values are those of an H100 SXM: per SM 64 warps, 32
//! blocks, 64 Ki registers and 228 KiB of shared memory (1 KiB of it reserved per block), as
//! `cuDeviceGetAttribute` reports them; the SMs sit in 8 GPCs, dealt in pairs (132 SMs: two GPCs
//! of 18, six of 16), and a cluster's blocks run in one GPC. A kernel uses 32 registers a thread
//! and no static shared memory (as `cuFuncGetAttribute` says). Devices have no peer access to
//! each other (as PCIe GPUs without P2P: `cuDeviceCanAccessPeer` answers 0 and
//! `cuCtxEnablePeerAccess` `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`), unless the machine was made with
//! `simgpu init --nvlink`: then every pair is linked as on an SXM board (access, native atomics
//! and arrays, the best rank) and peer access is enabled and disabled per pair of contexts.

use std::collections::{BTreeSet, HashMap};
use std::ffi::{c_int, c_uint};
use std::sync::Mutex;

use cuda_abi::{CUcontext, CUdevice, CUfunction, CUlaunchConfig, CUresult};

use crate::driver::*;
use crate::handles::from_ptr;

/// `CUlimit` values, in `cuda.h`'s order, and an H100's defaults.
const LIMITS: [usize; 7] = [
    1024,    // CU_LIMIT_STACK_SIZE
    1 << 20, // CU_LIMIT_PRINTF_FIFO_SIZE
    8 << 20, // CU_LIMIT_MALLOC_HEAP_SIZE
    2,       // CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH
    2048,    // CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT
    64,      // CU_LIMIT_MAX_L2_FETCH_GRANULARITY
    0,       // CU_LIMIT_PERSISTING_L2_CACHE_SIZE
];
const LIMIT_L2_FETCH: usize = 5;
const LIMIT_PERSISTING_L2: usize = 6;

/// `CUfunc_cache`: PREFER_NONE .. PREFER_EQUAL.
const FUNC_CACHE_MAX: c_int = 3;
/// `CUsharedconfig`: DEFAULT_BANK_SIZE, FOUR_BYTE_BANK_SIZE, EIGHT_BYTE_BANK_SIZE.
const SHARED_CONFIG_MAX: c_int = 2;
/// An H100's banks are four bytes wide and cannot be changed.
const SHARED_CONFIG_FOUR_BYTE: c_int = 1;

/// `CUdevice_P2PAttribute`: performance rank .. CUDA array access (1..=4; 3 is the deprecated
/// alias of 4 and still accepted).
const P2P_ATTRIBUTE_MAX: c_int = 4;

/// SM resources of an H100 (compute capability 9.0).
const WARPS_PER_SM: u64 = 64;
const BLOCKS_PER_SM: u64 = 32;
const REGS_PER_SM: u64 = 64 * 1024;
const REGS_PER_THREAD: u64 = 32;
const SHARED_PER_SM: u64 = 228 * 1024;
const SHARED_RESERVED_PER_BLOCK: u64 = 1024;
const SHARED_PER_BLOCK_OPTIN: u64 = 227 * 1024;
const MAX_THREADS_PER_BLOCK: u64 = 1024;

/// Per context: its limits and cache configuration.
#[derive(Clone, Copy)]
struct Settings {
    limits: [usize; 7],
    cache: c_int,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            limits: LIMITS,
            cache: 0,
        }
    }
}

static SETTINGS: Mutex<Option<HashMap<u64, Settings>>> = Mutex::new(None);

/// Runs `f` on the current context's settings.
fn with_current<T>(f: impl FnOnce(&mut Settings) -> Res<T>) -> Res<T> {
    let d = drv()?;
    let (ctx, _) = d.inner.lock().cur().map(|(h, c)| (h, c.dev))?;
    let mut all = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    f(all.get_or_insert_with(HashMap::new).entry(ctx).or_default())
}

fn limit_index(limit: c_int) -> Res<usize> {
    usize::try_from(limit)
        .ok()
        .filter(|&i| i < LIMITS.len())
        .ok_or(CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT)
}

/// # Safety
/// `value` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, limit: c_int) -> CUresult {
    status(with_current(|s| {
        let i = limit_index(limit)?;
        // SAFETY: out-pointer from the caller (NULL refused by `put`).
        unsafe { put(value, s.limits[i]) }
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    status(with_current(|s| {
        let i = limit_index(limit)?;
        s.limits[i] = match i {
            // A hint between 0 and 128 bytes, a power of two.
            LIMIT_L2_FETCH if value > 128 || !(value == 0 || value.is_power_of_two()) => {
                return Err(E_INVALID_VALUE);
            }
            // Clamped to CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE, as the driver clamps
            // it; simgpu reports that attribute as 0 (it models no L2).
            LIMIT_PERSISTING_L2 => 0,
            _ => value,
        };
        Ok(())
    }))
}

/// # Safety
/// `config` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCacheConfig(config: *mut c_int) -> CUresult {
    // SAFETY: out-pointer from the caller (NULL refused by `put`).
    status(with_current(|s| unsafe { put(config, s.cache) }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCacheConfig(config: c_int) -> CUresult {
    status(with_current(|s| {
        if !(0..=FUNC_CACHE_MAX).contains(&config) {
            return Err(E_INVALID_VALUE);
        }
        s.cache = config;
        Ok(())
    }))
}

/// # Safety
/// `config` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetSharedMemConfig(config: *mut c_int) -> CUresult {
    // SAFETY: out-pointer from the caller (NULL refused by `put`).
    status(with_current(|_| unsafe {
        put(config, SHARED_CONFIG_FOUR_BYTE)
    }))
}

/// The bank size is fixed on this device: a valid setting is accepted and changes nothing.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetSharedMemConfig(config: c_int) -> CUresult {
    status(with_current(|_| shared_config(config)))
}

fn shared_config(config: c_int) -> Res {
    if (0..=SHARED_CONFIG_MAX).contains(&config) {
        Ok(())
    } else {
        Err(E_INVALID_VALUE)
    }
}

/// A function handle this process made (a CUfunction or a CUkernel).
fn check_func(f: CUfunction) -> Res {
    let d = drv()?;
    d.inner
        .lock()
        .funcs
        .get(from_ptr(f))
        .map(|_| ())
        .ok_or(E_INVALID_HANDLE)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetCacheConfig(f: CUfunction, config: c_int) -> CUresult {
    status(check_func(f).and_then(|()| {
        if (0..=FUNC_CACHE_MAX).contains(&config) {
            Ok(())
        } else {
            Err(E_INVALID_VALUE)
        }
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetSharedMemConfig(f: CUfunction, config: c_int) -> CUresult {
    status(check_func(f).and_then(|()| shared_config(config)))
}

// ---- peer access -----------------------------------------------------------------------------

/// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK`.
const P2P_PERFORMANCE_RANK: c_int = 1;

/// (context, peer context) pairs with peer access enabled, in this process.
static PEERS: Mutex<BTreeSet<(u64, u64)>> = Mutex::new(BTreeSet::new());

fn peers() -> std::sync::MutexGuard<'static, BTreeSet<(u64, u64)>> {
    PEERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// 1 where the devices are linked (`simgpu init --nvlink`), else 0.
///
/// # Safety
/// `can` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    status(drv().and_then(|d| {
        let (a, b) = (d.physical(dev)?, d.physical(peer)?);
        // SAFETY: out-pointer from the caller (NULL refused by `put`).
        unsafe { put(can, d.state.linked(a, b).into()) }
    }))
}

/// Linked devices: access, native atomics and CUDA arrays supported, performance rank 0 (the
/// best). Otherwise every attribute is 0.
///
/// # Safety
/// `value` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetP2PAttribute(
    value: *mut c_int,
    attrib: c_int,
    src: CUdevice,
    dst: CUdevice,
) -> CUresult {
    status(drv().and_then(|d| {
        let (a, b) = (d.physical(src)?, d.physical(dst)?);
        if src == dst {
            return Err(E_INVALID_DEVICE);
        }
        if !(1..=P2P_ATTRIBUTE_MAX).contains(&attrib) {
            return Err(E_INVALID_VALUE);
        }
        let v = d.state.linked(a, b) && attrib != P2P_PERFORMANCE_RANK;
        // SAFETY: out-pointer from the caller (NULL refused by `put`).
        unsafe { put(value, v.into()) }
    }))
}

/// Access from the current context to `peer`'s memory: on linked devices enabled once per pair
/// (`CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` the second time), refused for a context on the same
/// device (`CUDA_ERROR_INVALID_DEVICE`) and between devices that are not linked.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> CUresult {
    status(drv().and_then(|d| {
        let inner = d.inner.lock();
        let (cur, c) = inner.cur()?;
        let h = from_ptr(peer as *mut _);
        let p = inner.ctx(h)?;
        if flags != 0 {
            return Err(E_INVALID_VALUE);
        }
        if c.dev == p.dev {
            return Err(E_INVALID_DEVICE);
        }
        if !d.state.linked(c.dev, p.dev) {
            return Err(CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
        }
        if !peers().insert((cur, h)) {
            return Err(CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        Ok(())
    }))
}

/// `CUDA_ERROR_PEER_ACCESS_NOT_ENABLED` unless access to `peer` was enabled from the current
/// context.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDisablePeerAccess(peer: CUcontext) -> CUresult {
    status(drv().and_then(|d| {
        let inner = d.inner.lock();
        let (cur, _) = inner.cur()?;
        let h = from_ptr(peer as *mut _);
        inner.ctx(h)?;
        if !peers().remove(&(cur, h)) {
            return Err(CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
        }
        Ok(())
    }))
}

// ---- occupancy -------------------------------------------------------------------------------

/// Blocks of `block_size` threads with `dynamic_smem` bytes of dynamic shared memory that fit on
/// one SM at once. Pure: the H100 figures above in, a count out.
fn max_active_blocks(block_size: u64, dynamic_smem: u64) -> u64 {
    if block_size == 0
        || block_size > MAX_THREADS_PER_BLOCK
        || dynamic_smem > SHARED_PER_BLOCK_OPTIN
    {
        return 0;
    }
    let warps = block_size.div_ceil(32);
    let by_warps = WARPS_PER_SM / warps;
    let by_regs = REGS_PER_SM / (warps * 32 * REGS_PER_THREAD);
    let by_smem = SHARED_PER_SM / (dynamic_smem + SHARED_RESERVED_PER_BLOCK);
    BLOCKS_PER_SM.min(by_warps).min(by_regs).min(by_smem)
}

fn occupancy(out: *mut c_int, f: CUfunction, block_size: c_int, smem: usize) -> Res {
    check_func(f)?;
    let block_size = u64::try_from(block_size).map_err(|_| E_INVALID_VALUE)?;
    let n = max_active_blocks(block_size, smem as u64);
    // SAFETY: out-pointer from the caller (NULL refused by `put`).
    unsafe { put(out, n as c_int) }
}

/// # Safety
/// `out` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    out: *mut c_int,
    f: CUfunction,
    block_size: c_int,
    dynamic_smem: usize,
) -> CUresult {
    status(occupancy(out, f, block_size, dynamic_smem))
}

/// `flags`: `CU_OCCUPANCY_DEFAULT` (0) or `CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE` (1), which
/// changes nothing here (no caching is modelled).
///
/// # Safety
/// `out` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    out: *mut c_int,
    f: CUfunction,
    block_size: c_int,
    dynamic_smem: usize,
    flags: c_uint,
) -> CUresult {
    if flags > 1 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    status(occupancy(out, f, block_size, dynamic_smem))
}

/// The dynamic shared memory a block may use so that `num_blocks` blocks of `block_size`
/// threads fit on an SM.
///
/// # Safety
/// `out` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    out: *mut usize,
    f: CUfunction,
    num_blocks: c_int,
    block_size: c_int,
) -> CUresult {
    status(check_func(f).and_then(|()| {
        let (blocks, threads) = match (u64::try_from(num_blocks), u64::try_from(block_size)) {
            (Ok(b), Ok(t)) if b > 0 && t > 0 => (b, t),
            _ => return Err(E_INVALID_VALUE),
        };
        let avail = if max_active_blocks(threads, 0) < blocks {
            0
        } else {
            (SHARED_PER_SM / blocks)
                .saturating_sub(SHARED_RESERVED_PER_BLOCK)
                .min(SHARED_PER_BLOCK_OPTIN)
        };
        // SAFETY: out-pointer from the caller (NULL refused by `put`).
        unsafe { put(out, avail as usize) }
    }))
}

/// GPCs of an H100 SXM: a cluster's blocks must all run in one.
const GPCS: u64 = 8;
/// The most blocks a cluster may have: portable, and with
/// `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`.
const CLUSTER_PORTABLE: u64 = 8;
const CLUSTER_NON_PORTABLE: u64 = 16;
/// `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`; a `CUlaunchAttribute` is 72 bytes: the id, padding
/// to 8, then a 64-byte value (for this id three u32: x, y, z).
const ATTR_CLUSTER_DIMENSION: u32 = 4;
const LAUNCH_ATTRIBUTE_SIZE: usize = 72;

/// Block size, dynamic shared memory and cluster size (1 without the cluster attribute) of a
/// launch configuration.
///
/// # Safety
/// `config` must be NULL or point to a `CUlaunchConfig` whose `attrs` holds `numAttrs` entries.
unsafe fn launch_shape(config: *const CUlaunchConfig) -> Res<(u64, u64, u64)> {
    if config.is_null() {
        return Err(E_INVALID_VALUE);
    }
    // SAFETY: per the contract.
    let c = unsafe { config.read_unaligned() };
    let block = c.blockDimX as u64 * c.blockDimY as u64 * c.blockDimZ as u64;
    let mut cluster = 1;
    for i in 0..c.numAttrs as usize {
        // SAFETY: per the contract, `attrs` has `numAttrs` entries of LAUNCH_ATTRIBUTE_SIZE.
        unsafe {
            let a = (c.attrs as *const u8).add(i * LAUNCH_ATTRIBUTE_SIZE);
            if (a as *const u32).read_unaligned() == ATTR_CLUSTER_DIMENSION {
                let dim = a.add(8) as *const u32;
                cluster = (0..3).map(|k| dim.add(k).read_unaligned() as u64).product();
            }
        }
    }
    Ok((block, c.sharedMemBytes as u64, cluster))
}

/// SMs per GPC: the device's SMs dealt to 8 GPCs in pairs (TPCs), as a harvested H100 has
/// them: 132 SMs are 18, 18, 16, 16, 16, 16, 16, 16.
fn gpc_sms(sm_count: u64) -> Vec<u64> {
    let tpcs = sm_count / 2;
    (0..GPCS)
        .map(|g| 2 * (tpcs / GPCS + u64::from(g < tpcs % GPCS)))
        .collect()
}

/// Clusters of `cluster` blocks of this shape that run at once: each within one GPC, whose SMs
/// each hold `max_active_blocks`.
fn max_active_clusters(sm_count: u64, block: u64, smem: u64, cluster: u64) -> u64 {
    if cluster == 0 || cluster > CLUSTER_NON_PORTABLE {
        return 0;
    }
    let per_sm = max_active_blocks(block, smem);
    gpc_sms(sm_count)
        .iter()
        .map(|sms| sms * per_sm / cluster)
        .sum()
}

/// # Safety
/// `out` must be NULL or writable; `config` as for [`launch_shape`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveClusters(
    out: *mut c_int,
    f: CUfunction,
    config: *const CUlaunchConfig,
) -> CUresult {
    status(check_func(f).and_then(|()| {
        // SAFETY: per the contract.
        let (block, smem, cluster) = unsafe { launch_shape(config) }?;
        let sms = drv()?.state.config().sm_count as u64;
        let n = max_active_clusters(sms, block, smem, cluster);
        // SAFETY: out-pointer from the caller (NULL refused by `put`).
        unsafe { put(out, n as c_int) }
    }))
}

/// The portable maximum, 8, whatever the kernel (whether it allows non-portable sizes is not
/// recorded); 0 if not even one block of the configuration fits on an SM.
///
/// # Safety
/// `out` must be NULL or writable; `config` as for [`launch_shape`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialClusterSize(
    out: *mut c_int,
    f: CUfunction,
    config: *const CUlaunchConfig,
) -> CUresult {
    status(check_func(f).and_then(|()| {
        // SAFETY: per the contract.
        let (block, smem, _) = unsafe { launch_shape(config) }?;
        let n = if max_active_blocks(block, smem) == 0 {
            0
        } else {
            CLUSTER_PORTABLE
        };
        // SAFETY: out-pointer from the caller (NULL refused by `put`).
        unsafe { put(out, n as c_int) }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occupancy_on_an_h100() {
        for (block, smem, want) in [
            (32, 0, 32),         // the block limit
            (128, 0, 16),        // 4 warps: 64 / 4
            (256, 0, 8),         //
            (1024, 0, 2),        // 32 warps
            (96, 0, 21),         // 3 warps: 64 / 3
            (33, 0, 32),         // rounds up to 2 warps: 32
            (128, 48 << 10, 4),  // 228 KiB / 49 KiB
            (128, 227 << 10, 1), // the opt-in maximum
            (128, 228 << 10, 0), // more than a block may have
            (0, 0, 0),           //
            (1025, 0, 0),        //
        ] {
            assert_eq!(
                max_active_blocks(block, smem),
                want,
                "{block} threads, {smem} B"
            );
        }
    }

    #[test]
    fn clusters_fit_in_a_gpc() {
        assert_eq!(gpc_sms(132), [18, 18, 16, 16, 16, 16, 16, 16]);
        assert_eq!(gpc_sms(132).iter().sum::<u64>(), 132);
        // 16 blocks of 128 threads per SM.
        assert_eq!(max_active_clusters(132, 128, 0, 1), 132 * 16);
        assert_eq!(max_active_clusters(132, 1024, 0, 2), 132);
        // One block per SM.
        assert_eq!(max_active_clusters(132, 1, 227 << 10, 3), 2 * 6 + 6 * 5);
        assert_eq!(max_active_clusters(132, 1, 227 << 10, 8), 2 * 2 + 6 * 2);
        assert_eq!(max_active_clusters(132, 1, 227 << 10, 16), 8);
        assert_eq!(max_active_clusters(132, 1, 227 << 10, 17), 0);
        assert_eq!(max_active_clusters(132, 2048, 0, 1), 0);
    }

    #[test]
    fn limits_have_the_driver_s_defaults_and_an_unknown_one_is_refused() {
        assert_eq!(limit_index(0), Ok(0));
        assert_eq!(limit_index(6), Ok(6));
        assert_eq!(limit_index(7), Err(CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT));
        assert_eq!(limit_index(-1), Err(CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT));
        assert_eq!(Settings::default().limits[0], 1024);
    }
}
