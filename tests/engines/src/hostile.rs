//! A hostile tenant (`cuda-workload tamper`) attacks whatever cuslice state its container can
//! reach, and the other containers on the node must not notice: their shares, their admission and
//! their start-up, judged by the simulator's count and by whether they start at all.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use cuslice_test_harness::{Sim, bin_dir};
use serde_json::Value;

use super::{Container, Engine, Spec, name};

/// 1 ms kernels back to back.
const KERNELS: &str = "cuda-workload launch --ns-per-block 1000 --blocks 1000";
/// 10 ms kernels back to back.
const LONG_KERNELS: &str = "cuda-workload launch --ns-per-block 10000 --blocks 1000";

/// Reads the container's JSON lines until one whose event is `event`, for at most `secs`
/// (a process hung in cuInit prints nothing: `lines_until` would wait for ever). None: the time
/// ran out, or the container ended first.
pub fn within(c: &mut dyn Container, event: &str, secs: u64) -> Option<(Vec<Value>, Value)> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut before = Vec::new();
    loop {
        if c.stdout().buffer().is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let mut fds = [libc::pollfd {
                fd: c.stdout().get_ref().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            // SAFETY: one valid pollfd for the length passed.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, left.as_millis() as i32) };
            if n <= 0 {
                continue;
            }
        }
        let mut line = String::new();
        if c.stdout().read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        if let Ok(v) = serde_json::from_str::<Value>(&line) {
            if v["event"] == event {
                return Some((before, v));
            }
            before.push(v);
        }
    }
}

fn spawn<'e>(
    engine: &'e dyn Engine,
    sim: &Sim,
    what: &str,
    env: &[&str],
    script: &str,
) -> Box<dyn Container + 'e> {
    let n = name(what);
    engine.spawn(
        sim,
        &Spec {
            name: &n,
            env,
            cmd: &["sh", "-c", script],
            read_only: false,
        },
    )
}

/// A container whose share of the device a test judges, run ahead of the machine's other work
/// from here on (`put_ahead`): its library's gate and compute thread run in its process, and a
/// host that runs them late leaves the device idle in the slice's own turn, which the turn is
/// charged for. In one CI run on the 2-core machine, slices limited to 30 and 70 got 21.8% and
/// 55.2% before the tenant came (the device idle a quarter of the time), and the scenario failed;
/// the share-judged scenarios here run twice before they fail (docs/testing.md, "What runs
/// beside what").
fn judged(c: &dyn Container) {
    cuslice_test_harness::put_ahead(c.host_pid());
}

/// `spawn`, waits for its work to start (`who` names it if it does not), and puts it ahead
/// (`judged`).
fn started_judged<'e>(
    engine: &'e dyn Engine,
    sim: &Sim,
    what: &str,
    who: &str,
    env: &[&str],
    script: &str,
) -> Box<dyn Container + 'e> {
    let mut c = spawn(engine, sim, what, env, script);
    within(c.as_mut(), "start", 30)
        .unwrap_or_else(|| panic!("{who} did not start: {}", c.stderr()));
    judged(c.as_ref());
    c
}

/// Each pid's share of the device (%) over `secs`, by the simulator's count (each count one the
/// simulator gave promptly, at the instant it stands for: `Sim::device_times_at`).
fn shares(sim: &Sim, pids: &[i32], secs: f64) -> Vec<f64> {
    let (t0, a) = sim.device_times_at(0);
    std::thread::sleep(Duration::from_secs_f64(secs));
    let (t1, b) = sim.device_times_at(0);
    let span = (t1 - t0).as_nanos() as f64;
    pids.iter()
        .map(|p| {
            let p = *p as i64;
            let used = b.get(&p).copied().unwrap_or(0) - a.get(&p).copied().unwrap_or(0);
            100.0 * used as f64 / span
        })
        .collect()
}

/// What the tenant said it tried and managed.
fn managed(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .filter(|v| v["event"] == "tampered" && v["ok"] == true)
        .map(|v| format!("{} {}", v["what"], v["path"]))
        .collect()
}

/// Two containers at once: no file or directory cuslice mounts is writable from both. Each
/// may write its own slice's files; the node agent's socket is the one thing they share.
pub fn nothing_shared_is_writable(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let survey = "exec cuda-workload tamper --survey --secs 30";
    let mut a = spawn(
        engine,
        &sim,
        "survey-a",
        &["CUSLICE_MEMORY_LIMIT=1GiB"],
        survey,
    );
    let mut b = spawn(
        engine,
        &sim,
        "survey-b",
        &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_CORE_LIMIT=30"],
        survey,
    );
    let mut writable = Vec::new();
    for c in [&mut a, &mut b] {
        let (lines, _) = within(c.as_mut(), "ready", 60)
            .unwrap_or_else(|| panic!("the survey did not finish: {}", c.stderr()));
        let mine: BTreeMap<(u64, u64), String> = lines
            .iter()
            .filter(|v| v["event"] == "writable")
            .map(|v| {
                (
                    (v["dev"].as_u64().unwrap(), v["ino"].as_u64().unwrap()),
                    v["path"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        writable.push(mine);
    }
    a.remove();
    b.remove();
    let a_keys: BTreeSet<_> = writable[0].keys().collect();
    let shared: Vec<&String> = writable[1]
        .iter()
        .filter(|(k, _)| a_keys.contains(k))
        .map(|(_, p)| p)
        .collect();
    assert!(
        shared.is_empty(),
        "both containers can write {shared:?} (first container: {:?}; second: {:?})",
        writable[0].values().collect::<Vec<_>>(),
        writable[1].values().collect::<Vec<_>>()
    );
    // Each can write its own ledger: the library's own bookkeeping needs it.
    for w in &writable {
        assert!(
            w.values().any(|p| p == "/run/cuslice/slice/ledger"),
            "{w:?}"
        );
    }
}

/// A tenant with only a memory cap forges the node's compute state for every device (the
/// whole device claimed, high priority, high-priority work always in flight, always wanting
/// more, its turn flickering between a short hold and a wait since the start of time) and takes
/// more places in the arbitration than there are, with the node agent running
/// (as on a node in production: it tells each container process its host pid). Beside it, by
/// the simulator's count: a container without core settings keeps the share of the device it had
/// before the tenant came, also where the driver names one process a period (as real drivers
/// and the simulator by default do); a container with a core request is admitted and gets at
/// least its request, the one without core settings the rest; and a second one with a request
/// is admitted too.
pub fn forged_claims_take_nothing(engine: &dyn Engine) {
    let _serial = cuslice_test_harness::serial();
    let _turn = super::agent_turn();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let _agent = super::NodeAgent::start(&sim);
    // Without core settings: what it gets of an otherwise idle device, before the tenant and
    // beside it. (10 ms kernels, so that the launching thread needs little of the CPU.)
    let free = started_judged(
        engine,
        &sim,
        "free",
        "a container without core settings",
        &["CUSLICE_MEMORY_LIMIT=1GiB"],
        &format!("exec {LONG_KERNELS} --secs 90"),
    );
    std::thread::sleep(Duration::from_secs(2));
    let before = shares(&sim, &[free.host_pid()], 3.0)[0];
    let mut tenant = spawn(
        engine,
        &sim,
        "forger",
        &["CUSLICE_MEMORY_LIMIT=4GiB"],
        "exec cuda-workload tamper --forge --forge-flicker --flood 260 --secs 120",
    );
    let (tried, _) = within(tenant.as_mut(), "ready", 180)
        .unwrap_or_else(|| panic!("the tenant did not get ready: {}", tenant.stderr()));
    let done = managed(&tried);
    let flooded = tried
        .iter()
        .find(|v| v["event"] == "flooded")
        .map(|v| v["initialised"].clone());
    std::thread::sleep(Duration::from_secs(2));
    let beside = shares(&sim, &[free.host_pid()], 4.0)[0];
    // With a core request of half the device: admitted, and held to no less than its request.
    let mut victim = spawn(
        engine,
        &sim,
        "victim",
        &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_CORE_REQUEST=50"],
        &format!("exec {LONG_KERNELS} --secs 60"),
    );
    let started = within(victim.as_mut(), "start", 30);
    let victim_err = victim.stderr();
    let both = if started.is_some() {
        judged(victim.as_ref());
        std::thread::sleep(Duration::from_secs(3));
        shares(&sim, &[free.host_pid(), victim.host_pid()], 4.0)
    } else {
        Vec::new()
    };
    // A second container with a request: admitted as well (50 + 40 <= 100).
    let second = engine.run(
        &sim,
        &Spec {
            name: &name("second"),
            env: &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_CORE_REQUEST=40"],
            cmd: &[
                "cuda-workload",
                "launch",
                "--ns-per-block",
                "1000",
                "--blocks",
                "10",
                "--secs",
                "0",
                "--count",
                "10",
            ],
            read_only: false,
        },
    );
    for c in [tenant, victim, free] {
        c.remove();
    }
    let attack = format!("the tenant managed {done:?}; flood processes initialised: {flooded:?}");
    // The attack took place: the forged claims were posted, and more processes than the node
    // once had places for initialised CUDA.
    assert!(
        done.iter().any(|d| d.contains("forge-claims")),
        "the tenant could not post its forged claims ({attack})"
    );
    assert!(
        flooded
            .as_ref()
            .and_then(Value::as_u64)
            .is_some_and(|n| n > 256),
        "the tenant's flood did not initialise more than 256 processes ({attack})"
    );
    eprintln!(
        "a container without core settings: {before:.1}% of the device before the tenant, \
         {beside:.1}% beside it; beside it and a container with a request of 50: {both:.1?}%"
    );
    assert!(
        beside >= before - 5.0,
        "a container without core settings got {before:.1}% of the device before the tenant \
         and {beside:.1}% beside it ({attack})"
    );
    assert!(
        started.is_some(),
        "a container with CUSLICE_CORE_REQUEST=50 was not admitted ({attack}): {victim_err}"
    );
    assert!(
        both[1] >= 47.0 && both[0] >= before - both[1] - 5.0,
        "beside the tenant, a container without core settings and one with a request of 50 got \
         {both:.1?}% ({before:.1}% before the tenant; {attack})"
    );
    assert!(
        second.status.success(),
        "a second container with CUSLICE_CORE_REQUEST=40 was not admitted ({attack}): {}",
        String::from_utf8_lossy(&second.stderr)
    );
}

/// A tenant granted a core request of 20% posts it in five entries of its claims file (each
/// admitted alone): it counts once, so a container asking for 70% more is admitted and runs
/// (with every entry counted, the device was 100% requested and it was refused at `cuInit`).
pub fn duplicate_claims_count_once(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let mut tenant = spawn(
        engine,
        &sim,
        "dupclaims",
        &["CUSLICE_CORE_REQUEST=20"],
        "exec cuda-workload tamper --duplicate-claims 5 --secs 60",
    );
    let (tried, _) = within(tenant.as_mut(), "ready", 60)
        .unwrap_or_else(|| panic!("the tenant did not get ready: {}", tenant.stderr()));
    let posted = tried
        .iter()
        .filter(|v| v["what"] == "duplicate-claim" && v["ok"] == true)
        .count();
    let other = engine.run(
        &sim,
        &Spec {
            name: &name("after-dup"),
            env: &["CUSLICE_CORE_REQUEST=70"],
            cmd: &[
                "cuda-workload",
                "launch",
                "--ns-per-block",
                "1000",
                "--blocks",
                "10",
                "--secs",
                "0",
                "--count",
                "10",
            ],
            read_only: false,
        },
    );
    tenant.remove();
    assert_eq!(
        posted, 5,
        "the tenant posted its claim in {posted} entries: {tried:?}"
    );
    assert!(
        other.status.success(),
        "a container with CUSLICE_CORE_REQUEST=70 beside a request of 20 posted five times was \
         not admitted: {}",
        String::from_utf8_lossy(&other.stderr)
    );
}

/// What bounds forged turns costs an honest slice: a container limited to 30, idle long enough
/// for the node agent to see it so (a slice without a request seen idle has no allotment), comes
/// back to work beside a busy container without core settings. The busy one's account of what
/// it holds it up goes past its bound within about half a second, and passes it over until the
/// agent's next look sees it at work (docs/compute.md, "What another slice posts"); from 3 s after
/// its work began, by the simulator's count, it has its limit again and the busy one the rest.
pub fn back_at_work_beside_a_busy_slice(engine: &dyn Engine) {
    let _serial = cuslice_test_harness::serial();
    let _turn = super::agent_turn();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let _agent = super::NodeAgent::start(&sim);
    let busy = started_judged(
        engine,
        &sim,
        "busy",
        "the busy container",
        &["CUSLICE_MEMORY_LIMIT=1GiB"],
        &format!("exec {LONG_KERNELS} --secs 40"),
    );
    let mut back = started_judged(
        engine,
        &sim,
        "back",
        "the limited container",
        &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_CORE_LIMIT=30"],
        "exec cuda-workload launch --ns-per-block 10000 --blocks 100 --idle-secs 3 \
         --progress-ms 250 --secs 12",
    );
    within(back.as_mut(), "progress", 30)
        .unwrap_or_else(|| panic!("the limited container did no work: {}", back.stderr()));
    // Half-second windows from a quarter of a second after its work began.
    let pids = [busy.host_pid(), back.host_pid()];
    let windows: Vec<Vec<f64>> = (0..12).map(|_| shares(&sim, &pids, 0.5)).collect();
    for c in [back, busy] {
        c.remove();
    }
    let shown = windows
        .iter()
        .map(|w| format!("{:.0}/{:.0}", w[0], w[1]))
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!("busy/limited, each half second from its work's first quarter: {shown}");
    let settled = &windows[6..];
    let mean = |i: usize| settled.iter().map(|w| w[i]).sum::<f64>() / settled.len() as f64;
    let (busy, back) = (mean(0), mean(1));
    assert!(
        (back - 30.0).abs() <= 5.0 && busy >= 60.0,
        "from 3 s after its work began, the container limited to 30 got {back:.1}% of the device \
         and the busy one {busy:.1}% (each half second: {shown})"
    );
}

/// A tenant with only a memory cap claims the whole of every device, always wanting more, and says
/// its launches took the whole device too (the figure by which a period the driver names one
/// process for is shared out). Two slices at core limits 30 and 70 beside it, both busy, with the
/// node agent running: by the simulator's count each stays within 3 points of what it got before
/// the tenant came. The device shows the neighbours busy, so the claim is not passed over for an
/// idle device; the agent's evidence of what the driver saw the tenant use (nothing) is what
/// keeps it from counting. Without that evidence the slice limited to 70% was allotted an equal
/// split with the tenant (35.0% in place of 69.9%) while the tenant left its part idle.
pub fn forged_claims_beside_busy_neighbours(engine: &dyn Engine) {
    let _serial = cuslice_test_harness::serial();
    let _turn = super::agent_turn();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let _agent = super::NodeAgent::start(&sim);
    let mut honest = Vec::new();
    for (what, limit) in [("thirty", 30), ("seventy", 70)] {
        let env = format!("CUSLICE_CORE_LIMIT={limit}");
        honest.push(started_judged(
            engine,
            &sim,
            what,
            &format!("the {what} container"),
            &["CUSLICE_MEMORY_LIMIT=1GiB", &env],
            &format!("exec {KERNELS} --secs 90"),
        ));
    }
    let pids: Vec<i32> = honest.iter().map(|c| c.host_pid()).collect();
    std::thread::sleep(Duration::from_secs(3));
    let before = shares(&sim, &pids, 4.0);
    let mut tenant = spawn(
        engine,
        &sim,
        "launches",
        &["CUSLICE_MEMORY_LIMIT=1GiB"],
        "exec cuda-workload tamper --forge --forge-launched --secs 60",
    );
    let (tried, _) = within(tenant.as_mut(), "ready", 60)
        .unwrap_or_else(|| panic!("the tenant did not get ready: {}", tenant.stderr()));
    let done = managed(&tried);
    std::thread::sleep(Duration::from_secs(3));
    let beside = shares(&sim, &pids, 6.0);
    tenant.remove();
    // An honest best-effort slice in its place, busy: its claim counts, since the driver sees
    // it at work, and it gets an equal part of what the 30 leaves.
    let busy = started_judged(
        engine,
        &sim,
        "busy",
        "the busy container",
        &["CUSLICE_MEMORY_LIMIT=1GiB"],
        &format!("exec {KERNELS} --secs 60"),
    );
    std::thread::sleep(Duration::from_secs(6));
    let honest_pids = [pids[0], pids[1], busy.host_pid()];
    let fair = shares(&sim, &honest_pids, 6.0);
    busy.remove();
    for c in honest {
        c.remove();
    }
    eprintln!(
        "limits 30 and 70: {before:.1?}% before the tenant, {beside:.1?}% beside it; \
         {fair:.1?}% beside an honest busy best-effort slice"
    );
    assert!(
        done.iter().any(|d| d.contains("forge-claims")),
        "the tenant could not post its forged launches: {done:?}"
    );
    for (k, limit) in [30.0, 70.0].into_iter().enumerate() {
        assert!(
            beside[k] <= limit + 3.0 && (beside[k] - before[k]).abs() <= 3.0,
            "the slice limited to {limit}% got {:.1}% before the tenant and {:.1}% beside it \
             (the tenant managed {done:?})",
            before[k],
            beside[k]
        );
    }
    // Beside an honest slice: 30, and an equal split of the rest (35 and 35).
    for (k, want) in [30.0, 35.0, 35.0].into_iter().enumerate() {
        assert!(
            (fair[k] - want).abs() <= 5.0,
            "beside an honest busy best-effort slice the three got {fair:.1?}%, not about \
             [30, 35, 35]: its claim did not count as the driver saw it at work"
        );
    }
}

/// A tenant granted a core request of 20 and no limit claims to use the whole device, to want
/// more, and to have had launches in flight the whole time, while it launches nothing. A busy
/// slice limited to 30% with 10 ms kernels beside it, with the node agent running: by the
/// simulator's count it gets no less than 3 points under what it got before the tenant came, and
/// no more than 5 over (30.8-33.1% in four runs on the 2-core machine, 29.5-30.1% before: with the
/// tenant on the board the driver's samples count as shared, so the slice is charged by its
/// timings, which sit a little under what it uses). Without the agent's bounds, each attack took
/// it far from that:
/// - the hunger: time no request guarantees goes to slices that want more in proportion to their
///   requests, so the tenant was allotted all of it and the 30 got 1.0-2.0%;
/// - the time in flight: the slices beside it take the part of their long kernels' readings that
///   the device's busy time shows was counted twice off what those kernels cost, so the 30 was
///   charged half its device time and got 59.9%.
pub fn forged_time_in_flight_beside_long_kernels(engine: &dyn Engine) {
    let _serial = cuslice_test_harness::serial();
    let _turn = super::agent_turn();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let _agent = super::NodeAgent::start(&sim);
    let victim = started_judged(
        engine,
        &sim,
        "long",
        "the limited container",
        &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_CORE_LIMIT=30"],
        &format!("exec {LONG_KERNELS} --secs 90"),
    );
    let pid = victim.host_pid();
    std::thread::sleep(Duration::from_secs(3));
    let before = shares(&sim, &[pid], 4.0)[0];
    let mut tenant = spawn(
        engine,
        &sim,
        "inflight",
        &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_CORE_REQUEST=20"],
        "exec cuda-workload tamper --forge --forge-launched --secs 60",
    );
    let (tried, _) = within(tenant.as_mut(), "ready", 60)
        .unwrap_or_else(|| panic!("the tenant did not get ready: {}", tenant.stderr()));
    let done = managed(&tried);
    std::thread::sleep(Duration::from_secs(4));
    let beside = shares(&sim, &[pid], 6.0)[0];
    tenant.remove();
    victim.remove();
    eprintln!(
        "a container limited to 30% with 10 ms kernels: {before:.1}% before the tenant, \
         {beside:.1}% beside it"
    );
    assert!(
        done.iter().any(|d| d.contains("forge-claims")),
        "the tenant could not post its forged launches: {done:?}"
    );
    assert!(
        (before - 30.0).abs() <= 3.0 && beside >= before - 3.0 && beside <= before + 5.0,
        "the container limited to 30% got {before:.1}% before the tenant and {beside:.1}% \
         beside it (the tenant managed {done:?})"
    );
}

/// A tenant replaces, links over and locks whatever node state it can: a new CUDA process in
/// another container still starts at once, and so does `cuslice set` on the host after the
/// tenant is gone.
pub fn replaced_state_hangs_nobody(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let mut first = spawn(
        engine,
        &sim,
        "first",
        &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_CORE_LIMIT=50"],
        "exec cuda-workload hold --bytes 1MiB --secs 120",
    );
    within(first.as_mut(), "holding", 60)
        .unwrap_or_else(|| panic!("the first container did not start: {}", first.stderr()));
    let mut tenant = spawn(
        engine,
        &sim,
        "replacer",
        &["CUSLICE_MEMORY_LIMIT=1GiB"],
        "exec cuda-workload tamper --replace --secs 60",
    );
    let (tried, _) = within(tenant.as_mut(), "ready", 60)
        .unwrap_or_else(|| panic!("the tenant did not get ready: {}", tenant.stderr()));
    let done = managed(&tried);
    // The attack took place: each kind of it was tried on the node state the tenant sees.
    for what in ["flock", "fifo-over", "dangling-symlink"] {
        assert!(
            tried
                .iter()
                .any(|v| v["event"] == "tampered" && v["what"] == what),
            "the tenant did not try {what}: {tried:?}"
        );
    }
    let mut victim = spawn(
        engine,
        &sim,
        "victim",
        &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_CORE_LIMIT=30"],
        &format!("exec {KERNELS} --secs 60"),
    );
    let started = within(victim.as_mut(), "start", 20);
    let victim_err = victim.stderr();
    let victim_id = victim.id();
    tenant.remove();
    // The host's tool, once the tenant has gone: answers, whatever it answers.
    let t0 = Instant::now();
    let mut set = Command::new(bin_dir().join("cuslice"))
        .args(["set", &victim_id, "--core-limit", "40"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut answered = None;
    while answered.is_none() && t0.elapsed() < Duration::from_secs(10) {
        answered = set.try_wait().ok().flatten();
        std::thread::sleep(Duration::from_millis(20));
    }
    // Reaped either way (a process that answered is not killed again).
    let _ = set.kill();
    let _ = set.wait();
    victim.remove();
    first.remove();
    assert!(
        started.is_some(),
        "a CUDA process in another container did not start within 20 s after the tenant \
         managed {done:?}: {victim_err}"
    );
    assert!(
        answered.is_some(),
        "`cuslice set` on the host did not answer within 10 s after the tenant (which managed \
         {done:?}) had gone"
    );
}

/// A tenant keeps the library from loading in its own processes with an LD_AUDIT module (the
/// loader asks it before each library, /etc/ld.so.preload's too). Nothing in the container can
/// stop that; the driver still counts what the process holds, and the node agent under
/// `--enforce stop` kills it once over its cap for the grace: by the simulator's count, 2 GiB
/// under a 1 GiB cap is gone within the grace (2 s) and two periods (1 s each) of its holding.
pub fn preload_dropped_is_stopped_by_the_agent(engine: &dyn Engine) {
    library_dropped_is_stopped(
        engine,
        "audit",
        &["CUSLICE_MEMORY_LIMIT=1GiB", "LD_AUDIT=/lib/drop-preload.so"],
        "exec cuda-workload hold --bytes 2GiB --secs 60",
    );
}

/// The same with the other way an unprivileged process has around the preload file: a user
/// namespace of its own, in which it bind-mounts an empty file over /etc/ld.so.preload, then
/// runs the workload there. The hook's read-only mount cannot stop that either; the agent does.
pub fn preload_hidden_by_a_user_namespace_is_stopped_by_the_agent(engine: &dyn Engine) {
    library_dropped_is_stopped(
        engine,
        "userns",
        &["CUSLICE_MEMORY_LIMIT=1GiB"],
        "exec cuda-workload drop-preload -- cuda-workload hold --bytes 2GiB --secs 60",
    );
}

fn library_dropped_is_stopped(engine: &dyn Engine, what: &str, env: &[&str], cmd: &str) {
    let _turn = super::agent_turn();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let agent = super::NodeAgent::start_with(&sim, &["--enforce", "stop"]);
    let mut c = spawn(engine, &sim, what, env, cmd);
    let (before, held) = within(c.as_mut(), "holding", 60)
        .unwrap_or_else(|| panic!("the workload did not hold its memory: {}", c.stderr()));
    assert!(
        before
            .iter()
            .all(|v| v["event"] != "dropped" || v["ok"] == true),
        "the tenant could not hide the preload file: {before:?}"
    );
    let t0 = Instant::now();
    // The library did not load: the process sees the whole device and holds past its cap.
    assert_eq!(held["total"], 8u64 << 30, "{held}");
    let pid = c.host_pid();
    let gone = loop {
        let held_now = sim.device(0)["processes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .find(|p| p["pid"] == pid)
            .map_or(0, |p| p["held"].as_u64().unwrap_or(0));
        if held_now <= 1 << 30 {
            break Some(t0.elapsed());
        }
        if t0.elapsed() > Duration::from_secs(20) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = agent.log();
    c.remove();
    let gone = gone.unwrap_or_else(|| {
        panic!("the process holding 2 GiB under a 1 GiB cap was not stopped in 20 s; agent: {log}")
    });
    assert!(
        gone <= Duration::from_secs(5),
        "stopped {gone:?} after it held 2 GiB (grace 2 s, period 1 s); agent: {log}"
    );
    assert!(log.contains("killed pid"), "{log}");
}

/// A tenant under a 30% core limit goes around the library and keeps four 100 ms kernels queued:
/// work queued on the device runs while the container is frozen. The node agent under
/// `--enforce stop` still holds it near its limit by the simulator's count (within 5 points over
/// 15 s, once it has found it), and says so by what the driver measured. (node/agent/tests has
/// the same with runc, and with kernels too long to hold by freezing.)
pub fn queued_kernels_are_held_by_the_drivers_count(engine: &dyn Engine) {
    let _serial = cuslice_test_harness::serial();
    let _turn = super::agent_turn();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let agent = super::NodeAgent::start_with(&sim, &["--enforce", "stop"]);
    let mut c = spawn(
        engine,
        &sim,
        "queued",
        &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_CORE_LIMIT=30"],
        "exec cuda-workload --route bypass launch --ns-per-block 100000000 --blocks 1 \
         --depth 4 --secs 180",
    );
    within(c.as_mut(), "start", 60)
        .unwrap_or_else(|| panic!("the workload did not start: {}", c.stderr()));
    let t0 = Instant::now();
    while !agent.log().contains("over its core limit") {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no compute finding in 30 s: {}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(5));
    let share = shares(&sim, &[c.host_pid()], 15.0)[0];
    let log = agent.log();
    c.remove();
    assert!(
        (share - 30.0).abs() <= 5.0,
        "a bypass keeping 100 ms kernels queued used {share:.1}% of the device over 15 s by the \
         simulator's count, not within 5 points of its 30% limit; agent: {log}"
    );
    assert!(
        !log.contains("held to"),
        "a share the agent did not measure: {log}"
    );
}

/// A tenant over its memory cap for 1.8 s at a time, resting 1.2 s between (each episode
/// shorter than the grace): the node agent under `--enforce stop` counts the time over in total
/// and stops the container within 20 s of its first episode; the simulator shows its memory
/// gone. (node/agent/tests has the same with runc, with the total time over measured.)
pub fn a_grace_bounds_the_total_time_over(engine: &dyn Engine) {
    let _turn = super::agent_turn();
    let sim = Sim::new(&["--memory", "8GiB"]);
    let agent = super::NodeAgent::start_with(&sim, &["--enforce", "stop", "--grace", "2"]);
    let mut c = spawn(
        engine,
        &sim,
        "pulse",
        &["CUSLICE_MEMORY_LIMIT=1GiB"],
        "while true; do cuda-workload --route bypass hold --bytes 2000MiB --secs 1.8; \
         sleep 1.2; done",
    );
    within(c.as_mut(), "holding", 60)
        .unwrap_or_else(|| panic!("the workload did not hold its memory: {}", c.stderr()));
    let t0 = Instant::now();
    let init = c.host_pid();
    let stopped = loop {
        if !Path::new(&format!("/proc/{init}")).exists() {
            break Some(t0.elapsed());
        }
        if t0.elapsed() > Duration::from_secs(40) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = agent.log();
    // The memory is the driver's again soon after.
    let t1 = Instant::now();
    let mut held = u64::MAX;
    while t1.elapsed() < Duration::from_secs(10) {
        held = sim.device(0)["used"].as_u64().unwrap_or(u64::MAX);
        if held == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    c.remove();
    let stopped = stopped.unwrap_or_else(|| {
        panic!("a container over its cap 1.8 s at a time was not stopped in 40 s; agent: {log}")
    });
    assert!(
        stopped <= Duration::from_secs(20),
        "stopped {stopped:?} after its first episode over its cap; agent: {log}"
    );
    assert_eq!(held, 0, "the simulator still counts {held} bytes held");
}

/// A tenant writes 96 MiB past the end of every file it can write, then reserves 96 MiB past
/// each with `fallocate` keeping the size. Its ledger, claims and turns are in a tmpfs of its own
/// (3 MiB), which refuses all six ("No space left on device"); three containers started beside
/// it start, read their config and exit 0.
pub fn a_tenant_filling_its_state_fills_only_its_own(engine: &dyn Engine) {
    let sim = Sim::new(&["--memory", "8GiB"]);
    let mut tenant = spawn(
        engine,
        &sim,
        "fillstate",
        &["CUSLICE_MEMORY_LIMIT=1GiB"],
        "exec cuda-workload tamper --grow-mib 96 --fallocate-mib 96 --secs 60",
    );
    let (tried, _) = within(tenant.as_mut(), "ready", 60)
        .unwrap_or_else(|| panic!("the tenant did not get ready: {}", tenant.stderr()));
    let files: Vec<&Value> = tried
        .iter()
        .filter(|v| v["what"] == "grow" || v["what"] == "fallocate")
        .collect();
    let others: Vec<Output> = (0..3)
        .map(|i| {
            engine.run(
                &sim,
                &Spec {
                    name: &name(&format!("beside-fill-{i}")),
                    env: &["CUSLICE_MEMORY_LIMIT=1GiB"],
                    cmd: &["cat", "/run/cuslice/slice/config"],
                    read_only: false,
                },
            )
        })
        .collect();
    tenant.remove();
    let mut tries: Vec<(&str, &str)> = files
        .iter()
        .filter_map(|v| {
            let file = v["path"].as_str()?.rsplit('/').next()?;
            Some((file, v["what"].as_str()?))
        })
        .collect();
    tries.sort();
    assert_eq!(
        tries,
        [
            ("claims", "fallocate"),
            ("claims", "grow"),
            ("ledger", "fallocate"),
            ("ledger", "grow"),
            ("turns", "fallocate"),
            ("turns", "grow"),
        ],
        "{tried:?}"
    );
    for v in &files {
        assert!(
            v["ok"] == false
                && v["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("No space left on device")),
            "{v}"
        );
    }
    for (i, out) in others.iter().enumerate() {
        assert!(
            out.status.success()
                && String::from_utf8_lossy(&out.stdout).contains("CUSLICE_MEMORY_LIMIT=1GiB"),
            "container {i} beside the filled state: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A tenant allowed 776 MiB of spill past a 1 GiB cap keeps its ledger's spill bound at 1 TiB
/// and the spilled count at 0 (rewriting both every millisecond) while another of its processes
/// allocates 256 MiB chunks up to 2 GiB. That process still stops within the cap and the spill:
/// it spills by its own count, against its own configuration, not the ledger's words.
pub fn rewritten_spill_words_spill_no_further(engine: &dyn Engine) {
    const MIB: u64 = 1 << 20;
    let sim = Sim::new(&["--memory", "8GiB"]);
    let mut c = spawn(
        engine,
        &sim,
        "spillwords",
        &["CUSLICE_MEMORY_LIMIT=1GiB", "CUSLICE_MEMORY_SPILL=776MiB"],
        "cuda-workload tamper --spill-words-mib 776 --secs 60 & \
         sleep 2; exec cuda-workload fill --family mem --chunk 256MiB --max-count 8 --hold 1",
    );
    let (tried, _) = within(c.as_mut(), "ready", 60)
        .unwrap_or_else(|| panic!("the tenant did not get ready: {}", c.stderr()));
    assert!(
        tried
            .iter()
            .any(|v| v["what"] == "spill-words" && v["ok"] == true),
        "{tried:?}"
    );
    let (_, refused) = within(c.as_mut(), "refused", 60)
        .unwrap_or_else(|| panic!("the filler did not finish: {}", c.stderr()));
    c.remove();
    let allocated = refused["allocated"].as_u64().unwrap();
    eprintln!("beside the rewritten spill words: {refused}");
    // The device holds at most the cap (contexts included), host memory at most the spill.
    assert_eq!(
        refused["code"], 2,
        "not stopped at cap and spill: {refused}"
    );
    assert!(allocated <= 1024 * MIB + 776 * MIB, "{refused}");
    // It did spill: three chunks at least (768 MiB) beyond what the device held.
    assert!(allocated >= 768 * MIB, "{refused}");
}

/// The scenarios as `#[test]`s of an engine's test binary.
#[macro_export]
macro_rules! hostile_scenarios {
    ($engine:expr) => {
        #[test]
        fn hostile_two_containers_share_nothing_writable() {
            $crate::root_required();
            $crate::hostile::nothing_shared_is_writable($engine);
        }
        #[test]
        fn hostile_forged_claims_take_nothing_from_a_neighbour() {
            $crate::root_required();
            ::cuslice_test_harness::twice(|| $crate::hostile::forged_claims_take_nothing($engine));
        }
        #[test]
        fn hostile_preload_dropped_by_ld_audit_is_stopped_by_the_agent() {
            $crate::root_required();
            $crate::hostile::preload_dropped_is_stopped_by_the_agent($engine);
        }
        #[test]
        fn hostile_preload_hidden_by_a_user_namespace_is_stopped_by_the_agent() {
            $crate::root_required();
            $crate::hostile::preload_hidden_by_a_user_namespace_is_stopped_by_the_agent($engine);
        }
        #[test]
        fn hostile_forged_claims_beside_busy_neighbours_take_nothing() {
            $crate::root_required();
            ::cuslice_test_harness::twice(|| {
                $crate::hostile::forged_claims_beside_busy_neighbours($engine)
            });
        }
        #[test]
        fn hostile_forged_time_in_flight_lowers_no_neighbours_cost() {
            $crate::root_required();
            ::cuslice_test_harness::twice(|| {
                $crate::hostile::forged_time_in_flight_beside_long_kernels($engine)
            });
        }
        #[test]
        fn hostile_a_claim_posted_five_times_counts_once() {
            $crate::root_required();
            $crate::hostile::duplicate_claims_count_once($engine);
        }
        #[test]
        fn hostile_rewritten_spill_words_spill_no_further() {
            $crate::root_required();
            $crate::hostile::rewritten_spill_words_spill_no_further($engine);
        }
        #[test]
        fn hostile_replaced_or_locked_state_hangs_nobody() {
            $crate::root_required();
            $crate::hostile::replaced_state_hangs_nobody($engine);
        }
    };
}
