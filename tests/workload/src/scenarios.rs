//! The scenarios: each drives the driver one way real software does and reports JSON lines.

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
use crate::kernels::{ImageArg, Shape, Spin};
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
    /// Free the allocation as soon as it is made (async and pool: cuMemFreeAsync, then
    /// cuStreamSynchronize) and hold only the context; `holding` reports free after the free
    #[arg(long)]
    pub free_at_once: bool,
    /// Do not call cuMemGetInfo before `holding` (its free and total are null): what other
    /// processes see then comes from the allocation calls and synchronisations alone
    #[arg(long, conflicts_with = "zero_ledger")]
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
    /// Device nanoseconds of each block of the spin kernel: each launch keeps the device busy
    /// for ns-per-block x blocks (see --image)
    #[arg(long)]
    pub ns_per_block: u64,
    /// Blocks per launch
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub blocks: u32,
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
}

#[derive(Clone, Debug, Args)]
pub struct MemcpyArgs {
    /// Bytes to copy each way
    #[arg(long, value_parser = parse_size)]
    pub bytes: u64,
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
    /// Kernel image: auto (PTX, else the simulator's text image), ptx, or text
    #[arg(long, value_enum, default_value = "auto")]
    pub image: ImageArg,
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

// ---------------------------------------------------------------------------------------------
// allocation families (fill, hold)
// ---------------------------------------------------------------------------------------------

/// `cuMemAllocPitch_v2` row width: deliberately not a multiple of any pitch alignment.
const PITCH_WIDTH: usize = (1 << 20) - 1000;
const MIB: u64 = 1 << 20;

/// One live allocation.
#[derive(Clone, Copy, Debug)]
enum Block {
    Device(CUdeviceptr),
    Array(CUarray),
    Mipmap(CUmipmappedArray),
    Vmm {
        ptr: CUdeviceptr,
        size: usize,
        handle: CUmemGenericAllocationHandle,
    },
}

/// A call that failed: `Ok(Err(e))` is the driver refusing (the design of `fill`), `Err(e)` an
/// unexpected failure (including an entry point the route did not find).
type Attempt<T> = Result<Result<T, CuError>, CuError>;

fn soft(r: Result<(), CuError>) -> Attempt<()> {
    match r {
        Ok(()) => Ok(Ok(())),
        Err(e) => refused(e),
    }
}

/// A failed allocation call as an `Attempt`: a refusal, unless the entry point is missing.
fn refused<T>(e: CuError) -> Attempt<T> {
    if e.missing { Err(e) } else { Ok(Err(e)) }
}

/// Undoes the first `done` steps (reserve, create, map) of a VMM allocation that failed later;
/// failures here only go to stderr.
fn undo_vmm(
    d: &Driver,
    done: u8,
    ptr: CUdeviceptr,
    size: usize,
    handle: CUmemGenericAllocationHandle,
) {
    let report = |r: Result<(), CuError>| {
        if let Err(e) = r {
            eprintln!("cuda-workload: cleanup: {e}");
        }
    };
    if done >= 3 {
        // SAFETY: `ptr`/`size` was mapped by the failed allocation.
        report(unsafe { d.cuMemUnmap(ptr, size) });
    }
    if done >= 2 {
        // SAFETY: `handle` was created by the failed allocation and is released once.
        report(unsafe { d.cuMemRelease(handle) });
    }
    if done >= 1 {
        // SAFETY: `ptr`/`size` was reserved by the failed allocation and is freed once.
        report(unsafe { d.cuMemAddressFree(ptr, size) });
    }
}

fn round_up(v: u64, to: u64) -> u64 {
    if to == 0 { v } else { v.div_ceil(to) * to }
}

/// Side of the mipmap's level 0: sqrt(chunk / 4) rounded down to a power of two (at least 1).
fn mipmap_side(chunk: u64) -> u64 {
    let side = ((chunk / 4) as f64).sqrt() as u64;
    if side == 0 {
        1
    } else {
        1 << (63 - side.leading_zeros())
    }
}

const MIPMAP_LEVELS: u32 = 4;

struct Allocator<'a> {
    d: &'a Driver,
    family: Family,
    stream: CUstream,
    pool: CUmemoryPool,
    granularity: u64,
    prop: CUmemAllocationProp,
    access: CUmemAccessDesc,
    /// The pitch the last cuMemAllocPitch_v2 returned.
    pitch: Option<u64>,
    /// Async and pool frees wait with an event (cuEventRecord + cuEventSynchronize) rather
    /// than cuStreamSynchronize.
    sync_event: bool,
}

impl<'a> Allocator<'a> {
    /// Sets up what the family needs: a stream (async, pool), the default pool with an
    /// unbounded release threshold (pool), the allocation granularity (vmm).
    fn new(d: &'a Driver, family: Family, dev: CUdevice) -> Result<Allocator<'a>, CuError> {
        let location = CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev,
        };
        let mut a = Allocator {
            d,
            family,
            stream: null_mut(),
            pool: null_mut(),
            granularity: 0,
            prop: CUmemAllocationProp {
                type_: CU_MEM_ALLOCATION_TYPE_PINNED,
                requestedHandleTypes: CU_MEM_HANDLE_TYPE_NONE,
                location,
                win32HandleMetaData: null_mut(),
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
            access: CUmemAccessDesc {
                location,
                flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            },
            pitch: None,
            sync_event: false,
        };
        if matches!(family, Family::Async | Family::Pool) {
            // SAFETY: out-pointer to a field.
            unsafe { d.cuStreamCreate(&mut a.stream, CU_STREAM_DEFAULT) }?;
        }
        if family == Family::Pool {
            // SAFETY: out-pointer to a field.
            unsafe { d.cuDeviceGetDefaultMemPool(&mut a.pool, dev) }?;
            let mut threshold: u64 = u64::MAX;
            // SAFETY: RELEASE_THRESHOLD takes a pointer to a cuuint64_t.
            unsafe {
                d.cuMemPoolSetAttribute(
                    a.pool,
                    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&raw mut threshold).cast(),
                )
            }?;
        }
        if family == Family::Vmm {
            let mut g = 0usize;
            // SAFETY: out-pointer to a local, `prop` fully initialised.
            unsafe {
                d.cuMemGetAllocationGranularity(&mut g, &a.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)
            }?;
            a.granularity = g as u64;
        }
        Ok(a)
    }

    /// Bytes one chunk's request describes (pitch: once a pitch is known).
    fn chunk_bytes(&self, chunk: u64) -> Value {
        match self.family {
            Family::Mem | Family::Managed | Family::Async | Family::Pool => json!(chunk),
            Family::Pitch => self.pitch.map_or(Value::Null, |p| json!(p * (chunk / MIB))),
            Family::Array => json!(16384 * (chunk / 16384).max(1)),
            Family::Array3d => json!(4 * MIB * (chunk / (4 * MIB)).max(1)),
            Family::Mipmap => {
                let side = mipmap_side(chunk);
                json!(
                    (0..MIPMAP_LEVELS)
                        .map(|l| (side >> l).max(1).pow(2) * 4)
                        .sum::<u64>()
                )
            }
            Family::Vmm => json!(round_up(chunk, self.granularity)),
        }
    }

    /// Family-specific facts for the report lines.
    fn details(&self, out: &mut Map<String, Value>) -> Result<(), CuError> {
        match self.family {
            Family::Pitch => {
                out.insert("pitch".into(), json!(self.pitch));
            }
            Family::Vmm => {
                out.insert("granularity".into(), json!(self.granularity));
            }
            Family::Pool => {
                out.insert(
                    "pool_reserved".into(),
                    json!(self.pool_attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?),
                );
                out.insert(
                    "pool_used".into(),
                    json!(self.pool_attribute(CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?),
                );
            }
            _ => {}
        }
        Ok(())
    }

    fn pool_attribute(&self, attr: u32) -> Result<u64, CuError> {
        let mut v: u64 = 0;
        // SAFETY: the *_MEM_* attributes write a cuuint64_t; `pool` is the device's default pool.
        unsafe {
            self.d
                .cuMemPoolGetAttribute(self.pool, attr, (&raw mut v).cast())
        }?;
        Ok(v)
    }

    fn alloc(&mut self, chunk: u64) -> Attempt<Block> {
        let d = self.d;
        let size = chunk as usize;
        let mut ptr: CUdeviceptr = 0;
        let block = match self.family {
            Family::Mem => {
                // SAFETY: out-pointer to a local.
                soft(unsafe { d.cuMemAlloc_v2(&mut ptr, size) })?.map(|()| Block::Device(ptr))
            }
            Family::Pitch => {
                let mut pitch = 0usize;
                let height = (chunk / MIB) as usize;
                // SAFETY: out-pointers to locals.
                let r = soft(unsafe {
                    d.cuMemAllocPitch_v2(&mut ptr, &mut pitch, PITCH_WIDTH, height, 4)
                })?;
                if r.is_ok() {
                    self.pitch = Some(pitch as u64);
                }
                r.map(|()| Block::Device(ptr))
            }
            Family::Managed => {
                // SAFETY: out-pointer to a local.
                let r = soft(unsafe { d.cuMemAllocManaged(&mut ptr, size, CU_MEM_ATTACH_GLOBAL) })?;
                if r.is_ok() {
                    // SAFETY: `ptr` is a live managed allocation of `size` bytes.
                    unsafe { d.cuMemsetD8_v2(ptr, 0, size) }?;
                    sync(d, null_mut())?;
                }
                r.map(|()| Block::Device(ptr))
            }
            Family::Array => {
                let desc = CUDA_ARRAY_DESCRIPTOR {
                    Width: 4096,
                    Height: (chunk / 16384) as usize,
                    Format: array_format::FLOAT,
                    NumChannels: 1,
                };
                let mut array: CUarray = null_mut();
                // SAFETY: out-pointer to a local; `desc` outlives the call.
                soft(unsafe { d.cuArrayCreate_v2(&mut array, &desc) })?
                    .map(|()| Block::Array(array))
            }
            Family::Array3d => {
                let desc = CUDA_ARRAY3D_DESCRIPTOR {
                    Width: 1024,
                    Height: 1024,
                    Depth: (chunk / (4 * MIB)) as usize,
                    Format: array_format::FLOAT,
                    NumChannels: 1,
                    Flags: 0,
                };
                let mut array: CUarray = null_mut();
                // SAFETY: out-pointer to a local; `desc` outlives the call.
                soft(unsafe { d.cuArray3DCreate_v2(&mut array, &desc) })?
                    .map(|()| Block::Array(array))
            }
            Family::Mipmap => {
                let side = mipmap_side(chunk) as usize;
                let desc = CUDA_ARRAY3D_DESCRIPTOR {
                    Width: side,
                    Height: side,
                    Depth: 0,
                    Format: array_format::FLOAT,
                    NumChannels: 1,
                    Flags: 0,
                };
                let mut array: CUmipmappedArray = null_mut();
                // SAFETY: out-pointer to a local; `desc` outlives the call.
                soft(unsafe { d.cuMipmappedArrayCreate(&mut array, &desc, MIPMAP_LEVELS) })?
                    .map(|()| Block::Mipmap(array))
            }
            Family::Async => {
                // SAFETY: out-pointer to a local; `stream` is live.
                let r = soft(unsafe { d.cuMemAllocAsync(&mut ptr, size, self.stream) })?;
                if r.is_ok() {
                    sync(d, self.stream)?;
                }
                r.map(|()| Block::Device(ptr))
            }
            Family::Pool => {
                // SAFETY: out-pointer to a local; `pool` and `stream` are live.
                let r = soft(unsafe {
                    d.cuMemAllocFromPoolAsync(&mut ptr, size, self.pool, self.stream)
                })?;
                if r.is_ok() {
                    sync(d, self.stream)?;
                }
                r.map(|()| Block::Device(ptr))
            }
            Family::Vmm => return self.alloc_vmm(chunk),
        };
        Ok(block)
    }

    fn alloc_vmm(&self, chunk: u64) -> Attempt<Block> {
        let d = self.d;
        let size = round_up(chunk, self.granularity) as usize;
        let mut ptr: CUdeviceptr = 0;
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: out-pointer to a local; no fixed address, default alignment.
        if let Err(e) = unsafe { d.cuMemAddressReserve(&mut ptr, size, 0, 0, 0) } {
            return refused(e);
        }
        // SAFETY: out-pointer to a local, `prop` fully initialised.
        if let Err(e) = unsafe { d.cuMemCreate(&mut handle, size, &self.prop, 0) } {
            undo_vmm(d, 1, ptr, size, handle);
            return refused(e);
        }
        // SAFETY: maps the whole handle at offset 0 onto the whole reserved range.
        if let Err(e) = unsafe { d.cuMemMap(ptr, size, 0, handle, 0) } {
            undo_vmm(d, 2, ptr, size, handle);
            return refused(e);
        }
        // SAFETY: one access descriptor for the mapped range.
        if let Err(e) = unsafe { d.cuMemSetAccess(ptr, size, &self.access, 1) } {
            undo_vmm(d, 3, ptr, size, handle);
            return refused(e);
        }
        Ok(Ok(Block::Vmm { ptr, size, handle }))
    }

    fn free(&self, block: Block) -> Result<(), CuError> {
        let d = self.d;
        match (self.family, block) {
            (Family::Async | Family::Pool, Block::Device(ptr)) => {
                // SAFETY: `ptr` came from cuMemAlloc(FromPool)Async and is freed once.
                unsafe { d.cuMemFreeAsync(ptr, self.stream) }?;
                if self.sync_event {
                    sync_with_event(d, self.stream)
                } else {
                    sync(d, self.stream)
                }
            }
            // SAFETY: `ptr` came from cuMemAlloc_v2/Pitch_v2/Managed and is freed once.
            (_, Block::Device(ptr)) => unsafe { d.cuMemFree_v2(ptr) },
            // SAFETY: `array` came from cuArray(3D)Create_v2 and is destroyed once.
            (_, Block::Array(array)) => unsafe { d.cuArrayDestroy(array) },
            // SAFETY: `array` came from cuMipmappedArrayCreate and is destroyed once.
            (_, Block::Mipmap(array)) => unsafe { d.cuMipmappedArrayDestroy(array) },
            (_, Block::Vmm { ptr, size, handle }) => {
                // SAFETY: the range and handle were mapped by alloc_vmm and are released once.
                unsafe { d.cuMemUnmap(ptr, size) }?;
                // SAFETY: as above.
                unsafe { d.cuMemRelease(handle) }?;
                // SAFETY: as above.
                unsafe { d.cuMemAddressFree(ptr, size) }
            }
        }
    }

    /// Destroys the stream, if the family made one.
    fn close(self) -> Result<(), CuError> {
        if self.stream.is_null() {
            return Ok(());
        }
        // SAFETY: the stream was created by `new` and is idle.
        unsafe { self.d.cuStreamDestroy_v2(self.stream) }
    }
}

fn sleep_secs(secs: f64) {
    if secs > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(secs));
    }
}

pub fn fill(s: &Session, a: &FillArgs) -> Result<(), Failure> {
    let d = s.d;
    let mut al = Allocator::new(d, a.family, s.dev)?;
    let mut blocks = Vec::new();
    let refusal = loop {
        if a.max_count.is_some_and(|max| blocks.len() as u64 >= max) {
            break None;
        }
        match al.alloc(a.chunk)? {
            Ok(block) => blocks.push(block),
            Err(e) => break Some(e),
        }
    };
    let count = blocks.len() as u64;
    let allocated = count.saturating_mul(a.chunk);
    let (free, total) = mem_get_info(d)?;
    let mut f = Map::new();
    f.insert("code".into(), json!(refusal.map_or(0, |e| e.code.0)));
    f.insert(
        "name".into(),
        json!(refusal.map_or(Some("CUDA_SUCCESS"), |e| e.name())),
    );
    f.insert("call".into(), json!(refusal.map(|e| e.call)));
    f.insert("max_count_reached".into(), json!(refusal.is_none()));
    f.insert("family".into(), json!(a.family.name()));
    f.insert("chunk".into(), json!(a.chunk));
    f.insert("chunk_bytes".into(), al.chunk_bytes(a.chunk));
    f.insert("count".into(), json!(count));
    f.insert("allocated".into(), json!(allocated));
    f.insert("free".into(), json!(free));
    f.insert("total".into(), json!(total));
    al.details(&mut f)?;
    emit("refused", Value::Object(f));
    if a.hold > 0.0 {
        emit(
            "holding",
            json!({"family": a.family.name(), "count": count, "allocated": allocated,
                   "free": free, "total": total, "secs": a.hold}),
        );
        sleep_secs(a.hold);
    }
    for block in blocks.into_iter().rev() {
        al.free(block)?;
    }
    let mut f = Map::new();
    al.details(&mut f)?;
    al.close()?;
    let (free, total) = mem_get_info(d)?;
    f.insert("family".into(), json!(a.family.name()));
    f.insert("count".into(), json!(count));
    f.insert("free".into(), json!(free));
    f.insert("total".into(), json!(total));
    emit("freed", Value::Object(f));
    Ok(())
}

pub fn hold(s: &Session, a: &HoldArgs) -> Result<(), Failure> {
    let d = s.d;
    let mut al = Allocator::new(d, a.family, s.dev)?;
    al.sync_event = a.sync_event;
    let block = al.alloc(a.bytes)??;
    let block = if a.free_at_once {
        al.free(block)?;
        None
    } else {
        Some(block)
    };
    let (free, total) = if a.no_mem_info {
        (None, None)
    } else {
        let (free, total) = mem_get_info(d)?;
        (Some(free), Some(total))
    };
    if let (Some(ledger), Some(free), Some(total)) = (&a.zero_ledger, free, total) {
        let used = total - free;
        match zero_words(ledger, used) {
            Ok(words) => emit(
                "tampered",
                json!({"ledger": ledger.display().to_string(), "value": used, "words": words}),
            ),
            Err(e) => {
                emit(
                    "error",
                    json!({"call": "zero-ledger", "message": format!("{}: {e}", ledger.display())}),
                );
                return Err(Failure::Check);
            }
        }
    }
    let mut f = Map::new();
    f.insert("family".into(), json!(a.family.name()));
    f.insert("bytes".into(), json!(a.bytes));
    f.insert("chunk_bytes".into(), al.chunk_bytes(a.bytes));
    f.insert("free".into(), json!(free));
    f.insert("total".into(), json!(total));
    f.insert("secs".into(), json!(a.secs));
    f.insert("freed_at_once".into(), json!(a.free_at_once));
    al.details(&mut f)?;
    emit("holding", Value::Object(f));
    match a.secs {
        Some(secs) => sleep_secs(secs),
        None => {
            // Held until whoever started us closes our stdin.
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        }
    }
    if let Some(block) = block {
        al.free(block)?;
    }
    al.close()?;
    let (free, total) = mem_get_info(d)?;
    emit(
        "freed",
        json!({"family": a.family.name(), "bytes": a.bytes, "free": free, "total": total}),
    );
    Ok(())
}

/// The signals `steps` waits for, blocked in every thread from the start (see `block_steps`).
fn step_signals() -> libc::sigset_t {
    // SAFETY: a zeroed sigset_t is a valid argument to sigemptyset, which initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is ours and initialised by sigemptyset first.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::sigaddset(&mut set, libc::SIGTERM);
    }
    set
}

/// Blocks SIGUSR1 and SIGTERM in this thread and every thread it starts (the driver's and an
/// interposer's threads too, when called before cuInit), so that `steps` takes them with sigwait.
pub fn block_steps() {
    let set = step_signals();
    // SAFETY: a valid, initialised signal set; the old mask is not wanted.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, null_mut()) };
}

/// A `ready` line (this process's pid, cuMemGetInfo's free and total), then one allocation of
/// --bytes at each SIGUSR1, kept; a `step` line each: `ok` (or the refusal's
/// `code`), the step's number, the bytes held in all, and cuMemGetInfo's free and total after
/// it. SIGTERM frees everything and ends. For tests that change a running slice's limits
/// between steps.
pub fn steps(s: &Session, a: &StepsArgs) -> Result<(), Failure> {
    let d = s.d;
    let mut al = Allocator::new(d, Family::Mem, s.dev)?;
    let (free, total) = mem_get_info(d)?;
    emit(
        "ready",
        json!({"free": free, "total": total, "bytes": a.bytes}),
    );
    let set = step_signals();
    let mut held = Vec::new();
    let mut n = 0u64;
    loop {
        let mut sig: c_int = 0;
        // SAFETY: a valid signal set (blocked in every thread) and an out-pointer to a local.
        if unsafe { libc::sigwait(&set, &mut sig) } != 0 || sig != libc::SIGUSR1 {
            break;
        }
        n += 1;
        let code = match al.alloc(a.bytes)? {
            Ok(b) => {
                held.push(b);
                0
            }
            Err(e) => e.code.0,
        };
        let (free, total) = mem_get_info(d)?;
        emit(
            "step",
            json!({"step": n, "ok": code == 0, "code": code, "held": held.len() as u64 * a.bytes,
                   "free": free, "total": total}),
        );
    }
    for b in held {
        al.free(b)?;
    }
    al.close()?;
    emit("freed", json!({}));
    Ok(())
}

/// Writes 0 over every 8-byte-aligned word of `path` equal to `value`, through a shared mapping
/// (as a process that maps the file sees it at once). Returns how many it changed.
fn zero_words(path: &std::path::Path, value: u64) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let len = f.metadata()?.len() as usize;
    if len < 8 {
        return Ok(0);
    }
    // SAFETY: a fresh shared read-write mapping of the whole file, of a descriptor open for both.
    let map = unsafe {
        libc::mmap(
            null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let words = map.cast::<std::sync::atomic::AtomicU64>();
    let mut changed = 0;
    for i in 0..len / 8 {
        // SAFETY: within the mapping (8-byte aligned: mmap returns a page-aligned address), and
        // others change these words only atomically.
        let w = unsafe { &*words.add(i) };
        if w.compare_exchange(value, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            changed += 1;
        }
    }
    // SAFETY: the mapping made above, no longer used.
    unsafe { libc::munmap(map, len) };
    Ok(changed)
}

// ---------------------------------------------------------------------------------------------
// launch
// ---------------------------------------------------------------------------------------------

const BLOCK_DIM: u32 = 128;

/// Waits for `stream` with an event: cuEventRecord, cuEventSynchronize, cuEventDestroy.
fn sync_with_event(d: &Driver, stream: CUstream) -> Result<(), CuError> {
    let ev = create_event(d, CU_EVENT_DISABLE_TIMING)?;
    // SAFETY: a live event and the live stream it is recorded on.
    let r = unsafe { d.cuEventRecord(ev, stream) }
        // SAFETY: the event was recorded just now.
        .and_then(|()| unsafe { d.cuEventSynchronize(ev) });
    // SAFETY: the event is idle and destroyed once.
    unsafe { d.cuEventDestroy_v2(ev) }?;
    r
}

fn create_event(d: &Driver, flags: u32) -> Result<CUevent, CuError> {
    let mut ev: CUevent = null_mut();
    // SAFETY: out-pointer to a local.
    unsafe { d.cuEventCreate(&mut ev, flags) }?;
    Ok(ev)
}

/// Launches `f` once on `stream` the way `via` says (`exec`: the instantiated graph), shaped
/// as `shape` says.
fn launch_once(
    d: &Driver,
    via: Via,
    f: CUfunction,
    exec: CUgraphExec,
    stream: CUstream,
    shape: Shape,
) -> Result<(), CuError> {
    // The kernel's one parameter; the driver copies it before the launch call returns.
    let mut arg = shape.arg;
    let mut params = [&mut arg as *mut u64 as *mut c_void];
    let params = params.as_mut_ptr();
    let null: *mut *mut c_void = null_mut();
    let grid = shape.grid;
    match via {
        // SAFETY: `f` is a live function taking one u64, which `params` points to; `stream` is live.
        Via::Kernel => unsafe {
            d.cuLaunchKernel(f, grid, 1, 1, BLOCK_DIM, 1, 1, 0, stream, params, null)
        },
        Via::Ex => {
            let config = CUlaunchConfig {
                gridDimX: grid,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: BLOCK_DIM,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                hStream: stream,
                attrs: null_mut(),
                numAttrs: 0,
            };
            // SAFETY: `config` outlives the call and has no attributes; `params` as above.
            unsafe { d.cuLaunchKernelEx(&config, f, params, null) }
        }
        // SAFETY: as for cuLaunchKernel.
        Via::Coop => unsafe {
            d.cuLaunchCooperativeKernel(f, grid, 1, 1, BLOCK_DIM, 1, 1, 0, stream, params)
        },
        // SAFETY: `exec` was instantiated from the captured graph; `stream` is live.
        Via::Graph => unsafe { d.cuGraphLaunch(exec, stream) },
    }
}

/// Captures one cuLaunchKernel on `stream` into a graph and instantiates it.
fn capture(
    d: &Driver,
    f: CUfunction,
    stream: CUstream,
    shape: Shape,
) -> Result<(CUgraph, CUgraphExec), CuError> {
    // SAFETY: `stream` is a live, non-legacy stream.
    unsafe { d.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) }?;
    let launched = launch_once(d, Via::Kernel, f, null_mut(), stream, shape);
    let mut graph: CUgraph = null_mut();
    // SAFETY: ends the capture begun above (also after a failed launch); out-pointer to a local.
    let ended = unsafe { d.cuStreamEndCapture(stream, &mut graph) };
    launched?;
    ended?;
    let mut exec: CUgraphExec = null_mut();
    // SAFETY: `graph` is the captured graph; out-pointer to a local.
    unsafe { d.cuGraphInstantiateWithFlags(&mut exec, graph, 0) }?;
    Ok((graph, exec))
}

pub fn launch(s: &Session, a: &LaunchArgs) -> Result<(), Failure> {
    let d = s.d;
    let spin = Spin::load(d, s.dev, a.image, a.ns_per_block)?;
    let shape = spin.shape(a.ns_per_block, a.blocks);
    let func = spin.func;
    let mut streams = Vec::with_capacity(a.streams as usize);
    for _ in 0..a.streams {
        let mut stream: CUstream = null_mut();
        // SAFETY: out-pointer to a local.
        unsafe { d.cuStreamCreate(&mut stream, CU_STREAM_DEFAULT) }?;
        streams.push(stream);
    }
    let graph = if a.via == Via::Graph {
        Some(capture(d, func, streams[0], shape)?)
    } else {
        None
    };
    let exec = graph.map_or(null_mut(), |(_, exec)| exec);
    let start = create_event(d, CU_EVENT_DEFAULT)?;
    let end = create_event(d, CU_EVENT_DEFAULT)?;

    // SAFETY: live event and stream.
    unsafe { d.cuEventRecord(start, streams[0]) }?;
    let t0 = Instant::now();
    let deadline = Duration::from_secs_f64(a.secs);
    let count = a.count.unwrap_or(0);
    let mut in_flight: Vec<VecDeque<CUevent>> = vec![VecDeque::new(); streams.len()];
    // Completed tracking events, reused; they block rather than spin in cuEventSynchronize.
    let mut spare: Vec<CUevent> = Vec::new();
    let mut launches: u64 = 0;
    loop {
        let done = if a.secs > 0.0 {
            t0.elapsed() >= deadline
        } else {
            launches >= count
        };
        if done {
            break;
        }
        let i = (launches % streams.len() as u64) as usize;
        let oldest = if in_flight[i].len() >= a.depth as usize {
            in_flight[i].pop_front()
        } else {
            None
        };
        if let Some(oldest) = oldest {
            // SAFETY: a recorded event of ours.
            unsafe { d.cuEventSynchronize(oldest) }?;
            spare.push(oldest);
        }
        launch_once(d, a.via, func, exec, streams[i], shape)?;
        let ev = match spare.pop() {
            Some(ev) => ev,
            None => create_event(d, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING)?,
        };
        // SAFETY: live event and stream.
        unsafe { d.cuEventRecord(ev, streams[i]) }?;
        in_flight[i].push_back(ev);
        launches += 1;
    }
    for &stream in &streams {
        sync(d, stream)?;
    }
    // SAFETY: live event and stream.
    unsafe { d.cuEventRecord(end, streams[0]) }?;
    // SAFETY: recorded just above.
    unsafe { d.cuEventSynchronize(end) }?;
    let wall_ns = t0.elapsed().as_nanos() as u64;
    let mut ms: f32 = 0.0;
    // SAFETY: both events recorded and complete; out-pointer to a local.
    unsafe { d.cuEventElapsedTime(&mut ms, start, end) }?;

    for ev in in_flight
        .into_iter()
        .flatten()
        .chain(spare)
        .chain([start, end])
    {
        // SAFETY: each event is ours, complete, and destroyed once.
        unsafe { d.cuEventDestroy_v2(ev) }?;
    }
    if let Some((graph, exec)) = graph {
        // SAFETY: idle graph exec and graph, destroyed once.
        unsafe { d.cuGraphExecDestroy(exec) }?;
        // SAFETY: as above.
        unsafe { d.cuGraphDestroy(graph) }?;
    }
    for stream in streams {
        // SAFETY: idle stream of ours, destroyed once.
        unsafe { d.cuStreamDestroy_v2(stream) }?;
    }
    let image = spin.describe();
    spin.unload(d)?;

    let engine_ns_requested =
        u128::from(launches) * u128::from(a.ns_per_block) * u128::from(a.blocks);
    let mut f = json!({
        "via": a.via.name(),
        "launches": launches,
        "blocks": a.blocks,
        "ns_per_block": a.ns_per_block,
        "grid": shape.grid,
        "streams": a.streams,
        "depth": a.depth,
        "wall_ns": wall_ns,
        "engine_ns_requested": u64::try_from(engine_ns_requested).unwrap_or(u64::MAX),
        "elapsed_ns": (f64::from(ms) * 1e6).round() as u64,
    });
    merge(&mut f, image);
    emit("launched", f);
    Ok(())
}

/// Times batches of launches of a short kernel, pausing (untimed) between batches so that a
/// slice with a core limit stays within its budget: what a launch costs the calling thread, not
/// how long the device takes.
pub fn bench_launch(s: &Session, a: &BenchLaunchArgs) -> Result<(), Failure> {
    let d = s.d;
    let spin = Spin::load(d, s.dev, a.image, a.kernel_ns)?;
    let shape = spin.shape(a.kernel_ns, 1);
    let func = spin.func;
    let mut stream: CUstream = null_mut();
    // SAFETY: out-pointer to a local.
    unsafe { d.cuStreamCreate(&mut stream, CU_STREAM_DEFAULT) }?;
    let graph = if a.via == Via::Graph {
        Some(capture(d, func, stream, shape)?)
    } else {
        None
    };
    let exec = graph.map_or(null_mut(), |(_, exec)| exec);
    let pause = Duration::from_micros(a.pause_us);
    let batch = || -> Result<u64, CuError> {
        let t0 = Instant::now();
        for _ in 0..a.batch {
            launch_once(d, a.via, func, exec, stream, shape)?;
        }
        let ns = t0.elapsed().as_nanos() as u64;
        sync(d, stream)?;
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
        Ok(ns)
    };
    let warmup = Instant::now();
    while warmup.elapsed().as_secs_f64() < a.warmup_secs {
        batch()?;
    }
    let mut per_launch = Vec::with_capacity(a.batches as usize);
    for _ in 0..a.batches {
        per_launch.push(batch()? as f64 / f64::from(a.batch));
    }
    if let Some((graph, exec)) = graph {
        // SAFETY: idle graph exec and graph, destroyed once.
        unsafe { d.cuGraphExecDestroy(exec) }?;
        // SAFETY: as above.
        unsafe { d.cuGraphDestroy(graph) }?;
    }
    // SAFETY: idle stream of ours, destroyed once.
    unsafe { d.cuStreamDestroy_v2(stream) }?;
    let image = spin.describe();
    spin.unload(d)?;
    let mean = per_launch.iter().sum::<f64>() / per_launch.len() as f64;
    per_launch.sort_by(f64::total_cmp);
    let pick = |q: f64| per_launch[((per_launch.len() - 1) as f64 * q).round() as usize];
    let mut f = json!({
        "via": a.via.name(),
        "batches": a.batches,
        "batch": a.batch,
        "ns_per_launch_median": pick(0.5),
        "ns_per_launch_mean": mean,
        "ns_per_launch_p90": pick(0.9),
        "ns_per_launch_max": pick(1.0),
    });
    merge(&mut f, image);
    emit("bench", f);
    Ok(())
}

/// A latency probe: every --period-ms, launch one short kernel and wait for it
/// (cuStreamSynchronize); each probe's completion latency is the wall time from just before the
/// launch to the synchronisation's return. One `probed` line: every latency (ns, in order), their
/// p50 / p99 / max, and start_mono_ns / end_mono_ns (CLOCK_MONOTONIC) of the reported probes.
pub fn probe(s: &Session, a: &ProbeArgs) -> Result<(), Failure> {
    let d = s.d;
    let kernel_ns = a.kernel_us * 1000;
    let spin = Spin::load(d, s.dev, a.image, kernel_ns)?;
    let shape = spin.shape(kernel_ns, 1);
    let mut stream: CUstream = null_mut();
    // SAFETY: out-pointer to a local.
    unsafe { d.cuStreamCreate(&mut stream, CU_STREAM_NON_BLOCKING) }?;
    let period = Duration::from_secs_f64(a.period_ms.max(0.0) / 1000.0);
    let t0 = Instant::now();
    let warmup = Duration::from_secs_f64(a.warmup_secs);
    let end = warmup + Duration::from_secs_f64(a.secs);
    let mut latencies: Vec<u64> = Vec::new();
    let mut start_mono = 0;
    let mut next = t0;
    while t0.elapsed() < end {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next += period;
        let at = Instant::now();
        let mono = monotonic_ns();
        launch_once(d, Via::Kernel, spin.func, null_mut(), stream, shape)?;
        sync(d, stream)?;
        let ns = at.elapsed().as_nanos() as u64;
        if at.duration_since(t0) >= warmup {
            if latencies.is_empty() {
                start_mono = mono;
            }
            latencies.push(ns);
        }
        // A probe that overran its period does not make the next ones bunch up.
        next = next.max(Instant::now());
    }
    let end_mono = monotonic_ns();
    // SAFETY: idle stream of ours, destroyed once.
    unsafe { d.cuStreamDestroy_v2(stream) }?;
    let image = spin.describe();
    spin.unload(d)?;
    let mut sorted = latencies.clone();
    sorted.sort_unstable();
    let pick = |q: f64| {
        sorted
            .get(((sorted.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    let mut f = json!({
        "kernel_ns": kernel_ns,
        "period_ms": a.period_ms,
        "probes": latencies.len(),
        "p50_ns": pick(0.5),
        "p99_ns": pick(0.99),
        "max_ns": pick(1.0),
        "start_mono_ns": start_mono,
        "end_mono_ns": end_mono,
        "latencies_ns": latencies,
    });
    merge(&mut f, image);
    emit("probed", f);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// memcpy
// ---------------------------------------------------------------------------------------------

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

/// A reproducible pseudo-random byte pattern (xorshift64*).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::raw(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next().to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn memcpy(s: &Session, a: &MemcpyArgs) -> Result<(), Failure> {
    let d = s.d;
    let n = a.bytes as usize;
    let first = pattern(n, 0x9e37_79b9_7f4a_7c15);
    let second: Vec<u8> = first.iter().map(|b| !b).collect();
    let mut back = vec![0u8; n];
    let (mut x, mut y): (CUdeviceptr, CUdeviceptr) = (0, 0);
    // SAFETY: out-pointer to a local.
    unsafe { d.cuMemAlloc_v2(&mut x, n) }?;
    // SAFETY: out-pointer to a local.
    unsafe { d.cuMemAlloc_v2(&mut y, n) }?;
    // x <- first; read x back.
    // SAFETY: `first` holds n bytes, `x` n device bytes.
    unsafe { d.cuMemcpyHtoD_v2(x, first.as_ptr().cast(), n) }?;
    // SAFETY: `back` holds n bytes.
    unsafe { d.cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), x, n) }?;
    let host_round_trip = back == first;
    // y <- x; overwrite x; x <- y; read x back: must be `first` again.
    // SAFETY: both allocations hold n bytes.
    unsafe { d.cuMemcpyDtoD_v2(y, x, n) }?;
    // SAFETY: `second` holds n bytes.
    unsafe { d.cuMemcpyHtoD_v2(x, second.as_ptr().cast(), n) }?;
    // SAFETY: `back` holds n bytes.
    unsafe { d.cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), x, n) }?;
    let overwritten = back == second;
    // SAFETY: both allocations hold n bytes.
    unsafe { d.cuMemcpyDtoD_v2(x, y, n) }?;
    // SAFETY: `back` holds n bytes.
    unsafe { d.cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), x, n) }?;
    let device_round_trip = back == first;
    // SAFETY: allocated above, freed once.
    unsafe { d.cuMemFree_v2(x) }?;
    // SAFETY: allocated above, freed once.
    unsafe { d.cuMemFree_v2(y) }?;
    let ok = host_round_trip && overwritten && device_round_trip;
    emit(
        "memcpy",
        json!({"bytes": a.bytes, "ok": ok, "htod_dtoh": host_round_trip,
               "overwrite": overwritten, "dtod": device_round_trip}),
    );
    if ok { Ok(()) } else { Err(Failure::Check) }
}

// ---------------------------------------------------------------------------------------------
// threads (churn, bench-alloc)
// ---------------------------------------------------------------------------------------------

/// Lets threads start a phase together. Every thread arrives once, or the run is failed (a thread
/// that cannot arrive), so no thread waits forever.
struct StartLine {
    /// (arrived, failed)
    state: Mutex<(u32, bool)>,
    changed: Condvar,
    threads: u32,
}

impl StartLine {
    fn new(threads: u32) -> StartLine {
        StartLine {
            state: Mutex::new((0, false)),
            changed: Condvar::new(),
            threads,
        }
    }

    /// Waits until every thread has arrived (true) or one has failed (false).
    fn arrive(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 += 1;
        self.changed.notify_all();
        while state.0 < self.threads && !state.1 {
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        !state.1
    }

    fn fail(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        self.changed.notify_all();
    }
}

/// Runs `body(i, start)` on `threads` threads. Each retains the device's primary context (the
/// process's context the main thread made current), makes it current with cuCtxSetCurrent, runs
/// `body` and releases it again. A thread that fails fails `start` too.
fn on_threads<T: Send>(
    s: &Session,
    threads: u32,
    body: impl Fn(usize, &StartLine) -> Result<T, CuError> + Sync,
) -> Vec<Result<T, CuError>> {
    let start = StartLine::new(threads);
    let run = |i: usize| -> Result<T, CuError> {
        let mut ctx: CUcontext = null_mut();
        // SAFETY: out-pointer to a local; `dev` came from cuDeviceGet.
        unsafe { s.d.cuDevicePrimaryCtxRetain(&mut ctx, s.dev) }?;
        // SAFETY: `ctx` is the primary context, retained above.
        let out = unsafe { s.d.cuCtxSetCurrent(ctx) }.and_then(|()| body(i, &start));
        // SAFETY: releases the retain above, once.
        let released = unsafe { s.d.cuDevicePrimaryCtxRelease_v2(s.dev) };
        let out = out?;
        released?;
        Ok(out)
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads as usize)
            .map(|i| {
                let (run, start) = (&run, &start);
                scope.spawn(move || {
                    let r = run(i);
                    if r.is_err() {
                        start.fail();
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Prints an `error` event for each failed thread; `Failure::Check` if there was one.
fn report_errors(errors: &[CuError]) -> Result<(), Failure> {
    for e in errors {
        cu_error(e);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Failure::Check)
    }
}

/// CLOCK_MONOTONIC in nanoseconds (the clock Python's `time.monotonic_ns` reads), so that runs of
/// several processes can be lined up.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: out-pointer to a local timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

// ---------------------------------------------------------------------------------------------
// churn
// ---------------------------------------------------------------------------------------------

/// A size in [min, max] (min >= 1): a whole number of MiB when the range holds one.
fn churn_size(rng: &mut Rng, min: u64, max: u64) -> u64 {
    let (lo, hi) = (min.div_ceil(MIB), max / MIB);
    if lo <= hi {
        (lo + rng.below(hi - lo + 1)) * MIB
    } else {
        min + rng.below(max - min + 1)
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Churned {
    allocs: u64,
    frees: u64,
    refused: u64,
    refused_bytes_max: u64,
}

/// One thread of `churn`: its counts, and the unexpected error that stopped it, if any.
fn churn_thread(
    s: &Session,
    a: &ChurnArgs,
    i: usize,
    start: &StartLine,
    stop: &AtomicBool,
) -> Result<(Churned, Option<CuError>), CuError> {
    let mut al = Allocator::new(s.d, a.family, s.dev)?;
    let mut rng = Rng::seeded(a.seed.wrapping_add((i as u64).wrapping_mul(0x9e37_79b9)));
    let mut held: Vec<Block> = Vec::with_capacity(a.hold_max as usize);
    let mut c = Churned::default();
    let mut failure = None;
    if !start.arrive() {
        return Ok((c, None));
    }
    let deadline = Instant::now() + Duration::from_secs_f64(a.secs);
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let size = churn_size(&mut rng, a.min, a.max);
        match al.alloc(size) {
            Ok(Ok(block)) => {
                held.push(block);
                c.allocs += 1;
            }
            Ok(Err(e)) if e.code == CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                c.refused += 1;
                c.refused_bytes_max = c.refused_bytes_max.max(size);
            }
            Ok(Err(e)) | Err(e) => {
                failure = Some(e);
                break;
            }
        }
        if !held.is_empty() && (held.len() >= a.hold_max as usize || rng.coin()) {
            let block = held.swap_remove(rng.below(held.len() as u64) as usize);
            if let Err(e) = al.free(block) {
                failure = Some(e);
                break;
            }
            c.frees += 1;
        }
    }
    if failure.is_some() {
        stop.store(true, Ordering::Relaxed);
    }
    for block in held {
        match al.free(block) {
            Ok(()) => c.frees += 1,
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    if let Err(e) = al.close() {
        failure.get_or_insert(e);
    }
    Ok((c, failure))
}

pub fn churn(s: &Session, a: &ChurnArgs) -> Result<(), Failure> {
    let stop = AtomicBool::new(false);
    let results = on_threads(s, a.threads, |i, start| churn_thread(s, a, i, start, &stop));
    let mut total = Churned::default();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok((c, failure)) => {
                total.allocs += c.allocs;
                total.frees += c.frees;
                total.refused += c.refused;
                total.refused_bytes_max = total.refused_bytes_max.max(c.refused_bytes_max);
                errors.extend(failure);
            }
            Err(e) => errors.push(e),
        }
    }
    let (free, reported_total) = mem_get_info(s.d)?;
    emit(
        "churned",
        json!({
            "threads": a.threads,
            "secs": a.secs,
            "family": a.family.name(),
            "min": a.min,
            "max": a.max,
            "hold_max": a.hold_max,
            "seed": a.seed,
            "allocs": total.allocs,
            "frees": total.frees,
            "refused": total.refused,
            "refused_bytes_max": total.refused_bytes_max,
            "errors": errors.len(),
            "free": free,
            "total": reported_total,
        }),
    );
    report_errors(&errors)
}

// ---------------------------------------------------------------------------------------------
// bench-alloc
// ---------------------------------------------------------------------------------------------

const BENCH_WARMUP: u64 = 1000;

/// `n` pairs of cuMemAlloc_v2 + cuMemFree_v2 of `size` bytes.
fn alloc_free_pairs(d: &Driver, size: usize, n: u64) -> Result<(), CuError> {
    let mut ptr: CUdeviceptr = 0;
    for _ in 0..n {
        // SAFETY: out-pointer to a local.
        unsafe { d.cuMemAlloc_v2(&mut ptr, size) }?;
        // SAFETY: allocated just above, freed once.
        unsafe { d.cuMemFree_v2(ptr) }?;
    }
    Ok(())
}

/// One thread's timed phase: (start, end) on the monotonic clock, in ns.
fn bench_thread(d: &Driver, a: &BenchAllocArgs, start: &StartLine) -> Result<(u64, u64), CuError> {
    let size = a.size as usize;
    alloc_free_pairs(d, size, BENCH_WARMUP)?;
    if !start.arrive() {
        return Ok((0, 0));
    }
    let t0 = Instant::now();
    let t0_ns = monotonic_ns();
    alloc_free_pairs(d, size, a.iters)?;
    let ns = t0.elapsed().as_nanos() as u64;
    Ok((t0_ns, t0_ns + ns.max(1)))
}

pub fn bench_alloc(s: &Session, a: &BenchAllocArgs) -> Result<(), Failure> {
    let results = on_threads(s, a.threads, |_, start| bench_thread(s.d, a, start));
    let mut spans = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(span) => spans.push(span),
            Err(e) => errors.push(e),
        }
    }
    report_errors(&errors)?;
    let iters = a.iters as f64;
    let ns_per_pair: Vec<f64> = spans
        .iter()
        .map(|(t0, t1)| (t1 - t0) as f64 / iters)
        .collect();
    let rates: Vec<f64> = ns_per_pair.iter().map(|ns| 1e9 / ns).collect();
    let n = spans.len() as f64;
    let first = spans.iter().map(|s| s.0).min().unwrap_or(0);
    let last = spans.iter().map(|s| s.1).max().unwrap_or(0);
    let wall_ns = last.saturating_sub(first).max(1);
    emit(
        "bench",
        json!({
            "threads": a.threads,
            "iters": a.iters,
            "size": a.size,
            "ns_per_pair": ns_per_pair.iter().sum::<f64>() / n,
            "pairs_per_sec_per_thread": rates.iter().sum::<f64>() / n,
            "total_pairs_per_sec": n * iters * 1e9 / wall_ns as f64,
            "per_thread_ns_per_pair": ns_per_pair,
            "wall_ns": wall_ns,
            "start_mono_ns": first,
            "end_mono_ns": last,
        }),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_format() {
        let u = CUuuid {
            bytes: [
                0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8,
            ],
        };
        assert_eq!(format_uuid(&u), "GPU-12345678-9abc-def0-0102-030405060708");
    }

    #[test]
    fn mipmap_side_is_a_power_of_two_within_the_chunk() {
        assert_eq!(mipmap_side(64 << 20), 4096);
        assert_eq!(mipmap_side(100 << 20), 4096);
        assert_eq!(mipmap_side(0), 1);
        for chunk in [1u64, 4, 1000, 1 << 20, 3 << 30] {
            let side = mipmap_side(chunk);
            assert!(side.is_power_of_two());
            assert!(side * side * 4 <= chunk.max(4), "{chunk}");
        }
    }

    #[test]
    fn pattern_is_reproducible_and_not_trivial() {
        let p = pattern(1001, 7);
        assert_eq!(p.len(), 1001);
        assert_eq!(p, pattern(1001, 7));
        assert_ne!(p, pattern(1001, 8));
        assert!(p.iter().filter(|&&b| b == p[0]).count() < 100);
    }

    #[test]
    fn churn_sizes_stay_in_range() {
        let mut rng = Rng::seeded(3);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let size = churn_size(&mut rng, 3 * MIB - 5, 8 * MIB);
            assert!(
                (3 * MIB..=8 * MIB).contains(&size) && size.is_multiple_of(MIB),
                "{size}"
            );
            seen.insert(size);
        }
        assert_eq!(seen.len(), 6);
        assert_eq!(churn_size(&mut rng, 4 * MIB, 4 * MIB), 4 * MIB);
        for _ in 0..1000 {
            let size = churn_size(&mut rng, 1000, 5000);
            assert!((1000..=5000).contains(&size), "{size}");
        }
        assert_eq!(churn_size(&mut rng, 7, 7), 7);
    }

    #[test]
    fn seeded_generators_differ_and_repeat() {
        let a: Vec<u64> = (0..4).scan(Rng::seeded(1), |r, _| Some(r.next())).collect();
        let b: Vec<u64> = (0..4).scan(Rng::seeded(1), |r, _| Some(r.next())).collect();
        let c: Vec<u64> = (0..4).scan(Rng::seeded(2), |r, _| Some(r.next())).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn start_line_releases_everyone_or_fails() {
        let line = StartLine::new(3);
        std::thread::scope(|s| {
            let waiters: Vec<_> = (0..2).map(|_| s.spawn(|| line.arrive())).collect();
            assert!(line.arrive());
            assert!(waiters.into_iter().all(|h| h.join().unwrap()));
        });
        let line = StartLine::new(3);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| line.arrive());
            line.fail();
            assert!(!waiter.join().unwrap());
        });
    }

    #[test]
    fn rounding() {
        assert_eq!(round_up(1, 2 << 20), 2 << 20);
        assert_eq!(round_up(4 << 20, 2 << 20), 4 << 20);
        assert_eq!(round_up(5, 0), 5);
    }
}
