//! Stream capture and CUDA graphs. Captured kernels become kernel nodes; cuMemAllocAsync on a
//! capturing stream becomes a memory-allocation node (its address is fixed at capture, its
//! device memory is taken at the first launch of an instantiated graph, or by cuGraphUpload, and
//! kept until the instantiated graph is destroyed). A graph launch occupies the engine for the
//! sum of its kernels: kernels that work, one after another, as one item of work; a kernel that
//! waits for the clock as an item of its own (its deadline is its own).

use cuda_abi::*;
use simgpu::{AllocId, AllocKind};

use crate::driver::*;
use crate::handles::{from_ptr, to_ptr};
use crate::memory::{give, take};
use crate::module::Cost;
use crate::ptx::Timing;
use crate::stream::{StreamRef, resolve};

#[derive(Clone, Debug)]
pub enum Node {
    Kernel(Cost),
    MemAlloc { va: u64, size: u64, dev: u32 },
    MemFree,
}

pub struct Capture {
    /// Unique in the process (`cuStreamGetCaptureInfo`'s id).
    pub id: u64,
    pub mode: u32,
    pub invalidated: bool,
    pub nodes: Vec<Node>,
}

pub struct Graph {
    pub nodes: Vec<Node>,
}

pub struct Exec {
    pub ctx: u64,
    /// What a launch queues, in order: runs of working kernels summed, each waiting kernel alone.
    pub kernels: Vec<Cost>,
    /// Graph-allocated memory: (address, size, device).
    pub allocs: Vec<(u64, u64, u32)>,
    pub backing: Vec<(u32, AllocId)>,
}

/// Records a kernel launch on a capturing stream; false if the stream is not capturing.
pub fn capture_kernel(inner: &mut Inner, sref: StreamRef, cost: Cost) -> bool {
    let StreamRef::Real(h, _) = sref else {
        return false;
    };
    match inner.streams.get_mut(h).and_then(|s| s.capture.as_mut()) {
        Some(c) => {
            c.nodes.push(Node::Kernel(cost));
            true
        }
        None => false,
    }
}

pub fn capture_alloc(_d: &Driver, inner: &mut Inner, stream: u64, size: u64) -> Res<u64> {
    if size == 0 {
        return Err(E_INVALID_VALUE);
    }
    let ctx = inner.streams.get(stream).ok_or(E_INVALID_HANDLE)?.ctx;
    let dev = inner.ctx(ctx)?.dev;
    let va = inner.va.take(size, 0)?;
    inner.maps.insert(
        va,
        Mapping {
            len: size.next_multiple_of(simgpu::GRANULE),
            dev,
            ctx,
            id: None,
            offset: 0,
            kind: MapKind::Graph,
            size,
            host_mapped: false,
            handle: 0,
        },
    );
    let c = inner
        .streams
        .get_mut(stream)
        .and_then(|s| s.capture.as_mut())
        .ok_or(E_INVALID_HANDLE)?;
    c.nodes.push(Node::MemAlloc { va, size, dev });
    Ok(va)
}

pub fn capture_free(inner: &mut Inner, stream: u64, _va: u64) -> Res {
    let c = inner
        .streams
        .get_mut(stream)
        .and_then(|s| s.capture.as_mut())
        .ok_or(E_INVALID_HANDLE)?;
    c.nodes.push(Node::MemFree);
    Ok(())
}

fn begin(s: CUstream, mode: u32, ptsz: bool) -> Res {
    let d = drv()?;
    let mut inner = d.inner.lock();
    let StreamRef::Real(h, _) = resolve(&inner, s, ptsz)? else {
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); // the default streams cannot be captured
    };
    if mode > CU_STREAM_CAPTURE_MODE_RELAXED {
        return Err(E_INVALID_VALUE);
    }
    let st = inner.streams.get_mut(h).ok_or(E_INVALID_HANDLE)?;
    if st.capture.is_some() {
        return Err(E_INVALID_VALUE);
    }
    static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    st.capture = Some(Capture {
        id: IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        mode,
        invalidated: false,
        nodes: Vec::new(),
    });
    if mode == CU_STREAM_CAPTURE_MODE_GLOBAL {
        inner.global_captures += 1;
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCapture(s: CUstream) -> CUresult {
    status(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCapture_ptsz(s: CUstream) -> CUresult {
    status(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL, true))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(s: CUstream, mode: u32) -> CUresult {
    status(begin(s, mode, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCapture_v2_ptsz(s: CUstream, mode: u32) -> CUresult {
    status(begin(s, mode, true))
}

fn end(s: CUstream, out: *mut CUgraph, ptsz: bool) -> Res {
    let d = drv()?;
    if out.is_null() {
        return Err(E_INVALID_VALUE);
    }
    let mut inner = d.inner.lock();
    let StreamRef::Real(h, _) = resolve(&inner, s, ptsz)? else {
        return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    };
    let cap = inner
        .streams
        .get_mut(h)
        .ok_or(E_INVALID_HANDLE)?
        .capture
        .take()
        .ok_or(E_INVALID_VALUE)?;
    if cap.mode == CU_STREAM_CAPTURE_MODE_GLOBAL {
        inner.global_captures -= 1;
    }
    if cap.invalidated {
        // SAFETY: checked non-NULL.
        unsafe { out.write(std::ptr::null_mut()) };
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    let g = inner.graphs.insert(Graph { nodes: cap.nodes });
    // SAFETY: checked non-NULL.
    unsafe { out.write(to_ptr(g)) };
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture(s: CUstream, g: *mut CUgraph) -> CUresult {
    status(end(s, g, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(s: CUstream, g: *mut CUgraph) -> CUresult {
    status(end(s, g, true))
}

fn is_capturing(s: CUstream, out: *mut u32, ptsz: bool) -> Res {
    let d = drv()?;
    let inner = d.inner.lock();
    let st = match resolve(&inner, s, ptsz)? {
        StreamRef::Real(h, _) => match inner.streams.get(h).and_then(|s| s.capture.as_ref()) {
            Some(c) if c.invalidated => CU_STREAM_CAPTURE_STATUS_INVALIDATED,
            Some(_) => CU_STREAM_CAPTURE_STATUS_ACTIVE,
            None => CU_STREAM_CAPTURE_STATUS_NONE,
        },
        _ => CU_STREAM_CAPTURE_STATUS_NONE,
    };
    // SAFETY: out-pointer from the caller.
    unsafe { put(out, st) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(s: CUstream, st: *mut u32) -> CUresult {
    status(is_capturing(s, st, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(s: CUstream, st: *mut u32) -> CUresult {
    status(is_capturing(s, st, true))
}

/// The CUDA 10/11 ABI: an error node and a log buffer instead of flags.
fn instantiate_with_log(
    out: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut std::ffi::c_char,
    log_size: usize,
) -> CUresult {
    // SAFETY: optional out-pointers from the caller; the log buffer has `log_size` bytes.
    unsafe {
        if !error_node.is_null() {
            error_node.write(std::ptr::null_mut());
        }
        if !log.is_null() && log_size > 0 {
            log.write(0);
        }
        cuGraphInstantiateWithFlags(out, graph, 0)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate(
    out: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut std::ffi::c_char,
    log_size: usize,
) -> CUresult {
    instantiate_with_log(out, graph, error_node, log, log_size)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    out: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut std::ffi::c_char,
    log_size: usize,
) -> CUresult {
    instantiate_with_log(out, graph, error_node, log, log_size)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    out: *mut CUgraphExec,
    graph: CUgraph,
    _flags: u64,
) -> CUresult {
    status(drv().and_then(|d| {
        if out.is_null() {
            return Err(E_INVALID_VALUE);
        }
        let mut inner = d.inner.lock();
        let ctx = inner.cur()?.0;
        let g = inner.graphs.get(from_ptr(graph)).ok_or(E_INVALID_HANDLE)?;
        let kernels = queued(&g.nodes);
        let allocs = g
            .nodes
            .iter()
            .filter_map(|n| {
                if let Node::MemAlloc { va, size, dev } = n {
                    Some((*va, *size, *dev))
                } else {
                    None
                }
            })
            .collect();
        let h = inner.execs.insert(Exec {
            ctx,
            kernels,
            allocs,
            backing: Vec::new(),
        });
        // SAFETY: checked non-NULL.
        unsafe { out.write(to_ptr(h)) };
        Ok(())
    }))
}

/// What a launch of a graph of `nodes` queues: consecutive working kernels as one item of their
/// summed work, each waiting kernel as an item of its own; one empty item for a graph without
/// kernels (so synchronising on the launch waits for the work queued before it).
fn queued(nodes: &[Node]) -> Vec<Cost> {
    let mut out: Vec<Cost> = Vec::new();
    for n in nodes {
        let Node::Kernel(c) = n else { continue };
        match out.last_mut() {
            Some(last) if last.timing == Timing::Work && c.timing == Timing::Work => {
                last.ns = last.ns.saturating_add(c.ns);
            }
            _ => out.push(*c),
        }
    }
    if out.is_empty() {
        out.push(Cost {
            ns: 0,
            timing: Timing::Work,
        });
    }
    out
}

/// Takes device memory for the graph's allocation nodes (once per instantiated graph).
fn back(d: &Driver, inner: &mut Inner, eh: u64) -> Res {
    let e = inner.execs.get(eh).ok_or(E_INVALID_HANDLE)?;
    if !e.backing.is_empty() || e.allocs.is_empty() {
        return Ok(());
    }
    let allocs = e.allocs.clone();
    let mut backing = Vec::new();
    for (_, size, dev) in &allocs {
        match take(d, *dev, AllocKind::Graph, *size) {
            Ok(id) => backing.push((*dev, id)),
            Err(err) => {
                for (dev, id) in backing {
                    give(d, dev, id);
                }
                return Err(err);
            }
        }
    }
    for ((va, _, _), (_, id)) in allocs.iter().zip(&backing) {
        if let Some(m) = inner.maps.get_mut(va) {
            m.id = Some(*id);
            m.handle = eh;
        }
    }
    let devs: Vec<u32> = backing.iter().map(|b| b.0).collect();
    inner.execs.get_mut(eh).ok_or(E_INVALID_HANDLE)?.backing = backing;
    for dev in devs {
        crate::info::note_graph_mem(inner, dev);
    }
    Ok(())
}

fn launch(exec: CUgraphExec, s: CUstream, ptsz: bool) -> Res {
    let d = drv()?;
    let mut inner = d.inner.lock();
    let sref = resolve(&inner, s, ptsz)?;
    let eh = from_ptr(exec);
    back(d, &mut inner, eh)?;
    let kernels = inner.execs.get(eh).ok_or(E_INVALID_HANDLE)?.kernels.clone();
    for cost in kernels {
        crate::stream::queue_kernel(d, &mut inner, sref, cost)?;
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(exec: CUgraphExec, s: CUstream) -> CUresult {
    status(launch(exec, s, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: CUgraphExec, s: CUstream) -> CUresult {
    status(launch(exec, s, true))
}

fn upload(exec: CUgraphExec, s: CUstream, ptsz: bool) -> Res {
    let d = drv()?;
    let mut inner = d.inner.lock();
    resolve(&inner, s, ptsz)?;
    back(d, &mut inner, from_ptr(exec))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphUpload(exec: CUgraphExec, s: CUstream) -> CUresult {
    status(upload(exec, s, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphUpload_ptsz(exec: CUgraphExec, s: CUstream) -> CUresult {
    status(upload(exec, s, true))
}

fn destroy_exec(d: &Driver, inner: &mut Inner, eh: u64) -> Res {
    let e = inner.execs.remove(eh).ok_or(E_INVALID_HANDLE)?;
    for (dev, id) in e.backing {
        give(d, dev, id);
    }
    for (va, _, _) in e.allocs {
        if let Some(m) = inner.maps.remove(&va) {
            inner.va.give(va, m.len);
        }
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    status(drv().and_then(|d| destroy_exec(d, &mut d.inner.lock(), from_ptr(exec))))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    status(drv().and_then(|d| {
        d.inner
            .lock()
            .graphs
            .remove(from_ptr(graph))
            .map(|_| ())
            .ok_or(E_INVALID_HANDLE)
    }))
}

pub fn release_ctx(d: &Driver, inner: &mut Inner, ctx: u64) {
    let execs: Vec<u64> = inner
        .execs
        .iter()
        .filter(|(_, e)| e.ctx == ctx)
        .map(|(h, _)| h)
        .collect();
    for h in execs {
        let _ = destroy_exec(d, inner, h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_queues_working_kernels_together_and_each_waiting_kernel_alone() {
        let work = |ns| Cost {
            ns,
            timing: Timing::Work,
        };
        let wait = |ns| Cost {
            ns,
            timing: Timing::Wait,
        };
        let nodes = [
            Node::Kernel(work(1)),
            Node::MemFree,
            Node::Kernel(work(2)),
            Node::Kernel(wait(10)),
            Node::Kernel(wait(20)),
            Node::Kernel(work(4)),
        ];
        assert_eq!(queued(&nodes), [work(3), wait(10), wait(20), work(4)]);
        assert_eq!(queued(&[Node::MemFree]), [work(0)]);
    }
}
