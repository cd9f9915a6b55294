//! A slice's first context on a device is measured as it is made. A neighbour (another slice)
//! allocating and freeing at that moment must not be counted in it: counted, it refused a
//! container's first context with CUDA_ERROR_OUT_OF_MEMORY while the container beside it filled
//! its cap (seen in hook/tests' two_containers_two_caps).

mod common;
use common::*;
use std::time::Duration;

#[test]
fn a_first_context_made_while_a_neighbour_allocates_is_charged_its_own_overhead_only() {
    let sim = Sim::new(&["--memory", "16GiB", "--context-overhead", "300MiB"]);
    // The neighbour: another slice, 4 threads allocating and freeing 256 MiB - 1 GiB at random.
    let neighbour = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "12GiB")]);
    let n = neighbour.spawn(
        &sim,
        &[
            "churn",
            "--threads",
            "4",
            "--secs",
            "20",
            "--min",
            "256MiB",
            "--max",
            "1GiB",
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    for round in 0..8 {
        // Each round a new slice, so its first context is measured again.
        let s = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
        let (lines, code, stderr) = s.run(&sim, &["info"]);
        assert_eq!(code, 0, "round {round}: {stderr}");
        let start = event(&lines, "start");
        assert_eq!(u(&start["total"]), GIB, "round {round}");
        // Charged the context's 300 MiB (what the simulator takes per context), not the
        // neighbour's allocations made meanwhile.
        assert_eq!(
            u(&start["free"]),
            GIB - 300 * MIB,
            "round {round}: charged {} MiB for the context",
            (GIB - u(&start["free"])) / MIB
        );
    }
    drop(n);
}
