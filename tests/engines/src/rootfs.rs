//! The root filesystem every test container runs: busybox, the test workload, the libraries they
//! need and the LD_AUDIT module a hostile process uses; as a directory or as a tarball for engines
//! that import images.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use cuslice_test_harness::bin_dir;

/// A minimal glibc root filesystem: busybox (static or Debian's dynamically linked one), the test
/// workload and the libraries they need.
/// No /etc and no /run: the hook has to make its mount points (and remove them afterwards).
pub fn make_rootfs(dir: &Path) {
    let run = |c: &mut Command| {
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{c:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for d in [
        "bin",
        "lib/x86_64-linux-gnu",
        "lib64",
        "usr/lib/x86_64-linux-gnu",
        "proc",
        "sys",
        "dev",
        "tmp",
    ] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    run(Command::new("cp")
        .arg(busybox())
        .arg(dir.join("bin/busybox")));
    // Debian's `busybox` package links libc and libresolv; `busybox-static` nothing.
    copy_libraries(Path::new(busybox()), dir);
    for tool in [
        "sh", "cat", "echo", "ls", "env", "sleep", "test", "grep", "umount", "mount", "true",
    ] {
        std::os::unix::fs::symlink("busybox", dir.join("bin").join(tool)).unwrap();
    }
    run(Command::new("cp")
        .arg(bin_dir().join("cuda-workload"))
        .arg(dir.join("bin/")));
    for lib in ["libc.so.6", "libgcc_s.so.1", "libm.so.6"] {
        run(Command::new("cp")
            .arg(Path::new("/lib/x86_64-linux-gnu").join(lib))
            .arg(dir.join("lib/x86_64-linux-gnu/")));
    }
    run(Command::new("cp")
        .arg("/lib64/ld-linux-x86-64.so.2")
        .arg(dir.join("lib64/")));
    // Also where a Debian image has it, and where a second link map (an audit module's) finds
    // it by name.
    run(Command::new("cp")
        .arg("/lib64/ld-linux-x86-64.so.2")
        .arg(dir.join("lib/x86_64-linux-gnu/")));
    run(Command::new("cp")
        .arg(drop_preload())
        .arg(dir.join("lib/drop-preload.so")));
}

/// tests/data/drop-preload.c built (once per test binary): an LD_AUDIT module with which a
/// process keeps /etc/ld.so.preload's cuslice from loading; in every test rootfs at
/// /lib/drop-preload.so.
fn drop_preload() -> &'static Path {
    static SO: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &SO.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let so = dir.path().join("drop-preload.so");
        let src = bin_dir().join("../../tests/data/drop-preload.c");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&so)
            .arg(&src)
            .output()
            .expect("cc is missing: apt-get install gcc (tests/tools/ensure-tools does)");
        assert!(
            out.status.success(),
            "cc {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        (dir, so)
    })
    .1
}

/// The shared libraries `program` needs (by ldd; none for a static one), each copied to the
/// same path under `root`.
pub fn copy_libraries(program: &Path, root: &Path) {
    let out = Command::new("ldd")
        .arg(program)
        .output()
        .unwrap_or_else(|e| panic!("ldd {}: {e}", program.display()));
    for lib in String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
    {
        let to = root.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        // Dereferenced: the library itself, not a link to a file the root does not hold.
        std::fs::copy(lib, &to).unwrap_or_else(|e| panic!("copy {lib}: {e}"));
    }
}

fn busybox() -> &'static str {
    for p in ["/bin/busybox", "/usr/bin/busybox"] {
        if Path::new(p).exists() {
            return p;
        }
    }
    panic!("busybox is missing: apt-get install busybox-static (tests/tools/ensure-tools does)")
}

/// A rootfs tarball for engines that import images (docker import, podman import).
pub fn rootfs_tar() -> &'static Path {
    static TAR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &TAR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        make_rootfs(&dir.path().join("rootfs"));
        let tar = dir.path().join("rootfs.tar");
        let out = Command::new("tar")
            .arg("-C")
            .arg(dir.path().join("rootfs"))
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .output()
            .unwrap();
        assert!(out.status.success());
        (dir, tar)
    })
    .1
}
