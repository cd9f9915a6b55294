//! The hook with plain runc: OCI bundles whose config.json lists `cuslice-hook prestart` and
//! `poststop` (the "done when"), run with `runc run`.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::runc::{RuncContainer, bundle, state_pid};
use common::*;
use cuslice_test_harness::Sim;

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

engine_scenarios!(&Runc);
hostile_scenarios!(&Runc);

/// The demo's three containers, with the node agent: shares hold (checked against the simulator).
#[test]
fn demo_shares_hold_with_the_agent() {
    root_required();
    common::shares::shares_hold(&Runc);
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
    // runc itself makes the mount points of the spec's mounts (/run/simgpu/state); the hook's
    // (/etc, /etc/ld.so.preload, /run/cuslice) must be gone.
    let extra: Vec<_> = after.iter().filter(|p| !before.contains(p)).collect();
    let runcs: Vec<String> = gpu_mounts(&sim)
        .iter()
        .map(|(_, dst, _)| dst.trim_start_matches('/').to_string())
        .collect();
    assert!(
        extra
            .iter()
            .all(|p| runcs.iter().any(|m| m.starts_with(p.as_str()))),
        "left in the image: {extra:?}"
    );
    assert!(!b.path.join("rootfs/etc").exists());
}

/// An image's own /etc/ld.so.preload entries are kept, after the interposer.
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
        "/lib/x86_64-linux-gnu/libm.so.6\n/run/cuslice/lib/libcuslice.so\n"
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
