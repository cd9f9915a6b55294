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

/// What one capped process's first context came to, by the simulator's count.
enum Outcome {
    /// Its first context was refused (CUDA_ERROR_OUT_OF_MEMORY) though it fits the cap.
    Refused,
    /// It filled its slice: the most it held at once (simgpu's peak for its pid).
    Peak(u64),
}

/// Reads `r`'s lines until `fill` reports its refusal (then the simulator's peak for its pid)
/// or the workload reports an error (its first context refused).
fn outcome(sim: &Sim, r: &mut Running) -> (Outcome, String) {
    use std::io::BufRead;
    let mut pid = None;
    let mut line = String::new();
    loop {
        line.clear();
        if r.out.read_line(&mut line).unwrap() == 0 {
            return (Outcome::Refused, "ended without a refusal".into());
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if v["event"] == "start" {
            pid = v["pid"].as_i64();
        }
        if v["event"] == "error" {
            return (Outcome::Refused, v.to_string());
        }
        if v["event"] == "refused" {
            let pid = pid.expect("a start event before the refusal");
            let dev = sim.device(0);
            let p = dev["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["pid"] == pid)
                .unwrap_or_else(|| panic!("simgpu lists no process {pid}: {dev}"))
                .clone();
            return (Outcome::Peak(u(&p["peak"])), v.to_string());
        }
    }
}

/// Slices whose first contexts are made at the same moment, beside neighbours that allocate and
/// free all the time: each is charged what its own context takes, so none holds more than its
/// cap by the simulator's count, and none has its first context refused. (Made together, more
/// than one process appears on the device across each creation, and the device's rise counts
/// the others' contexts and the neighbours' allocations and frees.)
#[test]
fn first_contexts_made_together_beside_churning_neighbours_stay_within_their_caps() {
    let sim = Sim::new(&["--memory", "40GiB", "--context-overhead", "300MiB"]);
    let churn = [
        "churn",
        "--threads",
        "4",
        "--secs",
        "120",
        "--min",
        "1MiB",
        "--max",
        "96MiB",
        "--hold-max",
        "8",
    ];
    let neighbours: Vec<(Slice, Running)> = (0..3)
        .map(|_| {
            let s = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "2GiB")]);
            let mut r = s.spawn(&sim, &churn);
            r.wait_for("start", Duration::from_secs(30));
            (s, r)
        })
        .collect();
    const CAP: u64 = 400 * MIB;
    let mut bad = Vec::new();
    let (mut peaks, mut how) = (Vec::new(), Vec::new());
    for round in 0..20 {
        let slices: Vec<Slice> = (0..3)
            .map(|_| Slice::new(&[("CUSLICE_MEMORY_LIMIT", "400MiB"), ("CUSLICE_LOG", "debug")]))
            .collect();
        let mut running: Vec<Running> = slices
            .iter()
            .map(|s| {
                s.spawn(
                    &sim,
                    &["fill", "--family", "mem", "--chunk", "16MiB", "--hold", "5"],
                )
            })
            .collect();
        for (k, r) in running.iter_mut().enumerate() {
            let (o, line) = outcome(&sim, r);
            match o {
                Outcome::Peak(p) if p <= CAP => peaks.push(p / MIB),
                Outcome::Peak(p) => {
                    peaks.push(p / MIB);
                    bad.push(format!(
                        "round {round}.{k}: held {} MiB of a 400 MiB cap: {line}",
                        p / MIB
                    ))
                }
                Outcome::Refused => {
                    bad.push(format!("round {round}.{k}: first context refused: {line}"))
                }
            }
        }
        for r in running {
            how.extend(
                r.err
                    .text()
                    .lines()
                    .filter_map(|l| l.split_once("measured by ").map(|m| m.1.to_string())),
            );
        }
    }
    drop(neighbours);
    let mut ways = std::collections::BTreeMap::new();
    for h in &how {
        *ways.entry(h.as_str()).or_insert(0) += 1;
    }
    eprintln!(
        "{} capped slices held {:?}..={:?} MiB at most by simgpu's count; measured \
         by {ways:?}",
        peaks.len(),
        peaks.iter().min(),
        peaks.iter().max()
    );
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
