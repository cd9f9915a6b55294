//! `CUSLICE_PRIORITY` through the hook with plain runc: the `cuslice.io/priority` annotation and
//! the environment variable reach the slice configuration the interposer reads in the container,
//! and a bad value refuses the container with one line; a high-priority probe container waits
//! less beside a low-priority neighbour container than two containers without priority do.

use std::process::{Command, Output, Stdio};

use cuslice_test_engines::runc::{RuncContainer, bundle};
use cuslice_test_engines::*;
use cuslice_test_harness::Sim;
use serde_json::json;

/// Runs `cmd` in a runc container with `env` and `annotations`; its output.
fn run(sim: &Sim, what: &str, env: &[&str], annotations: &[(&str, &str)], cmd: &[&str]) -> Output {
    let n = name(what);
    let b = bundle(
        sim,
        &Spec {
            name: &n,
            env,
            cmd,
            read_only: false,
        },
        &[],
    );
    let path = b.path.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c["annotations"] = json!(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect::<serde_json::Map<_, _>>()
    );
    std::fs::write(&path, serde_json::to_string_pretty(&c).unwrap()).unwrap();
    let out = Command::new("runc")
        .args(["run", &n])
        .current_dir(&b.path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = Command::new("runc")
        .args(["delete", "--force", &n])
        .output();
    out
}

const CONFIG: &[&str] = &["cat", "/run/cuslice/slice/config"];

#[test]
fn the_priority_annotation_and_variable_reach_the_slice() {
    root_required();
    let sim = Sim::new(&[]);
    for (env, annotations, want) in [
        (
            &[][..],
            &[("cuslice.io/priority", "high")][..],
            "CUSLICE_PRIORITY=high\n",
        ),
        (
            &["CUSLICE_PRIORITY=low"][..],
            &[][..],
            "CUSLICE_PRIORITY=low\n",
        ),
    ] {
        let out = run(&sim, "prio", env, annotations, CONFIG);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(want),
            "{env:?} {annotations:?}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn a_bad_priority_annotation_refuses_the_container_with_one_line() {
    root_required();
    let sim = Sim::new(&[]);
    let out = run(
        &sim,
        "prio-bad",
        &[],
        &[("cuslice.io/priority", "urgent")],
        &["echo", "STARTED"],
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "started anyway: {all}");
    assert!(!all.contains("STARTED"), "{all}");
    let line = "annotation cuslice.io/priority: CUSLICE_PRIORITY=\"urgent\" is not a priority (high, \
                normal or low); write e.g. CUSLICE_PRIORITY=high";
    assert!(
        all.contains(line) || all.contains(&line.replace('"', "\\\"")),
        "{all}"
    );
}

/// A probe container's latencies (ns), beside a neighbour container launching 1 ms kernels with
/// `neighbour_env`, or alone.
fn probe_beside(sim: &Sim, probe_env: &[&str], neighbour_env: Option<&[&str]>) -> Vec<u64> {
    let nn = name("prio-neighbour");
    let neighbour = neighbour_env.map(|env| {
        let mut neighbour = RuncContainer::start(
            sim,
            &Spec {
                name: &nn,
                env,
                cmd: &[
                    "cuda-workload",
                    "launch",
                    "--ns-per-block",
                    "1000",
                    "--blocks",
                    "1000",
                    "--secs",
                    "30",
                ],
                read_only: false,
            },
            &[],
        );
        wait_for(&mut neighbour, "start");
        neighbour
    });
    let out = run(
        sim,
        "prio-probe",
        probe_env,
        &[],
        &[
            "cuda-workload",
            "probe",
            "--secs",
            "3",
            "--warmup-secs",
            "1.5",
        ],
    );
    if let Some(neighbour) = neighbour {
        Box::new(neighbour).remove();
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let probed = cuslice_test_harness::parse_lines(&text)
        .into_iter()
        .find(|v| v["event"] == "probed")
        .unwrap_or_else(|| panic!("{text} {}", String::from_utf8_lossy(&out.stderr)));
    probed["latencies_ns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

/// Judged by the host's timing (a probe is late where a handoff's threads ran late): one that
/// fails is run once more (`twice`). In one full run on a busy host a quarter of the probes
/// beside a low-priority neighbour came late (149 of 584; 238 of 601 beside a normal one).
#[test]
fn a_high_priority_probe_container_waits_less_beside_a_low_priority_one() {
    root_required();
    let _serial = cuslice_test_harness::serial();
    cuslice_test_harness::twice(high_priority_probe_waits_less_once);
}

fn high_priority_probe_waits_less_once() {
    let sim = Sim::new(&[]);
    // Alone: what this host adds to a probe's own latency (waking its thread, the container's
    // share of the CPUs), the yardstick for "late" below.
    let alone = probe_beside(&sim, &[], None);
    // Without priority (no cuslice settings): the probe waits for the rest of the neighbour's
    // time slice, up to 2 ms.
    let normal = probe_beside(&sim, &[], Some(&[]));
    let prio = probe_beside(
        &sim,
        &["CUSLICE_PRIORITY=high"],
        Some(&["CUSLICE_PRIORITY=low"]),
    );
    let quantile = |v: &[u64], q: f64| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v[((v.len() - 1) as f64 * q) as usize]
    };
    let median = |v: &[u64]| quantile(v, 0.5);
    // Later than one neighbour kernel (1 ms) and what the probe takes alone on this host (its
    // 90th percentile), with a quarter of a millisecond to spare.
    let limit = 1_250_000 + quantile(&alone, 0.9);
    let late = |v: &[u64]| v.iter().filter(|&&ns| ns > limit).count();
    assert!(normal.len() > 300 && prio.len() > 300);
    // Shown with --nocapture.
    eprintln!(
        "probe median {} / {} / {} ns, later than {limit} ns {} / {} of {} / {} (priority / none / alone)",
        median(&prio),
        median(&normal),
        median(&alone),
        late(&prio),
        late(&normal),
        prio.len(),
        normal.len()
    );
    assert!(
        median(&prio) < median(&normal),
        "median {} ns with priority, {} ns without",
        median(&prio),
        median(&normal)
    );
    // Beside a high-priority slice the neighbour keeps nothing queued beyond its kernel running:
    // a probe is late only where the host ran a handoff's threads late (on a quiet host 2 of 600,
    // on a busy one about a tenth).
    assert!(
        late(&prio) * 5 < prio.len(),
        "probes later than {limit} ns with priority: {} of {}",
        late(&prio),
        prio.len()
    );
    assert!(
        late(&prio) * 2 < late(&normal),
        "probes later than {limit} ns: {} of {} with priority, {} of {} without",
        late(&prio),
        prio.len(),
        late(&normal),
        normal.len()
    );
}
