//! The Kubernetes manifests in install/kubernetes/: no cluster runs them here, so this checks what
//! can be checked without one: the install command in the DaemonSet is one this `cuslice`
//! accepts, the RuntimeClass names the default runtime, and (where Python's yaml module is
//! installed) both files parse as YAML.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cuslice");

fn manifest(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("kubernetes")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn daemonset_runs_a_valid_install_command() {
    let ds = manifest("daemonset.yaml");
    let line = ds
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("args: [\"install\""))
        .expect("the install container's args");
    // A YAML flow sequence of double-quoted strings is a JSON array.
    let args: Vec<String> =
        serde_json::from_str(line.trim_start_matches("args:").trim()).expect("args as JSON");
    assert_eq!(
        args,
        ["install", "--root", "/host", "--engine", "containerd"]
    );

    // Run it against a scratch root (in place of the host's /) as a dry run.
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
    std::fs::create_dir_all(&host).expect("mkdir");
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

    assert!(ds.contains("mountPath: /host"));
    assert!(ds.contains("path: /\n"));
    assert!(ds.contains("privileged: true"));
    assert!(ds.contains("nvidia.com/gpu.present: \"true\""));
    assert!(ds.contains("namespace: cuslice-system"));
    assert!(!ds.contains('\t'), "YAML takes no tabs");
}

#[test]
fn runtimeclass_names_the_default_runtime() {
    let rc = manifest("runtimeclass.yaml");
    assert!(rc.contains("apiVersion: node.k8s.io/v1\n"));
    assert!(rc.contains("kind: RuntimeClass\n"));
    assert!(rc.contains("\n  name: cuslice\n"));
    assert!(rc.contains("\nhandler: cuslice\n"));
    assert!(!rc.contains('\t'));
}

#[test]
fn manifests_parse_as_yaml_where_python_yaml_is_installed() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kubernetes");
    let script = "import sys, yaml\n\
                  for f in sys.argv[1:]:\n\
                  \x20   docs = [d for d in yaml.safe_load_all(open(f)) if d]\n\
                  \x20   assert docs and all('apiVersion' in d and 'kind' in d for d in docs), f\n";
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(dir.join("daemonset.yaml"))
        .arg(dir.join("runtimeclass.yaml"))
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) if String::from_utf8_lossy(&o.stderr).contains("No module named 'yaml'") => {
            eprintln!("skipped: python3 has no yaml module");
        }
        Ok(o) => panic!("{}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => eprintln!("skipped: no python3 ({e})"),
    }
}
