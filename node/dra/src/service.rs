//! The kubelet-facing gRPC surface, after kubernetes-sigs/dra-example-driver's driver.go
//! (Ref: dra-example-driver cmd/dra-example-kubeletplugin/driver.go): the plugin registration
//! service and the DRA v1 service on their unix sockets, each call turned into calls on the
//! node's [`DeviceState`] (what is prepared) with what the API server says (`apiserver`); and
//! [`serve`], which runs them and publishes the node's ResourceSlice again when the GPUs change.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::Mutex;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::apiserver::{self, Publisher};
use crate::checkpoint::Prepared;
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
use crate::resource_slice::DRIVER;
use crate::state::{DeviceState, Places};
use crate::{Options, discover, log};

/// The service name the kubelet looks for among the supported versions.
pub const DRA_V1: &str = "v1.DRAPlugin";

/// What the DRA service calls on: the API server, and the node's prepared claims (one call at a
/// time: a claim is read, allotted and prepared under the state's lock).
pub struct Plugin {
    client: kube::Client,
    /// The node's name: its pool, where a claim's devices must be allocated.
    node: String,
    state: Mutex<DeviceState>,
    /// `--memory-oversubscription`, percent.
    oversubscription: u32,
}

async fn gpus(oversubscription: u32) -> Result<discover::Gpus, String> {
    tokio::task::spawn_blocking(move || discover::gpus(oversubscription))
        .await
        .map_err(|e| format!("NVML: {e}"))?
}

/// A prepared claim's devices as the kubelet is told them.
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

impl Plugin {
    /// A claim prepared before gets the same answer; otherwise the claim as the API server has
    /// it, allotted on the GPUs NVML describes now, with the pods it is reserved for when the
    /// container index is kept, is prepared.
    async fn prepare(&self, c: ClaimRef) -> Result<Vec<Device>, String> {
        let mut st = self.state.lock().await;
        if let Some(p) = st.prepared(&c)? {
            return Ok(devices_of(p));
        }
        let object = apiserver::claim(&self.client, &c)
            .await
            .map_err(|e| format!("{c}: {e}"))?;
        let found = gpus(self.oversubscription)
            .await
            .map_err(|e| format!("{c}: {e}"))?;
        let allotted = claim::allotments(&c, &object, &self.node, &found.usable)?;
        let pods = if st.keeps_index() {
            apiserver::reserved_pods(&self.client, &c, &object)
                .await
                .map_err(|e| format!("{c}: {e}"))?
        } else {
            Vec::new()
        };
        let p = st.prepare(&c, allotted, &found.usable, &pods)?;
        Ok(devices_of(p))
    }

    async fn unprepare(&self, c: ClaimRef) -> Result<(), String> {
        self.state.lock().await.unprepare(&c)
    }
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

/// Serves the kubelet until SIGTERM or SIGINT: loads the state, publishes the node's
/// ResourceSlice, registers, and reads the GPUs again every `--rescan`.
pub async fn serve(opts: Options) -> Result<(), String> {
    for d in [&opts.plugin_dir, &opts.cdi_dir, &opts.registry_dir] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let state = DeviceState::load(Places::of(&opts))?;
    let client = apiserver::client(&opts).await?;
    let node = apiserver::node(&client, &opts.node_name).await?;
    let found = gpus(opts.memory_oversubscription).await?;
    let publisher = Publisher::new(client.clone(), node);
    let plugin = Arc::new(Plugin {
        client,
        node: opts.node_name.clone(),
        state: Mutex::new(state),
        oversubscription: opts.memory_oversubscription,
    });
    publisher.publish(&found).await?;

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
    if opts.memory_oversubscription > crate::resource_slice::NO_OVERSUBSCRIPTION {
        log(&format!(
            "memory caps on each GPU may add up to {}% of its memory; on a full GPU a claim's \
             processes wait for room (memoryWait, {} unless the claim says) while quiet processes \
             of other claims give theirs back (memoryFreezeIdle, {} unless the claim says)",
            opts.memory_oversubscription,
            crate::resource_slice::OVERSUBSCRIBED_MEMORY_WAIT,
            crate::resource_slice::OVERSUBSCRIBED_FREEZE_IDLE
        ));
    }
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
                match gpus(opts.memory_oversubscription).await {
                    Ok(found) => if let Err(e) = publisher.publish(&found).await {
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
