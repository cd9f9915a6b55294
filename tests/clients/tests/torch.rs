//! PyTorch, as its users use it, on simgpu with NVIDIA's own libcudart inside: torch 2.15.0 (pip's
//! default CUDA 13.2 build) from the `cu13` environment `tests/frameworks/install` makes.
//! `tests/frameworks/torch_check.py` does the work and prints what PyTorch said; each test judges
//! it against the simulator's own count (`simgpu show`): what the process held, its peak, and the
//! device time its kernels used. Kernels (libtorch's own, from its fatbins) are timed, never run,
//! so no test reads a number the device computed.
//!
//! Without the environment the tests print one skip line and pass, except under `CI`, where they
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
/// PyTorch's three allocators: the caching allocator over cudaMalloc, the same over
/// cuMemCreate/cuMemMap, and the runtime's pool (cudaMallocAsync).
const ALLOCATORS: [(&str, &str); 3] = [
    ("native", ""),
    ("expandable", "expandable_segments:True"),
    ("cudaMallocAsync", "backend:cudaMallocAsync"),
];

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../frameworks/torch_check.py")
}

fn python() -> Option<PathBuf> {
    framework_python_or_skip("cu13", "torch")
}

/// `torch_check.py args` with `python` on `sim`, inside `slice` (libcuslice.so preloaded) or
/// outside, with `PYTORCH_CUDA_ALLOC_CONF=alloc_conf` (unset when empty).
fn torch_cmd(
    sim: &Sim,
    python: &Path,
    slice: Option<&Slice>,
    alloc_conf: &str,
    args: &[&str],
) -> Command {
    let mut all = vec![script().display().to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let mut c = command(sim, python, slice, &all);
    c.env_remove("PYTORCH_CUDA_ALLOC_CONF");
    if !alloc_conf.is_empty() {
        c.env("PYTORCH_CUDA_ALLOC_CONF", alloc_conf);
    }
    c
}

/// Runs the script to completion; panics (with its stderr) unless it exits 0.
fn run(
    sim: &Sim,
    python: &Path,
    slice: Option<&Slice>,
    alloc_conf: &str,
    args: &[&str],
) -> Vec<Value> {
    run_to_end(
        &mut torch_cmd(sim, python, slice, alloc_conf, args),
        &format!("torch_check.py {args:?} (PYTORCH_CUDA_ALLOC_CONF={alloc_conf:?})"),
    )
}

// ---- the device as PyTorch sees it ---------------------------------------------------------

/// `torch.cuda.is_available()`, `get_device_properties(0)` and `mem_get_info()`: the simulated
/// device outside a slice, the cap inside one.
#[test]
fn torch_sees_the_simulated_device_and_in_a_slice_the_cap() {
    let Some(python) = python() else { return };
    let sim = Sim::new(&["--memory", "8GiB", "--sm-count", "114"]);
    let dev = sim.device(0);
    let slice = Slice::capped();
    for (s, limit) in [(None, DEVICE), (Some(&slice), CAP)] {
        let place = if s.is_some() { "in a slice" } else { "bare" };
        let lines = run(&sim, &python, s, "", &["info"]);
        let i = event(&lines, "info");
        assert_eq!(i["available"], true, "{place}: {i}");
        assert_eq!(u(&i["count"]), 1, "{place}: {i}");
        assert_eq!(i["name"], dev["name"], "{place}: {i}");
        assert_eq!(u(&i["sm_count"]), u(&dev["sm_count"]), "{place}: {i}");
        assert_eq!((u(&i["major"]), u(&i["minor"])), (9, 0), "{place}: {i}");
        assert_eq!(u(&i["total_memory"]), limit, "{place}: total_memory: {i}");
        assert_eq!(u(&i["total"]), limit, "{place}: mem_get_info total: {i}");
        assert_eq!(
            u(&i["free"]),
            limit - CTX,
            "{place}: mem_get_info free (the context took {} MiB): {i}",
            mib(CTX)
        );
    }
}

// ---- memory under a cap --------------------------------------------------------------------

/// Each allocator fills a capped slice with 64 MiB tensors until PyTorch raises
/// `torch.cuda.OutOfMemoryError`: the message names the capped total, the refusal comes with
/// less than a tensor of the cap unused, the process never held more than the cap by the
/// simulator's count, and everything goes back.
#[test]
fn each_allocator_raises_out_of_memory_at_the_cap() {
    let Some(python) = python() else { return };
    let chunk = 64 * MIB;
    for (name, conf) in ALLOCATORS {
        let sim = Sim::new(&["--memory", "8GiB"]);
        let slice = Slice::capped();
        let lines = run(&sim, &python, Some(&slice), conf, &["fill", "64"]);
        let start = event(&lines, "start");
        let refused = event(&lines, "refused");
        let freed = event(&lines, "freed");
        assert_eq!(
            start["backend"],
            if name == "cudaMallocAsync" {
                name
            } else {
                "native"
            }
        );
        assert_eq!(u(&start["total"]), CAP, "{name}: {start}");
        assert_eq!(u(&start["free"]), CAP - CTX, "{name}: {start}");
        let message = refused["message"].as_str().unwrap();
        // The caching allocator says "GPU 0 has a total capacity of 1024.00 MiB"; the
        // cudaMallocAsync one "Device limit : 1024.00 MiB".
        assert!(
            message.contains("1024.00 MiB"),
            "{name}: the OutOfMemoryError does not name the 1024 MiB cap: {message}"
        );
        let got = u(&refused["allocated"]);
        assert!(
            got + chunk > CAP - CTX,
            "{name}: refused with {} MiB of tensors, {} MiB of the cap free after the context",
            mib(got),
            mib(CAP - CTX)
        );
        let pid = u(&refused["pid"]);
        let p = process(&sim, pid);
        let peak = u(&p["peak"]);
        assert!(
            peak <= CAP,
            "{name}: the process held {} MiB under a {} MiB cap",
            mib(peak),
            mib(CAP)
        );
        assert!(
            peak >= CTX + got,
            "{name}: the simulator saw a peak of {} MiB for {} MiB of tensors",
            mib(peak),
            mib(got)
        );
        assert_eq!(
            u(&freed["free"]),
            u(&start["free"]),
            "{name}: free after empty_cache: {freed}"
        );
        assert_eq!(u(&freed["reserved"]), 0, "{name}: {freed}");
    }
}

/// Outside a slice the caching allocator fills the whole simulated device, to the same error.
#[test]
fn the_caching_allocator_fills_the_bare_device() {
    let Some(python) = python() else { return };
    let chunk = 512 * MIB;
    let sim = Sim::new(&["--memory", "8GiB"]);
    let lines = run(&sim, &python, None, "", &["fill", "512"]);
    let refused = event(&lines, "refused");
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("total capacity of 8.00 GiB"),
        "the OutOfMemoryError does not name the 8 GiB device: {message}"
    );
    let got = u(&refused["allocated"]);
    assert!(
        got + chunk > DEVICE - CTX,
        "refused with {} MiB of tensors",
        mib(got)
    );
    let peak = u(&process(&sim, u(&refused["pid"]))["peak"]);
    assert!(
        peak <= DEVICE && peak >= CTX + got,
        "peak {} MiB",
        mib(peak)
    );
}

/// `torch.cuda.memory_stats()`'s reserved bytes are what the simulator counts for the process
/// beyond its context, for each allocator.
#[test]
fn memory_stats_reserved_is_what_the_simulator_counts() {
    let Some(python) = python() else { return };
    for (name, conf) in ALLOCATORS {
        let sim = Sim::new(&["--memory", "8GiB"]);
        let slice = Slice::capped();
        let mut r = Running::start(torch_cmd(
            &sim,
            &python,
            Some(&slice),
            conf,
            &["hold", "100"],
        ));
        let h = r.wait_for("holding", Duration::from_secs(120));
        let p = process(&sim, u(&h["pid"]));
        let by_kind = p["by_kind"].as_object().unwrap();
        let hidden: u64 = ["context", "module"]
            .iter()
            .filter_map(|k| by_kind.get(*k))
            .map(u)
            .sum();
        let reserved = u(&h["reserved"]);
        assert!(reserved >= 100 * MIB, "{name}: {h}");
        assert_eq!(
            u(&p["held"]) - hidden,
            reserved,
            "{name}: the simulator's count beside the context ({p}) vs memory_stats ({h})"
        );
        assert_eq!(
            u(&h["free"]),
            CAP - u(&p["held"]),
            "{name}: mem_get_info free vs the simulator's count: {h} {p}"
        );
        assert_eq!(r.release(), 0);
    }
}

/// Two processes of one slice share its 1 GiB: the second, filling with 64 MiB tensors, is
/// refused at the cap less what the first holds, and the slice never held more than the cap.
#[test]
fn two_processes_in_one_slice_share_the_cap() {
    let Some(python) = python() else { return };
    let chunk = 64 * MIB;
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::capped();
    let mut a = Running::start(torch_cmd(&sim, &python, Some(&slice), "", &["hold", "200"]));
    let h = a.wait_for("holding", Duration::from_secs(120));
    let a_held = u(&process(&sim, u(&h["pid"]))["held"]);
    assert_eq!(
        a_held,
        CTX + 200 * MIB,
        "the first process by the simulator's count"
    );
    let lines = run(&sim, &python, Some(&slice), "", &["fill", "64"]);
    let start = event(&lines, "start");
    assert_eq!(
        u(&start["free"]),
        CAP - a_held - CTX,
        "the second process's mem_get_info beside the first: {start}"
    );
    let refused = event(&lines, "refused");
    let got = u(&refused["allocated"]);
    let room = CAP - a_held - CTX;
    assert!(
        got <= room && got + chunk > room,
        "the second process got {} MiB of tensors; the cap left {} MiB",
        mib(got),
        mib(room)
    );
    let peak = u(&sim.device(0)["peak_used"]);
    assert!(peak <= CAP, "the slice held {} MiB", mib(peak));
    assert_eq!(a.release(), 0);
}

// ---- compute -------------------------------------------------------------------------------

/// Two slices at core limits 30 and 70, each a PyTorch process launching libtorch's elementwise
/// kernel (`x.add_(1)`) back to back; the simulator's device time gives each its share, within 3
/// points or in proportion (`held_to_shares`: one full run on a busy host got 28.1/65.7%, 30.0/70.0%
/// of what the two got together). A run that misses is run once more (`twice`).
#[test]
fn torch_kernels_in_slices_at_30_and_70_share_the_device() {
    let _turn = serial();
    twice(torch_kernels_in_slices_at_30_and_70_once);
}

fn torch_kernels_in_slices_at_30_and_70_once() {
    let Some(python) = python() else { return };
    let sim = Sim::new(&["--memory", "8GiB"]);
    let node = tempfile::tempdir().unwrap();
    let node_dir = node.path().display().to_string();
    let (settle, window) = (Duration::from_secs(3), Duration::from_secs(4));
    let secs = ((settle + window).as_secs_f64() + 2.0).to_string();
    let slices: Vec<Slice> = ["30", "70"]
        .iter()
        .map(|l| Slice::new(&[("CUSLICE_CORE_LIMIT", l), ("CUSLICE_NODE_DIR", &node_dir)]))
        .collect();
    let mut procs: Vec<Running> = slices
        .iter()
        .map(|s| {
            let mut c = torch_cmd(&sim, &python, Some(s), "", &["spin", &secs]);
            c.stdin(Stdio::null());
            Running::start(c)
        })
        .collect();
    let pids: Vec<u64> = procs
        .iter_mut()
        .map(|r| u(&r.wait_for("ready", Duration::from_secs(120))["pid"]))
        .collect();
    std::thread::sleep(settle);
    let shares = device_shares(&sim, &pids, window);
    eprintln!("limits 30 and 70 achieved {shares:.2?} of the device");
    for mut r in procs {
        let spun = r.wait_for("spun", Duration::from_secs(60));
        assert!(u(&spun["launches"]) > 0, "{spun}");
        assert_eq!(r.child.wait().unwrap().code(), Some(0));
    }
    assert!(
        held_to_shares(&shares, &[30.0, 70.0], 3.0),
        "slices limited to 30 and 70 had {shares:.1?}% of the device by the simulator's count"
    );
}

/// `torch.cuda.CUDAGraph`: capture nine elementwise kernels, one writing a tensor allocated
/// during the capture, and replay the graph; each replay costs the device the same time, by the
/// simulator's count, in a capped slice.
#[test]
fn a_cuda_graph_replays_on_the_device_in_a_slice() {
    let Some(python) = python() else { return };
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::capped();
    let time = |replays: u64| {
        let lines = run(
            &sim,
            &python,
            Some(&slice),
            "",
            &["graph", &replays.to_string()],
        );
        let r = event(&lines, "replayed");
        assert_eq!(u(&r["replays"]), replays, "{r}");
        u(&process(&sim, u(&r["pid"]))["device_time_ns"])
    };
    let (t0, t1, t20) = (time(0), time(1), time(20));
    let one = t1.saturating_sub(t0);
    assert!(
        one > 0,
        "a replay took no device time ({t0} ns without, {t1} ns with one)"
    );
    let per = (t20 - t0) as f64 / 20.0;
    assert!(
        (per - one as f64).abs() <= 0.05 * one as f64,
        "one replay took {one} ns, twenty {} ns ({per:.0} ns each)",
        t20 - t0
    );
}

// ---- sizing a cache from what is free, on several devices ------------------------------------

/// vLLM's `gpu_memory_utilization`, on fractions of two devices: a process that, on each device,
/// loads weights, captures a CUDA graph and then sizes a cache as 0.9 of the memory
/// `torch.cuda.mem_get_info` reports free. Each device is capped at half (4 of 8 GiB). By the
/// simulator's count the process holds on each device exactly what CUDA says it uses, within the
/// cap, with the cache at 0.9 of what was free (within 2 MiB); and NVML (nvidia-ml-py) agrees
/// with CUDA on the total, the device's use and the process's own, before the capture, after it
/// and after the cache. Without cuslice the same process holds more than the half on each.
#[test]
fn a_cache_sized_from_free_memory_fills_its_share_of_each_capped_device() {
    let Some(python) = python() else { return };
    let cap = 4 * GIB;
    let sim = Sim::new(&["--devices", "2", "--memory", "8GiB"]);
    let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "4GiB")]);
    let mut r = Running::start(torch_cmd(
        &sim,
        &python,
        Some(&slice),
        "",
        &["size-cache", "0.9"],
    ));
    let sized = r.wait_for("sized", Duration::from_secs(180));
    let pid = &sized["pid"];
    let devices = sized["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{sized}");
    for d in devices {
        let dev = u(&d["device"]) as usize;
        for stage in ["before_capture", "after_capture", "after_cache"] {
            let f = &d[stage];
            assert_eq!(u(&f["cuda_total"]), cap, "device {dev} {stage}: {f}");
            assert_eq!(
                f["nvml_total"], f["cuda_total"],
                "device {dev} {stage}: {f}"
            );
            assert_eq!(f["nvml_used"], f["cuda_used"], "device {dev} {stage}: {f}");
            assert_eq!(
                f["nvml_process_used"], f["cuda_used"],
                "device {dev} {stage}: {f}"
            );
        }
        let free = u(&d["after_capture"]["cuda_free"]);
        let cache = u(&d["cache"]);
        assert!(
            (cache as f64 - 0.9 * free as f64).abs() <= (2 * MIB) as f64,
            "device {dev}: a cache of {:.0} MiB for {:.0} MiB free",
            mib(cache),
            mib(free)
        );
        let held = sim.device(dev)["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == *pid)
            .map(|p| u(&p["held"]))
            .unwrap_or_else(|| panic!("pid {pid} holds nothing on device {dev}"));
        assert_eq!(
            held,
            u(&d["after_cache"]["cuda_used"]),
            "device {dev}: the simulator's count against CUDA's: {d}"
        );
        assert!(
            held <= cap && held >= u(&d["after_capture"]["cuda_used"]) + cache,
            "device {dev}: holds {:.0} MiB under a cap of {:.0} MiB: {d}",
            mib(held),
            mib(cap)
        );
    }
    let err = r.err.text();
    assert_eq!(r.release(), 0, "{err}");
    // Without cuslice the same process sizes its cache from the whole device: past the half.
    let bare_sim = Sim::new(&["--devices", "2", "--memory", "8GiB"]);
    let mut bare = Running::start(torch_cmd(
        &bare_sim,
        &python,
        None,
        "",
        &["size-cache", "0.9"],
    ));
    let sized = bare.wait_for("sized", Duration::from_secs(180));
    for d in sized["devices"].as_array().unwrap() {
        let dev = u(&d["device"]) as usize;
        assert_eq!(u(&d["after_cache"]["cuda_total"]), 8 * GIB, "{d}");
        let held = bare_sim.device(dev)["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == sized["pid"])
            .map_or(0, |p| u(&p["held"]));
        assert!(
            held > cap,
            "device {dev}: without cuslice it holds {held}: {d}"
        );
    }
    let err = bare.err.text();
    assert_eq!(bare.release(), 0, "{err}");
}
