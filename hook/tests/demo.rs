//! The demo (`tests/demo`, the README's first command) as a new user runs it, on a machine
//! whose busybox is Debian's dynamically linked one (the `busybox` package, which links
//! libresolv), where it once stopped without a word: Debian's package, unpacked by
//! `tests/tools/ensure-tools` into target/tools/busybox-dynamic, is bind-mounted over this
//! machine's busybox in a mount namespace of the demo's own (nothing outside it changes). The
//! demo must run its three containers to the end, print its tables, keep each container's
//! output, and leave nothing behind that a second run or `cuslice status` would trip on.

use std::path::{Path, PathBuf};
use std::process::Command;

use cuslice_test_engines::root_required;
use cuslice_test_harness::bin_dir;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_demo_runs_with_debians_dynamically_linked_busybox() {
    root_required();
    let dynamic = repo().join("target/tools/busybox-dynamic/bin/busybox");
    assert!(
        dynamic.is_file(),
        "{} is missing: tests/tools/ensure-tools unpacks Debian's busybox package there",
        dynamic.display()
    );
    let ldd = Command::new("ldd").arg(&dynamic).output().unwrap();
    assert!(
        String::from_utf8_lossy(&ldd.stdout).contains("libresolv.so.2"),
        "{} does not link libresolv: {}",
        dynamic.display(),
        String::from_utf8_lossy(&ldd.stdout)
    );
    let host = ["/usr/bin/busybox", "/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .expect("no busybox on this machine: tests/tools/ensure-tools installs busybox-static")
        .canonicalize()
        .unwrap();
    let socket = Path::new("/run/cuslice/agent/agent.sock");
    let agent_before = socket.exists();
    let out = tempfile::tempdir().unwrap();
    let run = Command::new("timeout")
        .args([
            "300",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
        ])
        .args([
            "sh",
            "-c",
            "mount --bind \"$1\" \"$2\" && exec \"$3\"",
            "sh",
        ])
        .arg(&dynamic)
        .arg(&host)
        .arg(repo().join("tests/demo"))
        .env("CUSLICE_DEMO_BUILT", "1")
        .env("CUSLICE_DEMO_OUT", out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "the demo failed ({}):\n{stdout}\n{stderr}",
        run.status
    );
    for said in [
        "started trainer",
        "started notebook",
        "started batch",
        "CUDA_ERROR_OUT_OF_MEMORY after",
        "trainer, notebook and batch exited (exit codes: 0 0 0)",
    ] {
        assert!(
            stdout.contains(said),
            "the demo did not say {said:?}:\n{stdout}"
        );
    }
    // The shares table: a row per container, with the simulator's figure.
    for name in ["trainer", "notebook", "batch"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.trim_start().starts_with(name) && l.trim_end().ends_with('%')),
            "no share row for {name}:\n{stdout}"
        );
        let log = out.path().join("logs").join(format!("{name}.log"));
        let text = std::fs::read_to_string(&log)
            .unwrap_or_else(|e| panic!("{}: {e} (the container's output)", log.display()));
        assert!(text.contains("\"event\""), "{}: {text}", log.display());
    }
    assert!(out.path().join("slices.svg").is_file());
    // The agent it started is gone, and its socket with it: `cuslice status` says no agent runs
    // rather than that one refuses connections.
    if !agent_before {
        assert!(!socket.exists(), "the demo left {}", socket.display());
        let status = Command::new(bin_dir().join("cuslice"))
            .arg("status")
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&status.stdout),
            String::from_utf8_lossy(&status.stderr)
        );
        assert!(!all.contains("Connection refused"), "{all}");
    }
}
