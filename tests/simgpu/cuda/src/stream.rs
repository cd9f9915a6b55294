//! Streams, events and host functions.
//!
//! All work of a context goes through its one in-order queue on the device (see simgpu's
//! engine). A stream remembers the sequence number of its last item, so synchronising a stream
//! waits for exactly that item. The legacy default stream also waits for all earlier work of
//! blocking streams, as CUDA specifies; the per-thread default stream (`_ptsz` entry points, or
//! CU_STREAM_PER_THREAD) only for its own.

use std::ffi::{c_float, c_int, c_uint, c_void};

use cuda_abi::*;
use simgpu::layout::{
    EVENT_CREATED, EVENT_DONE, EVENT_PENDING, HOSTFN_PENDING, ITEM_HOSTFN, ITEM_MARKER, Item,
};

use crate::driver::*;
use crate::graph::Capture;
use crate::handles::{from_ptr, to_ptr};
use crate::module::Cost;
use crate::ptx::Timing;

pub struct Stream {
    pub ctx: u64,
    pub flags: u32,
    /// Its priority, within cuCtxGetStreamPriorityRange's range (lower is higher priority).
    pub priority: i32,
    pub last_seq: u64,
    pub capture: Option<Capture>,
}

pub struct EventObj {
    pub dev: u32,
    pub idx: u32,
    pub generation: u32,
    pub flags: u32,
    pub ctx: u64,
    /// Where the last record was queued: (device, shared ctx, ctx generation, seq).
    pub recorded: Option<(u32, u32, u32, u64)>,
}

/// A stream as a launch sees it.
#[derive(Clone, Copy, Debug)]
pub enum StreamRef {
    Legacy(u64),
    PerThread(u64),
    Real(u64, u64),
}

impl StreamRef {
    pub fn ctx(self) -> u64 {
        match self {
            StreamRef::Legacy(c) | StreamRef::PerThread(c) | StreamRef::Real(_, c) => c,
        }
    }
}

/// Resolves a stream argument. `ptsz`: the call came through a `_ptsz`/`_ptds` entry point, where
/// the NULL stream means the per-thread default stream.
pub fn resolve(inner: &Inner, s: CUstream, ptsz: bool) -> Res<StreamRef> {
    let hs = from_ptr(s);
    match hs as usize {
        0 if ptsz => Ok(StreamRef::PerThread(inner.cur()?.0)),
        0 | CU_STREAM_LEGACY => Ok(StreamRef::Legacy(inner.cur()?.0)),
        CU_STREAM_PER_THREAD => Ok(StreamRef::PerThread(inner.cur()?.0)),
        _ => {
            let st = inner.streams.get(hs).ok_or(E_INVALID_HANDLE)?;
            inner.ctx(st.ctx)?;
            Ok(StreamRef::Real(hs, st.ctx))
        }
    }
}

pub fn check_stream(s: CUstream, ptsz: bool) -> Res {
    let d = drv()?;
    resolve(&d.inner.lock(), s, ptsz).map(|_| ())
}

/// Queues `item` on the stream's context (waiting, asleep, while the queue is full) and
/// records it as the stream's last work.
pub fn push(d: &Driver, inner: &mut Inner, sref: StreamRef, item: Item) -> Res<u64> {
    let c = inner.ctx(sref.ctx())?;
    let (dev, shared, shared_gen) = (c.dev, c.shared, c.shared_gen);
    let seq = loop {
        let wait = {
            let mut g = d.state.lock_device(dev);
            g.advance_now();
            let mut dv = g.dev();
            if !dv.ctx_valid(shared, shared_gen) {
                return Err(E_INVALID_CONTEXT);
            }
            match dv.push(shared, item) {
                Ok(seq) => break seq,
                Err(_) => {
                    let head = dv.completed(shared) + 1;
                    dv.min_wait(shared, head)
                }
            }
        };
        simgpu::clock::sleep_ns_on_time(wait.clamp(20_000, 10_000_000));
    };
    let blocking = match sref {
        StreamRef::Real(h, _) => {
            let st = inner.streams.get_mut(h).ok_or(E_INVALID_HANDLE)?;
            st.last_seq = seq;
            st.flags & CU_STREAM_NON_BLOCKING == 0
        }
        StreamRef::PerThread(ctx) => {
            PER_THREAD.with(|m| m.borrow_mut().insert(ctx, seq));
            true
        }
        StreamRef::Legacy(_) => {
            if let Some(c) = inner.ctxs.get_mut(sref.ctx()) {
                c.legacy_last = seq;
            }
            true
        }
    };
    if blocking && let Some(c) = inner.ctxs.get_mut(sref.ctx()) {
        c.last_blocking = seq;
    }
    Ok(seq)
}

/// Queues a kernel on the stream, or records it as a kernel node if the stream is capturing.
pub fn queue_kernel(d: &Driver, inner: &mut Inner, sref: StreamRef, cost: Cost) -> Res {
    if crate::graph::capture_kernel(inner, sref, cost) {
        return Ok(());
    }
    let kind = match cost.timing {
        Timing::Work => simgpu::layout::ITEM_KERNEL,
        Timing::Wait => simgpu::layout::ITEM_WAIT,
    };
    push(
        d,
        inner,
        sref,
        Item {
            kind,
            remaining: cost.ns,
            total: cost.ns,
            ..Item::default()
        },
    )
    .map(|_| ())
}

/// (device, shared ctx, generation, sequence number) a synchronisation of `sref` waits for.
pub fn sync_target(inner: &Inner, sref: StreamRef) -> Res<(u32, u32, u32, u64)> {
    let c = inner.ctx(sref.ctx())?;
    let seq = match sref {
        StreamRef::Legacy(_) => c.last_blocking,
        StreamRef::PerThread(ctx) => {
            PER_THREAD.with(|m| m.borrow().get(&ctx).copied().unwrap_or(0))
        }
        StreamRef::Real(h, _) => inner.streams.get(h).ok_or(E_INVALID_HANDLE)?.last_seq,
    };
    Ok((c.dev, c.shared, c.shared_gen, seq))
}

fn capturing(inner: &Inner, sref: StreamRef) -> bool {
    matches!(sref, StreamRef::Real(h, _) if inner.streams.get(h).is_some_and(|s| s.capture.is_some()))
}

fn stream_sync(s: CUstream, ptsz: bool) -> Res {
    let d = drv()?;
    let (dev, ctx, generation, seq) = {
        let mut inner = d.inner.lock();
        let sref = resolve(&inner, s, ptsz)?;
        if capturing(&inner, sref) {
            inner.refuse_if_capturing()?;
            return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        sync_target(&inner, sref)?
    };
    wait_seq(d, dev, ctx, generation, seq);
    crate::pool::release_to_thresholds(d, dev);
    Ok(())
}

fn stream_query(s: CUstream, ptsz: bool) -> Res {
    let d = drv()?;
    let (dev, ctx, _, seq) = {
        let inner = d.inner.lock();
        sync_target(&inner, resolve(&inner, s, ptsz)?)?
    };
    let mut g = d.state.lock_device(dev);
    g.advance_now();
    if g.dev().completed(ctx) >= seq {
        Ok(())
    } else {
        Err(CUresult::CUDA_ERROR_NOT_READY)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(out: *mut CUstream, flags: c_uint) -> CUresult {
    status(drv().and_then(|d| {
        if out.is_null() || flags > CU_STREAM_NON_BLOCKING {
            return Err(E_INVALID_VALUE);
        }
        let mut inner = d.inner.lock();
        let ctx = inner.cur()?.0;
        let h = inner.streams.insert(Stream {
            ctx,
            flags,
            priority: 0,
            last_seq: 0,
            capture: None,
        });
        // SAFETY: checked non-NULL.
        unsafe { out.write(to_ptr(h)) };
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    out: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { cuStreamCreate(out, flags) };
    if r == CUresult::CUDA_SUCCESS
        && let Ok(d) = drv()
        // SAFETY: cuStreamCreate wrote the new stream there.
        && let Some(st) = d.inner.lock().streams.get_mut(from_ptr(unsafe { *out }))
    {
        // Out of range is clamped to it, as the driver does.
        st.priority = priority.clamp(crate::info::GREATEST_PRIORITY, crate::info::LEAST_PRIORITY);
    }
    r
}

fn stream_destroy(s: CUstream) -> Res {
    let d = drv()?;
    let mut inner = d.inner.lock();
    let st = inner.streams.remove(from_ptr(s)).ok_or(E_INVALID_HANDLE)?;
    if st
        .capture
        .as_ref()
        .is_some_and(|c| c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
    {
        inner.global_captures -= 1;
    }
    Ok(()) // queued work still completes, as CUDA specifies
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy(s: CUstream) -> CUresult {
    status(stream_destroy(s))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy_v2(s: CUstream) -> CUresult {
    status(stream_destroy(s))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize(s: CUstream) -> CUresult {
    status(stream_sync(s, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(s: CUstream) -> CUresult {
    status(stream_sync(s, true))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamQuery(s: CUstream) -> CUresult {
    status(stream_query(s, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamQuery_ptsz(s: CUstream) -> CUresult {
    status(stream_query(s, true))
}

fn stream_wait_event(s: CUstream, e: CUevent, ptsz: bool) -> Res {
    let d = drv()?;
    let (target, sref_ctx) = {
        let inner = d.inner.lock();
        let sref = resolve(&inner, s, ptsz)?;
        let ev = inner.events.get(from_ptr(e)).ok_or(E_INVALID_HANDLE)?;
        (ev.recorded, sref.ctx())
    };
    // Work of one context is in order already; across contexts, hold the host until the event.
    if let Some((dev, ctx, generation, seq)) = target {
        let same = d
            .inner
            .lock()
            .ctxs
            .get(sref_ctx)
            .is_some_and(|c| c.dev == dev && c.shared == ctx);
        if !same {
            wait_seq(d, dev, ctx, generation, seq);
        }
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamWaitEvent(s: CUstream, e: CUevent, _flags: c_uint) -> CUresult {
    status(stream_wait_event(s, e, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamWaitEvent_ptsz(
    s: CUstream,
    e: CUevent,
    _flags: c_uint,
) -> CUresult {
    status(stream_wait_event(s, e, true))
}

// ---- events -----------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(out: *mut CUevent, flags: c_uint) -> CUresult {
    status(drv().and_then(|d| {
        if out.is_null() || flags > 0x7 {
            return Err(E_INVALID_VALUE);
        }
        let slot = d
            .state
            .my_slot()
            .ok_or(CUresult::CUDA_ERROR_NOT_INITIALIZED)?;
        let mut inner = d.inner.lock();
        let (ctx, c) = inner.cur()?;
        let dev = c.dev;
        let (idx, generation) = d
            .state
            .lock_device(dev)
            .dev()
            .create_event(slot)
            .ok_or(E_OOM)?;
        let h = inner.events.insert(EventObj {
            dev,
            idx,
            generation,
            flags,
            ctx,
            recorded: None,
        });
        // SAFETY: checked non-NULL.
        unsafe { out.write(to_ptr(h)) };
        Ok(())
    }))
}

fn event_record(e: CUevent, s: CUstream, ptsz: bool) -> Res {
    let d = drv()?;
    let mut inner = d.inner.lock();
    let sref = resolve(&inner, s, ptsz)?;
    let eh = from_ptr(e);
    let (dev, idx, generation) = {
        let ev = inner.events.get(eh).ok_or(E_INVALID_HANDLE)?;
        (ev.dev, ev.idx, ev.generation)
    };
    if capturing(&inner, sref) {
        return Ok(()); // an event node: nothing to time in the simulator
    }
    let c = inner.ctx(sref.ctx())?;
    if c.dev != dev {
        return Err(E_INVALID_HANDLE);
    }
    let (shared, shared_gen) = (c.shared, c.shared_gen);
    let record_generation = {
        let mut g = d.state.lock_device(dev);
        let dv = g.dev();
        let ev = &mut dv.b.events[idx as usize];
        if ev.generation != generation {
            return Err(E_INVALID_HANDLE);
        }
        ev.record_generation = ev.record_generation.wrapping_add(1);
        ev.state = EVENT_PENDING;
        ev.record_generation
    };
    let seq = push(
        d,
        &mut inner,
        sref,
        Item {
            kind: ITEM_MARKER,
            arg: idx as u64 | (record_generation as u64) << 32,
            ..Item::default()
        },
    )?;
    if let Some(ev) = inner.events.get_mut(eh) {
        ev.recorded = Some((dev, shared, shared_gen, seq));
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord(e: CUevent, s: CUstream) -> CUresult {
    status(event_record(e, s, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord_ptsz(e: CUevent, s: CUstream) -> CUresult {
    status(event_record(e, s, true))
}

/// The event's shared state after bringing its device up to now.
fn event_state(d: &Driver, eh: u64) -> Res<(u32, u64, u32)> {
    let (dev, idx, generation, flags) = {
        let inner = d.inner.lock();
        let ev = inner.events.get(eh).ok_or(E_INVALID_HANDLE)?;
        (ev.dev, ev.idx, ev.generation, ev.flags)
    };
    let mut g = d.state.lock_device(dev);
    g.advance_now();
    let dv = g.dev();
    let ev = dv.event(idx, generation).ok_or(E_INVALID_HANDLE)?;
    Ok((ev.state, ev.ts, flags))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventQuery(e: CUevent) -> CUresult {
    status(drv().and_then(|d| match event_state(d, from_ptr(e))?.0 {
        EVENT_PENDING => Err(CUresult::CUDA_ERROR_NOT_READY),
        _ => Ok(()),
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventSynchronize(e: CUevent) -> CUresult {
    status(drv().and_then(|d| {
        let rec = {
            let inner = d.inner.lock();
            inner
                .events
                .get(from_ptr(e))
                .ok_or(E_INVALID_HANDLE)?
                .recorded
        };
        if let Some((dev, ctx, generation, seq)) = rec {
            wait_seq(d, dev, ctx, generation, seq);
            crate::pool::release_to_thresholds(d, dev);
        }
        Ok(())
    }))
}

fn elapsed(ms: *mut c_float, start: CUevent, end: CUevent) -> Res {
    let d = drv()?;
    if ms.is_null() {
        return Err(E_INVALID_VALUE);
    }
    let (s_state, s_ts, s_flags) = event_state(d, from_ptr(start))?;
    let (e_state, e_ts, e_flags) = event_state(d, from_ptr(end))?;
    if (s_flags | e_flags) & CU_EVENT_DISABLE_TIMING != 0
        || s_state == EVENT_CREATED
        || e_state == EVENT_CREATED
    {
        return Err(E_INVALID_HANDLE);
    }
    if s_state != EVENT_DONE || e_state != EVENT_DONE {
        return Err(CUresult::CUDA_ERROR_NOT_READY);
    }
    // SAFETY: checked non-NULL.
    unsafe { ms.write(((e_ts as i128 - s_ts as i128) as f64 / 1e6) as c_float) };
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut c_float,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    status(elapsed(ms, start, end))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut c_float,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    status(elapsed(ms, start, end))
}

fn event_destroy(e: CUevent) -> Res {
    let d = drv()?;
    let ev = d
        .inner
        .lock()
        .events
        .remove(from_ptr(e))
        .ok_or(E_INVALID_HANDLE)?;
    d.state
        .lock_device(ev.dev)
        .dev()
        .destroy_event(ev.idx, ev.generation);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventDestroy(e: CUevent) -> CUresult {
    status(event_destroy(e))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventDestroy_v2(e: CUevent) -> CUresult {
    status(event_destroy(e))
}

// ---- host functions ---------------------------------------------------------------------

/// A host function waiting for its turn in a context's queue.
pub struct HostCall {
    pub dev: u32,
    pub ctx: u32,
    pub ctx_gen: u32,
    pub seq: u64,
    pub f: unsafe extern "C" fn(*mut c_void),
    pub data: usize,
}

fn hostfn_worker(rx: std::sync::mpsc::Receiver<HostCall>) {
    let Ok(d) = drv() else { return };
    for call in rx {
        // Run when everything queued before it has finished; the engine holds the context's
        // later work until we report the function returned.
        wait_seq(d, call.dev, call.ctx, call.ctx_gen, call.seq - 1);
        // SAFETY: the application's callback with its own argument, as cuLaunchHostFunc promises.
        unsafe { (call.f)(call.data as *mut c_void) };
        let mut g = d.state.lock_device(call.dev);
        g.advance_now();
        g.dev().finish_hostfn(call.ctx, call.seq);
    }
}

fn launch_host_func(s: CUstream, f: CUhostFn, data: *mut c_void, ptsz: bool) -> Res {
    let f = f.ok_or(E_INVALID_VALUE)?;
    let d = drv()?;
    let mut inner = d.inner.lock();
    let sref = resolve(&inner, s, ptsz)?;
    if capturing(&inner, sref) {
        return Ok(());
    }
    let c = inner.ctx(sref.ctx())?;
    let (dev, ctx, ctx_gen) = (c.dev, c.shared, c.shared_gen);
    let seq = push(
        d,
        &mut inner,
        sref,
        Item {
            kind: ITEM_HOSTFN,
            remaining: HOSTFN_PENDING,
            ..Item::default()
        },
    )?;
    let tx = d.hostfn.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("simgpu-hostfn".into())
            .spawn(move || hostfn_worker(rx))
            .expect("simgpu: cannot start the host-function thread");
        tx
    });
    tx.send(HostCall {
        dev,
        ctx,
        ctx_gen,
        seq,
        f,
        data: data as usize,
    })
    .map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchHostFunc(s: CUstream, f: CUhostFn, data: *mut c_void) -> CUresult {
    status(launch_host_func(s, f, data, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchHostFunc_ptsz(
    s: CUstream,
    f: CUhostFn,
    data: *mut c_void,
) -> CUresult {
    status(launch_host_func(s, f, data, true))
}

pub fn release_ctx(d: &Driver, inner: &mut Inner, ctx: u64) {
    let streams: Vec<u64> = inner
        .streams
        .iter()
        .filter(|(_, s)| s.ctx == ctx)
        .map(|(h, _)| h)
        .collect();
    for h in streams {
        if let Some(s) = inner.streams.remove(h)
            && s.capture
                .is_some_and(|c| c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
        {
            inner.global_captures -= 1;
        }
    }
    let events: Vec<u64> = inner
        .events
        .iter()
        .filter(|(_, e)| e.ctx == ctx)
        .map(|(h, _)| h)
        .collect();
    for h in events {
        if let Some(e) = inner.events.remove(h) {
            d.state
                .lock_device(e.dev)
                .dev()
                .destroy_event(e.idx, e.generation);
        }
    }
}
