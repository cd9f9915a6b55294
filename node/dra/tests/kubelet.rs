//! The DRA plugin at its boundaries, as a node runs it: the kubelet's side (registration,
//! NodePrepareResources, NodeUnprepareResources over the plugin's real unix sockets, by a client
//! built from the same .proto definitions), the API server's side (kube-rs calls answered with
//! recorded upstream responses, the published ResourceSlice read back as k8s-openapi's type), and
//! the node's side (simgpu's NVML, the CDI directory, the checkpoint). Ground truth for the GPUs:
//! `simgpu show`. Needs the release build (`cargo build --release --workspace`).

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::*;
use cuslice_dra::quantity;
use cuslice_dra::registration::registration_client::RegistrationClient;
use cuslice_dra::registration::{PluginInfo, RegistrationStatus};
use cuslice_test_harness::{GIB, MIB, poll};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

/// The kubelet registers the plugin: the type, driver name, endpoint and DRA version it needs.
#[test]
fn registers_with_the_kubelet() {
    let node = Node::new(1, "16GiB");
    let plugin = node.start_plugin(&[]);
    let info = get_info(&node.registration_socket());
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.cuslice.io");
    assert_eq!(info.endpoint, node.dra_socket().to_str().unwrap());
    assert_eq!(info.supported_versions, vec!["v1.DRAPlugin".to_owned()]);
    notify(&node.registration_socket(), false, "version skew");
    notify(&node.registration_socket(), true, "");
    let (status, log) = plugin.stop();
    assert!(status.success(), "{status}: {log}");
    assert!(
        log.contains("the kubelet refused the registration: version skew"),
        "{log}"
    );
    assert!(log.contains("registered with the kubelet"), "{log}");
    // Stopping unregisters: the kubelet's plugin watcher sees the socket go.
    assert!(!node.registration_socket().exists());
    assert!(!node.dra_socket().exists());
}

/// The capacities of a device, checked against the rules upstream's API documents for
/// consumable capacity (CapacityRequestPolicyRange): min <= default <= max <= value, default and
/// max on the step from min, min + step <= value.
fn check_policy(name: &str, cap: &Value) {
    let q = |v: &Value| quantity::parse(v.as_str().unwrap()).unwrap();
    let value = q(&cap["value"]);
    let p = &cap["requestPolicy"];
    let r = &p["validRange"];
    let (default, min, max, step) = (q(&p["default"]), q(&r["min"]), q(&r["max"]), q(&r["step"]));
    assert!(
        min <= default && default <= max && max <= value,
        "{name}: {cap}"
    );
    assert_eq!((default - min) % step, 0, "{name}: {cap}");
    assert_eq!((max - min) % step, 0, "{name}: {cap}");
    assert!(min + step <= value, "{name}: {cap}");
}

/// The published ResourceSlice: one device per GPU simgpu has, shareable, with the GPU's UUID
/// and memory; a well-formed k8s-openapi object of the shape upstream documents for consumable
/// capacity, applied server-side with the driver as field manager, owned by the Node.
#[test]
fn publishes_each_gpu_as_a_shareable_device() {
    // 10000 MiB is not a multiple of the 256 MiB step: the published capacity is rounded down.
    let node = Node::new(2, "10000MiB");
    let _plugin = node.start_plugin(&[]);
    let slice = node.api.slice().expect("a ResourceSlice was applied");
    let typed: ResourceSlice = strict(&slice);
    assert_eq!(typed.spec.driver, "gpu.cuslice.io");
    assert_eq!(typed.spec.node_name.as_deref(), Some(NODE));
    assert_eq!(typed.spec.pool.name, NODE);
    assert_eq!(typed.spec.pool.resource_slice_count, 1);
    assert_eq!(typed.spec.pool.generation, 1);
    let owner = &slice["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Node");
    assert_eq!(owner["uid"], data("node.json")["metadata"]["uid"]);

    let truth = node.sim.show();
    let devices = slice["spec"]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), truth["devices"].as_array().unwrap().len());
    for (i, (d, t)) in devices
        .iter()
        .zip(truth["devices"].as_array().unwrap())
        .enumerate()
    {
        assert_eq!(d["name"], format!("gpu-{i}"));
        assert_eq!(d["allowMultipleAllocations"], true);
        assert_eq!(d["attributes"]["uuid"]["string"], t["uuid"]);
        assert_eq!(d["attributes"]["index"]["int"], i);
        assert_eq!(d["attributes"]["cudaComputeCapability"]["version"], "9.0.0");
        assert_eq!(d["attributes"]["driverVersion"]["version"], "580.95.5");
        let total = t["total"].as_u64().unwrap();
        assert_eq!(total, 10000 * MIB);
        let memory = quantity::parse(d["capacity"]["memory"]["value"].as_str().unwrap()).unwrap();
        assert_eq!(memory, total / (256 * MIB) * (256 * MIB));
        assert_eq!(d["capacity"]["cores"]["value"], "100");
        for (name, cap) in d["capacity"].as_object().unwrap() {
            check_policy(name, cap);
        }
    }
    // The shape upstream documents for a shareable device with consumable capacity (KEP-5075's
    // ResourceSlice example): the same fields, with a max we add so that no request can exceed
    // the device.
    let paths = |v: &Value| -> BTreeSet<String> {
        fn walk(v: &Value, at: String, out: &mut BTreeSet<String>) {
            match v.as_object() {
                Some(o) => o
                    .iter()
                    .for_each(|(k, v)| walk(v, format!("{at}.{k}"), out)),
                None => {
                    out.insert(at);
                }
            }
        }
        let mut out = BTreeSet::new();
        walk(v, String::new(), &mut out);
        out
    };
    let documented = json!({
        "allowMultipleAllocations": true,
        "capacity": {"memory": {"value": "40Gi", "requestPolicy": {
            "default": "5Gi", "validRange": {"min": "5Gi", "step": "5Gi", "max": "40Gi"}}}}
    });
    let ours = json!({
        "allowMultipleAllocations": devices[0]["allowMultipleAllocations"],
        "capacity": {"memory": devices[0]["capacity"]["memory"]},
    });
    assert_eq!(paths(&ours), paths(&documented));

    let applied = node.api.requests("PATCH", "/resourceslices/");
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].content_type, "application/apply-patch+yaml");
    assert!(
        applied[0].query.contains("fieldManager=gpu.cuslice.io"),
        "{:?}",
        applied[0]
    );
    assert!(applied[0].query.contains("force=true"), "{:?}", applied[0]);
}

/// With `--memory-oversubscription 250`, an 8 GiB GPU is published with 20 GiB of memory for the
/// claims together and at most 8 GiB for one (the attribute says how far); three claims of 6 GiB
/// are all prepared, and each container is told to wait for room and to let its quiet processes
/// be frozen for others, unless its claim says otherwise. What then happens on a full device is
/// the engines' test (`engines.rs`) and docs/oversubscription.md.
#[test]
fn an_oversubscribed_gpu_takes_claims_past_its_memory_and_tells_each_to_wait_for_room() {
    let node = Node::new(1, "8GiB");
    let plugin = node.start_plugin(&["--memory-oversubscription", "250"]);
    let slice = node.api.slice().expect("a ResourceSlice was applied");
    let _: ResourceSlice = strict(&slice);
    let d = &slice["spec"]["devices"][0];
    let memory = &d["capacity"]["memory"];
    assert_eq!(memory["value"], "20Gi", "{d}");
    assert_eq!(memory["requestPolicy"]["validRange"]["max"], "8Gi", "{d}");
    check_policy("memory", memory);
    assert_eq!(d["attributes"]["memoryOversubscription"]["int"], 250, "{d}");
    assert!(
        plugin
            .log()
            .contains("memory caps on each GPU may add up to 250% of its memory"),
        "{}",
        plugin.log()
    );

    let mut own = slice_config(30);
    own["memoryWait"] = json!("5s");
    let claims: Vec<Value> = (1..=3)
        .map(|i| {
            let params = (i == 3).then(|| own.clone());
            claim(
                &format!("notebook-{i}"),
                &format!("00000000-0000-4000-8000-00000000000{i}"),
                "gpu-0",
                "6Gi",
                "30",
                params,
            )
        })
        .collect();
    for c in &claims {
        node.api.put_claim(c);
    }
    let r = prepare(&node.dra_socket(), claims.iter().map(claim_of).collect());
    for (i, c) in claims.iter().enumerate() {
        let uid = c["metadata"]["uid"].as_str().unwrap();
        assert_eq!(r.claims[uid].error, "", "{uid}");
        let env = env_of(&read_spec(&node, uid));
        let wait = if i == 2 { "5s" } else { "60s" };
        for want in [
            format!("CUSLICE_MEMORY_LIMIT={}", 6 * GIB),
            format!("CUSLICE_MEMORY_WAIT={wait}"),
            "CUSLICE_MEMORY_FREEZE_IDLE=1h".to_owned(),
        ] {
            assert!(env.contains(&want), "{uid}: {want} not in {env:?}");
        }
    }
    let r = unprepare(&node.dra_socket(), claims.iter().map(claim_of).collect());
    assert!(r.claims.values().all(|c| c.error.is_empty()));
}

fn spec_file(node: &Node, uid: &str) -> std::path::PathBuf {
    node.cdi_dir().join(format!("gpu.cuslice.io-{uid}.json"))
}

fn read_spec(node: &Node, uid: &str) -> Value {
    let p = spec_file(node, uid);
    serde_json::from_str(
        &std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    )
    .unwrap()
}

fn env_of(spec: &Value) -> Vec<String> {
    spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// Prepare writes one CDI spec per claim carrying the slice's settings, the GPU's device nodes
/// and driver libraries and the cuslice hooks, and returns its CDI id; a repeated prepare gives
/// the same answer without asking the API server again; a restart of the plugin (a crash, even)
/// between prepare and unprepare loses nothing; unprepare removes the spec, twice is harmless.
#[test]
fn prepares_claims_as_cdi_devices_across_restarts() {
    let node = Node::new(2, "16GiB");
    let recorded = data("resourceclaim.json");
    // The recorded claim itself: 8Gi and 30 cores of gpu-0, coreLimit 60.
    let _: ResourceClaim = strict(&recorded);
    let b = claim(
        "trainer-gpu-4m9qz",
        "b0d1e2f3-0000-4000-8000-00000000000b",
        "gpu-0",
        "2Gi",
        "50",
        None,
    );
    node.api.put_claim(&recorded);
    node.api.put_claim(&b);
    let (a_uid, b_uid) = (
        "9e3c1a52-8f0b-4d6e-a1c7-3b5d2f8e6a90",
        "b0d1e2f3-0000-4000-8000-00000000000b",
    );

    let plugin = node.start_plugin(&[]);
    let r = prepare(&node.dra_socket(), vec![claim_of(&recorded), claim_of(&b)]);
    assert_eq!(r.claims.len(), 2);
    for (uid, c) in &r.claims {
        assert_eq!(c.error, "", "{uid}");
        assert_eq!(c.devices.len(), 1);
        let d = &c.devices[0];
        assert_eq!(
            (d.pool_name.as_str(), d.device_name.as_str()),
            (NODE, "gpu-0")
        );
        assert_eq!(d.request_names, vec!["gpu".to_owned()]);
        assert_eq!(
            d.cdi_device_ids,
            vec![format!("gpu.cuslice.io/claim={uid}-gpu-0")]
        );
    }
    let a_spec = read_spec(&node, a_uid);
    assert_eq!(a_spec["kind"], "gpu.cuslice.io/claim");
    assert_eq!(a_spec["devices"][0]["name"], format!("{a_uid}-gpu-0"));
    assert_eq!(
        env_of(&a_spec),
        vec![
            format!("CUSLICE_MEMORY_LIMIT={}", 8 * GIB),
            "CUSLICE_CORE_REQUEST=30".to_owned(),
            "CUSLICE_CORE_LIMIT=60".to_owned()
        ]
    );
    assert_eq!(
        env_of(&read_spec(&node, b_uid)),
        vec![
            format!("CUSLICE_MEMORY_LIMIT={}", 2 * GIB),
            "CUSLICE_CORE_REQUEST=50".to_owned(),
            "CUSLICE_CORE_LIMIT=50".to_owned()
        ]
    );
    let edits = &a_spec["devices"][0]["containerEdits"];
    let root = node.driver_root();
    let nodes: Vec<(String, String)> = edits["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["path"].as_str().unwrap().into(),
                n["hostPath"].as_str().unwrap().into(),
            )
        })
        .collect();
    let host = |p: &str| format!("{}{p}", root.display());
    // gpu-0's node, not gpu-1's; the control and unified-memory nodes.
    assert_eq!(
        nodes,
        ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]
            .iter()
            .map(|p| (p.to_string(), host(p)))
            .collect::<Vec<_>>()
    );
    let mounts: Vec<&str> = edits["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap())
        .collect();
    assert_eq!(
        mounts,
        [
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
        ]
    );
    // The hooks once for the whole spec (a container with several of the claim's devices still
    // runs each stage once).
    let hooks: Vec<(&str, &str)> = a_spec["containerEdits"]["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["hookName"].as_str().unwrap(), h["path"].as_str().unwrap()))
        .collect();
    assert_eq!(
        hooks,
        [
            ("createRuntime", "/usr/local/bin/cuslice-hook"),
            ("poststop", "/usr/local/bin/cuslice-hook")
        ]
    );

    // The container index (for cuslice-runtime on containerd 1.6): the recorded claim's pod
    // names it, through its template, for container main, not for the sidecar; the other claim
    // is reserved for that pod too but no container of it names the claim.
    let index: Vec<String> = std::fs::read_dir(node.container_index())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(index, vec![format!("default_inference_main_{a_uid}.json")]);
    let entry: Value = serde_json::from_str(
        &std::fs::read_to_string(node.container_index().join(&index[0])).unwrap(),
    )
    .unwrap();
    assert_eq!(
        entry,
        json!({"podUID": data("pod.json")["metadata"]["uid"],
               "cdiDevices": [format!("gpu.cuslice.io/claim={a_uid}-gpu-0")],
               "claim": recorded["metadata"]["name"]})
    );

    // Again: the same devices, the same spec, no second read of the claim.
    let gets = node.api.requests("GET", "/resourceclaims/").len();
    let spec_text = std::fs::read_to_string(spec_file(&node, a_uid)).unwrap();
    let again = prepare(&node.dra_socket(), vec![claim_of(&recorded)]);
    assert_eq!(again.claims[a_uid], r.claims[a_uid]);
    assert_eq!(node.api.requests("GET", "/resourceclaims/").len(), gets);
    assert_eq!(
        std::fs::read_to_string(spec_file(&node, a_uid)).unwrap(),
        spec_text
    );

    // A crash, and a new plugin: it knows both claims from its checkpoint. A spec that went
    // missing meanwhile is written again by a repeated prepare.
    plugin.kill();
    std::fs::remove_file(spec_file(&node, b_uid)).unwrap();
    let plugin = node.start_plugin(&[]);
    let b_again = prepare(&node.dra_socket(), vec![claim_of(&b)]);
    assert_eq!(b_again.claims[b_uid], r.claims[b_uid]);
    assert!(spec_file(&node, b_uid).exists());
    assert_eq!(node.api.requests("GET", "/resourceclaims/").len(), gets);

    let u = unprepare(&node.dra_socket(), vec![claim_of(&recorded)]);
    assert_eq!(u.claims[a_uid].error, "");
    assert!(!spec_file(&node, a_uid).exists());
    assert_eq!(
        std::fs::read_dir(node.container_index()).unwrap().count(),
        0
    );
    assert!(spec_file(&node, b_uid).exists());
    // Twice, and a claim never prepared here: nothing to undo, no error.
    let never = claim(
        "other",
        "c0c0c0c0-0000-4000-8000-00000000000c",
        "gpu-1",
        "1Gi",
        "10",
        None,
    );
    let u = unprepare(
        &node.dra_socket(),
        vec![claim_of(&recorded), claim_of(&never)],
    );
    assert_eq!(u.claims.len(), 2);
    assert!(u.claims.values().all(|c| c.error.is_empty()), "{u:?}");

    // A clean stop and start: b is still prepared, a is not.
    let (status, _) = plugin.stop();
    assert!(status.success());
    let cp: Value =
        serde_json::from_str(&std::fs::read_to_string(node.checkpoint()).unwrap()).unwrap();
    let kept: Vec<&String> = cp["claims"].as_object().unwrap().keys().collect();
    assert_eq!(kept, vec![b_uid]);
    let _plugin = node.start_plugin(&[]);
    let u = unprepare(&node.dra_socket(), vec![claim_of(&b)]);
    assert_eq!(u.claims[b_uid].error, "");
    assert!(!spec_file(&node, b_uid).exists());
    assert_eq!(std::fs::read_dir(node.cdi_dir()).unwrap().count(), 0);
}

/// A claim the plugin cannot honour gets one line naming the claim and the reason, no spec, and
/// the other claims of the same call are prepared.
#[test]
fn refuses_claims_it_cannot_honour() {
    let node = Node::new(2, "16GiB");
    let good = claim(
        "good",
        "00000000-0000-4000-8000-000000000001",
        "gpu-0",
        "1Gi",
        "10",
        None,
    );
    let mut typo = slice_config(60);
    typo["corelimit"] = json!(70);
    let cases = [
        (
            claim(
                "typo",
                "00000000-0000-4000-8000-000000000002",
                "gpu-0",
                "1Gi",
                "10",
                Some(typo),
            ),
            "unknown field `corelimit`",
        ),
        (
            claim(
                "below",
                "00000000-0000-4000-8000-000000000003",
                "gpu-0",
                "1Gi",
                "40",
                Some(slice_config(20)),
            ),
            "coreLimit 20 is below the 40 cores the claim takes of gpu-0",
        ),
        (
            claim(
                "elsewhere",
                "00000000-0000-4000-8000-000000000004",
                "gpu-5",
                "1Gi",
                "10",
                None,
            ),
            "device gpu-5 was allocated to it, but this node has no such GPU now (NVML lists gpu-0, gpu-1)",
        ),
    ];
    for (c, _) in &cases {
        node.api.put_claim(c);
    }
    node.api.put_claim(&good);
    let missing = claim(
        "missing",
        "00000000-0000-4000-8000-000000000005",
        "gpu-0",
        "1Gi",
        "10",
        None,
    );
    let mut podless = claim(
        "podless",
        "00000000-0000-4000-8000-000000000006",
        "gpu-0",
        "1Gi",
        "10",
        None,
    );
    podless["status"]["reservedFor"][0]["name"] = json!("gone");
    node.api.put_claim(&podless);

    let _plugin = node.start_plugin(&[]);
    let mut all: Vec<_> = cases.iter().map(|(c, _)| claim_of(c)).collect();
    all.push(claim_of(&good));
    all.push(claim_of(&missing));
    all.push(claim_of(&podless));
    let r = prepare(&node.dra_socket(), all);
    let e = &r.claims["00000000-0000-4000-8000-000000000006"].error;
    assert!(
        e.starts_with("claim default/podless (uid 00000000-0000-4000-8000-000000000006): reading pod default/gone it is reserved for: "),
        "{e}"
    );
    assert!(!spec_file(&node, "00000000-0000-4000-8000-000000000006").exists());
    for (c, want) in &cases {
        let uid = c["metadata"]["uid"].as_str().unwrap();
        let name = c["metadata"]["name"].as_str().unwrap();
        let e = &r.claims[uid].error;
        assert!(
            e.starts_with(&format!("claim default/{name} (uid {uid}): ")),
            "{e}"
        );
        assert!(e.contains(want), "want {want:?} in {e}");
        assert!(!e.contains('\n'), "{e}");
        assert!(r.claims[uid].devices.is_empty());
        assert!(!spec_file(&node, uid).exists());
    }
    let e = &r.claims["00000000-0000-4000-8000-000000000005"].error;
    assert!(e.starts_with("claim default/missing (uid 00000000-0000-4000-8000-000000000005): reading it from the API server"), "{e}");
    assert!(e.contains("not found"), "{e}");
    assert_eq!(r.claims["00000000-0000-4000-8000-000000000001"].error, "");
    assert!(spec_file(&node, "00000000-0000-4000-8000-000000000001").exists());
}

/// A GPU that falls off the bus (NVML: GPU_IS_LOST) leaves the published slice within a rescan,
/// a claim for it is refused by name, and it comes back when the GPU does, each change at a new
/// pool generation.
#[test]
fn follows_gpus_that_leave_and_come_back() {
    let node = Node::new(2, "16GiB");
    let c = claim(
        "on-gpu-1",
        "00000000-0000-4000-8000-000000000011",
        "gpu-1",
        "1Gi",
        "10",
        None,
    );
    node.api.put_claim(&c);
    let plugin = node.start_plugin(&["--rescan", "1"]);
    let names = |s: &Value| -> Vec<String> {
        s["spec"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&node.api.slice().unwrap()), ["gpu-0", "gpu-1"]);
    let set = |lost: &str| {
        let out = std::process::Command::new(cuslice_test_harness::simgpu())
            .args(["set", "--device", "1", "--lost", lost, "--state"])
            .arg(&node.sim.state)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    set("on");
    let s = poll("gpu-1 leaves the slice", 10, || {
        node.api.slice().filter(|s| names(s) == ["gpu-0"])
    });
    assert_eq!(s["spec"]["pool"]["generation"], 2);
    let r = prepare(&node.dra_socket(), vec![claim_of(&c)]);
    let e = &r.claims["00000000-0000-4000-8000-000000000011"].error;
    assert!(
        e.contains(
            "device gpu-1 was allocated to it, but this node has no such GPU now (NVML lists gpu-0)"
        ),
        "{e}"
    );
    set("off");
    let s = poll("gpu-1 comes back", 10, || {
        node.api.slice().filter(|s| names(s) == ["gpu-0", "gpu-1"])
    });
    assert_eq!(s["spec"]["pool"]["generation"], 3);
    let r = prepare(&node.dra_socket(), vec![claim_of(&c)]);
    assert_eq!(r.claims["00000000-0000-4000-8000-000000000011"].error, "");
    let (_, log) = plugin.stop();
    assert!(log.contains("GPU 1 is not published: "), "{log}");
    assert!(
        log.contains("GPU is lost") || log.contains("returned 15"),
        "{log}"
    );
}

/// A checkpoint the plugin cannot read stops it with one line naming the file, and the file is
/// left as it was (it lists what is prepared on the node).
#[test]
fn a_corrupt_checkpoint_stops_the_plugin_and_is_kept() {
    let node = Node::new(1, "16GiB");
    std::fs::create_dir_all(node.plugin_dir()).unwrap();
    let text = "{\"version\": 1, \"claims\": {\"9e3c";
    std::fs::write(node.checkpoint(), text).unwrap();
    let out = node.plugin_command(&[]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "cuslice-dra-plugin: {}: not a checkpoint",
            node.checkpoint().display()
        )),
        "{err}"
    );
    assert!(err.contains("move it aside"), "{err}");
    assert_eq!(std::fs::read_to_string(node.checkpoint()).unwrap(), text);
    assert!(!node.registration_socket().exists());
}

/// Bad command lines and an unknown node get one line each.
#[test]
fn bad_options_get_one_line() {
    let node = Node::new(1, "16GiB");
    let out = node
        .plugin_command(&["--hook", "cuslice-hook"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--hook \"cuslice-hook\" is not an absolute path"),
        "{err}"
    );
    let out = node
        .plugin_command(&["--memory-oversubscription", "90"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "invalid value '90' for '--memory-oversubscription <PERCENT>': 90 is not in 100..=1000"
        ),
        "{err}"
    );
    let out = node.plugin_command_on("node-z", &[]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("cuslice-dra-plugin: node node-z: "),
        "{err}"
    );
}

/// The plugin's registration info, as the kubelet asks for it.
fn get_info(reg: &Path) -> PluginInfo {
    try_info(reg).unwrap()
}

/// Tells the plugin whether the kubelet registered it, as the kubelet does.
fn notify(reg: &Path, registered: bool, error: &str) {
    block_on(async {
        RegistrationClient::new(channel(reg).await.unwrap())
            .notify_registration_status(RegistrationStatus {
                plugin_registered: registered,
                error: error.into(),
            })
            .await
            .unwrap();
    })
}

/// `value` read as JSON into the k8s-openapi type `T` and written back must give `value` again:
/// a field k8s-openapi does not know (a typo, a field of another version) would be dropped.
fn strict<T: serde::de::DeserializeOwned + serde::Serialize>(value: &Value) -> T {
    let t: T = serde_json::from_value(value.clone()).unwrap();
    let back = serde_json::to_value(&t).unwrap();
    assert_eq!(
        &back, value,
        "the object does not round-trip through k8s-openapi"
    );
    t
}

/// The plugin across releases (docs/upgrades.md), with the previous release's plugin
/// (`CUSLICE_PREVIOUS` names its target/release, as `tests/upgrade/run` sets it): what it
/// prepared, this release knows from its checkpoint (a repeated prepare gives the same devices
/// without asking the API server; unprepare removes the spec); back one release, the previous
/// plugin takes this one's checkpoint, a claim that set what it may not know (`memoryWait`)
/// included: the spec it writes again still carries the setting, and a new claim asking for it
/// is refused in one line by a release that does not know it.
#[test]
#[ignore = "needs the previous release built: tests/upgrade/run"]
fn claims_survive_an_upgrade_and_a_downgrade_of_the_plugin() {
    let prev = std::path::PathBuf::from(std::env::var_os("CUSLICE_PREVIOUS").expect(
        "CUSLICE_PREVIOUS names the previous release's target/release: tests/upgrade/run sets it",
    ))
    .join("cuslice-dra-plugin");
    assert!(prev.is_file(), "{}: no plugin there", prev.display());
    let node = Node::new(2, "16GiB");
    let uids = [
        "a0a0a0a0-0000-4000-8000-00000000000a",
        "b0b0b0b0-0000-4000-8000-00000000000b",
        "c0c0c0c0-0000-4000-8000-00000000000c",
        "d0d0d0d0-0000-4000-8000-00000000000d",
    ];
    let a = claim("a", uids[0], "gpu-0", "2Gi", "30", Some(slice_config(60)));
    let b = claim("b", uids[1], "gpu-1", "4Gi", "50", None);
    let mut waits = slice_config(40);
    waits["memoryWait"] = json!("5s");
    let c = claim("c", uids[2], "gpu-0", "1Gi", "20", Some(waits.clone()));
    let d = claim("d", uids[3], "gpu-1", "1Gi", "20", Some(waits));
    for x in [&a, &b, &c, &d] {
        node.api.put_claim(x);
    }
    let gets = || node.api.requests("GET", "/resourceclaims/").len();

    // The previous release prepares a.
    let old = node.start_plugin_of(&prev, &[]);
    let first = prepare(&node.dra_socket(), vec![claim_of(&a)]);
    assert_eq!(first.claims[uids[0]].error, "", "{first:?}");
    let spec_a = std::fs::read_to_string(spec_file(&node, uids[0])).unwrap();
    assert!(old.stop().0.success());

    // This release over its checkpoint: a is known, b is new.
    let new = node.start_plugin(&[]);
    let asked = gets();
    let again = prepare(&node.dra_socket(), vec![claim_of(&a)]);
    assert_eq!(again.claims[uids[0]], first.claims[uids[0]]);
    assert_eq!(
        gets(),
        asked,
        "this release asked the API server again for a"
    );
    assert_eq!(
        std::fs::read_to_string(spec_file(&node, uids[0])).unwrap(),
        spec_a
    );
    let b_first = prepare(&node.dra_socket(), vec![claim_of(&b)]);
    assert_eq!(b_first.claims[uids[1]].error, "", "{b_first:?}");
    assert!(new.stop().0.success());
    let cp: Value =
        serde_json::from_str(&std::fs::read_to_string(node.checkpoint()).unwrap()).unwrap();
    assert_eq!(cp["version"], 1, "{cp}");

    // Back one release: the previous plugin takes this checkpoint, unprepares a and knows b.
    let old = node.start_plugin_of(&prev, &[]);
    let u = unprepare(&node.dra_socket(), vec![claim_of(&a)]);
    assert_eq!(u.claims[uids[0]].error, "", "{u:?}");
    assert!(!spec_file(&node, uids[0]).exists());
    let asked = gets();
    let b_again = prepare(&node.dra_socket(), vec![claim_of(&b)]);
    assert_eq!(b_again.claims[uids[1]], b_first.claims[uids[1]]);
    assert_eq!(gets(), asked, "the previous release asked again for b");
    assert!(old.stop().0.success());

    // This release prepares c, which waits at its cap. The previous release's records have no
    // such field and it ignores fields it does not know: it takes the checkpoint, knows c, and
    // the spec it keeps (and would write again) still gives c's containers the wait.
    let new = node.start_plugin(&[]);
    let c_first = prepare(&node.dra_socket(), vec![claim_of(&c)]);
    assert_eq!(c_first.claims[uids[2]].error, "", "{c_first:?}");
    let wait = "CUSLICE_MEMORY_WAIT=5s".to_owned();
    assert!(env_of(&read_spec(&node, uids[2])).contains(&wait));
    assert!(new.stop().0.success());
    let old = node.start_plugin_of(&prev, &[]);
    std::fs::remove_file(spec_file(&node, uids[2])).unwrap();
    let asked = gets();
    let c_again = prepare(&node.dra_socket(), vec![claim_of(&c)]);
    assert_eq!(c_again.claims[uids[2]], c_first.claims[uids[2]]);
    assert_eq!(gets(), asked, "the previous release asked again for c");
    assert!(
        env_of(&read_spec(&node, uids[2])).contains(&wait),
        "{}",
        read_spec(&node, uids[2])
    );
    // A claim that asks for the wait only now: a previous release that does not know the
    // setting refuses it in one line and writes nothing; one that knows it gives the wait.
    let d_prepared = prepare(&node.dra_socket(), vec![claim_of(&d)]);
    let line = &d_prepared.claims[uids[3]].error;
    if line.is_empty() {
        assert!(
            env_of(&read_spec(&node, uids[3])).contains(&wait),
            "{}",
            read_spec(&node, uids[3])
        );
        let u = unprepare(&node.dra_socket(), vec![claim_of(&d)]);
        assert_eq!(u.claims[uids[3]].error, "", "{u:?}");
    } else {
        assert!(
            line.contains("memoryWait") && !line.contains('\n'),
            "{line}"
        );
    }
    assert!(!spec_file(&node, uids[3]).exists());
    assert!(old.stop().0.success());

    // And this release again, on what the previous one last wrote: it serves all of it.
    let _new = node.start_plugin(&[]);
    for (x, uid) in [(&b, uids[1]), (&c, uids[2])] {
        let u = unprepare(&node.dra_socket(), vec![claim_of(x)]);
        assert_eq!(u.claims[uid].error, "", "{u:?}");
    }
    assert_eq!(std::fs::read_dir(node.cdi_dir()).unwrap().count(), 0);
}
