//! Freezing an idle process (`CUSLICE_MEMORY_FREEZE_IDLE`) by the routes programs take to the
//! driver: through `dlsym` a process is frozen and its next call (here the free at its end) thaws
//! it; linked with `-lcuda` it is never frozen, and says why once. The simulator says which
//! processes it holds checkpointed (`simgpu show`). The rest is in tests/clients (NVIDIA's own
//! bindings, PyTorch through the real-GPU tier).

mod common;
use common::*;

use std::time::{Duration, Instant};

fn freezing() -> Slice {
    Slice::new(&[
        ("CUSLICE_MEMORY_LIMIT", "1GiB"),
        ("CUSLICE_MEMORY_FREEZE_IDLE", "1s"),
        ("CUSLICE_LOG", "info"),
    ])
}

/// Whether the simulator holds a process checkpointed now (each test runs one process).
fn checkpointed(sim: &Sim) -> bool {
    sim.show()["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["state"] == "checkpointed")
}

fn hold(sim: &Sim, slice: &Slice, program: &std::path::Path) -> Running {
    let mut r = Running::start(slice.command(sim, program, &["hold", "--bytes", "64MiB"]));
    r.wait_for("holding", Duration::from_secs(30));
    r
}

#[test]
fn a_process_reaching_the_driver_through_dlsym_is_frozen_and_its_last_free_thaws_it() {
    let sim = Sim::new(&["--memory", "2GiB"]);
    let slice = freezing();
    let r = hold(&sim, &slice, &workload());
    let end = Instant::now() + Duration::from_secs(20);
    while !checkpointed(&sim) {
        assert!(Instant::now() < end, "not frozen: {}", r.err.text());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(used(&sim, 0), 0, "the device holds none of it");
    // Its stdin closed, it frees its allocation and exits: the free thaws it first.
    let err = r.err.text();
    assert_eq!(r.release(), 0, "{err}");
    assert!(err.contains("frozen after 1s idle"), "{err}");
}

#[test]
fn a_program_linked_against_libcuda_is_never_frozen_and_says_why_once() {
    let sim = Sim::new(&["--memory", "2GiB"]);
    let slice = freezing();
    let r = hold(&sim, &slice, &bin_dir().join("cuda-workload-linked"));
    let end = Instant::now() + Duration::from_secs(20);
    while !r.err.text().contains("not frozen") {
        assert!(Instant::now() < end, "no word: {}", r.err.text());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!checkpointed(&sim));
    let err = r.err.text();
    assert!(
        err.contains("not frozen: the program is linked against libcuda.so"),
        "{err}"
    );
    assert_eq!(err.matches("not frozen").count(), 1, "{err}");
    assert_eq!(r.release(), 0, "{err}");
}
