//! Multi-GPU, multi-process jobs as tensor-parallel frameworks run them: one process (rank) per
//! device, all in one slice, each exporting memory that the next rank opens (CUDA IPC, or a VMM
//! handle exported as a POSIX file descriptor, as NCCL's transports do), the peer queries they
//! make, and copies between devices (cuMemcpyPeer[Async]). Ground truth is the simulator's count
//! of what each process holds on each device, and the bytes read back.

mod common;
use common::*;

use std::io::Write;
use std::time::Duration;

use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);
const SHARED: u64 = 512 * MIB;

/// What each process holds on device `dev`, by kind ("mem", "vmm", "context", ...), by pid.
fn held_by_kind(sim: &Sim, dev: usize, pid: &Value) -> Value {
    sim.device(dev)["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == *pid)
        .map(|p| p["by_kind"].clone())
        .unwrap_or_else(|| panic!("pid {pid} holds nothing on device {dev}"))
}

/// `n` ranks, rank i on device i, export `SHARED` bytes `via` (`ipc`, `fd`, or `fd-host`: a
/// host-located VMM handle, as NCCL's shared-memory buffers with cuMem on); rank i then opens
/// what rank i + 1 exported, on that rank's device. With `slice`, every process runs in it (libcuslice
/// preloaded); without, directly on the simulator. Returns the running ranks (exporters, then
/// importers) and their `exported` / `imported` lines.
fn ranks(
    sim: &Sim,
    slice: Option<&Slice>,
    n: usize,
    via: &str,
) -> (Vec<Running>, Vec<Value>, Vec<Value>) {
    let spawn = |args: &[&str]| match slice {
        Some(s) => s.spawn(sim, args),
        None => sim.spawn(args),
    };
    let bytes = format!("{}MiB", SHARED / MIB);
    let mut running = Vec::new();
    let mut exported = Vec::new();
    for i in 0..n {
        let dev = i.to_string();
        let how: &[&str] = match via {
            "fd-host" => &["--via", "fd", "--location", "host"],
            _ => &["--via", via],
        };
        let args = [&["--device", &dev, "export"][..], how, &["--bytes", &bytes]].concat();
        let mut r = spawn(&args);
        exported.push(r.wait_for("exported", WAIT));
        running.push(r);
    }
    let mut imported = Vec::new();
    for i in 0..n {
        let j = (i + 1) % n;
        let (dev, from) = (j.to_string(), exported[j].to_string());
        let mut r = spawn(&["--device", &dev, "import", "--from", &from]);
        let line = r.wait_for("imported", WAIT);
        assert_eq!(
            line["pattern_ok"], true,
            "rank {i} read another pattern: {line}"
        );
        assert_eq!(line["uuid"], exported[j]["uuid"], "{line}");
        imported.push(line);
        running.push(r);
    }
    (running, exported, imported)
}

fn release_all(running: Vec<Running>) {
    for r in running {
        let err = r.err.text();
        assert_eq!(r.release(), 0, "a rank failed: {err}");
    }
}

/// Each rank's shared memory is held once, by its exporter, on its device (host-located memory
/// on none); the importer holds its context only.
fn charged_once(sim: &Sim, n: usize, via: &str, exported: &[Value], imported: &[Value]) {
    let (kind, held) = match via {
        "ipc" => ("mem", SHARED),
        "fd" => ("vmm", SHARED),
        _ => ("vmm", 0),
    };
    for j in 0..n {
        let by_exporter = held_by_kind(sim, j, &exported[j]["pid"]);
        assert_eq!(
            by_exporter[kind].as_u64().unwrap_or(0),
            held,
            "device {j}: {by_exporter}"
        );
        let importer = &imported[(j + n - 1) % n];
        let by_importer = held_by_kind(sim, j, &importer["pid"]);
        let extra: Vec<_> = by_importer
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k != "context")
            .collect();
        assert!(
            extra.is_empty(),
            "device {j}: the importer holds more than its context: {by_importer}"
        );
    }
}

/// A tensor-parallel job on fractions of `n` devices: the shared memory works, is charged once
/// (to the exporter), and each device's cap still holds to the byte-granule while the ranks hold
/// it: a further process of the slice fills each device to its own cap, no less (imported memory
/// is not charged twice) and no more.
fn job(n: usize, via: &str, env: &[(&str, &str)], caps: &[u64]) {
    let sim = Sim::new(&["--devices", &n.to_string(), "--memory", "8GiB"]);
    let slice = Slice::new(env);
    let (running, exported, imported) = ranks(&sim, Some(&slice), n, via);
    charged_once(&sim, n, via, &exported, &imported);
    for (dev, &cap) in caps.iter().enumerate() {
        let (lines, code, stderr) = slice.run(
            &sim,
            &[
                "--device",
                &dev.to_string(),
                "fill",
                "--family",
                "mem",
                "--chunk",
                "64MiB",
            ],
        );
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(
            event(&lines, "refused")["code"],
            2,
            "device {dev}: {lines:?}"
        );
        let peak = peak_used(&sim, dev);
        assert!(
            peak <= cap && cap - peak < 64 * MIB,
            "device {dev} ({via}, {n} ranks): peak {} MiB for a cap of {} MiB",
            peak / MIB,
            cap / MIB
        );
    }
    release_all(running);
}

#[test]
fn two_ranks_share_memory_by_ipc_under_one_cap_for_all_devices() {
    job(2, "ipc", &[("CUSLICE_MEMORY_LIMIT", "2GiB")], &[2 * GIB; 2]);
}

#[test]
fn two_ranks_share_memory_by_exported_fds_under_per_device_caps() {
    job(
        2,
        "fd",
        &[
            ("CUSLICE_MEMORY_LIMIT_0", "1536MiB"),
            ("CUSLICE_MEMORY_LIMIT_1", "3GiB"),
        ],
        &[1536 * MIB, 3 * GIB],
    );
}

#[test]
fn four_ranks_share_memory_by_ipc_and_by_exported_fds() {
    job(4, "ipc", &[("CUSLICE_MEMORY_LIMIT", "2GiB")], &[2 * GIB; 4]);
    job(
        4,
        "fd",
        &[
            ("CUSLICE_MEMORY_LIMIT", "2GiB"),
            ("CUSLICE_MEMORY_LIMIT_3", "3GiB"),
        ],
        &[2 * GIB, 2 * GIB, 2 * GIB, 3 * GIB],
    );
}

/// Host-located VMM memory (NCCL's shared-memory buffers with cuMem on) shared by file
/// descriptors: every rank reads and writes what the next one made, it is charged on no device,
/// and a further process still fills each device to its cap.
#[test]
fn host_located_memory_shared_by_fds_is_charged_nowhere() {
    job(2, "fd-host", &[("CUSLICE_MEMORY_LIMIT", "1GiB")], &[GIB; 2]);
}

/// The same job without cuslice: the scenario itself runs on the simulator, and charges alike.
#[test]
fn the_same_ranks_without_cuslice() {
    for (n, via) in [(2, "ipc"), (4, "fd"), (2, "fd-host")] {
        let sim = Sim::new(&["--devices", &n.to_string(), "--memory", "8GiB"]);
        let (running, exported, imported) = ranks(&sim, None, n, via);
        charged_once(&sim, n, via, &exported, &imported);
        release_all(running);
    }
}

/// What the driver says of peers (can access, the P2P attributes, enabling access) and of
/// multicast objects is what a process under cuslice is told, and peer copies from each device to
/// each other arrive whole under it as without: cuslice hides no peer, no link and no multicast
/// support, adds none, and passes cuMemcpyPeer[Async] through. On PCIe cards without peer access and on an NVLink board
/// (`simgpu init --nvlink`), where every pair reaches the other and access is enabled; neither
/// has NVSwitch multicast (attribute 0, `cuMulticastCreate` not supported), which NCCL then
/// does without.
#[test]
fn peer_queries_pass_through_untouched() {
    for nvlink in [false, true] {
        for n in [2, 4] {
            let count = n.to_string();
            let mut args = vec!["--devices", &count, "--memory", "8GiB"];
            if nvlink {
                args.push("--nvlink");
            }
            let sim = Sim::new(&args);
            let (plain, code) = sim.workload(&["peers"]);
            assert_eq!(code, 0);
            let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
            let (capped, code, stderr) = slice.run(&sim, &["peers"]);
            assert_eq!(code, 0, "{stderr}");
            let (a, b) = (event(&plain, "peers"), event(&capped, "peers"));
            assert_eq!(u(&a["devices"]), n as u64);
            let pairs = a["pairs"].as_array().unwrap();
            assert_eq!(pairs.len(), n * (n - 1));
            for p in pairs {
                let (can, enable) = if nvlink {
                    (1, "CUDA_SUCCESS")
                } else {
                    (0, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED")
                };
                assert_eq!(p["can_access"], can, "the driver, nvlink {nvlink}: {p}");
                assert_eq!(p["enable"], enable, "the driver, nvlink {nvlink}: {p}");
            }
            assert_eq!(a["multicast_create"], "CUDA_ERROR_NOT_SUPPORTED", "{a}");
            assert_eq!(
                a["multicast_supported"],
                serde_json::json!(vec![0; n]),
                "{a}"
            );
            let copies = a["copies"].as_array().unwrap();
            assert_eq!(copies.len(), n * (n - 1), "{a}");
            for c in copies {
                for k in ["sync_ok", "async_ok"] {
                    assert_eq!(c[k], true, "the driver, nvlink {nvlink}: {c}");
                }
            }
            for k in ["pairs", "copies", "multicast_supported", "multicast_create"] {
                assert_eq!(a[k], b[k], "{k}, {n} devices, nvlink {nvlink}");
            }
        }
    }
}

/// A copy from each device to each other (cuMemcpyPeer, then cuMemcpyPeerAsync on a stream and
/// its synchronisation) moves bytes and nothing else: with and without cuslice, reached by dlsym
/// and by cuGetProcAddress, on PCIe cards
/// (no peer access; the driver stages the copy) and on an NVLink board, every pattern arrives
/// whole, and what the process holds on each device by the simulator's count (each device's n - 1
/// sources and n - 1 destinations, and its context) is the same after the copies as before.
#[test]
fn peer_copies_arrive_whole_and_charge_neither_device() {
    const N: usize = 3;
    const BYTES: u64 = 8 * MIB;
    for nvlink in [false, true] {
        let mut args = vec!["--devices", "3", "--memory", "8GiB"];
        if nvlink {
            args.push("--nvlink");
        }
        let sim = Sim::new(&args);
        let slice = Slice::new(&[("CUSLICE_MEMORY_LIMIT", "1GiB")]);
        // By dlsym of the versioned names, and by cuGetProcAddress_v2 asking for the per-thread
        // default-stream variants (cuMemcpyPeer_ptds, cuMemcpyPeerAsync_ptsz).
        let routes: [&[&str]; 2] = [&[], &["--route", "proc-v2", "--ptds"]];
        for (under, route) in [None, Some(&slice)]
            .into_iter()
            .flat_map(|under| routes.map(|route| (under, route)))
        {
            let what = format!(
                "nvlink {nvlink}, cuslice {}, route {route:?}",
                under.is_some()
            );
            let mut cmd = route.to_vec();
            cmd.extend(["peers", "--hold", "--copy-bytes", "8MiB"]);
            let mut r = match under {
                Some(s) => s.spawn(&sim, &cmd),
                None => sim.spawn(&cmd),
            };
            let ready = r.wait_for("peer_buffers", WAIT);
            assert_eq!(u(&ready["copies"]), (N * (N - 1)) as u64, "{what}: {ready}");
            let pid = ready["pid"].clone();
            let held = || -> Vec<Value> { (0..N).map(|d| held_by_kind(&sim, d, &pid)).collect() };
            let before = held();
            for (dev, by_kind) in before.iter().enumerate() {
                assert_eq!(
                    u(&by_kind["mem"]),
                    2 * (N as u64 - 1) * BYTES,
                    "{what}, device {dev}: {by_kind}"
                );
            }
            writeln!(r.child.stdin.as_mut().unwrap()).unwrap();
            let line = r.wait_for("peers", WAIT);
            assert_eq!(
                held(),
                before,
                "{what}: the copies changed what the process holds"
            );
            let copies = line["copies"].as_array().unwrap();
            assert_eq!(copies.len(), N * (N - 1), "{what}: {line}");
            for c in copies {
                assert_eq!(u(&c["bytes"]), BYTES, "{what}: {c}");
                for (call, ok) in [("sync", "sync_ok"), ("async", "async_ok")] {
                    assert_eq!(c[call], "CUDA_SUCCESS", "{what}: {c}");
                    assert_eq!(c[ok], true, "{what}: {c}");
                }
            }
            let err = r.err.text();
            assert_eq!(r.release(), 0, "{what}: {err}");
        }
    }
}
