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
