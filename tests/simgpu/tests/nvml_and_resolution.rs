//! NVML agrees with the device model; cuGetProcAddress answers both libcudart request lists.

use cuslice_test_harness::*;
use std::time::Duration;

#[test]
fn nvml_memory_and_processes_match_the_model() {
    let sim = Sim::new(&["--memory", "8GiB", "--devices", "2"]);
    let mut a = sim.spawn(&["hold", "--bytes", "1GiB"]);
    let h = a.wait_for("holding", Duration::from_secs(30));
    let (lines, _) = sim.workload(&["info"]);
    let info = event(&lines, "info");
    let truth = sim.show();
    for d in 0..2 {
        let nv = &info["nvml"]["devices"][d];
        let dev = &truth["devices"][d];
        assert_eq!(nv["uuid"], dev["uuid"]);
        // The info process itself holds a context on device 0 while it asks; it has exited since.
        let own = if d == 0 { 300 * MIB } else { 0 };
        assert_eq!(
            u(&nv["memory"]["used"]),
            u(&dev["used"]) + own,
            "device {d}"
        );
        assert_eq!(u(&nv["memory"]["total"]), 8 * GIB);
        assert_eq!(u(&nv["memory"]["free"]) + u(&nv["memory"]["used"]), 8 * GIB);
        assert_eq!(nv["memory_v2"]["used"], nv["memory"]["used"]);
    }
    let procs = info["nvml"]["devices"][0]["processes"].as_array().unwrap();
    let pa = procs
        .iter()
        .find(|p| p["pid"] == h["pid"])
        .expect("the holder is listed by its pid");
    assert_eq!(
        u(&pa["used"]),
        GIB + 300 * MIB,
        "per-process usage includes the context"
    );
    assert!(
        procs.iter().any(|p| p["pid"] == info["pid"]),
        "the asking process has a context too"
    );
    assert!(
        info["nvml"]["devices"][1]["processes"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    a.release();
}

#[test]
fn nvml_utilisation_follows_the_engine() {
    let _turn = serial();
    let sim = Sim::new(&[]);
    let mut busy = sim.spawn(&[
        "launch",
        "--ns-per-block",
        "1000",
        "--blocks",
        "1000",
        "--secs",
        "3",
    ]);
    busy.wait_for("start", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1200));
    let (lines, _) = sim.workload(&["info"]);
    let util = u(&event(&lines, "info")["nvml"]["devices"][0]["utilization"]["gpu"]);
    assert!(
        util >= 90,
        "a device running kernels back to back reads {util}% busy"
    );
    drop(busy);
}

#[test]
fn both_cudart_request_lists_resolve_every_implemented_symbol() {
    let sim = Sim::new(&[]);
    for (route, file) in [
        ("cudart-12.9", "cudart-12.9-getprocaddress.txt"),
        ("cudart-13.0", "cudart-13.0-getprocaddress.txt"),
    ] {
        let (lines, code) = sim.workload(&["--route", route, "resolve"]);
        assert_eq!(code, 0, "{route}");
        let r = event(&lines, "resolved");
        let requests = std::fs::read_to_string(data_file(file))
            .unwrap()
            .lines()
            .skip(1)
            .count() as u64;
        let extra = r["extra"].as_array().unwrap().len() as u64;
        assert_eq!(
            u(&r["requests"]),
            requests + extra,
            "{route}: every request was replayed (plus the lookups libcudart makes later)"
        );
        assert!(
            r["version_not_sufficient"].as_array().unwrap().is_empty(),
            "{route}: {r}"
        );
        let not_found: Vec<&str> = r["not_found"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        // Unknown symbols get the real driver's answer (CUDA_ERROR_NOT_FOUND) ...
        assert!(
            not_found.contains(&"") && not_found.contains(&"cuArrayGetDescriptor"),
            "{route}"
        );
        // ... and nothing the simulator implements is among them.
        for implemented in [
            "cuMemAlloc",
            "cuLaunchKernel",
            "cuLaunchKernelEx",
            "cuMemAllocAsync",
            "cuGraphLaunch",
            "cuCtxCreate",
            "cuGetProcAddress",
            "cuMemcpyPeer",
            "cuMemcpyPeerAsync",
        ] {
            assert!(
                !not_found.contains(&implemented),
                "{route}: {implemented} not found"
            );
        }
        assert!(r["missing"].as_array().unwrap().is_empty(), "{route}: {r}");
    }
}

#[test]
fn sixteen_devices_have_sixteen_distinct_pci_addresses() {
    let sim = Sim::new(&["--memory", "1GiB", "--devices", "16"]);
    let truth = sim.show();
    let ids: Vec<&str> = truth["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["pci_bus_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 16);
    let mut buses = std::collections::BTreeSet::new();
    for id in &ids {
        // domain:bus:device.function, the bus one byte as PCI has it.
        let parts: Vec<&str> = id.split([':', '.']).collect();
        assert_eq!(parts.len(), 4, "{id}");
        assert_eq!(parts[1].len(), 2, "bus of {id} is not one byte");
        buses.insert(u8::from_str_radix(parts[1], 16).unwrap());
    }
    assert_eq!(buses.len(), 16, "{ids:?}");
}
