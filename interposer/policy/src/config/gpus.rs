//! Which GPU a per-device setting (`CUSLICE_MEMORY_LIMIT_<i>`) is for, in a container: the hook
//! records the container's GPUs as its engine gave them ([`Gpus`], three lines of the hook file),
//! and the library and the node agent both turn that record into the container's numbering
//! ([`Gpus::order`]) with the NVML they have. So a setting stays with its GPU whatever
//! `CUDA_VISIBLE_DEVICES` a process of the container sets for itself: a process that lists the
//! container's GPUs in another order sees them at other ordinals, but each GPU keeps its own
//! cap. Pure.

use super::names::{CUDA_VISIBLE, DEVICE_NODES, NVIDIA_VISIBLE};
use super::parse::Entry;
use super::{Config, ConfigError, Limits};

/// The container's GPUs as its engine gave them, recorded by the hook where the container's
/// settings name devices by ordinal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gpus {
    /// `CUSLICE_DEVICE_NODES`: the minor numbers of the GPU device nodes in the container's spec
    /// (`/dev/nvidia<N>`, as CDI, the DRA plugin and `--device` give them). Where set, these
    /// are the container's GPUs, in NVML's order (PCI bus order).
    pub nodes: Option<Vec<u32>>,
    /// `CUSLICE_NVIDIA_VISIBLE_DEVICES`: the container's `NVIDIA_VISIBLE_DEVICES` (the NVIDIA
    /// runtime's list of the node's GPUs, by index or UUID), where it had no device nodes.
    pub nvidia_visible: Option<String>,
    /// `CUSLICE_CUDA_VISIBLE_DEVICES`: the container's own `CUDA_VISIBLE_DEVICES`, where it had
    /// no device nodes.
    pub cuda_visible: Option<String>,
}

/// One GPU as NVML lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlGpu {
    /// `GPU-...`.
    pub uuid: String,
    /// N of its device node `/dev/nvidiaN`, where NVML says.
    pub minor: Option<u32>,
}

/// Entries of a `*_VISIBLE_DEVICES` list as CUDA reads them: a comma-separated list of device
/// indices or UUID prefixes (`GPU-...`), cut at the first entry that names no device (or names
/// one again). None: the variable puts no restriction (unset, or NVIDIA's `all`).
pub fn visible(var: Option<&str>, among: &[String]) -> Option<Vec<String>> {
    let v = var?.trim();
    if v == "all" {
        return None;
    }
    let mut out = Vec::new();
    if v.is_empty() || v == "none" || v == "void" {
        return Some(out);
    }
    for e in v.split(',').map(str::trim) {
        let found = match e.parse::<usize>() {
            Ok(i) => among.get(i).cloned(),
            Err(_) if e.starts_with("GPU-") => {
                let mut m = among.iter().filter(|u| u.starts_with(e));
                match (m.next(), m.next()) {
                    (Some(u), None) => Some(u.clone()),
                    _ => None,
                }
            }
            Err(_) => None,
        };
        match found {
            Some(u) if !out.contains(&u) => out.push(u),
            _ => break,
        }
    }
    Some(out)
}

impl Gpus {
    /// The record for a container: from the device paths of its spec (`linux.devices`) and its
    /// environment. `None` where neither names a GPU (every GPU NVML lists is the container's,
    /// in NVML's order).
    pub fn of_container<'a>(
        env: impl IntoIterator<Item = &'a str>,
        device_paths: impl IntoIterator<Item = &'a str>,
    ) -> Option<Gpus> {
        let nodes: Vec<u32> = device_paths
            .into_iter()
            .filter_map(|p| p.strip_prefix("/dev/nvidia"))
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .filter_map(|n| n.parse().ok())
            .collect();
        if !nodes.is_empty() {
            // The engine gave these GPUs and no others: the container's environment (which a
            // pod's author writes) does not move a setting to another of them.
            return Some(Gpus {
                nodes: Some(nodes),
                ..Gpus::default()
            });
        }
        let (mut nvidia, mut cuda) = (None, None);
        for e in env {
            if let Some(v) = e.strip_prefix("NVIDIA_VISIBLE_DEVICES=") {
                nvidia = Some(v.trim().to_string());
            } else if let Some(v) = e.strip_prefix("CUDA_VISIBLE_DEVICES=") {
                cuda = Some(v.trim().to_string());
            }
        }
        (nvidia.is_some() || cuda.is_some()).then_some(Gpus {
            nodes: None,
            nvidia_visible: nvidia,
            cuda_visible: cuda,
        })
    }

    /// The hook file's lines for this record (`NAME`, `VALUE`).
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(n) = &self.nodes {
            let list: Vec<String> = n.iter().map(u32::to_string).collect();
            out.push((DEVICE_NODES, list.join(",")));
        }
        if let Some(v) = &self.nvidia_visible {
            out.push((NVIDIA_VISIBLE, v.clone()));
        }
        if let Some(v) = &self.cuda_visible {
            out.push((CUDA_VISIBLE, v.clone()));
        }
        out
    }

    /// The container's GPUs (UUIDs) in the order per-device settings number them, from `nvml`
    /// (NVML's GPUs, in its order). `every_gpu`: `nvml` lists every GPU of the node (the node
    /// agent, on the host), so `NVIDIA_VISIBLE_DEVICES` still has to pick the container's; a
    /// process in the container has NVML list only the container's GPUs already.
    pub fn order(&self, nvml: &[NvmlGpu], every_gpu: bool) -> Vec<String> {
        let all: Vec<String> = nvml.iter().map(|g| g.uuid.clone()).collect();
        let container = match &self.nodes {
            Some(minors) => nvml
                .iter()
                .filter(|g| g.minor.is_some_and(|m| minors.contains(&m)))
                .map(|g| g.uuid.clone())
                .collect(),
            None if every_gpu => visible(self.nvidia_visible.as_deref(), &all).unwrap_or(all),
            None => all,
        };
        visible(self.cuda_visible.as_deref(), &container).unwrap_or(container)
    }
}

/// Parses `CUSLICE_DEVICE_NODES`: minor numbers, comma-separated.
pub(super) fn parse_nodes(entry: &Entry) -> Result<Vec<u32>, ConfigError> {
    let list: Option<Vec<u32>> = entry
        .value
        .split(',')
        .map(|m| m.trim().parse().ok())
        .collect();
    list.filter(|l| !l.is_empty()).ok_or_else(|| {
        entry.error(
            "is not a list of device minor numbers",
            format!("{DEVICE_NODES}=0,1"),
        )
    })
}

impl Config {
    /// The container's GPUs as the hook recorded them, where it did.
    pub fn gpus(&self) -> Option<&Gpus> {
        self.gpus.as_ref()
    }

    /// The limits for the GPU `uuid`, where per-device settings number the GPUs as `order` does
    /// (the container's GPUs, [`Gpus::order`]). A GPU that is not among them gets the strictest
    /// limits the configuration sets for any device: a process cannot reach a laxer one by
    /// listing the container's GPUs in another order.
    pub fn limits_of_gpu(&self, uuid: &str, order: &[String]) -> Limits {
        let ordinals = self.mentioned_ordinals();
        if ordinals.is_empty() {
            return self.limits(0);
        }
        if let Some(i) = order.iter().position(|u| u == uuid) {
            return self.limits(i as u32);
        }
        self.strictest()
    }

    /// The strictest limits the configuration sets for any device, each limit on its own.
    pub fn strictest(&self) -> Limits {
        let max = self.mentioned_ordinals().last().copied().unwrap_or(0);
        (0..=max + 1)
            .map(|o| self.limits(o))
            .reduce(strictest)
            .unwrap_or_default()
    }
}

/// The stricter of two sets of limits, each limit on its own (a set limit is stricter than none).
pub fn strictest(a: Limits, b: Limits) -> Limits {
    fn min_some<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, None) => a,
            (None, b) => b,
        }
    }
    Limits {
        memory: min_some(a.memory, b.memory),
        core_limit: min_some(a.core_limit, b.core_limit),
        core_request: min_some(a.core_request, b.core_request),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn nvml(n: u32) -> Vec<NvmlGpu> {
        (0..n)
            .map(|i| NvmlGpu {
                uuid: format!("GPU-{i}{i}{i}"),
                minor: Some(i),
            })
            .collect()
    }

    fn uuids(l: &[u32]) -> Vec<String> {
        l.iter().map(|i| format!("GPU-{i}{i}{i}")).collect()
    }

    #[test]
    fn device_nodes_are_the_containers_gpus_in_nvmls_order_whatever_its_environment_says() {
        let g = Gpus::of_container(
            ["CUDA_VISIBLE_DEVICES=1,0", "NVIDIA_VISIBLE_DEVICES=all"],
            [
                "/dev/nvidiactl",
                "/dev/nvidia3",
                "/dev/nvidia-uvm",
                "/dev/nvidia1",
            ],
        )
        .unwrap();
        assert_eq!(g.nodes, Some(vec![3, 1]));
        assert_eq!((g.nvidia_visible, g.cuda_visible), (None, None));
        let g = Gpus {
            nodes: Some(vec![3, 1]),
            ..Gpus::default()
        };
        assert_eq!(g.order(&nvml(4), true), uuids(&[1, 3]));
        // In the container NVML lists only its GPUs; the same two.
        let mine: Vec<NvmlGpu> = nvml(4)
            .into_iter()
            .filter(|g| g.minor != Some(0) && g.minor != Some(2))
            .collect();
        assert_eq!(g.order(&mine, false), uuids(&[1, 3]));
    }

    #[test]
    fn without_device_nodes_the_containers_environment_numbers_them() {
        assert_eq!(Gpus::of_container(["PATH=/bin"], ["/dev/null"]), None);
        let g = Gpus::of_container(["CUDA_VISIBLE_DEVICES=3,1"], []).unwrap();
        assert_eq!(g.order(&nvml(4), true), uuids(&[3, 1]));
        assert_eq!(g.order(&nvml(4), false), uuids(&[3, 1]));
        // NVIDIA's list picks the node's GPUs on the host; the container's NVML shows only those.
        let g = Gpus::of_container(["NVIDIA_VISIBLE_DEVICES=2,3", "CUDA_VISIBLE_DEVICES=1"], [])
            .unwrap();
        assert_eq!(g.order(&nvml(4), true), uuids(&[3]));
        assert_eq!(g.order(&nvml(4)[2..], false), uuids(&[3]));
        // By UUID prefix; cut at the first entry that names no GPU, as CUDA does.
        let g = Gpus {
            cuda_visible: Some("GPU-222,x,1".into()),
            ..Gpus::default()
        };
        assert_eq!(g.order(&nvml(4), true), uuids(&[2]));
    }

    #[test]
    fn the_record_goes_through_the_hook_file() {
        let g = Gpus::of_container(
            ["NVIDIA_VISIBLE_DEVICES=GPU-1", "CUDA_VISIBLE_DEVICES=0"],
            [],
        )
        .unwrap();
        let lines: Vec<(&str, String)> = g.entries();
        let text = super::super::hook_file::write(
            "c",
            lines
                .iter()
                .map(|(n, v)| (*n, v.as_str()))
                .chain([("CUSLICE_MEMORY_LIMIT_0", "1GiB")]),
            "/run/cuslice/node",
        );
        let c = Config::from_hook_file(&text, std::iter::empty::<(&str, &str)>()).unwrap();
        assert_eq!(c.gpus(), Some(&g));
        let n = Gpus {
            nodes: Some(vec![1, 0]),
            ..Gpus::default()
        };
        let text = format!("CUSLICE_DEVICE_NODES={}\n", n.entries()[0].1);
        let c = Config::from_hook_file(&text, std::iter::empty::<(&str, &str)>()).unwrap();
        assert_eq!(c.gpus(), Some(&n));
        let e = Config::from_hook_file(
            "CUSLICE_DEVICE_NODES=1,x\n",
            std::iter::empty::<(&str, &str)>(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("minor numbers"), "{e}");
    }

    #[test]
    fn each_gpu_keeps_its_own_limits_and_any_other_gets_the_strictest() {
        let c = Config::from_vars([
            ("CUSLICE_MEMORY_LIMIT_0", "8GiB"),
            ("CUSLICE_MEMORY_LIMIT_1", "2GiB"),
            ("CUSLICE_CORE_LIMIT", "50"),
        ])
        .unwrap();
        let order = uuids(&[3, 1]);
        let mem = |u: &str| c.limits_of_gpu(u, &order).memory;
        assert_eq!(mem("GPU-333"), Some(8 * GIB));
        assert_eq!(mem("GPU-111"), Some(2 * GIB));
        assert_eq!(mem("GPU-000"), Some(2 * GIB));
        assert_eq!(c.limits_of_gpu("GPU-000", &order).core_limit, Some(50));
        // Without per-device settings every GPU gets the same.
        let c = Config::from_vars([("CUSLICE_MEMORY_LIMIT", "1GiB")]).unwrap();
        assert_eq!(c.limits_of_gpu("GPU-000", &[]).memory, Some(GIB));
    }
}
