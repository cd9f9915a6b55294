//! The demo's three containers (tests/demo) sharing one device, with the node agent running:
//! each container's share of device time, from `cuslice top --json` and from the simulator's
//! device time per host pid, against what the configuration means.
//!
//! - trainer: limit 30, no request; notebook: request 40, limit 50; batch: no core setting,
//!   started 4 s later (in the demo, 8 s).
//! - What that means, once all three run: the notebook's request comes first and, being the only
//!   slice with a request, it is lent time nobody is guaranteed up to its limit (50). The two
//!   slices without a request share what is left (50) in equal parts, each below what it may
//!   use: trainer 25 (its limit is 30), batch 25. Before batch starts, the device is not
//!   contended: trainer 30 (its limit), notebook 50 (its limit).
//! - Requests and shares are judged on what the device ran: on a busy host a launching thread
//!   that waits for a CPU leaves the device idle, and every slice loses its part of that time.
//!   Limits are judged on the device's time.

use std::process::Stdio;
use std::time::{Duration, Instant};

use cuslice_test_harness::{Sim, bin_dir};
use serde_json::Value;

use super::{Container, Engine, NodeAgent, Spec, agent_turn, name, wait_for};

/// 1 ms kernels back to back.
const KERNELS: &str = "cuda-workload launch --ns-per-block 1000 --blocks 1000";

struct Slice {
    what: &'static str,
    limit: f64,
    request: f64,
    /// Its share once all three run.
    share: f64,
}

const SLICES: [Slice; 3] = [
    Slice {
        what: "trainer",
        limit: 30.0,
        request: 0.0,
        share: 25.0,
    },
    Slice {
        what: "notebook",
        limit: 50.0,
        request: 40.0,
        share: 50.0,
    },
    Slice {
        what: "batch",
        limit: 100.0,
        request: 0.0,
        share: 25.0,
    },
];

pub fn shares_hold(engine: &dyn Engine) {
    let _serial = cuslice_test_harness::serial();
    let _turn = agent_turn();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let _agent = NodeAgent::start(&sim);
    let secs = 18;
    let mut top = sim
        .command(
            &bin_dir().join("cuslice"),
            &["top", "--json", "--interval", "0.5"],
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Read as it comes: a pipe nobody reads fills up (64 KiB) and stops `top` mid-run.
    let top_out = top.stdout.take().unwrap();
    let reader = std::thread::spawn(move || -> Vec<Value> {
        std::io::BufRead::lines(std::io::BufReader::new(top_out))
            .map_while(Result::ok)
            .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
            .collect()
    });
    let spawn = |s: &Slice, secs: u32| -> Box<dyn Container + '_> {
        let n = name(s.what);
        let mut env = vec!["CUSLICE_MEMORY_LIMIT=1GiB".to_string()];
        if s.limit < 100.0 {
            env.push(format!("CUSLICE_CORE_LIMIT={}", s.limit));
        }
        if s.request > 0.0 {
            env.push(format!("CUSLICE_CORE_REQUEST={}", s.request));
        }
        let env: Vec<&str> = env.iter().map(String::as_str).collect();
        let script = format!("exec {KERNELS} --secs {secs}");
        let mut c = engine.spawn(
            &sim,
            &Spec {
                name: &n,
                env: &env,
                cmd: &["sh", "-c", &script],
                read_only: false,
            },
        );
        // The workload has started (and the engine knows the container) once it says so.
        wait_for(c.as_mut(), "start");
        c
    };
    let t0 = Instant::now();
    let mut containers = vec![spawn(&SLICES[0], secs), spawn(&SLICES[1], secs)];
    std::thread::sleep(Duration::from_secs(4).saturating_sub(t0.elapsed()));
    containers.push(spawn(&SLICES[2], secs - 4));
    let pids: Vec<i64> = containers.iter().map(|c| c.host_pid() as i64).collect();
    let ids: Vec<String> = containers.iter().map(|c| c.id()).collect();
    // The simulator's device time per container every 0.5 s (the workload is the container's
    // init: `exec`).
    let mut samples: Vec<(Instant, Vec<u64>)> = Vec::new();
    while t0.elapsed() < Duration::from_secs(secs as u64 - 1) {
        let (t, d) = sim.device_times_at(0);
        samples.push((
            t,
            pids.iter()
                .map(|p| d.get(p).copied().unwrap_or(0))
                .collect(),
        ));
        std::thread::sleep(Duration::from_millis(500));
    }
    let timeline: Vec<Value> = {
        let mut top = top;
        let _ = top.kill();
        let _ = top.wait();
        reader.join().unwrap()
    };
    let last_top = timeline
        .last()
        .expect("cuslice top printed nothing")
        .clone();
    for c in containers {
        c.remove();
    }
    let share = |k: usize, from: usize, to: usize| -> f64 {
        let (a, b) = (&samples[from], &samples[to]);
        100.0 * (b.1[k] - a.1[k]) as f64 / (b.0 - a.0).as_nanos() as f64
    };
    // A slice's part of what the device ran: where the host left the device idle (a launching
    // thread that waited for a CPU, on a busy 2-core machine), every slice loses its part of that
    // time, and a request or a share is judged on what was run.
    let part = |k: usize, from: usize, to: usize| -> f64 {
        let busy: f64 = (0..SLICES.len()).map(|j| share(j, from, to)).sum();
        100.0 * share(k, from, to) / busy.max(f64::MIN_POSITIVE)
    };
    let mut problems = Vec::new();
    // Every 1 s window (two samples apart) from 2 s after batch started (6 s) to the end.
    let start = samples
        .iter()
        .position(|(t, _)| *t >= t0 + Duration::from_secs(6))
        .unwrap();
    let busy: Vec<f64> = (start..samples.len() - 2)
        .map(|i| (0..SLICES.len()).map(|k| share(k, i, i + 2)).sum())
        .collect();
    for (k, s) in SLICES.iter().enumerate() {
        let windows: Vec<f64> = (start..samples.len() - 2)
            .map(|i| share(k, i, i + 2))
            .collect();
        let parts: Vec<f64> = (start..samples.len() - 2)
            .map(|i| part(k, i, i + 2))
            .collect();
        if windows.iter().any(|w| *w > s.limit + 5.0) {
            problems.push(format!(
                "{} over its limit {} by more than 5 points: {windows:.1?}",
                s.what, s.limit
            ));
        }
        // Below its request in two windows in a row: more than 1 s.
        if parts
            .windows(2)
            .any(|w| w.iter().all(|x| *x < s.request - 3.0))
        {
            problems.push(format!(
                "{} below its request {} of what the device ran for more than 1 s: {parts:.1?} \
                 (of the device's time {windows:.1?}, the device busy {busy:.1?})",
                s.what, s.request
            ));
        }
    }
    // The last 10 s: the simulator's share and cuslice top's (its last line), against the
    // configured share. A slice is charged its turns' spans, which include what the device did
    // not run while the slice's launching thread waited for the host: top may say more than the
    // simulator by the time the device was idle, never less.
    let n = samples.len() - 1;
    let from = samples
        .iter()
        .position(|(t, _)| *t >= samples[n].0 - Duration::from_secs(10))
        .unwrap();
    let idle = 100.0 - (0..SLICES.len()).map(|k| share(k, from, n)).sum::<f64>();
    let slices = last_top["devices"][0]["slices"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (k, s) in SLICES.iter().enumerate() {
        let truth = share(k, from, n);
        let of_run = part(k, from, n);
        let seen = slices
            .iter()
            .find(|v| v["slice"] == ids[k].as_str())
            .and_then(|v| v["compute"]["share_10s_pct"].as_f64());
        let line = format!(
            "{}: configured {}, simulator {truth:.1} ({of_run:.1} of what the device ran, idle \
             {idle:.1}), cuslice top {seen:?}",
            s.what, s.share
        );
        match seen {
            Some(seen)
                if (of_run - s.share).abs() <= 3.0
                    && seen >= truth - 3.0
                    && seen <= truth + 3.0 + idle.max(0.0) => {}
            _ => {
                // What cuslice top saw of this slice, line by line: share over 1 s and 10 s,
                // device seconds, (est.) where launch estimates stood in for readings.
                let seen: Vec<String> = timeline
                    .iter()
                    .filter_map(|v| {
                        let c = v["devices"][0]["slices"]
                            .as_array()?
                            .iter()
                            .find(|x| x["slice"] == ids[k].as_str())?["compute"]
                            .clone();
                        Some(format!(
                            "{}/{}/{}{}",
                            c["share_1s_pct"],
                            c["share_10s_pct"],
                            c["device_seconds"],
                            if c["estimated"] == true { " est" } else { "" }
                        ))
                    })
                    .collect();
                problems.push(format!("{line}; cuslice top (1 s/10 s/device s): {seen:?}"));
            }
        }
    }

    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
