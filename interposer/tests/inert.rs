//! The library loads into every process of a container: it must change nothing for processes
//! that never use CUDA, and its dlsym override must answer only the exact names it wraps,
//! keeping every other lookup (RTLD_NEXT ones of other libraries included) as it was.

mod common;
use common::*;
use std::process::Command;

fn run(
    cmd: &[&str],
    preload: Option<&str>,
    env: &[(&str, &str)],
) -> (Option<i32>, Vec<u8>, Vec<u8>) {
    let mut c = Command::new(cmd[0]);
    c.args(&cmd[1..]);
    c.env_remove("LD_PRELOAD");
    if let Some(p) = preload {
        c.env("LD_PRELOAD", p);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    (o.status.code(), o.stdout, o.stderr)
}

#[test]
fn true_and_sh_behave_as_without_the_library_even_with_a_bad_setting() {
    let lib = libcuslice().display().to_string();
    let script = "echo out; echo err >&2; ls / >/dev/null; exit 3";
    for env in [
        &[][..],
        &[("CUSLICE_MEMORY_LIMIT", "12XB")][..],
        &[("CUSLICE_MEMORY_LIMIT", "1GiB")][..],
    ] {
        for cmd in [
            &["/bin/true"][..],
            &["/bin/false"][..],
            &["sh", "-c", script][..],
        ] {
            let without = run(cmd, None, env);
            let with = run(cmd, Some(&lib), env);
            assert_eq!(
                with, without,
                "{cmd:?} with {env:?} behaves differently under the library"
            );
        }
    }
}

#[test]
fn dlsym_answers_exactly_the_wrapped_names_and_keeps_rtld_next_relative_to_the_caller() {
    let tmp = tempfile::tempdir().unwrap();
    let probe = build_c(tmp.path(), "dlsym_probe.c", "dlsym_probe", false);
    let wrapper = build_c(tmp.path(), "next_wrapper.c", "next_wrapper.so", true);
    let sim = Sim::new(&[]);
    let names = [
        "cuMemAlloc_v2",
        "cuMemAlloc",
        "cuGetProcAddress_v2",
        "cuLaunchKernel_ptsz",
        "cuDeviceGetName",
        "cuMemAllocPitch_v2",
        "cudnnCreate",
        "cuMemAlloc_v3",
        "nvmlDeviceGetMemoryInfo",
    ];
    let preload = format!("{}:{}", libcuslice().display(), wrapper.display());
    let out = sim
        .command(&probe, &names)
        .env("LD_PRELOAD", &preload)
        .env("CUSLICE_MEMORY_LIMIT", "1GiB")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "probe failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<&str> = text.lines().collect();
    assert_eq!(
        got,
        [
            "cuMemAlloc_v2 cuslice",
            "cuMemAlloc cuslice",
            "cuGetProcAddress_v2 cuslice",
            // A per-thread-stream twin has a wrapper of its own.
            "cuLaunchKernel_ptsz cuslice",
            // Not wrapped: the driver's own, behind cuslice's gate stub (which holds the calls
            // of a frozen process).
            "cuDeviceGetName cuslice",
            "cuMemAllocPitch_v2 cuslice",
            // Not a driver name at all: not found, with dlerror set, as without cuslice.
            "cudnnCreate null dlerror",
            "cuMemAlloc_v3 null dlerror",
            // An NVML name looked up in libcuda's scope is not there.
            "nvmlDeviceGetMemoryInfo null dlerror",
            // next_wrapper.so's dlsym(RTLD_NEXT, "getpid") still finds libc's getpid.
            "getpid ok",
            "RTLD_DEFAULT:cuMemAlloc_v2 cuslice",
            "RTLD_DEFAULT:cuDeviceGetName cuslice",
        ]
    );
}
