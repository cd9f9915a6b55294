//! What the slice charges and reports where the driver's own figures move under it: pool memory
//! the driver gave back at a synchronisation, allocations freed with the context they were made
//! in, a device physically fuller than the cap, and cuMemGetInfo with one out-pointer NULL.
//! Ground truth is the simulator's.

mod common;
use common::*;

use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

/// Through `route` (`--ptds`: the per-thread-stream variants), one process allocates 320 MiB with
/// cuMemAllocAsync, frees it with cuMemFreeAsync and synchronises its stream (with an event where
/// `hold` says `--sync-event`), and reads no figure
/// afterwards: its synchronisation alone must give the memory back to the slice. Another process
/// of the slice then allocates what cuMemFree would have left it, and a third one sees its own
/// free figure come back after the same sequence.
fn async_free_goes_back_at_synchronisation(route: &[&'static str], hold: &[&'static str]) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
    let with = |scenario: &[&'static str]| -> Vec<&str> {
        route.iter().chain(scenario).copied().collect()
    };
    let async_free = [
        &[
            "hold",
            "--family",
            "async",
            "--bytes",
            "320MiB",
            "--free-at-once",
        ],
        hold,
    ]
    .concat();
    let mut a = slice.spawn(&sim, &with(&[&async_free[..], &["--no-mem-info"]].concat()));
    a.wait_for("holding", WAIT);
    // The driver gave the default pool's memory back at the synchronisation (release threshold
    // 0): the device holds the context only.
    let overhead = u(&sim.show()["context_overhead"]);
    assert_eq!(
        used(&sim, 0),
        overhead,
        "{route:?} {hold:?}: the simulator still holds pool memory"
    );
    // The second process gets the cap less two contexts.
    let left = GIB - 2 * overhead;
    let size = format!("{}MiB", left / MIB);
    let (lines, code, stderr) = slice.run(&sim, &["hold", "--bytes", &size, "--secs", "0"]);
    assert_eq!(
        u(&event(&lines, "start")["free"]) / MIB,
        left / MIB,
        "{route:?} {hold:?}: the second process's free (MiB)"
    );
    assert_eq!(
        code, 0,
        "{route:?} {hold:?}: the second process could not hold {size}: {stderr}"
    );
    // The third process's free figure after its own async free and synchronisation is what it
    // was before its allocation.
    let (lines, code, stderr) =
        slice.run(&sim, &with(&[&async_free[..], &["--secs", "0"]].concat()));
    assert_eq!(code, 0, "{route:?} {hold:?}: {stderr}");
    assert_eq!(
        u(&event(&lines, "holding")["free"]) / MIB,
        u(&event(&lines, "start")["free"]) / MIB,
        "{route:?} {hold:?}: free (MiB) after the async free and the synchronisation vs before the allocation"
    );
    assert!(peak_used(&sim, 0) <= GIB, "peak {}", peak_used(&sim, 0));
    a.release();
}

#[test]
fn memory_freed_by_cu_mem_free_async_goes_back_to_the_slice_at_synchronisation() {
    let stream: &[&str] = &[];
    for (route, hold) in [
        (&["--route", "dlsym"][..], stream),
        (&["--route", "dlsym"], &["--sync-event"]),
        (&["--route", "dlsym", "--ptds"], stream),
        (&["--route", "proc-v1"], stream),
        (&["--route", "proc-v2", "--ptds"], stream),
        (&["--route", "cudart-12.9"], &["--sync-event"]),
        (&["--route", "cudart-13.0"], stream),
    ] {
        async_free_goes_back_at_synchronisation(route, hold);
    }
}

#[test]
fn nvml_free_is_what_cuda_reports_when_a_process_outside_the_slice_fills_the_device() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    // Not in any slice: 7 GiB of the 8 GiB device.
    let mut outside = sim.spawn(&["hold", "--bytes", "7GiB"]);
    outside.wait_for("holding", WAIT);
    let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
    let (lines, code, stderr) = slice.run(&sim, &["info"]);
    assert_eq!(code, 0, "{stderr}");
    let info = event(&lines, "info");
    // While `info` ran the device held the outside process and `info`'s own context.
    let overhead = u(&sim.show()["context_overhead"]);
    let physical_free = 8 * GIB - used(&sim, 0) - overhead;
    let cuda_free = u(&info["mem_get_info"]["free"]);
    assert_eq!(
        cuda_free / MIB,
        physical_free / MIB,
        "cuMemGetInfo free (MiB)"
    );
    let nvml = &info["nvml"]["devices"][0];
    for v in ["memory", "memory_v2"] {
        let m = &nvml[v];
        assert_eq!(u(&m["free"]) / MIB, cuda_free / MIB, "NVML {v} free (MiB)");
        assert_eq!(u(&m["total"]), GIB, "NVML {v} total");
        assert_eq!(
            u(&m["used"]) + u(&m["free"]),
            u(&m["total"]),
            "NVML {v}: used + free = total"
        );
    }
    outside.release();
}

#[test]
fn mem_get_info_with_one_null_pointer_writes_the_other_capped() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    // Without cuslice: the driver accepts either pointer NULL and writes the other.
    let (lines, code) = sim.workload(&["info"]);
    assert_eq!(code, 0);
    let info = event(&lines, "info");
    let one = &info["mem_get_info_one"];
    assert_eq!(one["free_only"]["code"], 0, "driver, (&free, NULL): {one}");
    assert_eq!(
        one["total_only"]["code"], 0,
        "driver, (NULL, &total): {one}"
    );
    assert_eq!(u(&one["total_only"]["total"]), 8 * GIB);
    assert_eq!(
        u(&one["free_only"]["free"]),
        u(&info["mem_get_info"]["free"])
    );
    // Under a 1 GiB cap: the same calls get the capped figures.
    let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
    let (lines, code, stderr) = slice.run(&sim, &["info"]);
    assert_eq!(code, 0, "{stderr}");
    let info = event(&lines, "info");
    let one = &info["mem_get_info_one"];
    assert_eq!(one["free_only"]["code"], 0, "capped, (&free, NULL): {one}");
    assert_eq!(
        one["total_only"]["code"], 0,
        "capped, (NULL, &total): {one}"
    );
    assert_eq!(
        u(&one["total_only"]["total"]) / MIB,
        GIB / MIB,
        "capped, (NULL, &total): total (MiB)"
    );
    assert_eq!(
        u(&one["free_only"]["free"]) / MIB,
        u(&info["mem_get_info"]["free"]) / MIB,
        "capped, (&free, NULL): free (MiB)"
    );
}

/// A context that goes away with allocations still in it (`cuCtxDestroy`, a primary context's
/// reset) gives the slice those allocations back, and only those: under a 6 GiB cap, 4 GiB more
/// fit in context B once context A went away with 2 GiB never freed, and 1 GiB past B's own 5
/// does not; the primary context's 5 GiB come back at its reset. The simulator's count says the
/// driver freed them too.
#[test]
fn allocations_a_context_took_with_it_go_back_to_the_slice() {
    let (_dir, program) = c_program("context_teardown");
    let sim = Sim::new(&["--memory", "16GiB"]);
    let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "6GiB")]);
    let out = slice.command(&sim, &program, &[]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        text,
        "a2 0\nb1 0\nb4 2\ndestroy_a 0\nb4 0\nb1 2\ndestroy_b 0\np5 0\nreset 0\np5 0\np1 2\n"
    );
    // At its peak the device held A's 2 GiB, B's 1 and two contexts, then B's 5 GiB: never A's
    // and B's together past the cap.
    let peak = peak_used(&sim, 0);
    assert!(peak <= 6 * GIB, "peak {peak}");
    assert!(peak >= 5 * GIB, "peak {peak}");
}
