//! The Kubernetes manifests in install/kubernetes/ (installed with `kubectl apply -k`) and the
//! examples in install/kubernetes/examples/: no cluster runs them here, so this checks what can be
//! checked without one. The files are parsed as YAML (by Python's yaml module, which
//! tests/tools/ensure-tools installs; PyYAML reads YAML 1.1 as kubectl's parser does) and:
//!
//! - every object is read as k8s-openapi's type for its kind (Kubernetes 1.34) and written back,
//!   and must come back as it was: a field the API does not have (k8s-openapi skips those when
//!   reading) is refused, with its path;
//! - the kustomization lists every manifest in the directory and no missing file, and
//!   `kubectl kustomize` (where kubectl is installed) renders exactly those objects;
//! - the DaemonSet: its init container runs an install command this `cuslice` accepts (run
//!   against a scratch root as a dry run); its agent runs `cuslice agent` with a command line this
//!   `cuslice` accepts, sees the host's pids, cgroups and the hook's state root, and serves
//!   /metrics on the port its Prometheus annotations name; its DRA plugin runs a command line
//!   `cuslice-dra-plugin` accepts (where that binary is built), with the kubelet's plugin and
//!   registry directories and the CDI directory at their host paths and the host's / read-only at
//!   its host root (--host-root);
//! - RBAC grants the plugin what it needs (PLUGIN_NEEDS, the one list of it) and nothing more, to
//!   the ServiceAccount the DaemonSet runs as;
//! - the examples name the DeviceClass, ask only for capacities the plugin publishes, carry config
//!   the plugin accepts, and ask for what their comments say; the example without DRA sets
//!   CUSLICE_* values the interposer accepts, sized to fit its time-slicing replicas;
//! - the RuntimeClass names the default runtime.
//!
//! One concern (the Kubernetes files, checked without a cluster), kept in one file: the helpers
//! that read the YAML as the API's types serve every check here.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, PodSpec, ServiceAccount};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceRequest, ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_cuslice");

/// The driver name and DeviceClass name (fixed for the project).
const DRIVER: &str = "gpu.cuslice.io";

/// What the DRA plugin does in the API server, as (API group, resource, verbs): the ClusterRole
/// must grant all of it and nothing else.
const PLUGIN_NEEDS: &[(&str, &str, &[&str])] = &[
    // Its node's ResourceSlice: read (the pool generation at start), applied server-side (which
    // creates it the first time).
    (
        "resource.k8s.io",
        "resourceslices",
        &["get", "create", "patch"],
    ),
    // The claims the kubelet asks it to prepare: allocation, consumed capacity, opaque config.
    ("resource.k8s.io", "resourceclaims", &["get"]),
    // The Node, the ResourceSlice's owner reference.
    ("", "nodes", &["get"]),
    // The pods a claim is reserved for: which of their containers use it (the container index
    // for cuslice-runtime on containerd 1.6).
    ("", "pods", &["get"]),
];

/// `cuslice-dra-plugin`'s options and their defaults (None: no default).
const PLUGIN_FLAGS: &[(&str, Option<&str>)] = &[
    ("--node-name", None),
    (
        "--plugin-dir",
        Some("/var/lib/kubelet/plugins/gpu.cuslice.io"),
    ),
    ("--registry-dir", Some("/var/lib/kubelet/plugins_registry")),
    ("--cdi-dir", Some("/var/run/cdi")),
    ("--driver-root", Some("/")),
    ("--host-root", Some("/")),
    ("--hook", Some("/usr/local/bin/cuslice-hook")),
    ("--library", Some("/usr/local/lib/cuslice/libcuslice.so")),
    ("--kubeconfig", None),
    (
        "--container-index",
        Some("/var/lib/kubelet/plugins/gpu.cuslice.io/containers"),
    ),
    ("--no-container-index", None),
    ("--rescan", Some("30")),
];

/// The capacities the plugin publishes for each GPU: all a claim can ask for.
const CAPACITIES: &[&str] = &["memory", "cores"];

const GIB: u128 = 1 << 30;

fn kube_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kubernetes")
}

fn manifest_path(name: &str) -> PathBuf {
    kube_dir().join(name)
}

fn manifest(name: &str) -> String {
    let p = manifest_path(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The `.yaml` files of `dir` (relative to install/kubernetes), sorted, as `dir/NAME`.
fn yaml_files(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(kube_dir().join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml"))
        .map(|n| {
            if dir.is_empty() {
                n
            } else {
                format!("{dir}/{n}")
            }
        })
        .collect();
    names.sort();
    names
}

/// The manifests `kubectl apply -k` installs: every YAML file beside the kustomization.
fn manifest_files() -> Vec<String> {
    yaml_files("")
        .into_iter()
        .filter(|n| n != "kustomization.yaml")
        .collect()
}

fn example_files() -> Vec<String> {
    yaml_files("examples")
}

/// The documents of a YAML text, as JSON; None (with a skip line) where Python has no yaml
/// module outside CI.
fn parse_yaml(what: &str, text: &str) -> Option<Vec<Value>> {
    let script = "import sys, json, yaml\n\
                  docs = [d for d in yaml.safe_load_all(sys.stdin) if d is not None]\n\
                  print(json.dumps(docs))\n";
    let child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: no python3 ({e}); tests/tools/ensure-tools installs it");
            return None;
        }
        Err(e) => panic!("python3: {e}"),
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to python3");
    let out = child.wait_with_output().expect("python3");
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if err.contains("No module named 'yaml'") && std::env::var_os("CI").is_none() {
            eprintln!(
                "skipped: python3 has no yaml module; tests/tools/ensure-tools installs PyYAML"
            );
            return None;
        }
        panic!("{what} is not valid YAML: {err}");
    }
    Some(serde_json::from_slice(&out.stdout).expect("JSON from python"))
}

/// The documents of a file under install/kubernetes, as JSON objects with apiVersion and kind.
fn documents(name: &str) -> Option<Vec<Value>> {
    let text = manifest(name);
    assert!(!text.contains('\t'), "{name}: YAML takes no tabs");
    let docs = parse_yaml(name, &text)?;
    for d in &docs {
        assert!(
            d["apiVersion"].is_string() && d["kind"].is_string(),
            "{name}: every document has apiVersion and kind: {d}"
        );
    }
    Some(docs)
}

/// Reads `doc` as the API type `T` and writes it back: what does not come back as it was is a
/// field `T` does not have (k8s-openapi's reader skips unknown fields, as the API server would
/// drop them) or a value it reads differently. Each such place is named by its path.
fn read_strict<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut problems = Vec::new();
    compare("", doc, &back, &mut problems);
    if problems.is_empty() {
        Ok(typed)
    } else {
        Err(problems.join("; "))
    }
}

fn compare(path: &str, input: &Value, back: &Value, problems: &mut Vec<String>) {
    match (input, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(w) => compare(&p, v, w, problems),
                    None if v.is_null() => problems.push(format!("{p}: empty (leave it out)")),
                    None => problems.push(format!("{p}: unknown field")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                compare(&format!("{path}[{i}]"), v, w, problems);
            }
        }
        _ if input == back => {}
        // A quantity written as a number (`nvidia.com/gpu: 1`) is read as its text, as the API
        // server reads it.
        (Value::Number(n), Value::String(t)) if n.to_string() == *t => {}
        _ => problems.push(format!("{path}: {input} reads as {back}")),
    }
}

/// Checks one document against the type of its kind.
fn check_typed(doc: &Value) -> Result<(), String> {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    match (api_version, kind) {
        ("v1", "Namespace") => read_strict::<Namespace>(doc).map(drop),
        ("v1", "ServiceAccount") => read_strict::<ServiceAccount>(doc).map(drop),
        ("v1", "ConfigMap") => read_strict::<ConfigMap>(doc).map(drop),
        ("v1", "Pod") => read_strict::<Pod>(doc).map(drop),
        ("apps/v1", "DaemonSet") => read_strict::<DaemonSet>(doc).map(drop),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
            read_strict::<ClusterRole>(doc).map(drop)
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            read_strict::<ClusterRoleBinding>(doc).map(drop)
        }
        ("resource.k8s.io/v1", "DeviceClass") => read_strict::<DeviceClass>(doc).map(drop),
        ("resource.k8s.io/v1", "ResourceClaim") => read_strict::<ResourceClaim>(doc).map(drop),
        ("resource.k8s.io/v1", "ResourceClaimTemplate") => {
            read_strict::<ResourceClaimTemplate>(doc).map(drop)
        }
        ("node.k8s.io/v1", "RuntimeClass") => read_strict::<RuntimeClass>(doc).map(drop),
        _ => Err(format!(
            "no type is checked for {api_version} {kind}; add it to check_typed"
        )),
    }
}

/// The one document of `kind` in `docs`, read as `T`.
fn one<T: DeserializeOwned + Serialize>(name: &str, docs: &[Value], kind: &str) -> T {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "{name}: one {kind}, found {}", found.len());
    read_strict(found[0]).unwrap_or_else(|e| panic!("{name}: {kind}: {e}"))
}

fn all<T: DeserializeOwned + Serialize>(name: &str, docs: &[Value], kind: &str) -> Vec<T> {
    docs.iter()
        .filter(|d| d["kind"] == kind)
        .map(|d| read_strict(d).unwrap_or_else(|e| panic!("{name}: {kind}: {e}")))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| {
            s.as_str()
                .unwrap_or_else(|| panic!("not a string: {s}"))
                .to_owned()
        })
        .collect()
}

/// The container (or init container) named `name` in a pod spec.
fn container<'a>(pod: &'a Value, list: &str, name: &str) -> &'a Value {
    pod[list]
        .as_array()
        .unwrap_or_else(|| panic!("no {list} in {pod}"))
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {list} entry named {name:?}"))
}

/// `container`'s mount of the hostPath volume of `host_path`.
fn volume_mount<'a>(pod: &Value, container: &'a Value, host_path: &str) -> Option<&'a Value> {
    let volume = pod["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["hostPath"]["path"] == host_path)?;
    container["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == volume["name"])
}

/// Where `container` mounts the host path `host_path` (through a hostPath volume).
fn mount_of(pod: &Value, container: &Value, host_path: &str) -> Option<(String, bool)> {
    let m = volume_mount(pod, container, host_path)?;
    Some((
        m["mountPath"].as_str()?.to_owned(),
        m["readOnly"].as_bool().unwrap_or(false),
    ))
}

/// The `mountPropagation` of `container`'s mount of the hostPath volume of `host_path`.
fn propagation_of(pod: &Value, container: &Value, host_path: &str) -> Option<String> {
    Some(
        volume_mount(pod, container, host_path)?["mountPropagation"]
            .as_str()?
            .to_owned(),
    )
}

/// The host path `container_path` is inside `container`, through the hostPath mount that covers
/// it most closely, and whether that mount is read-only; None if no hostPath mount covers it.
fn host_path_of(pod: &Value, container: &Value, container_path: &str) -> Option<(PathBuf, bool)> {
    let target = Path::new(container_path);
    let mut best: Option<(usize, PathBuf, bool)> = None;
    for m in container["volumeMounts"].as_array()? {
        let mount = Path::new(m["mountPath"].as_str()?);
        let Ok(rest) = target.strip_prefix(mount) else {
            continue;
        };
        let volume = pod["volumes"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == m["name"])?;
        let Some(host) = volume["hostPath"]["path"].as_str() else {
            continue;
        };
        let depth = mount.components().count();
        if best.as_ref().is_none_or(|(d, _, _)| depth > *d) {
            let ro = m["readOnly"].as_bool().unwrap_or(false);
            best = Some((depth, Path::new(host).join(rest), ro));
        }
    }
    best.map(|(_, p, ro)| (p, ro))
}

fn daemonset() -> Option<Value> {
    let docs = documents("daemonset.yaml")?;
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(kinds, ["DaemonSet"]);
    Some(docs[0].clone())
}

/// A Kubernetes quantity as a number: `8Gi`, `1Ti`, `512Mi`, `30`, `2G`.
fn quantity(q: &str) -> u128 {
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (digits, suffix) = q.split_at(split);
    let n: u128 = digits
        .parse()
        .unwrap_or_else(|_| panic!("{q:?}: not a whole quantity"));
    let unit: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => panic!("{q:?}: unknown quantity suffix {suffix:?}"),
    };
    n * unit
}

/// The driver a DeviceClass selects, from its one CEL selector `device.driver == "NAME"`.
fn class_driver(class: &DeviceClass) -> String {
    let selectors = class.spec.selectors.as_deref().unwrap_or_default();
    assert_eq!(selectors.len(), 1, "one selector: {selectors:?}");
    let cel = &selectors[0]
        .cel
        .as_ref()
        .expect("a CEL selector")
        .expression;
    cel.strip_prefix("device.driver == \"")
        .and_then(|r| r.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{cel:?} is not device.driver == \"NAME\""))
        .to_owned()
}

#[test]
fn every_manifest_and_example_is_a_kubernetes_1_34_object_with_no_unknown_field() {
    let files: Vec<String> = manifest_files()
        .into_iter()
        .chain(example_files())
        .collect();
    assert!(files.len() >= 9, "{files:?}");
    let mut problems = Vec::new();
    for f in &files {
        let Some(docs) = documents(f) else { return };
        for (i, d) in docs.iter().enumerate() {
            if let Err(e) = check_typed(d) {
                problems.push(format!(
                    "{f}, document {} ({} {}): {e}",
                    i + 1,
                    d["kind"].as_str().unwrap_or_default(),
                    d["metadata"]["name"].as_str().unwrap_or_default()
                ));
            }
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn kustomization_lists_every_manifest_and_kubectl_renders_them() {
    let Some(k) = documents("kustomization.yaml") else {
        return;
    };
    assert_eq!(k.len(), 1);
    let k = &k[0];
    assert_eq!(k["apiVersion"], "kustomize.config.k8s.io/v1beta1");
    assert_eq!(k["kind"], "Kustomization");
    let known = ["apiVersion", "kind", "resources", "images"];
    for key in k.as_object().expect("a mapping").keys() {
        assert!(
            known.contains(&key.as_str()),
            "kustomization.yaml: {key:?} is not checked here (known: {known:?})"
        );
    }
    let listed = strings(&k["resources"]);
    let unique: BTreeSet<&String> = listed.iter().collect();
    assert_eq!(unique.len(), listed.len(), "listed twice: {listed:?}");
    let missing: Vec<&String> = listed
        .iter()
        .filter(|f| !manifest_path(f).is_file())
        .collect();
    assert!(missing.is_empty(), "listed but missing: {missing:?}");
    let on_disk: BTreeSet<String> = manifest_files().into_iter().collect();
    let listed: BTreeSet<String> = listed.into_iter().collect();
    let left_out: Vec<&String> = on_disk.difference(&listed).collect();
    assert!(
        left_out.is_empty(),
        "in install/kubernetes but not in kustomization.yaml's resources: {left_out:?}"
    );

    // Every `images` entry names the image the DaemonSet's containers use, so the user's image
    // replaces it; the result is what every container runs.
    let images = k["images"].as_array().expect("images");
    assert_eq!(images.len(), 1);
    let (name, new) = (
        images[0]["name"].as_str().expect("name"),
        format!(
            "{}:{}",
            images[0]["newName"].as_str().expect("newName"),
            images[0]["newTag"].as_str().expect("newTag")
        ),
    );
    let Some(ds) = daemonset() else { return };
    let pod = &ds["spec"]["template"]["spec"];
    for list in ["initContainers", "containers"] {
        for c in pod[list].as_array().expect("containers") {
            let image = c["image"].as_str().expect("image");
            assert_eq!(
                image.split_once(':').map(|(n, _)| n),
                Some(name),
                "{}: kustomization.yaml's images entry {name:?} does not name {image:?}",
                c["name"]
            );
        }
    }

    // kubectl's own kustomize renders exactly the objects of the listed files.
    let out = match Command::new("kubectl")
        .arg("kustomize")
        .arg(kube_dir())
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "skipped: kubectl kustomize ({e}): install kubectl to render the kustomization"
            );
            return;
        }
    };
    assert!(
        out.status.success(),
        "kubectl kustomize: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = parse_yaml(
        "kubectl kustomize's output",
        &String::from_utf8_lossy(&out.stdout),
    )
    .expect("python3 with yaml parsed the files above");
    let id = |d: &Value| {
        format!(
            "{} {} {}/{}",
            d["apiVersion"].as_str().unwrap_or_default(),
            d["kind"].as_str().unwrap_or_default(),
            d["metadata"]["namespace"].as_str().unwrap_or_default(),
            d["metadata"]["name"].as_str().unwrap_or_default()
        )
    };
    let got: BTreeSet<String> = rendered.iter().map(id).collect();
    let mut want = BTreeSet::new();
    for f in &on_disk {
        for d in documents(f).expect("parsed above") {
            want.insert(id(&d));
        }
    }
    assert_eq!(got, want);
    let ds = rendered
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("DaemonSet");
    for list in ["initContainers", "containers"] {
        for c in ds["spec"]["template"]["spec"][list]
            .as_array()
            .expect("list")
        {
            assert_eq!(c["image"], new.as_str(), "{}", c["name"]);
        }
    }
}

#[test]
fn daemonset_installs_with_a_valid_command_and_no_agent_unit() {
    let ds = manifest("daemonset.yaml");
    assert!(!ds.contains('\t'), "YAML takes no tabs");
    let Some(ds) = daemonset() else { return };
    assert_eq!(ds["metadata"]["namespace"], "cuslice-system");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["nvidia.com/gpu.present"], "true");
    let install = container(pod, "initContainers", "install");
    let args = strings(&install["args"]);
    assert_eq!(
        args,
        [
            "install",
            "--root",
            "/host",
            "--engine",
            "containerd",
            "--no-agent"
        ]
    );
    assert_eq!(install["securityContext"]["privileged"], true);
    assert_eq!(
        mount_of(pod, install, "/"),
        Some(("/host".to_owned(), false))
    );

    // Run it against a scratch root (in place of the host's /, where systemd runs) as a dry run.
    let dir = tempfile::tempdir().expect("tempdir");
    let from = dir.path().join("from");
    std::fs::create_dir_all(&from).expect("mkdir");
    for f in [
        "cuslice-hook",
        "cuslice-runtime",
        "cuslice",
        "libcuslice.so",
        "libcuslice_core.so",
    ] {
        std::fs::write(from.join(f), f).expect("write");
    }
    let host = dir.path().join("host");
    std::fs::create_dir_all(host.join("run/systemd/system")).expect("mkdir");
    let args: Vec<String> = args
        .into_iter()
        .map(|a| {
            if a == "/host" {
                host.display().to_string()
            } else {
                a
            }
        })
        .collect();
    let out = Command::new(BIN)
        .args(&args)
        .arg("--from")
        .arg(&from)
        .arg("--dry-run")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("conf.d/cuslice.toml"), "{text}");
    assert!(
        !text.contains("cuslice-agent.service"),
        "the agent runs in the pod, not as a unit on the host: {text}"
    );
}

#[test]
fn daemonset_runs_the_agent_with_the_hosts_pids_cgroups_and_state() {
    let Some(ds) = daemonset() else { return };
    let template = &ds["spec"]["template"];
    let pod = &template["spec"];
    let containers = pod["containers"].as_array().expect("containers");
    let names: Vec<&str> = containers
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["agent", "dra-plugin"],
        "two long-running containers"
    );
    let agent = container(pod, "containers", "agent");
    assert!(
        agent["command"].is_null(),
        "the image's entry point is cuslice"
    );
    let args = strings(&agent["args"]);
    assert_eq!(args[0], "agent");
    assert!(
        args.windows(2).any(|w| w == ["--listen", ":9400"]),
        "{args:?}"
    );
    // It stops what it finds (docs/agent.md, "Which mode").
    assert!(
        args.windows(2).any(|w| w == ["--enforce", "stop"]),
        "{args:?}"
    );
    // This cuslice accepts the command line (--help after it: parsed, then help, exit 0).
    let out = Command::new(BIN)
        .args(&args)
        .arg("--help")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "cuslice {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The host's processes, as the agent must see them.
    assert_eq!(pod["hostPID"], true);
    assert_eq!(agent["securityContext"]["privileged"], true);
    assert_eq!(
        mount_of(pod, agent, "/run/cuslice"),
        Some(("/run/cuslice".to_owned(), false)),
        "the hook's state root, writable (the agent's socket goes there)"
    );
    assert_eq!(
        mount_of(pod, agent, "/dev/shm/cuslice"),
        Some(("/dev/shm/cuslice".to_owned(), true)),
        "the compute board, read-only (the agent checks every slice's claims)"
    );
    // Slices' own spaces and places are mounts the hook makes on the host after the pod
    // started: without propagation from the host the agent would see empty directories.
    for path in ["/run/cuslice", "/dev/shm/cuslice"] {
        assert_eq!(
            propagation_of(pod, agent, path),
            Some("HostToContainer".to_owned()),
            "{path}"
        );
    }
    assert_eq!(
        mount_of(pod, agent, "/sys/fs/cgroup"),
        Some(("/sys/fs/cgroup".to_owned(), false)),
        "the host's cgroups, writable (freezing a slice)"
    );
    assert!(
        mount_of(pod, agent, "/").is_none(),
        "only the install step sees the host's /"
    );

    // Prometheus: the annotated port is the one the agent listens on.
    let ann = &template["metadata"]["annotations"];
    assert_eq!(ann["prometheus.io/scrape"], "true");
    assert_eq!(ann["prometheus.io/port"], "9400");
    assert_eq!(ann["prometheus.io/path"], "/metrics");
    let port = &agent["ports"][0];
    assert_eq!(port["containerPort"], 9400);
    assert_eq!(port["name"], "metrics");
    for c in containers {
        let all = format!("{}{}", c["command"], c["args"]);
        assert!(!all.contains("sleep"), "nothing just sleeps: {all}");
    }
}

#[test]
fn runtimeclass_names_the_default_runtime() {
    let rc = manifest("runtimeclass.yaml");
    assert!(!rc.contains('\t'));
    let Some(docs) = documents("runtimeclass.yaml") else {
        return;
    };
    assert_eq!(docs.len(), 1);
    let rc = &docs[0];
    assert_eq!(rc["apiVersion"], "node.k8s.io/v1");
    assert_eq!(rc["kind"], "RuntimeClass");
    assert_eq!(rc["metadata"]["name"], "cuslice");
    assert_eq!(rc["handler"], "cuslice");
    assert_eq!(
        rc["scheduling"]["nodeSelector"]["nvidia.com/gpu.present"],
        "true"
    );
}

/// The plugin's options as the DaemonSet passes them (`--flag value` or `--flag=value`), with
/// every other option at its default.
fn plugin_options(args: &[String]) -> BTreeMap<&'static str, Option<String>> {
    let mut given: BTreeMap<String, String> = BTreeMap::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, value) = match a.split_once('=') {
            Some((f, v)) => (f.to_owned(), v.to_owned()),
            None => (
                a.clone(),
                it.next()
                    .unwrap_or_else(|| panic!("{a} without a value in {args:?}"))
                    .clone(),
            ),
        };
        assert!(
            PLUGIN_FLAGS.iter().any(|(f, _)| *f == flag),
            "{flag} is not an option of cuslice-dra-plugin"
        );
        assert!(given.insert(flag.clone(), value).is_none(), "{flag} twice");
    }
    PLUGIN_FLAGS
        .iter()
        .map(|(f, default)| {
            (
                *f,
                given
                    .get(*f)
                    .cloned()
                    .or_else(|| default.map(str::to_owned)),
            )
        })
        .collect()
}

#[test]
fn daemonset_runs_the_dra_plugin_with_the_kubelet_dirs_cdi_dir_and_the_hosts_root() {
    let Some(ds) = daemonset() else { return };
    let pod = &ds["spec"]["template"]["spec"];
    let plugin = container(pod, "containers", "dra-plugin");
    let command = strings(&plugin["command"]);
    assert_eq!(command, ["/opt/cuslice/cuslice-dra-plugin"]);
    // The image has it there: the Dockerfile copies it into /opt/cuslice/.
    let dockerfile = manifest("Dockerfile");
    let copy: Vec<&str> = dockerfile
        .lines()
        .find(|l| l.starts_with("COPY "))
        .expect("a COPY line")
        .split_whitespace()
        .collect();
    assert_eq!(copy.last(), Some(&"/opt/cuslice/"), "{copy:?}");
    assert!(copy.contains(&"cuslice-dra-plugin"), "{copy:?}");
    // `cuslice install` copies the library's loader and its core from there.
    assert!(copy.contains(&"libcuslice.so"), "{copy:?}");
    assert!(copy.contains(&"libcuslice_core.so"), "{copy:?}");
    assert!(
        manifest("README.md").contains("-p cuslice-dra"),
        "README.md's build command builds the plugin"
    );

    let args = strings(&plugin["args"]);
    let opts = plugin_options(&args);
    let opt = |f: &str| opts[f].clone().unwrap_or_else(|| panic!("{f} unset"));

    // The node name comes from the pod's node.
    assert_eq!(opts["--node-name"], None, "NODE_NAME from the downward API");
    let env = plugin["env"].as_array().expect("env");
    let var = |name: &str| env.iter().find(|e| e["name"] == name);
    assert_eq!(
        var("NODE_NAME").expect("NODE_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    // NVML as the agent gets it.
    let agent = container(pod, "containers", "agent");
    for name in ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"] {
        let agents = agent["env"]
            .as_array()
            .expect("agent env")
            .iter()
            .find(|e| e["name"] == name);
        assert!(agents.is_some(), "the agent sets {name}");
        assert_eq!(var(name), agents, "{name} as for the agent");
    }

    // The kubelet connects to the sockets at the paths the plugin registers, and the runtime
    // reads the CDI specs from the host's CDI directory: each is mounted at its own host path,
    // writable.
    // The container index, too: cuslice-runtime reads it on the host, at the same path (its
    // default, cuslice_cdi::DEFAULT_CONTAINER_INDEX).
    assert_eq!(
        opt("--container-index"),
        cuslice_cdi::DEFAULT_CONTAINER_INDEX
    );
    for flag in [
        "--plugin-dir",
        "--registry-dir",
        "--cdi-dir",
        "--container-index",
    ] {
        let dir = opt(flag);
        assert_eq!(
            host_path_of(pod, plugin, &dir),
            Some((PathBuf::from(&dir), false)),
            "{flag} {dir}: the container's path must be the host's, writable"
        );
    }
    assert!(
        opt("--plugin-dir").ends_with(&format!("/{DRIVER}")),
        "the plugin dir is named after the driver: {}",
        opt("--plugin-dir")
    );
    // The host's / read-only at the host root.
    let root = opt("--host-root");
    assert_eq!(
        host_path_of(pod, plugin, &root),
        Some((PathBuf::from("/"), true)),
        "--host-root {root}: the host's /, read-only"
    );
    // The hook and library the CDI specs name are where the install step puts them.
    let install = strings(&container(pod, "initContainers", "install")["args"]);
    let prefix = install
        .windows(2)
        .find(|w| w[0] == "--prefix")
        .map_or("/usr/local".to_owned(), |w| w[1].clone());
    assert_eq!(opt("--hook"), format!("{prefix}/bin/cuslice-hook"));
    assert_eq!(
        opt("--library"),
        format!("{prefix}/lib/cuslice/libcuslice.so")
    );

    // The plugin accepts the command line (--help after it: parsed, then help, exit 0).
    let bin = Path::new(BIN).with_file_name("cuslice-dra-plugin");
    if !bin.exists() {
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../node/dra/Cargo.toml");
        assert!(
            !(crate_dir.exists() && std::env::var_os("CI").is_some()),
            "{} is missing: cargo build --release --workspace builds it",
            bin.display()
        );
        eprintln!(
            "skipped: the command-line check: {} is not built (cargo build --release -p cuslice-dra)",
            bin.display()
        );
        return;
    }
    let out = Command::new(&bin)
        .args(&args)
        .arg("--help")
        .env("NODE_NAME", "node-1")
        .output()
        .expect("run cuslice-dra-plugin");
    assert!(
        out.status.success(),
        "cuslice-dra-plugin {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn rbac_grants_the_plugin_what_it_needs_and_nothing_else() {
    let Some(docs) = documents("rbac.yaml") else {
        return;
    };
    let sa: ServiceAccount = one("rbac.yaml", &docs, "ServiceAccount");
    let role: ClusterRole = one("rbac.yaml", &docs, "ClusterRole");
    let binding: ClusterRoleBinding = one("rbac.yaml", &docs, "ClusterRoleBinding");

    let rules = role.rules.unwrap_or_default();
    let mut granted: BTreeSet<(String, String, String)> = BTreeSet::new();
    for r in &rules {
        assert!(
            r.resource_names.is_none() && r.non_resource_urls.is_none(),
            "{r:?}"
        );
        for g in r.api_groups.as_deref().unwrap_or_default() {
            for res in r.resources.as_deref().unwrap_or_default() {
                for v in &r.verbs {
                    for x in [g, res, v] {
                        assert_ne!(x, "*", "no wildcards: {r:?}");
                    }
                    granted.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    let needed: BTreeSet<(String, String, String)> = PLUGIN_NEEDS
        .iter()
        .flat_map(|(g, res, verbs)| {
            verbs
                .iter()
                .map(move |v| (g.to_string(), res.to_string(), v.to_string()))
        })
        .collect();
    let missing: Vec<_> = needed.difference(&granted).collect();
    assert!(missing.is_empty(), "the ClusterRole lacks {missing:?}");
    let extra: Vec<_> = granted.difference(&needed).collect();
    assert!(
        extra.is_empty(),
        "the ClusterRole grants more than the plugin needs: {extra:?}"
    );

    // Bound to the ServiceAccount the DaemonSet's pods run as, in the namespace that exists.
    let role_name = role.metadata.name.as_deref().expect("role name");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(binding.role_ref.name, role_name);
    let sa_name = sa.metadata.name.as_deref().expect("sa name");
    let sa_ns = sa.metadata.namespace.as_deref().expect("sa namespace");
    let subjects = binding.subjects.unwrap_or_default();
    assert!(
        subjects.iter().any(|s| s.kind == "ServiceAccount"
            && s.name == sa_name
            && s.namespace.as_deref() == Some(sa_ns)),
        "{subjects:?}"
    );
    let Some(ns_docs) = documents("namespace.yaml") else {
        return;
    };
    let ns: Namespace = one("namespace.yaml", &ns_docs, "Namespace");
    assert_eq!(ns.metadata.name.as_deref(), Some(sa_ns));
    let Some(ds) = documents("daemonset.yaml") else {
        return;
    };
    let ds: DaemonSet = one("daemonset.yaml", &ds, "DaemonSet");
    assert_eq!(ds.metadata.namespace.as_deref(), Some(sa_ns));
    let pod = ds.spec.expect("spec").template.spec.expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some(sa_name));
    assert_ne!(pod.automount_service_account_token, Some(false));
}

#[test]
fn deviceclass_selects_the_drivers_devices() {
    let Some(docs) = documents("deviceclass.yaml") else {
        return;
    };
    let class: DeviceClass = one("deviceclass.yaml", &docs, "DeviceClass");
    assert_eq!(class.metadata.name.as_deref(), Some(DRIVER));
    assert_eq!(class_driver(&class), DRIVER);
}

/// Every claim spec (of a ResourceClaim or ResourceClaimTemplate) in `docs`, by object name.
fn claim_specs(name: &str, docs: &[Value]) -> BTreeMap<String, ResourceClaimSpec> {
    let mut specs = BTreeMap::new();
    for t in all::<ResourceClaimTemplate>(name, docs, "ResourceClaimTemplate") {
        specs.insert(t.metadata.name.expect("name"), t.spec.spec);
    }
    for c in all::<ResourceClaim>(name, docs, "ResourceClaim") {
        specs.insert(c.metadata.name.expect("name"), c.spec);
    }
    specs
}

/// The memory (bytes) and cores one request asks for.
fn asks(request: &DeviceRequest) -> (u128, u128) {
    let exact = request.exactly.as_ref().expect("an exact request");
    let capacity = exact
        .capacity
        .as_ref()
        .and_then(|c| c.requests.as_ref())
        .expect("capacity.requests");
    let get = |k: &str| {
        capacity
            .get(k)
            .map(|q| quantity(&q.0))
            .unwrap_or_else(|| panic!("{}: no {k} asked for", request.name))
    };
    (get("memory"), get("cores"))
}

/// The pods of an example with, for each, the claim specs its containers use.
fn pods_and_claims(name: &str, docs: &[Value]) -> Vec<(String, Vec<(String, ResourceClaimSpec)>)> {
    let specs = claim_specs(name, docs);
    all::<Pod>(name, docs, "Pod")
        .into_iter()
        .map(|p| {
            let pod_name = p.metadata.name.expect("pod name");
            let spec: PodSpec = p.spec.expect("pod spec");
            let claims = spec.resource_claims.unwrap_or_default();
            // Every claim a container names is one of the pod's, and is used.
            let used: BTreeSet<String> = spec
                .containers
                .iter()
                .flat_map(|c| c.resources.iter().flat_map(|r| r.claims.iter().flatten()))
                .map(|c| c.name.clone())
                .collect();
            let declared: BTreeSet<String> = claims.iter().map(|c| c.name.clone()).collect();
            assert_eq!(
                used, declared,
                "{name}: pod {pod_name}: claims used and declared"
            );
            let claims = claims
                .into_iter()
                .map(|c| {
                    let source = c
                        .resource_claim_template_name
                        .or(c.resource_claim_name)
                        .unwrap_or_else(|| {
                            panic!("{name}: {pod_name}: claim {} names nothing", c.name)
                        });
                    let spec = specs.get(&source).unwrap_or_else(|| {
                        panic!("{name}: {pod_name} names {source:?}, not in the file")
                    });
                    (source, spec.clone())
                })
                .collect();
            (pod_name, claims)
        })
        .collect()
}

/// What every claim of every example asks for, against what the plugin publishes and accepts,
/// and against what each example's comments say it asks for.
#[test]
fn examples_ask_for_the_device_class_capacities_and_config_the_plugin_serves() {
    let Some(docs) = documents("deviceclass.yaml") else {
        return;
    };
    let class: DeviceClass = one("deviceclass.yaml", &docs, "DeviceClass");
    let class_name = class.metadata.name.clone().expect("name");
    let mut asked: BTreeMap<String, Vec<(String, u128, u128)>> = BTreeMap::new();
    for f in example_files() {
        let Some(docs) = documents(&f) else { return };
        for (source, spec) in claim_specs(&f, &docs) {
            let devices = spec.devices.expect("devices");
            let requests = devices.requests.unwrap_or_default();
            for r in &requests {
                let exact = r.exactly.as_ref().expect("an exact request");
                assert_eq!(
                    exact.device_class_name, class_name,
                    "{f}: {source}: the DeviceClass is {class_name}"
                );
                let capacity = exact
                    .capacity
                    .as_ref()
                    .and_then(|c| c.requests.as_ref())
                    .expect("capacity.requests");
                for k in capacity.keys() {
                    assert!(
                        CAPACITIES.contains(&k.as_str()),
                        "{f}: {source}: {k:?} is not a capacity the plugin publishes ({CAPACITIES:?})"
                    );
                }
                let (memory, cores) = asks(r);
                assert!(memory > 0 && (1..=100).contains(&cores), "{f}: {source}");
            }
            for c in devices.config.unwrap_or_default() {
                let opaque = c.opaque.expect("opaque config");
                assert_eq!(opaque.driver, DRIVER, "{f}: {source}");
                // SliceConfig, as the plugin reads it: unknown fields refused.
                let p = &opaque.parameters.0;
                let keys: BTreeSet<&str> = p
                    .as_object()
                    .expect("a mapping")
                    .keys()
                    .map(|k| k.as_str())
                    .collect();
                let known: BTreeSet<&str> = ["apiVersion", "kind", "coreLimit"].into();
                assert!(keys.is_subset(&known), "{f}: {source}: {keys:?}");
                assert_eq!(p["apiVersion"], "gpu.cuslice.io/v1alpha1");
                assert_eq!(p["kind"], "SliceConfig");
                let applies_to = c.requests.clone().unwrap_or_default();
                for name in &applies_to {
                    assert!(
                        requests.iter().any(|r| &r.name == name),
                        "{f}: {source}: config for unknown request {name}"
                    );
                }
                if let Some(limit) = p.get("coreLimit") {
                    let limit = limit.as_u64().expect("coreLimit is a whole number") as u128;
                    assert!((1..=100).contains(&limit), "{f}: coreLimit {limit}");
                    for r in requests.iter().filter(|r| applies_to.contains(&r.name)) {
                        assert!(
                            limit >= asks(r).1,
                            "{f}: coreLimit below the requested cores"
                        );
                    }
                }
            }
        }
        for (pod, claims) in pods_and_claims(&f, &docs) {
            for (source, spec) in claims {
                for r in spec.devices.expect("devices").requests.unwrap_or_default() {
                    let (m, c) = asks(&r);
                    asked
                        .entry(f.clone())
                        .or_default()
                        .push((format!("{pod}/{source}"), m, c));
                }
            }
        }
    }

    // What each example's comments say it asks for.
    let slice = &asked["examples/slice-8gi-30-cores.yaml"];
    assert_eq!(slice.len(), 1, "{slice:?}");
    assert_eq!((slice[0].1, slice[0].2), (8 * GIB, 30));

    // Two pods, each with its own claim, that fit on one GPU of 16 GiB together.
    let two = &asked["examples/two-pods-one-gpu.yaml"];
    assert_eq!(two.len(), 2, "{two:?}");
    let Some(docs) = documents("examples/two-pods-one-gpu.yaml") else {
        return;
    };
    for p in all::<Pod>("two-pods-one-gpu.yaml", &docs, "Pod") {
        for c in p.spec.expect("spec").resource_claims.unwrap_or_default() {
            assert!(
                c.resource_claim_template_name.is_some(),
                "each pod its own claim, from a template: {c:?}"
            );
        }
    }
    let (memory, cores) = two.iter().fold((0, 0), |(m, c), x| (m + x.1, c + x.2));
    assert!(memory <= 16 * GIB && cores <= 100, "{two:?}");

    // Tensor parallel: one claim of two requests, 40 GiB and 50 cores each, kept on two GPUs
    // by their UUIDs (an attribute the plugin publishes).
    let tp = &asked["examples/tensor-parallel-2-gpus.yaml"];
    assert_eq!(tp.len(), 2, "{tp:?}");
    assert!(tp.iter().all(|x| (x.1, x.2) == (40 * GIB, 50)), "{tp:?}");
    let name = "examples/tensor-parallel-2-gpus.yaml";
    let Some(docs) = documents(name) else { return };
    for (source, spec) in claim_specs(name, &docs) {
        let constraints = spec.devices.and_then(|d| d.constraints).unwrap_or_default();
        assert!(
            constraints.iter().any(|c| c.distinct_attribute.as_deref()
                == Some(&format!("{DRIVER}/uuid"))
                && c.requests.as_ref().is_some_and(|r| r.len() == 2)),
            "{source}: {constraints:?}"
        );
    }

    // More memory than any GPU has.
    let big = &asked["examples/too-big-stays-pending.yaml"];
    assert_eq!(big.len(), 1);
    assert!(big[0].1 >= 1 << 40, "{big:?}");
}

#[test]
fn example_without_dra_fits_its_replicas_and_sets_limits_the_interposer_accepts() {
    let name = "examples/without-dra-time-slicing.yaml";
    let Some(docs) = documents(name) else { return };
    let cm: ConfigMap = one(name, &docs, "ConfigMap");
    let config = cm
        .data
        .as_ref()
        .and_then(|d| d.get("any"))
        .expect("data.any: the device plugin's configuration");
    let config = parse_yaml("data.any", config).expect("parsed above");
    assert_eq!(config.len(), 1);
    let config = &config[0];
    assert_eq!(config["version"], "v1");
    let resources = config["sharing"]["timeSlicing"]["resources"]
        .as_array()
        .expect("sharing.timeSlicing.resources");
    assert_eq!(resources.len(), 1);
    assert_eq!(resources[0]["name"], "nvidia.com/gpu");
    let replicas = resources[0]["replicas"].as_u64().expect("replicas");
    assert!(replicas >= 2, "{replicas}");

    let pod: Pod = one(name, &docs, "Pod");
    let spec = pod.spec.expect("spec");
    let Some(rc) = documents("runtimeclass.yaml") else {
        return;
    };
    let rc: RuntimeClass = one("runtimeclass.yaml", &rc, "RuntimeClass");
    assert_eq!(spec.runtime_class_name, rc.metadata.name);
    assert_eq!(spec.containers.len(), 1);
    let c = &spec.containers[0];
    let gpus = c
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("nvidia.com/gpu"))
        .expect("limits nvidia.com/gpu");
    assert_eq!(gpus.0, "1", "one replica of a GPU");
    let env: Vec<(String, String)> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().expect("a literal value")))
        .collect();
    let config = cuslice_policy::Config::from_vars(env.clone())
        .unwrap_or_else(|e| panic!("{env:?}: cuslice: {e}"));
    let limits = config.limits(0);
    let memory = limits.memory.expect("a memory cap") as u128;
    let cores = limits.core_limit.expect("a core limit") as u128;
    // The replicas fit together: their core limits on one GPU's time, their memory on the GPU
    // the comment names (32 GiB).
    assert!(cores * replicas as u128 <= 100, "{cores}% x {replicas}");
    assert!(
        memory * replicas as u128 <= 32 * GIB,
        "{memory} x {replicas}"
    );
}
