//! The plugin's client of the API server: the client itself (a kubeconfig, else the pod's
//! service account), this node, a claim as the scheduler allocated it, the pods a claim is
//! reserved for (for the container index), and the node's ResourceSlice, published again when the
//! GPUs change. Errors are one line, without the claim's name (the caller adds it).

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::Mutex;

use crate::claim::ClaimRef;
use crate::resource_slice::{self, DRIVER, Gpu, NodeRef};
use crate::{Options, discover, log};

/// A client of the API server `opts` names (`--kubeconfig`), else of the one the environment
/// gives (`$KUBECONFIG`, the pod's service account).
pub async fn client(opts: &Options) -> Result<kube::Client, String> {
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

/// The node `name`, as the ResourceSlice's owner.
pub async fn node(client: &kube::Client, name: &str) -> Result<NodeRef, String> {
    let node = Api::<Node>::all(client.clone())
        .get(name)
        .await
        .map_err(|e| format!("node {name}: {e}"))?;
    Ok(NodeRef {
        name: name.to_owned(),
        uid: node.metadata.uid.unwrap_or_default(),
    })
}

/// The claim `c` as the API server has it now.
pub async fn claim(client: &kube::Client, c: &ClaimRef) -> Result<ResourceClaim, String> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &c.namespace);
    api.get(&c.name)
        .await
        .map_err(|e| format!("reading it from the API server: {e}"))
}

/// The pods the claim `object` is reserved for, each with the name it is reserved under; a pod
/// of that name whose uid is not the reserved one (the reserved pod is gone and another of its
/// name was made) is not the claim's and is left out. Err: a reserved pod that cannot be read.
pub async fn reserved_pods(
    client: &kube::Client,
    c: &ClaimRef,
    object: &ResourceClaim,
) -> Result<Vec<(String, Pod)>, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &c.namespace);
    let reserved = object
        .status
        .iter()
        .flat_map(|s| s.reserved_for.iter().flatten())
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty());
    let mut out = Vec::new();
    for r in reserved {
        let pod = pods.get(&r.name).await.map_err(|e| {
            format!(
                "reading pod {}/{} it is reserved for: {e}",
                c.namespace, r.name
            )
        })?;
        if pod.metadata.uid.as_deref().unwrap_or_default() == r.uid {
            out.push((r.name.clone(), pod));
        }
    }
    Ok(out)
}

/// Publishes the node's ResourceSlice, and remembers what it published last.
pub struct Publisher {
    client: kube::Client,
    node: NodeRef,
    /// The GPUs last published, and the pool generation they were published at.
    published: Mutex<Option<(i64, Vec<Gpu>)>>,
}

impl Publisher {
    pub fn new(client: kube::Client, node: NodeRef) -> Publisher {
        Publisher {
            client,
            node,
            published: Mutex::new(None),
        }
    }

    /// Publishes the slice if the GPUs differ from what was last published (server-side apply,
    /// at the next pool generation).
    pub async fn publish(&self, found: &discover::Gpus) -> Result<(), String> {
        for (i, why) in &found.unusable {
            log(&format!("GPU {i} is not published: {why}"));
        }
        let mut published = self.published.lock().await;
        if published.as_ref().is_some_and(|(_, g)| *g == found.usable) {
            return Ok(());
        }
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let name = resource_slice::slice_name(&self.node.name);
        let generation = match &*published {
            Some((g, _)) => g + 1,
            None => match api.get_opt(&name).await {
                Ok(Some(s)) => s.spec.pool.generation + 1,
                Ok(None) => 1,
                Err(e) => return Err(format!("reading ResourceSlice {name}: {e}")),
            },
        };
        let s = resource_slice::resource_slice(&self.node, generation, &found.usable);
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
        *published = Some((generation, found.usable.clone()));
        Ok(())
    }
}
