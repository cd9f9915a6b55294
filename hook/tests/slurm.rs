//! cuslice under real Slurm: slurmctld, slurmd and munge started by the tests on this machine
//! (`cuslice_test_engines::slurm`), cuslice's SPANK plugin in its `plugstack.conf`, and simgpu's
//! two 8 GiB devices behind the node's two GPUs, each cut into 100 shards. Jobs run as nobody.
//! What each job got is the simulator's count: the memory a process held at its peak, and the
//! device time each process used while both ran.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cuslice_test_engines::root_required;
use cuslice_test_engines::slurm::{Cluster, GPU_MEMORY, SHARDS, cluster};
use cuslice_test_harness::{parse_lines, poll, u};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// A process's peak on device `dev` by the simulator's count (it has ended, or still runs).
fn peak(c: &Cluster, dev: usize, pid: u64) -> u64 {
    let d = c.sim.device(dev);
    ["exited", "processes"]
        .iter()
        .flat_map(|k| d[*k].as_array().cloned().unwrap_or_default())
        .find(|p| p["pid"].as_u64() == Some(pid))
        .and_then(|p| p["peak"].as_u64())
        .unwrap_or_else(|| panic!("simgpu lists no process {pid} on device {dev}: {d}"))
}

fn output(mut cmd: Command) -> (Vec<Value>, String, bool) {
    let out = cmd.output().unwrap();
    let mut stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        stderr.push_str(&format!(
            "; stdout: {}",
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    (
        parse_lines(&String::from_utf8_lossy(&out.stdout)),
        stderr,
        out.status.success(),
    )
}

fn the<'a>(lines: &'a [Value], event: &str, context: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l["event"] == event)
        .unwrap_or_else(|| panic!("no {event} line: {lines:?}; {context}"))
}

/// A directory jobs (nobody) can write their output to.
fn out_dir(c: &Cluster) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = c.dir.join("out");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

/// `sbatch --wait` as nobody (`job_output` reads what it printed).
fn sbatch(c: &Cluster, args: &[&str], script: &str) -> Command {
    let mut cmd = submit(c, args, script);
    cmd.arg("--wait");
    cmd
}

/// `sbatch` as nobody, answering with the job id.
fn submit(c: &Cluster, args: &[&str], script: &str) -> Command {
    let out = out_dir(c).join(format!("job-{}.out", std::process::id()));
    let mut cmd = c.command("sbatch");
    cmd.args(["-n1", "--parsable"])
        .arg("--export=ALL")
        .arg(format!("--output={}-%j", out.display()))
        .args(args)
        .arg(format!("--wrap={script}"));
    cmd
}

fn job_output(c: &Cluster, stdout: &str) -> Vec<Value> {
    let id = stdout.trim().split(';').next().unwrap_or("").to_string();
    let out = out_dir(c).join(format!("job-{}.out-{id}", std::process::id()));
    parse_lines(&std::fs::read_to_string(&out).unwrap_or_default())
}

/// The object for slice `id` anywhere in `cuslice status --json`.
fn find_slice(v: &Value, id: &str) -> Option<Value> {
    match v {
        Value::Object(m) if m.get("slice").and_then(Value::as_str) == Some(id) => Some(v.clone()),
        Value::Object(m) => m.values().find_map(|x| find_slice(x, id)),
        Value::Array(a) => a.iter().find_map(|x| find_slice(x, id)),
        _ => None,
    }
}

/// A job holding 64 MiB until its stdin closes, once it has started.
fn holding(c: &Cluster, gres: &str) -> std::process::Child {
    let mut job = c
        .srun(&[gres], &["hold", "--bytes", "64m"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(job.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    job
}

fn wl() -> String {
    cuslice_test_harness::workload().display().to_string()
}

/// Two jobs of 25 and 75 shards of one GPU, one by srun and one by sbatch, each filling memory
/// until refused and holding it while the other runs: each is held to its share of the GPU's
/// memory (its context included), by the simulator's count.
#[test]
fn shard_jobs_get_their_share_of_memory_under_srun_and_sbatch() {
    root_required();
    let c = cluster();
    let fill = ["fill", "--family", "mem", "--chunk", "64m", "--hold", "4"];
    let mut batch = sbatch(
        c,
        &["--gres=shard:75"],
        &format!("{} {}", wl(), fill.join(" ")),
    );
    let batch = std::thread::spawn(move || batch.output().unwrap());
    let (lines, stderr, ok) = output(c.srun(&["--gres=shard:25"], &fill));
    assert!(ok, "srun failed: {stderr}; slurmd: {}", c.slurmd_log());
    let batch = batch.join().unwrap();
    assert!(
        batch.status.success(),
        "sbatch failed: {}",
        String::from_utf8_lossy(&batch.stderr)
    );
    let batch_lines = job_output(c, &String::from_utf8_lossy(&batch.stdout));
    for (lines, shards) in [(&lines, 25u64), (&batch_lines, 75)] {
        let refused = the(lines, "refused", &stderr);
        assert_eq!(refused["name"], "CUDA_ERROR_OUT_OF_MEMORY", "{refused}");
        let cap = GPU_MEMORY * shards / u64::from(SHARDS);
        let held = peak(c, 0, u(&refused["pid"]));
        assert!(
            held <= cap && held + 64 * MIB > cap,
            "{shards} shards: held {} MiB at its peak, cap {} MiB",
            held / MIB,
            cap / MIB
        );
        // What the job's process reads back is its cap, not the device.
        assert_eq!(u(&refused["total"]), cap, "{refused}");
    }
    poll("the jobs' slices removed at their epilog", 30, || {
        c.slices().is_empty().then_some(())
    });
}

/// Two jobs of 25 and 75 shards running fixed-work kernels back to back at once: each gets
/// its share of the GPU's time, by the simulator's count. Judged as every share is: one run
/// that misses is run once more (a host that holds a job's launching thread back leaves the
/// device idle in its turn: 23.2% and 69.9% once, 93.1% of the device in all), and the test
/// fails when it misses twice running.
#[test]
fn shard_jobs_get_their_share_of_compute() {
    let _serial = cuslice_test_harness::serial();
    root_required();
    cuslice_test_harness::twice(shard_jobs_get_their_share_of_compute_once);
}

fn shard_jobs_get_their_share_of_compute_once() {
    let c = cluster();
    let secs = 14.0;
    let launch = format!(
        "{} launch --kernel work --ns-per-block 1000 --blocks 1000 --secs {secs}",
        wl()
    );
    let mut batch = sbatch(c, &["--gres=shard:25"], &launch);
    let batch = std::thread::spawn(move || batch.output().unwrap());
    let mut srun = c
        .srun(
            &["--gres=shard:75"],
            &launch.split_whitespace().skip(1).collect::<Vec<_>>(),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(srun.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let big: Value = serde_json::from_str(&first)
        .unwrap_or_else(|_| panic!("srun printed {first:?}; slurmd: {}", c.slurmd_log()));
    let big = u(&big["pid"]) as i64;
    // Both running: two processes with device time on device 0.
    let start = Instant::now();
    let both = poll("both jobs running on device 0", 30, || {
        let t = c.sim.device_times(0);
        let live: Vec<i64> = c.sim.device(0)["processes"]
            .as_array()?
            .iter()
            .filter_map(|p| p["pid"].as_i64())
            .collect();
        (live.len() == 2 && live.contains(&big)).then_some((t, live))
    });
    let small = *both.1.iter().find(|&&p| p != big).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let t0 = c.sim.device_times(0);
    let w0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(
        (secs - 4.0 - start.elapsed().as_secs_f64()).max(4.0),
    ));
    let t1 = c.sim.device_times(0);
    let wall = w0.elapsed().as_nanos() as f64;
    let share = |pid: i64| (t1[&pid] - t0.get(&pid).copied().unwrap_or(0)) as f64 / wall * 100.0;
    let (s25, s75) = (share(small), share(big));
    eprintln!("25 and 75 shards: {s25:.1}% and {s75:.1}% of the device");
    let _ = srun.wait();
    let batch = batch.join().unwrap();
    assert!(batch.status.success(), "sbatch: {batch:?}");
    assert!(
        (s25 - 25.0).abs() <= 5.0 && (s75 - 75.0).abs() <= 5.0,
        "25 and 75 shards got {s25:.1}% and {s75:.1}% of the device"
    );
}

/// A job that unsets LD_PRELOAD, sets its own CUSLICE_* and starts its program with `env -i`
/// (keeping only what the simulated driver needs) is still held to its 25 shards, and cannot
/// unmount what holds it, nor write another job's claims and turns on the node's compute board
/// (at its real path, which world-writable files would otherwise leave open to any account).
#[test]
fn a_job_that_tries_to_escape_is_held() {
    root_required();
    let c = cluster();
    let mut neighbour = holding(c, "--gres=shard:10");
    let script = format!(
        "unset LD_PRELOAD; export CUSLICE_MEMORY_LIMIT=8GiB CUSLICE_CORE_LIMIT=100; \
         umount /etc/ld.so.preload 2>/dev/null && echo '{{\"event\":\"unmounted\"}}'; \
         n=0; for f in {board}/*/claims {board}/*/turns; do [ -f $f ] && n=$((n+1)); \
         (echo x >> $f) 2>/dev/null && echo '{{\"event\":\"wrote\"}}'; done; \
         echo '{{\"event\":\"board\",\"files\":'$n'}}'; \
         exec env -i SIMGPU_STATE={} LD_LIBRARY_PATH={} CUSLICE_MEMORY_LIMIT=8GiB {} fill --family mem --chunk 64m",
        c.sim.state.display(),
        c.libs.display(),
        wl(),
        board = c.node_dir.display()
    );
    // It also names another node in the environment it submits (taken for this node's name, it
    // matched none of the job's GRES, and the task ran with no slice).
    let mut cmd = c.command("srun");
    cmd.args(["-n1", "--quiet", "--gres=shard:25"])
        .arg("--export=ALL")
        .env("SLURMD_NODENAME", "elsewhere")
        .args(["sh", "-c", &script]);
    let (lines, stderr, ok) = output(cmd);
    assert!(ok, "srun failed: {stderr}; slurmd: {}", c.slurmd_log());
    drop(neighbour.stdin.take());
    let _ = neighbour.wait();
    assert!(
        !lines.iter().any(|l| l["event"] == "unmounted"),
        "{lines:?}"
    );
    // Its own and its neighbour's places: four files, none written.
    assert_eq!(the(&lines, "board", &stderr)["files"], 4, "{lines:?}");
    assert!(!lines.iter().any(|l| l["event"] == "wrote"), "{lines:?}");
    let refused = the(&lines, "refused", &stderr);
    let cap = GPU_MEMORY / 4;
    let held = peak(c, 0, u(&refused["pid"]));
    assert!(
        held <= cap,
        "held {} MiB, cap {} MiB",
        held / MIB,
        cap / MIB
    );
    // The interposer says it ignored the environment's settings.
    assert!(stderr.contains("CUSLICE_MEMORY_LIMIT"), "{stderr}");
}

/// A job holding both GPUs whole gets each GPU's memory as its cap there, and a job whose
/// shards are on the second GPU is held there: device ordinals follow the job's GPUs.
#[test]
fn multi_gpu_and_second_gpu_jobs_get_the_right_cap_on_each() {
    root_required();
    let c = cluster();
    for dev in ["0", "1"] {
        let (lines, stderr, ok) = output(c.srun(
            &["--gres=gpu:2"],
            &[
                "--device", dev, "fill", "--family", "mem", "--chunk", "256m",
            ],
        ));
        assert!(ok, "srun failed: {stderr}; slurmd: {}", c.slurmd_log());
        let refused = the(&lines, "refused", &stderr);
        let held = peak(c, dev.parse().unwrap(), u(&refused["pid"]));
        assert!(
            held <= GPU_MEMORY && held + 256 * MIB > GPU_MEMORY,
            "device {dev}: {} MiB",
            held / MIB
        );
    }
    // 100 shards of GPU 0 held by one job: the next shard job is given GPU 1.
    let mut holder = holding(c, "--gres=shard:100");
    let (lines, stderr, ok) = output(c.srun(
        &["--gres=shard:50"],
        &["fill", "--family", "mem", "--chunk", "64m"],
    ));
    drop(holder.stdin.take());
    let _ = holder.wait();
    assert!(ok, "srun failed: {stderr}");
    let refused = the(&lines, "refused", &stderr);
    let held = peak(c, 1, u(&refused["pid"]));
    assert!(
        held <= GPU_MEMORY / 2 && held + 64 * MIB > GPU_MEMORY / 2,
        "{} MiB",
        held / MIB
    );
}

/// `cuslice status` names a running job's slice by its job id and user; the slice goes at the
/// job's end, after `scancel` too.
#[test]
fn status_names_the_job_and_scancel_leaves_nothing() {
    root_required();
    let c = cluster();
    let out = submit(
        c,
        &["--gres=shard:10"],
        &format!("{} hold --bytes 64m --secs 120", wl()),
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "sbatch: {out:?}");
    let job = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let slice = format!("slurm-{job}");
    let start = Instant::now();
    let status = loop {
        let mut cmd = c.sim.command(
            &cuslice_test_harness::bin_dir().join("cuslice"),
            &["status", "--json", "--state-root"],
        );
        cmd.arg(&c.state_root);
        let last = cuslice_test_harness::json_of(&mut cmd);
        if let Some(s) = find_slice(&last, &slice)
            .filter(|s| s["memory"]["used"].as_u64().is_some_and(|u| u > 0))
        {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no {slice} in cuslice status in 30 s: {last}; slices {:?}; slurmd: {}",
            c.slices(),
            c.slurmd_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status["name"], format!("job {job} (nobody)"), "{status}");
    // The exporter labels its series the same way.
    let metrics = cuslice_test_engines::scrape(&c.sim, &c.state_root);
    let label = format!("name=\"job {job} (nobody)\"");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("cuslice_slice_memory_used_bytes")
                && l.contains(&label)
                && l.contains(&slice)),
        "no cuslice_slice_memory_used_bytes series for {slice} with {label}: {metrics}"
    );
    // A slice whose job's epilog never ran (slurmd was killed): made from this one's record.
    let record = c
        .state_root
        .join("containers")
        .join(&slice)
        .join("record.json");
    let mut stale: Value =
        serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    stale["id"] = "slurm-424242".into();
    stale["slurm"]["job"] = 424242.into();
    let stale_dir = c.state_root.join("containers/slurm-424242");
    std::fs::create_dir_all(&stale_dir).unwrap();
    std::fs::write(stale_dir.join("record.json"), stale.to_string()).unwrap();
    assert!(c.slices().contains(&"slurm-424242".to_string()));
    let scancel = c.command("scancel").arg(&job).output().unwrap();
    assert!(scancel.status.success(), "{scancel:?}");
    // Its epilog removes its slice, and the one of the job this node no longer runs.
    poll("the cancelled job's slice removed", 30, || {
        c.slices().is_empty().then_some(())
    });
    // Nothing of it on the compute board either.
    let board: Vec<_> = std::fs::read_dir(&c.node_dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        c.slices().is_empty() == board.is_empty(),
        "slices {:?}, board {board:?}",
        c.slices()
    );
}

/// A job that hides /etc/ld.so.preload from its program (a user namespace of its own, with an
/// empty file mounted over it) runs without the library and takes 4 GiB under its 2 GiB cap.
/// A job's process started by `srun` with `args`, once it says it holds its memory: (the job, its
/// `holding` line).
fn holding_job(
    c: &Cluster,
    args: &[&str],
    agent: &cuslice_test_engines::NodeAgent,
) -> (std::process::Child, Value) {
    let mut job = c
        .srun(&["--gres=shard:25"], args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(job.stdout.take().unwrap());
    let mut lines = Vec::new();
    let held = loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!(
                "the job ended before holding its memory: {lines:?}; agent: {}",
                agent.log()
            );
        }
        let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        if v["event"] == "holding" {
            break v;
        }
        lines.push(v);
    };
    assert!(
        lines
            .iter()
            .all(|v| v["event"] != "dropped" || v["ok"] == true),
        "the job could not hide the preload file: {lines:?}"
    );
    (job, held)
}

/// The node agent under `--enforce stop` tells the job's processes by the slice mounted in their
/// mount namespace, and kills it by the driver's count. Beside it, a job that put a FIFO over its
/// slice's config file (in a mount namespace of its own) does not hold the agent up: the agent,
/// which read that file to tell a job's processes, waited on the FIFO for ever and stopped
/// nobody.
#[test]
fn the_agent_stops_a_job_that_drops_the_library() {
    root_required();
    let c = cluster();
    let agent = cuslice_test_engines::NodeAgent::start_at_args(
        &c.sim,
        &c.state_root,
        &["--enforce", "stop"],
    );
    let fifo = out_dir(c).join(format!("fifo-{}", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    std::fs::set_permissions(&fifo, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let over = format!("/run/cuslice/slice/config={}", fifo.display());
    let (mut hider, _) = holding_job(
        c,
        &[
            "drop-preload",
            "--over",
            &over,
            "--",
            &wl(),
            "hold",
            "--bytes",
            "1GiB",
            "--secs",
            "60",
        ],
        &agent,
    );
    let (mut job, held) = holding_job(
        c,
        &[
            "drop-preload",
            "--",
            &wl(),
            "hold",
            "--bytes",
            "4GiB",
            "--secs",
            "60",
        ],
        &agent,
    );
    // The library did not load: the process sees the whole device.
    assert_eq!(u(&held["total"]), GPU_MEMORY, "{held}");
    let pid = held["pid"].clone();
    let t0 = Instant::now();
    let gone = loop {
        let now = c.sim.device(0)["processes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .find(|p| p["pid"] == pid)
            .map_or(0, |p| u(&p["held"]));
        if now <= GPU_MEMORY / 4 {
            break Some(t0.elapsed());
        }
        if t0.elapsed() > Duration::from_secs(20) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for j in [&mut job, &mut hider] {
        let _ = j.kill();
        let _ = j.wait();
    }
    let _ = std::fs::remove_file(&fifo);
    let log = agent.log();
    let gone = gone.unwrap_or_else(|| {
        panic!("the job's process holding 4 GiB under a 2 GiB cap was not stopped in 20 s; agent: {log}")
    });
    assert!(
        gone <= Duration::from_secs(5),
        "stopped after {gone:?}; agent: {log}"
    );
    assert!(
        log.contains("killed pid") && log.contains("slurm-"),
        "{log}"
    );
}

/// The batch script and both tasks of a step inside it share the job's one slice: while one
/// task holds 1 GiB of the job's 2 GiB, the other is refused at what is left.
#[test]
fn the_steps_and_tasks_of_a_job_share_one_slice() {
    root_required();
    let c = cluster();
    let script = format!(
        "srun -n2 --quiet sh -c 'if [ $SLURM_PROCID = 0 ]; then exec {wl} hold --bytes 1GiB --secs 6; \
         else sleep 2; exec {wl} fill --family mem --chunk 64m; fi'",
        wl = wl()
    );
    let mut cmd = c.command("sbatch");
    cmd.args([
        "--wait",
        "-n2",
        "--parsable",
        "--gres=shard:25",
        "--export=ALL",
    ])
    .arg(format!(
        "--output={}/steps-{}.out",
        out_dir(c).display(),
        std::process::id()
    ))
    .arg(format!("--wrap={script}"));
    let out = cmd.output().unwrap();
    let text =
        std::fs::read_to_string(out_dir(c).join(format!("steps-{}.out", std::process::id())))
            .unwrap_or_default();
    assert!(out.status.success(), "sbatch: {out:?}; job output: {text}");
    let lines = parse_lines(&text);
    let refused = the(&lines, "refused", &text);
    let holder = the(&lines, "holding", &text);
    let (a, b) = (
        peak(c, 0, u(&refused["pid"])),
        peak(c, 0, u(&holder["pid"])),
    );
    let cap = GPU_MEMORY / 4;
    assert!(
        a + b <= cap && a + b + 64 * MIB > cap,
        "the two tasks held {} and {} MiB at their peaks under one 2048 MiB cap",
        a / MIB,
        b / MIB
    );
}
