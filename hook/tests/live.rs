//! `cuslice set` on running containers, with runc and with Podman: a cap lowered or raised holds
//! at the container's next allocation (and cuMemGetInfo in the container says so), a core limit
//! raised from 30 to 60 is followed, and refused changes (a bad value, a request past the
//! device) leave the hook file, the ledger and the container as they were. Ground truth from
//! the simulator (what the container's process holds, the device time it used).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use cuslice_test_engines as engines;
use cuslice_test_engines::runc::{RuncContainer, bundle};
use cuslice_test_engines::*;
use cuslice_test_harness::{GIB, MIB, Sim, bin_dir};
use serde_json::Value;

struct Runc;

impl Engine for Runc {
    fn run(&self, sim: &Sim, spec: &Spec<'_>) -> Output {
        let b = bundle(sim, spec, &[]);
        let out = Command::new("runc")
            .args(["run", spec.name])
            .current_dir(&b.path)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let _ = Command::new("runc")
            .args(["delete", "--force", spec.name])
            .output();
        out
    }
    fn spawn(&self, sim: &Sim, spec: &Spec<'_>) -> Box<dyn Container + '_> {
        Box::new(RuncContainer::start(sim, spec, &[]))
    }
}

/// `cuslice set TARGET ARGS` on the hook's state root.
fn set(target: &str, args: &[&str]) -> Output {
    Command::new(bin_dir().join("cuslice"))
        .arg("set")
        .arg(target)
        .args(args)
        .output()
        .unwrap()
}

fn set_ok(target: &str, args: &[&str]) -> String {
    let out = set(target, args);
    assert!(
        out.status.success(),
        "cuslice set {target} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One SIGUSR1 to the container's `steps` process (its init): its `step` line.
fn step(c: &mut dyn Container) -> Value {
    let ok = Command::new("kill")
        .arg("-USR1")
        .arg(c.host_pid().to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -USR1 {}", c.host_pid());
    wait_for(c, "step")
}

fn config(id: &str) -> String {
    std::fs::read_to_string(slice_dir(id).join("mnt/slice/config")).unwrap()
}

const STEPS: &[&str] = &["cuda-workload", "steps", "--bytes", "256MiB"];

fn live_cap(engine: &dyn Engine) {
    let _turn = agent_turn();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let _agent = NodeAgent::start(&sim);
    let n = name("live-cap");
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: STEPS,
            read_only: false,
        },
    );
    let ready = wait_for(&mut *c, "ready");
    assert_eq!(ready["total"], GIB, "{ready}");
    let id = c.id();
    let mut last = step(&mut *c);
    for _ in 0..8 {
        if last["ok"] == false {
            break;
        }
        last = step(&mut *c);
    }
    assert_eq!(last["code"], 2, "never refused under a 1 GiB cap: {last}");
    let (before, _) = held_by(&sim, c.host_pid());
    assert!(before <= GIB, "held {before}");

    let said = set_ok(&id, &["--memory-limit", "2GiB"]);
    assert!(said.contains("memory limit 2 GiB (was 1 GiB)"), "{said}");
    let raised = step(&mut *c);
    assert_eq!(
        raised["ok"], true,
        "refused after the cap was raised: {raised}"
    );
    assert_eq!(raised["total"], 2 * GIB, "{raised}");
    let (after, _) = held_by(&sim, c.host_pid());
    assert!(
        after >= before + 256 * MIB && after <= 2 * GIB,
        "simulator: held {before} before, {after} after"
    );
    assert!(
        config(&id).contains("CUSLICE_MEMORY_LIMIT=2GiB"),
        "{}",
        config(&id)
    );
    let s = slice_in(&status_json(&sim), &id);
    assert_eq!(s["memory"]["limit"], 2 * GIB, "{s}");

    let said = set_ok(&id, &["--memory-limit", "512MiB"]);
    assert!(said.contains("refused until it is under"), "{said}");
    let lowered = step(&mut *c);
    assert_eq!(lowered["code"], 2, "{lowered}");
    assert_eq!(lowered["total"], 512 * MIB, "{lowered}");
    assert_eq!(lowered["free"], 0, "{lowered}");
    assert_eq!(
        held_by(&sim, c.host_pid()).0,
        after,
        "memory was freed behind the application"
    );
    let s = slice_in(&status_json(&sim), &id);
    assert_eq!(s["memory"]["limit"], 512 * MIB, "{s}");
    // The node agent checks the slice against the new cap (from the hook file it reads again):
    // over it by the driver's count, and nothing is done about it (it was lowered under what
    // the slice held).
    let f = poll("the agent's finding against the lowered cap", || {
        status_json(&sim)["findings"]["findings"]
            .as_array()?
            .iter()
            .find(|f| f["slice"] == id.as_str() && f["kind"] == "memory")
            .filter(|f| f["cap_bytes"] == 512 * MIB)
            .cloned()
    });
    assert_eq!(f["driver_bytes"], after, "{f}");
    c.remove();
}

fn device_ns(sim: &Sim, pid: i32) -> u64 {
    let d = sim.device(0);
    ["processes", "exited"]
        .iter()
        .flat_map(|k| d[*k].as_array().cloned().unwrap_or_default())
        .find(|p| p["pid"] == pid)
        .map_or(0, |p| p["device_time_ns"].as_u64().unwrap())
}

fn live_core(engine: &dyn Engine) {
    let _serial = cuslice_test_harness::serial();
    let _turn = agent_turn();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let _agent = NodeAgent::start(&sim);
    let n = name("live-core");
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_CORE_LIMIT=30"],
            cmd: &[
                "cuda-workload",
                "launch",
                "--ns-per-block",
                "1000",
                "--blocks",
                "1000",
                "--secs",
                "40",
            ],
            read_only: false,
        },
    );
    wait_for(&mut *c, "start");
    let (id, pid) = (c.id(), c.host_pid());
    // Judged by its share: ahead of the machine's other work, as in `cuslice set`'s own tests
    // (install/tests/set.rs; docs/testing.md, "What runs beside what").
    cuslice_test_harness::put_ahead(pid);
    let share = |secs: f64| {
        let (t0, d0) = (Instant::now(), device_ns(&sim, pid));
        std::thread::sleep(Duration::from_secs_f64(secs));
        let (t1, d1) = (Instant::now(), device_ns(&sim, pid));
        100.0 * (d1 - d0) as f64 / (t1 - t0).as_nanos() as f64
    };
    std::thread::sleep(Duration::from_secs(3));
    let before = share(3.0);
    let changed = Instant::now();
    let said = set_ok(&id, &["--core-limit", "60"]);
    assert!(said.contains("core limit 60% (was 30%)"), "{said}");
    let mut windows = Vec::new();
    while changed.elapsed() < Duration::from_secs(6) {
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
    let s = slice_in(&status_json(&sim), &id);
    c.remove();
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
    assert_eq!(s["compute"]["limit_pct"], 60.0, "{s}");
}

fn live_refusals(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let (na, nb) = (name("live-a"), name("live-b"));
    let mut a = engine.spawn(
        &sim,
        &Spec {
            name: &na,
            env: &["CUSLICE_CORE_REQUEST=40", "CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: STEPS,
            read_only: false,
        },
    );
    let mut b = engine.spawn(
        &sim,
        &Spec {
            name: &nb,
            env: &[
                "CUSLICE_CORE_REQUEST=30",
                "CUSLICE_CORE_LIMIT=50",
                "CUSLICE_MEMORY_LIMIT=1GiB",
            ],
            cmd: STEPS,
            read_only: false,
        },
    );
    wait_for(&mut *a, "ready");
    wait_for(&mut *b, "ready");
    let id = b.id();
    let limits = |s: &Value| {
        (
            s["memory"]["limit"].clone(),
            s["compute"]["request_pct"].clone(),
            s["compute"]["limit_pct"].clone(),
        )
    };
    let was = limits(&slice_in(&status_json(&sim), &id));
    let file = config(&id);
    let cases: &[(&[&str], &str)] = &[
        (
            &["--core-request", "70", "--core-limit", "80"],
            "at most --core-request 60",
        ),
        (&["--memory-limit", "12XB"], "is not a size"),
        (&["--core-limit", "150"], "--core-limit \"150\""),
        (&["--core-request", "55"], "core request"),
        (
            &["--memory-limit", "2GiB", "--core-limit", "x"],
            "--core-limit \"x\"",
        ),
    ];
    for (args, says) in cases {
        let out = set(&id, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
        assert!(
            err.contains(says),
            "{args:?}: {err:?} does not say {says:?}"
        );
    }
    assert_eq!(config(&id), file, "a refused change rewrote the hook file");
    assert_eq!(limits(&slice_in(&status_json(&sim), &id)), was);
    assert_eq!(step(&mut *b)["total"], GIB);
    a.remove();
    b.remove();
}

/// One SIGUSR1 to the `steps` process `host_pid` of the container: its `step` line.
fn step_pid(c: &mut dyn Container, host_pid: i64) -> Value {
    let ok = Command::new("kill")
        .arg("-USR1")
        .arg(host_pid.to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -USR1 {host_pid}");
    wait_for(c, "step")
}

/// What the simulator says process `host_pid` holds on device `dev`.
fn held_on(sim: &Sim, dev: usize, host_pid: i64) -> u64 {
    let d = sim.device(dev);
    d["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == host_pid)
        .unwrap_or_else(|| panic!("simgpu lists no process {host_pid} on device {dev}: {d}"))["held"]
        .as_u64()
        .unwrap()
}

/// Container `id`'s memory cap on the device `uuid` in a `cuslice status --json` view.
fn cap_on(view: &Value, uuid: &str, id: &str) -> Value {
    view["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["uuid"] == uuid)
        .and_then(|d| d["slices"].as_array()?.iter().find(|s| s["slice"] == id))
        .unwrap_or_else(|| panic!("container {id} not on {uuid} in {view}"))["memory"]["limit"]
        .clone()
}

/// `cuslice set --device` on a container with a process on each of two devices, both capped at
/// 1 GiB: device 1 raised to 2 GiB by its index, then device 0 lowered to 768 MiB by its UUID.
/// By the simulator's count each change holds on its device alone; the hook file, `cuslice
/// status` and the lines `set` prints say the same; a device the slice does not have, or a
/// priority for one device, is refused in one line and changes nothing.
fn live_device_cap(engine: &dyn Engine) {
    let sim = Sim::new(&["--devices", "2", "--memory", "8GiB"]);
    let n = name("live-device");
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &[
                "sh",
                "-c",
                "cuda-workload --device 1 steps --bytes 256MiB & \
                 exec cuda-workload steps --bytes 256MiB",
            ],
            read_only: false,
        },
    );
    wait_for(&mut *c, "ready");
    wait_for(&mut *c, "ready");
    let id = c.id();
    let p0 = i64::from(c.host_pid());
    let on_1 = poll("the process on device 1", || {
        sim.device(1)["processes"]
            .as_array()?
            .iter()
            .find_map(|p| p["pid"].as_i64())
    });
    let uuid = |d: usize| sim.device(d)["uuid"].as_str().unwrap().to_string();
    // Each process up to the cap on its device.
    for p in [p0, on_1] {
        let mut last = step_pid(&mut *c, p);
        for _ in 0..8 {
            if last["ok"] == false {
                break;
            }
            last = step_pid(&mut *c, p);
        }
        assert_eq!(last["code"], 2, "never refused under a 1 GiB cap: {last}");
    }
    let (held0, held1) = (held_on(&sim, 0, p0), held_on(&sim, 1, on_1));
    assert!(held0 <= GIB && held1 <= GIB, "held {held0}, {held1}");

    // Device 1 by its index: raised there alone.
    let said = set_ok(&id, &["--device", "1", "--memory-limit", "2GiB"]);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.contains(&format!("on {}: memory limit 2 GiB (was 1 GiB)", uuid(1))),
        "{said}"
    );
    let raised = step_pid(&mut *c, on_1);
    assert_eq!(
        raised["ok"], true,
        "device 1 refused after its cap was raised: {raised}"
    );
    assert_eq!(raised["total"], 2 * GIB, "{raised}");
    let still = step_pid(&mut *c, p0);
    assert_eq!(still["code"], 2, "device 0 took more: {still}");
    assert_eq!(still["total"], GIB, "{still}");
    let after1 = held_on(&sim, 1, on_1);
    assert!(
        after1 >= held1 + 256 * MIB && after1 <= 2 * GIB,
        "simulator, device 1: held {held1} before, {after1} after"
    );
    assert_eq!(held_on(&sim, 0, p0), held0, "simulator, device 0");
    eprintln!(
        "{said}simulator: device 0 held {held0} before and after; device 1 held {held1} before, \
         {after1} after"
    );
    let file = config(&id);
    assert!(
        file.contains("CUSLICE_MEMORY_LIMIT=1GiB\n")
            && file.contains("CUSLICE_MEMORY_LIMIT_1=2GiB\n"),
        "{file}"
    );
    let view = status_json(&sim);
    assert_eq!(
        (cap_on(&view, &uuid(0), &id), cap_on(&view, &uuid(1), &id)),
        (Value::from(GIB), Value::from(2 * GIB)),
        "{view}"
    );
    // The table: under device 1 the new cap, marked as changed live; under device 0 the old.
    let table = output_of(&mut sim.command(&bin_dir().join("cuslice"), &["status"]));
    let under = |d: usize| {
        let start = table.find(&uuid(d)).unwrap_or_else(|| panic!("{table}"));
        let rest = &table[start + 1..];
        let end = [uuid(0), uuid(1)]
            .iter()
            .filter_map(|u| rest.find(u.as_str()))
            .min()
            .unwrap_or(rest.len());
        rest[..end].to_string()
    };
    assert!(under(1).contains(" 2 GiB*"), "{table}");
    assert!(
        under(0).contains(" 1 GiB ") && !under(0).contains("GiB*"),
        "{table}"
    );

    // Device 0 by its UUID: lowered below what it holds there, device 1 unchanged.
    let said = set_ok(&id, &["--device", &uuid(0), "--memory-limit", "768MiB"]);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.contains(&format!("on {}: memory limit 768 MiB", uuid(0))),
        "{said}"
    );
    let lowered = step_pid(&mut *c, p0);
    assert_eq!(
        (lowered["code"].clone(), lowered["total"].clone()),
        (Value::from(2), Value::from(768 * MIB)),
        "{lowered}"
    );
    assert_eq!(
        held_on(&sim, 0, p0),
        held0,
        "memory was freed behind the application"
    );
    let more = step_pid(&mut *c, on_1);
    assert_eq!(
        (more["ok"].clone(), more["total"].clone()),
        (Value::Bool(true), Value::from(2 * GIB)),
        "{more}"
    );
    assert!(held_on(&sim, 1, on_1) <= 2 * GIB);
    let view = status_json(&sim);
    assert_eq!(
        (cap_on(&view, &uuid(0), &id), cap_on(&view, &uuid(1), &id)),
        (Value::from(768 * MIB), Value::from(2 * GIB)),
        "{view}"
    );

    // Refusals: one line each, the hook file as it was.
    let file = config(&id);
    let bad_uuid = "GPU-ffffffff-ffff-4fff-bfff-ffffffffffff";
    for (args, says) in [
        (
            &["--device", "2", "--memory-limit", "1GiB"][..],
            "has no device 2; its devices are 0: ",
        ),
        (
            &["--device", bad_uuid, "--memory-limit", "1GiB"][..],
            "has no device \"gpu-ffffffff",
        ),
        (
            &["--device", "first", "--memory-limit", "1GiB"][..],
            "neither a device index nor a GPU UUID",
        ),
        (
            &["--device", "1", "--priority", "high"][..],
            "--priority is the slice's on every device",
        ),
    ] {
        let out = set(&id, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
        assert!(
            err.contains(says),
            "{args:?}: {err:?} does not say {says:?}"
        );
    }
    assert!(
        set(&id, &["--device", "2", "--memory-limit", "1GiB"])
            .stdout
            .is_empty()
    );
    assert_eq!(config(&id), file, "a refused change rewrote the hook file");
    c.remove();
}

/// A container given GPUs 3 and 1 (`CUDA_VISIBLE_DEVICES=3,1`), each with its own cap
/// (`CUSLICE_MEMORY_LIMIT_0=1GiB` for GPU 3, `_1=2GiB` for GPU 1), whose one process lists the
/// two the other way round for itself and uses GPU 3 as its device 1. It is held to GPU 3's cap,
/// 1 GiB, not its device 1's ordinal's; `cuslice set --device <GPU 3's UUID>` raises GPU 3's
/// cap, which the hook file keeps as the container's device 0 (the process registered GPU 3
/// second), and the process then holds 1.5 GiB there by the simulator's count, GPU 1 untouched.
fn live_cap_of_a_gpu_listed_in_another_order(engine: &dyn Engine) {
    let sim = Sim::new(&["--devices", "4", "--memory", "8GiB"]);
    let n = name("live-order");
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &scenarios::GPUS_3_AND_1,
            cmd: &[
                "sh",
                "-c",
                "CUDA_VISIBLE_DEVICES=1,3 exec cuda-workload --device 1 steps --bytes 256MiB",
            ],
            read_only: false,
        },
    );
    let ready = wait_for(&mut *c, "ready");
    assert_eq!(
        ready["total"], GIB,
        "GPU 3 as the process's device 1: {ready}"
    );
    let id = c.id();
    let pid = i64::from(c.host_pid());
    let mut last = step(&mut *c);
    for _ in 0..8 {
        if last["ok"] == false {
            break;
        }
        last = step(&mut *c);
    }
    assert_eq!(
        last["code"], 2,
        "never refused under GPU 3's 1 GiB cap: {last}"
    );
    let before = held_on(&sim, 3, pid);
    assert!(before <= GIB, "GPU 3 held {before}");
    let uuid = |d: usize| sim.device(d)["uuid"].as_str().unwrap().to_string();
    // Run where the simulated NVML answers: the container's numbering comes from it.
    let out = sim
        .command(
            &bin_dir().join("cuslice"),
            &[
                "set",
                &id,
                "--device",
                &uuid(3),
                "--memory-limit",
                "1536MiB",
            ],
        )
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains(&format!("on {}: memory limit 1.5 GiB (was 1 GiB)", uuid(3))),
        "{said}"
    );
    let file = config(&id);
    assert!(
        file.contains("CUSLICE_MEMORY_LIMIT_0=1536MiB\n")
            && file.contains("CUSLICE_MEMORY_LIMIT_1=2GiB\n"),
        "{file}"
    );
    let raised = step(&mut *c);
    assert_eq!(
        raised["ok"], true,
        "refused after GPU 3's cap was raised: {raised}"
    );
    assert_eq!(raised["total"], 1536 * MIB, "{raised}");
    let after = held_on(&sim, 3, pid);
    assert!(
        after > before && after <= 1536 * MIB,
        "simulator, GPU 3: held {before} before, {after} after"
    );
    assert!(
        sim.device(1)["processes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["held"].as_u64().unwrap_or(0) < GIB),
        "GPU 1: {}",
        sim.device(1)
    );
    c.remove();
}

/// `cuslice agent --enforce stop` under the simulator, stopped when dropped.
struct StopAgent(std::process::Child, cuslice_test_harness::Stderr);

impl StopAgent {
    fn start(sim: &Sim) -> StopAgent {
        let mut child = sim
            .command(
                &bin_dir().join("cuslice"),
                &[
                    "agent",
                    "--state-root",
                    STATE_ROOT,
                    "--enforce",
                    "stop",
                    "--grace",
                    "0.5",
                    "--period",
                    "0.2",
                ],
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = cuslice_test_harness::Stderr::capture(&mut child);
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert!(
            line.starts_with("cuslice agent: listening on"),
            "cuslice agent did not start: {line:?}; stderr: {}",
            err.text()
        );
        StopAgent(child, err)
    }
}

impl Drop for StopAgent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while cuslice_state::agent::ask(&agent_socket(), Duration::from_secs(1)).is_ok()
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Under `cuslice agent --enforce stop`, a cap lowered below what the container holds kills
/// nothing: the process answers long past the grace, still holding what it held (by the
/// simulator), and is refused more.
fn lowered_under_stop(engine: &dyn Engine) {
    let _turn = agent_turn();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let agent = StopAgent::start(&sim);
    let n = name("live-stop");
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: STEPS,
            read_only: false,
        },
    );
    wait_for(&mut *c, "ready");
    let id = c.id();
    assert_eq!(step(&mut *c)["ok"], true);
    assert_eq!(step(&mut *c)["ok"], true);
    let (before, _) = held_by(&sim, c.host_pid());
    set_ok(&id, &["--memory-limit", "256MiB"]);
    // The agent's finding shows it judged the slice against the new cap.
    let f = poll("the agent's finding against the lowered cap", || {
        status_json(&sim)["findings"]["findings"]
            .as_array()?
            .iter()
            .find(|f| f["slice"] == id.as_str() && f["kind"] == "memory")
            .filter(|f| f["cap_bytes"] == 256 * MIB)
            .cloned()
    });
    // Five times the grace.
    std::thread::sleep(Duration::from_millis(2500));
    let refused = step(&mut *c);
    assert_eq!(refused["code"], 2, "{refused}");
    assert_eq!(held_by(&sim, c.host_pid()).0, before, "{f}");
    let log = agent.1.text();
    assert!(!log.contains("killed pid"), "the agent killed: {log}");
    c.remove();
}

#[test]
fn runc_cap_changed_while_running() {
    root_required();
    live_cap(&Runc);
}

#[test]
fn runc_core_limit_30_to_60_while_running() {
    root_required();
    cuslice_test_harness::twice(|| live_core(&Runc));
}

#[test]
fn runc_refused_changes_change_nothing() {
    root_required();
    live_refusals(&Runc);
}

#[test]
fn podman_cap_changed_while_running() {
    root_required();
    live_cap(engines::podman::engine());
}

#[test]
fn podman_core_limit_30_to_60_while_running() {
    root_required();
    cuslice_test_harness::twice(|| live_core(engines::podman::engine()));
}

#[test]
fn podman_refused_changes_change_nothing() {
    root_required();
    live_refusals(engines::podman::engine());
}

#[test]
fn runc_one_devices_cap_changed_while_running() {
    root_required();
    live_device_cap(&Runc);
}

#[test]
fn podman_one_devices_cap_changed_while_running() {
    root_required();
    live_device_cap(engines::podman::engine());
}

#[test]
fn runc_cap_lowered_under_enforce_stop_kills_nothing() {
    root_required();
    lowered_under_stop(&Runc);
}

#[test]
fn podman_cap_lowered_under_enforce_stop_kills_nothing() {
    root_required();
    lowered_under_stop(engines::podman::engine());
}

#[test]
fn runc_cap_of_a_gpu_listed_in_another_order_changed_while_running() {
    root_required();
    live_cap_of_a_gpu_listed_in_another_order(&Runc);
}
