//! Clients nobody here wrote, used as their users use them: `tests/clients/cuda_client.py` calls
//! the driver through NVIDIA's `cuda-bindings` (`cuda.bindings.driver`) and NVML through
//! `nvidia-ml-py` (`pynvml`), both pinned in tests/tools/requirements.txt. Each test runs it on
//! simgpu, with and without libcuslice.so preloaded, and checks what it printed against the
//! simulator's ground truth (`simgpu show`).
//!
//! Without python3 or those packages the tests print one skip line and pass, except under `CI`,
//! where they fail (tests/tools/ensure-tools installs them).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cuslice_client_tests::{Slice, command, mib, run_to_end};
use cuslice_test_harness::*;
use serde_json::Value;

const CAP: u64 = GIB;
/// simgpu's default hidden memory per context.
const CTX: u64 = 300 * MIB;

fn client() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda_client.py")
}

fn spin_ptx() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../workload/src/spin.ptx")
}

/// Whether python3 with both bindings is here; outside CI a missing one skips (one line).
fn have_python() -> bool {
    static HAVE: OnceLock<Result<(), String>> = OnceLock::new();
    let r = HAVE.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import cuda.bindings.driver, pynvml"])
            .output()
            .map_err(|e| format!("no python3 ({e})"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "python3 lacks cuda-bindings or nvidia-ml-py: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ))
        }
    });
    match r {
        Ok(()) => true,
        Err(why) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "{why}; tests/tools/ensure-tools installs tests/tools/requirements.txt"
            );
            eprintln!(
                "skipped: {why}; tests/tools/ensure-tools installs tests/tools/requirements.txt"
            );
            false
        }
    }
}

/// `cuda_client.py args` on `sim`, inside `slice` (libcuslice.so preloaded) or outside.
fn client_cmd(sim: &Sim, slice: Option<&Slice>, args: &[&str]) -> Command {
    let mut all = vec![client().display().to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    command(sim, Path::new("python3"), slice, &all)
}

/// Runs the client to completion; panics (with its stderr) unless it exits 0.
fn run(sim: &Sim, slice: Option<&Slice>, args: &[&str]) -> Vec<Value> {
    run_to_end(
        &mut client_cmd(sim, slice, args),
        &format!("cuda_client.py {args:?}"),
    )
}

/// Starts a client that holds what it made until its stdin closes; waits for "holding".
fn hold(sim: &Sim, slice: Option<&Slice>, args: &[&str]) -> (Running, Value) {
    let mut r = Running::start(client_cmd(sim, slice, args));
    let v = r.wait_for("holding", Duration::from_secs(60));
    (r, v)
}

fn process(dev: &Value, pid: u64) -> &Value {
    dev["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not on the device: {dev}"))
}

fn held(sim: &Sim, pid: u64) -> u64 {
    u(&process(&sim.device(0), pid)["held"])
}

// ---- memory families through the official bindings ---------------------------------------

/// Fills an 8 GiB device with `chunk_mib` chunks of `family`; checks the refusal, the figures the
/// client read, and that everything went back, against the simulator.
fn fill(family: &str, slice: Option<&Slice>, chunk_mib: u64) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let chunk = chunk_mib * MIB;
    let lines = run(&sim, slice, &["fill", family, &chunk_mib.to_string()]);
    let start = event(&lines, "start");
    let refused = event(&lines, "refused");
    let freed = event(&lines, "freed");
    let limit = if slice.is_some() { CAP } else { 8 * GIB };
    assert_eq!(u(&start["total"]), limit, "{family}: total the client read");
    assert_eq!(
        u(&start["free"]),
        limit - CTX,
        "{family}: free at start (the context took {} MiB)",
        mib(CTX)
    );
    assert_eq!(
        refused["code"], 2,
        "{family}: refused with CUDA_ERROR_OUT_OF_MEMORY"
    );
    // Ground truth: the device never held more than the limit, and the refusal came with less
    // than a chunk of it unused.
    let peak = u(&sim.device(0)["peak_used"]);
    assert!(
        peak <= limit,
        "{family}: the device held {} MiB under a {} MiB limit",
        mib(peak),
        mib(limit)
    );
    // Managed memory is backed in 128 MiB steps (as an H100 backs it): less than a step unused.
    let unit = if family == "managed" {
        chunk.max(128 * MIB)
    } else {
        chunk
    };
    assert!(
        limit - peak < unit,
        "{family}: refused with {} MiB of {} MiB unused (chunk {chunk_mib} MiB)",
        mib(limit - peak),
        mib(limit)
    );
    assert_eq!(
        u(&refused["allocated"]) + CTX,
        peak,
        "{family}: what the client got is what the device held"
    );
    // Everything freed (cuMemFreeAsync and a synchronise for the async family) is free again,
    // for the client as for the device.
    assert_eq!(
        u(&freed["free"]),
        u(&start["free"]),
        "{family}: free after freeing everything ({} MiB, started with {} MiB)",
        mib(u(&freed["free"])),
        mib(u(&start["free"]))
    );
    assert_eq!(u(&sim.device(0)["used"]), 0, "{family}: memory left behind");
}

#[test]
fn memory_families_through_the_bindings_on_the_bare_device() {
    if !have_python() {
        return;
    }
    for family in ["mem", "async", "vmm", "managed"] {
        fill(family, None, 512);
    }
}

#[test]
fn cumemalloc_through_the_bindings_is_held_to_a_cap() {
    if have_python() {
        fill("mem", Some(&Slice::capped()), 64);
    }
}

/// Needs the pool accounting: memory given back by cuMemFreeAsync and a
/// synchronise must leave the slice's charge.
#[test]
fn cumemallocasync_with_frees_through_the_bindings_is_held_to_a_cap() {
    if have_python() {
        fill("async", Some(&Slice::capped()), 64);
    }
}

#[test]
fn cumemcreate_and_cumemmap_through_the_bindings_are_held_to_a_cap() {
    if have_python() {
        fill("vmm", Some(&Slice::capped()), 64);
    }
}

#[test]
fn managed_memory_through_the_bindings_is_held_to_a_cap() {
    if have_python() {
        fill("managed", Some(&Slice::capped()), 64);
    }
}

/// One process of a slice frees 320 MiB with cuMemFreeAsync and synchronises; the driver gives
/// the pool's memory back, so the slice's other process can use it.
#[test]
fn an_async_free_leaves_the_memory_to_the_slice_s_other_process() {
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::capped();
    let (a, h) = hold(&sim, Some(&slice), &["async-free", "320"]);
    let a_pid = u(&h["pid"]);
    // The driver holds nothing for A's pool any more: only its context.
    assert_eq!(
        held(&sim, a_pid),
        CTX,
        "simgpu: what A holds after its free"
    );
    let chunk = 32 * MIB;
    let lines = run(&sim, Some(&slice), &["fill", "mem", "32"]);
    let got = u(&event(&lines, "refused")["allocated"]);
    let peak = u(&sim.device(0)["peak_used"]);
    assert!(peak <= CAP, "the slice held {} MiB", mib(peak));
    // B may use all the cap that A's context and its own leave: 424 MiB.
    let room = CAP - 2 * CTX;
    assert!(
        got + chunk > room,
        "B got {} MiB beside A's async-freed pool; {} MiB of the cap were free by the simulator's count",
        mib(got),
        mib(room)
    );
    // A's own view is unchanged by the free and synchronise, as without cuslice.
    assert_eq!(
        u(&h["free_after"]),
        CAP - CTX,
        "A's cuMemGetInfo free after cuMemFreeAsync + synchronise: {} MiB",
        mib(u(&h["free_after"]))
    );
    assert_eq!(a.release(), 0);
}

// ---- NVML under a cap ----------------------------------------------------------------------

/// NVML in a slice beside a process outside it: the slice's memory and its processes, held to the
/// cap, by the simulator's count; and outside the slice, the whole device.
#[test]
fn nvml_memory_and_processes_under_a_cap_beside_a_process_outside() {
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::capped();
    let (inside, hi) = hold(&sim, Some(&slice), &["hold", "256"]);
    let (outside, ho) = hold(&sim, None, &["hold", "1024"]);
    let (pi, po) = (u(&hi["pid"]), u(&ho["pid"]));
    let dev = sim.device(0);
    let in_held = u(&process(&dev, pi)["held"]);
    assert_eq!(in_held, CTX + 256 * MIB, "simgpu: the slice's process");

    let n = run(&sim, Some(&slice), &["nvml"]);
    let m = event(&n, "nvml");
    assert_eq!(u(&m["total"]), CAP, "NVML total in the slice: {m}");
    assert_eq!(u(&m["used"]), in_held, "NVML used in the slice: {m}");
    assert_eq!(u(&m["free"]), CAP - in_held, "NVML free in the slice: {m}");
    for k in ["total", "used", "free"] {
        assert_eq!(m[k], m[format!("v2_{k}")], "nvmlMemory_v2 {k}: {m}");
    }
    let procs = m["processes"].as_array().unwrap();
    assert_eq!(
        procs.len(),
        1,
        "the slice's NVML lists its own process only: {m}"
    );
    assert_eq!(u(&procs[0]["pid"]), pi, "{m}");
    assert_eq!(u(&procs[0]["used"]), in_held, "{m}");
    let sum: u64 = procs.iter().map(|p| u(&p["used"])).sum();
    assert_eq!(sum, u(&m["used"]), "processes sum to used: {m}");
    // What the capped process's cuMemGetInfo said agrees.
    assert_eq!(u(&hi["free"]), u(&m["free"]), "cuMemGetInfo vs NVML free");

    // Outside the slice: the whole device, every process, as the simulator has it.
    let n = run(&sim, None, &["nvml"]);
    let m = event(&n, "nvml");
    let dev = sim.device(0);
    assert_eq!(u(&m["total"]), 8 * GIB, "{m}");
    assert_eq!(u(&m["used"]), u(&dev["used"]), "{m} vs {dev}");
    let mut got: Vec<(u64, u64)> = m["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (u(&p["pid"]), u(&p["used"])))
        .collect();
    got.sort();
    let mut want = vec![(pi, in_held), (po, u(&process(&dev, po)["held"]))];
    want.sort();
    assert_eq!(got, want, "NVML's processes outside the slice");
    assert_eq!(inside.release(), 0);
    assert_eq!(outside.release(), 0);
}

/// A process outside the slice holds most of the device: the slice's NVML free is what can
/// really be had, min(cap - used, physical free), as its cuMemGetInfo says.
#[test]
fn nvml_free_in_a_slice_on_a_fuller_device_is_what_can_be_had() {
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::capped();
    let (outside, _) = hold(&sim, None, &["hold", "7168"]);
    let (inside, hi) = hold(&sim, Some(&slice), &["hold", "0"]);
    let dev = sim.device(0);
    let physical_free = u(&dev["free"]);
    let in_held = held(&sim, u(&hi["pid"]));
    let want = (CAP - in_held).min(physical_free);
    assert_eq!(
        u(&hi["free"]),
        want,
        "cuMemGetInfo free in the slice (cap {} MiB, physical free {} MiB)",
        mib(CAP - in_held),
        mib(physical_free)
    );
    let n = run(&sim, Some(&slice), &["nvml"]);
    let m = event(&n, "nvml");
    assert_eq!(
        u(&m["free"]),
        want,
        "NVML free in the slice: {} MiB, cuMemGetInfo {} MiB: {m}",
        mib(u(&m["free"])),
        mib(want)
    );
    assert_eq!(u(&m["v2_free"]), want, "nvmlMemory_v2 free: {m}");
    assert_eq!(inside.release(), 0);
    assert_eq!(outside.release(), 0);
}

/// `cuMemGetInfo_v2(NULL, &total)` and `(&free, NULL)` succeed and fill the one figure asked for,
/// as the real driver does; under a cap that figure is the slice's.
#[test]
fn cumemgetinfo_with_one_null_out_parameter_answers_the_other() {
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::capped();
    for (s, limit) in [(None, 8 * GIB), (Some(&slice), CAP)] {
        let lines = run(&sim, s, &["null-outs"]);
        let n = event(&lines, "null_outs");
        let place = if s.is_some() { "in a slice" } else { "bare" };
        assert_eq!(
            n["rc_total_only"], 0,
            "{place}: cuMemGetInfo_v2(NULL, &total): {n}"
        );
        assert_eq!(u(&n["total"]), limit, "{place}: total: {n}");
        assert_eq!(
            n["rc_free_only"], 0,
            "{place}: cuMemGetInfo_v2(&free, NULL): {n}"
        );
        assert_eq!(u(&n["free"]), limit - CTX, "{place}: free: {n}");
    }
}

// ---- compute ------------------------------------------------------------------------------

/// A process limited to 30% launches 1 ms PTX kernels back to back through the bindings
/// (cuModuleLoadData, cuLaunchKernel); the simulator's device time gives its share.
#[test]
fn a_compute_limited_client_gets_30_percent_of_the_device() {
    if !have_python() {
        return;
    }
    let _turn = serial();
    let sim = Sim::new(&[]);
    let node = tempfile::tempdir().unwrap();
    let slice = Slice::new(&[
        ("CUSLICE_CORE_LIMIT", "30"),
        ("CUSLICE_NODE_DIR", &node.path().display().to_string()),
    ]);
    let (settle, window) = (Duration::from_secs(3), Duration::from_secs(4));
    let secs = (settle + window).as_secs_f64() + 1.5;
    let ptx = spin_ptx().display().to_string();
    let mut r = Running::start({
        let mut c = client_cmd(
            &sim,
            Some(&slice),
            &["launch", &ptx, "1000000", &secs.to_string()],
        );
        c.stdin(Stdio::null());
        c
    });
    let pid = u(&r.wait_for("start", Duration::from_secs(60))["pid"]);
    std::thread::sleep(settle);
    let time = |sim: &Sim| {
        let d = sim.device(0);
        (Instant::now(), u(&process(&d, pid)["device_time_ns"]))
    };
    let (t0, a) = time(&sim);
    std::thread::sleep(window);
    let (t1, b) = time(&sim);
    let share = 100.0 * (b - a) as f64 / (t1 - t0).as_nanos() as f64;
    eprintln!("achieved {share:.2}% of the device");
    let launched = r.wait_for("launched", Duration::from_secs(60));
    assert!(u(&launched["kernels"]) > 0, "{launched}");
    assert!(
        (share - 30.0).abs() <= 3.0,
        "a client limited to 30% had {share:.1}% of the device by the simulator's count"
    );
}

// ---- what monitoring tools ask NVML --------------------------------------------------------

/// The NVML queries of gpustat and nvitop answer as on an H100 node, in and outside a slice.
#[test]
fn nvml_answers_what_monitoring_tools_ask() {
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::capped();
    for s in [None, Some(&slice)] {
        let n = run(&sim, s, &["nvml"]);
        let t = event(&n, "tools");
        let text = |k: &str| {
            t[k].as_str()
                .unwrap_or_else(|| panic!("{k}: {}", t[k]))
                .to_string()
        };
        let driver = text("driver_version");
        assert_eq!(
            text("nvml_version"),
            format!("{}.{driver}", u(&t["cuda_driver_version"]) / 1000),
            "{t}"
        );
        let bar1 = &t["bar1"];
        assert_eq!(u(&bar1["bar1Total"]), 8 * GIB, "BAR1: {t}");
        assert_eq!(
            u(&bar1["bar1Free"]) + u(&bar1["bar1Used"]),
            u(&bar1["bar1Total"]),
            "{t}"
        );
        for g in ["graphics", "graphics_v2", "graphics_v3"] {
            assert_eq!(t[g], serde_json::json!([]), "{g}: {t}");
        }
        let temp = u(&t["temperature"]);
        assert!((30..=75).contains(&temp), "temperature: {t}");
        // Passively cooled, as an H100 SXM: no fans, and fan speed "Not Supported" (3).
        assert_eq!(t["fan_speed"]["error"], 3, "{t}");
        assert_eq!(t["num_fans"], 0, "{t}");
        assert_eq!(u(&t["power_limit"]), 700_000, "{t}");
        let power = u(&t["power_usage"]);
        assert!((70_000..=700_000).contains(&power), "power: {t}");
        assert_eq!(t["encoder"], serde_json::json!([0, 1_000_000]), "{t}");
        assert_eq!(t["decoder"], serde_json::json!([0, 1_000_000]), "{t}");
        // nvitop's header: persistence on, P0, default compute mode, no display, ECC on with
        // no errors, no driver model (Windows only: "Not Supported").
        assert_eq!(t["persistence_mode"], 1, "{t}");
        assert_eq!(t["performance_state"], 0, "{t}");
        assert_eq!(t["compute_mode"], 0, "{t}");
        assert_eq!(t["power_management_limit"], 700_000, "{t}");
        assert_eq!(t["display_active"], 0, "{t}");
        assert_eq!(t["display_mode"], 0, "{t}");
        assert_eq!(t["ecc_mode"], serde_json::json!([1, 1]), "{t}");
        assert_eq!(t["ecc_errors"], 0, "{t}");
        assert_eq!(t["driver_model"]["error"], 3, "{t}");
    }
}

/// What NVML says of peers and NVLinks (nvidia-ml-py, as NCCL and vLLM ask it) is what a process
/// under cuslice is told: on PCIe cards every peer status "not supported" and no NVLink, on an
/// NVLink board (`simgpu init --nvlink`) every status OK and each device's links active, each
/// to another device's PCI bus id; with 2 and 4 devices, with and without libcuslice.so.
#[test]
fn nvml_peer_and_link_answers_pass_through_untouched() {
    if !have_python() {
        return;
    }
    for nvlink in [false, true] {
        for n in [2usize, 4] {
            let count = n.to_string();
            let mut args = vec!["--devices", &count, "--memory", "8GiB"];
            if nvlink {
                args.push("--nvlink");
            }
            let sim = Sim::new(&args);
            let plain = event(&run(&sim, None, &["topology"]), "topology").clone();
            let slice = Slice::capped();
            let capped = event(&run(&sim, Some(&slice), &["topology"]), "topology").clone();
            assert_eq!(plain, capped, "{n} devices, nvlink {nvlink}");
            assert_eq!(u(&plain["devices"]), n as u64, "{plain}");
            let pairs = plain["pairs"].as_array().unwrap();
            assert_eq!(pairs.len(), n * (n - 1), "{plain}");
            for p in pairs {
                for k in ["read", "write", "nvlink", "atomics", "prop"] {
                    // nvmlGpuP2PStatus_t: 0 OK, 5 NOT_SUPPORTED.
                    let want = if nvlink { 0 } else { 5 };
                    assert_eq!(p[k], want, "nvlink {nvlink}: {p}");
                }
            }
            let bus_ids = plain["bus_ids"].as_array().unwrap();
            for l in plain["links"].as_array().unwrap() {
                let (d, link) = (u(&l["device"]) as usize, u(&l["link"]) as usize);
                if !nvlink {
                    // NVML_ERROR_NOT_SUPPORTED: a PCIe card has no NVLink.
                    assert_eq!(l["state"]["error"], 3, "{l}");
                } else if link < n - 1 {
                    assert_eq!(l["state"], 1, "active: {l}");
                    assert!(
                        bus_ids.contains(&l["remote"]) && l["remote"] != bus_ids[d],
                        "device {d}'s link {link} reaches another device: {l} {bus_ids:?}"
                    );
                } else {
                    // NVML_ERROR_INVALID_ARGUMENT: no such link.
                    assert_eq!(l["state"]["error"], 2, "{l}");
                }
            }
        }
    }
}

// ---- the checkpoint API through the bindings ----------------------------------------------

/// `cuda_client.py checkpoint PID OPS...` (lock[:MS], checkpoint, restore, unlock): one line
/// per step, with its code and the state after it.
fn checkpoint(sim: &Sim, pid: u64, ops: &[&str]) -> Vec<Value> {
    let mut args = vec!["checkpoint".to_string(), pid.to_string()];
    args.extend(ops.iter().map(|o| o.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(sim, None, &args)
}

fn steps(lines: &[Value]) -> Vec<(String, String)> {
    lines
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_string(),
                l["state"].as_str().unwrap_or("-").to_string(),
            )
        })
        .collect()
}

fn step(name: &str, state: &str) -> (String, String) {
    (name.to_string(), format!("CU_PROCESS_STATE_{state}"))
}

/// The simulator's record of a process the checkpoint API holds, if it holds it.
fn checkpointed(sim: &Sim, pid: u64) -> Option<Value> {
    sim.show()["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["pid"] == pid)
        .cloned()
}

fn check(r: &mut Running) -> Value {
    use std::io::Write;
    writeln!(r.child.stdin.as_mut().unwrap(), "check").unwrap();
    r.wait_for("checked", Duration::from_secs(60))
}

#[test]
fn a_checkpointed_process_lets_the_device_go_and_gets_its_bytes_back_at_the_same_addresses() {
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "1GiB"]);
    let (mut k, held_line) = hold(&sim, None, &["keep", "64"]);
    let pid = u(&held_line["pid"]);
    let before = held(&sim, pid);
    assert_eq!(before, 64 * MIB + CTX);

    let lines = checkpoint(&sim, pid, &["lock:5000", "checkpoint"]);
    assert_eq!(
        steps(&lines),
        [
            step("CUDA_SUCCESS", "LOCKED"),
            step("CUDA_SUCCESS", "CHECKPOINTED")
        ]
    );
    let dev = sim.device(0);
    assert_eq!(u(&dev["used"]), 0, "the device let it all go: {dev}");
    assert!(
        dev["processes"].as_array().unwrap().is_empty(),
        "no process on the device: {dev}"
    );
    let c = checkpointed(&sim, pid).expect("the simulator lists it as checkpointed");
    assert_eq!(c["state"], "checkpointed");
    assert_eq!(
        u(&c["host_bytes"]),
        before,
        "what it held is in its host memory"
    );

    // Another tenant writes over every byte of the device the first one had.
    let free_mib = u(&sim.device(0)["free"]) / MIB - CTX / MIB;
    let s = run(&sim, None, &["scribble", &free_mib.to_string()]);
    assert_eq!(u(&event(&s, "scribbled")["bytes"]), free_mib * MIB);

    let lines = checkpoint(&sim, pid, &["restore", "unlock"]);
    assert_eq!(
        steps(&lines),
        [
            step("CUDA_SUCCESS", "LOCKED"),
            step("CUDA_SUCCESS", "RUNNING")
        ]
    );
    assert_eq!(held(&sim, pid), before, "all of it is back on the device");
    assert!(checkpointed(&sim, pid).is_none());
    let v = check(&mut k);
    assert_eq!(
        v["intact"], true,
        "the bytes it wrote read back the same through the same pointer"
    );
    assert_eq!(k.release(), 0);
}

#[test]
fn a_locked_process_waits_in_its_next_call_until_it_is_unlocked() {
    use std::io::Write;
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "1GiB"]);
    let (mut k, held_line) = hold(&sim, None, &["keep", "16"]);
    let pid = u(&held_line["pid"]);
    let lines = checkpoint(&sim, pid, &["lock:5000"]);
    assert_eq!(steps(&lines), [step("CUDA_SUCCESS", "LOCKED")]);
    // A copy, which takes the process's objects, and a device count, which takes nothing.
    writeln!(k.child.stdin.as_mut().unwrap(), "count\ncheck").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let unlocking = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let lines = checkpoint(&sim, pid, &["unlock"]);
    assert_eq!(steps(&lines), [step("CUDA_SUCCESS", "RUNNING")]);
    let c = k.wait_for("counted", Duration::from_secs(60));
    assert_eq!(c["devices"], 1);
    assert!(
        c["at"].as_f64().unwrap() >= unlocking,
        "the count asked for while locked was answered only after the unlock: {c}"
    );
    let v = k.wait_for("checked", Duration::from_secs(60));
    assert_eq!(v["intact"], true);
    assert_eq!(k.release(), 0);
}

#[test]
fn the_checkpoint_api_refuses_what_the_driver_refuses() {
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "1GiB"]);
    // Managed memory: not supported; the process stays locked, and unlocks.
    let (mut k, held_line) = hold(&sim, None, &["keep", "16", "managed"]);
    let pid = u(&held_line["pid"]);
    let held_before = held(&sim, pid);
    let lines = checkpoint(
        &sim,
        pid,
        &["checkpoint", "lock", "checkpoint", "lock", "unlock"],
    );
    assert_eq!(
        steps(&lines),
        [
            step("CUDA_ERROR_ILLEGAL_STATE", "RUNNING"),
            step("CUDA_SUCCESS", "LOCKED"),
            step("CUDA_ERROR_NOT_SUPPORTED", "LOCKED"),
            step("CUDA_ERROR_ILLEGAL_STATE", "LOCKED"),
            step("CUDA_SUCCESS", "RUNNING"),
        ]
    );
    assert_eq!(held(&sim, pid), held_before, "nothing left the device");
    assert_eq!(check(&mut k)["intact"], true);
    assert_eq!(k.release(), 0);

    // A pid that is no CUDA process.
    let me = std::process::id() as u64;
    let lines = checkpoint(&sim, me, &["lock"]);
    assert_eq!(lines[0]["name"], "CUDA_ERROR_INVALID_VALUE");
}

#[test]
fn a_restore_without_room_fails_and_leaves_the_process_checkpointed_for_good() {
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "1GiB"]);
    let (_keeper, held_line) = hold(&sim, None, &["keep", "256"]);
    let pid = u(&held_line["pid"]);
    let lines = checkpoint(&sim, pid, &["lock", "checkpoint"]);
    assert_eq!(steps(&lines)[1], step("CUDA_SUCCESS", "CHECKPOINTED"));
    // Another process takes the room while it is off the device.
    let (other, _) = hold(&sim, None, &["hold", "512"]);
    let lines = checkpoint(&sim, pid, &["restore"]);
    assert_eq!(
        steps(&lines),
        [step("CUDA_ERROR_OUT_OF_MEMORY", "CHECKPOINTED")]
    );
    assert_eq!(other.release(), 0);
    let lines = checkpoint(&sim, pid, &["restore"]);
    assert_eq!(
        steps(&lines),
        [step("CUDA_ERROR_ILLEGAL_STATE", "CHECKPOINTED")],
        "with room again, it still cannot come back"
    );
    let c = checkpointed(&sim, pid).unwrap();
    assert_eq!(c["stuck"], true);
    assert_eq!(u(&sim.device(0)["used"]), 0);
}

// ---- an idle slice's memory frozen to the host (CUSLICE_MEMORY_FREEZE_IDLE) -------------------

/// A slice capped at 1 GiB whose processes are frozen after a second without a CUDA call.
fn freezing() -> Slice {
    Slice::new(&[
        ("CUSLICE_MEMORY_LIMIT", "1GiB"),
        ("CUSLICE_MEMORY_FREEZE_IDLE", "1s"),
        ("CUSLICE_LOG", "info"),
    ])
}

/// Waits until the simulator lists `pid` as checkpointed (None after `timeout`).
fn wait_checkpointed(sim: &Sim, pid: u64, timeout: Duration) -> Option<Value> {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if let Some(c) = checkpointed(sim, pid)
            && c["state"] == "checkpointed"
        {
            return Some(c);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn an_idle_process_of_a_slice_is_frozen_and_its_next_call_thaws_it_with_its_bytes_intact() {
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "2GiB"]);
    let slice = freezing();
    let (mut k, held_line) = hold(&sim, Some(&slice), &["keep", "64"]);
    let pid = u(&held_line["pid"]);
    let before = held(&sim, pid);
    assert_eq!(before, 64 * MIB + CTX);

    let c = wait_checkpointed(&sim, pid, Duration::from_secs(20))
        .expect("frozen after a second without a call");
    assert_eq!(u(&c["host_bytes"]), before, "all it held is in host memory");
    let dev = sim.device(0);
    assert_eq!(u(&dev["used"]), 0, "the device has it all back: {dev}");

    // Another tenant takes the whole device and writes over every byte of it, then leaves.
    let free_mib = u(&dev["free"]) / MIB - CTX / MIB;
    let s = run(&sim, None, &["scribble", &free_mib.to_string()]);
    assert_eq!(u(&event(&s, "scribbled")["bytes"]), free_mib * MIB);

    // Its next call (a copy, through a driver function cuslice does not wrap) thaws it.
    let v = check(&mut k);
    assert_eq!(v["intact"], true, "its bytes read back the same: {v}");
    assert!(checkpointed(&sim, pid).is_none(), "running again");
    assert_eq!(held(&sim, pid), before, "all of it is back on the device");
    let err = said(&k, "thawed");
    assert!(
        err.contains("frozen after 1s idle: 364 MiB of device memory went to the host"),
        "{err}"
    );
    assert!(err.contains("thawed: 364 MiB back on the device"), "{err}");
    assert_eq!(k.release(), 0);
}

/// The process's stderr once it holds `text` (or after 10 s).
fn said(r: &Running, text: &str) -> String {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let err = r.err.text();
        if err.contains(text) || Instant::now() > end {
            return err;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_busy_process_is_never_frozen() {
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "2GiB"]);
    let slice = freezing();
    let ptx = spin_ptx().display().to_string();
    // One 3-second kernel and a synchronize (no call for 3 s, one under way in the driver), then
    // 1 ms kernels for 3 s.
    for (ns, secs) in [("3000000000", "0.001"), ("1000000", "3")] {
        let mut r = Running::start(client_cmd(&sim, Some(&slice), &["launch", &ptx, ns, secs]));
        let end = Instant::now() + Duration::from_secs(60);
        let mut seen = false;
        while r.child.try_wait().unwrap().is_none() && Instant::now() < end {
            let show = sim.show();
            seen |= !show["checkpoints"].as_array().unwrap().is_empty();
            std::thread::sleep(Duration::from_millis(50));
        }
        if r.child.try_wait().unwrap().is_none() {
            let _ = r.child.kill();
            panic!(
                "still running after 60 s ({ns} ns kernels; frozen while busy, seen: {seen}): {}",
                r.err.text()
            );
        }
        let v = r.wait_for("launched", Duration::from_secs(5));
        assert!(u(&v["kernels"]) >= 1);
        let err = r.err.text();
        assert!(!seen, "a busy process was frozen ({ns} ns kernels): {err}");
        assert!(!err.contains("frozen after"), "{err}");
    }
}

#[test]
fn a_process_the_driver_will_not_checkpoint_is_left_running_and_says_why_once() {
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "2GiB"]);
    let slice = freezing();
    // Managed memory: the checkpoint API does not support it.
    let (mut k, held_line) = hold(&sim, Some(&slice), &["keep", "16", "managed"]);
    let pid = u(&held_line["pid"]);
    let err = said(&k, "not frozen");
    assert!(
        err.contains(
            "not frozen: the driver refused to checkpoint it (CUDA_ERROR_NOT_SUPPORTED(801): managed memory"
        ),
        "{err}"
    );
    // Two more idle spells: tried again, said no more.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        checkpointed(&sim, pid).is_none(),
        "left running, not locked"
    );
    let v = check(&mut k);
    assert_eq!(v["intact"], true);
    let err = k.err.text();
    assert_eq!(err.matches("not frozen").count(), 1, "{err}");
    assert_eq!(k.release(), 0);
}

/// `n` slices of their own, each capped at 6 GiB and frozen after a second idle.
fn notebooks(n: usize) -> Vec<Slice> {
    (0..n)
        .map(|_| {
            Slice::new(&[
                ("CUSLICE_MEMORY_LIMIT", "6GiB"),
                ("CUSLICE_MEMORY_FREEZE_IDLE", "1s"),
                ("CUSLICE_LOG", "info"),
            ])
        })
        .collect()
}

#[test]
fn three_notebooks_capped_at_6_gib_take_turns_on_an_8_gib_device_with_their_bytes_intact() {
    use std::io::Write;
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "8GiB"]);
    // Three slices of their own, each capped at 6 GiB (18 GiB of caps on 8 GiB), each holding
    // 3 GiB and a context (3.3 GiB): any two fit on the device, three do not.
    let slices = notebooks(3);
    let mut books = Vec::new();
    for s in &slices {
        let (k, line) = hold(&sim, Some(s), &["keep", "3072"]);
        let pid = u(&line["pid"]);
        assert!(
            wait_checkpointed(&sim, pid, Duration::from_secs(20)).is_some(),
            "idle, it gives the device back before the next one starts"
        );
        books.push((k, pid));
    }
    assert_eq!(u(&sim.device(0)["used"]), 0);
    // Rounds of work: each notebook's next cell reads its bytes back (the thaw), in turn, while
    // the others idle and freeze again.
    for round in 0..2 {
        for (k, pid) in books.iter_mut() {
            let v = check(k);
            assert_eq!(v["intact"], true, "round {round}, pid {pid}: {v}");
        }
    }
    // Two at once fit; the third's next cell waits in its thaw until one of them is idle again.
    let [a, b, c] = &mut books[..] else {
        unreachable!()
    };
    assert_eq!(check(&mut a.0)["intact"], true);
    assert_eq!(check(&mut b.0)["intact"], true);
    assert!(checkpointed(&sim, a.1).is_none() && checkpointed(&sim, b.1).is_none());
    writeln!(c.0.child.stdin.as_mut().unwrap(), "check").unwrap();
    let v = c.0.wait_for("checked", Duration::from_secs(60));
    assert_eq!(v["intact"], true, "{v}");
    let err = c.0.err.text();
    assert!(err.contains("thaw waits for room on device 0"), "{err}");
    let dev = sim.device(0);
    assert!(u(&dev["used"]) <= 8 * GIB, "{dev}");
    for (k, pid) in books {
        let err = k.err.text();
        assert!(!err.contains("refused"), "pid {pid} met no OOM: {err}");
        assert_eq!(k.release(), 0);
    }
}

/// A thaw's room is its own until the restore has it: another slice that allocates and frees as
/// fast as it can beside a notebook that thaws again and again (caps past the device: the two
/// do not fit at once) never takes the room between the thaw's look and its restore, which the
/// driver would answer with OUT_OF_MEMORY and a process checkpointed for good. Every thaw comes
/// back with its bytes, and the other slice gets its room whenever the notebook is frozen.
#[test]
fn a_slice_allocating_beside_a_thaw_never_takes_the_room_the_restore_needs() {
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slices = notebooks(2);
    let (mut book, line) = hold(&sim, Some(&slices[0]), &["keep", "4096"]);
    let pid = u(&line["pid"]);
    let (mut churn, _) = hold(&sim, Some(&slices[1]), &["churn", "5120", "25"]);
    for round in 0..5 {
        let c = wait_checkpointed(&sim, pid, Duration::from_secs(20))
            .unwrap_or_else(|| panic!("round {round}: not frozen: {}", book.err.text()));
        assert_eq!(c["stuck"], false, "round {round}");
        use std::io::Write;
        writeln!(book.child.stdin.as_mut().unwrap(), "check").unwrap();
        let v = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            book.wait_for("checked", Duration::from_secs(20))
        }))
        .unwrap_or_else(|_| {
            panic!(
                "round {round}: the thaw did not come back ({:?}): {}",
                checkpointed(&sim, pid),
                book.err.text()
            )
        });
        assert_eq!(v["intact"], true, "round {round}: {v}");
    }
    let v = churn.wait_for("churned", Duration::from_secs(60));
    assert!(
        u(&v["got"]) > 0,
        "the other slice had room while the notebook was frozen: {v}"
    );
    // The protocol, not luck: the other slice's allocations waited for the thaws.
    let err = churn.err.text();
    assert!(
        err.contains("an allocation of 5 GiB waits while 4.29 GiB comes back to the device"),
        "{err}"
    );
    let err = book.err.text();
    assert!(!err.contains("could not restore"), "{err}");
    assert_eq!(churn.release(), 0);
    assert_eq!(book.release(), 0);
}

/// A slice of its own capped at 6 GiB (two of them on an 8 GiB device add up past it), frozen
/// after an hour idle or sooner when another slice waits for room, waiting `wait` for room itself.
fn waiting_slice(wait: &str) -> Slice {
    Slice::new(&[
        ("CUSLICE_MEMORY_LIMIT", "6GiB"),
        ("CUSLICE_MEMORY_FREEZE_IDLE", "1h"),
        ("CUSLICE_MEMORY_WAIT", wait),
        ("CUSLICE_LOG", "info"),
    ])
}

/// Caps that add up past the device, and both slices busy at once: the one that asks last waits
/// for its wait (2 s), then gets the driver's OUT_OF_MEMORY and carries on as it chooses (this
/// client exits with its own error). Nobody is frozen, nobody killed, the busy slice's bytes
/// are intact.
#[test]
fn when_every_slice_is_busy_the_last_to_ask_waits_then_is_refused_and_nobody_is_frozen() {
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "8GiB"]);
    let (first, second) = (waiting_slice("60s"), waiting_slice("2s"));
    let ptx = spin_ptx().display().to_string();
    let (mut a, _) = hold(&sim, Some(&first), &["busy", "5120", &ptx, "8"]);
    let mut b = Running::start(client_cmd(&sim, Some(&second), &["hold", "5120"]));
    let end = Instant::now() + Duration::from_secs(60);
    let mut frozen = false;
    while b.child.try_wait().unwrap().is_none() && Instant::now() < end {
        frozen |= !sim.show()["checkpoints"].as_array().unwrap().is_empty();
        std::thread::sleep(Duration::from_millis(50));
    }
    let v = b.wait_for("error", Duration::from_secs(5));
    assert_eq!(v["name"], "CUDA_ERROR_OUT_OF_MEMORY", "{v}");
    let status = b.child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(3),
        "its own exit, not a signal: {status}"
    );
    let err = b.err.text();
    assert!(err.contains("device 0 has no room for 5 GiB"), "{err}");
    assert!(
        err.contains("device 0 had no room for 5 GiB within 2s"),
        "{err}"
    );
    let v = a.wait_for("checked", Duration::from_secs(60));
    assert_eq!(v["intact"], true, "{v}");
    assert!(!frozen, "a busy slice was frozen: {}", a.err.text());
    assert!(!a.err.text().contains("frozen after"), "{}", a.err.text());
    assert_eq!(a.release(), 0);
}

/// Every family of device memory waits for room on a full device, not only cuMemAlloc: a
/// stream-ordered allocation (cuMemAllocAsync, the pools PyTorch and JAX can use), a VMM one
/// (cuMemCreate) and a 2D array (cuArrayCreate) of 5 GiB each wait until a quiet slice holding
/// 4 GiB is frozen for them.
#[test]
fn allocations_of_every_family_wait_for_room_that_a_quiet_slice_gives_back() {
    if !have_python() {
        return;
    }
    for family in ["async", "vmm", "array"] {
        let sim = Sim::new(&["--memory", "8GiB"]);
        let slices: Vec<Slice> = (0..2)
            .map(|_| {
                Slice::new(&[
                    ("CUSLICE_MEMORY_LIMIT", "6GiB"),
                    ("CUSLICE_MEMORY_FREEZE_IDLE", "1h"),
                    ("CUSLICE_MEMORY_WAIT", "60s"),
                    ("CUSLICE_LOG", "info"),
                ])
            })
            .collect();
        let (mut a, line) = hold(&sim, Some(&slices[0]), &["keep", "4096"]);
        let a_pid = u(&line["pid"]);
        let (b, line) = hold(&sim, Some(&slices[1]), &["hold", "5120", family]);
        let b_pid = u(&line["pid"]);
        let c = checkpointed(&sim, a_pid)
            .unwrap_or_else(|| panic!("{family}: the quiet slice is not frozen"));
        assert_eq!(c["state"], "checkpointed", "{family}");
        let err = said(&b, "had room");
        assert!(
            err.contains("device 0 had room for 5 GiB after"),
            "{family}: {err}"
        );
        assert!(held(&sim, b_pid) >= 5120 * MIB, "{family}");
        assert_eq!(b.release(), 0, "{family}");
        // With the room back, the first's next read thaws it, its bytes intact.
        let v = check(&mut a);
        assert_eq!(v["intact"], true, "{family}: {v}");
        assert_eq!(a.release(), 0, "{family}");
    }
}

#[test]
fn a_slice_waiting_for_room_on_a_full_device_gets_it_from_a_quiet_slice_frozen_on_demand() {
    use std::io::Write;
    if !have_python() {
        return;
    }
    let sim = Sim::new(&["--memory", "8GiB"]);
    // Two slices capped at 6 GiB on an 8 GiB device, frozen after an hour idle (never, here), or
    // sooner when another slice waits for room; each waits up to a minute for room.
    let slices = [waiting_slice("60s"), waiting_slice("60s")];
    let (mut a, line) = hold(&sim, Some(&slices[0]), &["keep", "4096"]);
    let a_pid = u(&line["pid"]);
    // The second needs 5 GiB: within its cap, past what the device has left. It waits, and the
    // first, quiet, gives the device back.
    let (mut b, line) = hold(&sim, Some(&slices[1]), &["keep", "5120"]);
    let b_pid = u(&line["pid"]);
    let c = checkpointed(&sim, a_pid).expect("the quiet slice is frozen");
    assert_eq!(c["state"], "checkpointed");
    assert_eq!(u(&c["host_bytes"]), 4096 * MIB + CTX);
    let err = said(&a, "frozen after");
    assert!(
        err.contains("quiet: another slice waits for 5 GiB on device 0"),
        "{err}"
    );
    let err = said(&b, "had room");
    assert!(err.contains("device 0 has no room for 5 GiB"), "{err}");
    assert!(err.contains("device 0 had room for 5 GiB after"), "{err}");
    assert_eq!(held(&sim, b_pid), 5120 * MIB + CTX);

    // The first's next cell: its thaw waits for room, and says so on the board; the second,
    // quiet by then, is frozen in its turn, and the first has its bytes back.
    std::thread::sleep(Duration::from_millis(1200));
    writeln!(a.child.stdin.as_mut().unwrap(), "check").unwrap();
    let v = a.wait_for("checked", Duration::from_secs(60));
    assert_eq!(v["intact"], true, "{v}");
    assert!(a.err.text().contains("thaw waits for room on device 0"));
    assert!(checkpointed(&sim, a_pid).is_none());
    assert_eq!(
        checkpointed(&sim, b_pid).map(|c| c["state"].clone()),
        Some(Value::from("checkpointed"))
    );
    // And the second's next cell brings it back, once the first is quiet again.
    let v = check(&mut b);
    assert_eq!(v["intact"], true, "{v}");
    assert!(u(&sim.device(0)["used"]) <= 8 * GIB);
    for k in [a, b] {
        let err = k.err.text();
        assert!(!err.contains("refused"), "{err}");
        assert_eq!(k.release(), 0);
    }
}
