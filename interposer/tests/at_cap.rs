//! What an allocation does at the cap when the slice asks for more than a refusal: waiting for
//! the slice's own frees (`CUSLICE_MEMORY_WAIT`) and spilling to host memory
//! (`CUSLICE_MEMORY_SPILL`), standalone. Ground truth is the simulator's: what each process
//! holds on the device, and the device's peak.

mod common;
use common::*;

use std::time::{Duration, Instant};

use serde_json::Value;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const CONTEXT: u64 = 64 * MIB;
const WAIT: Duration = Duration::from_secs(30);

/// A simulated 8 GiB device whose contexts take 64 MiB, so that three processes fit in a 1 GiB
/// slice (832 MiB left for allocations).
fn sim() -> Sim {
    Sim::new(&["--memory", "8GiB", "--context-overhead", "64MiB"])
}

/// What the simulator says process `pid` holds on device 0 (0: not listed).
fn held(sim: &Sim, pid: u64) -> u64 {
    sim.device(0)["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .map_or(0, |p| u(&p["held"]))
}

/// The workload's pid, as its lines give it (the child is `simgpu run`, its parent).
fn pid(line: &Value) -> u64 {
    u(&line["pid"])
}

/// Waits for `r`'s `start` line (its context is made), then long enough for its allocation to
/// have reached the cap and queued.
fn started(r: &mut Running) -> Value {
    let v = r.wait_for("start", WAIT);
    std::thread::sleep(Duration::from_millis(800));
    v
}

#[test]
fn waiters_get_what_the_slice_frees_first_come_first_served() {
    let _g = serial();
    let sim = sim();
    let slice = Slice::new(&[
        ("CUSLICE_MEMORY_LIMIT", "1GiB"),
        ("CUSLICE_MEMORY_WAIT", "30s"),
    ]);
    let mut a = slice.spawn(&sim, &["hold", "--bytes", "600MiB"]);
    a.wait_for("holding", WAIT);
    // B asks for more than is left (1 GiB - 2 contexts - 600 MiB = 296 MiB): it waits.
    let mut b = slice.spawn(&sim, &["hold", "--bytes", "700MiB"]);
    let b_pid = pid(&started(&mut b));
    // C asks for 200 MiB, which would fit beside A now (232 MiB left after its context), but
    // B came first: C waits behind B.
    let mut c = slice.spawn(&sim, &["hold", "--bytes", "200MiB"]);
    let c_pid = pid(&started(&mut c));
    assert_eq!(held(&sim, b_pid), CONTEXT, "B holds more than its context");
    assert_eq!(
        held(&sim, c_pid),
        CONTEXT,
        "C went ahead of B, which waited first"
    );
    // A frees: B gets its 700 MiB; C (132 MiB left) still waits, now for B.
    let freed_at = Instant::now();
    assert_eq!(a.release(), 0);
    b.wait_for("holding", WAIT);
    let b_after = freed_at.elapsed();
    assert_eq!(held(&sim, b_pid), CONTEXT + 700 * MIB);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        held(&sim, c_pid),
        CONTEXT,
        "C got memory that was not there"
    );
    // B frees: C gets its 200 MiB.
    assert_eq!(b.release(), 0);
    c.wait_for("holding", WAIT);
    assert_eq!(held(&sim, c_pid), CONTEXT + 200 * MIB);
    assert_eq!(c.release(), 0);
    assert!(
        u(&sim.device(0)["peak_used"]) <= GIB,
        "the device held more than the cap at some point: {}",
        sim.device(0)
    );
    // Woken by the free, not by a poll that happens to come by: well within the re-check
    // period of 100 ms plus a loaded machine's start-up of the workload's next line.
    eprintln!("B held its memory {b_after:?} after A was told to free");
}

#[test]
fn a_waiter_out_of_time_is_refused_as_at_the_cap() {
    let _g = serial();
    let sim = sim();
    let slice = Slice::new(&[
        ("CUSLICE_MEMORY_LIMIT", "1GiB"),
        ("CUSLICE_MEMORY_WAIT", "1s"),
    ]);
    let mut a = slice.spawn(&sim, &["hold", "--bytes", "600MiB"]);
    let a_pid = pid(&a.wait_for("holding", WAIT));
    let t = Instant::now();
    let (lines, code, stderr) = slice.run(&sim, &["hold", "--bytes", "400MiB", "--secs", "0"]);
    let took = t.elapsed();
    let error = event(&lines, "error");
    assert_eq!(error["code"], 2, "{error} {stderr}");
    assert_eq!(error["call"], "cuMemAlloc_v2", "{error}");
    assert_ne!(code, 0);
    assert!(
        took >= Duration::from_secs(1),
        "refused after {took:?}, before its wait was out"
    );
    assert!(
        took < Duration::from_secs(10),
        "refused only after {took:?}"
    );
    // The holder was never held up, and the refused process left nothing behind: one more
    // process gets all that is left at once.
    assert_eq!(held(&sim, a_pid), CONTEXT + 600 * MIB);
    let (_, code, stderr) = slice.run(&sim, &["hold", "--bytes", "296MiB", "--secs", "0"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(a.release(), 0);
}

/// The stream-ordered allocator never waits, whatever CUSLICE_MEMORY_WAIT says: at the cap,
/// `cuMemAllocAsync` and `cuMemAllocFromPoolAsync` are refused at once (a thread waiting there
/// could be waiting for its own stream's free), while a plain allocation of the same size in the
/// same slice waits out its time.
#[test]
fn the_stream_ordered_allocator_is_refused_at_once_with_a_wait_set() {
    let _g = serial();
    let sim = sim();
    let slice = Slice::new(&[
        ("CUSLICE_MEMORY_LIMIT", "1GiB"),
        ("CUSLICE_MEMORY_WAIT", "3s"),
    ]);
    let mut a = slice.spawn(&sim, &["hold", "--bytes", "600MiB"]);
    let a_pid = pid(&a.wait_for("holding", WAIT));
    for (family, call) in [
        ("async", "cuMemAllocAsync"),
        ("pool", "cuMemAllocFromPoolAsync"),
        ("mem", "cuMemAlloc_v2"),
    ] {
        let t = Instant::now();
        let (lines, code, stderr) = slice.run(
            &sim,
            &[
                "hold", "--family", family, "--bytes", "400MiB", "--secs", "0",
            ],
        );
        let took = t.elapsed();
        let error = event(&lines, "error");
        assert_eq!(error["code"], 2, "{family}: {error} {stderr}");
        assert_eq!(error["call"], call, "{family}: {error}");
        assert_ne!(code, 0);
        if family == "mem" {
            assert!(
                took >= Duration::from_secs(3),
                "{family}: refused after {took:?}, before its wait was out"
            );
        } else {
            assert!(
                took < Duration::from_secs(2),
                "{family}: refused only after {took:?}: it waited"
            );
        }
    }
    assert_eq!(held(&sim, a_pid), CONTEXT + 600 * MIB);
    assert_eq!(a.release(), 0);
}

#[test]
fn a_waiter_killed_while_it_waits_leaves_the_slice_nothing_less() {
    let _g = serial();
    let sim = sim();
    let slice = Slice::new(&[
        ("CUSLICE_MEMORY_LIMIT", "1GiB"),
        ("CUSLICE_MEMORY_WAIT", "30s"),
    ]);
    let mut a = slice.spawn(&sim, &["hold", "--bytes", "600MiB"]);
    a.wait_for("holding", WAIT);
    let mut b = slice.spawn(&sim, &["hold", "--bytes", "700MiB"]);
    started(&mut b);
    // SIGKILL while it waits in the queue.
    let _ = b.child.kill();
    let _ = b.child.wait();
    assert_eq!(a.release(), 0);
    // A newcomer with the same wait gets the whole slice less its context at once: nothing is
    // still charged to the dead waiter, and its place in the queue holds nobody up.
    let t = Instant::now();
    let mut d = slice.spawn(&sim, &["hold", "--bytes", "960MiB"]);
    let d_pid = pid(&d.wait_for("holding", WAIT));
    let took = t.elapsed();
    assert_eq!(held(&sim, d_pid), CONTEXT + 960 * MIB);
    assert!(
        took < Duration::from_secs(10),
        "the newcomer waited {took:?}"
    );
    assert_eq!(d.release(), 0);
}

/// The spill's charge in `cuslice status --json` for the slice (device 0).
fn status_memory(slice: &Slice) -> Value {
    let v = cuslice_test_harness::json_of(
        std::process::Command::new(bin_dir().join("cuslice"))
            .args(["status", "--json", "--state-dir"])
            .arg(slice.dir.path()),
    );
    v["devices"][0]["slices"][0]["memory"].clone()
}

/// One scrape of `cuslice exporter` serving the slice.
fn scrape(slice: &Slice) -> String {
    let mut cmd = std::process::Command::new(bin_dir().join("cuslice"));
    cmd.args(["exporter", "--listen", "127.0.0.1:0", "--state-root"])
        .arg("/nonexistent-cuslice-root")
        .arg("--state-dir")
        .arg(slice.dir.path())
        .stderr(std::process::Stdio::null());
    cuslice_test_harness::scrape_exporter(cmd)
}

#[test]
fn a_slice_spills_past_its_cap_into_host_memory_and_no_further() {
    let _g = serial();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::new(&[
        ("CUSLICE_MEMORY_LIMIT", "1GiB"),
        ("CUSLICE_MEMORY_SPILL", "1GiB"),
    ]);
    // 300 MiB context: 724 MiB of device memory for allocations, then 1 GiB of host memory.
    let mut a = slice.spawn(
        &sim,
        &[
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
    );
    let refused = a.wait_for("refused", WAIT);
    let a_pid = pid(&refused);
    a.wait_for("holding", WAIT);
    assert_eq!(u(&refused["count"]), 6, "{refused}");
    assert_eq!(u(&refused["allocated"]), 1536 * MIB, "{refused}");
    assert_eq!(refused["code"], 2, "past cap and spill: {refused}");
    let dev = sim.device(0);
    assert!(
        held(&sim, a_pid) <= GIB && u(&dev["peak_used"]) <= GIB,
        "the device held more than the cap: {dev}"
    );
    assert_eq!(held(&sim, a_pid), 300 * MIB + 512 * MIB, "{dev}");
    let memory = status_memory(&slice);
    assert_eq!(u(&memory["spilled"]), GIB, "{memory}");
    assert_eq!(u(&memory["spill_limit"]), GIB, "{memory}");
    assert_eq!(u(&memory["used"]), 300 * MIB + 512 * MIB, "{memory}");
    let metrics = scrape(&slice);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("cuslice_slice_memory_spilled_bytes{")
                && l.ends_with(&format!(" {GIB}"))),
        "{metrics}"
    );
    drop(a);
    // Killed: its spill is the slice's again once a process of the slice looks (as its used
    // memory is): the next one may spill the whole 1 GiB again.
    let (lines, code, stderr) = slice.run(
        &sim,
        &[
            "fill",
            "--family",
            "mem",
            "--chunk",
            "256MiB",
            "--max-count",
            "6",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let refused = event(&lines, "refused");
    assert_eq!(u(&refused["count"]), 6, "{refused}");
    assert_eq!(u(&status_memory(&slice)["spilled"]), 0);
}

/// A process started with a smaller `CUSLICE_MEMORY_SPILL` than the slice's first spills at
/// most its own: the slice allows 512 MiB, the second process 128 MiB, and it stops there with
/// 384 MiB of the slice's spill free.
#[test]
fn a_process_spills_at_most_its_own_setting() {
    let _g = serial();
    let sim = sim();
    let slice = Slice::new(&[
        ("CUSLICE_MEMORY_LIMIT", "1GiB"),
        ("CUSLICE_MEMORY_SPILL", "512MiB"),
    ]);
    let mut first = slice.spawn(
        &sim,
        &[
            "fill",
            "--family",
            "mem",
            "--chunk",
            "2MiB",
            "--max-count",
            "1",
            "--hold",
            "60",
        ],
    );
    first.wait_for("holding", WAIT);
    let mut c = slice.command(
        &sim,
        &workload(),
        &[
            "fill",
            "--family",
            "mem",
            "--chunk",
            "128MiB",
            "--max-count",
            "12",
        ],
    );
    c.env("CUSLICE_MEMORY_SPILL", "128MiB")
        .env("CUSLICE_LOG", "info");
    let (lines, code, stderr) = split(c.output().unwrap());
    assert_eq!(code, 0, "{stderr}");
    let refused = event(&lines, "refused");
    // Two contexts of 64 MiB and the first one's 2 MiB: 6 chunks under the cap, then one spilled.
    assert_eq!(u(&refused["count"]), 7, "{refused} {stderr}");
    assert_eq!(refused["code"], 2, "{refused}");
    assert!(
        stderr.contains("this process holds 128 MiB of its 128 MiB spill"),
        "{stderr}"
    );
    drop(first);
}

/// The families that cannot spill (arrays, VMM, pools, managed memory) are refused at the cap
/// with a spill set, as without it: nothing of theirs goes to host memory, and the device holds
/// no more than the cap by the simulator's count.
#[test]
fn families_that_cannot_spill_are_refused_at_the_cap() {
    let _g = serial();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::new(&[
        ("CUSLICE_MEMORY_LIMIT", "1GiB"),
        ("CUSLICE_MEMORY_SPILL", "1GiB"),
    ]);
    for family in ["array", "vmm", "pool", "managed"] {
        let (lines, code, stderr) = slice.run(
            &sim,
            &[
                "fill",
                "--family",
                family,
                "--chunk",
                "256MiB",
                "--max-count",
                "7",
            ],
        );
        assert_eq!(code, 0, "{family}: {stderr}");
        let refused = event(&lines, "refused");
        assert_eq!(refused["code"], 2, "{family}: {refused}");
        // 300 MiB of context: two chunks fit under the cap, no third spills.
        assert_eq!(u(&refused["count"]), 2, "{family}: {refused}");
        assert!(
            u(&refused["allocated"]) < GIB,
            "{family} went past the cap: {refused}"
        );
        let dev = sim.device(0);
        assert!(u(&dev["peak_used"]) <= GIB, "{family}: {dev}");
    }
}

#[test]
fn spilled_memory_works_in_copies() {
    let _g = serial();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::new(&[
        ("CUSLICE_MEMORY_LIMIT", "1GiB"),
        ("CUSLICE_MEMORY_SPILL", "2GiB"),
    ]);
    // Both 800 MiB buffers are past the cap: host to device, device to device and back, all
    // in spilled memory.
    let (lines, code, stderr) = slice.run(&sim, &["memcpy", "--bytes", "800MiB"]);
    assert_eq!(code, 0, "{stderr}");
    let m = event(&lines, "memcpy");
    assert_eq!(m["ok"], true, "{m}");
    assert!(u(&sim.device(0)["peak_used"]) <= GIB);
}

/// Spilled memory is managed memory: CUDA IPC refuses it as the driver refuses any managed
/// allocation (cuslice passes the call through), where device memory of the same slice is
/// exported as before.
#[test]
fn spilled_memory_cannot_be_shared_by_ipc() {
    let _g = serial();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::new(&[
        ("CUSLICE_MEMORY_LIMIT", "1GiB"),
        ("CUSLICE_MEMORY_SPILL", "1GiB"),
    ]);
    let mut under = slice.spawn(&sim, &["export", "--via", "ipc", "--bytes", "512MiB"]);
    under.wait_for("exported", WAIT);
    drop(under);
    let (lines, code, _) = slice.run(&sim, &["export", "--via", "ipc", "--bytes", "800MiB"]);
    assert_ne!(code, 0);
    let error = event(&lines, "error");
    assert_eq!(error["call"], "cuIpcGetMemHandle", "{error}");
    assert_eq!(error["code"], 1, "{error}");
}

/// A program that asks what kind of memory it got: the allocation under the cap is device
/// memory, the spilled one managed (`IS_MANAGED` 1) though the driver's memory type says device
/// for both: cuslice passes the question through and hides nothing.
#[test]
fn spilled_memory_says_it_is_managed() {
    let _g = serial();
    let (_dir, program) = c_program("pointer_kind");
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::new(&[
        ("CUSLICE_MEMORY_LIMIT", "1GiB"),
        ("CUSLICE_MEMORY_SPILL", "1GiB"),
    ]);
    let out = slice
        .command(&sim, &program, &["512", "512"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // code, CU_MEMORYTYPE_DEVICE (2), IS_MANAGED
    assert_eq!(text, "0 2 0\n0 2 1\n");
}
