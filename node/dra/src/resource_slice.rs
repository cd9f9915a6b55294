//! The ResourceSlice this node publishes: one device per GPU, each shareable by several claims,
//! each claim taking an amount of the device's `memory` and `cores` (consumable capacity,
//! KEP-5075). Pure: built from what NVML described.

use std::collections::BTreeMap;

use cuslice_node::nvml::Description;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::quantity;

/// The DRA driver name: the DeviceClass, the ResourceSlice's driver, the opaque config's driver.
/// It is the claim specs' CDI vendor, defined with them in `cuslice_cdi` (which the hook side
/// reads too, for the container index's default directory).
pub const DRIVER: &str = cuslice_cdi::CLAIM_VENDOR;

/// Memory is taken in steps of this many bytes (and at least one step).
pub const MEMORY_STEP: u64 = 256 << 20;

/// Oversubscription off: the memory caps of the claims on a GPU add up to at most its memory.
pub const NO_OVERSUBSCRIPTION: u32 = 100;

/// With oversubscription, what a claim's processes do when the device is full, unless the claim
/// (or its class) says otherwise: wait this long for room (`memoryWait`) ...
pub const OVERSUBSCRIBED_MEMORY_WAIT: &str = "60s";
/// ... while processes of other slices quiet for a second give theirs back, and each gives its
/// own back after this long idle (`memoryFreezeIdle`; docs/oversubscription.md).
pub const OVERSUBSCRIBED_FREEZE_IDLE: &str = "1h";

/// A GPU as published: NVML's description, the driver it runs under, and how far the memory caps
/// of claims on it may add up (the plugin's `--memory-oversubscription`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub description: Description,
    pub driver_version: String,
    /// Percent of its memory (`NO_OVERSUBSCRIPTION`: its memory, no more).
    pub oversubscription: u32,
}

impl Gpu {
    /// The device's name in the ResourceSlice: `gpu-<NVML index>`.
    pub fn name(&self) -> String {
        device_name(self.description.index)
    }

    /// What one claim may take of its memory: all of it, in whole steps (a remainder under one
    /// step could never be taken).
    pub fn whole(&self) -> u64 {
        self.description.total / MEMORY_STEP * MEMORY_STEP
    }

    /// What the claims on it may take together: its memory times the oversubscription, in whole
    /// steps.
    pub fn memory_capacity(&self) -> u64 {
        let total = self.description.total as u128 * self.oversubscription as u128 / 100;
        let steps = total / MEMORY_STEP as u128 * MEMORY_STEP as u128;
        steps.min(u64::MAX as u128) as u64
    }

    pub fn oversubscribed(&self) -> bool {
        self.oversubscription > NO_OVERSUBSCRIPTION
    }
}

pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The ResourceSlice's name: one per node and driver.
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER}")
}

/// A version attribute must be semantic versioning 2.0: NVIDIA's `580.95.05` becomes `580.95.5`,
/// compute capability `9.0` becomes `9.0.0`.
pub fn semver(v: &str) -> Option<String> {
    let mut parts: Vec<u64> = v
        .split('.')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    parts.resize(3, 0);
    Some(format!("{}.{}.{}", parts[0], parts[1], parts[2]))
}

fn string(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_owned()),
        ..Default::default()
    }
}

fn version(s: String) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(s),
        ..Default::default()
    }
}

/// A capacity of `value` in all, of which one claim takes `min` to `max` in steps of `step`, and
/// `max` when it names no amount.
fn capacity(value: String, max: String, min: String, step: String) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(value),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity(max.clone())),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity(min),
                max: Some(Quantity(max)),
                step: Some(Quantity(step)),
            }),
            valid_values: None,
        }),
    }
}

/// One GPU as a device of the slice. A request that names no amount takes the whole device
/// (all its memory and 100 cores), as `nvidia.com/gpu: 1` would: a fraction is always asked for.
/// With oversubscription the claims may take more memory together than the device has (its
/// `memory` capacity is that much larger, and its `memoryOversubscription` attribute says how
/// far), but one claim never more than the device.
pub fn device(gpu: &Gpu) -> Device {
    let d = &gpu.description;
    let mut attributes = BTreeMap::new();
    attributes.insert("uuid".to_owned(), string(&d.uuid));
    attributes.insert("productName".to_owned(), string(&d.name));
    attributes.insert(
        "index".to_owned(),
        DeviceAttribute {
            int: Some(d.index.into()),
            ..Default::default()
        },
    );
    if let Some(v) = semver(&gpu.driver_version) {
        attributes.insert("driverVersion".to_owned(), version(v));
    }
    if let Some(v) = d
        .compute_capability
        .and_then(|(major, minor)| semver(&format!("{major}.{minor}")))
    {
        attributes.insert("cudaComputeCapability".to_owned(), version(v));
    }
    attributes.insert(
        "memoryOversubscription".to_owned(),
        DeviceAttribute {
            int: Some(gpu.oversubscription.into()),
            ..Default::default()
        },
    );
    let mut capacities = BTreeMap::new();
    capacities.insert(
        "memory".to_owned(),
        capacity(
            quantity::bytes(gpu.memory_capacity()),
            quantity::bytes(gpu.whole()),
            quantity::bytes(MEMORY_STEP),
            quantity::bytes(MEMORY_STEP),
        ),
    );
    capacities.insert(
        "cores".to_owned(),
        capacity("100".into(), "100".into(), "1".into(), "1".into()),
    );
    Device {
        name: gpu.name(),
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes),
        capacity: Some(capacities),
        ..Default::default()
    }
}

/// The node, as the slice's owner: deleting the Node deletes its slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRef {
    pub name: String,
    pub uid: String,
}

/// The whole ResourceSlice for `node` at pool generation `generation`.
pub fn resource_slice(node: &NodeRef, generation: i64, gpus: &[Gpu]) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(&node.name)),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.name.clone(),
                uid: node.uid.clone(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.name.clone()),
            pool: ResourcePool {
                name: node.name.clone(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(gpus.iter().map(device).collect()),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, total: u64) -> Gpu {
        Gpu {
            description: Description {
                index,
                uuid: format!("GPU-{index}"),
                name: "NVIDIA H100 80GB HBM3".into(),
                total,
                minor: Some(index),
                compute_capability: Some((9, 0)),
            },
            driver_version: "580.95.05".into(),
            oversubscription: NO_OVERSUBSCRIPTION,
        }
    }

    #[test]
    fn versions_become_semver() {
        assert_eq!(semver("580.95.05").as_deref(), Some("580.95.5"));
        assert_eq!(semver("9.0").as_deref(), Some("9.0.0"));
        assert_eq!(semver("535.104.12").as_deref(), Some("535.104.12"));
        assert_eq!(semver("r580"), None);
        assert_eq!(semver("1.2.3.4"), None);
    }

    #[test]
    fn a_gpu_is_a_shareable_device_with_memory_and_cores() {
        let s = resource_slice(
            &NodeRef {
                name: "node-a".into(),
                uid: "u".into(),
            },
            3,
            &[gpu(0, 85_520_809_984)],
        );
        let v = serde_json::to_value(&s).unwrap();
        let d = &v["spec"]["devices"][0];
        assert_eq!(d["name"], "gpu-0");
        assert_eq!(d["allowMultipleAllocations"], true);
        assert_eq!(d["attributes"]["driverVersion"]["version"], "580.95.5");
        assert_eq!(d["attributes"]["cudaComputeCapability"]["version"], "9.0.0");
        // 81559 MiB is 318.6 steps of 256 MiB: 318 steps are published.
        assert_eq!(d["capacity"]["memory"]["value"], "81408Mi");
        assert_eq!(
            d["capacity"]["memory"]["requestPolicy"]["validRange"]["step"],
            "256Mi"
        );
        assert_eq!(d["capacity"]["cores"]["value"], "100");
        assert_eq!(v["spec"]["pool"]["generation"], 3);
        assert_eq!(v["metadata"]["name"], "node-a-gpu.cuslice.io");
        assert_eq!(v["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert_eq!(d["attributes"]["memoryOversubscription"]["int"], 100);
        assert_eq!(
            d["capacity"]["memory"]["requestPolicy"]["validRange"]["max"],
            "81408Mi"
        );
    }

    /// At 250%, the claims on an 8 GiB device may take 20 GiB together, each at most 8 GiB; the
    /// attribute says how far, for a class's or claim's selector.
    #[test]
    fn an_oversubscribed_gpu_publishes_more_memory_than_one_claim_may_take() {
        let mut g = gpu(0, 8 << 30);
        g.oversubscription = 250;
        let d = serde_json::to_value(device(&g)).unwrap();
        let memory = &d["capacity"]["memory"];
        assert_eq!(memory["value"], "20Gi");
        assert_eq!(memory["requestPolicy"]["validRange"]["max"], "8Gi");
        assert_eq!(memory["requestPolicy"]["default"], "8Gi");
        assert_eq!(d["attributes"]["memoryOversubscription"]["int"], 250);
        // Not a whole number of steps: rounded down, as without oversubscription.
        let mut odd = gpu(0, (8 << 30) + (100 << 20));
        odd.oversubscription = 150;
        assert_eq!(odd.memory_capacity(), 12_288 << 20);
        assert_eq!(odd.whole(), 8 << 30);
    }
}
