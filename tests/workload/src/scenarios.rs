//! The scenarios: each drives the driver one way real software does and reports JSON lines.

mod launch;
mod memcpy;
mod memory;
mod threads;

pub use launch::{bench_launch, calibrate_work, launch, probe};
pub use memcpy::{keep, memcpy, pattern};
pub use memory::{block_steps, fill, hold, steps};
pub use threads::{bench_alloc, churn};

use launch::sync_with_event;
use memory::{Allocator, Block};
pub(crate) use threads::monotonic_ns;

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use cuda_abi::*;
use serde_json::{Map, Value, json};

use crate::driver::{CuError, Driver};
use crate::kernels::{BLOCK_DIM, ImageArg, Kernel, KernelArg, Shape};
use crate::out::{cu_error, emit};

/// Why a scenario did not run as designed.
#[derive(Debug)]
pub enum Failure {
    /// An unexpected driver error: reported as an `error` event.
    Cu(CuError),
    /// A check failed; its event already says so.
    Check,
}

impl From<CuError> for Failure {
    fn from(e: CuError) -> Failure {
        Failure::Cu(e)
    }
}

/// An allocation API family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Family {
    /// cuMemAlloc_v2
    Mem,
    /// cuMemAllocPitch_v2 (rows of 1 MiB - 1000 bytes, chunk / 1 MiB rows)
    Pitch,
    /// cuMemAllocManaged (CU_MEM_ATTACH_GLOBAL), each allocation then set to zero on the device
    /// (cuMemsetD8_v2, synchronised), so that its pages are resident on the GPU: the driver backs
    /// managed memory with device memory only where it is touched
    Managed,
    /// cuArrayCreate_v2 (FLOAT, 4096 wide, chunk / 16 KiB high)
    Array,
    /// cuArray3DCreate_v2 (FLOAT, 1024 x 1024, chunk / 4 MiB deep)
    Array3d,
    /// cuMipmappedArrayCreate (2D FLOAT, power-of-two side, 4 levels)
    Mipmap,
    /// cuMemAllocAsync on a created stream
    Async,
    /// cuMemAllocFromPoolAsync from the default pool, release threshold UINT64_MAX
    Pool,
    /// cuMemAddressReserve + cuMemCreate + cuMemMap + cuMemSetAccess
    Vmm,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Mem => "mem",
            Family::Pitch => "pitch",
            Family::Managed => "managed",
            Family::Array => "array",
            Family::Array3d => "array3d",
            Family::Mipmap => "mipmap",
            Family::Async => "async",
            Family::Pool => "pool",
            Family::Vmm => "vmm",
        }
    }
}

/// How kernels are launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Via {
    /// cuLaunchKernel
    Kernel,
    /// cuLaunchKernelEx
    Ex,
    /// cuLaunchCooperativeKernel
    Coop,
    /// one captured launch, replayed with cuGraphLaunch
    Graph,
}

impl Via {
    pub fn name(self) -> &'static str {
        match self {
            Via::Kernel => "kernel",
            Via::Ex => "ex",
            Via::Coop => "coop",
            Via::Graph => "graph",
        }
    }
}

/// The value at quantile `q` (0 to 1) of `sorted`, by nearest rank; None when it is empty.
pub(crate) fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    let last = sorted.len().checked_sub(1)?;
    sorted.get((last as f64 * q).round() as usize).copied()
}

pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    cuslice_policy::parse_size(s).map_err(|e| e.to_string())
}

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds >= 0")),
    }
}

#[derive(Clone, Debug, Args)]
pub struct FillArgs {
    /// Allocation family
    #[arg(long, value_enum)]
    pub family: Family,
    /// Bytes per allocation (4GiB, 512MiB, 1.5GiB, 4g, 4096m or plain bytes)
    #[arg(long, value_parser = parse_size)]
    pub chunk: u64,
    /// Seconds to hold everything after the refusal before freeing
    #[arg(long, value_parser = parse_secs, default_value = "0")]
    pub hold: f64,
    /// Stop after this many successful allocations
    #[arg(long)]
    pub max_count: Option<u64>,
}

#[derive(Clone, Debug, Args)]
pub struct HoldArgs {
    /// Bytes to allocate
    #[arg(long, value_parser = parse_size)]
    pub bytes: u64,
    /// Allocation family
    #[arg(long, value_enum, default_value = "mem")]
    pub family: Family,
    /// Seconds to hold; without it, hold until stdin reaches EOF
    #[arg(long, value_parser = parse_secs)]
    pub secs: Option<f64>,
    /// Once allocated, write zeros over every 8-byte word of this file (a slice's ledger, e.g.
    /// /run/cuslice/slice/ledger) that equals the memory the driver now reports in use: a
    /// tenant hiding what it holds from the ledger's counters
    #[arg(long, value_name = "LEDGER")]
    pub zero_ledger: Option<std::path::PathBuf>,
    /// Once allocated, mark this process frozen to the host in this file (a slice's ledger),
    /// while it holds its memory on the device: a tenant making itself look smaller
    #[arg(long, value_name = "LEDGER", conflicts_with = "zero_ledger")]
    pub forge_frozen: Option<std::path::PathBuf>,
    /// Free the allocation as soon as it is made (async and pool: cuMemFreeAsync, then
    /// cuStreamSynchronize) and hold only the context; `holding` reports free after the free
    #[arg(long)]
    pub free_at_once: bool,
    /// Do not call cuMemGetInfo before `holding` (its free and total are null): what other
    /// processes see then comes from the allocation calls and synchronisations alone
    #[arg(long, conflicts_with_all = ["zero_ledger", "forge_frozen"])]
    pub no_mem_info: bool,
    /// Async and pool families: wait for the stream with an event (cuEventRecord +
    /// cuEventSynchronize) instead of cuStreamSynchronize
    #[arg(long)]
    pub sync_event: bool,
}

#[derive(Clone, Debug, Args)]
pub struct StepsArgs {
    /// Bytes each step asks for
    #[arg(long, value_parser = parse_size)]
    pub bytes: u64,
}

#[derive(Clone, Debug, Args)]
pub struct LaunchArgs {
    /// Device nanoseconds of each block of the kernel: each launch keeps the device busy for
    /// ns-per-block x blocks (see --image; on a real GPU the work kernel's length comes from
    /// --work-iters)
    #[arg(long)]
    pub ns_per_block: u64,
    /// Blocks per launch
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub blocks: u32,
    /// The kernel: spin (waits on the device's clock: ends on time, whatever else ran) or work
    /// (a fixed amount of arithmetic: what a process completes measures the device time it got)
    #[arg(long, value_enum, default_value = "spin")]
    pub kernel: KernelArg,
    /// The work kernel's iterations per launch (per thread), for its length on a real GPU
    /// (`calibrate-work` prints them) [default: 450 per microsecond of the kernel's length]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub work_iters: Option<u64>,
    /// Kernel image: auto (PTX, else the simulator's text image), ptx, or text. With PTX the
    /// blocks run side by side, so min(blocks, SMs) blocks each spin for ns-per-block x blocks
    #[arg(long, value_enum, default_value = "auto")]
    pub image: ImageArg,
    /// Seconds of wall time to keep launching; 0 = exactly --count launches
    #[arg(long, value_parser = parse_secs)]
    pub secs: f64,
    /// Launches to make when --secs is 0
    #[arg(long)]
    pub count: Option<u64>,
    /// Launch API
    #[arg(long, value_enum, default_value = "kernel")]
    pub via: Via,
    /// Streams to launch on, round-robin
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub streams: u32,
    /// Launches in flight per stream at most
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub depth: u32,
    /// Launch K kernels, then wait for all of them (each stream synchronised), and repeat, as a
    /// loop that synchronises every K iterations does (--depth is then not used)
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub sync_every: Option<u32>,
    /// Print a `progress` line every this many milliseconds, and one at the end (0: none; a
    /// reader must then drain stdout as the run goes, or the workload blocks on a full pipe)
    #[arg(long, default_value_t = 0)]
    pub progress_ms: u64,
    /// Seconds to wait, the context made and the kernel loaded, before the first launch (as a
    /// framework does between making its context and its first kernels); --secs counts from the
    /// first launch
    #[arg(long, value_parser = parse_secs, default_value_t = 0.0)]
    pub idle_secs: f64,
}

#[derive(Clone, Debug, Args)]
pub struct CalibrateWorkArgs {
    /// The kernel length to find the work kernel's iterations for, in microseconds
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub us: u64,
    /// Kernels timed back to back in each round
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub kernels: u32,
    /// Kernel image: auto (PTX, else the simulator's text image), ptx, or text
    #[arg(long, value_enum, default_value = "auto")]
    pub image: ImageArg,
}

#[derive(Clone, Debug, Args)]
pub struct MemcpyArgs {
    /// Bytes to copy each way
    #[arg(long, value_parser = parse_size)]
    pub bytes: u64,
}

#[derive(Clone, Debug, Args)]
pub struct KeepArgs {
    /// Bytes to allocate and keep
    #[arg(long, value_parser = parse_size)]
    pub bytes: u64,
    /// Cells of work: each reads the kept bytes back and compares them
    #[arg(long, default_value_t = 3)]
    pub cells: u32,
    /// Seconds idle before each cell (no CUDA call meanwhile)
    #[arg(long, default_value_t = 3.0)]
    pub idle_secs: f64,
}

#[derive(Clone, Debug, Args)]
pub struct ChurnArgs {
    /// Threads, each with the process's primary context current
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: u32,
    /// Seconds each thread keeps allocating and freeing
    #[arg(long, value_parser = parse_secs)]
    pub secs: f64,
    /// Smallest allocation (sizes are whole MiB when [min, max] holds one)
    #[arg(long, value_parser = parse_size)]
    pub min: u64,
    /// Largest allocation
    #[arg(long, value_parser = parse_size)]
    pub max: u64,
    /// Allocations a thread holds at most; it frees a random one on reaching it
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub hold_max: u32,
    /// Seed of the threads' pseudo-random sizes and choices
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Allocation family
    #[arg(long, value_enum, default_value = "mem")]
    pub family: Family,
}

#[derive(Clone, Debug, Args)]
pub struct BenchAllocArgs {
    /// Timed cuMemAlloc_v2 + cuMemFree_v2 pairs per thread (after 1000 untimed ones)
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: u64,
    /// Threads, each with the process's primary context current
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: u32,
    /// Bytes per allocation
    #[arg(long, value_parser = parse_size, default_value = "1MiB")]
    pub size: u64,
}

#[derive(Clone, Debug, Args)]
pub struct BenchLaunchArgs {
    /// Timed batches
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub batches: u64,
    /// Launches per batch (timed together)
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,
    /// Untimed pause after each batch, in microseconds (the stream is synchronised first)
    #[arg(long, default_value_t = 1000)]
    pub pause_us: u64,
    /// Seconds of untimed batches first
    #[arg(long, value_parser = parse_secs, default_value = "1")]
    pub warmup_secs: f64,
    /// Device nanoseconds each launch takes (one block)
    #[arg(long, default_value_t = 1000)]
    pub kernel_ns: u64,
    /// The kernel: spin or work (see `launch`)
    #[arg(long, value_enum, default_value = "spin")]
    pub kernel: KernelArg,
    /// Kernel image: auto (PTX, else the simulator's text image), ptx, or text
    #[arg(long, value_enum, default_value = "auto")]
    pub image: ImageArg,
    /// Launch API
    #[arg(long, value_enum, default_value = "kernel")]
    pub via: Via,
}

#[derive(Clone, Debug, Args)]
pub struct ProbeArgs {
    /// Device microseconds each probe kernel takes (one block)
    #[arg(long, default_value_t = 200)]
    pub kernel_us: u64,
    /// One probe every this many milliseconds (launch, then cuStreamSynchronize)
    #[arg(long, default_value_t = 5.0)]
    pub period_ms: f64,
    /// Seconds of wall time to keep probing
    #[arg(long, value_parser = parse_secs)]
    pub secs: f64,
    /// Seconds of probes first that are not reported
    #[arg(long, value_parser = parse_secs, default_value = "0")]
    pub warmup_secs: f64,
    /// The kernel: spin or work (see `launch`)
    #[arg(long, value_enum, default_value = "spin")]
    pub kernel: KernelArg,
    /// The work kernel's iterations per probe (see `launch`)
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub work_iters: Option<u64>,
    /// Kernel image: auto (PTX, else the simulator's text image), ptx, or text
    #[arg(long, value_enum, default_value = "auto")]
    pub image: ImageArg,
    /// Print a `progress` line every this many milliseconds, and one at the end (0: none)
    #[arg(long, default_value_t = 0)]
    pub progress_ms: u64,
}

/// A device with its primary context current on this thread.
pub struct Session<'a> {
    pub d: &'a Driver,
    pub ordinal: i32,
    pub dev: CUdevice,
}

impl<'a> Session<'a> {
    /// cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent.
    pub fn open(d: &'a Driver, ordinal: i32) -> Result<Session<'a>, CuError> {
        let mut dev: CUdevice = 0;
        let mut ctx: CUcontext = null_mut();
        // SAFETY: plain flags argument.
        unsafe { d.cuInit(0) }?;
        // SAFETY: out-pointer to a local.
        unsafe { d.cuDeviceGet(&mut dev, ordinal) }?;
        // SAFETY: out-pointer to a local; `dev` came from cuDeviceGet.
        unsafe { d.cuDevicePrimaryCtxRetain(&mut ctx, dev) }?;
        // SAFETY: `ctx` is the retained primary context.
        unsafe { d.cuCtxSetCurrent(ctx) }?;
        Ok(Session { d, ordinal, dev })
    }

    /// Releases the primary context retained by `open`.
    pub fn close(self) -> Result<(), CuError> {
        // SAFETY: `dev` is valid and its primary context was retained once by `open`.
        unsafe { self.d.cuDevicePrimaryCtxRelease_v2(self.dev) }
    }

    /// The `start` event.
    pub fn start(&self, route: &str, scenario: &str) -> Result<(), CuError> {
        let total = total_mem(self.d, self.dev)?;
        let (free, reported_total) = mem_get_info(self.d)?;
        emit(
            "start",
            json!({"route": route, "scenario": scenario, "device": self.ordinal,
                   "total": total, "free": free, "reported_total": reported_total}),
        );
        Ok(())
    }
}

/// Adds the fields of `extra` (an object) to `into` (an object).
fn merge(into: &mut Value, extra: Value) {
    if let (Value::Object(into), Value::Object(extra)) = (into, extra) {
        into.extend(extra);
    }
}

/// cuMemGetInfo_v2: (free, total).
fn mem_get_info(d: &Driver) -> Result<(u64, u64), CuError> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: out-pointers to locals.
    unsafe { d.cuMemGetInfo_v2(&mut free, &mut total) }?;
    Ok((free as u64, total as u64))
}

/// cuMemGetInfo_v2 with one out-pointer NULL, each way round (the driver accepts either):
/// `{"free_only": {"code", "free"}, "total_only": {"code", "total"}}`.
fn mem_get_info_one(d: &Driver) -> Value {
    let code = |r: Result<(), CuError>| r.err().map_or(0, |e| e.code.0);
    let mut free = 0usize;
    // SAFETY: an out-pointer to a local, and NULL for the total.
    let free_rc = code(unsafe { d.cuMemGetInfo_v2(&mut free, null_mut()) });
    let mut total = 0usize;
    // SAFETY: NULL for the free figure, and an out-pointer to a local.
    let total_rc = code(unsafe { d.cuMemGetInfo_v2(null_mut(), &mut total) });
    json!({
        "free_only": {"code": free_rc, "free": free},
        "total_only": {"code": total_rc, "total": total},
    })
}

/// cuDeviceTotalMem_v2.
fn total_mem(d: &Driver, dev: CUdevice) -> Result<u64, CuError> {
    let mut total = 0usize;
    // SAFETY: out-pointer to a local.
    unsafe { d.cuDeviceTotalMem_v2(&mut total, dev) }?;
    Ok(total as u64)
}

fn attribute(d: &Driver, attr: i32, dev: CUdevice) -> Result<i32, CuError> {
    let mut v = 0;
    // SAFETY: out-pointer to a local.
    unsafe { d.cuDeviceGetAttribute(&mut v, attr, dev) }?;
    Ok(v)
}

fn sync(d: &Driver, stream: CUstream) -> Result<(), CuError> {
    // SAFETY: `stream` is a live stream this process created.
    unsafe { d.cuStreamSynchronize(stream) }
}

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it.
pub fn format_uuid(u: &CUuuid) -> String {
    let hex: String = u.bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

// ---------------------------------------------------------------------------------------------
// info
// ---------------------------------------------------------------------------------------------

pub fn info(s: &Session) -> Result<(), Failure> {
    let d = s.d;
    let mut version = 0;
    // SAFETY: out-pointer to a local.
    unsafe { d.cuDriverGetVersion(&mut version) }?;
    let mut count = 0;
    // SAFETY: out-pointer to a local.
    unsafe { d.cuDeviceGetCount(&mut count) }?;
    let mut devices = Vec::new();
    for ordinal in 0..count {
        let mut dev: CUdevice = 0;
        // SAFETY: out-pointer to a local.
        unsafe { d.cuDeviceGet(&mut dev, ordinal) }?;
        let mut name = [0u8; 256];
        // SAFETY: the buffer holds the length passed.
        unsafe { d.cuDeviceGetName(name.as_mut_ptr().cast::<c_char>(), name.len() as i32, dev) }?;
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        let mut uuid = CUuuid::default();
        // SAFETY: out-pointer to a local CUuuid.
        unsafe { d.cuDeviceGetUuid_v2(&mut uuid, dev) }?;
        let major = attribute(d, attr::COMPUTE_CAPABILITY_MAJOR, dev)?;
        let minor = attribute(d, attr::COMPUTE_CAPABILITY_MINOR, dev)?;
        devices.push(json!({
            "ordinal": ordinal,
            "name": String::from_utf8_lossy(&name[..end]),
            "uuid": format_uuid(&uuid),
            "total": total_mem(d, dev)?,
            "multiprocessor_count": attribute(d, attr::MULTIPROCESSOR_COUNT, dev)?,
            "compute_capability": [major, minor],
        }));
    }
    let (free, total) = mem_get_info(d)?;
    emit(
        "info",
        json!({
            "driver_version": version,
            "device_count": count,
            "devices": devices,
            "current_device": s.ordinal,
            "mem_get_info": {"free": free, "total": total},
            "mem_get_info_one": mem_get_info_one(d),
            "nvml": crate::nvml::report(),
        }),
    );
    Ok(())
}

const MIB: u64 = 1 << 20;

/// xorshift64*: a small reproducible pseudo-random generator.
struct Rng(u64);

impl Rng {
    /// A generator whose state is `seed` (made odd, as the state must not be 0).
    fn raw(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// A generator seeded through splitmix64, so that nearby seeds give unrelated sequences.
    fn seeded(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng::raw(z ^ (z >> 31))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, n) for n > 0 (the modulo bias is negligible for the ranges used here).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn coin(&mut self) -> bool {
        self.next() >> 63 == 1
    }
}

#[cfg(test)]
mod tests;
