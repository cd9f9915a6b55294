//! A SIGKILL storm: hundreds of processes of one slice killed at random points while they
//! allocate. Afterwards the whole cap is allocatable again and nothing hangs.

mod common;
use common::*;
use std::time::{Duration, Instant};

fn fill_count(slice: &Slice, sim: &Sim) -> u64 {
    let start = Instant::now();
    let (lines, code, stderr) = slice.run(sim, &["fill", "--family", "mem", "--chunk", "16MiB"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "a fill took {:?}",
        start.elapsed()
    );
    assert_eq!(event(&lines, "refused")["code"], 2);
    u(&event(&lines, "refused")["count"])
}

#[test]
fn after_a_sigkill_storm_the_whole_cap_is_allocatable_again() {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
    let before = fill_count(&slice, &sim);
    let families = ["mem", "pool", "vmm", "array", "pitch"];
    let mut seed: u64 = std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let storm = Instant::now();
    let mut killed = 0;
    for _ in 0..40 {
        let mut batch: Vec<Running> = (0..6)
            .map(|_| {
                let family = families[(next() % families.len() as u64) as usize];
                slice.spawn(
                    &sim,
                    &[
                        "fill", "--family", family, "--chunk", "8MiB", "--hold", "30",
                    ],
                )
            })
            .collect();
        for p in batch.iter_mut() {
            std::thread::sleep(Duration::from_micros(next() % 15_000));
            p.child.kill().unwrap(); // SIGKILL
            p.child.wait().unwrap();
            killed += 1;
        }
    }
    assert_eq!(killed, 240);
    assert!(
        storm.elapsed() < Duration::from_secs(120),
        "the storm took {:?}",
        storm.elapsed()
    );
    // Every dead process's memory comes back: the same fill gets exactly as far as before.
    let after = fill_count(&slice, &sim);
    assert_eq!(after, before, "the slice lost memory to killed processes");
    assert_eq!(used(&sim, 0), 0, "the device still holds memory");
    assert!(
        peak_used(&sim, 0) <= GIB,
        "peak {} over the cap",
        peak_used(&sim, 0)
    );
}
