//! The CDI specs the plugin writes, consumed by real container engines on simgpu: Podman 4.3
//! resolves `--device gpu.cuslice.io/claim=...` itself; containerd 1.6 has no CDI, so
//! cuslice-runtime applies the devices. Claims are prepared through the kubelet's API on the
//! plugin's socket, from claims the test API server returns; each container then gets only what
//! the plugin's spec gives it (device nodes, the driver's libraries, the settings, the hook).
//! Ground truth: the simulator (what each container's process held; device time per process).
//! Needs root, podman, containerd, runc and busybox (`tests/tools/ensure-tools`), and the release
//! build.

mod common;

use std::time::Duration;

use common::*;
use cuslice_test_engines as engines;
use cuslice_test_harness::{GIB, bin_dir};
use engines::cdi::{CdiEngine, Claim, held_to_claims};
use engines::{Container, Spec, root_required};
use serde_json::Value;

/// The plugin on a node of one simulated 8 GiB GPU, writing specs where `engine` reads them,
/// naming this build's hook and library.
fn node_for(engine: &dyn CdiEngine) -> (Node, PluginProcess) {
    node_of(engine, 1)
}

/// The same, on a node of `gpus` simulated 8 GiB GPUs.
fn node_of(engine: &dyn CdiEngine, gpus: u32) -> (Node, PluginProcess) {
    node_with(engine, gpus, &[])
}

/// The same, the plugin given `extra` options too.
fn node_with(engine: &dyn CdiEngine, gpus: u32, extra: &[&str]) -> (Node, PluginProcess) {
    let node = Node::with_cdi_dir(gpus, "8GiB", Some(engine.spec_dir()));
    let hook = bin_dir().join("cuslice-hook");
    let library = bin_dir().join("libcuslice.so");
    let mut args = vec![
        "--hook",
        hook.to_str().unwrap(),
        "--library",
        library.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let plugin = node.start_plugin(&args);
    (node, plugin)
}

/// Unprepares the claims when dropped (their specs are in a shared directory).
struct Prepared<'a> {
    node: &'a Node,
    claims: Vec<Value>,
}

impl Drop for Prepared<'_> {
    fn drop(&mut self) {
        let all = self.claims.iter().map(claim_of).collect();
        let r = unprepare(&self.node.dra_socket(), all);
        for c in &self.claims {
            let uid = c["metadata"]["uid"].as_str().unwrap();
            if !std::thread::panicking() {
                assert_eq!(r.claims[uid].error, "", "unprepare {uid}");
            }
            let spec = self
                .node
                .cdi_dir()
                .join(format!("gpu.cuslice.io-{uid}.json"));
            assert!(
                !spec.exists() || std::thread::panicking(),
                "{} left",
                spec.display()
            );
        }
    }
}

/// Claims on gpu-0 of `memory`, `cores` and core limit (None: none), prepared by the plugin: each
/// becomes a Claim the engine tests take (its uid and the CDI id the plugin answered).
fn prepare_claims<'a>(
    node: &'a Node,
    wanted: &[(&str, &str, Option<u32>)],
) -> (Prepared<'a>, Vec<Claim>) {
    let mut objects = Vec::new();
    for (i, (memory, cores, limit)) in wanted.iter().enumerate() {
        let uid = format!("{:08x}-0000-4000-8000-{:012x}", std::process::id(), i + 1);
        let c = claim(
            &engines::name("claim"),
            &uid,
            "gpu-0",
            memory,
            cores,
            limit.map(slice_config),
        );
        node.api.put_claim(&c);
        objects.push(c);
    }
    let r = prepare(&node.dra_socket(), objects.iter().map(claim_of).collect());
    let claims = objects
        .iter()
        .map(|c| {
            let uid = c["metadata"]["uid"].as_str().unwrap().to_owned();
            let answer = &r.claims[&uid];
            assert_eq!(answer.error, "", "{uid}");
            Claim {
                id: answer.devices[0].cdi_device_ids[0].clone(),
                uid,
            }
        })
        .collect();
    (
        Prepared {
            node,
            claims: objects,
        },
        claims,
    )
}

fn caps_hold(engine: &dyn CdiEngine) {
    let (node, _plugin) = node_for(engine);
    let (_prepared, claims) =
        prepare_claims(&node, &[("1Gi", "30", Some(60)), ("2Gi", "40", None)]);
    held_to_claims(
        engine,
        &node.sim,
        &[
            (&claims[0], GIB, 30.0, 60.0),
            (&claims[1], 2 * GIB, 40.0, 40.0),
        ],
    );
}

/// 1 ms kernels back to back.
const KERNELS: &[&str] = &[
    "cuda-workload",
    "launch",
    "--ns-per-block",
    "1000",
    "--blocks",
    "1000",
    "--secs",
    "30",
];

/// Device time (ns) of host pid `pid`, from the simulator.
fn device_time(node: &Node, pid: i32) -> u64 {
    let d = node.sim.device(0);
    d["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["pid"] == pid)
        .and_then(|p| p["device_time_ns"].as_u64())
        .unwrap_or(0)
}

/// Two busy claims, 30 and 60 cores: over 6 s with both running, the simulator's device time
/// gives each its claim's share within 5 points, with the node agent running as on a node.
fn shares_hold(engine: &dyn CdiEngine) {
    let (node, _plugin) = node_for(engine);
    let (_prepared, claims) = prepare_claims(&node, &[("1Gi", "30", None), ("1Gi", "60", None)]);
    let _turn = engines::agent_turn();
    let _agent = engines::NodeAgent::start(&node.sim);
    let mut running: Vec<Box<dyn Container + '_>> = Vec::new();
    for c in &claims {
        let n = engines::name("share");
        let mut k = engine.spawn_with(
            &node.sim,
            &Spec {
                name: &n,
                env: &[],
                cmd: KERNELS,
                read_only: false,
            },
            &[c],
        );
        engines::wait_for(k.as_mut(), "start");
        running.push(k);
    }
    // Settle, then measure.
    std::thread::sleep(Duration::from_secs(2));
    let pids: Vec<i32> = running.iter().map(|c| c.host_pid()).collect();
    let before: Vec<u64> = pids.iter().map(|p| device_time(&node, *p)).collect();
    let t = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(6));
    let after: Vec<u64> = pids.iter().map(|p| device_time(&node, *p)).collect();
    let wall = t.elapsed().as_nanos() as f64;
    let shares: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| 100.0 * (a - b) as f64 / wall)
        .collect();
    for c in running {
        c.remove();
    }
    eprintln!("shares of GPU time by the simulator's count: {shares:.1?} (claims: 30, 60 cores)");
    for (share, want) in shares.iter().zip([30.0, 60.0]) {
        assert!(
            (share - want).abs() <= 5.0,
            "shares {shares:?}, claims 30 and 60 cores"
        );
    }
}

/// containerd 1.6 with a kubelet since 1.31: no CDI annotation reaches the container, only the
/// CRI's own annotations (namespace, pod, uid, container). The plugin's container index gives
/// the pod's `main` container the claim's device, and cuslice-runtime applies it: the
/// container sees its cap. The pod's `sidecar`, which does not name the claim, gets no GPU.
#[test]
fn containerd_16_gives_a_pods_container_its_claim_through_the_index() {
    root_required();
    let _one = cuslice_test_harness::serial();
    let engine = engines::containerd::engine();
    let mut node = Node::with_cdi_dir(1, "8GiB", Some(CdiEngine::spec_dir(engine)));
    node.index = Some(engine.container_index());
    let hook = bin_dir().join("cuslice-hook");
    let library = bin_dir().join("libcuslice.so");
    let _plugin = node.start_plugin(&[
        "--hook",
        hook.to_str().unwrap(),
        "--library",
        library.to_str().unwrap(),
    ]);
    // The recorded claim (the pod's, through its template), 1 GiB and 30 cores.
    let mut c = data("resourceclaim.json");
    c["metadata"]["uid"] = serde_json::json!(format!(
        "{:08x}-0000-4000-8000-00000000aaaa",
        std::process::id()
    ));
    c["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] =
        serde_json::json!({"memory": "1Gi", "cores": "30"});
    node.api.put_claim(&c);
    let prepared = Prepared {
        node: &node,
        claims: vec![c.clone()],
    };
    let r = prepare(&node.dra_socket(), vec![claim_of(&c)]);
    assert!(r.claims.values().all(|x| x.error.is_empty()), "{r:?}");
    let pod_uid = data("pod.json")["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = |container: &str| {
        let n = engines::name("indexed");
        let cri = [
            (cuslice_cdi::CRI_CONTAINER_TYPE, "container"),
            (cuslice_cdi::CRI_NAMESPACE, "default"),
            (cuslice_cdi::CRI_POD, "inference"),
            (cuslice_cdi::CRI_POD_UID, pod_uid.as_str()),
            (cuslice_cdi::CRI_CONTAINER, container),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        engine.run_with(
            &node.sim,
            &Spec {
                name: &n,
                env: &[],
                cmd: &[
                    "cuda-workload",
                    "fill",
                    "--family",
                    "mem",
                    "--chunk",
                    "64MiB",
                ],
                read_only: false,
            },
            &cri,
        )
    };
    let out = run("main");
    let lines = cuslice_test_harness::parse_lines(&String::from_utf8_lossy(&out.stdout));
    let start = cuslice_test_harness::event(&lines, "start");
    assert_eq!(start["total"], GIB, "{lines:?}");
    let exited = node.sim.device(0)["exited"].clone();
    let peak = exited
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["peak"].as_u64())
        .max()
        .unwrap();
    assert!(peak <= GIB, "peak {peak} over the 1 GiB cap: {exited}");
    let out = run("sidecar");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!said.contains("\"start\""), "the sidecar saw a GPU: {said}");
    drop(prepared);
    let left: Vec<_> = std::fs::read_dir(engine.container_index())
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "index entries left after unprepare: {left:?}"
    );
}

/// A tensor-parallel claim: two requests, 1 GiB and 30 cores of gpu-0 and 2 GiB and 40 cores of
/// gpu-1, prepared as one spec with a CDI device each. One container gets both; a process on
/// each of its GPUs fills it, the one on gpu-0 listing the two the other way round for itself
/// (`CUDA_VISIBLE_DEVICES=1,0`, so gpu-0 is its device 1, whose ordinal's cap is gpu-1's): by
/// the simulator's count each GPU held at most its own cap and nearly all of it, and `cuslice
/// status` shows the slice on each GPU with that GPU's cap, core request and limit.
fn a_claim_of_two_gpus_caps_each(engine: &dyn CdiEngine) {
    let (node, _plugin) = node_of(engine, 2);
    let uid = format!("{:08x}-0000-4000-8000-00000000002a", std::process::id());
    let mut c = claim(&engines::name("tp"), &uid, "gpu-0", "1Gi", "30", None);
    let request = |name: &str, memory: &str, cores: &str| {
        serde_json::json!({"name": name, "exactly": {"deviceClassName": "gpu.cuslice.io",
            "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"memory": memory, "cores": cores}}}})
    };
    c["spec"]["devices"]["requests"] =
        serde_json::json!([request("tp0", "1Gi", "30"), request("tp1", "2Gi", "40")]);
    let results = &mut c["status"]["allocation"]["devices"]["results"];
    let mut second = results[0].clone();
    results[0]["request"] = "tp0".into();
    second["request"] = "tp1".into();
    second["device"] = "gpu-1".into();
    second["consumedCapacity"] = serde_json::json!({"memory": "2Gi", "cores": "40"});
    results.as_array_mut().unwrap().push(second);
    node.api.put_claim(&c);
    let _prepared = Prepared {
        node: &node,
        claims: vec![c.clone()],
    };
    let r = prepare(&node.dra_socket(), vec![claim_of(&c)]);
    let answer = &r.claims[&uid];
    assert_eq!(answer.error, "");
    let ids: Vec<engines::cdi::Claim> = answer
        .devices
        .iter()
        .map(|d| engines::cdi::Claim {
            uid: uid.clone(),
            id: d.cdi_device_ids[0].clone(),
        })
        .collect();
    assert_eq!(ids.len(), 2, "{answer:?}");
    let n = engines::name("tp");
    let fill =
        |d: u32| format!("cuda-workload --device {d} fill --family mem --chunk 64MiB --hold 60");
    let script = format!("CUDA_VISIBLE_DEVICES=1,0 {} & exec {}", fill(1), fill(1));
    let mut k = engine.spawn_with(
        &node.sim,
        &Spec {
            name: &n,
            env: &[],
            cmd: &["sh", "-c", &script],
            read_only: false,
        },
        &ids.iter().collect::<Vec<_>>(),
    );
    engines::wait_for(k.as_mut(), "holding");
    engines::wait_for(k.as_mut(), "holding");
    let caps = [GIB, 2 * GIB];
    for (d, cap) in caps.iter().enumerate() {
        let dev = node.sim.device(d);
        let held: u64 = dev["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| p["held"].as_u64().unwrap())
            .sum();
        let peak = dev["peak_used"].as_u64().unwrap();
        assert!(
            peak <= *cap && held >= cap - 128 * cuslice_test_harness::MIB,
            "GPU {d}, cap {cap}: held {held}, peak {peak}: {dev}"
        );
    }
    let view = engines::status_json(&node.sim);
    for (d, (cap, (request, limit))) in caps.iter().zip([(30.0, 30.0), (40.0, 40.0)]).enumerate() {
        let slice = view["devices"][d]["slices"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["slice"] == k.id())
            .unwrap_or_else(|| panic!("GPU {d}: no slice {}: {view}", k.id()))
            .clone();
        assert_eq!(slice["memory"]["limit"], *cap, "GPU {d}: {slice}");
        assert_eq!(slice["compute"]["request_pct"], request, "GPU {d}: {slice}");
        assert_eq!(slice["compute"]["limit_pct"], limit, "GPU {d}: {slice}");
    }
    k.remove();
}

/// With `--memory-oversubscription 200`, two claims of 6 GiB on an 8 GiB GPU (12 GiB of caps),
/// each container a notebook keeping 5 GiB: both do not fit at once. The claims say nothing of
/// waiting or freezing; what the plugin gives claims on an oversubscribed GPU does it: the
/// second's allocation waits for room, the first, quiet, is frozen for it (by the simulator's
/// count), and each cell's read brings its container back, which waits for room in turn. No
/// refusal, no OOM, every read intact.
fn claims_past_the_gpu_take_turns(engine: &dyn CdiEngine) {
    let (node, _plugin) = node_with(engine, 1, &["--memory-oversubscription", "200"]);
    let (_prepared, claims) = prepare_claims(&node, &[("6Gi", "50", None), ("6Gi", "50", None)]);
    let cmd = [
        "cuda-workload",
        "keep",
        "--bytes",
        "5GiB",
        "--cells",
        "2",
        "--idle-secs",
        "4",
    ];
    let mut books: Vec<Box<dyn Container + '_>> = Vec::new();
    let mut frozen = false;
    for c in &claims {
        let n = engines::name("notebook");
        let mut k = engine.spawn_with(
            &node.sim,
            &Spec {
                name: &n,
                env: &["CUSLICE_LOG=info"],
                cmd: &cmd,
                read_only: false,
            },
            &[c],
        );
        engines::wait_for(k.as_mut(), "holding");
        frozen |= node.sim.show()["checkpoints"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["state"] == "checkpointed"));
        books.push(k);
    }
    assert!(
        frozen,
        "two 5 GiB holders on an 8 GiB GPU, and neither was frozen: {}",
        node.sim.show()
    );
    for k in books.iter_mut() {
        for cell in 0..2 {
            let v = engines::wait_for(k.as_mut(), "checked");
            assert_eq!(
                (v["cell"].as_u64(), v["intact"].as_bool()),
                (Some(cell), Some(true)),
                "{v}"
            );
        }
    }
    let said: Vec<String> = books.iter().map(|k| k.stderr()).collect();
    for err in &said {
        assert!(
            !err.contains("cuslice: refused") && !err.contains("had no room"),
            "{err}"
        );
    }
    assert!(
        said.iter()
            .any(|e| e.contains("s quiet: another slice waits for")),
        "{said:?}"
    );
    for k in books {
        k.remove();
    }
}

fn podman() -> &'static dyn CdiEngine {
    engines::podman::engine()
}

fn containerd() -> &'static dyn CdiEngine {
    engines::containerd::engine()
}

// Each test runs alone (cuslice_test_harness::serial): shares measured on 2 CPUs while another
// test's containers run would measure the CPUs, not the claims.

#[test]
fn podman_holds_each_claim_to_its_cap() {
    root_required();
    let _one = cuslice_test_harness::serial();
    caps_hold(podman());
}

#[test]
fn podman_gives_each_claim_its_share() {
    root_required();
    let _one = cuslice_test_harness::serial();
    shares_hold(podman());
}

#[test]
fn containerd_holds_each_claim_to_its_cap() {
    root_required();
    let _one = cuslice_test_harness::serial();
    caps_hold(containerd());
}

#[test]
fn containerd_gives_each_claim_its_share() {
    root_required();
    let _one = cuslice_test_harness::serial();
    shares_hold(containerd());
}

#[test]
fn podman_caps_each_gpu_of_a_claim_of_two() {
    root_required();
    let _one = cuslice_test_harness::serial();
    a_claim_of_two_gpus_caps_each(podman());
}

#[test]
fn podman_lets_claims_past_the_gpu_take_turns_with_their_bytes_intact() {
    root_required();
    let _one = cuslice_test_harness::serial();
    claims_past_the_gpu_take_turns(podman());
}
