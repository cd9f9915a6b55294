//! Launching kernels (launch, bench-launch, probe, calibrate-work): the spin or work kernel
//! through every launch route, captured graphs included, the latency of a probe beside other
//! work, and the work kernel's rate alone.

use super::*;

/// `progress` lines every `every` (none when it is zero, the default: a reader that asks for them
/// drains stdout as the run goes): the kernels completed so far and the work they asked for, so
/// that it can take the throughput over any window.
struct Progress {
    every: Duration,
    next: Instant,
    /// Device nanoseconds one kernel asks for.
    kernel_ns: u64,
}

impl Progress {
    fn new(ms: u64, kernel_ns: u64) -> Progress {
        let every = Duration::from_millis(ms);
        Progress {
            every,
            next: Instant::now() + every,
            kernel_ns,
        }
    }

    fn due(&self) -> bool {
        !self.every.is_zero() && Instant::now() >= self.next
    }

    /// One line: `mono_ns` (CLOCK_MONOTONIC), `completed` kernels, `launches` made, `work_ns`
    /// (completed x the device time each asks for).
    fn emit(&mut self, completed: u64, launches: u64) {
        if self.every.is_zero() {
            return;
        }
        emit(
            "progress",
            json!({"mono_ns": monotonic_ns(), "completed": completed, "launches": launches,
                   "work_ns": u64::try_from(u128::from(completed) * u128::from(self.kernel_ns))
                       .unwrap_or(u64::MAX)}),
        );
        let now = Instant::now();
        while self.next <= now {
            self.next += self.every;
        }
    }
}

/// Whether `ev` has completed (cuEventQuery: CUDA_SUCCESS or CUDA_ERROR_NOT_READY).
fn event_done(d: &Driver, ev: CUevent) -> Result<bool, CuError> {
    // SAFETY: a live, recorded event of ours.
    match unsafe { d.cuEventQuery(ev) } {
        Ok(()) => Ok(true),
        Err(e) if !e.missing && e.code == CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        Err(e) => Err(e),
    }
}

/// Waits for `stream` with an event: cuEventRecord, cuEventSynchronize, cuEventDestroy.
pub(super) fn sync_with_event(d: &Driver, stream: CUstream) -> Result<(), CuError> {
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

/// Launches `k` once on `stream` the way `via` says (`exec`: the instantiated graph), shaped
/// as `shape` says.
fn launch_once(
    d: &Driver,
    via: Via,
    k: &Kernel,
    exec: CUgraphExec,
    stream: CUstream,
    shape: Shape,
) -> Result<(), CuError> {
    // The kernel's parameters; the driver copies them before the launch call returns.
    let mut args = k.params(shape);
    let params = args.as_kernel_params();
    let null: *mut *mut c_void = null_mut();
    let grid = shape.grid;
    let f = k.func;
    match via {
        // SAFETY: `f` is a live function whose parameters `params` points to; `stream` is live.
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
    k: &Kernel,
    stream: CUstream,
    shape: Shape,
) -> Result<(CUgraph, CUgraphExec), CuError> {
    // SAFETY: `stream` is a live, non-legacy stream.
    unsafe { d.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) }?;
    let launched = launch_once(d, Via::Kernel, k, null_mut(), stream, shape);
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
    let kernel = Kernel::load(d, s.dev, a.kernel, a.image, a.ns_per_block, a.work_iters)?;
    let shape = kernel.shape(a.ns_per_block, a.blocks);
    let kernel_ns = a.ns_per_block.saturating_mul(u64::from(a.blocks));
    let mut streams = Vec::with_capacity(a.streams as usize);
    for _ in 0..a.streams {
        let mut stream: CUstream = null_mut();
        // SAFETY: out-pointer to a local.
        unsafe { d.cuStreamCreate(&mut stream, CU_STREAM_DEFAULT) }?;
        streams.push(stream);
    }
    let graph = if a.via == Via::Graph {
        Some(capture(d, &kernel, streams[0], shape)?)
    } else {
        None
    };
    let exec = graph.map_or(null_mut(), |(_, exec)| exec);
    let start = create_event(d, CU_EVENT_DEFAULT)?;
    let end = create_event(d, CU_EVENT_DEFAULT)?;
    if a.idle_secs > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(a.idle_secs));
    }

    // SAFETY: live event and stream.
    unsafe { d.cuEventRecord(start, streams[0]) }?;
    let t0 = Instant::now();
    let mut progress = Progress::new(a.progress_ms, kernel_ns);
    let deadline = Duration::from_secs_f64(a.secs);
    let count = a.count.unwrap_or(0);
    // Each launch's tracking event, per stream, oldest first, until it is known complete.
    let mut in_flight: Vec<VecDeque<CUevent>> = vec![VecDeque::new(); streams.len()];
    // Completed tracking events, reused; they block rather than spin in cuEventSynchronize.
    let mut spare: Vec<CUevent> = Vec::new();
    let (mut launches, mut completed): (u64, u64) = (0, 0);
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
        if let Some(k) = a.sync_every {
            // K launched: wait for all of them before the next K.
            if launches > 0 && launches % u64::from(k) == 0 {
                for &stream in &streams {
                    sync(d, stream)?;
                }
                for q in &mut in_flight {
                    completed += q.len() as u64;
                    spare.extend(q.drain(..));
                }
            }
        } else if in_flight[i].len() >= a.depth as usize
            && let Some(oldest) = in_flight[i].pop_front()
        {
            // SAFETY: a recorded event of ours.
            unsafe { d.cuEventSynchronize(oldest) }?;
            spare.push(oldest);
            completed += 1;
        }
        launch_once(d, a.via, &kernel, exec, streams[i], shape)?;
        let ev = match spare.pop() {
            Some(ev) => ev,
            None => create_event(d, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING)?,
        };
        // SAFETY: live event and stream.
        unsafe { d.cuEventRecord(ev, streams[i]) }?;
        in_flight[i].push_back(ev);
        launches += 1;
        if progress.due() {
            // A stream's kernels complete in order: count from the oldest while they are done.
            for q in &mut in_flight {
                while let Some(&ev) = q.front() {
                    if !event_done(d, ev)? {
                        break;
                    }
                    spare.push(ev);
                    q.pop_front();
                    completed += 1;
                }
            }
            progress.emit(completed, launches);
        }
    }
    for &stream in &streams {
        sync(d, stream)?;
    }
    // SAFETY: live event and stream.
    unsafe { d.cuEventRecord(end, streams[0]) }?;
    // SAFETY: recorded just above.
    unsafe { d.cuEventSynchronize(end) }?;
    let wall_ns = t0.elapsed().as_nanos() as u64;
    progress.emit(launches, launches);
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
    let image = kernel.describe();
    kernel.unload(d)?;

    let engine_ns_requested = u128::from(launches) * u128::from(kernel_ns);
    let mut f = json!({
        "via": a.via.name(),
        "launches": launches,
        "blocks": a.blocks,
        "ns_per_block": a.ns_per_block,
        "grid": shape.grid,
        "streams": a.streams,
        "depth": a.depth,
        "sync_every": a.sync_every,
        "work_iters": (a.kernel == KernelArg::Work).then_some(shape.iters),
        "wall_ns": wall_ns,
        "engine_ns_requested": u64::try_from(engine_ns_requested).unwrap_or(u64::MAX),
        "elapsed_ns": (f64::from(ms) * 1e6).round() as u64,
    });
    merge(&mut f, image);
    emit("launched", f);
    Ok(())
}

/// The work kernel's iterations for a kernel of --us microseconds, shaped as `launch
/// --ns-per-block 1000 --blocks US` shapes it: rounds of --kernels kernels back to back, timed
/// with events, each round's iterations scaled by how far the last round's mean was from the
/// target, until a round is within 2% of it (5 rounds at most). One `calibrated` line: `iters`
/// (for the target length), `kernel_ns` and `measured_iters` (the last round's mean length and
/// its iterations), `iters_per_us`, and `kernels_per_sec` and `work_ns_per_sec` (the rate alone:
/// kernels of the last round's length back to back, and the device time they ask for).
pub fn calibrate_work(s: &Session, a: &CalibrateWorkArgs) -> Result<(), Failure> {
    let d = s.d;
    let target = a.us.saturating_mul(1000);
    let blocks = u32::try_from(a.us).unwrap_or(u32::MAX);
    let mut stream: CUstream = null_mut();
    // SAFETY: out-pointer to a local.
    unsafe { d.cuStreamCreate(&mut stream, CU_STREAM_DEFAULT) }?;
    let start = create_event(d, CU_EVENT_DEFAULT)?;
    let end = create_event(d, CU_EVENT_DEFAULT)?;
    let mut iters = crate::kernels::default_work_iters(target);
    let mut kernel = Kernel::load(d, s.dev, KernelArg::Work, a.image, 1000, Some(iters))?;
    let mut rounds = 0;
    let (measured_iters, kernel_ns, grid) = loop {
        kernel.set_work_iters(iters);
        let shape = kernel.shape(1000, blocks);
        // One untimed launch first.
        launch_once(d, Via::Kernel, &kernel, null_mut(), stream, shape)?;
        sync(d, stream)?;
        // SAFETY: live event and stream.
        unsafe { d.cuEventRecord(start, stream) }?;
        for _ in 0..a.kernels {
            launch_once(d, Via::Kernel, &kernel, null_mut(), stream, shape)?;
        }
        // SAFETY: live event and stream.
        unsafe { d.cuEventRecord(end, stream) }?;
        // SAFETY: recorded just above.
        unsafe { d.cuEventSynchronize(end) }?;
        let mut ms: f32 = 0.0;
        // SAFETY: both events recorded and complete; out-pointer to a local.
        unsafe { d.cuEventElapsedTime(&mut ms, start, end) }?;
        rounds += 1;
        let ns = ((f64::from(ms) * 1e6 / f64::from(a.kernels)).round() as u64).max(1);
        let off = (ns as f64 - target as f64).abs() / target as f64;
        if off <= 0.02 || rounds == 5 {
            break (iters, ns, shape.grid);
        }
        iters = ((iters as f64 * target as f64 / ns as f64).round() as u64).max(1);
    };
    for ev in [start, end] {
        // SAFETY: our events, complete, destroyed once.
        unsafe { d.cuEventDestroy_v2(ev) }?;
    }
    // SAFETY: idle stream of ours, destroyed once.
    unsafe { d.cuStreamDestroy_v2(stream) }?;
    let image = kernel.describe();
    kernel.unload(d)?;
    let per_us = measured_iters as f64 * 1000.0 / kernel_ns as f64;
    let kernels_per_sec = 1e9 / kernel_ns as f64;
    let mut f = json!({
        "us": a.us,
        "iters": ((per_us * a.us as f64).round() as u64).max(1),
        "measured_iters": measured_iters,
        "kernel_ns": kernel_ns,
        "iters_per_us": per_us,
        "kernels_per_sec": kernels_per_sec,
        "work_ns_per_sec": kernels_per_sec * target as f64,
        "grid": grid,
        "rounds": rounds,
    });
    merge(&mut f, image);
    emit("calibrated", f);
    Ok(())
}

/// Times batches of launches of a short kernel, pausing (untimed) between batches so that a
/// slice with a core limit stays within its budget: what a launch costs the calling thread, not
/// how long the device takes.
pub fn bench_launch(s: &Session, a: &BenchLaunchArgs) -> Result<(), Failure> {
    let d = s.d;
    let kernel = Kernel::load(d, s.dev, a.kernel, a.image, a.kernel_ns, None)?;
    let shape = kernel.shape(a.kernel_ns, 1);
    let mut stream: CUstream = null_mut();
    // SAFETY: out-pointer to a local.
    unsafe { d.cuStreamCreate(&mut stream, CU_STREAM_DEFAULT) }?;
    let graph = if a.via == Via::Graph {
        Some(capture(d, &kernel, stream, shape)?)
    } else {
        None
    };
    let exec = graph.map_or(null_mut(), |(_, exec)| exec);
    let pause = Duration::from_micros(a.pause_us);
    let batch = || -> Result<u64, CuError> {
        let t0 = Instant::now();
        for _ in 0..a.batch {
            launch_once(d, a.via, &kernel, exec, stream, shape)?;
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
    let image = kernel.describe();
    kernel.unload(d)?;
    let mean = per_launch.iter().sum::<f64>() / per_launch.len() as f64;
    per_launch.sort_by(f64::total_cmp);
    let pick = |q: f64| nearest_rank(&per_launch, q);
    let mut f = json!({
        "via": a.via.name(),
        "batches": a.batches,
        "batch": a.batch,
        "ns_per_launch_p10": pick(0.1),
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
/// launch to the synchronisation's return. With --progress-ms, `progress` lines as `launch`
/// prints them; then one `probed` line: every latency (ns, in order), their p50 / p99 / max, and
/// start_mono_ns / end_mono_ns (CLOCK_MONOTONIC) of the reported probes.
pub fn probe(s: &Session, a: &ProbeArgs) -> Result<(), Failure> {
    let d = s.d;
    let kernel_ns = a.kernel_us * 1000;
    let kernel = Kernel::load(d, s.dev, a.kernel, a.image, kernel_ns, a.work_iters)?;
    let shape = kernel.shape(kernel_ns, 1);
    let mut progress = Progress::new(a.progress_ms, kernel_ns);
    let mut probes: u64 = 0;
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
        launch_once(d, Via::Kernel, &kernel, null_mut(), stream, shape)?;
        sync(d, stream)?;
        let ns = at.elapsed().as_nanos() as u64;
        probes += 1;
        if progress.due() {
            progress.emit(probes, probes);
        }
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
    progress.emit(probes, probes);
    // SAFETY: idle stream of ours, destroyed once.
    unsafe { d.cuStreamDestroy_v2(stream) }?;
    let image = kernel.describe();
    kernel.unload(d)?;
    let mut sorted = latencies.clone();
    sorted.sort_unstable();
    let pick = |q: f64| nearest_rank(&sorted, q).unwrap_or(0);
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
