//! Queries about streams, captures and contexts that frameworks make at start-up and around
//! graph capture (PyTorch's stream pools and `torch.cuda.CUDAGraph`): stream priorities and
//! flags, capture status and id, and the thread's capture interaction mode.

use std::ffi::{c_int, c_uint};

use cuda_abi::*;

use crate::driver::*;
use crate::stream::{StreamRef, resolve};

/// The stream priority range of an H100 (`cuCtxGetStreamPriorityRange`): 0 is the lowest
/// (default) priority, -5 the highest.
pub const LEAST_PRIORITY: i32 = 0;
pub const GREATEST_PRIORITY: i32 = -5;

/// Either pointer may be NULL; needs a current context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    status(drv().and_then(|d| {
        d.inner.lock().cur()?;
        // SAFETY: optional out-pointers from the caller.
        unsafe {
            if !least.is_null() {
                least.write(LEAST_PRIORITY);
            }
            if !greatest.is_null() {
                greatest.write(GREATEST_PRIORITY);
            }
        }
        Ok(())
    }))
}

/// A stream's priority and flags; the default streams have priority 0 and flags 0
/// (`CU_STREAM_DEFAULT`).
fn stream_info(s: CUstream, ptsz: bool) -> Res<(i32, u32)> {
    let d = drv()?;
    let inner = d.inner.lock();
    Ok(match resolve(&inner, s, ptsz)? {
        StreamRef::Real(h, _) => inner
            .streams
            .get(h)
            .map(|st| (st.priority, st.flags))
            .ok_or(E_INVALID_HANDLE)?,
        _ => (0, 0),
    })
}

fn get_priority(s: CUstream, out: *mut c_int, ptsz: bool) -> CUresult {
    // SAFETY: out-pointer from the caller (NULL refused by `put`).
    status(stream_info(s, ptsz).and_then(|(p, _)| unsafe { put(out, p) }))
}

fn get_flags(s: CUstream, out: *mut c_uint, ptsz: bool) -> CUresult {
    // SAFETY: out-pointer from the caller (NULL refused by `put`).
    status(stream_info(s, ptsz).and_then(|(_, f)| unsafe { put(out, f) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetPriority(s: CUstream, out: *mut c_int) -> CUresult {
    get_priority(s, out, false)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetPriority_ptsz(s: CUstream, out: *mut c_int) -> CUresult {
    get_priority(s, out, true)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetFlags(s: CUstream, out: *mut c_uint) -> CUresult {
    get_flags(s, out, false)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetFlags_ptsz(s: CUstream, out: *mut c_uint) -> CUresult {
    get_flags(s, out, true)
}

/// Sets this thread's capture interaction mode and hands back the one it had
/// (`CU_STREAM_CAPTURE_MODE_GLOBAL` until changed). In relaxed mode, calls that are unsafe
/// during a global-mode capture are allowed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) -> CUresult {
    if mode.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-NULL.
    let new = unsafe { *mode };
    if new > CU_STREAM_CAPTURE_MODE_RELAXED {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-NULL.
    unsafe { mode.write(CAPTURE_MODE.replace(new)) };
    CUresult::CUDA_SUCCESS
}

/// A stream's capture status and, while capturing, the capture's id (unique in the process).
/// The graph being built and its dependency set are not exposed: the graph out-pointer gets
/// NULL and the dependencies none.
fn capture_info(s: CUstream, ptsz: bool) -> Res<(u32, u64)> {
    let d = drv()?;
    let inner = d.inner.lock();
    Ok(match resolve(&inner, s, ptsz)? {
        StreamRef::Real(h, _) => match inner.streams.get(h).and_then(|s| s.capture.as_ref()) {
            Some(c) if c.invalidated => (CU_STREAM_CAPTURE_STATUS_INVALIDATED, c.id),
            Some(c) => (CU_STREAM_CAPTURE_STATUS_ACTIVE, c.id),
            None => (CU_STREAM_CAPTURE_STATUS_NONE, 0),
        },
        _ => (CU_STREAM_CAPTURE_STATUS_NONE, 0),
    })
}

/// cuStreamGetCaptureInfo's out-pointers; all but `status` optional (NULL).
struct CaptureOuts {
    status: *mut u32,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const std::ffi::c_void,
    count: *mut usize,
}

impl CaptureOuts {
    fn new(status: *mut u32, id: *mut u64) -> CaptureOuts {
        CaptureOuts {
            status,
            id,
            graph: std::ptr::null_mut(),
            deps: std::ptr::null_mut(),
            edges: std::ptr::null_mut(),
            count: std::ptr::null_mut(),
        }
    }
}

/// # Safety
/// Every non-NULL pointer in `o` is an out-pointer of the caller's.
unsafe fn write_capture_info(s: CUstream, ptsz: bool, o: CaptureOuts) -> CUresult {
    status(capture_info(s, ptsz).and_then(|(st, cid)| {
        if o.status.is_null() {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: out-pointers from the caller, each optional but the status.
        unsafe {
            o.status.write(st);
            if st == CU_STREAM_CAPTURE_STATUS_NONE {
                return Ok(());
            }
            if !o.id.is_null() {
                o.id.write(cid);
            }
            if !o.graph.is_null() {
                o.graph.write(std::ptr::null_mut());
            }
            if !o.deps.is_null() {
                o.deps.write(std::ptr::null());
            }
            if !o.edges.is_null() {
                o.edges.write(std::ptr::null());
            }
            if !o.count.is_null() {
                o.count.write(0);
            }
        }
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo(
    s: CUstream,
    st: *mut u32,
    id: *mut u64,
) -> CUresult {
    // SAFETY: the caller's out-pointers.
    unsafe { write_capture_info(s, false, CaptureOuts::new(st, id)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_ptsz(
    s: CUstream,
    st: *mut u32,
    id: *mut u64,
) -> CUresult {
    // SAFETY: the caller's out-pointers.
    unsafe { write_capture_info(s, true, CaptureOuts::new(st, id)) }
}

/// The CUDA 11.3 form: the graph being built and its dependencies too.
fn outs_v2(
    st: *mut u32,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    count: *mut usize,
) -> CaptureOuts {
    CaptureOuts {
        graph,
        deps,
        count,
        ..CaptureOuts::new(st, id)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    s: CUstream,
    st: *mut u32,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's out-pointers.
    unsafe { write_capture_info(s, false, outs_v2(st, id, graph, deps, count)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2_ptsz(
    s: CUstream,
    st: *mut u32,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's out-pointers.
    unsafe { write_capture_info(s, true, outs_v2(st, id, graph, deps, count)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    s: CUstream,
    st: *mut u32,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const std::ffi::c_void,
    count: *mut usize,
) -> CUresult {
    let o = CaptureOuts {
        edges,
        ..outs_v2(st, id, graph, deps, count)
    };
    // SAFETY: the caller's out-pointers.
    unsafe { write_capture_info(s, false, o) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3_ptsz(
    s: CUstream,
    st: *mut u32,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const std::ffi::c_void,
    count: *mut usize,
) -> CUresult {
    let o = CaptureOuts {
        edges,
        ..outs_v2(st, id, graph, deps, count)
    };
    // SAFETY: the caller's out-pointers.
    unsafe { write_capture_info(s, true, o) }
}

// ---- graph memory --------------------------------------------------------------------------
// Graph allocation nodes take their memory when an instantiated graph is first launched or
// uploaded and keep it until that graph is destroyed (graph.rs); nothing is pooled between
// graphs, so what the device holds for graphs (reserved) is the sum of those allocations in
// whole granules, and what they use is the sum of their sizes.

/// Highest (used, reserved) graph memory per device since the last reset, noted at each backing.
static GRAPH_MEM_HIGH: std::sync::Mutex<Vec<(u32, u64, u64)>> = std::sync::Mutex::new(Vec::new());

/// This process's graph memory on physical device `dev`: (used, reserved).
fn graph_mem(inner: &Inner, dev: u32) -> (u64, u64) {
    let mut used = 0;
    let mut reserved = 0;
    for h in inner.execs.handles() {
        if let Some(e) = inner.execs.get(h)
            && !e.backing.is_empty()
        {
            for &(_, size, d) in &e.allocs {
                if d == dev {
                    used += size;
                    reserved += size.next_multiple_of(simgpu::layout::GRANULE);
                }
            }
        }
    }
    (used, reserved)
}

fn with_high<R>(dev: u32, f: impl FnOnce(&mut (u32, u64, u64)) -> R) -> R {
    let mut all = GRAPH_MEM_HIGH.lock().unwrap_or_else(|e| e.into_inner());
    let i = match all.iter().position(|e| e.0 == dev) {
        Some(i) => i,
        None => {
            all.push((dev, 0, 0));
            all.len() - 1
        }
    };
    f(&mut all[i])
}

/// Raises device `dev`'s high watermarks to what graphs hold now (after a graph is backed).
pub fn note_graph_mem(inner: &Inner, dev: u32) {
    let (used, reserved) = graph_mem(inner, dev);
    with_high(dev, |h| {
        h.1 = h.1.max(used);
        h.2 = h.2.max(reserved);
    });
}

const GRAPH_MEM_USED_CURRENT: c_int = 0;
const GRAPH_MEM_USED_HIGH: c_int = 1;
const GRAPH_MEM_RESERVED_CURRENT: c_int = 2;
const GRAPH_MEM_RESERVED_HIGH: c_int = 3;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    device: CUdevice,
    attr: c_int,
    value: *mut std::ffi::c_void,
) -> CUresult {
    status(drv().and_then(|d| {
        let dev = d.physical(device)?;
        let (used, reserved) = graph_mem(&d.inner.lock(), dev);
        let v = match attr {
            GRAPH_MEM_USED_CURRENT => used,
            GRAPH_MEM_RESERVED_CURRENT => reserved,
            GRAPH_MEM_USED_HIGH => with_high(dev, |h| h.1.max(used)),
            GRAPH_MEM_RESERVED_HIGH => with_high(dev, |h| h.2.max(reserved)),
            _ => return Err(E_INVALID_VALUE),
        };
        // SAFETY: out-pointer to a cuuint64_t from the caller (NULL refused by `put`).
        unsafe { put(value as *mut u64, v) }
    }))
}

/// Only the high watermarks may be set, and only to 0, which resets them to the current use.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceSetGraphMemAttribute(
    device: CUdevice,
    attr: c_int,
    value: *mut std::ffi::c_void,
) -> CUresult {
    status(drv().and_then(|d| {
        let dev = d.physical(device)?;
        if value.is_null() || !matches!(attr, GRAPH_MEM_USED_HIGH | GRAPH_MEM_RESERVED_HIGH) {
            return Err(E_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; a cuuint64_t of the caller's.
        if unsafe { *(value as *const u64) } != 0 {
            return Err(E_INVALID_VALUE);
        }
        let (used, reserved) = graph_mem(&d.inner.lock(), dev);
        with_high(dev, |h| {
            if attr == GRAPH_MEM_USED_HIGH {
                h.1 = used;
            } else {
                h.2 = reserved;
            }
        });
        Ok(())
    }))
}

/// Gives back graph memory no graph uses: the simulator keeps none beyond live graphs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(device: CUdevice) -> CUresult {
    status(drv().and_then(|d| d.physical(device).map(|_| ())))
}

// ---- events ---------------------------------------------------------------------------------

/// `CU_EVENT_RECORD_EXTERNAL`: during a capture, an event-record node (the simulator keeps no
/// event nodes; see graph.rs); outside one, invalid.
const EVENT_RECORD_EXTERNAL: c_uint = 1;

fn record_with_flags(e: CUevent, s: CUstream, flags: c_uint, ptsz: bool) -> CUresult {
    let check = drv().and_then(|_| {
        if flags > EVENT_RECORD_EXTERNAL {
            return Err(E_INVALID_VALUE);
        }
        if flags == EVENT_RECORD_EXTERNAL
            && capture_info(s, ptsz)?.0 == CU_STREAM_CAPTURE_STATUS_NONE
        {
            return Err(E_INVALID_VALUE);
        }
        Ok(())
    });
    if let Err(err) = check {
        return err;
    }
    // SAFETY: forwarding the caller's handles.
    unsafe {
        if ptsz {
            crate::stream::cuEventRecord_ptsz(e, s)
        } else {
            crate::stream::cuEventRecord(e, s)
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecordWithFlags(
    e: CUevent,
    s: CUstream,
    flags: c_uint,
) -> CUresult {
    record_with_flags(e, s, flags, false)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecordWithFlags_ptsz(
    e: CUevent,
    s: CUstream,
    flags: c_uint,
) -> CUresult {
    record_with_flags(e, s, flags, true)
}

// ---- graphs ---------------------------------------------------------------------------------

/// A graph's nodes (kernels and memory nodes, in capture order). Node handles are opaque values
/// naming the graph and the node's place in it; no call takes them back yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: CUgraph,
    nodes: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    status(drv().and_then(|d| {
        if count.is_null() {
            return Err(E_INVALID_VALUE);
        }
        let gh = crate::handles::from_ptr(graph);
        let n = d
            .inner
            .lock()
            .graphs
            .get(gh)
            .map(|g| g.nodes.len())
            .ok_or(E_INVALID_VALUE)?;
        // SAFETY: checked non-NULL; with `nodes`, the caller gave *count entries.
        unsafe {
            if !nodes.is_null() {
                for i in 0..*count {
                    let h = if i < n { (gh << 24) + i as u64 + 1 } else { 0 };
                    nodes.add(i).write(crate::handles::to_ptr(h));
                }
                count.write((*count).min(n));
            } else {
                count.write(n);
            }
        }
        Ok(())
    }))
}
