//! `cuslice-dra-plugin`: the Kubernetes DRA kubelet plugin for the driver `gpu.cuslice.io`.
//!
//! - It publishes one ResourceSlice for its node: every GPU NVML describes is a device that
//!   several claims may share, each taking an amount of its `memory` and `cores` (consumable
//!   capacity). It reads NVML again every `--rescan` seconds and publishes again when the GPUs
//!   changed.
//! - It serves the kubelet's plugin registration API and the DRA v1 API on unix sockets.
//!   NodePrepareResources reads the allocated claim from the API server and writes one CDI spec
//!   per claim: the GPU's device nodes and driver libraries, the slice's settings as
//!   `CUSLICE_*` variables, and the cuslice hooks. The container runtime applies it.
//! - Prepared claims are kept in a checkpoint file, so that a restarted plugin unprepares (or
//!   prepares again, idempotently) claims an earlier run prepared.
//!
//! Policy (what a claim gets, what the node publishes) is pure, in `claim` and `resource_slice`.
//! The I/O is in three parts, after kubernetes-sigs/dra-example-driver's driver.go and state.go:
//! `service` turns the kubelet's gRPC calls into calls on `state`, which owns what is prepared
//! (checkpoint, CDI specs, container index entries); `apiserver` is the API server's client
//! (claims and pods in, the ResourceSlice out).
//!
//! What is the plugin's and what it shares with the hook side: the driver name
//! ([`resource_slice::DRIVER`]), what goes into a claim's CDI spec ([`cdi`]), which containers use a
//! claim ([`index`]) and when specs and index entries are written and removed ([`state`]) are
//! here. The formats the hook side reads too (the CDI schema, the claim spec's shape, the
//! container index entry and its file names and default directory) are in `cuslice_cdi`, so that
//! the hook needs none of this crate (tonic, kube).

pub mod apiserver;
pub mod cdi;
pub mod checkpoint;
pub mod claim;
pub mod discover;
pub mod index;
pub mod quantity;
pub mod resource_slice;
pub mod service;
pub mod state;

/// The kubelet's DRA v1 API (proto/dra/v1/api.proto).
pub mod dra {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// The kubelet's plugin registration API (proto/pluginregistration/v1/api.proto).
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

use std::path::PathBuf;
use std::time::Duration;

/// What the plugin is told on its command line.
#[derive(Debug, Clone)]
pub struct Options {
    pub node_name: String,
    /// dra.sock and checkpoint.json.
    pub plugin_dir: PathBuf,
    /// The kubelet's plugin watcher directory (the registration socket).
    pub registry_dir: PathBuf,
    /// Where CDI specs are written for the container runtime.
    pub cdi_dir: PathBuf,
    pub roots: discover::Roots,
    /// cuslice-hook and libcuslice.so, as paths on the host.
    pub hook: String,
    pub library: String,
    pub kubeconfig: Option<PathBuf>,
    pub rescan: Duration,
    /// The container index for cuslice-runtime on containerd 1.6 (None: not kept).
    pub container_index: Option<PathBuf>,
    /// How far the memory caps of claims on one GPU may add up, percent of its memory
    /// (`resource_slice::NO_OVERSUBSCRIPTION`: to its memory, no more).
    pub memory_oversubscription: u32,
}

impl Options {
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join("dra.sock")
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir
            .join(format!("{}-reg.sock", resource_slice::DRIVER))
    }

    pub fn checkpoint(&self) -> PathBuf {
        self.plugin_dir.join("checkpoint.json")
    }
}

/// One line to stderr, prefixed with the plugin's name.
fn log(line: &str) {
    eprintln!("cuslice-dra-plugin: {line}");
}

/// Runs the plugin until SIGTERM or SIGINT; Err: one line saying why it cannot run.
pub fn run(opts: Options) -> Result<(), String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?
        .block_on(service::serve(opts))
}
