//! The Kubernetes manifests in install/kubernetes/: no cluster runs them here, so this checks what
//! can be checked without one. The manifests are parsed as YAML (by Python's yaml module, which
//! tests/ensure-tools installs) and read as the API objects they declare: the DaemonSet's init
//! container runs an install command this `cuslice` accepts (run against a scratch root as a dry
//! run), its main container runs `cuslice agent` with a command line this `cuslice` accepts, sees
//! the host's pids, cgroups and the hook's state root, and serves /metrics on the port its
//! Prometheus annotations name; the RuntimeClass names the default runtime.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_cuslice");

fn manifest_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("kubernetes")
        .join(name)
}

fn manifest(name: &str) -> String {
    let p = manifest_path(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The documents of a YAML file, as JSON; None (with a skip line) where Python has no yaml
/// module outside CI.
fn documents(name: &str) -> Option<Vec<Value>> {
    let script = "import sys, json, yaml\n\
                  docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]\n\
                  print(json.dumps(docs))\n";
    let out = match Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(manifest_path(name))
        .output()
    {
        Ok(o) => o,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: no python3 ({e}); tests/ensure-tools installs it");
            return None;
        }
        Err(e) => panic!("python3: {e}"),
    };
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if err.contains("No module named 'yaml'") && std::env::var_os("CI").is_none() {
            eprintln!("skipped: python3 has no yaml module; tests/ensure-tools installs PyYAML");
            return None;
        }
        panic!("{name} is not valid YAML: {err}");
    }
    let docs: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON from python");
    for d in &docs {
        assert!(
            d["apiVersion"].is_string() && d["kind"].is_string(),
            "{name}: every document has apiVersion and kind: {d}"
        );
    }
    Some(docs)
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

/// Where `container` mounts the host path `host_path` (through a hostPath volume).
fn mount_of(pod: &Value, container: &Value, host_path: &str) -> Option<(String, bool)> {
    let volume = pod["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["hostPath"]["path"] == host_path)?;
    let m = container["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == volume["name"])?;
    Some((
        m["mountPath"].as_str()?.to_owned(),
        m["readOnly"].as_bool().unwrap_or(false),
    ))
}

fn daemonset() -> Option<Value> {
    let docs = documents("daemonset.yaml")?;
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(kinds, ["Namespace", "DaemonSet"]);
    Some(docs[1].clone())
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
    assert_eq!(containers.len(), 1, "one long-running container");
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
