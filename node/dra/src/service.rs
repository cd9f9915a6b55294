//! The plugin's I/O: the two gRPC services on their sockets, the API server (claims in, the
//! ResourceSlice out), the CDI directory and the checkpoint.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::Mutex;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::checkpoint::{self, Checkpoint, Prepared, PreparedDevice};
use crate::claim::{self, ClaimRef};
use crate::dra::dra_plugin_server::{DraPlugin, DraPluginServer};
use crate::dra::{
    Device, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use crate::registration::registration_server::{Registration, RegistrationServer};
use crate::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use crate::slice::{self, DRIVER, Gpu, NodeRef};
use crate::{Options, cdi, discover};

/// The service name the kubelet looks for among the supported versions.
pub const DRA_V1: &str = "v1.DRAPlugin";

fn log(line: &str) {
    eprintln!("cuslice-dra-plugin: {line}");
}

/// What the plugin holds between calls.
struct State {
    checkpoint: Checkpoint,
    /// The GPUs last published, and the pool generation they were published at.
    published: Option<(i64, Vec<Gpu>)>,
}

pub struct Plugin {
    opts: Options,
    client: kube::Client,
    node: NodeRef,
    state: Mutex<State>,
}

async fn gpus() -> Result<discover::Gpus, String> {
    tokio::task::spawn_blocking(discover::gpus)
        .await
        .map_err(|e| format!("NVML: {e}"))?
}

impl Plugin {
    /// Publishes the slice if the GPUs differ from what was last published.
    async fn publish(&self, found: &discover::Gpus) -> Result<(), String> {
        for (i, why) in &found.unusable {
            log(&format!("GPU {i} is not published: {why}"));
        }
        let mut st = self.state.lock().await;
        if st
            .published
            .as_ref()
            .is_some_and(|(_, g)| *g == found.usable)
        {
            return Ok(());
        }
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let name = slice::slice_name(&self.node.name);
        let generation = match &st.published {
            Some((g, _)) => g + 1,
            None => match api.get_opt(&name).await {
                Ok(Some(s)) => s.spec.pool.generation + 1,
                Ok(None) => 1,
                Err(e) => return Err(format!("reading ResourceSlice {name}: {e}")),
            },
        };
        let s = slice::resource_slice(&self.node, generation, &found.usable);
        api.patch(
            &name,
            &PatchParams::apply(DRIVER).force(),
            &Patch::Apply(&s),
        )
        .await
        .map_err(|e| format!("publishing ResourceSlice {name}: {e}"))?;
        log(&format!(
            "published ResourceSlice {name} (pool generation {generation}): {}",
            if found.usable.is_empty() {
                "no GPUs".to_owned()
            } else {
                found
                    .usable
                    .iter()
                    .map(|g| format!("{} {}", g.name(), g.description.uuid))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ));
        st.published = Some((generation, found.usable.clone()));
        Ok(())
    }

    fn devices_of(p: &Prepared) -> Vec<Device> {
        p.devices
            .iter()
            .map(|d| Device {
                request_names: vec![d.allotted.request.clone()],
                pool_name: d.pool.clone(),
                device_name: d.allotted.device.clone(),
                cdi_device_ids: d.cdi_ids.clone(),
            })
            .collect()
    }

    async fn prepare(&self, c: ClaimRef) -> Result<Vec<Device>, String> {
        let mut st = self.state.lock().await;
        if let Some(p) = st.checkpoint.claims.get(&c.uid) {
            // Prepared before (by this run or an earlier one): the same answer, and the spec
            // written again if it went missing.
            for d in &p.devices {
                if !d.spec_file.exists() {
                    write_spec(&d.spec_file, &d.spec).map_err(|e| format!("{c}: {e}"))?;
                }
            }
            return Ok(Self::devices_of(p));
        }
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        let object = api
            .get(&c.name)
            .await
            .map_err(|e| format!("{c}: reading it from the API server: {e}"))?;
        let found = gpus().await.map_err(|e| format!("{c}: {e}"))?;
        let allotted = claim::allotments(&c, &object, &self.node.name, &found.usable)?;
        let mut devices = Vec::new();
        for a in allotted {
            let gpu = found
                .usable
                .iter()
                .find(|g| g.name() == a.device)
                .expect("allotments are of usable GPUs");
            let spec = cdi::build(
                &c,
                &a,
                gpu,
                &self.opts.roots,
                &self.opts.hook,
                &self.opts.library,
            );
            let spec_file = self.opts.cdi_dir.join(cdi::file_name(&c));
            write_spec(&spec_file, &spec).map_err(|e| format!("{c}: {e}"))?;
            devices.push(PreparedDevice {
                cdi_ids: vec![cdi::id(&c, &a)],
                allotted: a,
                pool: self.node.name.clone(),
                spec_file,
                spec,
            });
        }
        let index_files = match &self.opts.container_index {
            Some(dir) => match self.write_index(dir, &c, &object, &devices).await {
                Ok(files) => files,
                Err(e) => {
                    for d in &devices {
                        let _ = std::fs::remove_file(&d.spec_file);
                    }
                    return Err(format!("{c}: {e}"));
                }
            },
            None => Vec::new(),
        };
        let p = Prepared {
            claim: c.clone(),
            devices,
            index_files,
        };
        st.checkpoint.claims.insert(c.uid.clone(), p.clone());
        if let Err(e) = checkpoint::save(&self.opts.checkpoint(), &st.checkpoint) {
            st.checkpoint.claims.remove(&c.uid);
            for f in p.devices.iter().map(|d| &d.spec_file).chain(&p.index_files) {
                let _ = std::fs::remove_file(f);
            }
            return Err(format!("{c}: {e}"));
        }
        for d in &p.devices {
            let a = &d.allotted;
            log(&format!(
                "prepared {c}: {} ({}) memory {} cores {} limit {} as {}",
                a.device,
                a.uuid,
                a.memory,
                a.core_request,
                a.core_limit,
                d.cdi_ids.join(",")
            ));
        }
        Ok(Self::devices_of(&p))
    }

    /// Writes the claim's container index entries: for each pod the claim is reserved for, each
    /// of its containers that uses the claim gets the CDI ids of the devices it names.
    async fn write_index(
        &self,
        dir: &Path,
        c: &ClaimRef,
        object: &ResourceClaim,
        devices: &[PreparedDevice],
    ) -> Result<Vec<std::path::PathBuf>, String> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &c.namespace);
        // Every entry first (reading the pods), then the files.
        let mut entries = Vec::new();
        let reserved = object
            .status
            .iter()
            .flat_map(|s| s.reserved_for.iter().flatten())
            .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty());
        for r in reserved {
            let pod = pods.get(&r.name).await.map_err(|e| {
                format!(
                    "reading pod {}/{} it is reserved for: {e}",
                    c.namespace, r.name
                )
            })?;
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if uid != r.uid {
                // That pod is gone and another of its name was made: not this claim's.
                continue;
            }
            for (container, request) in crate::index::containers_using(&pod, &c.name) {
                let ids: Vec<String> = devices
                    .iter()
                    .filter(|d| request.as_ref().is_none_or(|q| *q == d.allotted.request))
                    .flat_map(|d| d.cdi_ids.clone())
                    .collect();
                let name =
                    cuslice_hook::cdi::index_file(&c.namespace, &r.name, &container, &c.uid)?;
                let entry = cuslice_hook::cdi::IndexEntry {
                    pod_uid: uid.clone(),
                    cdi_devices: ids,
                    claim: Some(c.name.clone()),
                };
                entries.push((dir.join(name), entry));
            }
        }
        let mut files = Vec::new();
        for (path, entry) in entries {
            let written = std::fs::create_dir_all(dir).and_then(|()| {
                cuslice_hook::cdi::write_atomic(
                    &path,
                    serde_json::to_string(&entry).expect("JSON").as_bytes(),
                    0o644,
                )
            });
            if let Err(e) = written {
                for f in &files {
                    let _ = std::fs::remove_file(f);
                }
                return Err(format!("{}: {e}", path.display()));
            }
            files.push(path);
        }
        Ok(files)
    }

    async fn unprepare(&self, c: ClaimRef) -> Result<(), String> {
        let mut st = self.state.lock().await;
        let Some(p) = st.checkpoint.claims.get(&c.uid).cloned() else {
            // Never prepared here, or already unprepared: nothing to undo.
            return Ok(());
        };
        // The index entries first: a container starting meanwhile finds no entry rather than
        // an entry whose spec is gone.
        for f in &p.index_files {
            match std::fs::remove_file(f) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("{c}: {}: {e}", f.display())),
            }
        }
        for d in &p.devices {
            let (dir, name) = (
                d.spec_file.parent().unwrap_or(Path::new(".")),
                d.spec_file
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy(),
            );
            cuslice_hook::cdi::remove_spec(dir, &name).map_err(|e| format!("{c}: {e}"))?;
        }
        st.checkpoint.claims.remove(&c.uid);
        if let Err(e) = checkpoint::save(&self.opts.checkpoint(), &st.checkpoint) {
            st.checkpoint.claims.insert(c.uid.clone(), p);
            return Err(format!("{c}: {e}"));
        }
        log(&format!("unprepared {c}"));
        Ok(())
    }
}

fn write_spec(path: &Path, spec: &cuslice_hook::cdi::Spec) -> Result<(), String> {
    let (dir, name) = (
        path.parent().unwrap_or(Path::new(".")),
        path.file_name().unwrap_or_default().to_string_lossy(),
    );
    cuslice_hook::cdi::write_spec(dir, &name, spec).map(|_| ())
}

fn claim_ref(c: crate::dra::Claim) -> ClaimRef {
    ClaimRef {
        namespace: c.namespace,
        name: c.name,
        uid: c.uid,
    }
}

#[derive(Clone)]
pub struct Dra(Arc<Plugin>);

#[tonic::async_trait]
impl DraPlugin for Dra {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut claims = HashMap::new();
        for c in request.into_inner().claims {
            let c = claim_ref(c);
            let uid = c.uid.clone();
            let r = match self.0.prepare(c).await {
                Ok(devices) => NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(error) => {
                    log(&error);
                    NodePrepareResourceResponse {
                        devices: vec![],
                        error,
                    }
                }
            };
            claims.insert(uid, r);
        }
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut claims = HashMap::new();
        for c in request.into_inner().claims {
            let c = claim_ref(c);
            let uid = c.uid.clone();
            let error = self.0.unprepare(c).await.err().unwrap_or_default();
            if !error.is_empty() {
                log(&error);
            }
            claims.insert(uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

pub struct Registrar {
    endpoint: String,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: "DRAPlugin".into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec![DRA_V1.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        if s.plugin_registered {
            log("registered with the kubelet");
        } else {
            log(&format!(
                "the kubelet refused the registration: {}",
                s.error
            ));
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

async fn client(opts: &Options) -> Result<kube::Client, String> {
    let config = match &opts.kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .map_err(|e| format!("--kubeconfig {}: {e}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| format!("--kubeconfig {}: {e}", p.display()))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            format!("no API server to talk to: {e}; run in a pod, or pass --kubeconfig FILE")
        })?,
    };
    kube::Client::try_from(config).map_err(|e| format!("API server client: {e}"))
}

/// Binds a unix socket, replacing one an earlier run left.
fn bind(path: &Path) -> Result<UnixListenerStream, String> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    let l = tokio::net::UnixListener::bind(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(UnixListenerStream::new(l))
}

pub async fn serve(opts: Options) -> Result<(), String> {
    for d in [&opts.plugin_dir, &opts.cdi_dir, &opts.registry_dir] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let checkpoint = checkpoint::load(&opts.checkpoint())?;
    let client = client(&opts).await?;
    let node = Api::<Node>::all(client.clone())
        .get(&opts.node_name)
        .await
        .map_err(|e| format!("node {}: {e}", opts.node_name))?;
    let node = NodeRef {
        name: opts.node_name.clone(),
        uid: node.metadata.uid.unwrap_or_default(),
    };
    let found = gpus().await?;
    let plugin = Arc::new(Plugin {
        opts: opts.clone(),
        client,
        node,
        state: Mutex::new(State {
            checkpoint,
            published: None,
        }),
    });
    plugin.publish(&found).await?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    // The DRA service first: the kubelet calls it as soon as the registration is seen.
    let dra = tonic::transport::Server::builder()
        .add_service(DraPluginServer::new(Dra(plugin.clone())))
        .serve_with_incoming_shutdown(bind(&opts.dra_socket())?, stopped(stop_rx.clone()));
    let reg = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(Registrar {
            endpoint: opts.dra_socket().to_string_lossy().into_owned(),
        }))
        .serve_with_incoming_shutdown(bind(&opts.registration_socket())?, stopped(stop_rx.clone()));
    let dra = tokio::spawn(dra);
    let reg = tokio::spawn(reg);
    log(&format!(
        "serving {} (registration at {})",
        opts.dra_socket().display(),
        opts.registration_socket().display()
    ));

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("SIGTERM: {e}"))?;
    let mut tick = tokio::time::interval(opts.rescan);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = tick.tick() => {
                match gpus().await {
                    Ok(found) => if let Err(e) = plugin.publish(&found).await {
                        log(&e);
                    },
                    Err(e) => log(&format!("rescan: {e}")),
                }
            }
        }
    }
    // Unregister first (the kubelet sees the socket go), then stop serving.
    let _ = std::fs::remove_file(opts.registration_socket());
    let _ = stop_tx.send(true);
    let _ = reg.await;
    let _ = dra.await;
    let _ = std::fs::remove_file(opts.dra_socket());
    log("stopped");
    Ok(())
}
