//! `cuslice set` on live standalone slices (LD_PRELOAD + CUSLICE_STATE_DIR) on simgpu: a cap
//! lowered or raised while the slice runs, a core limit raised from 30 to 60 while it launches,
//! and refusals (bad values, a request past the device) that change nothing. Ground truth is
//! the simulator's: what the process holds, the device time it used. Containers (runc, Podman)
//! are checked in hook/tests/live.rs.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use cuslice_test_harness::{GIB, MIB, Running, Sim, ahead, libcuslice, twice, workload};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_cuslice");

/// A process of the slice in `dir`, with the library preloaded, run ahead of the machine's other
/// work (`ahead`: these tests judge its share of device time).
fn start(sim: &Sim, dir: &Path, node: &Path, env: &[&str], args: &[&str]) -> Running {
    let mut c = ahead(sim.command(&workload(), args));
    c.env("LD_PRELOAD", libcuslice())
        .env("CUSLICE_STATE_DIR", dir)
        .env("CUSLICE_NODE_DIR", node);
    for kv in env {
        let (k, v) = kv.split_once('=').unwrap();
        c.env(k, v);
    }
    Running::start(c)
}

/// `cuslice set DIR ARGS` (the node dir given).
fn set(dir: &Path, node: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("set")
        .arg(dir)
        .arg("--node-dir")
        .arg(node)
        .arg("--state-root")
        .arg("/nonexistent-cuslice-root")
        .args(args)
        .output()
        .unwrap()
}

fn set_ok(dir: &Path, node: &Path, args: &[&str]) -> String {
    let out = set(dir, node, args);
    assert!(
        out.status.success(),
        "cuslice set {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `cuslice status --json` for the slices in `dirs`: each one's entry on device 0.
fn status(sim: &Sim, dirs: &[&Path]) -> Vec<Value> {
    let mut args = vec![
        "status",
        "--json",
        "--state-root",
        "/nonexistent-cuslice-root",
    ];
    for d in dirs {
        args.push("--state-dir");
        args.push(d.to_str().unwrap());
    }
    let out = sim.command(Path::new(BIN), &args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    dirs.iter()
        .map(|d| {
            view["devices"][0]["slices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["slice"] == d.to_str().unwrap())
                .unwrap_or_else(|| panic!("no slice {} in {view}", d.display()))
                .clone()
        })
        .collect()
}

/// The value of `metric` for the slice in `dir`, as `cuslice exporter` serves it now.
fn exported(dir: &Path, metric: &str) -> Option<f64> {
    let mut cmd = Command::new(BIN);
    cmd.args(["exporter", "--listen", "127.0.0.1:0"])
        .args(["--state-root", "/nonexistent-cuslice-root", "--state-dir"])
        .arg(dir);
    let text = cuslice_test_harness::scrape_exporter(cmd);
    let label = format!("slice=\"{}\"", dir.display());
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(&label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// What the simulator says process `pid` holds on device 0.
fn held(sim: &Sim, pid: u64) -> u64 {
    let d = sim.device(0);
    d["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .map_or(0, |p| p["held"].as_u64().unwrap())
}

/// One SIGUSR1 to a `steps` process: its `step` line.
fn step(w: &mut Running, pid: u64) -> Value {
    signal(pid, "USR1");
    w.wait_for("step", Duration::from_secs(30))
}

fn signal(pid: u64, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

#[test]
fn a_cap_lowered_or_raised_while_running_holds_at_the_next_allocation() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let (dir, node) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut w = start(
        &sim,
        dir.path(),
        node.path(),
        &["CUSLICE_MEMORY_LIMIT=1GiB"],
        &["steps", "--bytes", "256MiB"],
    );
    let ready = w.wait_for("ready", Duration::from_secs(30));
    let pid = ready["pid"].as_u64().unwrap();
    assert_eq!(ready["total"], GIB, "{ready}");
    // Up to the cap: refused once the next 256 MiB does not fit.
    let mut last = step(&mut w, pid);
    for _ in 0..8 {
        if last["ok"] == false {
            break;
        }
        last = step(&mut w, pid);
    }
    assert_eq!(last["code"], 2, "never refused under a 1 GiB cap: {last}");
    let before = held(&sim, pid);
    assert!(before <= GIB, "held {before} under a 1 GiB cap");

    // Raised: the next allocation that fits succeeds, and cuMemGetInfo reports the new total.
    let said = set_ok(dir.path(), node.path(), &["--memory-limit", "2GiB"]);
    assert!(said.contains("memory limit 2 GiB (was 1 GiB)"), "{said}");
    let raised = step(&mut w, pid);
    assert_eq!(
        raised["ok"], true,
        "refused after the cap was raised: {raised}"
    );
    assert_eq!(raised["total"], 2 * GIB, "{raised}");
    let after = held(&sim, pid);
    assert!(
        after >= before + 256 * MIB && after <= 2 * GIB,
        "simulator: held {before} before, {after} after"
    );
    assert_eq!(status(&sim, &[dir.path()])[0]["memory"]["limit"], 2 * GIB);

    // A process that joins now takes the slice's cap, not its own environment's.
    let (lines, code, err) = {
        let mut c = sim.command(&workload(), &["info"]);
        c.env("LD_PRELOAD", libcuslice())
            .env("CUSLICE_STATE_DIR", dir.path())
            .env("CUSLICE_NODE_DIR", node.path())
            .env("CUSLICE_MEMORY_LIMIT", "1GiB");
        let out = c.output().unwrap();
        (
            cuslice_test_harness::parse_lines(&String::from_utf8_lossy(&out.stdout)),
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(code, Some(0), "{err}");
    let start = cuslice_test_harness::event(&lines, "start");
    assert_eq!(start["total"], 2 * GIB, "{start}");

    // Lowered below what it holds: refused, total and free say so, nothing is freed.
    let said = set_ok(dir.path(), node.path(), &["--memory-limit", "512MiB"]);
    assert!(
        said.contains("allocations are refused until it is under"),
        "{said}"
    );
    let lowered = step(&mut w, pid);
    assert_eq!(lowered["code"], 2, "{lowered}");
    assert_eq!(lowered["total"], 512 * MIB, "{lowered}");
    assert_eq!(lowered["free"], 0, "{lowered}");
    assert_eq!(
        held(&sim, pid),
        after,
        "memory was freed behind the application"
    );
    let s = &status(&sim, &[dir.path()])[0];
    assert_eq!(s["memory"]["limit"], 512 * MIB, "{s}");
    assert_eq!(
        (
            s["memory"]["set_live"].clone(),
            s["compute"]["set_live"].clone()
        ),
        (Value::Bool(true), Value::Bool(false)),
        "{s}"
    );
    let table = Command::new(BIN)
        .args([
            "status",
            "--state-root",
            "/nonexistent-cuslice-root",
            "--state-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("512 MiB*"), "{table}");
    assert!(
        table.contains("* changed while the slice ran (cuslice set)"),
        "{table}"
    );
    assert_eq!(
        exported(dir.path(), "cuslice_slice_memory_limit_bytes"),
        Some((512 * MIB) as f64)
    );

    signal(pid, "TERM");
    w.wait_for("freed", Duration::from_secs(30));
}

/// A busy workload: 1 ms kernels back to back for 30 s.
const BUSY: &[&str] = &[
    "launch",
    "--ns-per-block",
    "1000",
    "--blocks",
    "1000",
    "--secs",
    "30",
];

/// Each process's share of the device (percent) over a window of `secs` from now, by the
/// simulator.
fn shares(sim: &Sim, pids: &[u64], secs: f64) -> Vec<f64> {
    // One reading of the simulator for every pid at each end of the window.
    let at =
        |d: &std::collections::HashMap<i64, u64>, p: u64| d.get(&(p as i64)).copied().unwrap_or(0);
    let (t0, d0) = (Instant::now(), sim.device_times(0));
    std::thread::sleep(Duration::from_secs_f64(secs));
    let (t1, d1) = (Instant::now(), sim.device_times(0));
    let span = (t1 - t0).as_nanos() as f64;
    pids.iter()
        .map(|&p| 100.0 * (at(&d1, p) - at(&d0, p)) as f64 / span)
        .collect()
}

#[test]
fn a_core_limit_raised_from_30_to_60_while_running_is_followed() {
    // Shares are measured beside quiet tests only: beside another test's busy processes on a
    // small machine, a slice's own process may not get the CPU to keep the device busy.
    let _turn = cuslice_test_harness::quiet();
    twice(a_core_limit_raised_from_30_to_60_while_running_is_followed_once);
}

fn a_core_limit_raised_from_30_to_60_while_running_is_followed_once() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let (dir, node) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // 1 ms kernels back to back.
    let mut w = start(
        &sim,
        dir.path(),
        node.path(),
        &["CUSLICE_CORE_LIMIT=30"],
        BUSY,
    );
    let pid = w.wait_for("start", Duration::from_secs(30))["pid"]
        .as_u64()
        .unwrap();
    // The share over a window of `secs` from now, by the simulator.
    let share = |secs: f64| shares(&sim, &[pid], secs)[0];
    std::thread::sleep(Duration::from_secs(2));
    let before = share(3.0);
    let changed = Instant::now();
    let said = set_ok(dir.path(), node.path(), &["--core-limit", "60"]);
    assert!(said.contains("core limit 60% (was 30%)"), "{said}");
    // Half-second windows until one is within 2 points of 60 (the first 5 s at most), then 3 s.
    let mut windows = Vec::new();
    while changed.elapsed() < Duration::from_secs(5) {
        let w = share(0.5);
        windows.push((changed.elapsed().as_secs_f64(), w));
        if (w - 60.0).abs() <= 2.0 {
            break;
        }
    }
    let after = share(3.0);
    eprintln!(
        "share before {before:.1}%, after {after:.1}%; windows after the change: {windows:.1?}"
    );
    assert!(
        (before - 30.0).abs() <= 2.0,
        "before the change: {before:.1}%"
    );
    assert!(
        (after - 60.0).abs() <= 2.0,
        "after the change: {after:.1}% (windows {windows:.1?})"
    );
    assert!(
        windows
            .iter()
            .any(|(t, w)| *t <= 2.5 && (w - 60.0).abs() <= 2.0),
        "no half-second window near 60% within about 2 s of the change: {windows:.1?}"
    );
    let s = &status(&sim, &[dir.path()])[0];
    assert_eq!(s["compute"]["limit_pct"], 60.0, "{s}");
    assert_eq!(
        exported(dir.path(), "cuslice_slice_core_limit_ratio"),
        Some(0.6)
    );
    drop(w);
}

/// A core limit set on one device (`--device 1`) changes that device's only: a slice limited to
/// 30% on each of two devices, busy on both (a process each), goes to 60% on device 1 by the
/// simulator's count while device 0 stays at 30%, and `cuslice status` says so per device.
#[test]
fn a_core_limit_set_on_one_device_changes_that_device_only() {
    let _turn = cuslice_test_harness::quiet();
    twice(a_core_limit_set_on_one_device_changes_that_device_only_once);
}

fn a_core_limit_set_on_one_device_changes_that_device_only_once() {
    let sim = Sim::new(&["--devices", "2", "--memory", "8GiB"]);
    let (dir, node) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let on = |d: &'static str| -> Vec<&str> {
        let mut a = vec!["--device", d];
        a.extend_from_slice(BUSY);
        a
    };
    let env = ["CUSLICE_CORE_LIMIT=30"];
    let mut w0 = start(&sim, dir.path(), node.path(), &env, &on("0"));
    let mut w1 = start(&sim, dir.path(), node.path(), &env, &on("1"));
    let pids = [&mut w0, &mut w1].map(|w| {
        w.wait_for("start", Duration::from_secs(30))["pid"]
            .as_u64()
            .unwrap()
    });
    let time = |d: usize| -> u64 {
        sim.device(d)["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pids[d])
            .map_or(0, |p| p["device_time_ns"].as_u64().unwrap())
    };
    // Each process's share of its own device over `secs` from now.
    let share = |secs: f64| -> [f64; 2] {
        let t0 = Instant::now();
        let before = [time(0), time(1)];
        std::thread::sleep(Duration::from_secs_f64(secs));
        let span = t0.elapsed().as_nanos() as f64;
        [0, 1].map(|d| 100.0 * (time(d) - before[d]) as f64 / span)
    };
    std::thread::sleep(Duration::from_secs(2));
    let before = share(3.0);
    let said = set_ok(
        dir.path(),
        node.path(),
        &["--device", "1", "--core-limit", "60"],
    );
    assert!(said.contains("core limit 60% (was 30%)"), "{said}");
    std::thread::sleep(Duration::from_secs(2));
    let after = share(3.0);
    eprintln!("shares on devices 0 and 1: before {before:.1?}%, after {after:.1?}%");
    for (what, got, want) in [
        ("device 0 before", before[0], 30.0),
        ("device 1 before", before[1], 30.0),
        ("device 0 after", after[0], 30.0),
        ("device 1 after", after[1], 60.0),
    ] {
        assert!(
            (got - want).abs() <= 2.0,
            "{what}: {got:.1}% (want {want}%)"
        );
    }
    let out = sim
        .command(
            Path::new(BIN),
            &[
                "status",
                "--json",
                "--state-root",
                "/nonexistent-cuslice-root",
                "--state-dir",
                dir.path().to_str().unwrap(),
            ],
        )
        .output()
        .unwrap();
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (d, want) in [(0, 30.0), (1, 60.0)] {
        let s = &view["devices"][d]["slices"][0];
        assert_eq!(s["compute"]["limit_pct"], want, "device {d}: {s}");
    }
    drop(w0);
    drop(w1);
}

#[test]
fn a_core_limit_set_on_a_slice_without_one_holds_it_to_the_limit() {
    // Shares are measured beside quiet tests only: beside another test's busy processes on a
    // small machine, a slice's own process may not get the CPU to keep the device busy.
    let _turn = cuslice_test_harness::quiet();
    twice(a_core_limit_set_on_a_slice_without_one_holds_it_to_the_limit_once);
}

fn a_core_limit_set_on_a_slice_without_one_holds_it_to_the_limit_once() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let (dir, node) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // No core setting at all (the gate passes every launch), 1 ms kernels back to back.
    let mut w = start(
        &sim,
        dir.path(),
        node.path(),
        &["CUSLICE_MEMORY_LIMIT=2GiB"],
        BUSY,
    );
    let pid = w.wait_for("start", Duration::from_secs(30))["pid"]
        .as_u64()
        .unwrap();
    let share = |secs: f64| shares(&sim, &[pid], secs)[0];
    std::thread::sleep(Duration::from_secs(1));
    let before = share(2.0);
    let said = set_ok(dir.path(), node.path(), &["--core-limit", "30"]);
    assert!(said.contains("core limit 30% (was none)"), "{said}");
    // The share follows within 2 s (docs/live-limits.md): the first second after the change
    // swings (the process's launch cost estimate starts over), the next ones hold it.
    std::thread::sleep(Duration::from_secs(2));
    let after = share(3.0);
    eprintln!("share before {before:.1}%, after {after:.1}%");
    assert!(before > 95.0, "before the change: {before:.1}%");
    assert!((after - 30.0).abs() <= 2.0, "after the change: {after:.1}%");
    drop(w);
}

#[test]
fn a_priority_raised_while_running_puts_the_slice_first_and_lowered_again_shares_evenly() {
    // Shares are measured beside quiet tests only: beside another test's busy processes on a
    // small machine, a slice's own process may not get the CPU to keep the device busy.
    let _turn = cuslice_test_harness::quiet();
    twice(
        a_priority_raised_while_running_puts_the_slice_first_and_lowered_again_shares_evenly_once,
    );
}

fn a_priority_raised_while_running_puts_the_slice_first_and_lowered_again_shares_evenly_once() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let node = tempfile::tempdir().unwrap();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Two busy slices with no core settings.
    let mut wa = start(
        &sim,
        a.path(),
        node.path(),
        &["CUSLICE_MEMORY_LIMIT=2GiB"],
        BUSY,
    );
    let mut wb = start(
        &sim,
        b.path(),
        node.path(),
        &["CUSLICE_MEMORY_LIMIT=2GiB"],
        BUSY,
    );
    let pa = wa.wait_for("start", Duration::from_secs(30))["pid"]
        .as_u64()
        .unwrap();
    let pb = wb.wait_for("start", Duration::from_secs(30))["pid"]
        .as_u64()
        .unwrap();
    let both = |secs: f64| {
        let s = shares(&sim, &[pa, pb], secs);
        (s[0], s[1])
    };
    std::thread::sleep(Duration::from_secs(1));
    let even = both(2.0);
    let said = set_ok(a.path(), node.path(), &["--priority", "high"]);
    assert!(said.contains("priority high (was normal)"), "{said}");
    let st = status(&sim, &[a.path()]);
    assert_eq!(st[0]["compute"]["priority"], "high", "{st:?}");
    assert_eq!(st[0]["compute"]["priority_set_live"], true, "{st:?}");
    std::thread::sleep(Duration::from_secs(2));
    let first = both(3.0);
    set_ok(a.path(), node.path(), &["--priority", "normal"]);
    std::thread::sleep(Duration::from_secs(2));
    let again = both(3.0);
    eprintln!("a/b: normal {even:.1?}, a high {first:.1?}, normal again {again:.1?}");
    assert!(
        (even.0 - even.1).abs() < 20.0,
        "two normal slices: {even:.1?}"
    );
    assert!(
        first.0 > 85.0 && first.1 > 0.0,
        "a high beside b normal: {first:.1?}"
    );
    assert!(
        (again.0 - again.1).abs() < 20.0,
        "back to normal: {again:.1?}"
    );
    drop((wa, wb));
}

#[test]
fn bad_values_and_a_request_past_the_device_are_refused_with_one_line_and_change_nothing() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let node = tempfile::tempdir().unwrap();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut wa = start(
        &sim,
        a.path(),
        node.path(),
        &["CUSLICE_CORE_REQUEST=40", "CUSLICE_MEMORY_LIMIT=1GiB"],
        &["steps", "--bytes", "64MiB"],
    );
    let mut wb = start(
        &sim,
        b.path(),
        node.path(),
        &[
            "CUSLICE_CORE_REQUEST=30",
            "CUSLICE_CORE_LIMIT=50",
            "CUSLICE_MEMORY_LIMIT=1GiB",
        ],
        &["steps", "--bytes", "64MiB"],
    );
    wa.wait_for("ready", Duration::from_secs(30));
    let pid_b = wb.wait_for("ready", Duration::from_secs(30))["pid"]
        .as_u64()
        .unwrap();
    let limits = |s: &Value| {
        (
            s["memory"]["limit"].clone(),
            s["compute"]["request_pct"].clone(),
            s["compute"]["limit_pct"].clone(),
            s["compute"]["priority"].clone(),
        )
    };
    let was: Vec<_> = status(&sim, &[a.path(), b.path()])
        .iter()
        .map(limits)
        .collect();
    let cases: &[(&[&str], &str)] = &[
        (
            &["--core-request", "70", "--core-limit", "80"],
            "at most --core-request 60",
        ),
        (
            &["--memory-limit", "12XB"],
            "--memory-limit \"12XB\" is not a size",
        ),
        (&["--memory-limit", "0"], "--memory-limit \"0\" is 0"),
        (&["--core-limit", "150"], "--core-limit \"150\""),
        (&["--core-limit", "0"], "--core-limit \"0\""),
        (&["--core-request", "abc"], "--core-request \"abc\""),
        (&["--core-request", "55"], "above a core limit of 50%"),
        (&["--core-limit", "20"], "above a core limit of 20%"),
        // A good value with a bad one: nothing at all is changed.
        (
            &["--memory-limit", "2GiB", "--core-limit", "x"],
            "--core-limit \"x\"",
        ),
        (
            &["--priority", "urgent"],
            "--priority \"urgent\" is not a priority (high, normal or low)",
        ),
        (
            &["--priority", "high", "--core-limit", "x"],
            "--core-limit \"x\"",
        ),
        (&[], "nothing to change"),
    ];
    for (args, says) in cases {
        let out = set(b.path(), node.path(), args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
        assert!(err.starts_with("cuslice set: "), "{args:?}: {err}");
        assert!(
            err.contains(says),
            "{args:?}: {err:?} does not say {says:?}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = Command::new(BIN)
        .args(["set", "no-such-slice", "--core-limit", "50"])
        .arg("--state-root")
        .arg("/nonexistent-cuslice-root")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cuslice status"), "{err}");
    let now: Vec<_> = status(&sim, &[a.path(), b.path()])
        .iter()
        .map(limits)
        .collect();
    assert_eq!(now, was, "a refused change changed something");
    // The cap is still 1 GiB for the slice's processes: the 2 GiB of a refused call never applied.
    assert_eq!(step(&mut wb, pid_b)["total"], GIB);
    // What fits is taken: 60 beside 40.
    let said = set_ok(
        b.path(),
        node.path(),
        &["--core-request", "50", "--core-limit", "60"],
    );
    assert!(said.contains("core request 50% (was 30%)"), "{said}");
    let s = &status(&sim, &[b.path()])[0];
    assert_eq!(
        (
            s["compute"]["request_pct"].clone(),
            s["compute"]["limit_pct"].clone()
        ),
        (Value::from(50.0), Value::from(60.0)),
        "{s}"
    );
}

/// Values a shell or a script gets wrong: a negative number, a cap no device holds (2^64-1
/// bytes), 100 kB of text. Each is refused in one line naming the flag, the value (cut
/// short) and a value that works, and changes nothing. A core request of 100 is applied, and
/// what is printed says 100%.
#[test]
fn negative_huge_and_long_values_are_refused_in_one_line_and_a_request_of_100_is_said() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let (dir, node) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut w = start(
        &sim,
        dir.path(),
        node.path(),
        &["CUSLICE_MEMORY_LIMIT=1GiB"],
        &["steps", "--bytes", "64MiB"],
    );
    w.wait_for("ready", Duration::from_secs(30));
    // One argument may be at most 128 KiB (execve's MAX_ARG_STRLEN).
    let long = "9".repeat(100_000);
    let cut = format!("--memory-limit \"{}\"… ({} bytes)", &long[..64], long.len());
    let cases: &[(&[&str], &str, &str)] = &[
        (
            &["--memory-limit", "-1"],
            "--memory-limit \"-1\"",
            "--memory-limit 4GiB",
        ),
        (
            &["--memory-limit", "-1GiB"],
            "--memory-limit \"-1GiB\"",
            "--memory-limit 4GiB",
        ),
        (
            &["--core-limit", "-5"],
            "--core-limit \"-5\"",
            "--core-limit 50",
        ),
        (
            &["--core-request", "-1"],
            "--core-request \"-1\"",
            "--core-request 50",
        ),
        (
            &["--priority", "-1"],
            "--priority \"-1\"",
            "--priority high",
        ),
        (
            &["--memory-limit", "18446744073709551615"],
            "--memory-limit \"18446744073709551615\" is too large",
            "at most 1 PiB",
        ),
        (&["--memory-limit", &long], &cut, "--memory-limit 4GiB"),
    ];
    for (args, says, example) in cases {
        let out = set(dir.path(), node.path(), args);
        let err = String::from_utf8_lossy(&out.stderr);
        let shown = &err[..err.len().min(2000)];
        let what = &args[..1];
        assert_eq!(out.status.code(), Some(2), "{what:?}: {shown}");
        assert_eq!(err.lines().count(), 1, "{what:?}: not one line: {shown}");
        assert!(err.len() < 600, "{what:?}: {} bytes: {shown}", err.len());
        assert!(err.starts_with("cuslice set: "), "{what:?}: {shown}");
        for s in [says, example] {
            assert!(err.contains(s), "{what:?}: {shown:?} does not say {s:?}");
        }
        assert!(out.stdout.is_empty(), "{what:?}");
    }
    let s = &status(&sim, &[dir.path()])[0];
    assert_eq!(
        s["memory"]["limit"], GIB,
        "a refused change changed the cap: {s}"
    );
    let said = set_ok(dir.path(), node.path(), &["--core-request", "100"]);
    assert!(said.contains("core request 100% (was none)"), "{said}");
    let s = &status(&sim, &[dir.path()])[0];
    assert_eq!(s["compute"]["request_pct"], 100.0, "{s}");
    drop(w);
}

/// Two `cuslice set --core-request 60` on two busy slices of one device, started at the same
/// moment, round after round: together they would promise 120% of the device, so one of them
/// must be refused, whichever comes first and however close together. A request written by
/// `cuslice set` reaches the board only at the slice's meters' next period, so without the
/// node's lock and record both would pass the check. After each round the requests `cuslice
/// status` shows add up to 100% at most; the winner is set back to 1% for the next round (its
/// claim on the board still says 60% for up to a period).
#[test]
fn requests_set_at_once_on_two_slices_never_promise_more_than_the_device() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let node = tempfile::tempdir().unwrap();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dirs = [a.path(), b.path()];
    let mut ws: Vec<Running> = dirs
        .iter()
        .map(|d| start(&sim, d, node.path(), &["CUSLICE_MEMORY_LIMIT=2GiB"], BUSY))
        .collect();
    for w in &mut ws {
        w.wait_for("start", Duration::from_secs(30));
    }
    // Both on the board (their meters post every 50 ms once they launch).
    std::thread::sleep(Duration::from_millis(300));
    let request = |s: &Value| s["compute"]["request_pct"].as_f64().unwrap_or(0.0);
    for round in 0..6 {
        let barrier = std::sync::Barrier::new(2);
        let outs: Vec<Output> = std::thread::scope(|s| {
            let hs: Vec<_> = dirs
                .iter()
                .map(|d| {
                    let (barrier, node) = (&barrier, node.path());
                    s.spawn(move || {
                        barrier.wait();
                        set(d, node, &["--core-request", "60"])
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let said: Vec<String> = outs
            .iter()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .collect();
        let won: Vec<usize> = (0..2).filter(|&i| outs[i].status.success()).collect();
        assert_eq!(won.len(), 1, "round {round}: {said:?}");
        let lost = 1 - won[0];
        let err = String::from_utf8_lossy(&outs[lost].stderr);
        assert_eq!(outs[lost].status.code(), Some(2), "round {round}: {err}");
        assert_eq!(err.lines().count(), 1, "round {round}: {err}");
        assert!(
            err.contains("a core request of 60% would take device") && err.contains("past 100%"),
            "round {round}: {err}"
        );
        let st = status(&sim, &dirs);
        let (r0, r1) = (request(&st[0]), request(&st[1]));
        assert_eq!(
            [r0, r1][won[0]],
            60.0,
            "round {round}: the winner's request: {st:?}"
        );
        assert!(r0 + r1 <= 100.0, "round {round}: {r0}% + {r1}%");
        set_ok(dirs[won[0]], node.path(), &["--core-request", "1"]);
    }
    drop(ws);
}
