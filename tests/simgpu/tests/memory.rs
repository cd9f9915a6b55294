//! Device memory as the simulated driver models it, checked end to end with real processes.

use cuslice_test_harness::*;

const ROUTES: [&str; 5] = ["dlsym", "proc-v1", "proc-v2", "cudart-12.9", "cudart-13.0"];

#[test]
fn a_4gib_device_refuses_near_4gib_minus_the_context_through_every_route() {
    let sim = Sim::new(&["--memory", "4GiB"]);
    for route in ROUTES {
        let (lines, code) = sim.workload(&[
            "--route", route, "fill", "--family", "mem", "--chunk", "64MiB",
        ]);
        assert_eq!(code, 0, "{route}");
        let start = event(&lines, "start");
        assert_eq!(u(&start["total"]), 4 * GIB, "{route}: cuDeviceTotalMem");
        assert_eq!(
            u(&start["reported_total"]),
            4 * GIB,
            "{route}: cuMemGetInfo total"
        );
        assert_eq!(
            u(&start["free"]),
            4 * GIB - 300 * MIB,
            "{route}: the context takes 300 MiB"
        );
        let r = event(&lines, "refused");
        assert_eq!(r["code"], 2, "{route}: CUDA_ERROR_OUT_OF_MEMORY");
        let allocated = u(&r["allocated"]);
        assert!(
            allocated <= 4 * GIB - 300 * MIB && allocated > 4 * GIB - 300 * MIB - 64 * MIB,
            "{route}: refused at {allocated}"
        );
    }
    // Nothing stays behind once the processes are gone.
    assert_eq!(u(&sim.device(0)["used"]), 0);
}

#[test]
fn a_program_linked_with_lcuda_reaches_the_same_device() {
    let sim = Sim::new(&["--memory", "2GiB"]);
    let out = sim
        .command(
            &bin_dir().join("cuda-workload-linked"),
            &["fill", "--family", "mem", "--chunk", "256MiB"],
        )
        .output()
        .unwrap();
    let lines = parse_lines(&String::from_utf8_lossy(&out.stdout));
    assert!(out.status.success());
    assert_eq!(event(&lines, "start")["route"], "direct");
    assert_eq!(
        u(&event(&lines, "refused")["count"]),
        (2 * GIB - 300 * MIB) / (256 * MIB)
    );
}

#[test]
fn every_allocation_family_is_refused_at_capacity_and_released() {
    let sim = Sim::new(&["--memory", "2GiB", "--context-overhead", "100MiB"]);
    for family in [
        "mem", "pitch", "managed", "array", "array3d", "mipmap", "async", "pool", "vmm",
    ] {
        let (lines, code) = sim.workload(&["fill", "--family", family, "--chunk", "128MiB"]);
        assert_eq!(code, 0, "{family}");
        let r = event(&lines, "refused");
        assert_eq!(r["code"], 2, "{family}: {r}");
        // What is left is less than one more chunk (mipmaps and pitched rows are larger than a chunk).
        assert!(
            u(&r["free"]) < u(&r["chunk_bytes"]).next_multiple_of(2 * MIB),
            "{family}: {r}"
        );
        let free_after = u(&event(&lines, "freed")["free"]);
        if family == "pool" {
            // The release threshold is UINT64_MAX (as PyTorch sets it): freed blocks stay reserved.
            assert!(
                free_after < 128 * MIB,
                "pool: the reservation is kept, {free_after} free"
            );
            assert_eq!(u(&r["pool_reserved"]) % (2 * MIB), 0);
        } else {
            assert_eq!(
                free_after,
                2 * GIB - 100 * MIB,
                "{family}: everything comes back"
            );
        }
    }
    assert_eq!(u(&sim.device(0)["used"]), 0, "exiting releases pools too");
}

#[test]
fn allocations_take_whole_2mib_granules() {
    let sim = Sim::new(&["--memory", "1GiB", "--context-overhead", "0"]);
    // 1000 allocations of 1 byte fill 1000 granules: 2000 MiB do not fit in 1 GiB, 512 do.
    let (lines, _) = sim.workload(&["fill", "--family", "mem", "--chunk", "1"]);
    assert_eq!(u(&event(&lines, "refused")["count"]), 512);
    let (lines, _) = sim.workload(&["fill", "--family", "mem", "--chunk", "3MiB"]);
    assert_eq!(
        u(&event(&lines, "refused")["count"]),
        256,
        "3 MiB takes two granules"
    );
}

#[test]
fn what_one_process_holds_lowers_the_others_free_memory_and_show_lists_both() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let mut a = sim.spawn(&["hold", "--bytes", "3GiB"]);
    let held = a.wait_for("holding", std::time::Duration::from_secs(30));
    assert_eq!(u(&held["free"]), 8 * GIB - 300 * MIB - 3 * GIB);
    let mut b = sim.spawn(&["hold", "--bytes", "1GiB"]);
    let held_b = b.wait_for("holding", std::time::Duration::from_secs(30));
    assert_eq!(
        u(&held_b["free"]),
        8 * GIB - 600 * MIB - 4 * GIB,
        "B sees A's memory and both contexts as used"
    );
    let dev = sim.device(0);
    assert_eq!(u(&dev["used"]), 4 * GIB + 600 * MIB);
    let procs = dev["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2);
    let pid_a = u(&held["pid"]) as i64;
    let pa = procs
        .iter()
        .find(|p| p["pid"].as_i64() == Some(pid_a))
        .expect("A is listed by pid");
    assert_eq!(
        u(&pa["held"]),
        3 * GIB + 300 * MIB,
        "held includes the context"
    );
    assert_eq!(u(&pa["peak"]), 3 * GIB + 300 * MIB);
    assert_eq!(u(&pa["by_kind"]["context"]), 300 * MIB);
    assert!(pa.get("device_time_ns").is_some());
    assert_eq!(a.release(), 0);
    assert_eq!(b.release(), 0);
    let dev = sim.device(0);
    assert_eq!(u(&dev["used"]), 0);
    assert_eq!(dev["exited"].as_array().unwrap().len(), 2);
}

#[test]
fn memcpy_round_trips_through_device_memory() {
    let sim = Sim::new(&["--memory", "1GiB"]);
    for size in ["1", "4097", "5MiB"] {
        let (lines, code) = sim.workload(&["memcpy", "--bytes", size]);
        assert_eq!(code, 0);
        assert_eq!(event(&lines, "memcpy")["ok"], true, "{size}");
    }
}

#[test]
fn cuda_visible_devices_selects_and_reorders_devices_and_nvml_ignores_it() {
    let sim = Sim::new(&["--devices", "2", "--memory", "1GiB"]);
    let show = sim.show();
    let uuid1 = show["devices"][1]["uuid"].as_str().unwrap().to_string();
    let out = sim
        .command(&workload(), &["info"])
        .env("CUDA_VISIBLE_DEVICES", &uuid1[..12])
        .output()
        .unwrap();
    let info = event(&parse_lines(&String::from_utf8_lossy(&out.stdout)), "info").clone();
    let devices = info["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "{info}");
    assert_eq!(
        devices[0]["uuid"],
        uuid1.as_str(),
        "a UUID prefix selects device 1 as ordinal 0"
    );
    assert_eq!(
        info["nvml"]["devices"].as_array().unwrap().len(),
        2,
        "NVML sees every device"
    );
    let out = sim
        .command(&workload(), &["info"])
        .env("CUDA_VISIBLE_DEVICES", "1,0")
        .output()
        .unwrap();
    let info = event(&parse_lines(&String::from_utf8_lossy(&out.stdout)), "info").clone();
    assert_eq!(info["devices"][0]["uuid"], uuid1.as_str());
    let out = sim
        .command(&workload(), &["info"])
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    assert!(!out.status.success(), "no visible device: cuInit fails");
}

#[test]
fn managed_memory_is_backed_in_128mib_steps_and_a_step_held_covers_the_next_allocation() {
    // 64 MiB allocations: each odd one takes a new 128 MiB step, each even one fits in the step
    // already held. A 1 GiB device holds sixteen of them, and never more than the steps.
    let sim = Sim::new(&["--memory", "1GiB", "--context-overhead", "0"]);
    let (lines, code) = sim.workload(&["fill", "--family", "managed", "--chunk", "64MiB"]);
    assert_eq!(code, 0);
    let r = event(&lines, "refused");
    assert_eq!(r["code"], 2, "{r}");
    assert_eq!(u(&r["count"]), 16, "{r}");
    assert!(u(&sim.device(0)["peak_used"]) <= GIB);
    // One 64 MiB allocation holds a whole step.
    let mut one = sim.spawn(&["hold", "--family", "managed", "--bytes", "64MiB"]);
    one.wait_for("holding", std::time::Duration::from_secs(30));
    assert_eq!(u(&sim.device(0)["used"]), 128 * MIB);
    drop(one);
}

/// A VMM handle shared between two processes on two devices as NCCL's transports share them:
/// made and filled on device 0, exported as a file descriptor, imported and mapped on device 1.
/// The importer reads the exporter's pattern and writes another over the first bytes, which the
/// exporter then reads. Device-located memory is held once, by the exporter; host-located memory
/// (filled and read by the CPU through the mapped pointers) by neither, on no device.
#[test]
fn vmm_handles_shared_by_file_descriptor_are_the_same_bytes_in_both_processes() {
    let wait = std::time::Duration::from_secs(30);
    let sim = Sim::new(&["--devices", "2", "--memory", "1GiB"]);
    for location in ["host", "device"] {
        let mut exporter = sim.spawn(&[
            "--device",
            "0",
            "export",
            "--via",
            "fd",
            "--location",
            location,
            "--bytes",
            "64MiB",
        ]);
        let exported = exporter.wait_for("exported", wait);
        assert_eq!(exported["location"], location);
        let mut importer = sim.spawn(&["--device", "1", "import", "--from", &exported.to_string()]);
        let imported = importer.wait_for("imported", wait);
        assert_eq!(
            (&imported["pattern_ok"], &imported["location"]),
            (&serde_json::json!(true), &serde_json::json!(location)),
            "{imported}"
        );
        let show = sim.show();
        for (dev, who) in [(0, &exported), (1, &imported)] {
            let procs = show["devices"][dev]["processes"].as_array().unwrap();
            let p = procs.iter().find(|p| p["pid"] == who["pid"]).unwrap();
            let mut kinds: Vec<(&String, u64)> = p["by_kind"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k, u(v)))
                .collect();
            kinds.sort();
            let want: Vec<(&str, u64)> = match (location, dev) {
                ("device", 0) => vec![("context", 300 * MIB), ("vmm", 64 * MIB)],
                _ => vec![("context", 300 * MIB)],
            };
            let kinds: Vec<(&str, u64)> = kinds.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            assert_eq!(kinds, want, "{location}, device {dev}: {p}");
        }
        let err = importer.err.text();
        assert_eq!(importer.release(), 0, "{err}");
        drop(exporter.child.stdin.take());
        let released = exporter.wait_for("released", wait);
        assert_eq!(released["written_back"], true, "{location}: {released}");
        let err = exporter.err.text();
        assert_eq!(exporter.release(), 0, "{err}");
        assert_eq!(u(&sim.device(0)["used"]), 0);
    }
}
