//! Where a compute meter's readings come from, and what happens when that changes: NVML's
//! per-process samples, the device's own utilisation, or launch estimates alone. Ground truth is
//! the simulator's device time per process (`simgpu show`).

use cuslice_test_harness::*;

use std::io::BufRead;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Starts `launch` (1 µs × `blocks` kernels back to back, for `secs`) in a slice with `env`;
/// returns the child and its pid once it has started.
fn launcher(
    sim: &Sim,
    node: &std::path::Path,
    env: &[(&str, &str)],
    blocks: u32,
    secs: u32,
) -> (Child, u64) {
    let (blocks, secs) = (blocks.to_string(), secs.to_string());
    let mut c = sim.command(
        &workload(),
        &[
            "launch",
            "--ns-per-block",
            "1000",
            "--blocks",
            &blocks,
            "--secs",
            &secs,
        ],
    );
    c.env("LD_PRELOAD", libcuslice())
        .env("CUSLICE_NODE_DIR", node)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["event"], "start", "{line}");
    (child, u(&v["pid"]))
}

fn device_time(sim: &Sim, pid: u64) -> u64 {
    let d = sim.device(0);
    ["processes", "exited"]
        .iter()
        .flat_map(|k| d[*k].as_array().cloned().unwrap_or_default())
        .find(|p| u(&p["pid"]) == pid)
        .map_or(0, |p| u(&p["device_time_ns"]))
}

fn set_process_samples(sim: &Sim, on: &str) {
    let out = std::process::Command::new(simgpu())
        .args(["set", "--state"])
        .arg(&sim.state)
        .args(["--process-samples", on])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// A failure the demo once showed: a slice metered by launch estimates while NVML did not list
/// it, then by NVML's samples once it did. Its first sample was taken to cover the whole time
/// since the process began, which had already been charged by estimate: the slice owed seconds
/// it never used and was held at 0% far below its request. Each 1 s window after the switch
/// must keep the request-40 slice at its request.
#[test]
fn moving_from_estimates_to_samples_charges_nothing_twice() {
    let _turn = serial();
    let sim = Sim::new(&[]);
    let node = tempfile::tempdir().unwrap();
    set_process_samples(&sim, "off");
    let secs = 13;
    let (a, pa) = launcher(
        &sim,
        node.path(),
        &[("CUSLICE_CORE_REQUEST", "40"), ("CUSLICE_CORE_LIMIT", "50")],
        1000,
        secs,
    );
    let (b, _) = launcher(
        &sim,
        node.path(),
        &[("CUSLICE_MEMORY_LIMIT", "2GiB")],
        1000,
        secs,
    );
    std::thread::sleep(Duration::from_secs(6));
    set_process_samples(&sim, "on");
    let mut windows = Vec::new();
    let (mut t, mut used) = (Instant::now(), device_time(&sim, pa));
    for _ in 0..5 {
        std::thread::sleep(Duration::from_secs(1));
        let (t1, used1) = (Instant::now(), device_time(&sim, pa));
        windows.push(100.0 * (used1 - used) as f64 / (t1 - t).as_nanos() as f64);
        (t, used) = (t1, used1);
    }
    for c in [a, b] {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    assert!(
        windows.iter().all(|w| (37.0..=53.0).contains(w)),
        "request 40 / limit 50 beside a best-effort slice, 1 s windows after NVML began to \
         sample it: {windows:.1?}"
    );
}

/// A driver that gives no per-process samples (MIG, some vGPU profiles): a slice alone on the
/// device is metered by the device's own utilisation, so 1 µs kernels under a 50% limit are not
/// each charged the 1 ms starting estimate (which allowed 500 launches a second), and the limit
/// still holds by the simulator's count.
#[test]
fn without_per_process_samples_a_lone_slice_is_metered_by_the_device() {
    let _turn = serial();
    let sim = Sim::new(&["--no-process-samples"]);
    let node = tempfile::tempdir().unwrap();
    let secs = 6;
    let (c, pid) = launcher(&sim, node.path(), &[("CUSLICE_CORE_LIMIT", "50")], 1, secs);
    std::thread::sleep(Duration::from_secs(3));
    let (t0, u0) = (Instant::now(), device_time(&sim, pid));
    std::thread::sleep(Duration::from_secs(2));
    let (t1, u1) = (Instant::now(), device_time(&sim, pid));
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let done = parse_lines(&String::from_utf8_lossy(&out.stdout));
    let launches = u(&event(&done, "launched")["launches"]);
    let share = 100.0 * (u1 - u0) as f64 / (t1 - t0).as_nanos() as f64;
    assert!(share <= 52.0, "share {share:.1}% under a 50% limit");
    assert!(
        launches >= 10 * 500 * secs as u64,
        "{launches} launches of 1 µs kernels in {secs} s under a 50% limit: still charged the \
         1 ms starting estimate"
    );
}
