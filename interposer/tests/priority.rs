//! Priority (`CUSLICE_PRIORITY`) on the simulator: real processes through libcuslice, device time
//! from `simgpu show` (the simulator's ground truth), probe latencies from the probe itself. No
//! goal is timed here (tests/tools/latency.py measures them); each test compares runs made side
//! by side with wide margins, or checks that something happens at all.

use cuslice_test_harness::*;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

/// One process of its own slice on `sim` (the compute board under `node`), stdout piped; its pid.
fn start(sim: &Sim, node: &std::path::Path, env: &[(&str, &str)], args: &[&str]) -> (Child, u64) {
    let mut c = sim.command(&workload(), args);
    c.env("LD_PRELOAD", libcuslice())
        .env("CUSLICE_NODE_DIR", node)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("{line}"));
    assert_eq!(v["event"], "start", "{line}");
    (child, u(&v["pid"]))
}

/// Back-to-back kernels of `kernel_us` for `secs`.
fn busy(kernel_us: u32, secs: f64) -> Vec<String> {
    ["launch", "--ns-per-block", "1000", "--blocks"]
        .iter()
        .map(|s| s.to_string())
        .chain([kernel_us.to_string(), "--secs".into(), secs.to_string()])
        .collect()
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The probe's latencies (ns) beside a neighbour of 1 ms kernels, the probe and the neighbour
/// with the given environments.
fn probe_beside(probe_env: &[(&str, &str)], neighbour_env: &[(&str, &str)]) -> Vec<u64> {
    // Contexts take turns on the engine every 4 ms: a probe left to the engine waits for the
    // rest of the neighbour's slice (up to 4 ms), one that goes first for the rest of its
    // kernel (up to 1 ms).
    let sim = Sim::new(&["--timeslice-us", "4000"]);
    let node = tempfile::tempdir().unwrap();
    let (mut n, _) = start(&sim, node.path(), neighbour_env, &args(&busy(1000, 8.0)));
    let (p, _) = start(
        &sim,
        node.path(),
        probe_env,
        &["probe", "--secs", "3", "--warmup-secs", "1.5"],
    );
    let out = p.wait_with_output().unwrap();
    let _ = n.kill();
    let _ = n.wait();
    let lat = latencies(&out);
    assert!(lat.len() > 300, "{} probes", lat.len());
    lat
}

/// The latencies (ns) a probe that exited reported, in order.
fn latencies(out: &std::process::Output) -> Vec<u64> {
    assert!(out.status.success(), "{out:?}");
    let lines = parse_lines(&String::from_utf8_lossy(&out.stdout));
    event(&lines, "probed")["latencies_ns"]
        .as_array()
        .unwrap()
        .iter()
        .map(u)
        .collect()
}

fn median(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v[v.len() / 2]
}

/// How many probes waited longer than one neighbour kernel and the probe's own kernel, with
/// room for the host's wake-ups: with priority, far fewer.
fn late(v: &[u64]) -> usize {
    v.iter().filter(|&&ns| ns > 1_600_000).count()
}

#[test]
fn a_high_priority_probe_waits_less_beside_a_low_priority_neighbour_than_beside_a_normal_one() {
    let _turn = serial();
    // Normal: the probe waits for the rest of the neighbour's time slice.
    let normal = probe_beside(&[], &[]);
    let prio = probe_beside(
        &[("CUSLICE_PRIORITY", "high")],
        &[("CUSLICE_PRIORITY", "low")],
    );
    let (mn, mp) = (median(&normal), median(&prio));
    eprintln!(
        "median {mp} ns with priority, {mn} without; later than 1.6 ms: {} of {} with, {} of {} without",
        late(&prio),
        prio.len(),
        late(&normal),
        normal.len()
    );
    assert!(
        mp < mn,
        "median latency with priority {mp} ns, without {mn} ns"
    );
    assert!(
        late(&prio) * 2 < late(&normal),
        "probes later than 1.6 ms: {} of {} with priority, {} of {} without",
        late(&prio),
        prio.len(),
        late(&normal),
        normal.len()
    );
}

/// A high-priority probe whose host stops it for longer than a waiter may leave the device free
/// (`turn::TAKE_GRACE_NS`, 20 ms) is passed over while it waits first in the queue. Once it runs
/// again it gets its turns back: before, the low neighbour went on renewing its turn while the
/// probe waited, until the probe passed it over in turn (after 150 ms), and from then on the two
/// held the device at once, sharing it by the engine's time slices for the rest of the run (seen
/// every few runs of the priority benchmark on a loaded 2-core machine).
#[test]
fn a_high_priority_probe_its_host_stops_for_a_while_gets_its_turns_back() {
    let _turn = serial();
    // Contexts take turns on the engine every 4 ms, as in the test above: two slices that hold
    // the device at once share it by time slices, and the probe waits for the rest of one.
    let sim = Sim::new(&["--timeslice-us", "4000"]);
    let node = tempfile::tempdir().unwrap();
    let (mut n, _) = start(
        &sim,
        node.path(),
        &[("CUSLICE_PRIORITY", "low")],
        &args(&busy(1000, 16.0)),
    );
    let (p, pid) = start(
        &sim,
        node.path(),
        &[("CUSLICE_PRIORITY", "high")],
        &["probe", "--secs", "10", "--warmup-secs", "1"],
    );
    // 25 stops of 30 ms, one every 230 ms from 1.5 s on: some fall while the probe waits for the
    // turn (a fifth of its time). The last ends more than 3 s before the probe does.
    let stopper = std::thread::spawn(move || {
        let signal = |sig: &str| {
            std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .status()
                .is_ok_and(|s| s.success())
        };
        std::thread::sleep(Duration::from_millis(1500));
        let mut stops = 0;
        for _ in 0..25 {
            if !signal("-STOP") {
                break;
            }
            stops += 1;
            std::thread::sleep(Duration::from_millis(30));
            signal("-CONT");
            std::thread::sleep(Duration::from_millis(200));
        }
        stops
    });
    let out = p.wait_with_output().unwrap();
    let stops = stopper.join().unwrap();
    let _ = n.kill();
    let _ = n.wait();
    let lat = latencies(&out);
    // A stop that fell inside a probe (the rest fell between probes).
    let stopped = lat.iter().filter(|&&ns| ns >= 25_000_000).count();
    // The last 3 s of probes, more than half a second after the last stop.
    let tail = &lat[lat.len().saturating_sub(600)..];
    eprintln!(
        "{stops} stops, {stopped} of {} probes took 25 ms or more (the longest {:.1} ms); of the \
         last {} probes {} took more than 1.6 ms (median {:.2} ms)",
        lat.len(),
        lat.iter().max().copied().unwrap_or(0) as f64 / 1e6,
        tail.len(),
        late(tail),
        median(tail) as f64 / 1e6
    );
    assert!(
        stops == 25 && stopped >= 1,
        "the stops did not take: {stops} stops, {stopped} probes of 25 ms or more"
    );
    // Back to turns: a probe waits for the rest of one neighbour kernel (1 ms), not for the rest
    // of the engine's 4 ms time slice (in the runs that held the device at once, a third of the
    // probes took longer than 1.6 ms; with turns, 5%).
    assert!(
        late(tail) * 6 < tail.len(),
        "after the stops, {} of the last {} probes took more than 1.6 ms: the probe and its \
         neighbour hold the device at once",
        late(tail),
        tail.len()
    );
}

/// Each pid's device time by the simulator's count, every second `n` times after `settle`, and
/// the wall time between the first and the last count (ns), each at the instant it stands for
/// (`Sim::device_times_at`).
fn per_second(sim: &Sim, pids: &[u64], settle: Duration, n: usize) -> (Vec<Vec<u64>>, f64) {
    std::thread::sleep(settle);
    let at = || {
        let (t, d) = sim.device_times_at(0);
        let mark: Vec<u64> = pids
            .iter()
            .map(|&p| d.get(&(p as i64)).copied().unwrap_or(0))
            .collect();
        (t, mark)
    };
    let (t0, first) = at();
    let (mut marks, mut last) = (vec![first], t0);
    for _ in 0..n {
        std::thread::sleep(Duration::from_secs(1));
        let (t, mark) = at();
        marks.push(mark);
        last = t;
    }
    (marks, (last - t0).as_nanos() as f64)
}

#[test]
fn a_low_priority_slice_beside_a_busy_high_one_gets_device_time_every_second() {
    let _turn = serial();
    let sim = Sim::new(&[]);
    let node = tempfile::tempdir().unwrap();
    let (mut high, hp) = start(
        &sim,
        node.path(),
        &[("CUSLICE_PRIORITY", "high")],
        &args(&busy(1000, 8.0)),
    );
    let (mut low, lp) = start(
        &sim,
        node.path(),
        &[("CUSLICE_PRIORITY", "low")],
        &args(&busy(1000, 8.0)),
    );
    let (marks, _) = per_second(&sim, &[hp, lp], Duration::from_secs(2), 4);
    for c in [&mut high, &mut low] {
        let _ = c.kill();
        let _ = c.wait();
    }
    let (mut high_total, mut low_total) = (0, 0);
    for w in marks.windows(2) {
        let (h, l) = (w[1][0] - w[0][0], w[1][1] - w[0][1]);
        assert!(
            l > 0,
            "the low slice got no device time in a 1 s window: {marks:?}"
        );
        high_total += h;
        low_total += l;
    }
    eprintln!("busy high {high_total} ns, low {low_total} ns over 4 s: {marks:?}");
    // The high slice comes first: well over half the device.
    assert!(
        high_total > 3 * low_total,
        "high {high_total} ns, low {low_total} ns over 4 s"
    );
}

/// A low-priority slice with a request of 30 beside a busy high-priority one: the low slice gets
/// its request, within 5 points, and the high one the rest. A run that misses is run once more;
/// the second may instead show the high slice held to what the request leaves (within 2 points),
/// the low one at half its request or more and the two together keeping the device at least 80%
/// busy: beside a high-priority slice the low
/// one launches one kernel at a time, each once the last is done, so a host that runs its threads
/// late leaves the device idle in its turns, and that comes out of its request (on the 2-core
/// machine with two busy processes on each core, 21.2 to 24.5% for 30, the high slice 68.8 to
/// 69.3%: docs/compute.md, Known limits).
#[test]
fn a_low_priority_request_is_still_met_beside_a_busy_high_slice() {
    let _turn = serial();
    let (l, h) = low_request_beside_high();
    if l >= 25.0 && h >= 55.0 {
        return;
    }
    eprintln!("request 30: low {l:.1}%, high {h:.1}%: missed, measured once more");
    let (l2, h2) = low_request_beside_high();
    if l2 >= 25.0 && h2 >= 55.0 {
        return;
    }
    assert!(
        (55.0..=72.0).contains(&h2) && l2 >= 15.0 && l2 + h2 >= 80.0,
        "low slice with request 30: {l:.1}%, then {l2:.1}% (high {h:.1}%, then {h2:.1}%)"
    );
    eprintln!(
        "request 30: the high slice held to what the request leaves ({h2:.1}%), the low one \
         {l2:.1}%: the host left the device idle in its turns"
    );
}

/// The low slice's and the high slice's percent of the device, by the simulator's count, over
/// 4 s after 3 s, the low one with a request of 30, both launching 1 ms kernels back to back.
fn low_request_beside_high() -> (f64, f64) {
    let sim = Sim::new(&[]);
    let node = tempfile::tempdir().unwrap();
    let (mut high, hp) = start(
        &sim,
        node.path(),
        &[("CUSLICE_PRIORITY", "high")],
        &args(&busy(1000, 9.0)),
    );
    let (mut low, lp) = start(
        &sim,
        node.path(),
        &[("CUSLICE_PRIORITY", "low"), ("CUSLICE_CORE_REQUEST", "30")],
        &args(&busy(1000, 9.0)),
    );
    let (marks, span) = per_second(&sim, &[hp, lp], Duration::from_secs(3), 4);
    for c in [&mut high, &mut low] {
        let _ = c.kill();
        let _ = c.wait();
    }
    let (first, last) = (&marks[0], &marks[marks.len() - 1]);
    let (h, l) = (
        100.0 * (last[0] - first[0]) as f64 / span,
        100.0 * (last[1] - first[1]) as f64 / span,
    );
    // Shown with --nocapture.
    eprintln!("request 30: low {l:.1}%, high {h:.1}%");
    (l, h)
}

#[test]
fn a_bad_priority_refuses_cuda_with_one_line() {
    let _turn = serial();
    let sim = Sim::new(&[]);
    let node = tempfile::tempdir().unwrap();
    let out = sim
        .command(&workload(), &["info"])
        .env("LD_PRELOAD", libcuslice())
        .env("CUSLICE_NODE_DIR", node.path())
        .env("CUSLICE_PRIORITY", "urgent")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let line = "CUSLICE_PRIORITY=\"urgent\" is not a priority (high, normal or low); write e.g. \
                CUSLICE_PRIORITY=high";
    assert!(err.contains(line), "{err}");
    assert_eq!(err.matches("CUSLICE_PRIORITY").count(), 2, "{err}");
    assert!(!out.status.success(), "{out:?}");
}
