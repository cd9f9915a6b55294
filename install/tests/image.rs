//! The image of install/kubernetes (its Dockerfile, built by `build-image` from the release
//! build), run in Podman the three ways the DaemonSet runs it, with simgpu for the GPU:
//!
//! - `cuslice install --root /host --engine containerd --no-agent` with a scratch host root at
//!   /host: the files land on the "host", stripped, and containerd's drop-in names them;
//! - `cuslice agent --listen ...` with simgpu's NVML where the NVIDIA container runtime mounts the
//!   driver's (`/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1`): it serves its socket under the
//!   mounted state root and its /metrics name simgpu's GPUs (read through NVML in the image);
//! - `cuslice-dra-plugin --help`, then the plugin against a stand-in API server and the same
//!   NVML: it publishes one device per simulated GPU and registers with the kubelet (its
//!   registration socket appears in the mounted registry directory), and unregisters on stop.
//!
//! And the image's size, printed and bounded. Podman keeps all its state in a temporary
//! directory (vfs storage), so nothing is left in the machine's own image store. Needs root,
//! Podman, runc and the release build (`cargo build --release --workspace`); skipped with one
//! line otherwise, except under `CI`, where it fails.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuslice_test_harness::{Sim, bin_dir};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
const TAG: &str = "localhost/cuslice:image-test";
/// Six stripped files, glibc and CA certificates: 19.4 MB (install/kubernetes/README.md).
const MAX_IMAGE_BYTES: u64 = 40_000_000;

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Why this machine cannot run the test, if it cannot.
fn missing() -> Option<&'static str> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n");
    if !root {
        return Some("needs root");
    }
    if !have("podman") || !have("runc") {
        return Some("needs podman and runc (tests/tools/ensure-tools installs them)");
    }
    if !have("objcopy") {
        return Some("needs objcopy (binutils) to strip the image's files");
    }
    None
}

#[track_caller]
fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "{}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Podman with every piece of its state under `dir`.
struct Podman {
    dir: tempfile::TempDir,
}

impl Podman {
    fn new() -> Podman {
        Podman {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// The command and its global options, as one string for build-image's `ENGINE`.
    fn words(&self) -> Vec<String> {
        let d = self.dir.path().display();
        vec![
            "podman".into(),
            format!("--root={d}/storage"),
            format!("--runroot={d}/run"),
            format!("--tmpdir={d}/tmp"),
            format!("--network-config-dir={d}/networks"),
            "--storage-driver=vfs".into(),
            "--events-backend=file".into(),
            "--cgroup-manager=cgroupfs".into(),
            "--runtime=runc".into(),
        ]
    }

    fn command(&self) -> Command {
        let w = self.words();
        let mut c = Command::new("timeout");
        c.arg("120").args(&w);
        c
    }

    /// `podman run --rm` of the image with these options, then the entry point's arguments.
    fn run(&self, options: &[String], args: &[&str]) -> Command {
        let mut c = self.command();
        c.args(["run", "--rm"])
            // Without both, runc fails setting rlimits on this machine kind.
            .args([
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
            ])
            .args(options)
            .arg(TAG)
            .args(args);
        c
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Containers still running (a failed check) go with their storage.
        let _ = self.command().args(["rm", "--all", "--force"]).output();
        let _ = self.command().args(["rmi", "--all", "--force"]).output();
    }
}

fn mount(host: &Path, inside: &str, ro: bool) -> [String; 2] {
    [
        "-v".into(),
        format!("{}:{inside}{}", host.display(), if ro { ":ro" } else { "" }),
    ]
}

/// The simulated GPU as the NVIDIA container runtime would give it: NVML at the driver's path,
/// the simulator's state and its device memory (as `cuslice_test_engines::gpu_mounts`).
fn gpu_options(sim: &Sim) -> Vec<String> {
    let mut o = Vec::new();
    o.extend(mount(
        &bin_dir().join("libsimgpu_nvml.so"),
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        true,
    ));
    o.extend(mount(&sim.state, "/run/simgpu/state", false));
    o.extend(mount(&sim.memory_file(), "/run/simgpu/state.mem", false));
    o.extend(["-e".into(), "SIMGPU_STATE=/run/simgpu/state".into()]);
    o
}

/// A port on 127.0.0.1 nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind")
        .port()
}

fn wait_until(what: &str, child: &mut Child, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        if let Ok(Some(s)) = child.try_wait() {
            let mut err = String::new();
            if let Some(e) = child.stderr.as_mut() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("the container exited ({s}) before {what}: {err}");
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no {what} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `podman stop` the container, and what it wrote to stderr.
fn stop(podman: &Podman, name: &str, mut child: Child) -> String {
    ok(&podman
        .command()
        .args(["stop", "--time", "20", name])
        .output()
        .expect("podman stop"));
    let status = child.wait().expect("wait");
    let mut err = String::new();
    if let Some(e) = child.stderr.as_mut() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(status.success(), "{name} exited {status}: {err}");
    err
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

#[test]
fn the_image_builds_and_runs_install_agent_and_dra_plugin() {
    if let Some(why) = missing() {
        assert!(std::env::var_os("CI").is_none(), "{why}");
        eprintln!("skipped: {why}");
        return;
    }
    let podman = Podman::new();
    let context = podman.dir.path().join("context");
    let out = ok(
        &Command::new(Path::new(REPO).join("install/kubernetes/build-image"))
            .args(["--tag", TAG, "--context"])
            .arg(&context)
            .arg("--from")
            .arg(bin_dir())
            .env("ENGINE", podman.words().join(" "))
            .output()
            .expect("build-image"),
    );
    let size: u64 = out
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("build-image's last line is not a size: {out}"));
    println!("image {TAG}: {size} bytes ({:.1} MB)", size as f64 / 1e6);
    assert!(
        size < MAX_IMAGE_BYTES,
        "the image is {size} bytes, over {MAX_IMAGE_BYTES}: are its files stripped?"
    );
    // Stripped: no debug sections in what the image carries.
    for f in ["cuslice", "cuslice-dra-plugin", "libcuslice_core.so"] {
        let sections = ok(&Command::new("objdump")
            .arg("-h")
            .arg(context.join(f))
            .output()
            .expect("objdump"));
        // (.debug_gdb_scripts is loaded with the program and stays.)
        for debug in [".debug_info", ".debug_line"] {
            assert!(!sections.contains(debug), "{f} is not stripped: {debug}");
        }
    }

    install_onto_a_host_root(&podman);
    agent_reads_simgpu(&podman);
    dra_plugin_publishes_and_registers(&podman);
}

/// The DaemonSet's init container: `cuslice install` onto the host's / at /host.
fn install_onto_a_host_root(podman: &Podman) {
    let host = tempfile::tempdir().expect("tempdir");
    let mut options = vec!["--network=none".to_string()];
    options.extend(mount(host.path(), "/host", false));
    let out = ok(&podman
        .run(
            &options,
            &[
                "install",
                "--root",
                "/host",
                "--engine",
                "containerd",
                "--no-agent",
            ],
        )
        .output()
        .expect("podman run"));
    let h = host.path();
    for (f, mode) in [
        ("usr/local/bin/cuslice-hook", 0o755),
        ("usr/local/bin/cuslice-runtime", 0o755),
        ("usr/local/bin/cuslice", 0o755),
        ("usr/local/lib/cuslice/libcuslice.so", 0o644),
        ("usr/local/lib/cuslice/libcuslice_core.so", 0o644),
    ] {
        let m =
            fs::metadata(h.join(f)).unwrap_or_else(|e| panic!("{f}: {e}; install said:\n{out}"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(m.permissions().mode() & 0o777, mode, "{f}");
        // The image's own (stripped) file, byte for byte.
        let name = Path::new(f).file_name().unwrap();
        let staged = podman.dir.path().join("context").join(name);
        assert!(
            fs::read(h.join(f)).unwrap() == fs::read(&staged).unwrap(),
            "{f} differs from the image's {}",
            staged.display()
        );
    }
    let dropin = fs::read_to_string(h.join("etc/containerd/conf.d/cuslice.toml")).expect("drop-in");
    assert!(
        dropin.contains("/usr/local/bin/cuslice-runtime"),
        "{dropin}"
    );
    assert!(
        !h.join("etc/systemd").exists(),
        "--no-agent installs no unit"
    );
}

/// The DaemonSet's agent container, with the host's state root and simgpu's NVML.
fn agent_reads_simgpu(podman: &Podman) {
    let sim = Sim::new(&["--devices", "2", "--memory", "16GiB"]);
    let state_root = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let name = "cuslice-image-test-agent";
    let mut options = vec![format!("--name={name}"), "--network=host".to_string()];
    options.extend(mount(state_root.path(), "/run/cuslice", false));
    options.extend(gpu_options(&sim));
    let listen = format!("127.0.0.1:{port}");
    let mut child = podman
        .run(
            &options,
            &["agent", "--listen", &listen, "--enforce", "stop"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("podman run");
    let socket = state_root.path().join("agent/agent.sock");
    wait_until("the agent's socket", &mut child, || socket.exists());
    let mut metrics = String::new();
    wait_until("/metrics", &mut child, || {
        metrics = http_get(port, "/metrics").unwrap_or_default();
        metrics.contains("cuslice_device_info")
    });
    let uuids: Vec<String> = (0..2)
        .map(|i| sim.device(i)["uuid"].as_str().expect("uuid").to_owned())
        .collect();
    for u in &uuids {
        assert!(
            metrics.contains(&format!(
                "cuslice_device_info{{uuid=\"{u}\",name=\"SimGPU (simulated)\"}} 1"
            )),
            "NVML in the image should name {u}:\n{metrics}"
        );
    }
    let log = stop(podman, name, child);
    assert!(log.contains("--enforce stop"), "{log}");
}

/// Answers the API calls the DRA plugin makes at start with upstream's recorded objects
/// (node/dra/tests/data): its Node, and server-side apply of its ResourceSlice (kept).
fn api_server(node: &str) -> (u16, Arc<Mutex<Vec<String>>>) {
    let data = Path::new(REPO).join("node/dra/tests/data");
    let node_json = fs::read_to_string(data.join("node.json"))
        .expect("node.json")
        .replace("node-a", node);
    let not_found = fs::read_to_string(data.join("not-found.json")).expect("not-found.json");
    let applied = Arc::new(Mutex::new(Vec::new()));
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    let kept = applied.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (node_json, not_found, kept) = (node_json.clone(), not_found.clone(), kept.clone());
            std::thread::spawn(move || serve(conn, &node_json, &not_found, &kept));
        }
    });
    (port, applied)
}

/// HTTP/1.1 with keep-alive, as kube-rs speaks it: one request after another on a connection.
fn serve(conn: TcpStream, node_json: &str, not_found: &str, applied: &Mutex<Vec<String>>) {
    let mut w = conn.try_clone().expect("clone");
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut words = line.split_whitespace();
        let (method, path) = (
            words.next().unwrap_or("").to_owned(),
            words.next().unwrap_or("").to_owned(),
        );
        let mut length = 0;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let path = path.split('?').next().unwrap_or("").to_owned();
        let (code, answer) = if method == "GET" && path.starts_with("/api/v1/nodes/") {
            (200, node_json.to_owned())
        } else if method == "PATCH" && path.starts_with("/apis/resource.k8s.io/v1/resourceslices/")
        {
            let text = String::from_utf8_lossy(&body).into_owned();
            applied.lock().unwrap().push(text.clone());
            let mut s: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            if let Some(m) = s["metadata"].as_object_mut() {
                m.insert("uid".into(), "0b7e4c2a-1f3d-4a5b-8c6d-9e0f1a2b3c4d".into());
                m.insert("resourceVersion".into(), "1".into());
                m.insert("creationTimestamp".into(), "2026-11-23T15:40:12Z".into());
            }
            (200, s.to_string())
        } else {
            (404, not_found.to_owned())
        };
        let reason = if code == 200 { "OK" } else { "Not Found" };
        let head = format!(
            "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            answer.len()
        );
        if w.write_all(head.as_bytes())
            .and_then(|()| w.write_all(answer.as_bytes()))
            .is_err()
        {
            return;
        }
    }
}

/// The DaemonSet's dra-plugin container: `--help`, then a start against simgpu's NVML and a
/// stand-in API server, with the kubelet's directories mounted.
fn dra_plugin_publishes_and_registers(podman: &Podman) {
    let entry = [
        "--entrypoint".to_string(),
        "/opt/cuslice/cuslice-dra-plugin".into(),
    ];
    let help = ok(&podman
        .run(
            &[entry.to_vec(), vec!["--network=none".into()]].concat(),
            &["--help"],
        )
        .output()
        .expect("podman run"));
    assert!(help.contains("--node-name"), "{help}");

    let node = "image-test-node";
    let sim = Sim::new(&["--devices", "2", "--memory", "16GiB"]);
    let (port, applied) = api_server(node);
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    for sub in ["plugins", "plugins_registry", "cdi"] {
        fs::create_dir_all(d.join(sub)).expect("mkdir");
    }
    fs::write(
        d.join("kubeconfig"),
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: \
             http://127.0.0.1:{port}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    \
             user: test\ncurrent-context: test\nusers:\n- name: test\n  user: {{}}\n"
        ),
    )
    .expect("kubeconfig");
    let name = "cuslice-image-test-dra";
    let mut options = entry.to_vec();
    options.extend([format!("--name={name}"), "--network=host".into()]);
    options.extend(mount(&d.join("plugins"), "/var/lib/kubelet/plugins", false));
    options.extend(mount(
        &d.join("plugins_registry"),
        "/var/lib/kubelet/plugins_registry",
        false,
    ));
    options.extend(mount(&d.join("cdi"), "/var/run/cdi", false));
    options.extend(mount(&d.join("kubeconfig"), "/etc/kubeconfig", true));
    options.extend(gpu_options(&sim));
    options.extend(["-e".into(), format!("NODE_NAME={node}")]);
    let mut child = podman
        .run(
            &options,
            &["--kubeconfig", "/etc/kubeconfig", "--no-container-index"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("podman run");
    let registration: PathBuf = d.join("plugins_registry/gpu.cuslice.io-reg.sock");
    wait_until("the kubelet registration socket", &mut child, || {
        registration.exists()
    });
    wait_until("a ResourceSlice", &mut child, || {
        !applied.lock().unwrap().is_empty()
    });
    let slice = applied.lock().unwrap().last().cloned().expect("applied");
    for i in 0..2 {
        let uuid = sim.device(i)["uuid"].as_str().expect("uuid").to_owned();
        assert!(
            slice.contains(&uuid),
            "the ResourceSlice should list {uuid}: {slice}"
        );
    }
    stop(podman, name, child);
    assert!(!registration.exists(), "stopping the plugin unregisters it");
}
