//! Bad configuration refuses CUDA with one line naming the variable, the value and an example;
//! aliases work; a ledger the library does not understand is refused, clearly.

mod common;
use common::*;

/// Runs `info` with `env` (plus a fresh slice dir unless `env` names one) and returns
/// (exit code, cuslice's stderr lines, JSON lines).
fn info_with(sim: &Sim, env: &[(&str, &str)]) -> (i32, Vec<String>, Vec<serde_json::Value>) {
    let slice = Slice::new(&[]);
    let mut c = slice.command(sim, &workload(), &["info"]);
    for (k, v) in env {
        c.env(k, v);
    }
    let (lines, code, stderr) = split(c.output().unwrap());
    let ours = stderr
        .lines()
        .filter(|l| l.starts_with("cuslice:"))
        .map(String::from)
        .collect();
    (code, ours, lines)
}

#[test]
fn every_bad_value_refuses_cuda_with_one_line_naming_it() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    // (environment, the variable the line must name, the value it must show)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: &[Case] = &[
        (
            &[("CUSLICE_MEMORY_LIMIT", "12XB")],
            "CUSLICE_MEMORY_LIMIT",
            "12XB",
        ),
        (
            &[("CUSLICE_MEMORY_LIMIT", "-1GiB")],
            "CUSLICE_MEMORY_LIMIT",
            "-1GiB",
        ),
        (
            &[("CUSLICE_MEMORY_LIMIT", "0")],
            "CUSLICE_MEMORY_LIMIT",
            "0",
        ),
        (&[("CUSLICE_MEMORY_LIMIT", "")], "CUSLICE_MEMORY_LIMIT", ""),
        (
            &[("CUSLICE_MEMORY_LIMIT", "lots")],
            "CUSLICE_MEMORY_LIMIT",
            "lots",
        ),
        (
            &[("CUSLICE_MEMORY_LIMIT_x", "1GiB")],
            "CUSLICE_MEMORY_LIMIT_x",
            "1GiB",
        ),
        (
            &[("CUSLICE_MEMORY_LIMIT_0", "1.0000001KiB")],
            "CUSLICE_MEMORY_LIMIT_0",
            "1.0000001KiB",
        ),
        (
            &[("CUSLICE_MEMORY_LIMT", "1GiB")],
            "CUSLICE_MEMORY_LIMT",
            "1GiB",
        ),
        (
            &[("CUSLICE_CORE_LIMIT", "150")],
            "CUSLICE_CORE_LIMIT",
            "150",
        ),
        (&[("CUSLICE_CORE_LIMIT", "-5")], "CUSLICE_CORE_LIMIT", "-5"),
        (&[("CUSLICE_CORE_LIMIT", "0")], "CUSLICE_CORE_LIMIT", "0"),
        (
            &[("CUSLICE_CORE_REQUEST", "80"), ("CUSLICE_CORE_LIMIT", "50")],
            "CUSLICE_CORE_REQUEST",
            "80",
        ),
        (
            &[("CUDA_DEVICE_MEMORY_LIMIT", "4x")],
            "CUDA_DEVICE_MEMORY_LIMIT",
            "4x",
        ),
        (
            &[("CUDA_DEVICE_SM_LIMIT", "-1")],
            "CUDA_DEVICE_SM_LIMIT",
            "-1",
        ),
        (
            &[("ALIYUN_COM_GPU_MEM_CONTAINER", "abc")],
            "ALIYUN_COM_GPU_MEM_CONTAINER",
            "abc",
        ),
        (
            &[
                ("ALIYUN_COM_GPU_MEM_CONTAINER", "2"),
                ("ALIYUN_COM_GPU_MEM_UNIT", "parsec"),
            ],
            "ALIYUN_COM_GPU_MEM_UNIT",
            "parsec",
        ),
        (&[("CUSLICE_LOG", "loud")], "CUSLICE_LOG", "loud"),
        // A name in lower case, or one letter off, would do nothing.
        (
            &[("cuslice_memory_limit", "1GiB")],
            "CUSLICE_MEMORY_LIMIT=1GiB",
            "1GiB",
        ),
        (
            &[("CUSLCE_CORE_LIMIT", "30")],
            "CUSLICE_CORE_LIMIT=30",
            "30",
        ),
        // A decimal unit: 10^9 or 2^30? The line shows the binary spelling.
        (
            &[("CUSLICE_MEMORY_LIMIT", "1.5GB")],
            "CUSLICE_MEMORY_LIMIT=1.5GiB",
            "1.5GB",
        ),
        // Device 1 on a machine of one device: the setting would apply to none.
        (
            &[("CUSLICE_MEMORY_LIMIT_1", "1GiB")],
            "CUSLICE_MEMORY_LIMIT_0=1GiB",
            "names device 1, but this process sees 1 CUDA device",
        ),
        (&[("CUSLICE_STATE_DIR", "")], "CUSLICE_STATE_DIR", ""),
        (
            &[
                ("CUSLICE_MEMORY_LIMIT", "1GiB"),
                ("CUSLICE_STATE_DIR", "/proc/cuslice-cannot-be-here"),
            ],
            "/proc/cuslice-cannot-be-here",
            "",
        ),
    ];
    for (env, variable, value) in cases {
        let (code, ours, lines) = info_with(&sim, env);
        assert_ne!(code, 0, "{env:?} was accepted");
        assert_eq!(event(&lines, "error")["code"], 800, "{env:?}: {lines:?}");
        assert_eq!(ours.len(), 1, "{env:?}: want one line, got {ours:?}");
        assert!(
            ours[0].contains(variable),
            "{env:?}: {:?} does not name {variable}",
            ours[0]
        );
        assert!(
            ours[0].contains(value),
            "{env:?}: {:?} does not show {value:?}",
            ours[0]
        );
        assert!(
            ours[0].contains("e.g.") || variable.starts_with('/'),
            "{env:?}: no example in {:?}",
            ours[0]
        );
    }
    assert_eq!(used(&sim, 0), 0);
}

/// A cap smaller than one CUDA context (4096 bytes; a context takes 300 MiB on this simulated
/// device): the context is refused, and one line says why, with the context's size and a cap
/// that would hold one. By the simulator's count nothing is left on the device.
#[test]
fn a_cap_smaller_than_a_context_says_so_with_the_contexts_size() {
    let sim = Sim::new(&["--memory", "8GiB", "--context-overhead", "300MiB"]);
    let (code, ours, lines) = info_with(&sim, &[("CUSLICE_MEMORY_LIMIT", "4096")]);
    assert_ne!(code, 0, "{lines:?}");
    assert_eq!(event(&lines, "error")["code"], 2, "{lines:?}");
    assert_eq!(ours.len(), 1, "want one line, got {ours:?}");
    assert_eq!(
        ours[0],
        "cuslice: CUSLICE_MEMORY_LIMIT=4096 (4 KiB) is smaller than one CUDA context on device 0 \
         (300 MiB, what the slice's first context there took); no context fits, so CUDA calls \
         fail with CUDA_ERROR_OUT_OF_MEMORY; write e.g. CUSLICE_MEMORY_LIMIT=1GiB (a cap covers \
         the slice's contexts too)"
    );
    assert_eq!(used(&sim, 0), 0);
    // A cap that holds a context is not refused for it.
    let (code, ours, _) = info_with(&sim, &[("CUSLICE_MEMORY_LIMIT", "512MiB")]);
    assert_eq!((code, ours.len()), (0, 0), "{ours:?}");
}

#[test]
fn aliases_set_the_cap_and_cuslice_names_win_a_conflict_with_a_notice() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let total = |env: &[(&str, &str)]| {
        let (code, ours, lines) = info_with(&sim, env);
        assert_eq!(code, 0, "{env:?}: {ours:?}");
        (u(&event(&lines, "info")["mem_get_info"]["total"]), ours)
    };
    assert_eq!(
        total(&[("CUDA_DEVICE_MEMORY_LIMIT", "1536m")]).0,
        1536 * MIB
    );
    assert_eq!(total(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "2g")]).0, 2 * GIB);
    assert_eq!(total(&[("ALIYUN_COM_GPU_MEM_CONTAINER", "3")]).0, 3 * GIB);
    assert_eq!(
        total(&[
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "512"),
            ("ALIYUN_COM_GPU_MEM_UNIT", "MiB")
        ])
        .0,
        512 * MIB
    );
    let (t, notices) = total(&[
        ("CUSLICE_MEMORY_LIMIT", "1GiB"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
    ]);
    assert_eq!(t, GIB);
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(
        notices[0].contains("CUDA_DEVICE_MEMORY_LIMIT=2g")
            && notices[0].contains("CUSLICE_MEMORY_LIMIT")
    );
    // Per-device beats all-devices.
    assert_eq!(
        total(&[
            ("CUSLICE_MEMORY_LIMIT", "1GiB"),
            ("CUSLICE_MEMORY_LIMIT_0", "2GiB")
        ])
        .0,
        2 * GIB
    );
    // A cap above the device's memory reports the device's memory.
    assert_eq!(total(&[("CUSLICE_MEMORY_LIMIT", "64GiB")]).0, 8 * GIB);
    // Quiet by default: a good configuration prints nothing.
    assert!(total(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]).1.is_empty());
}

#[test]
fn processes_of_one_slice_must_agree_on_the_cap() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
    let (_, code, _) = slice.run(&sim, &["info"]);
    assert_eq!(code, 0);
    let dir = slice.dir.path().display().to_string();
    let (code, ours, lines) = info_with(
        &sim,
        &[
            ("CUSLICE_STATE_DIR", &dir),
            ("CUSLICE_MEMORY_LIMIT", "2GiB"),
        ],
    );
    assert_ne!(code, 0);
    assert_eq!(event(&lines, "error")["code"], 800);
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert!(
        ours[0].contains("2 GiB") && ours[0].contains("1 GiB"),
        "{ours:?}"
    );
    // Without a cap of its own, a process inherits the slice's.
    let (code, _, lines) = info_with(&sim, &[("CUSLICE_STATE_DIR", &dir)]);
    assert_eq!(code, 0);
    assert_eq!(u(&event(&lines, "info")["mem_get_info"]["total"]), GIB);
}

#[test]
fn a_foreign_damaged_or_newer_ledger_is_refused_and_left_alone() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let good = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
    good.run(&sim, &["info"]);
    let real = std::fs::read(good.ledger()).unwrap();
    let mut newer = real.clone();
    newer[8..12].copy_from_slice(&99u32.to_ne_bytes());
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "foreign",
            b"#!/bin/sh\necho not a ledger\n".to_vec(),
            "not a cuslice ledger",
        ),
        ("empty", Vec::new(), "not a cuslice ledger"),
        ("newer", newer, "version 99"),
        ("truncated", real[..4096].to_vec(), "damaged"),
    ];
    for (what, bytes, says) in cases {
        let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
        std::fs::write(slice.ledger(), &bytes).unwrap();
        let (lines, code, stderr) = slice.run(&sim, &["info"]);
        assert_ne!(code, 0, "{what} ledger accepted");
        assert_eq!(event(&lines, "error")["code"], 800);
        let ours: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("cuslice:"))
            .collect();
        assert_eq!(ours.len(), 1, "{what}: {ours:?}");
        assert!(
            ours[0].contains(says) && ours[0].contains("ledger"),
            "{what}: {ours:?}"
        );
        assert_eq!(
            std::fs::read(slice.ledger()).unwrap(),
            bytes,
            "{what} ledger was modified"
        );
    }
}
