//! CuPy, as its users use it, on simgpu with NVIDIA's own libcudart inside: cupy-cuda12x with
//! the CUDA 12.9 runtime (`cu12`) and cupy-cuda13x with the CUDA 13.2 wheels (`cu13`), from the
//! environments `tests/frameworks/install` makes. `tests/frameworks/cupy_check.py` does the work
//! and prints what CuPy said; each test judges it against the simulator's own count (`simgpu
//! show`): what the process held at its peak, and the device time its kernels used. Kernels are
//! timed, never run, so no test reads a number the device computed.
//!
//! Without an environment the tests print one skip line and pass, except under `CI`, where they
//! fail naming `tests/frameworks/install`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cuslice_client_tests::{
    Slice, command, device_shares, framework_python_or_skip, mib, process, run_to_end,
};
use cuslice_test_harness::*;
use serde_json::Value;

const CAP: u64 = GIB;
const DEVICE: u64 = 8 * GIB;
/// simgpu's default hidden memory per context.
const CTX: u64 = 300 * MIB;
const VENVS: [&str; 2] = ["cu12", "cu13"];

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../frameworks/cupy_check.py")
}

/// `cupy_check.py args` with `python` on `sim`, inside `slice` (libcuslice.so preloaded) or
/// outside. CuPy's kernel cache is private to the run (in `cache`), so NVRTC compiles each time.
fn cupy_cmd(
    sim: &Sim,
    python: &Path,
    slice: Option<&Slice>,
    cache: &Path,
    args: &[&str],
) -> Command {
    let mut all = vec![script().display().to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let mut c = command(sim, python, slice, &all);
    c.env("CUPY_CACHE_DIR", cache);
    c
}

/// Runs the script to completion; panics (with its stderr) unless it exits 0.
fn run(sim: &Sim, python: &Path, slice: Option<&Slice>, args: &[&str]) -> Vec<Value> {
    let cache = tempfile::tempdir().unwrap();
    run_to_end(
        &mut cupy_cmd(sim, python, slice, cache.path(), args),
        &format!("{} cupy_check.py {args:?}", python.display()),
    )
}

// ---- memory --------------------------------------------------------------------------------

/// `cudaMemGetInfo` reports the cap in a slice and the device outside one; the runtime is the
/// CUDA version of the wheels.
#[test]
fn cupy_mem_get_info_reports_the_cap_in_a_slice_and_the_device_outside() {
    for venv in VENVS {
        let Some(python) = framework_python_or_skip(venv, "cupy") else {
            continue;
        };
        let _turn = serial();
        let sim = Sim::new(&["--memory", "8GiB"]);
        let slice = Slice::capped();
        for (s, limit) in [(None, DEVICE), (Some(&slice), CAP)] {
            let lines = run(&sim, &python, s, &["info"]);
            let i = event(&lines, "info");
            let place = if s.is_some() { "in a slice" } else { "bare" };
            let want_runtime = if venv == "cu12" { 12090 } else { 13020 };
            assert_eq!(u(&i["runtime"]), want_runtime, "{venv} {place}: {i}");
            assert_eq!(u(&i["devices"]), 1, "{venv} {place}: {i}");
            assert_eq!(u(&i["total"]), limit, "{venv} {place}: total: {i}");
            assert_eq!(u(&i["free"]), limit - CTX, "{venv} {place}: free: {i}");
        }
    }
}

/// Fills through `pool` (`default`: CuPy's memory pool over cudaMalloc; `async`:
/// `cupy.cuda.MemoryAsyncPool` over cudaMallocAsync; `managed`: a pool over cudaMallocManaged)
/// in `chunk_mib` arrays on an 8 GiB device;
/// checks the error CuPy raised, what the process held by the simulator's count, and that the
/// freed memory can be had again.
fn fill(venv: &str, pool: &str, slice: Option<&Slice>, chunk_mib: u64) {
    let Some(python) = framework_python_or_skip(venv, "cupy") else {
        return;
    };
    // One CuPy process at a time in this file (start-up and NVRTC take both CPUs of a small
    // machine), so the shares the compute tests measure are not skewed.
    let _turn = serial();
    let what = format!(
        "{venv} {pool} pool {}",
        if slice.is_some() {
            "in a slice"
        } else {
            "bare"
        }
    );
    let sim = Sim::new(&["--memory", "8GiB"]);
    let chunk = chunk_mib * MIB;
    let lines = run(
        &sim,
        &python,
        slice,
        &["fill", pool, &chunk_mib.to_string()],
    );
    let start = event(&lines, "start");
    let refused = event(&lines, "refused");
    let freed = event(&lines, "freed");
    let again = event(&lines, "again");
    let limit = if slice.is_some() { CAP } else { DEVICE };
    assert_eq!(
        u(&start["total"]),
        limit,
        "{what}: total CuPy read: {start}"
    );
    assert_eq!(
        refused["error"], "cupy.cuda.memory.OutOfMemoryError",
        "{what}: {refused}"
    );
    // Ground truth: the process never held more than the limit, and it was refused with less
    // than a chunk of the limit unused.
    let peak = u(&process(&sim, u(&start["pid"]))["peak"]);
    let device_peak = u(&sim.device(0)["peak_used"]);
    eprintln!(
        "{what}: {} chunks of {chunk_mib} MiB, then OutOfMemoryError; simgpu's peak {} MiB of {} MiB",
        u(&refused["chunks"]),
        mib(peak),
        mib(limit)
    );
    assert!(
        peak <= limit && device_peak <= limit,
        "{what}: simgpu held {} MiB (device {} MiB) under a {} MiB limit",
        mib(peak),
        mib(device_peak),
        mib(limit)
    );
    // Managed memory is backed in 128 MiB steps (as an H100 backs it): less than a step unused.
    let unit = if pool == "managed" {
        chunk.max(128 * MIB)
    } else {
        chunk
    };
    assert!(
        limit - peak < unit,
        "{what}: refused with {} MiB of {} MiB unused (chunk {chunk_mib} MiB)",
        mib(limit - peak),
        mib(limit)
    );
    assert_eq!(
        u(&refused["allocated"]) + CTX,
        peak,
        "{what}: what CuPy got (and its context) is what the device held"
    );
    // What cudaMemGetInfo said when CuPy gave up: the limit less what the device held.
    assert_eq!(
        u(&refused["free"]),
        limit - u(&refused["allocated"]) - CTX,
        "{what}: free CuPy read at the refusal ({} MiB)",
        mib(u(&refused["free"]))
    );
    // Freed (and the pool's blocks given back): as free as at the start, and as much again.
    assert_eq!(
        u(&freed["free"]),
        u(&start["free"]),
        "{what}: free after freeing everything ({} MiB, started with {} MiB)",
        mib(u(&freed["free"])),
        mib(u(&start["free"]))
    );
    assert_eq!(again["error"], Value::Null, "{what}: {again}");
    assert_eq!(again["chunks"], refused["chunks"], "{what}: {again}");
    assert_eq!(u(&sim.device(0)["used"]), 0, "{what}: memory left behind");
}

#[test]
fn cupy_default_pool_raises_out_of_memory_at_the_cap() {
    for venv in VENVS {
        fill(venv, "default", Some(&Slice::capped()), 64);
    }
}

#[test]
fn cupy_async_pool_raises_out_of_memory_at_the_cap() {
    for venv in VENVS {
        fill(venv, "async", Some(&Slice::capped()), 64);
    }
}

/// A memory pool over `cudaMallocManaged` (`cupy.cuda.malloc_managed`).
#[test]
fn cupy_managed_memory_pool_raises_out_of_memory_at_the_cap() {
    for venv in VENVS {
        fill(venv, "managed", Some(&Slice::capped()), 64);
    }
}

#[test]
fn cupy_pools_raise_out_of_memory_at_the_device_size_without_cuslice() {
    for venv in VENVS {
        for pool in ["default", "async", "managed"] {
            fill(venv, pool, None, 512);
        }
    }
}

// ---- everyday operations -------------------------------------------------------------------

/// Operations beyond elementwise kernels, through NVIDIA's runtime and CUB: each ran without an
/// error, pointer attributes name the memory as the driver does, in a slice and outside one, and the device as CuPy sees it is simgpu's (under a cap,
/// with the cap as its memory).
#[test]
fn cupy_sorts_queries_and_graphs_work_in_a_slice_and_outside() {
    for venv in VENVS {
        let Some(python) = framework_python_or_skip(venv, "cupy") else {
            continue;
        };
        let _turn = serial();
        let sim = Sim::new(&["--memory", "8GiB"]);
        let slice = Slice::capped();
        for (s, limit) in [(None, DEVICE), (Some(&slice), CAP)] {
            let place = if s.is_some() { "in a slice" } else { "bare" };
            let lines = run(&sim, &python, s, &["ops"]);
            let o = event(&lines, "ops");
            let failed: Vec<_> = o["results"]
                .as_object()
                .unwrap()
                .iter()
                .filter(|(_, r)| *r != "ok")
                .collect();
            assert!(failed.is_empty(), "{venv} {place}: {failed:?}");
            assert_eq!(u(&o["total_global_mem"]), limit, "{venv} {place}: {o}");
            assert_eq!(u(&o["multiprocessors"]), 132, "{venv} {place}: {o}");
            // The driver's form: a 4-digit domain, 12 characters.
            assert_eq!(o["pci_bus_id"], "0000:18:00.0", "{venv} {place}: {o}");
            assert_eq!(u(&o["stack_limit"]), 1024, "{venv} {place}: {o}");
            assert_eq!(u(&o["can_access_peer"]), 0, "{venv} {place}: {o}");
            // cudaPointerGetAttributes: (cudaMemoryType, device) of device, page-locked host,
            // managed and ordinary host memory.
            let p = &o["pointers"];
            assert_eq!(
                p["device"],
                serde_json::json!([2, 0]),
                "{venv} {place}: {p}"
            );
            assert_eq!(
                p["pinned"],
                serde_json::json!([1, 0]),
                "{venv} {place}: {p}"
            );
            assert_eq!(
                p["managed"],
                serde_json::json!([3, 0]),
                "{venv} {place}: {p}"
            );
            assert_eq!(p["host"], serde_json::json!([0, -2]), "{venv} {place}: {p}");
            assert_eq!(p["unowned_device"], 0, "{venv} {place}: {p}");
        }
    }
}

// ---- compute -------------------------------------------------------------------------------

/// Two slices at core limits 30 and 70, each a CuPy process launching an NVRTC-compiled
/// elementwise kernel (1024 blocks of 1 us: about 1 ms) back to back; the simulator's device
/// time gives each its share, within 3 points or in proportion (`held_to_shares`); a run that
/// misses is run once more (`twice`), as `torch.rs`'s pair is.
fn shares_30_70(venv: &str) {
    let Some(python) = framework_python_or_skip(venv, "cupy") else {
        return;
    };
    let _turn = serial();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let node = tempfile::tempdir().unwrap();
    let node_dir = node.path().display().to_string();
    let (settle, window) = (Duration::from_secs(3), Duration::from_secs(4));
    // Start-up (import, NVRTC) is not timed: each process says "start" once its kernel is built.
    let secs = ((settle + window).as_secs_f64() + 2.0).to_string();
    let limits = ["30", "70"];
    let slices: Vec<Slice> = limits
        .iter()
        .map(|l| Slice::new(&[("CUSLICE_CORE_LIMIT", l), ("CUSLICE_NODE_DIR", &node_dir)]))
        .collect();
    let mut procs: Vec<Running> = slices
        .iter()
        .map(|s| {
            let mut c = cupy_cmd(
                &sim,
                &python,
                Some(s),
                &s.dir.path().join("cupy-cache"),
                &["kernels", &secs, "131072"],
            );
            c.stdin(Stdio::null());
            Running::start(c)
        })
        .collect();
    let pids: Vec<u64> = procs
        .iter_mut()
        .map(|r| u(&r.wait_for("start", Duration::from_secs(120))["pid"]))
        .collect();
    std::thread::sleep(settle);
    let shares = device_shares(&sim, &pids, window);
    eprintln!("{venv}: limits 30 and 70 achieved {shares:.2?} of the device");
    for mut r in procs {
        let launched = r.wait_for("launched", Duration::from_secs(60));
        assert!(u(&launched["kernels"]) > 0, "{launched}");
        assert_eq!(r.child.wait().unwrap().code(), Some(0));
    }
    assert!(
        held_to_shares(&shares, &[30.0, 70.0], 3.0),
        "{venv}: slices limited to 30 and 70 had {shares:.1?}% of the device by the simulator's count"
    );
}

#[test]
fn cupy_kernels_in_slices_at_30_and_70_share_the_device_cu12() {
    twice(|| shares_30_70("cu12"));
}

#[test]
fn cupy_kernels_in_slices_at_30_and_70_share_the_device_cu13() {
    twice(|| shares_30_70("cu13"));
}
