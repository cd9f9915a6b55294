//! The hook with plain runc: OCI bundles whose config.json lists `cuslice-hook prestart` and
//! `poststop`, run with `runc run`. One concern (the hook under plain runc), kept in one file.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use cuslice_test_engines as engines;
use cuslice_test_engines::preload::{self, Prepared};
use cuslice_test_engines::runc::{Bundle, RuncContainer, bundle, state_pid};
use cuslice_test_engines::*;
use cuslice_test_harness::Sim;
use serde_json::{Value, json};

struct Runc;

impl Engine for Runc {
    fn run(&self, sim: &Sim, spec: &Spec<'_>) -> Output {
        run_bundle(&bundle(sim, spec, &[]), spec.name)
    }
    fn spawn(&self, sim: &Sim, spec: &Spec<'_>) -> Box<dyn Container + '_> {
        Box::new(RuncContainer::start(sim, spec, &[]))
    }
}

impl Prepared for Runc {
    fn run_prepared(&self, sim: &Sim, spec: &Spec<'_>, prepare: &dyn Fn(&Path)) -> Output {
        let b = bundle(sim, spec, &[]);
        prepare(&b.path.join("rootfs"));
        run_bundle(&b, spec.name)
    }
    fn spawn_prepared(
        &self,
        sim: &Sim,
        spec: &Spec<'_>,
        prepare: &dyn Fn(&Path),
    ) -> Box<dyn Container + '_> {
        let b = bundle(sim, spec, &[]);
        prepare(&b.path.join("rootfs"));
        Box::new(RuncContainer::start_bundle(b, spec.name))
    }
}

/// `runc run ID` in the bundle `b`, to completion; the container is deleted after.
fn run_bundle(b: &Bundle, id: &str) -> Output {
    let out = Command::new("runc")
        .args(["run", id])
        .current_dir(&b.path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = Command::new("runc")
        .args(["delete", "--force", id])
        .output();
    out
}

engine_scenarios!(&Runc);
hostile_scenarios!(&Runc);

/// An honest slice back at work is passed over for a moment, and then has its limit again.
#[test]
fn a_limited_slice_back_at_work_beside_a_busy_one_gets_its_limit() {
    root_required();
    cuslice_test_harness::twice(|| engines::hostile::back_at_work_beside_a_busy_slice(&Runc));
}

/// The demo's three containers, with the node agent: shares hold (checked against the simulator).
#[test]
fn demo_shares_hold_with_the_agent() {
    root_required();
    engines::shares::shares_hold(&Runc);
}

/// The image is left as it was: the mount points the hook made are gone after the container.
#[test]
fn rootfs_left_as_it_was() {
    root_required();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("rootfs");
    let b = bundle(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &["cat", "/etc/ld.so.preload"],
            read_only: true,
        },
        &[],
    );
    let before = listing(&b.path.join("rootfs"));
    let out = Command::new("runc")
        .args(["run", &n])
        .current_dir(&b.path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/run/cuslice/lib/libcuslice.so\n"
    );
    let after = listing(&b.path.join("rootfs"));
    let extra = not_runcs(&sim, &before, &after);
    assert!(extra.is_empty(), "left in the image: {extra:?}");
    assert!(!b.path.join("rootfs/etc").exists());
}

/// A state root of its own: a 64 MiB tmpfs (as `/run` is on most hosts) on a temporary
/// directory, detached again when dropped.
struct TmpfsRoot(tempfile::TempDir);

impl TmpfsRoot {
    fn new() -> TmpfsRoot {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64m", "cuslice-test"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        TmpfsRoot(dir)
    }

    fn path(&self) -> String {
        self.0.path().to_str().unwrap().to_string()
    }
}

impl Drop for TmpfsRoot {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// A start that fails after the hook made its mount points in the image (its state root full,
/// so that its record cannot be written) leaves the image as it was: nothing stays behind in a
/// rootfs other containers may share. The state root is a tmpfs of its own whose inodes run out
/// one step later at each start, until a start succeeds.
#[test]
fn a_start_that_fails_late_leaves_the_rootfs_as_it_was() {
    root_required();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let state = TmpfsRoot::new();
    let dir = state.path();
    let sh = |args: &[&str]| {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let run = |n: &str| {
        let b = bundle(
            &sim,
            &Spec {
                name: n,
                env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
                cmd: &["true"],
                read_only: false,
            },
            &["--state-root", &dir],
        );
        let before = listing(&b.path.join("rootfs"));
        let out = Command::new("runc")
            .args(["run", n])
            .current_dir(&b.path)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let _ = Command::new("runc").args(["delete", "--force", n]).output();
        let extra = not_runcs(&sim, &before, &listing(&b.path.join("rootfs")));
        (out, extra)
    };
    // One start first, so that what every container shares is made.
    let (out, _) = run(&name("late-first"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let used = || {
        let f = sh(&["stat", "-f", "-c", "%c %d", &dir]);
        let (total, free) = f.split_once(' ').unwrap();
        total.parse::<u64>().unwrap() - free.parse::<u64>().unwrap()
    };
    let mut late = 0;
    for more in 0..24 {
        let n = name("late");
        sh(&[
            "mount",
            "-o",
            &format!("remount,nr_inodes={}", used() + more),
            &dir,
        ]);
        let (out, extra) = run(&n);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            extra.is_empty(),
            "with {more} inodes free: left in the image: {extra:?}; {err}"
        );
        if out.status.success() {
            break;
        }
        assert!(err.contains("No space left on device"), "{err}");
        // Its record, the last thing a start writes.
        if err.contains(&format!("cannot write {dir}/containers/{n}:")) {
            late += 1;
        }
    }
    assert!(late > 0, "no start failed writing its record");
}

/// A tenant that writes far past the end of its ledger, claims and turns fills its own space (a
/// tmpfs of `slice_space()`), not the state root's nor the board's: with the state root a 64 MiB
/// tmpfs (as `/run` is a tmpfs on most hosts), containers started beside it all start and run.
#[test]
fn a_tenant_filling_its_state_leaves_room_for_other_containers() {
    root_required();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let state = TmpfsRoot::new();
    let dir = state.path();
    let n = name("fill-ledger");
    let mut c = RuncContainer::start(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &[
                "cuda-workload",
                "tamper",
                "--grow-mib",
                "96",
                "--secs",
                "60",
            ],
            read_only: false,
        },
        &["--state-root", &dir],
    );
    let (tried, _) = engines::lines_until(&mut c, "ready");
    let grown: Vec<Value> = tried
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["what"] == "grow")
        .collect();
    let mut files: Vec<&str> = grown
        .iter()
        .filter_map(|v| v["path"].as_str()?.rsplit('/').next())
        .collect();
    files.sort();
    assert_eq!(files, ["claims", "ledger", "turns"], "{tried:?}");
    for v in &grown {
        assert_eq!(v["ok"], false, "{v}");
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("No space left on device"),
            "{v}"
        );
    }
    for i in 0..5 {
        let other = name(&format!("beside-fill-{i}"));
        let b = bundle(
            &sim,
            &Spec {
                name: &other,
                env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
                cmd: &["cat", "/run/cuslice/slice/config"],
                read_only: false,
            },
            &["--state-root", &dir],
        );
        let out = Command::new("runc")
            .args(["run", &other])
            .current_dir(&b.path)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let _ = Command::new("runc")
            .args(["delete", "--force", &other])
            .output();
        assert!(
            out.status.success()
                && String::from_utf8_lossy(&out.stdout).contains("CUSLICE_MEMORY_LIMIT=1GiB"),
            "container {i} beside the filled ledger: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Box::new(c).remove();
}

/// An image's own /etc/ld.so.preload entries are kept, after the interposer, which comes first.
#[test]
fn image_preload_entries_kept() {
    root_required();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("preload");
    let b = bundle(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &["cat", "/etc/ld.so.preload"],
            read_only: false,
        },
        &[],
    );
    std::fs::create_dir_all(b.path.join("rootfs/etc")).unwrap();
    std::fs::write(
        b.path.join("rootfs/etc/ld.so.preload"),
        "/lib/x86_64-linux-gnu/libm.so.6\n",
    )
    .unwrap();
    let out = Command::new("runc")
        .args(["run", &n])
        .current_dir(&b.path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/run/cuslice/lib/libcuslice.so\n/lib/x86_64-linux-gnu/libm.so.6\n"
    );
    assert_eq!(
        std::fs::read_to_string(b.path.join("rootfs/etc/ld.so.preload")).unwrap(),
        "/lib/x86_64-linux-gnu/libm.so.6\n",
        "the image's file changed"
    );
}

/// Many containers starting at once each get their own slice.
#[test]
fn concurrent_starts() {
    root_required();
    let sim = Sim::new(&["--memory", "16GiB"]);
    let names: Vec<String> = (0..6).map(|_| name("many")).collect();
    let caps = ["512MiB", "1GiB", "1536MiB", "512MiB", "1GiB", "1536MiB"];
    let containers: Vec<Box<dyn Container>> = names
        .iter()
        .zip(caps)
        .map(|(n, cap)| {
            let env = format!("CUSLICE_MEMORY_LIMIT={cap}");
            Runc.spawn(
                &sim,
                &Spec {
                    name: n,
                    env: &[env.as_str()],
                    cmd: &["cuda-workload", "info"],
                    read_only: false,
                },
            )
        })
        .collect();
    for (mut c, cap) in containers.into_iter().zip(caps) {
        let v = wait_for(&mut *c, "start");
        let want = cuslice_policy::size::parse_size(cap).unwrap();
        assert_eq!(v["total"], want, "{cap}: {v}");
        c.remove();
    }
}

/// What is in `after` and was not in `before`, less the mount points runc itself makes for the
/// spec's mounts (/run/simgpu/state and the driver's libraries): what the hook left.
fn not_runcs(sim: &Sim, before: &[String], after: &[String]) -> Vec<String> {
    let runcs: Vec<String> = gpu_mounts(sim)
        .iter()
        .map(|(_, dst, _)| dst.trim_start_matches('/').to_string())
        .collect();
    after
        .iter()
        .filter(|p| !before.contains(p) && !runcs.iter().any(|m| m.starts_with(p.as_str())))
        .cloned()
        .collect()
}

fn listing(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A container that vanishes without poststop (created, its process killed, never deleted): its
/// slice is swept by the next hook, or by `cuslice-hook sweep`.
#[test]
fn vanished_container_swept() {
    root_required();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let n = name("vanish");
    let b = bundle(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &["sleep", "60"],
            read_only: false,
        },
        &[],
    );
    // The container's process inherits runc's stdio: no pipes, or reading them never ends.
    let status = Command::new("runc")
        .args(["create", &n])
        .current_dir(&b.path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        slice_dir(&n).join("record.json").exists(),
        "createRuntime/prestart ran at create"
    );
    let pid = state_pid(&n);
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).output();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        slice_dir(&n).exists(),
        "nothing ran poststop, so the state is still there"
    );
    let out = Command::new(hook()).arg("sweep").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&n),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!slice_dir(&n).exists());
    let _ = Command::new("runc")
        .args(["delete", "--force", &n])
        .output();
}

// ---- an image's own /etc/ld.so.preload, used against the hook ---------------------------

/// An image whose /etc/ld.so.preload is one NUL byte still gets the interposer loaded.
#[test]
fn a_nul_byte_in_the_image_preload_does_not_drop_the_library() {
    root_required();
    preload::nul_byte(&Runc);
}

/// A bundle whose hooks keep their state under `state_root`; with `limit_kib`, each hook runs
/// with its address space held to that (`ulimit -v`), so a hook that reads a whole huge file
/// fails there instead of taking the host's memory.
fn bundle_in(sim: &Sim, spec: &Spec<'_>, state_root: &Path, limit_kib: Option<u64>) -> Bundle {
    let b = bundle(sim, spec, &["--state-root", state_root.to_str().unwrap()]);
    if let Some(kib) = limit_kib {
        let path = b.path.join("config.json");
        let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for stage in ["prestart", "poststop"] {
            let h = &mut c["hooks"][stage][0];
            let mut args = vec![
                json!("sh"),
                json!("-c"),
                json!(format!("ulimit -v {kib} && exec \"$0\" \"$@\"")),
                h["path"].clone(),
            ];
            args.extend(h["args"].as_array().unwrap()[1..].iter().cloned());
            h["path"] = json!("/bin/sh");
            h["args"] = json!(args);
        }
        std::fs::write(&path, serde_json::to_string_pretty(&c).unwrap()).unwrap();
    }
    b
}

/// `runc run ID` in `b`, waited for at most `limit`: its output and how long it took, or how
/// long it was waited for (then it is killed and deleted).
fn run_within(b: &Bundle, id: &str, limit: Duration) -> Result<(Output, Duration), Duration> {
    let start = Instant::now();
    let mut child = Command::new("runc")
        .args(["run", id])
        .current_dir(&b.path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let _ = Command::new("runc")
                .args(["delete", "--force", id])
                .output();
            return Err(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = start.elapsed();
    let out = child.wait_with_output().unwrap();
    let _ = Command::new("runc")
        .args(["delete", "--force", id])
        .output();
    Ok((out, took))
}

fn engine_output(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

const FOUR_GIB: u64 = 4 << 30;
/// The address space a hook gets in these tests: 256 MiB.
const HOOK_KIB: u64 = 256 * 1024;

/// An image's 4 GiB (sparse) /etc/ld.so.preload: refused at once in one line naming the file,
/// its size and the bound, by a hook held to 256 MiB of address space; nothing is left in the
/// state root or the rootfs.
#[test]
fn a_huge_image_preload_is_refused_at_once_in_little_memory() {
    root_required();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let root = tempfile::tempdir().unwrap();
    let n = name("huge");
    let b = bundle_in(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &["echo", "STARTED"],
            read_only: false,
        },
        root.path(),
        Some(HOOK_KIB),
    );
    preload::sparse_preload(&b.path.join("rootfs"), FOUR_GIB);
    let before = listing(&b.path.join("rootfs"));
    let (out, took) = run_within(&b, &n, Duration::from_secs(60))
        .unwrap_or_else(|t| panic!("neither started nor refused in {t:?}"));
    let all = engine_output(&out);
    assert!(!out.status.success(), "started anyway: {all}");
    assert!(!all.contains("STARTED"), "{all}");
    let line = preload::hook_line(&all);
    for says in [
        "/etc/ld.so.preload is 4294967296 bytes",
        "65536 bytes",
        "the container is not started",
    ] {
        assert!(line.contains(says), "{line:?} does not say {says:?}");
    }
    assert!(took < Duration::from_secs(5), "refused after {took:?}");
    let (size, path) = preload::largest_file(root.path());
    assert!(size < 64 << 10, "{}: {size} bytes", path.display());
    assert!(!root.path().join("containers").join(&n).exists());
    let after = listing(&b.path.join("rootfs"));
    assert!(before.iter().all(|p| after.contains(p)), "{after:?}");
    let extra = not_runcs(&sim, &before, &after);
    assert!(extra.is_empty(), "left in the image: {extra:?}");
}

/// The image's preload file is read without the node-wide lock: with the state root's lock
/// held by someone else (here, the test), a container whose /etc/ld.so.preload is a FIFO or a
/// 4 GiB file is refused at once, not queued behind the lock.
#[test]
fn a_bad_image_preload_is_refused_without_waiting_for_the_lock() {
    root_required();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let root = tempfile::tempdir().unwrap();
    let lock = std::fs::File::create(root.path().join("lock")).unwrap();
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| e)
        .unwrap();
    let fifo = |rootfs: &Path| {
        std::fs::create_dir_all(rootfs.join("etc")).unwrap();
        nix::unistd::mkfifo(
            &rootfs.join("etc/ld.so.preload"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
    };
    let huge = |rootfs: &Path| preload::sparse_preload(rootfs, FOUR_GIB);
    type Prepare<'a> = &'a dyn Fn(&Path);
    let cases: [(&str, Prepare, &str); 2] = [
        ("a FIFO", &fifo, "/etc/ld.so.preload is a FIFO"),
        ("4 GiB", &huge, "/etc/ld.so.preload is 4294967296 bytes"),
    ];
    for (what, prepare, says) in cases {
        let n = name("locked");
        let b = bundle_in(
            &sim,
            &Spec {
                name: &n,
                env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
                cmd: &["echo", "STARTED"],
                read_only: false,
            },
            root.path(),
            Some(HOOK_KIB),
        );
        prepare(&b.path.join("rootfs"));
        let (out, took) = run_within(&b, &n, Duration::from_secs(10)).unwrap_or_else(|t| {
            panic!(
                "{what}: neither started nor refused in {t:?}: the hook waits for the lock, \
                 which another holds"
            )
        });
        let all = engine_output(&out);
        assert!(!out.status.success(), "{what}: started anyway: {all}");
        let line = preload::hook_line(&all);
        assert!(
            line.contains(says),
            "{what}: {line:?} does not say {says:?}"
        );
        assert!(
            took < Duration::from_secs(5),
            "{what}: refused after {took:?}"
        );
    }
}

/// While one container's hook deals with its image's 4 GiB /etc/ld.so.preload, another
/// container of the same node starts about as fast as alone.
#[test]
fn a_huge_image_preload_does_not_hold_up_other_containers() {
    root_required();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let root = tempfile::tempdir().unwrap();
    let other = || {
        let n = name("other");
        let b = bundle_in(
            &sim,
            &Spec {
                name: &n,
                env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
                cmd: &["cuda-workload", "info"],
                read_only: false,
            },
            root.path(),
            None,
        );
        let start = Instant::now();
        let out = run_bundle(&b, &n);
        let took = start.elapsed();
        let all = engine_output(&out);
        assert!(out.status.success(), "{all}");
        let lines = cuslice_test_harness::parse_lines(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(lines[0]["total"], cuslice_test_harness::GIB, "{all}");
        took
    };
    let alone = other();
    let n = name("huge");
    let b = bundle_in(
        &sim,
        &Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
            cmd: &["echo", "STARTED"],
            read_only: false,
        },
        root.path(),
        None,
    );
    preload::sparse_preload(&b.path.join("rootfs"), FOUR_GIB);
    let huge = Command::new("runc")
        .args(["run", &n])
        .current_dir(&b.path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Time for runc to reach the hook.
    std::thread::sleep(Duration::from_millis(300));
    let beside = other();
    let out = huge.wait_with_output().unwrap();
    let _ = Command::new("runc")
        .args(["delete", "--force", &n])
        .output();
    assert!(
        beside < alone + Duration::from_secs(2),
        "a container took {alone:?} to run alone and {beside:?} beside one with a 4 GiB \
         /etc/ld.so.preload"
    );
    assert!(!out.status.success(), "{}", engine_output(&out));
}

/// A cap of 2^64-1 bytes and a 100 kB value: refused in one short line.
#[test]
fn a_cap_no_device_holds_and_a_long_value_are_refused_in_one_short_line() {
    root_required();
    engines::too_large_or_too_long(&Runc);
}

// ---- a slice's first context beside busy neighbours --------------------------------------------

/// Capped containers started three at a time beside three containers that allocate and free all
/// the time, on a state root of the test's own: each capped container's first context is charged
/// what it takes, so by the simulator's count none ever holds more than its cap, and none has its
/// first context refused. Without the agent every container's process is NVML's pid 1 (simgpu
/// names a container's process by its container pid until a host process resolves it); with it,
/// each process knows its host pid.
fn first_contexts_beside_churn(with_agent: bool) {
    root_required();
    let sim = Sim::new(&["--memory", "40GiB", "--context-overhead", "300MiB"]);
    let root = tempfile::tempdir().unwrap();
    let _agent = with_agent.then(|| NodeAgent::start_at(&sim, root.path()));
    let hook_args = ["--state-root", root.path().to_str().unwrap()];
    let churn = [
        "cuda-workload",
        "churn",
        "--threads",
        "4",
        "--secs",
        "300",
        "--min",
        "1MiB",
        "--max",
        "96MiB",
        "--hold-max",
        "8",
    ];
    let mut neighbours = Vec::new();
    for _ in 0..3 {
        let n = name("churn");
        let spec = Spec {
            name: &n,
            env: &["CUSLICE_MEMORY_LIMIT=2GiB"],
            cmd: &churn,
            read_only: false,
        };
        let mut c = RuncContainer::start(&sim, &spec, &hook_args);
        wait_for(&mut c, "start");
        neighbours.push(c);
    }
    const CAP: u64 = 400 << 20;
    let fill = [
        "cuda-workload",
        "fill",
        "--family",
        "mem",
        "--chunk",
        "16MiB",
        "--hold",
        "30",
    ];
    let (mut bad, mut peaks, mut how) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..12 {
        let names: Vec<String> = (0..5).map(|_| name("capped")).collect();
        let mut capped: Vec<RuncContainer> = names
            .iter()
            .map(|n| {
                let spec = Spec {
                    name: n,
                    env: &["CUSLICE_MEMORY_LIMIT=400MiB", "CUSLICE_LOG=debug"],
                    cmd: &fill,
                    read_only: false,
                };
                RuncContainer::start(&sim, &spec, &hook_args)
            })
            .collect();
        for (k, c) in capped.iter_mut().enumerate() {
            let (refused, line) = fill_outcome(c);
            let what = format!("round {round}.{k}: {line}");
            if !refused {
                // The library's own account of it, which may trail the workload's output.
                std::thread::sleep(Duration::from_millis(300));
                bad.push(format!("{what}: first context refused; {}", c.stderr()));
                continue;
            }
            let (_, peak) = held_by(&sim, c.host_pid());
            peaks.push(peak >> 20);
            if peak > CAP {
                bad.push(format!("{what}: held {} MiB of a 400 MiB cap", peak >> 20));
            }
        }
        for c in capped {
            how.extend(measured_by(&c.stderr()));
            Box::new(c).remove();
        }
    }
    for c in neighbours {
        Box::new(c).remove();
    }
    eprintln!("{}", summary(&peaks, &how));
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// How the library says it measured a context (its debug log).
fn measured_by(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| l.split_once("measured by ").map(|m| m.1.to_string()))
        .collect()
}

/// The peaks (MiB) the simulator counted, and how many contexts were measured which way.
fn summary(peaks: &[u64], how: &[String]) -> String {
    let mut ways = std::collections::BTreeMap::new();
    for h in how {
        *ways.entry(h.as_str()).or_insert(0) += 1;
    }
    format!(
        "{} capped containers held {:?}..={:?} MiB at most by the simulator's \
         count; measured by {ways:?}",
        peaks.len(),
        peaks.iter().min(),
        peaks.iter().max()
    )
}

/// Reads a `fill` container's lines until its refusal (true) or an error or its end (false);
/// the line that decided.
fn fill_outcome(c: &mut RuncContainer) -> (bool, String) {
    use std::io::BufRead;
    let mut line = String::new();
    loop {
        line.clear();
        if c.stdout().read_line(&mut line).unwrap() == 0 {
            return (false, "ended without a refusal".into());
        }
        if let Ok(v) = serde_json::from_str::<Value>(&line) {
            if v["event"] == "refused" {
                return (true, line.trim_end().to_string());
            }
            if v["event"] == "error" {
                return (false, line.trim_end().to_string());
            }
        }
    }
}

#[test]
fn first_contexts_beside_churn_without_the_agent() {
    first_contexts_beside_churn(false);
}

#[test]
fn first_contexts_beside_churn_with_the_agent() {
    first_contexts_beside_churn(true);
}

/// A pod's container, annotated as containerd's CRI annotates it but with a pod name that tries
/// to forge a label and a control character, and the DRA plugin's container index naming its
/// claim: `cuslice status --json` and the exporter's series (read by the Prometheus client's
/// OpenMetrics parser) carry its namespace, pod, container and claim, cleaned and escaped.
#[test]
fn kubernetes_names_reach_status_and_the_metrics() {
    use std::io::Write;
    root_required();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let root = tempfile::tempdir().unwrap();
    let index = tempfile::tempdir().unwrap();
    let pod = r#"job-0",namespace="kube-system"#;
    std::fs::write(
        index.path().join(format!("team-a_{pod}_trainer_u1.json")),
        r#"{"podUID":"p1","cdiDevices":[],"claim":"job-0-gpu-x7k"}"#,
    )
    .unwrap();
    let n = name("k8s");
    let spec = Spec {
        name: &n,
        env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
        cmd: &["cuda-workload", "hold", "--bytes", "256MiB", "--secs", "60"],
        read_only: false,
    };
    let b = bundle(
        &sim,
        &spec,
        &[
            "--state-root",
            root.path().to_str().unwrap(),
            "--container-index",
            index.path().to_str().unwrap(),
        ],
    );
    let path = b.path.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["annotations"] = json!({
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-namespace": "team-a",
        "io.kubernetes.cri.sandbox-name": format!("{pod}\n\u{7}"),
        "io.kubernetes.cri.sandbox-uid": "p1",
        "io.kubernetes.cri.container-name": "trainer",
    });
    std::fs::write(&path, config.to_string()).unwrap();
    let mut c = RuncContainer::start_bundle(b, &n);
    wait_for(&mut c, "holding");

    let cuslice = cuslice_test_harness::bin_dir().join("cuslice");
    let out = sim
        .command(
            &cuslice,
            &[
                "status",
                "--json",
                "--state-root",
                root.path().to_str().unwrap(),
            ],
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    let slice = slice_in(&view, &n);
    assert_eq!(
        slice["kubernetes"],
        json!({"namespace": "team-a", "pod": pod, "container": "trainer", "pod_uid": "p1",
               "claim": "job-0-gpu-x7k"}),
        "{slice}"
    );
    assert_eq!(slice["name"], format!("{pod}/trainer"), "{slice}");
    let text = sim
        .command(
            &cuslice,
            &["status", "--state-root", root.path().to_str().unwrap()],
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&format!("{pod}/trainer")), "{text}");
    assert!(!text.contains('\u{7}'), "{text}");
    println!("{text}\n{}", slice["kubernetes"]);

    let body = scrape(&sim, root.path());
    let script = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
print(json.dumps([[s.name, s.labels] for f in text_string_to_metric_families(sys.stdin.read())
                  for s in f.samples]))
"#;
    let mut py = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (tests/tools/ensure-tools installs it and prometheus-client)");
    py.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let parsed = py.wait_with_output().unwrap();
    assert!(
        parsed.status.success(),
        "the OpenMetrics parser rejected the exposition: {}\n{body}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    let samples: Vec<(String, std::collections::HashMap<String, String>)> =
        serde_json::from_slice(&parsed.stdout).unwrap();
    let ours: Vec<_> = samples
        .iter()
        .filter(|(_, l)| l.get("slice") == Some(&n))
        .collect();
    assert!(
        ours.iter()
            .any(|(name, _)| name == "cuslice_slice_memory_used_bytes"),
        "{body}"
    );
    for (name, l) in &ours {
        let get = |k: &str| l.get(k).map(String::as_str);
        assert_eq!(
            (get("namespace"), get("pod"), get("container"), get("claim")),
            (
                Some("team-a"),
                Some(pod),
                Some("trainer"),
                Some("job-0-gpu-x7k")
            ),
            "{name}: {l:?}\n{body}"
        );
    }
    let line = body
        .lines()
        .find(|l| l.starts_with("cuslice_slice_memory_used_bytes{") && l.contains(&n))
        .unwrap();
    println!("{line}");
    Box::new(c).remove();
}

/// Three notebook-like containers, each capped at 6 GiB on an 8 GiB device (18 GiB of caps),
/// each keeping 3 GiB there and reading it back after idle spells: any two fit, three do not.
/// The third's allocation waits for room, and a quiet one gives its memory back for it; each
/// cell's read thaws its container, which waits for room in turn. No OOM, every byte intact.
#[test]
fn three_notebook_containers_capped_past_the_device_take_turns_with_their_bytes_intact() {
    root_required();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let env = [
        "CUSLICE_MEMORY_LIMIT=6GiB",
        "CUSLICE_MEMORY_FREEZE_IDLE=1h",
        "CUSLICE_MEMORY_WAIT=60s",
        "CUSLICE_LOG=info",
    ];
    let names: Vec<String> = (0..3).map(|i| name(&format!("notebook-{i}"))).collect();
    let cmd = [
        "cuda-workload",
        "keep",
        "--bytes",
        "3GiB",
        "--cells",
        "3",
        "--idle-secs",
        "6",
    ];
    let mut books: Vec<RuncContainer> = names
        .iter()
        .map(|n| {
            RuncContainer::start(
                &sim,
                &Spec {
                    name: n,
                    env: &env,
                    cmd: &cmd,
                    read_only: false,
                },
                &[],
            )
        })
        .collect();
    for c in books.iter_mut() {
        wait_for(c, "holding");
    }
    // The three hold 3 GiB each: one of them is frozen for it, by the simulator's count.
    let frozen = sim.show()["checkpoints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        frozen.iter().any(|c| c["state"] == "checkpointed"),
        "none of three 3 GiB holders on an 8 GiB device is frozen: {frozen:?}"
    );
    for (c, n) in books.iter_mut().zip(&names) {
        for cell in 0..3 {
            let v = wait_for(c, "checked");
            assert_eq!(
                (v["cell"].as_u64(), v["intact"].as_bool()),
                (Some(cell), Some(true)),
                "{n}: {v}"
            );
        }
    }
    for (mut c, n) in books.into_iter().zip(&names) {
        let status = exit_status(&mut c, n);
        let err = Container::stderr(&c);
        assert!(status.success(), "{n}: {status}: {err}");
        // No allocation refused at the cap or for want of room.
        assert!(
            !err.contains("cuslice: refused") && !err.contains("had no room"),
            "{n}: {err}"
        );
    }
}

/// A container `n` (settings `env`) that keeps 1 GiB on the device for one cell: it reads it
/// back after `idle_secs`, then exits.
fn keeper(sim: &Sim, n: &str, env: &[&str], idle_secs: &str) -> RuncContainer {
    RuncContainer::start(
        sim,
        &Spec {
            name: n,
            env,
            cmd: &[
                "cuda-workload",
                "keep",
                "--bytes",
                "1GiB",
                "--cells",
                "1",
                "--idle-secs",
                idle_secs,
            ],
            read_only: false,
        },
        &[],
    )
}

/// A hostile tenant (`cuda-workload tamper --ATTACK-gib 1024` for 30 s, settings `env`) once it
/// is ready, having tried the attack.
fn liar(sim: &Sim, attack: &str, env: &[&str]) -> RuncContainer {
    let flag = format!("--{attack}-gib");
    let mut l = RuncContainer::start(
        sim,
        &Spec {
            name: &name(attack),
            env,
            cmd: &["cuda-workload", "tamper", &flag, "1024", "--secs", "30"],
            read_only: false,
        },
        &[],
    );
    let (tried, _) = engines::lines_until(&mut l, "ready");
    assert!(tried.iter().any(|t| t.contains(attack)), "{tried:?}");
    l
}

/// A hostile tenant says, in its own claims, that it waits for 1 TiB on the device. A want is
/// believed up to the wanter's memory cap, by its grant: capped at 1 GiB on a device with room
/// for that, it gets nobody frozen. Without a cap, a container beside it that freezes when idle
/// (after an hour) is frozen once quiet for a second, as if the want were real; and that is all:
/// its next read brings its bytes back intact, and it exits cleanly.
#[test]
fn a_forged_want_of_memory_costs_a_neighbour_a_thaw_and_nothing_more() {
    root_required();
    for capped in [true, false] {
        let sim = Sim::new(&["--memory", "8GiB"]);
        let env: &[&str] = if capped {
            &["CUSLICE_MEMORY_LIMIT=1GiB"]
        } else {
            &["CUSLICE_CORE_LIMIT=50"]
        };
        let l = liar(&sim, "forge-want", env);
        let n = name("beside-forged-want");
        let mut c = keeper(
            &sim,
            &n,
            &[
                "CUSLICE_MEMORY_LIMIT=2GiB",
                "CUSLICE_MEMORY_FREEZE_IDLE=1h",
                "CUSLICE_LOG=info",
            ],
            "8",
        );
        wait_for(&mut c, "holding");
        // Frozen within its quiet spell (8 s), by the simulator's count: checkpointed, not only
        // locked (copying its 1 GiB to the host takes a slow host a while).
        let end = Instant::now() + Duration::from_secs(7);
        let frozen = loop {
            let cps = sim.show()["checkpoints"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if cps.iter().any(|c| c["state"] == "checkpointed") || Instant::now() > end {
                break cps;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if capped {
            assert_eq!(frozen, Vec::<serde_json::Value>::new(), "capped at 1 GiB");
        } else {
            assert_eq!(frozen.len(), 1, "{frozen:?}");
            assert_eq!(frozen[0]["state"], "checkpointed", "{frozen:?}");
        }
        let err = ends_intact(&mut c, &n);
        assert_eq!(
            err.contains("quiet: another slice waits for 1 TiB"),
            !capped,
            "capped {capped}: {err}"
        );
        Box::new(l).remove();
    }
}

/// A hostile tenant says, in its own turns, that it brings 1 TiB back to the device from a frozen
/// process: a thaw it never does. Where its grant lets it freeze, a container beside it waits as
/// it would for a real thaw (its context and its allocation leave that room), but only as long
/// as one slice's thaws are believed in a row (4 s), then runs, bytes intact; where its grant
/// does not, nobody waits at all.
#[test]
fn a_forged_thaw_holds_a_neighbour_back_seconds_and_nothing_more() {
    root_required();
    for freezes in [true, false] {
        let sim = Sim::new(&["--memory", "8GiB"]);
        let env: &[&str] = if freezes {
            &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_MEMORY_FREEZE_IDLE=1h"]
        } else {
            &["CUSLICE_MEMORY_LIMIT=1GiB"]
        };
        let l = liar(&sim, "forge-thaw", env);
        let n = name("beside-forged-thaw");
        let started = Instant::now();
        let mut c = keeper(
            &sim,
            &n,
            &["CUSLICE_MEMORY_LIMIT=2GiB", "CUSLICE_LOG=info"],
            "0",
        );
        wait_for(&mut c, "holding");
        let took = started.elapsed();
        let err = ends_intact(&mut c, &n);
        assert_eq!(
            err.contains(
                "device 0: a new context waits while 1 TiB comes back to the device from a frozen process"
            ),
            freezes,
            "freezes: {freezes}: {err}"
        );
        // Never for the 30 s the lie lasts.
        assert!(
            took < Duration::from_secs(15),
            "freezes: {freezes}: {took:?}: {err}"
        );
        Box::new(l).remove();
    }
}

/// A keeper container `n` checks its bytes, finds them intact and exits 0: its stderr.
fn ends_intact(c: &mut RuncContainer, n: &str) -> String {
    let v = wait_for(c, "checked");
    assert_eq!(v["intact"], true, "{v}");
    let status = exit_status(c, n);
    let err = Container::stderr(c);
    assert!(status.success(), "{status}: {err}");
    err
}

/// Container `n`'s exit status, once runc reports it (panics after 30 s).
fn exit_status(c: &mut RuncContainer, n: &str) -> std::process::ExitStatus {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = c.exited() {
            return s;
        }
        assert!(Instant::now() < end, "{n} did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}
