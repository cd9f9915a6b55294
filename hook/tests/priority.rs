//! `CUSLICE_PRIORITY` through the hook with plain runc: the `cuslice.io/priority` annotation and
//! the environment variable reach the slice configuration the interposer reads in the container,
//! and a bad value refuses the container with one line.

mod common;

use std::process::{Command, Output, Stdio};

use common::runc::bundle;
use common::*;
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
