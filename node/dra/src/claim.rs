//! What an allocated ResourceClaim gives each of its gpu.cuslice.io devices: the memory cap (the
//! consumed `memory`), the core request (the consumed `cores`) and the core limit (the claim's
//! opaque `coreLimit`, or the request), and what an allocation does at the cap (`memoryWait`,
//! `memorySpill`). Pure: from the claim as the API server returns it and the
//! GPUs this node has now. Every refusal is one line naming the claim and the reason.

use cuslice_policy::config::Config;
use cuslice_policy::priority::Priority;
use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, ResourceClaim};
use serde::{Deserialize, Serialize};

use crate::quantity;
use crate::resource_slice::{DRIVER, Gpu, OVERSUBSCRIBED_FREEZE_IDLE, OVERSUBSCRIBED_MEMORY_WAIT};

/// The claim the kubelet names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "claim {}/{} (uid {})",
            self.namespace, self.name, self.uid
        )
    }
}

/// The opaque configuration a claim (or its DeviceClass) may give a gpu.cuslice.io device.
pub const CONFIG_API_VERSION: &str = "gpu.cuslice.io/v1alpha1";
pub const CONFIG_KIND: &str = "SliceConfig";

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SliceConfig {
    pub api_version: String,
    pub kind: String,
    /// The most of the GPU's time the slice may use when others want it too, percent; at least
    /// the core request.
    pub core_limit: Option<u32>,
    /// `high`, `normal` or `low`: the slice's priority at the GPU's gate (`CUSLICE_PRIORITY`,
    /// docs/compute.md).
    pub priority: Option<String>,
    /// How long an allocation at the cap waits for the slice's own frees (`CUSLICE_MEMORY_WAIT`,
    /// e.g. `5s`).
    pub memory_wait: Option<String>,
    /// How much the slice may hold in host memory past its cap (`CUSLICE_MEMORY_SPILL`, e.g.
    /// `4Gi` or `4GiB`).
    pub memory_spill: Option<String>,
    /// How long a process of the slice goes without a CUDA call before its device memory is
    /// frozen to the host (`CUSLICE_MEMORY_FREEZE_IDLE`, e.g. `10m`; docs/oversubscription.md).
    pub memory_freeze_idle: Option<String>,
}

/// One device of the claim, with the slice's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allotted {
    /// The claim's request this device was allocated for.
    pub request: String,
    /// The device's name in this node's ResourceSlice (`gpu-0`).
    pub device: String,
    /// The GPU's UUID, as NVML gave it when the claim was prepared.
    pub uuid: String,
    /// Memory cap, bytes.
    pub memory: u64,
    /// Core request and limit, percent of the GPU's time.
    pub core_request: u32,
    pub core_limit: u32,
    /// The priority the configuration gave (`high`, `normal`, `low`); none: the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// `CUSLICE_MEMORY_WAIT` and `CUSLICE_MEMORY_SPILL` as the configuration gave them, checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_wait: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_spill: Option<String>,
    /// `CUSLICE_MEMORY_FREEZE_IDLE` as the configuration gave it, checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_freeze_idle: Option<String>,
}

/// Checks a value the configuration gives for `variable` by the interposer's own rules; the
/// value as the container's environment gets it (a Kubernetes quantity's `Gi` read as `GiB`).
fn at_cap_setting(
    claim: &ClaimRef,
    field: &str,
    variable: &str,
    value: &str,
) -> Result<String, String> {
    let value = match value.trim().strip_suffix('i') {
        Some(v) if v.ends_with(['K', 'M', 'G', 'T', 'P']) => format!("{v}iB"),
        _ => value.trim().to_string(),
    };
    Config::from_vars([(variable, value.as_str())])
        .map(|_| value.clone())
        .map_err(|e| format!("{claim}: {field}: {e}"))
}

fn config_applies(c: &DeviceAllocationConfiguration, request: &str) -> bool {
    let parent = request.split('/').next().unwrap_or(request);
    match &c.requests {
        None => true,
        Some(r) if r.is_empty() => true,
        Some(r) => r.iter().any(|x| x == request || x == parent),
    }
}

fn read_config(claim: &ClaimRef, value: &serde_json::Value) -> Result<SliceConfig, String> {
    let c: SliceConfig = serde_json::from_value(value.clone()).map_err(|e| {
        format!(
            "{claim}: its {DRIVER} configuration is not a {CONFIG_API_VERSION} {CONFIG_KIND}: {e} \
             (known fields: apiVersion, kind, coreLimit, priority, memoryWait, memorySpill, \
             memoryFreezeIdle)"
        )
    })?;
    if c.api_version != CONFIG_API_VERSION || c.kind != CONFIG_KIND {
        return Err(format!(
            "{claim}: its {DRIVER} configuration is {}/{}; this driver takes apiVersion: \
             {CONFIG_API_VERSION}, kind: {CONFIG_KIND}",
            c.api_version, c.kind
        ));
    }
    Ok(c)
}

fn consumed(
    claim: &ClaimRef,
    device: &str,
    what: &str,
    q: Option<&str>,
) -> Result<Option<u64>, String> {
    q.map(|q| {
        quantity::parse(q).map_err(|e| format!("{claim}: device {device}: consumed {what}: {e}"))
    })
    .transpose()
}

/// The claim's gpu.cuslice.io devices on this node (`pool` is the node's pool), each with its
/// settings; `gpus` are the GPUs NVML describes now. Devices of other drivers or pools are not
/// this plugin's and are left out.
pub fn allotments(
    claim: &ClaimRef,
    object: &ResourceClaim,
    pool: &str,
    gpus: &[Gpu],
) -> Result<Vec<Allotted>, String> {
    let uid = object.metadata.uid.as_deref().unwrap_or("");
    if uid != claim.uid {
        return Err(format!(
            "{claim}: the API server's claim of that name has uid {uid:?}: it was deleted and made \
             again; the kubelet will ask for the new one"
        ));
    }
    let Some(devices) = object
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
    else {
        return Err(format!(
            "{claim}: it is not allocated (no status.allocation.devices); the scheduler allocates \
             a claim before the kubelet prepares it"
        ));
    };
    let configs: Vec<&DeviceAllocationConfiguration> = devices
        .config
        .iter()
        .flatten()
        .filter(|c| c.opaque.as_ref().is_some_and(|o| o.driver == DRIVER))
        .collect();
    let mut out = Vec::new();
    for r in devices.results.iter().flatten() {
        if r.driver != DRIVER || r.pool != pool {
            continue;
        }
        let Some(gpu) = gpus.iter().find(|g| g.name() == r.device) else {
            return Err(format!(
                "{claim}: device {} was allocated to it, but this node has no such GPU now \
                 (NVML lists {}); the GPU has gone from the node since the scheduler placed the pod",
                r.device,
                if gpus.is_empty() {
                    "none".to_owned()
                } else {
                    gpus.iter().map(Gpu::name).collect::<Vec<_>>().join(", ")
                }
            ));
        };
        let cap = r.consumed_capacity.as_ref();
        let get = |k: &str| cap.and_then(|c| c.get(k)).map(|q| q.0.as_str());
        // Without consumed capacity (the DRAConsumableCapacity feature off), the scheduler gave
        // the whole device to this claim alone.
        let whole = gpu.whole();
        let memory = consumed(claim, &r.device, "memory", get("memory"))?.unwrap_or(whole);
        let cores = consumed(claim, &r.device, "cores", get("cores"))?.unwrap_or(100);
        if memory == 0 || cores == 0 || cores > 100 {
            return Err(format!(
                "{claim}: device {}: consumed memory {memory} bytes and cores {cores}; a slice \
                 needs more than 0 bytes and 1 to 100 cores",
                r.device
            ));
        }
        if memory > gpu.description.total {
            return Err(format!(
                "{claim}: device {}: consumed memory {} is more than the GPU holds ({}); a \
                 claim consumes at most the memory capacity the device publishes",
                r.device,
                quantity::bytes(memory),
                quantity::bytes(gpu.description.total)
            ));
        }
        let cores = cores as u32;
        let mut limit = cores;
        let mut priority = None;
        let (mut memory_wait, mut memory_spill, mut memory_freeze_idle) = (None, None, None);
        // Class configurations come first, the claim's own after them and win.
        let mut ordered: Vec<&&DeviceAllocationConfiguration> = configs
            .iter()
            .filter(|c| config_applies(c, &r.request))
            .collect();
        ordered.sort_by_key(|c| c.source != "FromClass");
        for c in ordered {
            let params = &c.opaque.as_ref().expect("filtered on opaque").parameters.0;
            let sc = read_config(claim, params)?;
            if let Some(l) = sc.core_limit {
                if !(1..=100).contains(&l) {
                    return Err(format!(
                        "{claim}: coreLimit {l} is not a percent from 1 to 100; write e.g. coreLimit: 60"
                    ));
                }
                limit = l;
            }
            if let Some(p) = &sc.priority {
                let p = Priority::parse(p).ok_or_else(|| {
                    format!(
                        "{claim}: priority {p:?} is not a priority (high, normal or low); write \
                         e.g. priority: high"
                    )
                })?;
                priority = Some(p.to_string());
            }
            if let Some(w) = &sc.memory_wait {
                memory_wait = Some(at_cap_setting(
                    claim,
                    "memoryWait",
                    "CUSLICE_MEMORY_WAIT",
                    w,
                )?);
            }
            if let Some(s) = &sc.memory_spill {
                memory_spill = Some(at_cap_setting(
                    claim,
                    "memorySpill",
                    "CUSLICE_MEMORY_SPILL",
                    s,
                )?);
            }
            if let Some(f) = &sc.memory_freeze_idle {
                memory_freeze_idle = Some(at_cap_setting(
                    claim,
                    "memoryFreezeIdle",
                    "CUSLICE_MEMORY_FREEZE_IDLE",
                    f,
                )?);
            }
        }
        // Caps that add up past the device: when it is full, a process waits for room while
        // quiet processes of other slices give theirs back, unless the configuration says
        // otherwise (docs/oversubscription.md).
        if gpu.oversubscribed() {
            memory_wait.get_or_insert_with(|| OVERSUBSCRIBED_MEMORY_WAIT.to_owned());
            memory_freeze_idle.get_or_insert_with(|| OVERSUBSCRIBED_FREEZE_IDLE.to_owned());
        }
        if limit < cores {
            return Err(format!(
                "{claim}: coreLimit {limit} is below the {cores} cores the claim takes of {}; a \
                 limit is at least the request: ask for fewer cores or raise coreLimit",
                r.device
            ));
        }
        out.push(Allotted {
            request: r.request.clone(),
            device: r.device.clone(),
            uuid: gpu.description.uuid.clone(),
            memory,
            core_request: cores,
            core_limit: limit,
            priority,
            memory_wait,
            memory_spill,
            memory_freeze_idle,
        });
    }
    // The container sees the claim's GPUs in the order of their PCI bus ids (the settings say
    // so: `CUDA_DEVICE_ORDER`), which is NVML's order too: per-device settings name them so.
    let index = |a: &Allotted| {
        gpus.iter()
            .find(|g| g.name() == a.device)
            .map_or(u32::MAX, |g| g.description.index)
    };
    out.sort_by_key(index);
    if let Some(w) = out.windows(2).find(|w| w[0].device == w[1].device) {
        return Err(format!(
            "{claim}: its requests {} and {} were both allocated {}; a container sees a GPU \
             once, so ask for it in one request (or add a constraint that keeps the requests on \
             distinct devices)",
            w[0].request, w[1].request, w[0].device
        ));
    }
    if let Some((first, other)) = out.first().and_then(|f| {
        out.iter()
            .find(|a| slice_wide(a) != slice_wide(f))
            .map(|o| (f, o))
    }) {
        return Err(format!(
            "{claim}: devices {} and {} are configured differently ({:?} and {:?}); priority, \
             memoryWait, memorySpill and memoryFreezeIdle cover every GPU of a container: give \
             the claim's requests one configuration",
            first.device,
            other.device,
            slice_wide(first),
            slice_wide(other)
        ));
    }
    Ok(out)
}

/// What a configuration gives a whole container rather than one of its GPUs: priority,
/// memoryWait, memorySpill, memoryFreezeIdle.
fn slice_wide(a: &Allotted) -> [Option<&str>; 4] {
    [
        a.priority.as_deref(),
        a.memory_wait.as_deref(),
        a.memory_spill.as_deref(),
        a.memory_freeze_idle.as_deref(),
    ]
}

/// The settings of device `i` of a claim's devices `all` (as [`allotments`] ordered them), as
/// the container's environment (the hook reads them from there).
///
/// A claim of one device sets the slice-wide variables. A claim of several gives each device
/// its own (`CUSLICE_MEMORY_LIMIT_<i>`, the GPU's ordinal in the container's view) and, in
/// every device alike, the slice-wide ones at the smallest of the claim's values: a container
/// that uses only some of the claim's requests sees its GPUs at other ordinals, and is then
/// held to the smallest of the claim's settings, never to none.
pub fn settings(all: &[Allotted], i: usize) -> Vec<(String, String)> {
    let a = &all[i];
    let mut out: Vec<(String, String)> = Vec::new();
    let mut slice = |name: &str, value: String| out.push((name.to_owned(), value));
    if all.len() == 1 {
        slice("CUSLICE_MEMORY_LIMIT", a.memory.to_string());
        slice("CUSLICE_CORE_REQUEST", a.core_request.to_string());
        slice("CUSLICE_CORE_LIMIT", a.core_limit.to_string());
    } else {
        let least = |f: fn(&Allotted) -> u64| all.iter().map(f).min().unwrap_or(0).to_string();
        slice("CUDA_DEVICE_ORDER", "PCI_BUS_ID".to_owned());
        slice("CUSLICE_MEMORY_LIMIT", least(|a| a.memory));
        slice("CUSLICE_CORE_REQUEST", least(|a| a.core_request.into()));
        slice("CUSLICE_CORE_LIMIT", least(|a| a.core_limit.into()));
        slice(&format!("CUSLICE_MEMORY_LIMIT_{i}"), a.memory.to_string());
        slice(
            &format!("CUSLICE_CORE_REQUEST_{i}"),
            a.core_request.to_string(),
        );
        slice(&format!("CUSLICE_CORE_LIMIT_{i}"), a.core_limit.to_string());
    }
    for (name, value) in [
        ("CUSLICE_PRIORITY", &a.priority),
        ("CUSLICE_MEMORY_WAIT", &a.memory_wait),
        ("CUSLICE_MEMORY_SPILL", &a.memory_spill),
        ("CUSLICE_MEMORY_FREEZE_IDLE", &a.memory_freeze_idle),
    ] {
        if let Some(v) = value {
            slice(name, v.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuslice_node::nvml::Description;
    use serde_json::json;

    fn gpus() -> Vec<Gpu> {
        (0..2)
            .map(|i| Gpu {
                description: Description {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    name: "sim".into(),
                    total: 16 << 30,
                    minor: Some(i),
                    compute_capability: Some((9, 0)),
                },
                driver_version: "580.95.05".into(),
                oversubscription: crate::resource_slice::NO_OVERSUBSCRIPTION,
            })
            .collect()
    }

    fn claim(results: serde_json::Value, config: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.cuslice.io"}}]}},
            "status": {"allocation": {"devices": {"results": results, "config": config}}}
        }))
        .unwrap()
    }

    fn r() -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u1".into(),
        }
    }

    fn result(device: &str, memory: &str, cores: &str) -> serde_json::Value {
        json!({"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": device,
               "shareID": "s1", "consumedCapacity": {"memory": memory, "cores": cores}})
    }

    fn opaque(source: &str, params: serde_json::Value) -> serde_json::Value {
        json!({"source": source, "opaque": {"driver": DRIVER, "parameters": params}})
    }

    #[test]
    fn consumed_capacity_becomes_the_slice() {
        let c = claim(json!([result("gpu-1", "8Gi", "30")]), json!([]));
        let a = allotments(&r(), &c, "node-a", &gpus()).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(
            (a[0].memory, a[0].core_request, a[0].core_limit),
            (8 << 30, 30, 30)
        );
        assert_eq!(a[0].uuid, "GPU-1");
        assert_eq!(
            settings(&a, 0)[0],
            ("CUSLICE_MEMORY_LIMIT".to_owned(), (8u64 << 30).to_string())
        );
    }

    #[test]
    fn core_limit_comes_from_the_claim_over_the_class() {
        let params =
            |l: u32| json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "coreLimit": l});
        let c = claim(
            json!([result("gpu-0", "1Gi", "30")]),
            json!([
                opaque("FromClaim", params(60)),
                opaque("FromClass", params(40))
            ]),
        );
        let a = allotments(&r(), &c, "node-a", &gpus()).unwrap();
        assert_eq!(a[0].core_limit, 60);
    }

    #[test]
    fn memory_wait_and_spill_become_the_containers_settings_checked() {
        let params = |w: &str, sp: &str| {
            json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND,
                   "memoryWait": w, "memorySpill": sp})
        };
        let c = claim(
            json!([result("gpu-0", "1Gi", "30")]),
            json!([opaque("FromClaim", params("5s", "2Gi"))]),
        );
        let a = allotments(&r(), &c, "node-a", &gpus()).unwrap();
        let s = settings(&a, 0);
        assert!(
            s.contains(&("CUSLICE_MEMORY_WAIT".to_owned(), "5s".to_owned())),
            "{s:?}"
        );
        assert!(
            s.contains(&("CUSLICE_MEMORY_SPILL".to_owned(), "2GiB".to_owned())),
            "{s:?}"
        );
        let none = claim(json!([result("gpu-0", "1Gi", "30")]), json!([]));
        let a = allotments(&r(), &none, "node-a", &gpus()).unwrap();
        assert!(
            settings(&a, 0)
                .iter()
                .all(|(k, _)| k != "CUSLICE_MEMORY_WAIT" && k != "CUSLICE_MEMORY_SPILL")
        );
        let bad = claim(
            json!([result("gpu-0", "1Gi", "30")]),
            json!([opaque("FromClaim", params("5", "2Gi"))]),
        );
        let e = allotments(&r(), &bad, "node-a", &gpus()).unwrap_err();
        assert!(
            e.contains("memoryWait: CUSLICE_MEMORY_WAIT=\"5\" is not a duration (it has no unit)"),
            "{e}"
        );
    }

    #[test]
    fn a_freeze_idle_time_becomes_the_containers_setting_checked() {
        let params = |f: &str| json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "memoryFreezeIdle": f});
        let c = claim(
            json!([result("gpu-0", "1Gi", "30")]),
            json!([opaque("FromClaim", params("10m"))]),
        );
        let a = allotments(&r(), &c, "node-a", &gpus()).unwrap();
        assert!(
            settings(&a, 0).contains(&("CUSLICE_MEMORY_FREEZE_IDLE".to_owned(), "10m".to_owned())),
            "{:?}",
            settings(&a, 0)
        );
        let bad = claim(
            json!([result("gpu-0", "1Gi", "30")]),
            json!([opaque("FromClaim", params("200ms"))]),
        );
        let e = allotments(&r(), &bad, "node-a", &gpus()).unwrap_err();
        assert!(
            e.contains(
                "memoryFreezeIdle: CUSLICE_MEMORY_FREEZE_IDLE=\"200ms\" is less than a second"
            ),
            "{e}"
        );
    }

    /// On a GPU whose caps may add up past its memory, a claim that says nothing waits for room
    /// and lets itself be frozen when quiet; what the claim or its class says wins; a GPU without
    /// oversubscription adds neither.
    #[test]
    fn an_oversubscribed_gpu_gives_claims_a_wait_and_freezing_unless_they_say_otherwise() {
        let over: Vec<Gpu> = gpus()
            .into_iter()
            .map(|g| Gpu {
                oversubscription: 200,
                ..g
            })
            .collect();
        let of = |a: &[Allotted]| {
            settings(a, 0)
                .into_iter()
                .filter(|(k, _)| k == "CUSLICE_MEMORY_WAIT" || k == "CUSLICE_MEMORY_FREEZE_IDLE")
                .collect::<Vec<_>>()
        };
        let plain = claim(json!([result("gpu-0", "12Gi", "30")]), json!([]));
        let a = allotments(&r(), &plain, "node-a", &over).unwrap();
        assert_eq!(
            of(&a),
            vec![
                ("CUSLICE_MEMORY_WAIT".to_owned(), "60s".to_owned()),
                ("CUSLICE_MEMORY_FREEZE_IDLE".to_owned(), "1h".to_owned())
            ]
        );
        let params = json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND,
                            "memoryWait": "5s", "memoryFreezeIdle": "10m"});
        let own = claim(
            json!([result("gpu-0", "12Gi", "30")]),
            json!([opaque("FromClaim", params)]),
        );
        let a = allotments(&r(), &own, "node-a", &over).unwrap();
        assert_eq!(
            of(&a),
            vec![
                ("CUSLICE_MEMORY_WAIT".to_owned(), "5s".to_owned()),
                ("CUSLICE_MEMORY_FREEZE_IDLE".to_owned(), "10m".to_owned())
            ]
        );
        let a = allotments(&r(), &plain, "node-a", &gpus()).unwrap();
        assert_eq!(of(&a), vec![]);
        // One claim never takes more than the GPU, oversubscribed or not.
        let past = claim(json!([result("gpu-0", "17Gi", "30")]), json!([]));
        let e = allotments(&r(), &past, "node-a", &over).unwrap_err();
        assert!(
            e.contains("consumed memory 17Gi is more than the GPU holds (16Gi)"),
            "{e}"
        );
    }

    #[test]
    fn priority_comes_from_the_claim_over_the_class_and_becomes_cuslice_priority() {
        let params =
            |p: &str| json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "priority": p});
        let c = claim(
            json!([result("gpu-0", "1Gi", "30")]),
            json!([
                opaque("FromClaim", params("High")),
                opaque("FromClass", params("low"))
            ]),
        );
        let a = allotments(&r(), &c, "node-a", &gpus()).unwrap();
        assert_eq!(a[0].priority.as_deref(), Some("high"));
        assert!(
            settings(&a, 0).contains(&("CUSLICE_PRIORITY".to_owned(), "high".to_owned())),
            "{:?}",
            settings(&a, 0)
        );
        // None given: the variable is left out (the default, normal).
        let c = claim(json!([result("gpu-0", "1Gi", "30")]), json!([]));
        let a = allotments(&r(), &c, "node-a", &gpus()).unwrap();
        assert!(settings(&a, 0).iter().all(|(k, _)| k != "CUSLICE_PRIORITY"));
        let bad = claim(
            json!([result("gpu-0", "1Gi", "30")]),
            json!([opaque("FromClaim", params("urgent"))]),
        );
        let e = allotments(&r(), &bad, "node-a", &gpus()).unwrap_err();
        assert!(
            e.contains("priority \"urgent\" is not a priority (high, normal or low)"),
            "{e}"
        );
    }

    #[test]
    fn consumed_memory_beyond_the_gpu_or_a_huge_quantity_is_one_short_line() {
        // More than the 16 GiB the GPU holds: no cap of the GPU's size or beyond (a cap of
        // 2^64 - 1 bytes would be none).
        for q in ["17Gi", "18446744073709551615"] {
            let c = claim(json!([result("gpu-0", q, "30")]), json!([]));
            let e = allotments(&r(), &c, "node-a", &gpus()).unwrap_err();
            assert!(e.contains("is more than the GPU holds (16Gi)"), "{e}");
        }
        let c = claim(json!([result("gpu-0", "16Gi", "30")]), json!([]));
        assert_eq!(
            allotments(&r(), &c, "node-a", &gpus()).unwrap()[0].memory,
            16 << 30
        );
        // A megabyte of digits is cut in the refusal.
        let huge = "9".repeat(1 << 20);
        let c = claim(json!([result("gpu-0", &huge, "30")]), json!([]));
        let e = allotments(&r(), &c, "node-a", &gpus()).unwrap_err();
        assert!(
            e.len() < 500 && e.contains("(1048576 bytes)"),
            "{} bytes",
            e.len()
        );
    }

    #[test]
    fn other_drivers_and_pools_are_not_ours() {
        let mut other = result("gpu-0", "1Gi", "10");
        other["driver"] = json!("gpu.nvidia.com");
        let mut elsewhere = result("gpu-0", "1Gi", "10");
        elsewhere["pool"] = json!("node-b");
        let c = claim(json!([other, elsewhere]), json!([]));
        assert_eq!(allotments(&r(), &c, "node-a", &gpus()).unwrap(), vec![]);
    }

    #[test]
    fn without_consumed_capacity_the_whole_device_is_the_claims() {
        let mut x = result("gpu-0", "", "");
        x.as_object_mut().unwrap().remove("consumedCapacity");
        let a = allotments(&r(), &claim(json!([x]), json!([])), "node-a", &gpus()).unwrap();
        assert_eq!((a[0].memory, a[0].core_request), (16 << 30, 100));
    }

    /// A tensor-parallel claim: two requests, one GPU each, listed out of order. The devices
    /// come in the GPUs' order, each with its own settings at its ordinal, and the slice-wide
    /// ones at the smallest of the claim's (what a container using one request only gets).
    #[test]
    fn a_claim_of_two_gpus_sets_each_one_by_its_ordinal() {
        let mut second = result("gpu-1", "6Gi", "50");
        second["request"] = json!("tp1");
        let mut first = result("gpu-0", "4Gi", "40");
        first["request"] = json!("tp0");
        let c = claim(json!([second, first]), json!([]));
        let a = allotments(&r(), &c, "node-a", &gpus()).unwrap();
        let names: Vec<&str> = a.iter().map(|a| a.device.as_str()).collect();
        assert_eq!(names, ["gpu-0", "gpu-1"]);
        let env = |i| -> std::collections::BTreeMap<String, String> {
            settings(&a, i).into_iter().collect()
        };
        let (e0, e1) = (env(0), env(1));
        assert_eq!(e0["CUSLICE_MEMORY_LIMIT_0"], (4u64 << 30).to_string());
        assert_eq!(e0["CUSLICE_CORE_REQUEST_0"], "40");
        assert_eq!(e1["CUSLICE_MEMORY_LIMIT_1"], (6u64 << 30).to_string());
        assert_eq!(e1["CUSLICE_CORE_LIMIT_1"], "50");
        for e in [&e0, &e1] {
            assert_eq!(e["CUSLICE_MEMORY_LIMIT"], (4u64 << 30).to_string(), "{e:?}");
            assert_eq!(e["CUSLICE_CORE_REQUEST"], "40", "{e:?}");
            assert_eq!(e["CUDA_DEVICE_ORDER"], "PCI_BUS_ID", "{e:?}");
        }
        // What both devices set, they set alike (an engine merges the devices' env by name).
        for (k, v) in &e0 {
            if let Some(w) = e1.get(k) {
                assert_eq!(v, w, "{k}");
            }
        }
        // Every setting passes the interposer's own rules, merged as a container gets them.
        let mut merged = e0.clone();
        merged.extend(e1.clone());
        Config::from_vars(merged.iter().map(|(k, v)| (k.as_str(), v.as_str()))).unwrap();
        // Configured differently per request: refused, naming both devices.
        let prio = |p: &str, req: &str| {
            json!({"source": "FromClaim", "requests": [req],
                   "opaque": {"driver": DRIVER, "parameters":
                       {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "priority": p}}})
        };
        let mut x = result("gpu-0", "4Gi", "40");
        x["request"] = json!("tp0");
        let mut y = result("gpu-1", "4Gi", "40");
        y["request"] = json!("tp1");
        let c = claim(
            json!([x, y]),
            json!([prio("high", "tp0"), prio("low", "tp1")]),
        );
        let e = allotments(&r(), &c, "node-a", &gpus()).unwrap_err();
        assert!(
            e.starts_with(
                "claim ns/c (uid u1): devices gpu-0 and gpu-1 are configured differently"
            ) && !e.contains('\n'),
            "{e}"
        );
    }

    #[test]
    fn refusals_name_the_claim_and_the_reason() {
        let ok = json!([result("gpu-0", "1Gi", "30")]);
        let cases: Vec<(ResourceClaim, &str)> = vec![
            (
                claim(
                    ok.clone(),
                    json!([opaque(
                        "FromClaim",
                        json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "corelimit": 50})
                    )]),
                ),
                "unknown field `corelimit`",
            ),
            (
                claim(
                    ok.clone(),
                    json!([opaque(
                        "FromClaim",
                        json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "coreLimit": 20})
                    )]),
                ),
                "coreLimit 20 is below the 30 cores",
            ),
            (
                claim(
                    ok.clone(),
                    json!([opaque(
                        "FromClaim",
                        json!({"apiVersion": "v1", "kind": "Pod"})
                    )]),
                ),
                "this driver takes apiVersion: gpu.cuslice.io/v1alpha1",
            ),
            (
                claim(json!([result("gpu-7", "1Gi", "30")]), json!([])),
                "device gpu-7 was allocated to it, but this node has no such GPU now (NVML lists gpu-0, gpu-1)",
            ),
            (
                claim(json!([result("gpu-0", "1.5", "30")]), json!([])),
                "consumed memory",
            ),
            (
                claim(json!([result("gpu-0", "1Gi", "300")]), json!([])),
                "1 to 100 cores",
            ),
            (
                claim(
                    json!([result("gpu-0", "1Gi", "30"), result("gpu-0", "2Gi", "30")]),
                    json!([]),
                ),
                "its requests gpu and gpu were both allocated gpu-0",
            ),
        ];
        for (c, want) in cases {
            let e = allotments(&r(), &c, "node-a", &gpus()).unwrap_err();
            assert!(e.starts_with("claim ns/c (uid u1): "), "{e}");
            assert!(e.contains(want), "want {want:?} in {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let mut unallocated = claim(ok, json!([]));
        unallocated.status = None;
        let e = allotments(&r(), &unallocated, "node-a", &gpus()).unwrap_err();
        assert!(e.contains("not allocated"), "{e}");
        let mut other = r();
        other.uid = "u2".into();
        let e = allotments(&other, &claim(json!([]), json!([])), "node-a", &gpus()).unwrap_err();
        assert!(e.contains("deleted and made again"), "{e}");
    }
}
