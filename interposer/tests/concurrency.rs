//! 4 processes x 8 threads allocating and freeing at random in one slice: the simulator's peak
//! never exceeds the cap, and while every request fits, none is refused.

mod common;
use common::*;

/// Runs the 4 x 8 churn; returns the `churned` lines. With `full_ok`, a process may instead have
/// been refused its context (the others had already taken the slice's memory).
fn churn_4x8(
    slice: &Slice,
    sim: &Sim,
    family: &str,
    max: &str,
    hold: &str,
    full_ok: bool,
) -> Vec<serde_json::Value> {
    let procs: Vec<_> = (0..4)
        .map(|i| {
            let seed = (i + 1).to_string();
            slice
                .command(
                    sim,
                    &workload(),
                    &[
                        "churn",
                        "--threads",
                        "8",
                        "--secs",
                        "2",
                        "--min",
                        "1MiB",
                        "--max",
                        max,
                        "--hold-max",
                        hold,
                        "--seed",
                        &seed,
                        "--family",
                        family,
                    ],
                )
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    procs
        .into_iter()
        .filter_map(|p| {
            let (lines, code, stderr) = split(p.wait_with_output().unwrap());
            if full_ok && code != 0 {
                let e = event(&lines, "error");
                assert_eq!(
                    (e["call"].as_str(), e["code"].as_u64()),
                    (Some("cuDevicePrimaryCtxRetain"), Some(2)),
                    "{e}"
                );
                return None;
            }
            assert_eq!(code, 0, "{lines:?} {stderr}");
            let c = event(&lines, "churned").clone();
            assert_eq!(c["errors"], 0, "{c}");
            Some(c)
        })
        .collect()
}

#[test]
fn random_churn_never_crosses_the_cap_and_never_refuses_what_fits() {
    let _turn = serial();
    for family in ["mem", "vmm"] {
        // Fits: 4 contexts (1200 MiB) + 32 threads x 2 blocks x at most 8 MiB (512 MiB) < 2 GiB.
        let sim = Sim::new(&["--memory", "8GiB"]);
        let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "2GiB")]);
        let runs = churn_4x8(&slice, &sim, family, "8MiB", "2", false);
        assert_eq!(runs.len(), 4);
        for c in &runs {
            assert_eq!(
                c["refused"], 0,
                "{family}: a request that fitted was refused: {c}"
            );
            assert!(u(&c["allocs"]) > 1000, "{c}");
        }
        // Does not fit: up to 32 x 4 x 64 MiB wanted of 848 MiB left.
        let sim = Sim::new(&["--memory", "8GiB"]);
        let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "2GiB")]);
        let runs = churn_4x8(&slice, &sim, family, "64MiB", "4", true);
        assert!(runs.len() >= 2, "{family}: {runs:?}");
        let refused: u64 = runs.iter().map(|c| u(&c["refused"])).sum();
        assert!(refused > 0, "{family}: nothing refused: {runs:?}");
        let peak = peak_used(&sim, 0);
        assert!(
            peak <= 2 * GIB,
            "{family}: the slice held {peak} bytes under a 2 GiB cap"
        );
        assert!(
            peak > 2 * GIB - 128 * MIB,
            "{family}: the slice never came near its cap ({peak})"
        );
        assert_eq!(used(&sim, 0), 0);
    }
}
