//! The allocation families (fill, hold, steps): every way software asks the driver for device
//! memory, until it refuses or for as long as asked.

use super::*;

/// `cuMemAllocPitch_v2` row width: deliberately not a multiple of any pitch alignment.
const PITCH_WIDTH: usize = (1 << 20) - 1000;

/// One live allocation.
#[derive(Clone, Copy, Debug)]
pub(super) enum Block {
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

pub(super) fn round_up(v: u64, to: u64) -> u64 {
    if to == 0 { v } else { v.div_ceil(to) * to }
}

/// Side of the mipmap's level 0: sqrt(chunk / 4) rounded down to a power of two (at least 1).
pub(super) fn mipmap_side(chunk: u64) -> u64 {
    let side = ((chunk / 4) as f64).sqrt() as u64;
    if side == 0 {
        1
    } else {
        1 << (63 - side.leading_zeros())
    }
}

const MIPMAP_LEVELS: u32 = 4;

pub(super) struct Allocator<'a> {
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
    pub(super) fn new(
        d: &'a Driver,
        family: Family,
        dev: CUdevice,
    ) -> Result<Allocator<'a>, CuError> {
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

    pub(super) fn alloc(&mut self, chunk: u64) -> Attempt<Block> {
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

    pub(super) fn free(&self, block: Block) -> Result<(), CuError> {
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
    pub(super) fn close(self) -> Result<(), CuError> {
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
    if let (Some(ledger), Some(free), Some(total)) = (&a.forge_frozen, free, total) {
        match forge_frozen(ledger, total - free) {
            Ok(at) => emit(
                "tampered",
                json!({"ledger": ledger.display().to_string(), "frozen_mark_at": at}),
            ),
            Err(e) => {
                emit(
                    "error",
                    json!({"call": "forge-frozen", "message": format!("{}: {e}", ledger.display())}),
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

/// Marks this process frozen in the ledger at `path`, as a tenant reading cuslice's source
/// would: its process record is the one whose first word says it is taken (1), whose third is
/// this pid, and whose charge on the slice's first device (the word 16 bytes in) is `used`, what
/// the driver reports in use under the cap; the mark is the record's word 1304 bytes in (the
/// ledger's version 8). Returns where it wrote.
fn forge_frozen(path: &std::path::Path, used: u64) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt;
    const FROZEN_AT: usize = 1304;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let bytes = std::fs::read(path)?;
    let word = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
    let pid = std::process::id();
    let record = (16..bytes.len().saturating_sub(FROZEN_AT + 8))
        .step_by(8)
        .find(|&o| bytes[o..o + 8] == used.to_ne_bytes() && word(o - 16) == 1 && word(o - 8) == pid)
        .map(|o| o - 16)
        .ok_or_else(|| std::io::Error::other(format!("no record of pid {pid} charged {used}")))?;
    let at = (record + FROZEN_AT) as u64;
    f.write_all_at(&1u64.to_ne_bytes(), at)?;
    Ok(at)
}
