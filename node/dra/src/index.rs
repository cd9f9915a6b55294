//! Which containers of a pod use a claim, for the container index that tells cuslice-runtime a
//! container's CDI devices on containerd 1.6 (see `cuslice_cdi::index`, whose format the plugin
//! writes and the hook reads). Pure: from
//! the Pod as the API server returns it.

use k8s_openapi::api::core::v1::Pod;

/// The containers (init containers too) of `pod` that use the claim named `claim`, each with the
/// claim request it names (None: every request of the claim). A pod names a claim directly
/// (`resourceClaimName`) or through a template, whose claim's name the pod's status gives.
pub fn containers_using(pod: &Pod, claim: &str) -> Vec<(String, Option<String>)> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    let names: Vec<&str> =
        spec.resource_claims
            .iter()
            .flatten()
            .filter(|p| {
                p.resource_claim_name.as_deref() == Some(claim)
                    || statuses.into_iter().flatten().any(|s| {
                        s.name == p.name && s.resource_claim_name.as_deref() == Some(claim)
                    })
            })
            .map(|p| p.name.as_str())
            .collect();
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .flat_map(|c| {
            c.resources
                .iter()
                .flat_map(|r| r.claims.iter().flatten())
                .filter(|rc| names.contains(&rc.name.as_str()))
                .map(|rc| (c.name.clone(), rc.request.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_the_containers_that_name_the_claim() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {
                "resourceClaims": [
                    {"name": "gpu", "resourceClaimTemplateName": "t"},
                    {"name": "shared", "resourceClaimName": "team-gpu"}
                ],
                "initContainers": [{"name": "warm", "resources": {"claims": [{"name": "shared"}]}}],
                "containers": [
                    {"name": "main", "resources": {"claims": [{"name": "gpu", "request": "big"}]}},
                    {"name": "sidecar"},
                    {"name": "both", "resources": {"claims": [{"name": "gpu"}, {"name": "shared"}]}}
                ]
            },
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x7k"}]}
        }))
        .unwrap();
        assert_eq!(
            containers_using(&pod, "p-gpu-x7k"),
            vec![
                ("main".to_owned(), Some("big".to_owned())),
                ("both".to_owned(), None)
            ]
        );
        assert_eq!(
            containers_using(&pod, "team-gpu"),
            vec![("warm".to_owned(), None), ("both".to_owned(), None)]
        );
        assert!(containers_using(&pod, "other").is_empty());
    }
}
