//! Scenarios on many threads (churn, bench-alloc), and what lets their threads start each phase
//! together.

use super::*;

/// Lets threads start a phase together. Every thread arrives once, or the run is failed (a thread
/// that cannot arrive), so no thread waits forever.
pub(super) struct StartLine {
    /// (arrived, failed)
    state: Mutex<(u32, bool)>,
    changed: Condvar,
    threads: u32,
}

impl StartLine {
    pub(super) fn new(threads: u32) -> StartLine {
        StartLine {
            state: Mutex::new((0, false)),
            changed: Condvar::new(),
            threads,
        }
    }

    /// Waits until every thread has arrived (true) or one has failed (false).
    pub(super) fn arrive(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 += 1;
        self.changed.notify_all();
        while state.0 < self.threads && !state.1 {
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        !state.1
    }

    pub(super) fn fail(&self) {
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
pub(super) fn churn_size(rng: &mut Rng, min: u64, max: u64) -> u64 {
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

/// Pairs timed together: each batch's ns a pair is kept, so that a run can say what a pair
/// costs when nothing else on the host gets in the way (a low percentile of its batches).
const BENCH_BATCH: u64 = 1000;

/// One thread's timed phase: (start, end) on the monotonic clock, in ns, and the ns a pair of
/// each whole batch of `BENCH_BATCH` pairs.
fn bench_thread(
    d: &Driver,
    a: &BenchAllocArgs,
    start: &StartLine,
) -> Result<(u64, u64, Vec<f64>), CuError> {
    let size = a.size as usize;
    alloc_free_pairs(d, size, BENCH_WARMUP)?;
    if !start.arrive() {
        return Ok((0, 0, Vec::new()));
    }
    let mut batches = Vec::with_capacity((a.iters / BENCH_BATCH) as usize);
    let t0 = Instant::now();
    let t0_ns = monotonic_ns();
    let mut left = a.iters;
    while left > 0 {
        let n = left.min(BENCH_BATCH);
        let b0 = Instant::now();
        alloc_free_pairs(d, size, n)?;
        if n == BENCH_BATCH {
            batches.push(b0.elapsed().as_nanos() as f64 / n as f64);
        }
        left -= n;
    }
    let ns = t0.elapsed().as_nanos() as u64;
    Ok((t0_ns, t0_ns + ns.max(1), batches))
}

pub fn bench_alloc(s: &Session, a: &BenchAllocArgs) -> Result<(), Failure> {
    let results = on_threads(s, a.threads, |_, start| bench_thread(s.d, a, start));
    let mut spans = Vec::new();
    let mut batches = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok((t0, t1, b)) => {
                spans.push((t0, t1));
                batches.extend(b);
            }
            Err(e) => errors.push(e),
        }
    }
    report_errors(&errors)?;
    batches.sort_by(f64::total_cmp);
    let pick = |q: f64| nearest_rank(&batches, q);
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
            "batch": BENCH_BATCH,
            "ns_per_pair_p10": pick(0.1),
            "ns_per_pair_median": pick(0.5),
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
