//! libcuslice.so is a small loader; the interposer is libcuslice_core.so beside it, loaded when
//! a process first reaches CUDA or NVML. These check what that split promises: a process that
//! never uses CUDA maps only the loader; every route into the driver still reaches the core
//! (the other test files run every scenario through the loader too); and a missing or foreign
//! core fails closed with one line instead of leaving the process uncapped.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn cc(args: &[&str]) {
    let out = Command::new("cc").args(args).output().expect("cc");
    assert!(
        out.status.success(),
        "cc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Exported names of a shared object, from `nm -D --defined-only`.
fn exports(lib: &Path) -> Vec<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .expect("nm (binutils) is needed");
    assert!(out.status.success());
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("T"))
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .collect();
    names.sort();
    names
}

fn core_lib() -> PathBuf {
    libcuslice().with_file_name("libcuslice_core.so")
}

#[test]
fn the_loader_exports_every_entry_point_the_core_wraps_and_needs_only_libc() {
    let loader = exports(&libcuslice());
    let core = exports(&core_lib());
    let wrapped = |names: &[String]| -> Vec<String> {
        names
            .iter()
            .filter(|n| n.starts_with("cu") || n.starts_with("nvml"))
            .filter(|n| !n.starts_with("cuslice_"))
            .cloned()
            .collect()
    };
    assert!(wrapped(&core).len() > 60, "{core:?}");
    assert_eq!(wrapped(&loader), wrapped(&core));
    assert!(loader.iter().any(|n| n == "dlsym"), "{loader:?}");
    assert!(loader.iter().any(|n| n == "dlmopen"), "{loader:?}");
    // The core no longer overrides dlsym/dlmopen itself: the loader's do, and hand over.
    assert!(
        !core.iter().any(|n| n == "dlsym" || n == "dlmopen"),
        "{core:?}"
    );

    let out = Command::new("readelf")
        .arg("-d")
        .arg(libcuslice())
        .output()
        .expect("readelf");
    let needed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .map(|l| {
            l.rsplit('[')
                .next()
                .unwrap_or("")
                .trim_end_matches(']')
                .to_owned()
        })
        .collect();
    assert_eq!(needed, ["libc.so.6"], "the loader's dependencies");
}

#[test]
fn a_process_that_never_uses_cuda_maps_the_loader_and_nothing_else_of_cuslice() {
    let out = Command::new("cat")
        .arg("/proc/self/maps")
        .env("LD_PRELOAD", libcuslice())
        .env("CUSLICE_MEMORY_LIMIT", "1GiB")
        .output()
        .unwrap();
    assert!(out.status.success());
    let maps = String::from_utf8_lossy(&out.stdout);
    assert!(maps.contains("/libcuslice.so"), "{maps}");
    assert!(!maps.contains("libcuslice_core.so"), "{maps}");
    assert!(!maps.contains("libgcc_s"), "{maps}");
}

#[test]
fn a_library_opened_before_cuda_and_a_child_forked_before_cuda_share_the_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/late_user.c");
    let src = src.to_str().unwrap();
    // A link stub named like the driver (as the toolkit's stubs/libcuda.so): libuser.so then
    // needs libcuda.so.1, which simgpu provides at run time.
    std::fs::write(
        dir.join("stub.c"),
        "void cuInit(void){} void cuDevicePrimaryCtxRetain(void){} \
         void cuCtxSetCurrent(void){} void cuMemAlloc_v2(void){}\n",
    )
    .unwrap();
    let d = dir.to_str().unwrap();
    cc(&[
        "-shared",
        "-fPIC",
        "-Wl,-soname,libcuda.so.1",
        "-o",
        &format!("{d}/libcuda.so"),
        &format!("{d}/stub.c"),
    ]);
    std::fs::remove_file(dir.join("stub.c")).unwrap();
    cc(&[
        "-shared",
        "-fPIC",
        "-DLIBUSER",
        "-o",
        &format!("{d}/libuser.so"),
        src,
        &format!("-L{d}"),
        "-lcuda",
    ]);
    std::fs::remove_file(dir.join("libcuda.so")).unwrap();
    cc(&["-O1", "-o", &format!("{d}/late_user"), src, "-ldl"]);

    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
    let out = slice
        .command(
            &sim,
            &dir.join("late_user"),
            &[&format!("{d}/libuser.so"), "600"],
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    // 600 MiB each: the second one, beside the child's, would cross the 1 GiB cap.
    assert_eq!(
        lines,
        ["child 0", "parent-alone 0", "parent-beside-child 2"],
        "CUresult of each allocation"
    );
    assert!(peak_used(&sim, 0) <= GIB, "peak {}", peak_used(&sim, 0));
}

/// Runs `cuda-workload info` with `loader` preloaded: (stdout, exit code, stderr).
fn info_with(loader: &Path, sim: &Sim) -> (Vec<serde_json::Value>, i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = sim
        .command(&workload(), &["info"])
        .env("LD_PRELOAD", loader)
        .env("CUSLICE_MEMORY_LIMIT", "1GiB")
        .env("CUSLICE_STATE_DIR", dir.path())
        .output()
        .unwrap();
    split(out)
}

#[test]
fn without_its_core_the_loader_says_so_once_and_cuda_fails_instead_of_running_uncapped() {
    let sim = Sim::new(&[]);
    let tmp = tempfile::tempdir().unwrap();
    let loader = tmp.path().join("libcuslice.so");
    std::fs::copy(libcuslice(), &loader).unwrap();

    // No core beside it.
    let (lines, code, stderr) = info_with(&loader, &sim);
    assert_ne!(code, 0, "{lines:?}");
    let err = event(&lines, "error");
    assert_eq!(err["code"], 3, "{err}");
    assert_eq!(err["name"], "CUDA_ERROR_NOT_INITIALIZED");
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("cuslice:"))
        .collect();
    assert_eq!(ours.len(), 1, "{stderr}");
    assert!(
        ours[0].contains(&format!("{}/libcuslice_core.so", tmp.path().display()))
            && ours[0].contains("beside libcuslice.so"),
        "{}",
        ours[0]
    );
    // A process that never reaches CUDA is not bothered.
    let t = Command::new("/bin/true")
        .env("LD_PRELOAD", &loader)
        .output()
        .unwrap();
    assert!(t.status.success() && t.stderr.is_empty());

    // A file of that name that is not cuslice's core (here: the simulator's NVML).
    std::fs::copy(
        bin_dir().join("libsimgpu_nvml.so"),
        tmp.path().join("libcuslice_core.so"),
    )
    .unwrap();
    let (lines, code, stderr) = info_with(&loader, &sim);
    assert_ne!(code, 0, "{lines:?}");
    assert_eq!(event(&lines, "error")["code"], 3);
    assert!(stderr.contains("lacks the loader's interface"), "{stderr}");
    // The device was never touched by an uncapped process.
    assert_eq!(peak_used(&sim, 0), 0);
}

#[test]
fn a_symbolic_link_to_the_loader_finds_the_core_beside_the_file_it_points_to() {
    let sim = Sim::new(&[]);
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("libcuslice.so");
    std::os::unix::fs::symlink(libcuslice(), &link).unwrap();
    let (lines, code, stderr) = info_with(&link, &sim);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("cuslice:"), "{stderr}");
    // The cap applies: the total CUDA reports is the slice's.
    assert_eq!(u(&event(&lines, "start")["total"]), GIB, "{lines:?}");
}
