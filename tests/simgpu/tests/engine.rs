//! The simulated compute engine: device time, contention between processes, events, graphs.

use cuslice_test_harness::*;

const MS: u64 = 1_000_000;

fn exited_time(sim: &Sim, pid: u64) -> u64 {
    let dev = sim.device(0);
    let e = dev["exited"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| u(&e["pid"]) == pid)
        .unwrap_or_else(|| panic!("{pid} not among exited: {dev}"));
    u(&e["device_time_ns"])
}

/// Runs two `launch` processes at once with `args`; their `launched` lines.
fn two_at_once(sim: &Sim, args: &[&str]) -> (serde_json::Value, serde_json::Value) {
    let spawn = || {
        sim.command(&workload(), args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(
        a.status.success() && b.status.success(),
        "{}{}",
        String::from_utf8_lossy(&a.stderr),
        String::from_utf8_lossy(&b.stderr)
    );
    let launched = |out: &std::process::Output| {
        event(
            &parse_lines(&String::from_utf8_lossy(&out.stdout)),
            "launched",
        )
        .clone()
    };
    (launched(&a), launched(&b))
}

#[test]
fn two_processes_launching_1ms_kernels_get_half_the_device_each() {
    let _turn = serial();
    let sim = Sim::new(&[]);
    let args = [
        "launch",
        "--kernel",
        "work",
        "--ns-per-block",
        "1000",
        "--blocks",
        "1000",
        "--secs",
        "3",
    ];
    let (la, lb) = two_at_once(&sim, &args);
    let (ta, tb) = (
        exited_time(&sim, u(&la["pid"])),
        exited_time(&sim, u(&lb["pid"])),
    );
    // Ground truth from the simulator: engine time each process's kernels used.
    assert_eq!(
        ta,
        u(&la["engine_ns_requested"]),
        "every launched kernel did all its work"
    );
    let share = ta as f64 / (ta + tb) as f64;
    assert!(
        (0.45..=0.55).contains(&share),
        "A got {:.1}% of the engine time",
        share * 100.0
    );
    // Both were busy the whole time, so the engine was busy nearly all of it.
    let wall = u(&la["wall_ns"]).max(u(&lb["wall_ns"]));
    assert!(
        (ta + tb) as f64 >= 0.9 * wall as f64,
        "engine busy {} of {wall} ns",
        ta + tb
    );
}

#[test]
fn beside_another_process_spin_kernels_end_on_time_and_work_kernels_stretch() {
    let _turn = serial();
    // 3 ms kernels and 2 ms time slices that switch at no cost: each kernel is switched out
    // once, mid-way. (The default device's slices and switches are the hardware's: docs/simgpu.md.)
    let sim = Sim::new(&["--timeslice-us", "2000", "--switch-us", "0"]);
    let run = |kernel| {
        let args = [
            "launch",
            "--kernel",
            kernel,
            "--ns-per-block",
            "1000",
            "--blocks",
            "3000",
            "--secs",
            "3",
        ];
        let (la, lb) = two_at_once(&sim, &args);
        [la, lb].map(|l| {
            let asked = u(&l["engine_ns_requested"]);
            let wall = u(&l["wall_ns"]) as f64;
            let used = exited_time(&sim, u(&l["pid"]));
            (asked, used, asked as f64 / wall, used as f64 / wall)
        })
    };
    // A spin kernel back on the engine after its deadline ends at once: it ran 2 ms of the 3 it
    // asked for, so what the two asked for over wall time adds up to about 150%, while the
    // simulator credits each what it ran: half the device.
    let spin = run("spin");
    let asked: f64 = spin.iter().map(|s| s.2).sum();
    assert!(
        (1.4..1.6).contains(&asked),
        "spin: asked for {asked:.2} of the wall time: {spin:?}"
    );
    for (asked, used, _, share) in spin {
        assert!(
            used < asked * 3 / 4 + asked / 50,
            "spin: used {used} of {asked}"
        );
        assert!(
            (0.45..0.55).contains(&share),
            "spin: {share:.3} of the device"
        );
    }
    // A work kernel needs its 3 ms of engine time: what each asked for is what it used.
    for (asked, used, asked_share, share) in run("work") {
        assert_eq!(used, asked, "work: every kernel did all its work");
        assert!(
            (0.45..0.55).contains(&share),
            "work: {share:.3} of the device"
        );
        assert!((share - asked_share).abs() < 0.01);
    }
}

#[test]
fn a_process_alone_gets_the_whole_engine_and_events_time_it() {
    let _turn = serial();
    let sim = Sim::new(&[]);
    let (lines, code) = sim.workload(&[
        "launch",
        "--ns-per-block",
        "5000",
        "--blocks",
        "1000",
        "--secs",
        "0",
        "--count",
        "20",
    ]);
    assert_eq!(code, 0);
    let l = event(&lines, "launched");
    assert_eq!(u(&l["engine_ns_requested"]), 100 * MS);
    let elapsed = u(&l["elapsed_ns"]);
    // Events measure device time between them: 100 ms of kernels (plus at most some scheduling).
    assert!(
        (100 * MS..130 * MS).contains(&elapsed),
        "cuEventElapsedTime says {elapsed} ns"
    );
    assert!(
        u(&l["wall_ns"]) >= 100 * MS,
        "synchronisation waits in real time"
    );
    assert_eq!(exited_time(&sim, u(&l["pid"])), 100 * MS);
}

#[test]
fn a_process_s_kernels_are_delayed_by_another_s_work() {
    let _turn = serial();
    let sim = Sim::new(&[]);
    let count = [
        "launch",
        "--kernel",
        "work",
        "--ns-per-block",
        "10000",
        "--blocks",
        "1000",
        "--secs",
        "0",
        "--count",
        "10",
    ];
    let (alone, _) = sim.workload(&count);
    let alone = u(&event(&alone, "launched")["elapsed_ns"]);
    let mut busy = sim.spawn(&[
        "launch",
        "--ns-per-block",
        "1000",
        "--blocks",
        "1000",
        "--secs",
        "3",
    ]);
    busy.wait_for("start", std::time::Duration::from_secs(30));
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (shared, _) = sim.workload(&count);
    let shared = u(&event(&shared, "launched")["elapsed_ns"]);
    assert!(
        shared as f64 > 1.7 * alone as f64,
        "100 ms of kernels took {alone} ns alone and {shared} ns beside a busy process"
    );
    drop(busy);
}

#[test]
fn every_launch_route_uses_engine_time_with_either_image() {
    let _turn = serial();
    let sim = Sim::new(&[]);
    for (image, kernel) in [
        ("ptx", "spin"),
        ("text", "spin"),
        ("ptx", "work"),
        ("text", "work"),
    ] {
        for via in ["kernel", "ex", "coop", "graph"] {
            for ptds in [false, true] {
                let mut args = vec![
                    "launch",
                    "--kernel",
                    kernel,
                    "--image",
                    image,
                    "--via",
                    via,
                    "--ns-per-block",
                    "1000",
                    "--blocks",
                    "1000",
                    "--secs",
                    "0",
                    "--count",
                    "25",
                    "--progress-ms",
                    "250",
                ];
                if ptds {
                    args.insert(0, "--ptds");
                    args.insert(0, "proc-v2");
                    args.insert(0, "--route");
                }
                let (lines, code) = sim.workload(&args);
                assert_eq!(code, 0, "{kernel} {image} {via} ptds={ptds}");
                let l = event(&lines, "launched");
                assert_eq!((&l["image"], &l["kernel"]), (&image.into(), &kernel.into()));
                assert_eq!(
                    exited_time(&sim, u(&l["pid"])),
                    25 * MS,
                    "{kernel} {image} {via} ptds={ptds}: 25 kernels of 1 ms"
                );
                // Progress lines end with every kernel completed and its work counted.
                let last = lines.iter().rfind(|l| l["event"] == "progress").unwrap();
                assert_eq!((u(&last["completed"]), u(&last["work_ns"])), (25, 25 * MS));
            }
        }
    }
}

#[test]
fn the_workload_falls_back_to_the_text_image_only_when_the_driver_refuses_ptx() {
    let _turn = serial();
    let sim = Sim::new(&[]);
    let args = [
        "launch",
        "--ns-per-block",
        "1000",
        "--blocks",
        "2000",
        "--secs",
        "0",
        "--count",
        "5",
    ];
    let run = |extra: &[&str], jit_off: bool| {
        let mut cmd = sim.command(&workload(), &[&args[..], extra].concat());
        if jit_off {
            cmd.env("CUDA_DISABLE_PTX_JIT", "1");
        }
        let out = cmd.output().unwrap();
        (
            parse_lines(&String::from_utf8_lossy(&out.stdout)),
            out.status.code(),
        )
    };
    // The default: the PTX image, its 2000 blocks run as 132 that each spin for the 2 ms.
    let (lines, code) = run(&[], false);
    assert_eq!(code, Some(0));
    let l = event(&lines, "launched");
    assert_eq!((l["image"].as_str(), u(&l["grid"])), (Some("ptx"), 132));
    assert_eq!(l["image_refused"], serde_json::json!([]));
    assert_eq!(exited_time(&sim, u(&l["pid"])), 10 * MS);
    // A driver that does not JIT-compile: the text image, after saying what was refused.
    let (lines, code) = run(&[], true);
    assert_eq!(code, Some(0));
    let l = event(&lines, "launched");
    assert_eq!((l["image"].as_str(), u(&l["grid"])), (Some("text"), 2000));
    assert_eq!(l["image_refused"][0]["image"], "ptx");
    assert_eq!(u(&l["image_refused"][0]["code"]), 223);
    assert_eq!(exited_time(&sim, u(&l["pid"])), 10 * MS);
    // --image ptx does not fall back: the refusal is the error.
    let (lines, code) = run(&["--image", "ptx"][..], true);
    assert_eq!(code, Some(1));
    let e = event(&lines, "error");
    assert_eq!(
        (e["call"].as_str(), u(&e["code"])),
        (Some("cuModuleLoadData"), 223)
    );
}

#[test]
fn several_streams_share_one_context_queue() {
    let _turn = serial();
    let sim = Sim::new(&[]);
    let (lines, code) = sim.workload(&[
        "launch",
        "--streams",
        "4",
        "--ns-per-block",
        "1000",
        "--blocks",
        "500",
        "--secs",
        "0",
        "--count",
        "40",
    ]);
    assert_eq!(code, 0);
    let l = event(&lines, "launched");
    assert_eq!(exited_time(&sim, u(&l["pid"])), 20 * MS);
    assert!(
        u(&l["elapsed_ns"]) >= 20 * MS,
        "one engine runs them one after another"
    );
}
