//! The checkpoint API (`cuCheckpointProcess*`, CUDA 12.8): another process, or the process
//! itself, locks a CUDA process (its API calls then wait), checkpoints it (its device memory goes
//! to its own host memory and the device lets it go), restores it (the memory comes back at the
//! same device addresses) and unlocks it.
//!
//! As in the real driver, the work is done inside the target process, by a thread the driver
//! starts there at cuInit (the "restore thread"): a caller posts its request in the target's
//! process slot and waits for the answer. The model follows driver 580:
//! - Lock waits for API calls under way, up to the lock's timeout (then NOT_READY, the process
//!   left RUNNING): a copy or a memset is under way until its last byte is moved, though it lets
//!   the driver's lock go meanwhile. Checkpoint waits for the process's queued work.
//! - A process holding managed memory, or sharing memory through IPC or exported VMM handles
//!   (either side), is refused with NOT_SUPPORTED and left LOCKED.
//! - Restore needs room on the device for everything at once; without it, it answers
//!   OUT_OF_MEMORY and the process stays CHECKPOINTED for good: later restores are refused with
//!   ILLEGAL_STATE (a driver-580 restore that failed for lack of memory left the process stuck).
//! - A transition from the wrong state answers ILLEGAL_STATE; a pid that is no CUDA process,
//!   or non-zero reserved arguments, INVALID_VALUE.

use std::collections::HashMap;
use std::ffi::c_int;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cuda_abi::CUresult;
use cuslice_shm::futex;
use parking_lot::Mutex;
use simgpu::layout::*;
use simgpu::{AllocId, AllocKind};

use crate::driver::*;
use crate::vmm::Backing;

/// Set once this process exported memory to another (an IPC handle or a VMM shareable handle):
/// the checkpoint API does not support it.
pub static EXPORTED: AtomicBool = AtomicBool::new(false);

const E_ILLEGAL_STATE: CUresult = CUresult::CUDA_ERROR_ILLEGAL_STATE;

/// One allocation moved to host memory: the bytes the device held (runs of data, by offset in
/// the allocation; holes were never written and come back as zeros).
struct Saved {
    dev: u32,
    kind: AllocKind,
    size: u64,
    /// Granules it took (and takes again).
    ngran: u32,
    old: AllocId,
    runs: Vec<(u64, Vec<u8>)>,
    /// The context whose hidden memory this is (Context allocations).
    ctx: Option<u32>,
}

/// What a checkpoint took off the devices.
#[derive(Default)]
struct Image {
    saved: Vec<Saved>,
    /// Per device: the contexts the process had there.
    contexts: Vec<(u32, u32)>,
}

static IMAGE: Mutex<Option<Image>> = Mutex::new(None);

/// Starts this process's checkpoint thread (once).
pub fn start(d: &'static Driver) {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if STARTED.swap(true, Ordering::SeqCst) {
        return;
    }
    let Some(s) = d.state.my_slot() else { return };
    let _ = std::thread::Builder::new()
        .name("simgpu-restore".into())
        .spawn(move || serve(d, s));
}

fn slot(d: &Driver, s: u32) -> &ProcSlot {
    &d.state.header().procs[s as usize]
}

/// The checkpoint thread: answers requests posted in this process's slot.
fn serve(d: &'static Driver, s: u32) {
    CHECKPOINT_THREAD.with(|c| c.set(true));
    let me = slot(d, s);
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    me.ckpt_tid.store(tid, Ordering::Release);
    loop {
        let op = me.ckpt_req.load(Ordering::Acquire);
        if op == 0 {
            futex::wait(&me.ckpt_req, 0, Duration::from_secs(1));
            continue;
        }
        if d.state.my_slot() != Some(s) {
            return; // a forked child's copy of the thread does not exist; a defence only
        }
        let arg = me.ckpt_arg.load(Ordering::Acquire);
        let r = match op {
            CKPT_OP_LOCK => lock(d, me, arg),
            CKPT_OP_CHECKPOINT => checkpoint(d, s, me),
            CKPT_OP_RESTORE => restore(d, s, me),
            CKPT_OP_UNLOCK => unlock(d, me),
            _ => Err(E_INVALID_VALUE),
        };
        me.ckpt_result.store(status(r).0, Ordering::Release);
        me.ckpt_req.store(0, Ordering::Release);
        futex::wake_all(&me.ckpt_req);
    }
}

fn lock(d: &Driver, me: &ProcSlot, timeout_ms: u32) -> Res {
    if me.ckpt_state.load(Ordering::Acquire) != CKPT_RUNNING {
        return Err(E_ILLEGAL_STATE);
    }
    let timeout = (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms as u64));
    if !d.inner.block(timeout) {
        return Err(CUresult::CUDA_ERROR_NOT_READY);
    }
    me.ckpt_state.store(CKPT_LOCKED, Ordering::Release);
    Ok(())
}

fn unlock(d: &Driver, me: &ProcSlot) -> Res {
    if me.ckpt_state.load(Ordering::Acquire) != CKPT_LOCKED {
        return Err(E_ILLEGAL_STATE);
    }
    me.ckpt_state.store(CKPT_RUNNING, Ordering::Release);
    d.inner.unblock();
    Ok(())
}

/// Whether this process holds what the checkpoint API does not support (managed memory,
/// memory shared with other processes).
fn unsupported(inner: &Inner) -> bool {
    EXPORTED.load(Ordering::Relaxed)
        || inner.managed.values().any(|(sum, _)| *sum > 0)
        || inner
            .maps
            .values()
            .any(|m| m.kind == MapKind::Ipc || m.host_mapped)
        || inner.vmm.iter().any(|(_, h)| h.imported)
}

fn checkpoint(d: &Driver, s: u32, me: &ProcSlot) -> Res {
    if me.ckpt_state.load(Ordering::Acquire) != CKPT_LOCKED {
        return Err(E_ILLEGAL_STATE);
    }
    let inner = d.inner.lock();
    if unsupported(&inner) {
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    // Submitted work finishes first.
    let ctxs: Vec<(u32, u32, u32)> = inner
        .ctxs
        .iter()
        .map(|(_, c)| (c.dev, c.shared, c.shared_gen))
        .collect();
    for (dev, ctx, generation) in ctxs {
        let seq = d.state.lock_device(dev).dev().b.ctxs[ctx as usize].submitted;
        wait_seq(d, dev, ctx, generation, seq);
    }
    let data = d.state.data().map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)?;
    let file =
        std::fs::File::open(d.state.data_fd_path()).map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)?;
    let mut image = Image::default();
    let mut bytes = 0;
    for dev in 0..d.state.ndev() {
        let data_off = d.state.device_info(dev).data_off;
        let mut g = d.state.lock_device(dev);
        let mut dv = g.dev();
        let owned: Vec<(AllocId, AllocRec)> =
            dv.allocations().filter(|(_, r)| r.owner == s).collect();
        let overheads: HashMap<u32, u32> = (0..MAX_CTXS as u32)
            .filter(|&c| {
                let x = &dv.b.ctxs[c as usize];
                x.state == CTX_LIVE && x.owner == s && x.overhead != NONE
            })
            .map(|c| (dv.b.ctxs[c as usize].overhead, c))
            .collect();
        for (id, rec) in owned {
            let granules = dv.granules_of(id).unwrap_or_default();
            let mut runs = Vec::new();
            for (i, &gr) in granules.iter().enumerate() {
                let at = data_off + gr as u64 * GRANULE;
                for (from, to) in data_runs(file.as_raw_fd(), at, at + GRANULE) {
                    // SAFETY: [from, to) lies inside the device's region of the memory file,
                    // which `data` maps whole; the allocation is this process's and no work of
                    // it is queued, so nothing writes it meanwhile.
                    let bytes = unsafe {
                        std::slice::from_raw_parts(
                            data.base.add(from as usize),
                            (to - from) as usize,
                        )
                    };
                    runs.push((i as u64 * GRANULE + (from - at), bytes.to_vec()));
                }
            }
            bytes += rec.ngran as u64 * GRANULE;
            image.saved.push(Saved {
                dev,
                kind: AllocKind::from_u32(rec.kind).unwrap_or(AllocKind::Mem),
                size: rec.size,
                ngran: rec.ngran,
                old: id,
                runs,
                ctx: overheads.get(&id.head).copied(),
            });
            dv.release(id);
        }
        let p = &mut dv.b.procs[s as usize];
        if p.contexts > 0 {
            image.contexts.push((dev, p.contexts));
            p.contexts = 0;
        }
    }
    drop(inner);
    *IMAGE.lock() = Some(image);
    me.ckpt_host_bytes.store(bytes, Ordering::Release);
    me.ckpt_state.store(CKPT_CHECKPOINTED, Ordering::Release);
    Ok(())
}

/// The runs of `fd` between `from` and `to` that hold data (SEEK_DATA / SEEK_HOLE): a granule
/// never written is a hole of the sparse memory file and costs nothing to keep.
fn data_runs(fd: i32, from: u64, to: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = from;
    while at < to {
        // SAFETY: lseek on a file descriptor we own; it changes only the file offset.
        let start = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
        if start < 0 || start as u64 >= to {
            break;
        }
        // SAFETY: as above.
        let end = unsafe { libc::lseek(fd, start, libc::SEEK_HOLE) };
        let end = if end < 0 { to } else { (end as u64).min(to) };
        out.push((start as u64, end));
        at = end;
    }
    out
}

fn restore(d: &Driver, s: u32, me: &ProcSlot) -> Res {
    if me.ckpt_state.load(Ordering::Acquire) != CKPT_CHECKPOINTED
        || me.ckpt_stuck.load(Ordering::Acquire) != 0
    {
        return Err(E_ILLEGAL_STATE);
    }
    let mut inner = d.inner.lock();
    let mut image_slot = IMAGE.lock();
    let image = image_slot.take().unwrap_or_default();
    // Everything is taken at once, under every device's lock (in device order), or nothing.
    let mut need: Vec<u32> = vec![0; d.state.ndev() as usize];
    for sv in &image.saved {
        need[sv.dev as usize] += sv.ngran;
    }
    let mut guards: Vec<_> = (0..d.state.ndev())
        .map(|dev| d.state.lock_device(dev))
        .collect();
    for (dev, g) in guards.iter_mut().enumerate() {
        if g.dev().free() / GRANULE < need[dev] as u64 {
            g.reclaim_dead();
        }
    }
    let short = guards
        .iter_mut()
        .enumerate()
        .any(|(dev, g)| g.dev().free() / GRANULE < need[dev] as u64);
    if short {
        drop(guards);
        *image_slot = Some(image);
        me.ckpt_stuck.store(1, Ordering::Release);
        return Err(E_OOM);
    }
    let mut moved: HashMap<(u32, AllocId), AllocId> = HashMap::new();
    let mut placed = Vec::new();
    for sv in &image.saved {
        let mut g = guards[sv.dev as usize].dev();
        let id = g
            .alloc(s, sv.kind, sv.size)
            .expect("room was checked under the same locks");
        if let Some(c) = sv.ctx {
            g.b.ctxs[c as usize].overhead = id.head;
        }
        placed.push((sv, g.granules_of(id).unwrap_or_default()));
        moved.insert((sv.dev, sv.old), id);
    }
    for &(dev, n) in &image.contexts {
        guards[dev as usize].dev().b.procs[s as usize].contexts = n;
    }
    drop(guards);
    let data = d.state.data().map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(d.state.data_fd_path())
        .map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)?;
    for (sv, granules) in placed {
        let data_off = d.state.device_info(sv.dev).data_off;
        for &gr in &granules {
            let at = data_off + gr as u64 * GRANULE;
            // What another process left there goes: the restored allocation holds only what
            // was saved.
            // SAFETY: fallocate on our own descriptor, inside the device's region.
            let punched = unsafe {
                libc::fallocate(
                    file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    at as libc::off_t,
                    GRANULE as libc::off_t,
                )
            };
            if punched != 0 {
                // SAFETY: the granule lies inside the mapping of the memory file.
                unsafe { std::ptr::write_bytes(data.base.add(at as usize), 0, GRANULE as usize) };
            }
        }
        for (off, bytes) in &sv.runs {
            let gi = (off / GRANULE) as usize;
            let at = data_off + granules[gi] as u64 * GRANULE + off % GRANULE;
            // SAFETY: a run never crosses its granule (see `checkpoint`), and the granule is this
            // process's, inside the mapping of the memory file.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    data.base.add(at as usize),
                    bytes.len(),
                )
            };
        }
    }
    relocate(&mut inner, &moved);
    me.ckpt_host_bytes.store(0, Ordering::Release);
    me.ckpt_state.store(CKPT_LOCKED, Ordering::Release);
    Ok(())
}

/// Points everything of this process at the allocations that replaced the checkpointed ones.
fn relocate(inner: &mut Inner, moved: &HashMap<(u32, AllocId), AllocId>) {
    let to = |dev: u32, id: &mut AllocId| {
        if let Some(n) = moved.get(&(dev, *id)) {
            *id = *n;
        }
    };
    for m in inner.maps.values_mut() {
        if let Some(id) = m.id.as_mut() {
            to(m.dev, id);
        }
    }
    for h in inner.pools.handles() {
        let p = inner.pools.get_mut(h).expect("listed");
        let dev = p.dev;
        p.chunks.iter_mut().for_each(|c| to(dev, &mut c.id));
    }
    for h in inner.vmm.handles() {
        if let Some(Backing::Device(dev, id)) = inner.vmm.get_mut(h).map(|v| &mut v.backing) {
            to(*dev, id);
        }
    }
    for reg in [&mut inner.arrays, &mut inner.mipmaps] {
        for h in reg.handles() {
            let a = reg.get_mut(h).expect("listed");
            to(a.dev, &mut a.id);
        }
    }
    for h in inner.modules.handles() {
        if let Some((dev, id)) = inner.modules.get_mut(h).and_then(|m| m.code.as_mut()) {
            to(*dev, id);
        }
    }
    for h in inner.execs.handles() {
        let e = inner.execs.get_mut(h).expect("listed");
        e.backing.iter_mut().for_each(|(dev, id)| to(*dev, id));
    }
}

// ---- the API, on the caller's side -----------------------------------------------------

/// Posts `op` to the checkpoint thread of the process `pid` names and waits for its answer.
fn call(pid: c_int, op: u32, arg: u32) -> Res {
    let d = driver()?;
    let s = d.state.slot_of_pid(pid).ok_or(E_INVALID_VALUE)?;
    // Threads of one process take turns here; processes on the slot's checkpoint lock.
    static TURN: Mutex<()> = Mutex::new(());
    let _t = TURN.lock();
    let _turn = d
        .state
        .checkpoint_turn(s)
        .map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)?;
    let target = slot(d, s);
    let generation = target.generation.load(Ordering::Acquire);
    let gone = || !d.state.slot_alive(s) || target.generation.load(Ordering::Acquire) != generation;
    if gone() {
        return Err(E_INVALID_VALUE);
    }
    let since = std::time::Instant::now();
    while target.ckpt_tid.load(Ordering::Acquire) == 0 {
        // The process is still in cuInit; its thread is on its way.
        if gone() {
            return Err(E_INVALID_VALUE);
        }
        if since.elapsed() > Duration::from_secs(5) {
            return Err(CUresult::CUDA_ERROR_NOT_READY);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    target.ckpt_arg.store(arg, Ordering::Release);
    target.ckpt_req.store(op, Ordering::Release);
    futex::wake_all(&target.ckpt_req);
    loop {
        futex::wait(&target.ckpt_req, op, Duration::from_millis(100));
        if target.ckpt_req.load(Ordering::Acquire) == 0 {
            return status_of(target.ckpt_result.load(Ordering::Acquire));
        }
        if gone() {
            return Err(E_INVALID_VALUE);
        }
    }
}

fn status_of(code: i32) -> Res {
    match code {
        0 => Ok(()),
        e => Err(CUresult(e)),
    }
}

/// Reserved words of an optional argument struct must be zero.
///
/// # Safety
/// `args` must be NULL or point at `n` readable u64 words.
unsafe fn reserved_zero(args: *const u64, n: usize) -> Res {
    if args.is_null() {
        return Ok(());
    }
    // SAFETY: per the contract.
    let words = unsafe { std::slice::from_raw_parts(args, n) };
    if words.iter().all(|&w| w == 0) {
        Ok(())
    } else {
        Err(E_INVALID_VALUE)
    }
}

/// `CUcheckpointLockArgs`.
#[repr(C)]
pub struct LockArgs {
    pub timeout_ms: u32,
    pub reserved0: u32,
    pub reserved1: [u64; 7],
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessLock(pid: c_int, args: *const LockArgs) -> CUresult {
    let timeout = if args.is_null() {
        Ok(0)
    } else {
        // SAFETY: the caller passes a CUcheckpointLockArgs.
        let a = unsafe { &*args };
        if a.reserved0 != 0 || a.reserved1.iter().any(|&w| w != 0) {
            Err(E_INVALID_VALUE)
        } else {
            Ok(a.timeout_ms)
        }
    };
    status(timeout.and_then(|t| call(pid, CKPT_OP_LOCK, t)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessCheckpoint(pid: c_int, args: *const u64) -> CUresult {
    // SAFETY: CUcheckpointCheckpointArgs is eight reserved u64 words.
    status(unsafe { reserved_zero(args, 8) }.and_then(|()| call(pid, CKPT_OP_CHECKPOINT, 0)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessRestore(pid: c_int, args: *const u64) -> CUresult {
    // SAFETY: CUcheckpointRestoreArgs is eight reserved u64 words.
    status(unsafe { reserved_zero(args, 8) }.and_then(|()| call(pid, CKPT_OP_RESTORE, 0)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessUnlock(pid: c_int, args: *const u64) -> CUresult {
    // SAFETY: CUcheckpointUnlockArgs is eight reserved u64 words.
    status(unsafe { reserved_zero(args, 8) }.and_then(|()| call(pid, CKPT_OP_UNLOCK, 0)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessGetState(pid: c_int, state: *mut c_int) -> CUresult {
    status(driver().and_then(|d| {
        let s = d.state.slot_of_pid(pid).ok_or(E_INVALID_VALUE)?;
        let v = slot(d, s).ckpt_state.load(Ordering::Acquire) as c_int;
        // SAFETY: out-pointer from the caller.
        unsafe { put(state, v) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessGetRestoreThreadId(
    pid: c_int,
    tid: *mut c_int,
) -> CUresult {
    status(driver().and_then(|d| {
        let s = d.state.slot_of_pid(pid).ok_or(E_INVALID_VALUE)?;
        match slot(d, s).ckpt_tid.load(Ordering::Acquire) {
            0 => Err(CUresult::CUDA_ERROR_NOT_READY),
            t => {
                // SAFETY: out-pointer from the caller.
                unsafe { put(tid, t) }
            }
        }
    }))
}
