//! NCCL (the nvidia-nccl wheel PyTorch 2.15 ships, 2.30.7) on simgpu with NVIDIA's own libcudart
//! inside, as tensor-parallel jobs drive it: one process per rank, rank r on device r, a
//! communicator made with ncclCommInitRank and all-reduces, through `torch.distributed`
//! (`tests/frameworks/nccl_check.py`). Judged by the simulator's count: what each rank holds, on
//! which device, and the device time its kernels took, with and without cuslice.
//!
//! NCCL runs with cuMem on, its default: its device buffers are device-located cuMemCreate
//! handles, and its shared-memory transport makes host-located cuMemCreate buffers, maps them for
//! the device and the CPU, and passes them to the other ranks as file descriptors
//! (cuMemExportToShareableHandle / cuMemImportFromShareableHandle), which simgpu backs with host
//! memory the processes share (docs/simgpu.md, VMM). The first test also runs every job with
//! `NCCL_CUMEM_ENABLE=0` (device buffers from cudaMalloc, shared memory in /dev/shm registered
//! with cuMemHostRegister). Which way NCCL went is judged by the simulator's count too: with cuMem
//! on, each rank holds VMM memory on its own device, with it off none. Kernels are timed, never
//! run, so no test reads a reduced value.
//!
//! Without the environment the tests print one skip line and pass, except under `CI`, where they
//! fail naming `tests/frameworks/install`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use cuslice_client_tests::{Slice, command, framework_python_or_skip};
use cuslice_test_harness::*;
use serde_json::Value;

/// A rank that has not finished by then is stuck: it is killed, and the test says so.
const BOUND_SECS: u64 = 120;
const CAP: u64 = 4 * GIB;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../frameworks/nccl_check.py")
}

/// A free TCP port on the loopback for the ranks' rendezvous, below the kernel's ephemeral range
/// (`ip_local_port_range`, 32768 and up by default): a port the kernel hands out for outgoing
/// connections (the ranks' own, or the other test's running beside) could be taken between this
/// check and rank 0's listen, which then fails with EADDRINUSE (it did once on the 2-core
/// machine). Each call in this process takes the next candidate.
fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let (low, span) = (10_000, ephemeral.saturating_sub(10_000).max(1));
    let first = std::process::id() % span;
    for _ in 0..span.min(1_000) {
        let port = low + (first + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        if let Ok(port) = u16::try_from(port)
            && TcpListener::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 from {low} to {ephemeral}")
}

/// `cmd` under `timeout`, so that a rank that hangs is killed after `BOUND_SECS`.
fn bounded(cmd: &Command) -> Command {
    under(&["timeout", "--kill-after=5", &BOUND_SECS.to_string()], cmd)
}

/// NCCL_CUMEM_ENABLE for a job: unset (NCCL's default, on) or 0.
#[derive(Clone, Copy, Debug, PartialEq)]
enum CuMem {
    Default,
    Off,
}

impl CuMem {
    fn apply(self, c: &mut Command) {
        match self {
            CuMem::Default => c.env_remove("NCCL_CUMEM_ENABLE"),
            CuMem::Off => c.env("NCCL_CUMEM_ENABLE", "0"),
        };
    }
}

/// Lets every rank go at once (closes each one's stdin), then waits for each to end, as a job's
/// ranks end together: with cuMem on, a rank's ncclCommDestroy (in `destroy_process_group`)
/// returns only once the other ranks have closed their connections to its proxy thread, which
/// served them its shared buffers (NCCL's `ncclProxyService` runs while peers are connected), so
/// a rank let go alone waits for the others.
fn release_together(mut ranks: Vec<Running>) {
    for r in &mut ranks {
        drop(r.child.stdin.take());
    }
    for r in ranks {
        let err = r.err.text();
        assert_eq!(
            r.release(),
            0,
            "a rank failed (or was stopped after {BOUND_SECS} s): {err}"
        );
    }
}

/// What one rank did: the bytes it held on each device once it had all-reduced (by the
/// simulator's count), the device time its work took on its own device, and how long
/// ncclCommInitRank took (by the rank's clock).
#[derive(Debug)]
struct Rank {
    held: Vec<u64>,
    device_time_ns: u64,
    init_secs: f64,
}

/// `n` ranks on `n` simulated devices, in `slice` or outside any, with `cumem`. Checks that no
/// rank holds anything but a context on another rank's device (what NCCL allocates lands on the
/// rank's own device), and that a rank holds VMM memory on its own device exactly when cuMem
/// is on; returns what each held where.
fn job(python: &Path, n: usize, slice: Option<&Slice>, cumem: CuMem, board: Board) -> Vec<Rank> {
    let n_arg = n.to_string();
    let mut args = vec!["--devices", &n_arg, "--memory", "8GiB"];
    if board == Board::NvLink {
        args.push("--nvlink");
    }
    let sim = Sim::new(&args);
    let port = free_port().to_string();
    let mut ranks: Vec<Running> = (0..n)
        .map(|r| {
            let script = script().display().to_string();
            let (rank, world) = (r.to_string(), n.to_string());
            let mut c = command(&sim, python, slice, &[&script, &rank, &world, &port]);
            cumem.apply(&mut c);
            Running::start(bounded(&c))
        })
        .collect();
    let timeout = Duration::from_secs(BOUND_SECS);
    let (initialised, reduced): (Vec<Value>, Vec<Value>) = ranks
        .iter_mut()
        .map(|r| {
            let init = r.wait_for("initialised", timeout);
            (init, r.wait_for("reduced", timeout))
        })
        .unzip();
    let show = sim.show();
    let mut out = Vec::new();
    for (r, line) in reduced.iter().enumerate() {
        let mut rank = Rank {
            held: vec![0; n],
            device_time_ns: 0,
            init_secs: initialised[r]["secs"].as_f64().unwrap_or(f64::NAN),
        };
        for d in 0..n {
            let procs = show["devices"][d]["processes"].as_array().unwrap();
            let Some(p) = procs.iter().find(|p| p["pid"] == line["pid"]) else {
                continue;
            };
            rank.held[d] = u(&p["held"]);
            if d == r {
                rank.device_time_ns = u(&p["device_time_ns"]);
                assert_eq!(
                    p["by_kind"].get("vmm").is_some(),
                    cumem == CuMem::Default,
                    "rank {r} with cuMem {cumem:?}: {p}"
                );
            } else {
                let kinds: Vec<&String> = p["by_kind"].as_object().unwrap().keys().collect();
                assert!(
                    kinds.iter().all(|k| *k == "context"),
                    "rank {r} holds more than a context on device {d}: {p}"
                );
            }
        }
        out.push(rank);
    }
    if let Some(slice) = slice {
        charged_once(&sim, slice, &show, n);
    }
    release_together(ranks);
    out
}

/// What the slice's ledger charges on each device (`cuslice status`) is what its ranks hold
/// there by the simulator's count: NCCL's memory charged once, on the device it is on (a peer's
/// buffer a rank maps is its owner's), and the host memory the ranks share charged nowhere.
fn charged_once(sim: &Sim, slice: &Slice, show: &Value, n: usize) {
    let view = json_of(
        sim.command(
            &bin_dir().join("cuslice"),
            &["status", "--json", "--state-dir"],
        )
        .arg(slice.dir.path()),
    );
    for d in 0..n {
        let dev = &show["devices"][d];
        let held: u64 = dev["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| u(&p["held"]))
            .sum();
        let charged = view["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["uuid"] == dev["uuid"])
            .map_or(0, |v| u(&v["slices"][0]["memory"]["used"]));
        assert_eq!(
            charged, held,
            "{n} ranks: device {d}: the slice is charged {charged}, its ranks hold {held} by the \
             simulator's count: {view}"
        );
    }
}

/// How the simulated devices reach each other: PCIe cards without peer access (NCCL's
/// shared-memory transport between ranks), or an NVLink board with peer access (its P2P
/// transport: each rank maps its peers' buffers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Board {
    Pcie,
    NvLink,
}

/// ncclCommInitRank and all-reduces across 2 and then 4 processes on as many devices, on PCIe
/// cards and on an NVLink board, with cuMem on (NCCL's default) and off: with libcuslice and a cap on every device, each rank holds
/// on every device exactly what it holds without cuslice (on its own device its memory, within
/// the cap; elsewhere at most a context; the host memory NCCL shares with cuMem on nowhere), and
/// its kernels take device time.
#[test]
fn nccl_initialises_and_all_reduces_under_caps_as_without_cuslice() {
    let Some(python) = framework_python_or_skip("cu13", "torch") else {
        return;
    };
    // Its jobs of up to four ranks take both of CI's cores: not beside the test that measures
    // what the host drives (below), which got a tenth of its limit when they ran at once.
    let _turn = serial();
    for (board, cumem) in [
        (Board::Pcie, CuMem::Default),
        (Board::Pcie, CuMem::Off),
        (Board::NvLink, CuMem::Default),
        (Board::NvLink, CuMem::Off),
    ] {
        for n in [2, 4] {
            let plain = job(&python, n, None, cumem, board);
            let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "4GiB")]);
            let capped = job(&python, n, Some(&slice), cumem, board);
            for (r, (a, b)) in plain.iter().zip(&capped).enumerate() {
                assert_eq!(
                    a.held, b.held,
                    "{board:?}, {n} ranks, cuMem {cumem:?}, rank {r}: {a:?} without cuslice, {b:?} with"
                );
                assert!(
                    b.held[r] > 0 && b.held[r] <= CAP,
                    "{board:?}, {n} ranks, cuMem {cumem:?}, rank {r}: {b:?}"
                );
                assert!(
                    b.device_time_ns > 0,
                    "{board:?}, {n} ranks, cuMem {cumem:?}, rank {r}: {b:?}"
                );
            }
            let init: Vec<f64> = plain.iter().chain(&capped).map(|r| r.init_secs).collect();
            let (fastest, slowest) = init
                .iter()
                .fold((f64::MAX, 0f64), |(a, b), s| (a.min(*s), b.max(*s)));
            eprintln!(
                "{board:?}, {n} ranks, cuMem {cumem:?}: ncclCommInitRank {fastest:.2} to {slowest:.2} s; \
                 without cuslice {plain:?}; with {capped:?}"
            );
        }
    }
}

/// `n` ranks in `slice` (or outside any) all-reducing back to back for a while: each rank's share
/// of its own device's time over a 4 s window after they settled, by the simulator's count.
fn spin_shares(python: &Path, n: usize, slice: Option<&Slice>) -> Vec<f64> {
    let sim = Sim::new(&["--devices", &n.to_string(), "--memory", "8GiB"]);
    let port = free_port().to_string();
    let (settle, window) = (Duration::from_secs(2), Duration::from_secs(4));
    let secs = (settle + window + Duration::from_secs(2))
        .as_secs()
        .to_string();
    let mut ranks: Vec<Running> = (0..n)
        .map(|r| {
            let script = script().display().to_string();
            let (rank, world) = (r.to_string(), n.to_string());
            let mut c = command(&sim, python, slice, &[&script, &rank, &world, &port, &secs]);
            CuMem::Default.apply(&mut c);
            Running::start(bounded(&c))
        })
        .collect();
    let timeout = Duration::from_secs(BOUND_SECS);
    let pids: Vec<Value> = ranks
        .iter_mut()
        .map(|r| r.wait_for("reduced", timeout)["pid"].clone())
        .collect();
    std::thread::sleep(settle);
    let busy = |sim: &Sim| -> Vec<u64> {
        let show = sim.show();
        pids.iter()
            .enumerate()
            .map(|(d, pid)| {
                show["devices"][d]["processes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|p| p["pid"] == *pid)
                    .map_or(0, |p| u(&p["device_time_ns"]))
            })
            .collect()
    };
    let (t0, before) = (std::time::Instant::now(), busy(&sim));
    std::thread::sleep(window);
    let (after, wall) = (busy(&sim), t0.elapsed().as_nanos() as f64);
    for r in ranks.iter_mut() {
        let spun = r.wait_for("spun", timeout);
        assert!(u(&spun["all_reduces"]) > 0, "{spun}");
    }
    release_together(ranks);
    before
        .iter()
        .zip(&after)
        .map(|(b, a)| 100.0 * (a - b) as f64 / wall)
        .collect()
}

/// All-reduces are metered by core limits like any kernel. Two ranks all-reducing back to back
/// (cuMem on) keep their devices only partly busy on simgpu, as busy as the host lets them be
/// (the host side, NCCL's proxy and the ranks' synchronisation, bounds them): 9 to 39% on CI's
/// two-core machine, 2.8 to 3.5% on one about half as fast. So the limit is set from what this
/// host drives first: half the less busy device's share without cuslice, from 1 to 5%. Limited
/// so, each rank's kernels take at most the limit (within 30% of it, plus half a point) of its
/// device by the simulator's count, which is below what the same ranks take free, and more than
/// nothing (they still run). Far less than the limit, too: 0.4 to 1.0% for a limit of 5 while
/// the other tests loaded the host, as each rank's turns on its device are not aligned with its
/// peer's (docs/compute.md, "Multi-GPU jobs").
#[test]
fn all_reduces_in_a_slice_take_at_most_its_core_limit_of_each_device() {
    let Some(python) = framework_python_or_skip("cu13", "torch") else {
        return;
    };
    let _turn = serial();
    let free = spin_shares(&python, 2, None);
    let least = free.iter().copied().fold(f64::MAX, f64::min);
    assert!(
        least >= 2.0,
        "without cuslice the ranks kept their devices only {free:.1?}% busy: this host drives \
         them too little for a core limit below that to be told apart from none"
    );
    let limit = (least / 2.0).floor().clamp(1.0, 5.0);
    let bound = limit * 1.3 + 0.5;
    let slice = Slice::new(&[("CUSLICE_CORE_LIMIT", &format!("{limit}"))]);
    let limited = spin_shares(&python, 2, Some(&slice));
    eprintln!(
        "all-reduce device shares: without cuslice {free:.1?}, limited to {limit} {limited:.1?} \
         (at most {bound:.1})"
    );
    assert!(bound < least, "{bound} {least}");
    assert!(
        limited.iter().all(|s| *s <= bound && *s > 0.0),
        "limited to {limit}: {limited:.1?} (without cuslice {free:.1?})"
    );
}
