//! The shared state survives processes dying at any point, and refuses files it does not understand.

use cuslice_test_harness::*;
use std::process::Command;
use std::time::{Duration, Instant};

fn kill9(pid: u64) {
    // SAFETY: sending a signal to a process id we started.
    let _ = unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

#[test]
fn a_killed_process_s_memory_and_contexts_are_reclaimed() {
    let sim = Sim::new(&["--memory", "2GiB"]);
    let mut a = sim.spawn(&["hold", "--bytes", "1GiB"]);
    let h = a.wait_for("holding", Duration::from_secs(30));
    assert_eq!(u(&sim.device(0)["used"]), GIB + 300 * MIB);
    kill9(u(&h["pid"]));
    let _ = a.child.wait();
    // The next process can have the whole device: the dead one's holdings are reclaimed before
    // any refusal.
    let (lines, _) = sim.workload(&["fill", "--family", "mem", "--chunk", "2MiB"]);
    assert_eq!(
        u(&event(&lines, "refused")["allocated"]),
        2 * GIB - 300 * MIB
    );
    let dev = sim.device(0);
    assert_eq!(u(&dev["used"]), 0);
    assert!(
        dev["exited"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["pid"] == h["pid"] && u(&e["peak"]) == GIB + 300 * MIB)
    );
}

#[test]
fn a_sigkill_storm_leaves_the_device_whole_and_nothing_hangs() {
    let sim = Sim::new(&["--memory", "4GiB", "--context-overhead", "10MiB"]);
    let start = Instant::now();
    let mut rng = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..6 {
        // Processes allocating, launching and freeing at full speed, killed at random moments.
        let kids: Vec<_> = (0..12)
            .map(|k| {
                let args: &[&str] = if k % 3 == 0 {
                    &[
                        "launch",
                        "--ns-per-block",
                        "100",
                        "--blocks",
                        "10",
                        "--secs",
                        "5",
                    ]
                } else {
                    &[
                        "fill",
                        "--family",
                        if k % 3 == 1 { "mem" } else { "pool" },
                        "--chunk",
                        "2MiB",
                        "--max-count",
                        "100000",
                    ]
                };
                sim.command(&workload(), args)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50 + next() % 150));
        for mut k in kids {
            std::thread::sleep(Duration::from_micros(next() % 3000));
            // Kill the workload itself (simgpu run's child dies with it via PDEATHSIG otherwise).
            let _ = Command::new("pkill")
                .args(["-9", "-P", &k.id().to_string()])
                .status();
            let _ = k.kill();
            let _ = k.wait();
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "round {round} took too long"
        );
    }
    let (lines, code) = sim.workload(&["fill", "--family", "mem", "--chunk", "2MiB"]);
    assert_eq!(code, 0);
    assert_eq!(
        u(&event(&lines, "refused")["allocated"]),
        4 * GIB - 10 * MIB,
        "the whole device is allocatable again"
    );
    assert_eq!(u(&sim.device(0)["used"]), 0);
}

fn show_err(path: &std::path::Path) -> String {
    let out = Command::new(simgpu())
        .args(["show", "--state"])
        .arg(path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_foreign_or_damaged_state_file_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("foreign");
    std::fs::write(&foreign, vec![7u8; 1 << 20]).unwrap();
    let e = show_err(&foreign);
    assert!(e.contains("is not a simgpu state file"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "one line: {e}");

    let sim = Sim::new(&["--memory", "64MiB", "--context-overhead", "10MiB"]);
    let bytes = std::fs::read(&sim.state).unwrap();
    let truncated = dir.path().join("truncated");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    assert!(show_err(&truncated).contains("is damaged"));
    let mut other_version = bytes.clone();
    other_version[8] = 99;
    let newer = dir.path().join("newer");
    std::fs::write(&newer, &other_version).unwrap();
    assert!(show_err(&newer).contains("layout version 99"));

    // The driver refuses to start on it, with the same message, instead of crashing.
    let out = Command::new(workload())
        .arg("info")
        .env("LD_LIBRARY_PATH", simgpu_lib_dir(&dir))
        .env("SIMGPU_STATE", &foreign)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a simgpu state file"));
}

fn simgpu_lib_dir(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let lib = dir.path().join("lib");
    let out = Command::new(simgpu())
        .args(["lib-dir", "--out"])
        .arg(&lib)
        .output()
        .unwrap();
    assert!(out.status.success());
    lib
}

#[test]
fn conflicting_device_options_for_an_existing_state_are_refused() {
    let sim = Sim::new(&["--memory", "1GiB"]);
    let out = Command::new(simgpu())
        .args(["init", "--memory", "2GiB", "--state"])
        .arg(&sim.state)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already describes 1 device(s) of 1 GiB")
    );
    let out = Command::new(simgpu())
        .args(["init", "--memory", "12XB", "--state", "/tmp/never"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"12XB\" is not a size"));
}
