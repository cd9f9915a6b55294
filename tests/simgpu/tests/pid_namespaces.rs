//! Processes in different pid namespaces share one simulated device, as containers do (each
//! with the state file mounted, each with its own pid 1): their thread ids collide. simgpu's
//! locks must still tell their holders apart, and no process killed at any instruction, waiting
//! or holding, may take another process down, hang it, or spoil the device's accounting.

use cuslice_test_harness::*;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn lib_dir(dir: &std::path::Path) -> std::path::PathBuf {
    let lib = dir.join("lib");
    let out = Command::new(simgpu())
        .args(["lib-dir", "--out"])
        .arg(&lib)
        .output()
        .unwrap();
    assert!(out.status.success());
    lib
}

/// `sh -c script` as pid 1 of a new pid namespace with its own /proc (like a container's init),
/// on the simulated device, its output in `out`. SIGKILL to the child kills the namespace.
fn in_namespace(sim: &Sim, lib: &std::path::Path, script: &str, out: &std::path::Path) -> Child {
    Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "--mount-proc", "--"])
        .args(["sh", "-c", script])
        .env("SIMGPU_STATE", &sim.state)
        .env("LD_LIBRARY_PATH", lib)
        .env("WORKLOAD", workload())
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(Stdio::from(
            std::fs::File::create(out.with_extension("err")).unwrap(),
        ))
        .spawn()
        .expect("unshare is missing: apt-get install util-linux")
}

/// The host pid of `unshare`'s child: the namespace's pid 1.
fn init_of(unshare: u32) -> Option<i32> {
    let children =
        std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

fn kill9(pid: i32) {
    // SAFETY: sending a signal to a process this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// What `simgpu show --json` says, checked: it ran (a crashed reader is a failure too), and the
/// device's used memory is what its processes hold.
fn checked_show(sim: &Sim) -> Result<serde_json::Value, String> {
    let out = Command::new(simgpu())
        .args(["show", "--json", "--state"])
        .arg(&sim.state)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(format!(
            "simgpu show ended with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let dev = &v["devices"][0];
    let held: u64 = dev["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| u(&p["held"]))
        .sum();
    if u(&dev["used"]) != held {
        return Err(format!(
            "the device has {} bytes used, its processes hold {held}: {}",
            u(&dev["used"]),
            dev["processes"]
        ));
    }
    Ok(v)
}

#[test]
fn processes_of_many_pid_namespaces_killed_at_random_leave_the_device_whole() {
    require_root("this test makes pid namespaces");
    let sim = Sim::new(&["--memory", "8GiB", "--context-overhead", "10MiB"]);
    let lib = lib_dir(sim.dir.path());
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };

    // The host's reader, as the node agent and `simgpu show` are, throughout.
    let stop = AtomicBool::new(false);
    let problems = std::sync::Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = checked_show(&sim) {
                    problems.lock().unwrap().push(e);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let fail = |why: String| {
            stop.store(true, Ordering::Relaxed);
            panic!("{why}");
        };
        for round in 0..6 {
            // Each namespace: threads allocating and freeing at full speed, or processes that
            // start, ask NVML and the driver what there is, and end, one after another.
            let kids: Vec<(Child, bool, std::path::PathBuf)> = (0..12)
                .map(|k| {
                    let out = sim.dir.path().join(format!("r{round}-k{k}.out"));
                    let script = if k % 4 == 3 {
                        "while :; do \"$WORKLOAD\" info >/dev/null || exit 1; done".to_string()
                    } else {
                        format!(
                            "exec \"$WORKLOAD\" churn --threads 8 --secs 3 --min 1MiB \
                             --max 16MiB --seed {}",
                            round * 100 + k
                        )
                    };
                    let churn = k % 4 != 3;
                    (in_namespace(&sim, &lib, &script, &out), churn, out)
                })
                .collect();
            // Kill the readers and about two thirds of the churners at random moments.
            std::thread::sleep(Duration::from_millis(300 + next() % 700));
            let mut kept = Vec::new();
            for (mut c, churn, out) in kids {
                if !churn || next() % 3 != 0 {
                    std::thread::sleep(Duration::from_micros(next() % 20_000));
                    if let Some(init) = init_of(c.id()) {
                        kill9(init);
                    }
                    let _ = c.kill();
                    let _ = c.wait();
                } else {
                    kept.push((c, out));
                }
            }
            // The rest end on their own, on time, having freed everything, without an error.
            let deadline = Instant::now() + Duration::from_secs(60);
            for (mut c, out) in kept {
                let status = loop {
                    if let Some(st) = c.try_wait().unwrap() {
                        break st;
                    }
                    if Instant::now() > deadline {
                        if let Some(init) = init_of(c.id()) {
                            kill9(init);
                        }
                        let _ = c.kill();
                        fail(format!(
                            "round {round}: a process of another pid namespace hangs ({})",
                            out.display()
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                let text = std::fs::read_to_string(&out).unwrap_or_default();
                let err = std::fs::read_to_string(out.with_extension("err")).unwrap_or_default();
                if !status.success() {
                    fail(format!(
                        "round {round}: a churning process ended with {status}; stdout: {text}; stderr: {err}"
                    ));
                }
                let churned = event(&parse_lines(&text), "churned").clone();
                if u(&churned["errors"]) != 0 || u(&churned["allocs"]) == 0 {
                    fail(format!("round {round}: {churned}; stderr: {err}"));
                }
            }
            let p = problems.lock().unwrap().clone();
            if let Some(first) = p.first() {
                fail(format!(
                    "round {round}: {first} ({} such findings)",
                    p.len()
                ));
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    // Everyone is gone: the device is whole again.
    let v = checked_show(&sim).unwrap_or_else(|e| panic!("{e}"));
    let dev = &v["devices"][0];
    assert_eq!(u(&dev["used"]), 0, "{dev}");
    assert_eq!(dev["processes"].as_array().unwrap().len(), 0, "{dev}");
}
