//! What real engines make of the files `cuslice install` writes, where the engine is installed
//! (each test prints a skip line and passes otherwise). Nothing here touches the machine's own
//! configuration: every path (`--config`, `--prefix`) is in a temporary directory.
//!
//! - containerd: `containerd --config FILE config dump` merges config.toml with the drop-in the way
//!   the daemon would; the runtime must be there and config.toml's CRI settings must survive.
//! - Podman: a container run with the hooks.d descriptors runs the (stand-in) hook at
//!   createRuntime and poststop with the arguments install wrote.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_cuslice");

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

fn fake_from(dir: &Path, hook_script: &str) {
    fs::create_dir_all(dir).expect("mkdir");
    fs::write(dir.join("cuslice-hook"), hook_script).expect("write");
    fs::set_permissions(
        dir.join("cuslice-hook"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    for f in [
        "cuslice-runtime",
        "cuslice",
        "libcuslice.so",
        "libcuslice_core.so",
    ] {
        fs::write(dir.join(f), f).expect("write");
    }
}

#[track_caller]
fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn containerd_merges_the_dropin_and_keeps_the_cri_settings() {
    if !have("containerd") {
        eprintln!("skipped: no containerd");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    fake_from(&d.join("from"), "#!/bin/sh\n");
    let config = d.join("config.toml");
    fs::write(
        &config,
        "version = 2\n\n\
         [plugins.\"io.containerd.grpc.v1.cri\"]\n\
         \x20 sandbox_image = \"registry.k8s.io/pause:3.9\"\n\
         \x20 [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n\
         \x20   runtime_type = \"io.containerd.runc.v2\"\n\
         \x20   [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n\
         \x20     SystemdCgroup = true\n",
    )
    .expect("write");
    let prefix = d.join("prefix");
    ok(&Command::new(BIN)
        .args([
            "install",
            "--no-agent",
            "--engine",
            "containerd",
            "--config",
        ])
        .arg(&config)
        .arg("--prefix")
        .arg(&prefix)
        .arg("--from")
        .arg(d.join("from"))
        .output()
        .expect("install"));
    let dump = ok(&Command::new("containerd")
        .arg("--config")
        .arg(&config)
        .args(["config", "dump"])
        .output()
        .expect("containerd config dump"));
    let runtime = format!(
        "BinaryName = \"{}\"",
        prefix.join("bin/cuslice-runtime").display()
    );
    assert!(dump.contains(&runtime), "{dump}");
    assert!(
        dump.contains("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.cuslice]"),
        "{dump}"
    );
    assert!(dump.contains("SystemdCgroup = true"), "{dump}");
    assert!(
        dump.contains("sandbox_image = \"registry.k8s.io/pause:3.9\""),
        "{dump}"
    );
    assert!(
        dump.contains("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]"),
        "{dump}"
    );

    // And with no CRI section in config.toml: runc stays the default runtime.
    fs::write(&config, "version = 2\n").expect("write");
    ok(&Command::new(BIN)
        .args([
            "install",
            "--no-agent",
            "--engine",
            "containerd",
            "--config",
        ])
        .arg(&config)
        .arg("--prefix")
        .arg(&prefix)
        .arg("--from")
        .arg(d.join("from"))
        .output()
        .expect("install"));
    let dump = ok(&Command::new("containerd")
        .arg("--config")
        .arg(&config)
        .args(["config", "dump"])
        .output()
        .expect("containerd config dump"));
    assert!(dump.contains(&runtime), "{dump}");
    assert!(
        dump.contains("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]"),
        "{dump}"
    );
}

#[test]
fn podman_runs_the_hooks_from_hooks_d() {
    // As another user podman would be rootless, which is not what this tests.
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n");
    if !have("podman") || !have("runc") || !root {
        eprintln!("skipped: needs root, podman and runc");
        return;
    }
    let Some(busybox) = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    else {
        eprintln!("skipped: no busybox for a rootfs");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let rootfs = d.join("rootfs");
    fs::create_dir_all(rootfs.join("bin")).expect("mkdir");
    fs::copy(busybox, rootfs.join("bin/busybox")).expect("copy busybox");
    // Debian's dynamically linked busybox needs its libraries there too.
    cuslice_test_engines::rootfs::copy_libraries(Path::new(busybox), &rootfs);
    std::os::unix::fs::symlink("busybox", rootfs.join("bin/true")).expect("link");
    let calls = d.join("calls");
    fake_from(
        &d.join("from"),
        &format!(
            "#!/bin/sh\necho \"$@\" >> {}\ncat > /dev/null\n",
            calls.display()
        ),
    );
    let hooks = d.join("hooks.d");
    let prefix = d.join("prefix");
    ok(&Command::new(BIN)
        .args(["install", "--no-agent", "--engine", "podman", "--config"])
        .arg(&hooks)
        .arg("--prefix")
        .arg(&prefix)
        .arg("--from")
        .arg(d.join("from"))
        .output()
        .expect("install"));

    // Every piece of podman's state in the temporary directory, none in /var/lib or /run.
    let podman_cmd = |hooks_dir: &Path| {
        let mut c = Command::new("timeout");
        c.arg("120")
            .arg("podman")
            .arg("--root")
            .arg(d.join("storage"))
            .arg("--runroot")
            .arg(d.join("run"))
            .arg("--tmpdir")
            .arg(d.join("tmp"))
            .arg("--network-config-dir")
            .arg(d.join("networks"))
            .args(["--storage-driver=vfs", "--events-backend=file"])
            .args(["--cgroup-manager=cgroupfs", "--runtime=runc"])
            .arg(format!("--hooks-dir={}", hooks_dir.display()));
        c
    };
    let podman = |hooks_dir: &Path| {
        podman_cmd(hooks_dir)
            .args([
                "run",
                "--rm",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
                "--network=none",
                "--rootfs",
            ])
            .arg(&rootfs)
            .arg("/bin/true")
            .output()
            .expect("podman")
    };
    // Where podman cannot run a container at all here, there is nothing to check.
    let empty = d.join("no-hooks");
    fs::create_dir_all(&empty).expect("mkdir");
    let baseline = podman(&empty);
    if !baseline.status.success() {
        eprintln!(
            "skipped: podman cannot run a container here: {}",
            String::from_utf8_lossy(&baseline.stderr)
        );
        return;
    }
    let run = podman(&hooks);
    let _ = podman_cmd(&hooks)
        .args(["rm", "--all", "--force", "--time", "0"])
        .output();
    ok(&run);
    let lib = prefix.join("lib/cuslice/libcuslice.so");
    assert_eq!(
        fs::read_to_string(&calls).expect("the hook ran"),
        format!(
            "createRuntime --library {}\npoststop --library {}\n",
            lib.display(),
            lib.display()
        )
    );
}
