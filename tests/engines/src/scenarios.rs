//! The scenarios every engine runs, each judged by the simulator or the engine:
//! [`engine_scenarios!`](crate::engine_scenarios) makes them the `#[test]`s of an engine's test
//! binary.

use std::time::Duration;

use cuslice_test_harness::{GIB, MIB, Sim, bin_dir};
use serde_json::Value;

use crate::*;

const FILL: &[&str] = &[
    "cuda-workload",
    "fill",
    "--family",
    "mem",
    "--chunk",
    "64MiB",
    "--hold",
    "60",
];

/// The shared scenarios as `#[test]`s of the calling engine's test binary.
#[macro_export]
macro_rules! engine_scenarios {
    ($engine:expr) => {
        #[test]
        fn held_to_its_cap() {
            $crate::root_required();
            $crate::held_to_cap($engine);
        }
        #[test]
        fn two_containers_two_caps() {
            $crate::root_required();
            $crate::two_caps($engine);
        }
        #[test]
        fn bad_value_stops_the_container() {
            $crate::root_required();
            $crate::bad_value($engine);
        }
        #[test]
        fn settings_that_would_do_nothing_are_refused() {
            $crate::root_required();
            $crate::scenarios::settings_that_would_do_nothing($engine);
        }
        #[test]
        fn container_without_settings_is_untouched() {
            $crate::root_required();
            $crate::untouched($engine);
        }
        #[test]
        fn limits_cannot_be_lifted_from_inside() {
            $crate::root_required();
            $crate::cannot_lift($engine);
        }
        #[test]
        fn state_gone_after_stop_and_sigkill() {
            $crate::root_required();
            $crate::state_gone($engine);
        }
        #[test]
        fn status_shows_the_container() {
            $crate::root_required();
            $crate::status_shows($engine);
        }
        #[test]
        fn the_agent_tells_container_processes_their_host_pids() {
            $crate::root_required();
            $crate::agent_tells_host_pids($engine);
        }
        #[test]
        fn reordered_gpus_are_capped_and_shown_by_uuid() {
            $crate::root_required();
            $crate::scenarios::reordered_gpus_capped_by_uuid($engine);
        }
        #[test]
        fn without_the_agent_the_container_runs_with_one_warning() {
            $crate::root_required();
            $crate::without_agent($engine);
        }
    };
}

/// A container with CUSLICE_MEMORY_LIMIT=1GiB sees a 1 GiB device and is refused past it; the
/// simulator confirms it never held more.
pub fn held_to_cap(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("cap");
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: FILL,
            read_only: false,
        },
    );
    let start = wait_for(&mut *c, "start");
    assert_eq!(
        start["total"], GIB,
        "the device as the container sees it: {start}"
    );
    let refused = wait_for(&mut *c, "refused");
    assert_eq!(refused["code"], 2, "{refused}");
    wait_for(&mut *c, "holding");
    let (used, peak) = held_by(&sim, c.host_pid());
    assert!(
        peak <= GIB && used <= GIB,
        "held {used}, peak {peak} > 1 GiB"
    );
    assert!(
        used >= GIB - 128 * MIB,
        "refused while 128 MiB more fitted: held {used}"
    );
    assert!(slice_dir(&c.id()).join("mnt/slice/ledger").exists());
    c.remove();
}

/// The environment of a container given physical GPUs 3 and 1, in that order, each with a cap of
/// its own: 1 GiB on GPU 3 (its device 0), 2 GiB on GPU 1 (its device 1).
pub const GPUS_3_AND_1: [&str; 3] = [
    "CUDA_VISIBLE_DEVICES=3,1",
    "CUSLICE_MEMORY_LIMIT_0=1GiB",
    "CUSLICE_MEMORY_LIMIT_1=2GiB",
];

/// A container given physical GPUs 3 and 1, in that order (`CUDA_VISIBLE_DEVICES=3,1`: it sees
/// them as 0 and 1), with a cap per ordinal (`CUSLICE_MEMORY_LIMIT_0=1GiB`, `_1=2GiB`), fills
/// each from a process of its own, beside the node agent. The process that fills GPU 3 lists the
/// two the other way round for itself (`CUDA_VISIBLE_DEVICES=1,3`, so GPU 3 is its device 1):
/// the caps stay with the GPUs. By the simulator's count GPU 3 holds at most 1 GiB of it and GPU
/// 1 at most 2 GiB (each nearly all), GPUs 0 and 2 nothing; `cuslice status`, `cuslice top` and
/// the exporter give each cap to the right GPU's UUID, and the agent, which reads the same
/// settings against the driver, finds nothing wrong.
pub fn reordered_gpus_capped_by_uuid(engine: &dyn Engine) {
    let _turn = super::agent_turn();
    let sim = Sim::new(&["--devices", "4", "--memory", "8GiB"]);
    let _agent = super::NodeAgent::start(&sim);
    let n = name("reordered");
    let fill =
        |d: u32| format!("cuda-workload --device {d} fill --family mem --chunk 64MiB --hold 60");
    let script = format!("CUDA_VISIBLE_DEVICES=1,3 {} & exec {}", fill(1), fill(1));
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &GPUS_3_AND_1,
            cmd: &["sh", "-c", &script],
            read_only: false,
        },
    );
    wait_for(&mut *c, "holding");
    wait_for(&mut *c, "holding");
    let id = c.id();
    // What each physical GPU holds of the container's processes, by the simulator's count.
    let holds = |d: usize| -> Vec<(u64, u64)> {
        sim.device(d)["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["held"].as_u64().unwrap_or(0) > 0)
            .map(|p| (p["held"].as_u64().unwrap(), p["peak"].as_u64().unwrap()))
            .collect()
    };
    for (d, cap) in [(3, GIB), (1, 2 * GIB)] {
        let h = holds(d);
        assert_eq!(h.len(), 1, "GPU {d}: {h:?}");
        let (held, peak) = h[0];
        assert!(
            peak <= cap && held >= cap - 128 * MIB,
            "GPU {d} (cap {cap}): held {held}, peak {peak}"
        );
    }
    for d in [0, 2] {
        assert!(holds(d).is_empty(), "GPU {d} holds the container's memory");
    }
    // The node's view, by UUID.
    let uuid = |d: usize| sim.device(d)["uuid"].as_str().unwrap().to_string();
    let view = status_json(&sim);
    // `cuslice top --json`'s first view, too.
    let top_view = top_json(&sim, &[]);
    let in_view = |view: &Value, u: &str| -> Option<Value> {
        view["devices"]
            .as_array()?
            .iter()
            .find(|dev| dev["uuid"] == u)?["slices"]
            .as_array()?
            .iter()
            .find(|s| s["slice"] == id.as_str())
            .cloned()
    };
    for (tool, view) in [("status", &view), ("top", &top_view)] {
        for (d, cap) in [(3, GIB), (1, 2 * GIB)] {
            let s = in_view(view, &uuid(d))
                .unwrap_or_else(|| panic!("{tool}: GPU {d} does not show the slice: {view}"));
            assert_eq!(s["memory"]["limit"], cap, "{tool}: GPU {d}: {s}");
        }
        for d in [0, 2] {
            assert!(
                in_view(view, &uuid(d)).is_none(),
                "{tool}: GPU {d} shows the slice: {view}"
            );
        }
    }
    let metrics = scrape(&sim, std::path::Path::new(STATE_ROOT));
    for (d, cap) in [(3, GIB), (1, 2 * GIB)] {
        let key = format!(
            "cuslice_slice_memory_limit_bytes{{uuid=\"{}\",slice=\"{id}\"",
            uuid(d)
        );
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with(&key) && l.ends_with(&format!(" {cap}"))),
            "no {key}... {cap} in:\n{metrics}"
        );
    }
    let findings = &view["findings"]["findings"];
    assert_eq!(
        findings.as_array().map_or(0, Vec::len),
        0,
        "the agent's findings: {findings}"
    );
    c.remove();
}

/// Two containers on one device, caps 1 GiB and 2 GiB, filling at the same time.
pub fn two_caps(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let (n1, n2) = (name("one"), name("two"));
    let mut a = engine.spawn(
        &sim,
        &Spec {
            name: &n1,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: FILL,
            read_only: false,
        },
    );
    let mut b = engine.spawn(
        &sim,
        &Spec {
            name: &n2,
            env: &["CUSLICE_MEMORY_LIMIT=2GiB"],
            cmd: FILL,
            read_only: false,
        },
    );
    wait_for(&mut *a, "holding");
    wait_for(&mut *b, "holding");
    let (ua, pa) = held_by(&sim, a.host_pid());
    let (ub, pb) = held_by(&sim, b.host_pid());
    assert!(
        pa <= GIB && ua >= GIB - 128 * MIB,
        "first: held {ua}, peak {pa}"
    );
    assert!(
        pb <= 2 * GIB && ub >= 2 * GIB - 128 * MIB,
        "second: held {ub}, peak {pb}"
    );
    a.remove();
    b.remove();
}

/// `CUSLICE_MEMORY_LIMIT=12XB` stops the container; the engine's output names the variable.
pub fn bad_value(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("bad");
    let out = engine.run(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=12XB"],
            cmd: &["echo", "STARTED"],
            read_only: false,
        },
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "started anyway: {all}");
    assert!(!all.contains("STARTED"), "{all}");
    assert!(
        all.contains("CUSLICE_MEMORY_LIMIT=\\\"12XB\\\"")
            || all.contains("CUSLICE_MEMORY_LIMIT=\"12XB\""),
        "the engine's output does not name the variable and value: {all}"
    );
    assert!(
        all.contains("CUSLICE_MEMORY_LIMIT=4GiB"),
        "no example in: {all}"
    );
    assert!(!slice_dir(&n).exists(), "state left behind");
}

/// Settings that would otherwise do nothing, each refused in one line naming it with an example:
/// a name in lower case and a decimal unit by the hook (the container is not started); a cap
/// for device 1 of a one-GPU container, and a cap smaller than one CUDA context, by the library
/// inside (CUDA is refused; the simulator shows nothing held).
pub fn settings_that_would_do_nothing(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB", "--context-overhead", "300MiB"]);
    let said = |env: &str, cmd: &[&str]| {
        let n = name("nothing");
        let out = engine.run(
            &sim,
            &Spec {
                name: &n,
                env: &[env],
                cmd,
                read_only: false,
            },
        );
        // runc's log line escapes the quotes of the hook's message.
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .replace("\\\"", "\"");
        assert!(!slice_dir(&n).exists(), "state left behind");
        (out.status.success(), all)
    };
    for (env, says) in [
        (
            "cuslice_memory_limit=1GiB",
            "cuslice_memory_limit=\"1GiB\" is not a cuslice variable, so it would do nothing; \
             CUSLICE_MEMORY_LIMIT is (names are upper case, with underscores); write e.g. \
             CUSLICE_MEMORY_LIMIT=1GiB",
        ),
        (
            "CUSLICE_MEMORY_LIMIT=1.5GB",
            "CUSLICE_MEMORY_LIMIT=\"1.5GB\" is ambiguous: GB is 10^9 bytes to some readers and \
             2^30 to others; write e.g. CUSLICE_MEMORY_LIMIT=1.5GiB",
        ),
    ] {
        let (ok, all) = said(env, &["echo", "STARTED"]);
        assert!(
            !ok && !all.contains("STARTED"),
            "{env}: started anyway: {all}"
        );
        assert!(
            all.contains(says),
            "{env}: the engine's output does not say {says:?}: {all}"
        );
    }
    for (env, says) in [
        (
            "CUSLICE_MEMORY_LIMIT_1=1GiB",
            "CUSLICE_MEMORY_LIMIT_1=\"1GiB\" names device 1, but this process sees 1 CUDA \
             device (device 0), so it would apply to none; write e.g. \
             CUSLICE_MEMORY_LIMIT_0=1GiB (device 0) or CUSLICE_MEMORY_LIMIT=1GiB (every device)",
        ),
        (
            "CUSLICE_MEMORY_LIMIT=4096",
            "is smaller than one CUDA context on device 0 (300 MiB, what the slice's first \
             context there took)",
        ),
    ] {
        let (_, all) = said(env, &["cuda-workload", "info"]);
        assert!(
            all.contains(says),
            "{env}: the container's output does not say {says:?}: {all}"
        );
        assert!(
            !all.contains("\"event\":\"info\""),
            "{env}: CUDA ran: {all}"
        );
        assert_eq!(sim.device(0)["used"], 0, "{env}: memory left on the device");
    }
}

/// A cap no device holds (2^64-1 bytes, which would be no cap at all) and a 100 kB value are
/// refused in one line naming the variable, the value (cut short) and what would work.
pub fn too_large_or_too_long(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let digits = "9".repeat(100_000);
    let long = format!("CUSLICE_MEMORY_LIMIT={digits}XB");
    let cut = format!(
        "CUSLICE_MEMORY_LIMIT=\"{}\"… ({} bytes)",
        &digits[..64],
        digits.len() + 2
    );
    let cases: [(&str, [&str; 2]); 2] = [
        (
            "CUSLICE_MEMORY_LIMIT=18446744073709551615",
            [
                "CUSLICE_MEMORY_LIMIT=\"18446744073709551615\" is too large",
                "at most 1 PiB",
            ],
        ),
        (&long, [&cut, "CUSLICE_MEMORY_LIMIT=4GiB"]),
    ];
    for (env, says) in cases {
        let n = name("bad");
        let out = engine.run(
            &sim,
            &Spec {
                name: &n,
                env: &[env],
                cmd: &["echo", "STARTED"],
                read_only: false,
            },
        );
        // runc's log line escapes the quotes of the hook's message.
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .replace("\\\"", "\"");
        let shown = &all[..all.len().min(2000)];
        assert!(!out.status.success(), "started anyway: {shown}");
        assert!(!all.contains("STARTED"), "{shown}");
        assert!(
            all.len() < 4000,
            "the engine's output is {} bytes: {shown}",
            all.len()
        );
        for s in says {
            assert!(all.contains(s), "{shown} does not say {s:?}");
        }
        assert!(!slice_dir(&n).exists(), "state left behind");
    }
}

/// A container without cuslice settings: no preload, no slice, full device.
pub fn untouched(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("plain");
    let out = engine.run(
        &sim,
        &Spec {
            name: &n,
            env: &[],
            cmd: &[
                "sh",
                "-c",
                "cat /etc/ld.so.preload 2>&1; ls /run/cuslice 2>&1; cuda-workload info",
            ],
            read_only: false,
        },
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("libcuslice"), "{text}");
    assert!(
        text.contains("ld.so.preload': No such file")
            || text.contains("ld.so.preload: No such file"),
        "the container has an /etc/ld.so.preload: {text}"
    );
    assert!(
        text.contains("/run/cuslice: No such file"),
        "the container has /run/cuslice: {text}"
    );
    let lines = parse_lines(&text);
    assert_eq!(lines[0]["total"], 8 * GIB, "{text}");
}

/// Inside, a process that unsets LD_PRELOAD and sets its own CUSLICE_* is still capped, and the
/// mounted files cannot be edited or unmounted. Also with a read-only rootfs.
pub fn cannot_lift(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("lift");
    let script = "echo CUSLICE_MEMORY_LIMIT=64GiB > /run/cuslice/slice/config && echo EDITED-CONFIG; \
                  echo > /etc/ld.so.preload && echo EDITED-PRELOAD; \
                  umount /etc/ld.so.preload 2>/dev/null && echo UNMOUNTED; \
                  rm -f /run/cuslice/slice/ledger && echo REMOVED-LEDGER; \
                  touch /run/cuslice/slice/extra 2>/dev/null && echo EDITED-SLICE; \
                  touch /run/cuslice/shared-by-all 2>/dev/null && echo EDITED-SKELETON; \
                  unset LD_PRELOAD; exec env -u LD_PRELOAD CUSLICE_MEMORY_LIMIT=64GiB CUDA_DEVICE_MEMORY_LIMIT=64g \
                  cuda-workload fill --family mem --chunk 64MiB --hold 60";
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &["sh", "-c", script],
            read_only: true,
        },
    );
    let (said, start) = lines_until(&mut *c, "start");
    assert_eq!(start["total"], GIB, "{start}");
    for done in [
        "EDITED-CONFIG",
        "EDITED-PRELOAD",
        "UNMOUNTED",
        "REMOVED-LEDGER",
        "EDITED-SLICE",
        "EDITED-SKELETON",
    ] {
        assert!(!said.iter().any(|l| l == done), "{done}: {said:?}");
    }
    wait_for(&mut *c, "holding");
    let (used, peak) = held_by(&sim, c.host_pid());
    assert!(peak <= GIB, "peak {peak} > 1 GiB");
    assert!(used >= GIB - 128 * MIB, "held {used}");
    // /run/cuslice is the node's one skeleton of mount points, shared by every container: no
    // container can add to it.
    assert!(!Path::new(STATE_ROOT).join("skel/shared-by-all").exists());
    // Refused by the kernel, as the shell in the container says.
    for file in ["/run/cuslice/slice/config", "/etc/ld.so.preload"] {
        let want = format!("can't create {file}: Read-only file system");
        poll(&want, || c.stderr().contains(&want).then_some(()));
    }
    c.remove();
}

/// The slice's state goes when the container is removed, and when its process is killed with
/// SIGKILL (the engine's poststop, or else the next hook's sweep).
pub fn state_gone(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("gone");
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: FILL,
            read_only: false,
        },
    );
    wait_for(&mut *c, "holding");
    let id = c.id();
    assert!(slice_dir(&id).exists());
    assert_eq!(
        node_places(&id).len(),
        1,
        "the container's place on the node's compute board"
    );
    c.remove();
    assert!(
        !slice_dir(&id).exists(),
        "state left after the container was removed"
    );
    let left = node_places(&id);
    assert!(
        left.is_empty(),
        "its place on the compute board is left: {left:?}"
    );

    let n = name("killed");
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: FILL,
            read_only: false,
        },
    );
    wait_for(&mut *c, "holding");
    let id = c.id();
    let pid = c.host_pid();
    assert!(slice_dir(&id).exists());
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).output();
    // Whatever the engine does after its process dies, the state is gone once the next
    // container starts (every hook sweeps) or the operator sweeps.
    let deadline = Instant::now() + Duration::from_secs(20);
    while slice_dir(&id).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if slice_dir(&id).exists() {
        let out = Command::new(bin_dir().join("cuslice-hook"))
            .arg("sweep")
            .output()
            .unwrap();
        assert!(out.status.success());
    }
    assert!(!slice_dir(&id).exists(), "state left after SIGKILL");
    let left = node_places(&id);
    assert!(
        left.is_empty(),
        "its place on the compute board is left after SIGKILL: {left:?}"
    );
    c.remove();
}

/// The places on the node's compute board (the hook's default node directory) whose grant names
/// container `id`.
fn node_places(id: &str) -> Vec<std::path::PathBuf> {
    let node = std::path::Path::new(cuslice_state::paths::DEFAULT_NODE_DIR);
    let origin = format!("origin hook {id} ");
    std::fs::read_dir(node)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    std::fs::read_to_string(p.join(cuslice_state::board::GRANT))
                        .is_ok_and(|g| g.lines().any(|l| l.starts_with(&origin)))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `cuslice status --json` on the host lists the container's slice by its id, with its cap and
/// core limit, its two processes by host pid (the engine's pid for its init) and what each
/// holds as the simulator says; and no longer lists it once the container is removed.
pub fn status_shows(engine: &dyn Engine) {
    // What this checks is a node without the agent: status is what tells the host pids.
    let _turn = agent_turn();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("status");
    let script = "cuda-workload hold --bytes 256MiB --secs 60 & \
                  exec cuda-workload launch --ns-per-block 1000 --blocks 1000 --secs 60";
    let mut c = engine.spawn(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_CORE_LIMIT=40"],
            cmd: &["sh", "-c", script],
            read_only: false,
        },
    );
    let mut seen = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                c.stdout().read_line(&mut line).unwrap() > 0,
                "ended: {seen:?}"
            );
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v["event"] == "holding" || v["event"] == "start" && v["scenario"] == "launch" {
                seen.push(v);
                break;
            }
        }
    }
    std::thread::sleep(Duration::from_millis(1500));
    let id = c.id();
    let status = || status_json(&sim);
    let find = |view: &Value| slice_in(view, &id);
    let view = status();
    let truth = sim.device(0);
    let slice = find(&view);
    assert_eq!(view["devices"][0]["uuid"], truth["uuid"]);
    assert_eq!(slice["kind"], "container");
    assert_eq!(slice["memory"]["limit"], GIB, "{slice}");
    assert_eq!(slice["compute"]["limit_pct"], 40.0, "{slice}");
    let procs = slice["processes"].as_array().unwrap().clone();
    assert_eq!(procs.len(), 2, "{slice}");
    let init = procs
        .iter()
        .find(|p| p["container_pid"] == 1)
        .unwrap_or_else(|| panic!("no container pid 1 in {slice}"));
    assert_eq!(init["pid"], c.host_pid(), "{slice}");
    let mut total = 0;
    for p in &procs {
        let pid = p["pid"].as_i64().unwrap() as i32;
        let (held, _) = held_by(&sim, pid);
        assert_eq!(
            p["memory"].as_u64().unwrap(),
            held,
            "process {pid}: {slice}"
        );
        total += held;
    }
    assert_eq!(slice["memory"]["used"].as_u64().unwrap(), total, "{slice}");
    // The simulator's device time for the container's processes, against status's.
    let device_time_matches = |slice: &Value, truth: &Value, when: &str| {
        let device_time: f64 = truth["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| procs.iter().any(|q| q["pid"] == p["pid"]))
            .map(|p| p["device_time_ns"].as_u64().unwrap() as f64 / 1e9)
            .sum();
        let seen = slice["compute"]["device_seconds"].as_f64().unwrap();
        assert!(
            (seen - device_time).abs() < 0.3,
            "device time {when}: status {seen} s, simulator {device_time} s"
        );
    };
    device_time_matches(&slice, &truth, "at first");
    // The simulator now names the container's processes by host pid, as a real driver always
    // does; told their host pids by status, their meters keep reading NVML (no estimates).
    std::thread::sleep(Duration::from_millis(2500));
    let slice = find(&status());
    let truth = sim.device(0);
    assert_eq!(slice["compute"]["estimated"], false, "{slice}");
    device_time_matches(&slice, &truth, "after");
    // The name the container was started under (`--name`; the id for runc and ctr) is what
    // status shows and what `cuslice set` takes, as an operator would use it.
    if id != n {
        assert_eq!(slice["name"], n.as_str(), "{slice}");
    }
    let text = String::from_utf8_lossy(
        &sim.command(&bin_dir().join("cuslice"), &["status"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(
        text.lines().any(|l| l.split_whitespace().any(|w| w == n)),
        "cuslice status does not show {n}: {text}"
    );
    let set = std::process::Command::new(bin_dir().join("cuslice"))
        .args(["set", &n, "--core-limit", "50"])
        .output()
        .unwrap();
    assert!(
        set.status.success(),
        "cuslice set {n}: {}",
        String::from_utf8_lossy(&set.stderr)
    );
    assert_eq!(find(&status())["compute"]["limit_pct"], 50.0);
    c.remove();
    let after = status();
    assert!(
        !after.to_string().contains(&id),
        "removed container still listed: {after}"
    );
}
