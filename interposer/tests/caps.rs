//! The memory cap, measured by the simulator: every allocation family through every route, the
//! figures applications read back, several processes in one slice, and per-device caps.

mod common;
use common::*;

const CAP: u64 = GIB;

/// The workload linked against libcuda.so.1 (route "direct").
fn linked() -> std::path::PathBuf {
    bin_dir().join("cuda-workload-linked")
}

/// Fills the device with 64 MiB chunks of `family` through `route` (or with the driver opened by
/// `dlmopen` into a new namespace) under a 1 GiB cap and checks
/// the refusal against the simulator's ground truth.
fn fill_is_capped(family: &str, route: &str) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
    let (program, mut args) = if route == "direct" {
        (linked(), vec![])
    } else if route == "dlmopen" {
        // libcuda.so.1 opened into a new link-map namespace, where no preload applies.
        (workload(), vec!["--dlmopen"])
    } else {
        (workload(), vec!["--route", route])
    };
    args.extend(["fill", "--family", family, "--chunk", "64MiB"]);
    let out = slice.command(&sim, &program, &args).output().unwrap();
    let (lines, code, stderr) = split(out);
    assert_eq!(
        code, 0,
        "{family} via {route}: exit {code}; stderr: {stderr}"
    );
    let start = event(&lines, "start");
    assert_eq!(
        u(&start["total"]),
        CAP,
        "{family} via {route}: reported total"
    );
    let refused = event(&lines, "refused");
    assert_eq!(refused["code"], 2, "{family} via {route}: {refused}");
    let peak = peak_used(&sim, 0);
    let chunk = u(&refused["chunk_bytes"]).next_multiple_of(2 * MIB);
    // Managed memory is charged in 128 MiB steps (as an H100 backs it): less than a step unused.
    let unit = if family == "managed" {
        chunk.max(128 * MIB)
    } else {
        chunk
    };
    assert!(
        peak <= CAP,
        "{family} via {route}: the device held {peak} bytes under a {CAP} cap"
    );
    assert!(
        CAP - peak < unit,
        "{family} via {route}: refused with {} MiB of the cap unused (chunk {} MiB)",
        (CAP - peak) / MIB,
        chunk / MIB
    );
    assert_eq!(used(&sim, 0), 0, "{family} via {route}: memory left behind");
}

macro_rules! family_tests {
    ($($name:ident: $family:literal;)*) => {$(
        #[test]
        fn $name() {
            for route in ["direct", "dlsym", "proc-v1", "proc-v2", "cudart-12.9", "cudart-13.0", "dlmopen"] {
                fill_is_capped($family, route);
            }
        }
    )*};
}

family_tests! {
    mem_is_capped_through_every_route: "mem";
    pitch_is_capped_through_every_route: "pitch";
    managed_is_capped_through_every_route: "managed";
    array_is_capped_through_every_route: "array";
    array3d_is_capped_through_every_route: "array3d";
    mipmap_is_capped_through_every_route: "mipmap";
    async_is_capped_through_every_route: "async";
    pool_is_capped_through_every_route: "pool";
    vmm_is_capped_through_every_route: "vmm";
}

#[test]
fn four_processes_in_one_slice_hold_at_most_the_cap_together() {
    let cap = 2 * GIB;
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "2GiB")]);
    let mut procs: Vec<Running> = (0..4)
        .map(|_| {
            slice.spawn(
                &sim,
                &[
                    "fill", "--family", "mem", "--chunk", "32MiB", "--hold", "30",
                ],
            )
        })
        .collect();
    // Each ends refused with out-of-memory: at an allocation (then holds what it got) or, when
    // the others took the cap first, already at its context.
    for p in procs.iter_mut() {
        let r = first_of(p, &["refused", "error"]);
        assert_eq!(r["code"], 2, "{r}");
    }
    let held = used(&sim, 0);
    assert!(
        held <= cap && cap - held < 300 * MIB,
        "the slice holds {held} of {cap}"
    );
    assert!(peak_used(&sim, 0) <= cap, "peak {}", peak_used(&sim, 0));
    drop(procs);
}

/// The next line whose event is one of `events`.
fn first_of(p: &mut Running, events: &[&str]) -> serde_json::Value {
    use std::io::BufRead;
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            p.out.read_line(&mut line).unwrap() > 0,
            "workload ended early"
        );
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
            && events.iter().any(|e| v["event"] == *e)
        {
            return v;
        }
    }
}

#[test]
fn a_context_that_does_not_fit_is_refused_with_out_of_memory() {
    // 300 MiB of context overhead per process: the fourth context does not fit in 1 GiB.
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
    let mut procs: Vec<Running> = (0..3)
        .map(|_| slice.spawn(&sim, &["hold", "--bytes", "2MiB"]))
        .collect();
    for p in procs.iter_mut() {
        p.wait_for("holding", std::time::Duration::from_secs(20));
    }
    let (lines, code, _) = slice.run(&sim, &["hold", "--bytes", "2MiB"]);
    assert_ne!(code, 0);
    assert_eq!(event(&lines, "error")["code"], 2, "{lines:?}");
    assert!(peak_used(&sim, 0) <= GIB);
    drop(procs);
}

#[test]
fn mem_get_info_and_nvml_agree_with_the_simulator() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "3GiB")]);
    let mut holder = slice.spawn(&sim, &["hold", "--bytes", "700MiB"]);
    holder.wait_for("holding", std::time::Duration::from_secs(20));
    let (lines, code, stderr) = slice.run(&sim, &["info"]);
    assert_eq!(code, 0, "{stderr}");
    let info = event(&lines, "info");
    // While `info` ran, the slice held everything on the device: the holder's context and
    // block (still there) and `info`'s own context (gone with it).
    let overhead = u(&sim.show()["context_overhead"]);
    let sim_used = used(&sim, 0) + overhead;
    let cap = 3 * GIB;
    let free = cap - sim_used;
    assert_eq!(u(&info["mem_get_info"]["total"]), cap);
    assert_eq!(u(&info["mem_get_info"]["free"]), free);
    assert_eq!(u(&info["devices"][0]["total"]), cap);
    let nvml = &info["nvml"]["devices"][0];
    assert_eq!(u(&nvml["memory"]["total"]), cap);
    assert_eq!(u(&nvml["memory"]["used"]), sim_used);
    assert_eq!(u(&nvml["memory"]["free"]), free);
    assert_eq!(u(&nvml["memory_v2"]["total"]), cap);
    assert_eq!(u(&nvml["memory_v2"]["used"]), sim_used);
    assert_eq!(u(&nvml["memory_v2"]["free"]), free);
    // The process list: the slice's two processes, with the simulator's per-process figures.
    let procs = nvml["processes"].as_array().unwrap();
    let truth = sim.device(0)["processes"].as_array().unwrap().clone();
    assert_eq!(procs.len(), 2, "{procs:?}");
    for p in procs {
        match truth.iter().find(|t| t["pid"] == p["pid"]) {
            Some(t) => assert_eq!(p["used"], t["held"], "{p} vs {t}"),
            None => {
                assert_eq!(p["pid"], info["pid"]);
                assert_eq!(u(&p["used"]), overhead);
            }
        }
    }
    holder.release();
}

#[test]
fn a_process_outside_the_slice_is_not_listed_and_uncapped_devices_are_untouched() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let other = Slice::new(&[]);
    let mut holder = other.spawn(&sim, &["hold", "--bytes", "100MiB"]);
    holder.wait_for("holding", std::time::Duration::from_secs(20));
    // No cap: the driver's own figures.
    let (lines, code, stderr) = other.run(&sim, &["info"]);
    assert_eq!(code, 0, "{stderr}");
    let info = event(&lines, "info");
    assert_eq!(u(&info["mem_get_info"]["total"]), 8 * GIB);
    assert_eq!(u(&info["nvml"]["devices"][0]["memory"]["total"]), 8 * GIB);
    assert_eq!(
        info["nvml"]["devices"][0]["processes"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // A capped slice beside it lists only its own process.
    let capped = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "2GiB")]);
    let (lines, _, _) = capped.run(&sim, &["info"]);
    let procs = event(&lines, "info")["nvml"]["devices"][0]["processes"].clone();
    assert_eq!(procs.as_array().unwrap().len(), 1, "{procs}");
    assert_eq!(procs[0]["pid"], event(&lines, "info")["pid"]);
    holder.release();
}

#[test]
fn per_device_caps_follow_the_device_uuid_across_a_permuted_visible_order() {
    let sim = Sim::new(&["--devices", "2", "--memory", "8GiB"]);
    let slice = Slice::new(&[
        ("CUSLICE_MEMORY_LIMIT_0", "1GiB"),
        ("CUSLICE_MEMORY_LIMIT_1", "2GiB"),
    ]);
    let (lines, code, stderr) = slice.run(&sim, &["info"]);
    assert_eq!(code, 0, "{stderr}");
    let devs = event(&lines, "info")["devices"].clone();
    assert_eq!(u(&devs[0]["total"]), GIB);
    assert_eq!(u(&devs[1]["total"]), 2 * GIB);
    // A second process of the slice sees the devices the other way round and sets no cap of its
    // own: the caps stay with the devices.
    let mut permuted = Slice {
        dir: tempfile::tempdir().unwrap(),
        env: vec![],
    };
    permuted.env.push((
        "CUSLICE_STATE_DIR".into(),
        slice.dir.path().display().to_string(),
    ));
    permuted
        .env
        .push(("CUDA_VISIBLE_DEVICES".into(), "1,0".into()));
    let (lines, code, stderr) = permuted.run(&sim, &["info"]);
    assert_eq!(code, 0, "{stderr}");
    let devs = event(&lines, "info")["devices"].clone();
    assert_eq!(devs[0]["uuid"], sim.device(1)["uuid"]);
    assert_eq!(u(&devs[0]["total"]), 2 * GIB);
    assert_eq!(u(&devs[1]["total"]), GIB);
    // And the cap holds on its ordinal 0 (the simulator's device 1).
    let (lines, code, _) = permuted.run(
        &sim,
        &[
            "--device", "0", "fill", "--family", "mem", "--chunk", "64MiB",
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(event(&lines, "refused")["code"], 2);
    let peak = peak_used(&sim, 1);
    assert!(
        peak <= 2 * GIB && 2 * GIB - peak < 64 * MIB,
        "device 1 peak {peak}"
    );
}

#[test]
fn a_context_and_its_allocations_are_released_when_the_process_exits() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
    let count = |lines: &[serde_json::Value]| u(&event(lines, "refused")["count"]);
    let (first, _, _) = slice.run(&sim, &["fill", "--family", "mem", "--chunk", "16MiB"]);
    for _ in 0..3 {
        let (again, _, _) = slice.run(&sim, &["fill", "--family", "mem", "--chunk", "16MiB"]);
        assert_eq!(
            count(&again),
            count(&first),
            "the slice lost memory between runs"
        );
    }
}
