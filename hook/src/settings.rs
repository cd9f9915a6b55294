//! What a container asks of cuslice, read from its spec (the `process.env` entries and the
//! `cuslice.io/` annotations), validated with the interposer's own rules, and turned into the
//! slice configuration file the interposer reads inside the container. Pure: no I/O.

use std::collections::BTreeMap;

use std::path::Path;

use cuslice_policy::config::{self, Config, hook_file};
use cuslice_policy::echo::{cut, quoted};
use cuslice_policy::grant::{Grant, Origin};

/// Annotations under this prefix are settings too: `cuslice.io/memory-limit` is
/// `CUSLICE_MEMORY_LIMIT`, `cuslice.io/core-limit-1` is `CUSLICE_CORE_LIMIT_1`,
/// `cuslice.io/priority` is `CUSLICE_PRIORITY`, `cuslice.io/memory-wait` is
/// `CUSLICE_MEMORY_WAIT`.
pub const ANNOTATION_PREFIX: &str = "cuslice.io/";

/// Where the slice's directory, the node's compute board and the library appear inside the
/// container.
pub use cuslice_state::paths::{CONTAINER_DIR, CONTAINER_LIBRARY, CONTAINER_NODE_DIR};

/// A container's validated settings: `NAME=VALUE` pairs, sorted by name (the GPUs the hook
/// records for the container last), and the configuration they make, as read from its spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub entries: Vec<(String, String)>,
    config: Config,
}

/// The variable an annotation stands for: `cuslice.io/memory-limit-1` -> `CUSLICE_MEMORY_LIMIT_1`.
pub fn annotation_variable(key: &str) -> Option<String> {
    let rest = key.strip_prefix(ANNOTATION_PREFIX)?;
    Some(format!(
        "CUSLICE_{}",
        rest.to_ascii_uppercase().replace('-', "_")
    ))
}

/// Whether the container mentions cuslice at all. Cheap: no validation, so a container without
/// settings costs the hook nothing more than reading its spec.
pub fn mentioned<'a>(
    env: impl IntoIterator<Item = &'a str>,
    annotations: impl IntoIterator<Item = &'a str>,
) -> bool {
    env.into_iter()
        .any(|e| config::is_setting(e.split_once('=').map_or(e, |(n, _)| n)))
        || annotations
            .into_iter()
            .any(|k| k.starts_with(ANNOTATION_PREFIX))
}

/// Reads and validates the settings. `Ok(None)`: the container does not mention cuslice. `Err`:
/// one line naming the variable (or annotation), the value and an example that would work.
pub fn read<'a>(
    env: impl IntoIterator<Item = &'a str>,
    annotations: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Option<Settings>, String> {
    // NAME -> (value, where it came from)
    let mut found: BTreeMap<String, (String, Option<String>)> = BTreeMap::new();
    let mut any = false;
    for e in env {
        let (name, value) = e.split_once('=').unwrap_or((e, ""));
        if !config::is_setting(name) {
            continue;
        }
        any = true;
        if config::is_placement(name) {
            // The hook decides where the slice's state lives; the container cannot.
            continue;
        }
        // The same name twice with different values: which one a program reads depends on the
        // program (getenv takes the first, a shell's export the last), so neither is guessed.
        if let Some((first, _)) = found.get(name)
            && first.trim() != value.trim()
        {
            let name = cut(name);
            return Err(format!(
                "{name} is set twice in the container's environment, to {} and to {}; set it \
                 once (e.g. {name}={})",
                quoted(first),
                quoted(value),
                cut(value)
            ));
        }
        found.insert(name.to_string(), (value.to_string(), None));
    }
    for (key, value) in annotations {
        let Some(name) = annotation_variable(key) else {
            continue;
        };
        any = true;
        if config::is_placement(&name) {
            return Err(format!(
                "annotation {} is not accepted: the hook decides where a container's slice state \
                 lives and records its GPUs itself; remove it",
                cut(key)
            ));
        }
        match found.get(&name) {
            Some((v, None)) if v.trim() != value.trim() => {
                let (name, key) = (cut(&name), cut(key));
                return Err(format!(
                    "{name}={} in the environment and annotation {key}={} disagree; set one of them (e.g. {name}={})",
                    quoted(v),
                    quoted(value),
                    cut(value)
                ));
            }
            _ => {
                found.insert(name, (value.to_string(), Some(key.to_string())));
            }
        }
    }
    if !any {
        return Ok(None);
    }
    let config = Config::from_vars(found.iter().map(|(n, (v, _))| (n.as_str(), v.as_str())))
        .map_err(|e| match found.get(&e.variable) {
            Some((_, Some(key))) => format!("annotation {}: {e}", cut(key)),
            _ => e.to_string(),
        })?;
    Ok(Some(Settings {
        entries: found.into_iter().map(|(n, (v, _))| (n, v)).collect(),
        config,
    }))
}

/// How many GPUs the container's processes see, where its spec says: the NVIDIA device nodes
/// (`/dev/nvidia0`, `/dev/nvidia1`, ...) in `linux.devices` (as CDI specs and the NVIDIA
/// container toolkit's CDI mode give them), and no more than `CUDA_VISIBLE_DEVICES` in its
/// environment names. With the words for a message (`the container has`). `None` where the spec
/// does not say (the toolkit's legacy hook adds the nodes itself, later): then the library
/// checks at CUDA's initialisation, by the devices the process sees.
pub fn visible_gpus<'a>(
    env: impl IntoIterator<Item = &'a str>,
    device_paths: impl IntoIterator<Item = &'a str>,
) -> Option<(u32, String)> {
    let nodes = device_paths
        .into_iter()
        .filter(|p| {
            p.strip_prefix("/dev/nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count() as u32;
    let visible = env
        .into_iter()
        .filter_map(|e| e.strip_prefix("CUDA_VISIBLE_DEVICES="))
        .last()
        .map(|v| {
            // CUDA reads the list up to its first empty entry.
            let n = v.split(',').take_while(|d| !d.trim().is_empty()).count() as u32;
            (n, v)
        });
    match (nodes, visible) {
        (0, None) => None,
        (n, None) => Some((n, "the container has".to_string())),
        (n, Some((v, list))) if n == 0 || v <= n => {
            Some((v, format!("CUDA_VISIBLE_DEVICES={} shows", quoted(list))))
        }
        (n, Some(_)) => Some((n, "the container has".to_string())),
    }
}

impl Settings {
    /// Refuses a per-device setting for a device the container does not have: `gpus` devices,
    /// as [`visible_gpus`] counts them (`seen`: its words). One line naming the variable, the
    /// value and an example.
    pub fn check_devices(&self, gpus: u32, seen: &str) -> Result<(), String> {
        self.config
            .check_device_count(gpus, seen)
            .map_err(|e| e.to_string())
    }

    /// Where the settings name devices by ordinal, records the container's GPUs as its spec
    /// gives them (device nodes, else its `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES`;
    /// [`cuslice_policy::config::gpus`]) among them, for the hook file: the library and the
    /// node agent number the container's GPUs by it, so a process that lists them in another
    /// order for itself does not move a GPU's setting to another GPU.
    pub fn record_gpus<'a>(
        &mut self,
        env: impl IntoIterator<Item = &'a str>,
        device_paths: impl IntoIterator<Item = &'a str>,
    ) {
        if self.config.mentioned_ordinals().is_empty() {
            return;
        }
        if let Some(gpus) = cuslice_policy::config::gpus::Gpus::of_container(env, device_paths) {
            for (name, value) in gpus.entries() {
                self.entries.push((name.to_string(), value));
            }
            // The record is valid (the policy's own lines), and the grant counts the
            // container's devices by it.
            if let Ok(c) =
                Config::from_vars(self.entries.iter().map(|(n, v)| (n.as_str(), v.as_str())))
            {
                self.config = c;
            }
        }
    }

    /// What the container may claim on any device of the node's compute board: its largest core
    /// request and limit, and its priority.
    pub fn grant(&self, container: &str, state_root: &Path) -> Grant {
        Grant::from_config(
            &self.config,
            Origin::Hook {
                id: container.to_string(),
                root: state_root.to_path_buf(),
            },
        )
    }

    /// The slice configuration file (`/run/cuslice/slice/config` in the container): the only
    /// source of limits for the processes inside, whatever their environment says.
    pub fn config_file(&self, container: &str) -> String {
        hook_file::write(
            container,
            self.entries.iter().map(|(n, v)| (n.as_str(), v.as_str())),
            CONTAINER_NODE_DIR,
        )
    }
}

/// The most of an image's `/etc/ld.so.preload` the hook reads: 64 KiB, thousands of library
/// paths. A larger file stops the container (a 4 GiB one once took the hook 8 GB of memory).
pub const PRELOAD_MAX: u64 = 64 << 10;

/// The longest library name kept from the image's file: PATH_MAX.
const PRELOAD_NAME_MAX: usize = 4096;

/// The library names the dynamic loader reads from an image's `/etc/ld.so.preload`, as glibc
/// parses the file (Ref: glibc elf/rtld.c, dl_main): the text ends at its first NUL byte (the
/// loader's string functions stop there), `#` starts a comment that runs to the end of the
/// line, and names are separated by spaces, tabs, newlines and `:`. Of those only the
/// well-formed names are kept: UTF-8 without control characters (a `\r` is not a separator to
/// the loader, so `a.so\r` names no file), at most 4096 bytes, and not the interposer (it comes
/// first anyway). In the file's order; no de-duplication (the loader loads a library once).
pub fn preload_entries(image: &[u8]) -> Vec<&str> {
    let text = image.split(|&b| b == 0).next().unwrap_or_default();
    let mut names = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        let line = line.split(|&b| b == b'#').next().unwrap_or_default();
        for name in line.split(|&b| matches!(b, b' ' | b'\t' | b':')) {
            if name.is_empty() || name.len() > PRELOAD_NAME_MAX {
                continue;
            }
            let Ok(name) = std::str::from_utf8(name) else {
                continue;
            };
            if !name.chars().any(char::is_control) && name != CONTAINER_LIBRARY {
                names.push(name);
            }
        }
    }
    names
}

/// `/etc/ld.so.preload` as the container will see it: the interposer on the first line, then
/// the image's own well-formed entries ([`preload_entries`]), one per line. Whatever the image's
/// file holds, the loader reads the interposer first.
pub fn preload_file(image: Option<&[u8]>) -> String {
    let mut out = format!("{CONTAINER_LIBRARY}\n");
    for name in preload_entries(image.unwrap_or_default()) {
        out.push_str(name);
        out.push('\n');
    }
    out
}

/// The most bytes kept of a name taken from an annotation or the hostname: a Kubernetes name is
/// at most 253 (a pod; namespaces and containers at most 63), and these values reach every
/// scrape of the node's metrics.
pub const NAME_MAX: usize = 253;

/// A name as the node tools show it and label metrics with: control characters (a newline,
/// an escape sequence for a terminal, a NUL) dropped, surrounding spaces trimmed, cut at
/// [`NAME_MAX`] bytes on a character boundary; `None` when nothing is left. Annotations are
/// written by whoever creates the pod, so they are treated as the tenant's data.
pub fn clean_name(value: &str) -> Option<String> {
    let mut out = String::new();
    for c in value.chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > NAME_MAX {
            break;
        }
        out.push(c);
    }
    let out = out.trim();
    (!out.is_empty()).then(|| out.to_string())
}

/// Where a container belongs in Kubernetes: part of the hook's record, so defined with it.
pub use cuslice_state::host::Kubernetes;

/// The annotations each engine sets on a pod's containers: (namespace, pod, container, pod uid).
/// containerd's CRI (Ref: containerd `pkg/cri/annotations/annotations.go`, `SandboxNamespace`,
/// `SandboxName`, `ContainerName`, `SandboxUID`), then CRI-O, which passes the kubelet's
/// container labels (Ref: kubernetes `pkg/kubelet/types/labels.go`) as annotations.
const KUBERNETES_ANNOTATIONS: [[&str; 4]; 2] = [
    [
        "io.kubernetes.cri.sandbox-namespace",
        "io.kubernetes.cri.sandbox-name",
        "io.kubernetes.cri.container-name",
        "io.kubernetes.cri.sandbox-uid",
    ],
    [
        "io.kubernetes.pod.namespace",
        "io.kubernetes.pod.name",
        "io.kubernetes.container.name",
        "io.kubernetes.pod.uid",
    ],
];

/// The container's place in Kubernetes, where an engine's annotations name at least its
/// container (each value as [`clean_name`] leaves it; a missing namespace or pod is empty).
/// containerd's names win over CRI-O's. `claim` is left for the caller (the DRA plugin's
/// container index).
pub fn kubernetes(annotations: &[(&str, &str)]) -> Option<Kubernetes> {
    let get = |k: &str| {
        annotations
            .iter()
            .find(|(key, _)| *key == k)
            .and_then(|(_, v)| clean_name(v))
    };
    KUBERNETES_ANNOTATIONS
        .iter()
        .find_map(|[namespace, pod, container, uid]| {
            Some(Kubernetes {
                container: get(container)?,
                namespace: get(namespace).unwrap_or_default(),
                pod: get(pod).unwrap_or_default(),
                pod_uid: get(uid),
                claim: None,
            })
        })
}

/// What people call a container, for `cuslice status` and `cuslice set NAME`: `pod/container`
/// where Kubernetes (through containerd or CRI-O) names it, else nerdctl's name, else the name
/// Docker or Podman keeps for it (`engine`, from [`crate::names`]), else the id where someone
/// chose it (`ctr run IMAGE web`, `runc run web`), else the hostname unless it is only the id's
/// prefix (Docker's and Podman's default). Each as [`clean_name`] leaves it.
pub fn display_name(
    id: &str,
    engine: Option<&str>,
    hostname: Option<&str>,
    annotations: &[(&str, &str)],
) -> Option<String> {
    if let Some(k) = kubernetes(annotations) {
        return Some(if k.pod.is_empty() {
            k.container
        } else {
            format!("{}/{}", k.pod, k.container)
        });
    }
    if let Some(n) = annotations
        .iter()
        .find(|(key, _)| *key == "nerdctl/name")
        .and_then(|(_, v)| clean_name(v))
    {
        return Some(n);
    }
    if let Some(n) = engine.and_then(clean_name) {
        return Some(n);
    }
    if chosen_id(id) {
        return clean_name(id);
    }
    hostname
        .and_then(clean_name)
        .filter(|h| !id.starts_with(h.as_str()))
}

/// Whether a container id is a name someone chose (`ctr run IMAGE web`, `runc run web`) rather
/// than one an engine made up (64 hex digits for Docker, Podman, containerd's CRI and CRI-O).
fn chosen_id(id: &str) -> bool {
    !(id.len() >= 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_env(env: &[&str]) -> Result<Option<Settings>, String> {
        read(env.iter().copied(), [])
    }

    #[test]
    fn no_setting_means_untouched() {
        assert_eq!(read_env(&["PATH=/bin", "HOME=/root"]), Ok(None));
        assert!(!mentioned(
            ["PATH=/bin", "CUDA_VISIBLE_DEVICES=0"],
            ["io.kubernetes.x"]
        ));
        assert!(mentioned(["CUSLICE_MEMORY_LIMIT=1GiB"], []));
        assert!(mentioned(["CUDA_DEVICE_MEMORY_LIMIT=1g"], []));
        assert!(mentioned([], ["cuslice.io/core-limit"]));
    }

    #[test]
    fn a_containers_gpus_are_recorded_where_its_settings_name_devices_and_never_taken_from_it() {
        let env = [
            "CUSLICE_MEMORY_LIMIT_1=2GiB",
            "CUSLICE_DEVICE_NODES=0",
            "CUDA_VISIBLE_DEVICES=1,0",
        ];
        let mut s = read(env, []).unwrap().unwrap();
        assert!(!s.entries.iter().any(|(n, _)| n == "CUSLICE_DEVICE_NODES"));
        // Before the record, device 0's cap is not known (none); after it, the container has
        // two devices, and the grant's memory cap is the larger of theirs once both have one.
        assert_eq!(s.grant("c", Path::new("/run/cuslice")).memory, None);
        s.record_gpus(env, ["/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia1"]);
        let text = s.config_file("c");
        assert!(text.contains("CUSLICE_DEVICE_NODES=3,1\n"), "{text}");
        assert!(!text.contains("VISIBLE"), "{text}");
        assert_eq!(s.grant("c", Path::new("/run/cuslice")).memory, None);
        let both = ["CUSLICE_MEMORY_LIMIT_0=1GiB", "CUSLICE_MEMORY_LIMIT_1=2GiB"];
        let mut s = read(both, []).unwrap().unwrap();
        s.record_gpus(both, ["/dev/nvidia3", "/dev/nvidia1"]);
        assert_eq!(
            s.grant("c", Path::new("/run/cuslice")).memory,
            Some(2 << 30)
        );
        // Without device nodes, the container's own lists.
        let mut s = read(env, []).unwrap().unwrap();
        s.record_gpus(env, ["/dev/null"]);
        let text = s.config_file("c");
        assert!(
            text.contains("CUSLICE_CUDA_VISIBLE_DEVICES=1,0\n"),
            "{text}"
        );
        // Without per-device settings nothing is recorded.
        let env = ["CUSLICE_MEMORY_LIMIT=2GiB", "CUDA_VISIBLE_DEVICES=1,0"];
        let mut s = read(env, []).unwrap().unwrap();
        s.record_gpus(env, ["/dev/nvidia1"]);
        assert!(!s.config_file("c").contains("CUSLICE_DEVICE"));
        let e = read([], [("cuslice.io/device-nodes", "0")]).unwrap_err();
        assert!(e.contains("not accepted"), "{e}");
    }

    #[test]
    fn settings_become_the_config_file() {
        let s = read_env(&[
            "PATH=/bin",
            "CUSLICE_MEMORY_LIMIT=1GiB",
            "CUSLICE_CORE_LIMIT=30",
        ])
        .unwrap()
        .unwrap();
        let text = s.config_file("abc");
        assert!(text.contains("\nCUSLICE_CORE_LIMIT=30\nCUSLICE_MEMORY_LIMIT=1GiB\n"));
        assert!(text.ends_with("CUSLICE_NODE_DIR=/run/cuslice/node\n"));
        // The interposer reads it back to the same limits.
        let c = Config::from_hook_file(&text, std::iter::empty::<(&str, &str)>()).unwrap();
        assert_eq!(c.limits(0).memory, Some(1 << 30));
        assert_eq!(c.limits(0).core_limit, Some(30));
        assert_eq!(
            c.node_dir.as_deref(),
            Some(std::path::Path::new("/run/cuslice/node"))
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = read_env(&["CUSLICE_MEMORY_LIMIT=12XB"]).unwrap_err();
        assert!(e.starts_with("CUSLICE_MEMORY_LIMIT=\"12XB\" "), "{e}");
        assert!(e.contains("CUSLICE_MEMORY_LIMIT=4GiB"), "{e}");
        let e = read_env(&["CUSLICE_CORE_LIMIT=-5"]).unwrap_err();
        assert!(e.starts_with("CUSLICE_CORE_LIMIT=\"-5\""), "{e}");
        let e = read_env(&["CUSLICE_MEMORY_LIMT=1GiB"]).unwrap_err();
        assert!(e.contains("CUSLICE_MEMORY_LIMT"), "{e}");
    }

    #[test]
    fn a_name_set_twice_with_different_values_is_refused() {
        let e = read_env(&[
            "CUSLICE_CORE_LIMIT=30",
            "PATH=/bin",
            "CUSLICE_CORE_LIMIT=60",
        ])
        .unwrap_err();
        assert_eq!(
            e,
            "CUSLICE_CORE_LIMIT is set twice in the container's environment, to \"30\" and to \
             \"60\"; set it once (e.g. CUSLICE_CORE_LIMIT=60)"
        );
        // The same value twice says one thing.
        let s = read_env(&["CUSLICE_CORE_LIMIT=30", "CUSLICE_CORE_LIMIT=30"])
            .unwrap()
            .unwrap();
        assert_eq!(s.entries, [("CUSLICE_CORE_LIMIT".into(), "30".into())]);
    }

    #[test]
    fn near_misses_and_decimal_units_are_refused_by_the_hook() {
        let e = read_env(&["cuslice_memory_limit=1GiB"]).unwrap_err();
        assert!(
            e.starts_with("cuslice_memory_limit=\"1GiB\" is not a cuslice variable"),
            "{e}"
        );
        assert!(e.ends_with("write e.g. CUSLICE_MEMORY_LIMIT=1GiB"), "{e}");
        assert!(mentioned(["CUSLCE_CORE_LIMIT=30"], []));
        let e = read_env(&["CUSLICE_MEMORY_LIMIT=1.5GB"]).unwrap_err();
        assert!(e.contains("is ambiguous"), "{e}");
        assert!(e.contains("write e.g. CUSLICE_MEMORY_LIMIT=1.5GiB"), "{e}");
    }

    #[test]
    fn a_setting_for_a_gpu_the_container_lacks_is_refused() {
        let nodes = ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"];
        assert_eq!(
            visible_gpus([], nodes),
            Some((1, "the container has".to_string()))
        );
        assert_eq!(visible_gpus(["PATH=/bin"], ["/dev/null"]), None);
        assert_eq!(
            visible_gpus(["CUDA_VISIBLE_DEVICES=3,1"], []),
            Some((2, "CUDA_VISIBLE_DEVICES=\"3,1\" shows".to_string()))
        );
        assert_eq!(
            visible_gpus(
                ["CUDA_VISIBLE_DEVICES=0,,1"],
                ["/dev/nvidia0", "/dev/nvidia1"]
            )
            .unwrap()
            .0,
            1
        );
        let s = read_env(&["CUSLICE_MEMORY_LIMIT_1=1GiB"]).unwrap().unwrap();
        let (gpus, seen) = visible_gpus([], nodes).unwrap();
        assert_eq!(
            s.check_devices(gpus, &seen).unwrap_err(),
            "CUSLICE_MEMORY_LIMIT_1=\"1GiB\" names device 1, but the container has 1 CUDA device \
             (device 0), so it would apply to none; write e.g. CUSLICE_MEMORY_LIMIT_0=1GiB \
             (device 0) or CUSLICE_MEMORY_LIMIT=1GiB (every device)"
        );
        assert_eq!(s.check_devices(2, "the container has"), Ok(()));
    }

    #[test]
    fn a_memory_limit_above_1_pib_is_refused_as_an_annotation_too() {
        let e = read([], [("cuslice.io/memory-limit", "18446744073709551615")]).unwrap_err();
        assert!(
            e.starts_with(
                "annotation cuslice.io/memory-limit: CUSLICE_MEMORY_LIMIT=\"18446744073709551615\" \
                 is too large: a memory limit is at most 1 PiB"
            ),
            "{e}"
        );
        assert!(read([], [("cuslice.io/memory-limit", "1PiB")]).is_ok());
    }

    #[test]
    fn long_values_and_keys_are_echoed_cut_short() {
        let long = "9".repeat(100_000);
        let env = format!("CUSLICE_CORE_LIMIT={long}");
        let e = read([env.as_str()], [("cuslice.io/core-limit", "40")]).unwrap_err();
        assert!(e.len() < 600, "{} bytes", e.len());
        assert!(e.contains("(100000 bytes)"), "{e}");
        let e = read(
            ["CUSLICE_CORE_LIMIT=40"],
            [("cuslice.io/core-limit", long.as_str())],
        )
        .unwrap_err();
        assert!(e.len() < 600, "{} bytes", e.len());
        let key = format!("cuslice.io/state-dir{long}");
        let e = read([], [(key.as_str(), "/x")]).unwrap_err();
        assert!(e.len() < 600, "{} bytes", e.len());
        let key = format!("cuslice.io/memory-limit-{long}");
        let e = read([], [(key.as_str(), "1GiB")]).unwrap_err();
        assert!(e.len() < 600, "{} bytes", e.len());
    }

    #[test]
    fn placement_is_the_hooks() {
        let s = read_env(&["CUSLICE_STATE_DIR=/tmp/x", "CUSLICE_MEMORY_LIMIT=2GiB"])
            .unwrap()
            .unwrap();
        assert_eq!(
            s.entries,
            vec![("CUSLICE_MEMORY_LIMIT".to_string(), "2GiB".to_string())]
        );
        let e = read([], [("cuslice.io/state-dir", "/x")]).unwrap_err();
        assert!(e.contains("cuslice.io/state-dir"), "{e}");
    }

    #[test]
    fn what_an_allocation_does_at_the_cap_comes_from_annotations_too() {
        let s = read(
            ["CUSLICE_MEMORY_LIMIT=1GiB"],
            [
                ("cuslice.io/memory-wait", "5s"),
                ("cuslice.io/memory-spill", "2GiB"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            s.entries,
            vec![
                ("CUSLICE_MEMORY_LIMIT".to_string(), "1GiB".to_string()),
                ("CUSLICE_MEMORY_SPILL".to_string(), "2GiB".to_string()),
                ("CUSLICE_MEMORY_WAIT".to_string(), "5s".to_string()),
            ]
        );
        let e = read([], [("cuslice.io/memory-wait", "soon")]).unwrap_err();
        assert!(
            e.starts_with(
                "annotation cuslice.io/memory-wait: CUSLICE_MEMORY_WAIT=\"soon\" is not a \
                 duration"
            ),
            "{e}"
        );
    }

    #[test]
    fn the_freeze_idle_time_comes_from_an_annotation_too() {
        let s = read(
            ["CUSLICE_MEMORY_LIMIT=1GiB"],
            [("cuslice.io/memory-freeze-idle", "10m")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            s.entries,
            vec![
                ("CUSLICE_MEMORY_FREEZE_IDLE".to_string(), "10m".to_string()),
                ("CUSLICE_MEMORY_LIMIT".to_string(), "1GiB".to_string()),
            ]
        );
        let e = read([], [("cuslice.io/memory-freeze-idle", "100ms")]).unwrap_err();
        assert!(
            e.starts_with(
                "annotation cuslice.io/memory-freeze-idle: CUSLICE_MEMORY_FREEZE_IDLE=\"100ms\" \
                 is less than a second"
            ),
            "{e}"
        );
    }

    #[test]
    fn annotations() {
        let s = read(
            ["CUSLICE_CORE_LIMIT=30"],
            [("cuslice.io/memory-limit-1", "3GiB"), ("other", "x")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            s.entries,
            vec![
                ("CUSLICE_CORE_LIMIT".to_string(), "30".to_string()),
                ("CUSLICE_MEMORY_LIMIT_1".to_string(), "3GiB".to_string()),
            ]
        );
        // Agreeing twice is fine; disagreeing is refused, naming both.
        assert!(read(["CUSLICE_CORE_LIMIT=30"], [("cuslice.io/core-limit", "30")]).is_ok());
        let e = read(["CUSLICE_CORE_LIMIT=30"], [("cuslice.io/core-limit", "40")]).unwrap_err();
        assert!(
            e.contains("CUSLICE_CORE_LIMIT") && e.contains("cuslice.io/core-limit"),
            "{e}"
        );
        let e = read([], [("cuslice.io/memory-limit", "lots")]).unwrap_err();
        assert!(e.starts_with("annotation cuslice.io/memory-limit: "), "{e}");
        // The priority, alone, is a setting; a bad one is refused naming the annotation.
        let s = read([], [("cuslice.io/priority", "high")])
            .unwrap()
            .unwrap();
        assert_eq!(
            s.entries,
            [("CUSLICE_PRIORITY".to_string(), "high".to_string())]
        );
        let e = read([], [("cuslice.io/priority", "urgent")]).unwrap_err();
        assert_eq!(
            e,
            "annotation cuslice.io/priority: CUSLICE_PRIORITY=\"urgent\" is not a priority \
             (high, normal or low); write e.g. CUSLICE_PRIORITY=high"
        );
    }

    #[test]
    fn preload_puts_the_interposer_first_and_keeps_the_images_well_formed_entries() {
        const LIB: &str = "/run/cuslice/lib/libcuslice.so\n";
        assert_eq!(preload_file(None), LIB);
        assert_eq!(preload_file(Some(b"")), LIB);
        for (image, kept) in [
            (&b"/lib/a.so /lib/b.so"[..], &["/lib/a.so", "/lib/b.so"][..]),
            (b"/lib/a.so\n", &["/lib/a.so"]),
            (b"/run/cuslice/lib/libcuslice.so\n", &[]),
            // As the loader reads it: space, tab, newline and ':' separate; '#' to the end of
            // the line is a comment; a name without a newline after it still counts.
            (
                b"# preloads\n/lib/a.so:libb.so\t/lib/c.so # not/this.so\n\n  /lib/d.so",
                &["/lib/a.so", "libb.so", "/lib/c.so", "/lib/d.so"],
            ),
            // One NUL byte, where the loader stops reading: nothing of the image's.
            (b"\0", &[]),
            (b"/lib/a.so\n\0/lib/after.so\n", &["/lib/a.so"]),
            // The loader reads "/lib/a" here, which is well-formed.
            (b"/lib/a\0.so\n", &["/lib/a"]),
            // Control characters, bytes that are not UTF-8, a name longer than PATH_MAX.
            (
                b"/lib/a.so\r\n/lib/\x01b.so /lib/\xffc.so /lib/d.so",
                &["/lib/d.so"],
            ),
        ] {
            assert_eq!(
                preload_entries(image),
                kept,
                "{:?}",
                String::from_utf8_lossy(image)
            );
            let file = preload_file(Some(image));
            assert!(file.starts_with(LIB), "{file:?}");
            assert_eq!(file.lines().skip(1).collect::<Vec<_>>(), kept, "{file:?}");
        }
        let long = format!("/{}.so /lib/e.so", "x".repeat(4096));
        assert_eq!(preload_entries(long.as_bytes()), ["/lib/e.so"]);
    }

    #[test]
    fn a_full_size_preload_file_is_parsed_quickly() {
        let image: Vec<u8> = b"/lib/x.so\n"
            .iter()
            .copied()
            .cycle()
            .take(PRELOAD_MAX as usize)
            .collect();
        let start = std::time::Instant::now();
        let file = preload_file(Some(&image));
        assert!(start.elapsed() < std::time::Duration::from_millis(50));
        // Whole lines, and the last one cut short (still a name).
        assert_eq!(file.lines().count(), 1 + image.len().div_ceil(10));
    }

    #[test]
    fn display_names_come_from_kubernetes_nerdctl_or_a_hostname_that_is_not_the_id() {
        let id = "e4f4267d7ae7aaaae4f4267d7ae7aaaae4f4267d7ae7aaaae4f4267d7ae7aaaa";
        let k8s = [
            ("io.kubernetes.cri.container-name", "trainer"),
            ("io.kubernetes.cri.sandbox-name", "job-0"),
        ];
        assert_eq!(
            display_name(id, None, Some("job-0"), &k8s).as_deref(),
            Some("job-0/trainer")
        );
        let crio = [("io.kubernetes.container.name", "server")];
        assert_eq!(
            display_name(id, None, None, &crio).as_deref(),
            Some("server")
        );
        let nerdctl = [("nerdctl/name", "web")];
        assert_eq!(
            display_name(id, None, Some("e4f4267d7ae7"), &nerdctl).as_deref(),
            Some("web")
        );
        assert_eq!(display_name(id, None, Some("e4f4267d7ae7"), &[]), None);
        // An id someone chose (ctr, runc) is the name; one an engine made up is none.
        assert_eq!(display_name("web", None, None, &[]).as_deref(), Some("web"));
        let made_up = "e4f4267d7ae7aaaae4f4267d7ae7aaaae4f4267d7ae7aaaae4f4267d7ae7aaaa";
        assert_eq!(display_name(made_up, None, None, &[]), None);
        assert_eq!(
            display_name(id, None, Some("demo-a"), &[]).as_deref(),
            Some("demo-a")
        );
        assert_eq!(
            display_name("web", None, Some("runc"), &[]).as_deref(),
            Some("web")
        );
        assert_eq!(display_name(id, None, Some(""), &[]), None);
        // The name Docker or Podman keeps wins over the hostname.
        assert_eq!(
            display_name(id, Some("web"), Some("e4f4267d7ae7"), &[]).as_deref(),
            Some("web")
        );
        assert_eq!(
            display_name(id, Some("web"), None, &k8s).as_deref(),
            Some("job-0/trainer")
        );
    }

    #[test]
    fn kubernetes_names_come_from_containerd_or_cri_o_annotations() {
        let containerd = [
            ("io.kubernetes.cri.sandbox-namespace", "team-a"),
            ("io.kubernetes.cri.sandbox-name", "job-0"),
            ("io.kubernetes.cri.container-name", "trainer"),
            ("io.kubernetes.cri.sandbox-uid", "0b7c-11"),
            ("io.kubernetes.cri.container-type", "container"),
        ];
        let k = kubernetes(&containerd).unwrap();
        assert_eq!(
            (k.namespace.as_str(), k.pod.as_str(), k.container.as_str()),
            ("team-a", "job-0", "trainer")
        );
        assert_eq!(k.pod_uid.as_deref(), Some("0b7c-11"));
        assert_eq!(k.claim, None);
        let crio = [
            ("io.kubernetes.pod.namespace", "default"),
            ("io.kubernetes.pod.name", "server-7d9"),
            ("io.kubernetes.container.name", "server"),
        ];
        let k = kubernetes(&crio).unwrap();
        assert_eq!(
            (k.namespace.as_str(), k.pod.as_str(), k.container.as_str()),
            ("default", "server-7d9", "server")
        );
        assert_eq!(k.pod_uid, None);
        // containerd's names win where both are given.
        let both: Vec<_> = crio.iter().chain(&containerd).copied().collect();
        assert_eq!(kubernetes(&both).unwrap().pod, "job-0");
        // No container name, or only an empty one: not a pod's container.
        assert_eq!(kubernetes(&[("io.kubernetes.cri.sandbox-name", "p")]), None);
        assert_eq!(
            kubernetes(&[("io.kubernetes.cri.container-name", " \n")]),
            None
        );
        assert_eq!(kubernetes(&[("nerdctl/name", "web")]), None);
        // A container name alone: the rest empty.
        let k = kubernetes(&[("io.kubernetes.container.name", "c")]).unwrap();
        assert_eq!((k.namespace.as_str(), k.pod.as_str()), ("", ""));
    }

    #[test]
    fn names_from_annotations_are_cleaned_and_bounded() {
        assert_eq!(clean_name("job-0").as_deref(), Some("job-0"));
        // Control characters (a forged metrics line, a terminal escape, a NUL) are dropped.
        assert_eq!(
            clean_name("evil\n# TYPE x gauge\r\u{1b}[2J\0\u{7f}\u{85}").as_deref(),
            Some("evil# TYPE x gauge[2J")
        );
        assert_eq!(clean_name("  padded\t").as_deref(), Some("padded"));
        assert_eq!(clean_name(""), None);
        assert_eq!(clean_name("\n\t\u{1b}"), None);
        // Quotes and backslashes are kept: the exporter's encoder escapes them.
        assert_eq!(clean_name(r#"a"b\c"#).as_deref(), Some(r#"a"b\c"#));
        // Bounded, on a character boundary.
        let long = "x".repeat(100_000);
        assert_eq!(clean_name(&long).unwrap().len(), NAME_MAX);
        let wide = format!("{}é", "x".repeat(NAME_MAX - 1));
        assert_eq!(clean_name(&wide).unwrap(), "x".repeat(NAME_MAX - 1));
        let k = kubernetes(&[
            (
                "io.kubernetes.cri.sandbox-namespace",
                "ns\u{1b}]0;pwned\u{7}",
            ),
            ("io.kubernetes.cri.sandbox-name", &long),
            ("io.kubernetes.cri.container-name", "c\nd"),
        ])
        .unwrap();
        assert_eq!(k.namespace, "ns]0;pwned");
        assert_eq!(k.pod.len(), NAME_MAX);
        assert_eq!(k.container, "cd");
        let hex = "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789";
        assert_eq!(
            display_name(hex, None, Some("web\n"), &[]).as_deref(),
            Some("web")
        );
        assert_eq!(display_name(hex, None, Some("abc\n"), &[]), None);
    }
}
