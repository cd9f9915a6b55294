//! The node's view in the Prometheus (OpenMetrics) text format, read afresh from the ledgers at
//! every scrape. Names and types: docs/status.md.

use cuslice_state::host::Kubernetes;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeMetric,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use crate::collect::{Sources, collect};
use crate::view::{Device, Node, Slice};

/// The content type of what `encode` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug)]
struct NodeCollector {
    sources: Sources,
}

type Labels = Vec<(&'static str, String)>;

/// A label value as the text format must carry it: `\\`, `"` and line feeds escaped (Ref:
/// OpenMetrics 1.0, "Escaping"). The Prometheus client writes label values as it is given them,
/// and values here come from containers' annotations and hostnames, and from paths: unescaped,
/// a `"` in one would end the value and let the rest forge labels.
fn esc(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn device_labels(d: &Device) -> Labels {
    vec![("uuid", esc(&d.uuid))]
}

/// `namespace`, `pod`, `container` (as NVIDIA's DCGM exporter names them) and `claim`: where the
/// slice's container belongs in Kubernetes; empty for a slice that is not a pod's container,
/// which Prometheus stores as no label at all.
fn kubernetes_labels(k: Option<&Kubernetes>) -> Labels {
    let (ns, pod, container, claim) = k.map_or(("", "", "", ""), |k| {
        (
            k.namespace.as_str(),
            k.pod.as_str(),
            k.container.as_str(),
            k.claim.as_deref().unwrap_or(""),
        )
    });
    vec![
        ("namespace", esc(ns)),
        ("pod", esc(pod)),
        ("container", esc(container)),
        ("claim", esc(claim)),
    ]
}

fn slice_labels(d: &Device, s: &Slice) -> Labels {
    let mut l = vec![
        ("uuid", esc(&d.uuid)),
        ("slice", esc(&s.slice)),
        ("kind", s.kind.to_string()),
        ("name", esc(s.name.as_deref().unwrap_or_default())),
    ];
    l.extend(kubernetes_labels(s.kubernetes.as_ref()));
    l
}

enum Kind {
    Gauge,
    Counter,
}

/// One metric family: its descriptor, then one sample per row.
fn family<V: EncodeGaugeValue + EncodeCounterValue + Copy>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    kind: Kind,
    rows: Vec<(Labels, V)>,
) -> Result<(), std::fmt::Error> {
    let ty = match kind {
        Kind::Gauge => MetricType::Gauge,
        Kind::Counter => MetricType::Counter,
    };
    let mut m = enc.encode_descriptor(name, help, unit, ty)?;
    for (labels, v) in rows {
        let sample = m.encode_family(&labels)?;
        match kind {
            Kind::Gauge => ConstGauge::new(v).encode(sample)?,
            Kind::Counter => ConstCounter::new(v).encode(sample)?,
        }
    }
    Ok(())
}

fn per_slice<V>(node: &Node, f: impl Fn(&Slice) -> Option<V>) -> Vec<(Labels, V)> {
    node.devices
        .iter()
        .flat_map(|d| {
            d.slices
                .iter()
                .filter_map(|s| Some((slice_labels(d, s), f(s)?)))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn per_device<V>(node: &Node, f: impl Fn(&Device) -> Option<V>) -> Vec<(Labels, V)> {
    node.devices
        .iter()
        .filter_map(|d| Some((device_labels(d), f(d)?)))
        .collect()
}

impl Collector for NodeCollector {
    fn encode(&self, enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_node(&collect(&self.sources), enc)
    }
}

/// Every family, from one view of the node.
fn encode_node(node: &Node, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let e = &mut enc;
    let bytes = Some(&Unit::Bytes);
    let seconds = Some(&Unit::Seconds);
    use Kind::{Counter, Gauge};
    let info: Vec<(Labels, u64)> = node
        .devices
        .iter()
        .map(|d| {
            let mut l = device_labels(d);
            l.push(("name", esc(d.name.as_deref().unwrap_or_default())));
            (l, 1)
        })
        .collect();
    family(
        e,
        "device_info",
        "A GPU (name from NVML; empty if NVML could not be asked)",
        None,
        Gauge,
        info,
    )?;
    let library: Vec<(Labels, u64)> = per_slice(node, |s| Some(s.ledger_version))
        .into_iter()
        .map(|(mut l, v)| {
            l.push(("ledger_version", v.to_string()));
            (l, 1)
        })
        .collect();
    family(
        e,
        "slice_info",
        "A slice on a device; ledger_version is the format its library writes (this \
         release's, or the previous release's for a slice started before an upgrade)",
        None,
        Gauge,
        library,
    )?;
    family(
        e,
        "device_memory_total",
        "Device memory (NVML)",
        bytes,
        Gauge,
        per_device(node, |d| d.memory_total),
    )?;
    family(
        e,
        "device_memory_used",
        "Device memory in use by any process (NVML)",
        bytes,
        Gauge,
        per_device(node, |d| d.memory_used),
    )?;
    family(
        e,
        "slice_memory_used",
        "Memory the slice's processes hold on the device, contexts included",
        bytes,
        Gauge,
        per_slice(node, |s| Some(s.memory.used)),
    )?;
    family(
        e,
        "slice_memory_frozen",
        "Memory of the slice's processes frozen to the host when idle (CUSLICE_MEMORY_FREEZE_IDLE): \
         back on the device at their next CUDA call, counted against the cap meanwhile",
        bytes,
        Gauge,
        per_slice(node, |s| Some(s.memory.frozen)),
    )?;
    family(
        e,
        "slice_memory_limit",
        "The slice's memory cap on the device (absent: no cap)",
        bytes,
        Gauge,
        per_slice(node, |s| s.memory.limit),
    )?;
    family(
        e,
        "slice_memory_peak",
        "The most the slice held on the device at once",
        bytes,
        Gauge,
        per_slice(node, |s| Some(s.memory.peak)),
    )?;
    family(
        e,
        "slice_memory_spilled",
        "Bytes the slice holds in host memory past its cap (CUSLICE_MEMORY_SPILL; absent: it \
         does not spill)",
        bytes,
        Gauge,
        per_slice(node, |s| s.memory.spill_limit.map(|_| s.memory.spilled)),
    )?;
    family(
        e,
        "slice_memory_spill_limit",
        "The most the slice may hold in host memory past its cap (absent: it does not spill)",
        bytes,
        Gauge,
        per_slice(node, |s| s.memory.spill_limit),
    )?;
    family(
        e,
        "slice_memory_waiting",
        "Allocations of the slice waiting now at its cap for its own frees \
         (CUSLICE_MEMORY_WAIT)",
        None,
        Gauge,
        per_slice(node, |s| Some(s.memory.waiting as u64)),
    )?;
    family(
        e,
        "slice_memory_refusals",
        "Allocations refused because they would cross the cap",
        None,
        Counter,
        per_slice(node, |s| Some(s.memory.refusals)),
    )?;
    let ratio = |p: Option<f64>| p.map(|p| p / 100.0);
    family(
        e,
        "slice_core_request_ratio",
        "The slice's guaranteed share of the device (absent: no request)",
        None,
        Gauge,
        per_slice(node, |s| ratio(s.compute.request_pct)),
    )?;
    family(
        e,
        "slice_core_limit_ratio",
        "The most of the device the slice may use (absent: no limit)",
        None,
        Gauge,
        per_slice(node, |s| ratio(s.compute.limit_pct)),
    )?;
    family(
        e,
        "slice_core_allotted_ratio",
        "The share of the device the slice may use now",
        None,
        Gauge,
        per_slice(node, |s| ratio(Some(s.compute.allotted_pct))),
    )?;
    let mut share = Vec::new();
    for (window, pick) in [
        (
            "1s",
            (|s: &Slice| s.compute.share_1s_pct) as fn(&Slice) -> Option<f64>,
        ),
        ("10s", |s: &Slice| s.compute.share_10s_pct),
    ] {
        for (mut l, v) in per_slice(node, |s| ratio(pick(s))) {
            l.push(("window", window.to_string()));
            share.push((l, v));
        }
    }
    family(
        e,
        "slice_core_share_ratio",
        "Share of the device the slice used over the window",
        None,
        Gauge,
        share,
    )?;
    let meter: Vec<(Labels, u64)> = per_slice(node, |s| s.compute.metered_by.clone())
        .into_iter()
        .map(|(mut l, by)| {
            l.push(("metered_by", esc(&by)));
            (l, 1)
        })
        .collect();
    family(
        e,
        "slice_core_meter",
        "What measures the slice's device time: its turns' spans (turns); for a slice of an \
         earlier release, the driver's per-process samples (samples), the library timing \
         launches itself (self-timing), or launch estimates alone (estimates); absent until the \
         slice has launched work",
        None,
        Gauge,
        meter,
    )?;
    family(
        e,
        "slice_device",
        "Device time the slice used, as its meters measured it (slice_core_meter says how)",
        seconds,
        Counter,
        per_slice(node, |s| Some(s.compute.device_seconds)),
    )?;
    family(
        e,
        "slice_throttled",
        "Time the slice's launching threads were held back to keep it to its share",
        seconds,
        Counter,
        per_slice(node, |s| Some(s.compute.throttled_seconds)),
    )?;
    family(
        e,
        "slice_processes",
        "Running processes of the slice",
        None,
        Gauge,
        per_slice(node, |s| {
            Some(s.processes.iter().filter(|p| p.alive).count() as u64)
        }),
    )?;
    if let Some(f) = &node.findings {
        let violations = f
            .findings
            .iter()
            .map(|x| {
                let mut labels = vec![
                    ("uuid", esc(&x.uuid)),
                    ("slice", esc(&x.slice)),
                    ("name", esc(x.name.as_deref().unwrap_or_default())),
                    ("check", esc(&x.kind)),
                ];
                // The findings name the slice; its place in Kubernetes is the hook's record.
                let k = node
                    .devices
                    .iter()
                    .flat_map(|d| &d.slices)
                    .find(|s| s.slice == x.slice)
                    .and_then(|s| s.kubernetes.as_ref());
                labels.extend(kubernetes_labels(k));
                (labels, 1u64)
            })
            .collect();
        family(
            e,
            "slice_violation",
            "1 while the node agent finds the slice over its cap (check=memory) or core limit \
             (compute) by the driver's count, its ledger not matching the driver (ledger), \
             its files written past their end (files), or its claims on the compute board \
             saying what no process of it posts (claims)",
            None,
            Gauge,
            violations,
        )?;
        family(
            e,
            "agent_actions",
            "What the node agent did to hold slices to their caps and limits: processes \
             killed over a memory cap, cgroup freezes over a core limit",
            None,
            Counter,
            vec![
                (vec![("action", "kill".to_string())], f.actions.kills),
                (vec![("action", "freeze".to_string())], f.actions.freezes),
            ],
        )?;
        family(
            e,
            "agent_frozen",
            "Time slices' cgroups were held frozen by the node agent",
            seconds,
            Counter,
            vec![(Vec::new(), f.actions.frozen_seconds)],
        )?;
    }
    family(
        e,
        "problems",
        "Things that could not be read (cuslice status lists them)",
        None,
        Gauge,
        vec![(Vec::new(), node.problems.len() as u64)],
    )?;
    Ok(())
}

/// A registry whose one collector reads `sources` at every scrape.
pub fn registry(sources: Sources) -> Registry {
    let mut r = Registry::with_prefix("cuslice");
    r.register_collector(Box::new(NodeCollector { sources }));
    r
}

/// One scrape's text.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, kubernetes: Option<Kubernetes>) -> Slice {
        let mut s = crate::view::idle_slice("c1");
        s.kind = "container";
        s.name = Some(name.into());
        s.kubernetes = kubernetes;
        s
    }

    /// The exposition of `node` alone, as a scrape would get it.
    fn scrape(node: Node) -> String {
        #[derive(Debug)]
        struct Fixed(Node);
        impl Collector for Fixed {
            fn encode(&self, enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
                encode_node(&self.0, enc)
            }
        }
        let mut r = Registry::with_prefix("cuslice");
        r.register_collector(Box::new(Fixed(node)));
        encode(&r)
    }

    #[test]
    fn each_slice_says_which_meter_measures_its_device_time() {
        let mut slices = Vec::new();
        for (dir, by) in [
            ("/s/samples", Some("samples")),
            ("/s/timed", Some("self-timing")),
            ("/s/estimated", Some("estimates")),
            ("/s/idle", None),
        ] {
            let mut s = crate::view::idle_slice(dir);
            s.compute.metered_by = by.map(str::to_owned);
            slices.push(s);
        }
        let node = Node {
            time: 0.0,
            devices: vec![Device {
                uuid: "GPU-1".into(),
                name: None,
                memory_total: None,
                memory_used: None,
                slices,
            }],
            problems: Vec::new(),
            findings: None,
            agent: crate::view::Agent {
                socket: String::new(),
                running: false,
                note: None,
            },
        };
        let text = scrape(node);
        let meter: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("cuslice_slice_core_meter{"))
            .collect();
        let labels = |slice: &str, by: &str| {
            format!(
                "cuslice_slice_core_meter{{uuid=\"GPU-1\",slice=\"{slice}\",kind=\"standalone\",\
                 name=\"\",namespace=\"\",pod=\"\",container=\"\",claim=\"\",\
                 metered_by=\"{by}\"}} 1"
            )
        };
        assert_eq!(
            meter,
            [
                labels("/s/samples", "samples"),
                labels("/s/timed", "self-timing"),
                labels("/s/estimated", "estimates"),
            ],
            "{text}"
        );
        assert!(
            text.contains("# TYPE cuslice_slice_core_meter gauge\n"),
            "{text}"
        );
        // The slice's other series carry no meter label: their identity does not change when
        // the meter does.
        assert!(
            text.lines()
                .filter(|l| l.contains("metered_by="))
                .all(|l| l.starts_with("cuslice_slice_core_meter{")),
            "{text}"
        );
    }

    #[test]
    fn label_values_are_escaped_so_no_value_forges_a_label() {
        assert_eq!(esc(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(esc("x\ny"), r"x\ny");
        let d = Device {
            uuid: "GPU-1".into(),
            name: None,
            memory_total: None,
            memory_used: None,
            slices: Vec::new(),
        };
        let k = Kubernetes {
            namespace: "team-a".into(),
            pod: r#"job",namespace="kube-system"#.into(),
            container: "trainer".into(),
            pod_uid: None,
            claim: Some("job-gpu".into()),
        };
        let labels = slice_labels(&d, &slice("p/c", Some(k)));
        let get = |n: &str| labels.iter().find(|(k, _)| *k == n).unwrap().1.clone();
        assert_eq!(get("namespace"), "team-a");
        assert_eq!(get("pod"), r#"job\",namespace=\"kube-system"#);
        assert_eq!(get("container"), "trainer");
        assert_eq!(get("claim"), "job-gpu");
        // A slice that is not a pod's container: the same labels, empty.
        let labels = slice_labels(&d, &slice("web", None));
        for n in ["namespace", "pod", "container", "claim"] {
            assert_eq!(labels.iter().find(|(k, _)| *k == n).unwrap().1, "", "{n}");
        }
    }
}
