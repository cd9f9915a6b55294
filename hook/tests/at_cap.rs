//! What an allocation does at the cap in a container that asks for more than a refusal, through
//! Podman: waiting for the slice's own frees (`CUSLICE_MEMORY_WAIT`) and spilling to host memory
//! (`CUSLICE_MEMORY_SPILL`). The processes of one container are one slice; ground truth is the
//! simulator's (what each process holds on the device, and the device's peak).

use std::io::BufRead;
use std::time::{Duration, Instant};

use cuslice_test_engines::podman::engine;
use cuslice_test_engines::*;
use cuslice_test_harness::{GIB, MIB, Sim};
use serde_json::Value;

/// Contexts of 64 MiB, so that three processes fit in a 1 GiB slice (832 MiB left).
fn sim() -> Sim {
    Sim::new(&["--memory", "8GiB", "--context-overhead", "64MiB"])
}

/// Every JSON line the container prints until it ends, each with when the test read it.
fn all_lines(c: &mut dyn Container) -> Vec<(Instant, Value)> {
    let mut out = Vec::new();
    let mut line = String::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(90) {
        line.clear();
        if c.stdout().read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        if let Ok(v) = serde_json::from_str::<Value>(&line) {
            out.push((Instant::now(), v));
        }
    }
    out
}

/// The index of the first line with `event` from the process that said `bytes` (hold's lines
/// carry the bytes they hold).
fn find(lines: &[(Instant, Value)], event: &str, bytes: u64) -> usize {
    lines
        .iter()
        .position(|(_, v)| v["event"] == event && v["bytes"] == bytes)
        .unwrap_or_else(|| {
            let all: Vec<&Value> = lines.iter().map(|(_, v)| v).collect();
            panic!("no {event:?} of {bytes} bytes in {all:?}")
        })
}

fn container(sim: &Sim, what: &str, env: &[&str], script: &str) -> Vec<(Instant, Value)> {
    let n = name(what);
    let mut c = engine().spawn(
        sim,
        &Spec {
            name: &n,
            env,
            cmd: &["sh", "-c", script],
            read_only: false,
        },
    );
    let lines = all_lines(&mut *c);
    let stderr = c.stderr();
    c.remove();
    assert!(!lines.is_empty(), "the container printed nothing: {stderr}");
    lines
}

/// A holds 600 MiB for 3 s; B, started a second later, asks for 700 MiB (more than is left) and
/// waits; A frees, and B holds. In that order, and never more than the cap on the device.
#[test]
fn a_waiter_holds_what_its_neighbour_frees_in_order() {
    root_required();
    let sim = sim();
    let lines = container(
        &sim,
        "wait",
        &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_MEMORY_WAIT=30s"],
        "cuda-workload hold --bytes 600MiB --secs 3 & \
         sleep 1; cuda-workload hold --bytes 700MiB --secs 0; wait",
    );
    let a_holding = find(&lines, "holding", 600 * MIB);
    let a_freed = find(&lines, "freed", 600 * MIB);
    let b_holding = find(&lines, "holding", 700 * MIB);
    // The order of two processes' lines in one pipe is when each wrote, not when the memory
    // moved: B may hold, and say so, between A's free and A's line about it (a busy host sees
    // it). That B held only once A had freed is the simulator's peak, below.
    assert!(
        a_holding < a_freed && a_holding < b_holding,
        "out of order: {lines:?}"
    );
    // B waited for A: it held only after A's free, about 2 s after it asked.
    let waited = lines[b_holding].0 - lines[a_holding].0;
    assert!(
        waited >= Duration::from_millis(1500),
        "B held after {waited:?}"
    );
    let dev = sim.device(0);
    assert!(u64_of(&dev["peak_used"]) <= GIB, "over the cap: {dev}");
    assert!(
        !lines.iter().any(|(_, v)| v["event"] == "error"),
        "{lines:?}"
    );
}

/// With a wait of 1 s, B is refused with CUDA_ERROR_OUT_OF_MEMORY after it, as at the cap.
#[test]
fn a_waiter_out_of_time_is_refused_with_out_of_memory() {
    root_required();
    let sim = sim();
    let lines = container(
        &sim,
        "wait-out",
        &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_MEMORY_WAIT=1s"],
        "cuda-workload hold --bytes 600MiB --secs 6 & \
         sleep 1; cuda-workload hold --bytes 400MiB --secs 0; wait",
    );
    let error = lines
        .iter()
        .find(|(_, v)| v["event"] == "error")
        .unwrap_or_else(|| panic!("B was not refused: {lines:?}"));
    assert_eq!(error.1["code"], 2, "{error:?}");
    assert_eq!(error.1["call"], "cuMemAlloc_v2", "{error:?}");
    // Refused while A still held its memory, which it then freed as usual.
    let a_freed = find(&lines, "freed", 600 * MIB);
    assert!(lines[a_freed].0 > error.0, "{lines:?}");
}

/// B is SIGKILLed while it waits; once A has freed, a third process gets all the slice has
/// left at once: the dead waiter holds nothing and holds nobody up.
#[test]
fn a_waiter_killed_while_it_waits_leaves_nothing_behind() {
    root_required();
    let sim = sim();
    let lines = container(
        &sim,
        "wait-kill",
        &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_MEMORY_WAIT=30s"],
        "cuda-workload hold --bytes 600MiB --secs 2 & A=$!; \
         sleep 0.5; cuda-workload hold --bytes 700MiB --secs 0 & B=$!; \
         sleep 1; kill -9 $B; wait $A; \
         cuda-workload hold --bytes 960MiB --secs 0",
    );
    let a_freed = find(&lines, "freed", 600 * MIB);
    let d_holding = find(&lines, "holding", 960 * MIB);
    assert!(
        !lines
            .iter()
            .any(|(_, v)| v["bytes"] == 700 * MIB && v["event"] == "holding"),
        "the killed waiter held: {lines:?}"
    );
    let took = lines[d_holding].0 - lines[a_freed].0;
    assert!(
        took < Duration::from_secs(10),
        "the newcomer waited {took:?}"
    );
    let dev = sim.device(0);
    assert!(u64_of(&dev["peak_used"]) <= GIB, "over the cap: {dev}");
}

/// A 1 GiB container with 1 GiB of spill allocates 1.5 GiB and no more; the simulator shows at
/// most 1 GiB on the device, and `cuslice status` shows the spill.
#[test]
fn a_container_spills_past_its_cap_and_status_shows_it() {
    root_required();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("spill");
    let mut c = engine().spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_MEMORY_SPILL=1GiB"],
            cmd: &[
                "cuda-workload",
                "fill",
                "--family",
                "mem",
                "--chunk",
                "256MiB",
                "--max-count",
                "7",
                "--hold",
                "60",
            ],
            read_only: false,
        },
    );
    let refused = wait_for(&mut *c, "refused");
    wait_for(&mut *c, "holding");
    assert_eq!(u64_of(&refused["count"]), 6, "{refused}");
    assert_eq!(u64_of(&refused["allocated"]), 1536 * MIB, "{refused}");
    assert_eq!(refused["code"], 2, "past cap and spill: {refused}");
    let (held, peak) = held_by(&sim, c.host_pid());
    assert!(held <= GIB && peak <= GIB, "held {held}, peak {peak}");
    let slice = slice_in(&status_json(&sim), &c.id());
    assert_eq!(u64_of(&slice["memory"]["spilled"]), GIB, "{slice}");
    assert_eq!(u64_of(&slice["memory"]["spill_limit"]), GIB, "{slice}");
    assert_eq!(u64_of(&slice["memory"]["used"]), held, "{slice}");
    let text = sim
        .command(
            &cuslice_test_harness::bin_dir().join("cuslice"),
            &["status"],
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("SPILLED") && text.contains("1 GiB of 1 GiB"),
        "{text}"
    );
    c.remove();
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}
