//! What the DRA plugin's tests share: a node (simgpu's GPUs, a driver root holding the simulated
//! driver's libraries and stand-in device nodes, the kubelet's directories), a test API server
//! that answers kube-rs with recorded upstream responses, the plugin started as the kubelet's
//! node would run it, and a gRPC client that makes the kubelet's calls over the plugin's unix
//! sockets, built from the same .proto definitions.

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cuslice_dra::dra::dra_plugin_client::DraPluginClient;
use cuslice_dra::dra::{
    Claim, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use cuslice_dra::registration::registration_client::RegistrationClient;
use cuslice_dra::registration::{InfoRequest, PluginInfo};
use cuslice_test_harness::{Sim, Stderr, simgpu};
use serde_json::{Value, json};
use tonic::transport::{Channel, Endpoint, Uri};

pub const NODE: &str = "node-a";
pub const PLUGIN: &str = env!("CARGO_BIN_EXE_cuslice-dra-plugin");

pub fn data(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

// ---- the API server ------------------------------------------------------------------------

/// One request the API server was sent.
#[derive(Debug, Clone)]
pub struct Req {
    pub method: String,
    pub path: String,
    // Read by the tests that check what the plugin sent (kubelet.rs's), not by every binary.
    #[allow(dead_code)]
    pub query: String,
    #[allow(dead_code)]
    pub content_type: String,
    pub body: String,
}

#[derive(Default)]
pub struct ApiState {
    /// (namespace, name) -> the ResourceClaim the server returns.
    pub claims: BTreeMap<(String, String), Value>,
    /// (namespace, name) -> the Pod the server returns.
    pub pods: BTreeMap<(String, String), Value>,
    /// name -> the ResourceSlice as last applied.
    pub slices: BTreeMap<String, Value>,
    pub log: Vec<Req>,
    resource_version: u64,
}

/// An HTTP server on 127.0.0.1 that answers the calls the plugin makes, with upstream's recorded
/// responses (tests/data): the Node, a NotFound Status, ResourceClaims, and server-side apply
/// of the ResourceSlice (stored, and returned as the API server returns it).
pub struct ApiServer {
    pub url: String,
    pub state: Arc<Mutex<ApiState>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn not_found(resource: &str, group: &str, name: &str) -> Value {
    let text = data("not-found.json")
        .to_string()
        .replace(
            "RESOURCE.GROUP",
            &if group.is_empty() {
                resource.to_owned()
            } else {
                format!("{resource}.{group}")
            },
        )
        .replace("RESOURCE", resource)
        .replace("GROUP", group)
        .replace("NAME", name);
    serde_json::from_str(&text).unwrap()
}

fn answer(st: &mut ApiState, r: &Req) -> (u16, Value) {
    let parts: Vec<&str> = r.path.trim_matches('/').split('/').collect();
    match (r.method.as_str(), parts.as_slice()) {
        ("GET", ["api", "v1", "nodes", name]) if *name == NODE => (200, data("node.json")),
        ("GET", ["api", "v1", "nodes", name]) => (404, not_found("nodes", "", name)),
        ("GET", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
            match st.slices.get(*name) {
                Some(s) => (200, s.clone()),
                None => (404, not_found("resourceslices", "resource.k8s.io", name)),
            }
        }
        ("PATCH", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
            let mut s: Value = serde_json::from_str(&r.body).unwrap();
            st.resource_version += 1;
            let created = !st.slices.contains_key(*name);
            let m = s["metadata"].as_object_mut().unwrap();
            m.insert("uid".into(), json!("0b7e4c2a-1f3d-4a5b-8c6d-9e0f1a2b3c4d"));
            m.insert(
                "resourceVersion".into(),
                json!(st.resource_version.to_string()),
            );
            m.insert("creationTimestamp".into(), json!("2026-11-23T15:40:12Z"));
            st.slices.insert(name.to_string(), s.clone());
            (if created { 201 } else { 200 }, s)
        }
        (
            "GET",
            [
                "apis",
                "resource.k8s.io",
                "v1",
                "namespaces",
                ns,
                "resourceclaims",
                name,
            ],
        ) => match st.claims.get(&(ns.to_string(), name.to_string())) {
            Some(c) => (200, c.clone()),
            None => (404, not_found("resourceclaims", "resource.k8s.io", name)),
        },
        ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => {
            match st.pods.get(&(ns.to_string(), name.to_string())) {
                Some(p) => (200, p.clone()),
                None => (404, not_found("pods", "", name)),
            }
        }
        _ => (404, not_found("unknown", "", &r.path)),
    }
}

impl ApiServer {
    pub fn start() -> ApiServer {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let url = format!("http://{}", server.server_addr().to_ip().unwrap());
        let mut st = ApiState::default();
        // The pod of the recorded claim.
        let pod = data("pod.json");
        st.pods.insert(
            (
                pod["metadata"]["namespace"].as_str().unwrap().to_owned(),
                pod["metadata"]["name"].as_str().unwrap().to_owned(),
            ),
            pod,
        );
        let state = Arc::new(Mutex::new(st));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(Some(mut rq)) = server.recv_timeout(Duration::from_millis(50)) else {
                        continue;
                    };
                    let mut body = String::new();
                    let _ = rq.as_reader().read_to_string(&mut body);
                    let (path, query) = rq.url().split_once('?').unwrap_or((rq.url(), ""));
                    let req = Req {
                        method: rq.method().to_string(),
                        path: path.to_owned(),
                        query: query.to_owned(),
                        content_type: rq
                            .headers()
                            .iter()
                            .find(|h| h.field.equiv("Content-Type"))
                            .map(|h| h.value.to_string())
                            .unwrap_or_default(),
                        body,
                    };
                    let (code, v) = {
                        let mut st = state.lock().unwrap();
                        st.log.push(req.clone());
                        answer(&mut st, &req)
                    };
                    let resp = tiny_http::Response::from_string(v.to_string())
                        .with_status_code(code)
                        .with_header(
                            "Content-Type: application/json"
                                .parse::<tiny_http::Header>()
                                .unwrap(),
                        );
                    let _ = rq.respond(resp);
                }
            })
        };
        ApiServer {
            url,
            state,
            stop,
            thread: Some(thread),
        }
    }

    pub fn put_claim(&self, claim: &Value) {
        let m = &claim["metadata"];
        self.state.lock().unwrap().claims.insert(
            (
                m["namespace"].as_str().unwrap().to_owned(),
                m["name"].as_str().unwrap().to_owned(),
            ),
            claim.clone(),
        );
    }
}

// What the server holds and was sent: read by kubelet.rs's tests, not by every binary.
#[allow(dead_code)]
impl ApiServer {
    pub fn slice(&self) -> Option<Value> {
        let name = format!("{NODE}-gpu.cuslice.io");
        self.state.lock().unwrap().slices.get(&name).cloned()
    }

    pub fn requests(&self, method: &str, path_part: &str) -> Vec<Req> {
        self.state
            .lock()
            .unwrap()
            .log
            .iter()
            .filter(|r| r.method == method && r.path.contains(path_part))
            .cloned()
            .collect()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---- the node ------------------------------------------------------------------------------

/// A node: simgpu's GPUs, the driver root, the kubelet's directories, the API server.
pub struct Node {
    pub sim: Sim,
    pub api: ApiServer,
    pub dir: tempfile::TempDir,
    /// Where the plugin writes CDI specs (default: a directory of this node's own).
    cdi: Option<PathBuf>,
    /// Where it keeps its container index (likewise).
    pub index: Option<PathBuf>,
}

/// Makes a character device node at `path` with /dev/null's numbers: a stand-in for a GPU's
/// device node (simgpu has none), which a container runtime can create in a container.
pub fn stand_in_device(path: &Path) {
    use std::os::unix::fs::MetadataExt;
    let null = std::fs::metadata("/dev/null").unwrap();
    assert!(null.file_type().is_char_device());
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and plain numbers.
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, null.rdev()) };
    assert_eq!(
        r,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

impl Node {
    /// `devices` simulated GPUs of `memory` each.
    // Not every test binary: engines.rs's nodes give a CDI directory (`with_cdi_dir`).
    #[allow(dead_code)]
    pub fn new(devices: u32, memory: &str) -> Node {
        Node::with_cdi_dir(devices, memory, None)
    }

    /// The same, with the plugin writing its CDI specs to `cdi` (a container engine's).
    pub fn with_cdi_dir(devices: u32, memory: &str, cdi: Option<PathBuf>) -> Node {
        let sim = Sim::new(&["--devices", &devices.to_string(), "--memory", memory]);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("driver");
        let dev = root.join("dev");
        std::fs::create_dir_all(&dev).unwrap();
        let mut nodes: Vec<String> = (0..devices).map(|i| format!("nvidia{i}")).collect();
        nodes.extend(["nvidiactl".into(), "nvidia-uvm".into()]);
        for n in nodes {
            stand_in_device(&dev.join(n));
        }
        let out = Command::new(simgpu())
            .args(["lib-dir", "--out"])
            .arg(root.join("usr/lib/x86_64-linux-gnu"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let api = ApiServer::start();
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n\
             contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n\
             current-context: test\nusers:\n- name: test\n  user: {{}}\n",
            api.url
        );
        std::fs::write(dir.path().join("kubeconfig"), kubeconfig).unwrap();
        Node {
            sim,
            api,
            dir,
            cdi,
            index: None,
        }
    }

    pub fn driver_root(&self) -> PathBuf {
        self.dir.path().join("driver")
    }

    pub fn plugin_dir(&self) -> PathBuf {
        self.dir.path().join("plugins/gpu.cuslice.io")
    }

    pub fn registry_dir(&self) -> PathBuf {
        self.dir.path().join("plugins_registry")
    }

    pub fn cdi_dir(&self) -> PathBuf {
        self.cdi
            .clone()
            .unwrap_or_else(|| self.dir.path().join("cdi"))
    }

    /// The container index the plugin keeps (default: a directory of this node's own).
    pub fn container_index(&self) -> PathBuf {
        self.index
            .clone()
            .unwrap_or_else(|| self.dir.path().join("container-index"))
    }

    /// The plugin's checkpoint.
    // Read by kubelet.rs's tests, not by every binary.
    #[allow(dead_code)]
    pub fn checkpoint(&self) -> PathBuf {
        self.plugin_dir().join("checkpoint.json")
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir().join("gpu.cuslice.io-reg.sock")
    }

    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir().join("dra.sock")
    }

    /// The plugin's command line, as the DaemonSet gives it (paths of this node).
    // These two: kubelet.rs's tests; engines.rs's only start the plugin (`start_plugin`).
    #[allow(dead_code)]
    pub fn plugin_command(&self, extra: &[&str]) -> Command {
        self.plugin_command_on(NODE, extra)
    }

    /// The same, claiming to be on node `name`.
    #[allow(dead_code)]
    pub fn plugin_command_on(&self, name: &str, extra: &[&str]) -> Command {
        self.plugin_command_of(Path::new(PLUGIN), name, extra)
    }

    /// The same, of the plugin binary `bin` (another release's).
    pub fn plugin_command_of(&self, bin: &Path, name: &str, extra: &[&str]) -> Command {
        let mut c = Command::new(bin);
        c.arg("--node-name")
            .arg(name)
            .arg("--plugin-dir")
            .arg(self.plugin_dir())
            .arg("--registry-dir")
            .arg(self.registry_dir())
            .arg("--cdi-dir")
            .arg(self.cdi_dir())
            .arg("--driver-root")
            .arg(self.driver_root())
            .arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .arg("--container-index")
            .arg(self.container_index())
            .args(extra)
            // NVML: simgpu's, as the driver root holds it.
            .env("SIMGPU_STATE", &self.sim.state)
            .env(
                "LD_LIBRARY_PATH",
                self.driver_root().join("usr/lib/x86_64-linux-gnu"),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    }

    /// Starts the plugin and waits until the kubelet could register it.
    pub fn start_plugin(&self, extra: &[&str]) -> PluginProcess {
        self.start_plugin_of(Path::new(PLUGIN), extra)
    }

    /// The same, of the plugin binary `bin` (another release's).
    pub fn start_plugin_of(&self, bin: &Path, extra: &[&str]) -> PluginProcess {
        let mut child = self.plugin_command_of(bin, NODE, extra).spawn().unwrap();
        let stderr = Some(Stderr::capture(&mut child));
        let mut p = PluginProcess { child, stderr };
        let t = Instant::now();
        loop {
            if self.registration_socket().exists() && try_info(&self.registration_socket()).is_ok()
            {
                return p;
            }
            if let Ok(Some(s)) = p.child.try_wait() {
                panic!("the plugin exited ({s}): {}", p.log());
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the plugin did not register within 20 s: {}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub struct PluginProcess {
    pub child: Child,
    stderr: Option<Stderr>,
}

impl PluginProcess {
    /// What it wrote to stderr so far.
    pub fn log(&self) -> String {
        self.stderr.as_ref().map(Stderr::text).unwrap_or_default()
    }
}

// Signalling, stopping and crashing the plugin: kubelet.rs's tests; engines.rs's leave it to
// `Drop`.
#[allow(dead_code)]
impl PluginProcess {
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill with a pid of our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// SIGTERM, and its exit status and stderr.
    pub fn stop(mut self) -> (std::process::ExitStatus, String) {
        self.signal(libc::SIGTERM);
        let s = self.child.wait().unwrap();
        (
            s,
            self.stderr.take().map(Stderr::finish).unwrap_or_default(),
        )
    }

    /// SIGKILL: a crash, nothing cleaned up.
    pub fn kill(mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- the kubelet's calls -------------------------------------------------------------------

pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// A gRPC channel over the unix socket at `path`, as the kubelet dials a plugin.
pub async fn channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    // The URI is not used: every connection goes to the socket.
    Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
}

/// The plugin's registration info, asked over its registration socket as the kubelet asks.
pub fn try_info(reg: &Path) -> Result<PluginInfo, String> {
    block_on(async {
        let ch = channel(reg).await.map_err(|e| e.to_string())?;
        RegistrationClient::new(ch)
            .get_info(InfoRequest {})
            .await
            .map(|r| r.into_inner())
            .map_err(|e| e.to_string())
    })
}

pub fn claim_of(v: &Value) -> Claim {
    let m = &v["metadata"];
    Claim {
        namespace: m["namespace"].as_str().unwrap().into(),
        uid: m["uid"].as_str().unwrap().into(),
        name: m["name"].as_str().unwrap().into(),
    }
}

pub fn prepare(dra: &Path, claims: Vec<Claim>) -> NodePrepareResourcesResponse {
    block_on(async {
        DraPluginClient::new(channel(dra).await.unwrap())
            .node_prepare_resources(NodePrepareResourcesRequest { claims })
            .await
            .unwrap()
            .into_inner()
    })
}

pub fn unprepare(dra: &Path, claims: Vec<Claim>) -> NodeUnprepareResourcesResponse {
    block_on(async {
        DraPluginClient::new(channel(dra).await.unwrap())
            .node_unprepare_resources(NodeUnprepareResourcesRequest { claims })
            .await
            .unwrap()
            .into_inner()
    })
}

/// The recorded claim, made into another claim: its name and uid, the device it was allocated,
/// the capacity it consumed and its opaque parameters (None: no config).
pub fn claim(
    name: &str,
    uid: &str,
    device: &str,
    memory: &str,
    cores: &str,
    params: Option<Value>,
) -> Value {
    let mut c = data("resourceclaim.json");
    c["metadata"]["name"] = json!(name);
    c["metadata"]["uid"] = json!(uid);
    let r = &mut c["status"]["allocation"]["devices"]["results"][0];
    r["device"] = json!(device);
    r["consumedCapacity"] = json!({"memory": memory, "cores": cores});
    c["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"] =
        json!({"memory": memory, "cores": cores});
    match params {
        Some(p) => {
            c["spec"]["devices"]["config"][0]["opaque"]["parameters"] = p.clone();
            c["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"] = p;
        }
        None => {
            c["spec"]["devices"]["config"] = json!([]);
            c["status"]["allocation"]["devices"]["config"] = json!([]);
        }
    }
    c
}

pub fn slice_config(core_limit: u32) -> Value {
    json!({"apiVersion": "gpu.cuslice.io/v1alpha1", "kind": "SliceConfig", "coreLimit": core_limit})
}
