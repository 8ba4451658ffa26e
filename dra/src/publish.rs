//! Publishing a node's ResourceSlices: each is created or updated by server-side apply (field manager `rdu-dra`),
//! and slices of this node and driver that are no longer published are deleted.

use crate::devices::{DRIVER_NAME, DevicesError, resource_slices};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use rdu_tiles::topology::Topology;

/// The field manager of every field the driver applies.
pub const FIELD_MANAGER: &str = "rdu-dra";

/// Errors publishing a node's ResourceSlices.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("cannot build the ResourceSlices of node {node}")]
    Build {
        node: String,
        #[source]
        source: DevicesError,
    },
    #[error("cannot apply ResourceSlice {name}")]
    Apply {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot list the ResourceSlices of node {node}")]
    List {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot delete stale ResourceSlice {name}")]
    Delete {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// The field selector of the ResourceSlices this driver publishes for `node`.
pub fn own_slices_selector(node: &str) -> String {
    format!("spec.nodeName={node},spec.driver={DRIVER_NAME}")
}

/// The apply parameters: field manager `rdu-dra`, forcing conflicts (the driver owns its slices).
pub fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// The names among `existing` that `published` no longer contains.
pub fn stale_names<'a>(existing: &'a [ResourceSlice], published: &[ResourceSlice]) -> Vec<&'a str> {
    existing
        .iter()
        .filter_map(|s| s.metadata.name.as_deref())
        .filter(|name| {
            !published
                .iter()
                .any(|p| p.metadata.name.as_deref() == Some(*name))
        })
        .collect()
}

/// Applies the ResourceSlices of `node` and deletes its stale ones; returns what the API server stored.
pub async fn publish(
    client: kube::Client,
    node: &str,
    topology: &Topology,
    model: &str,
    generation: i64,
) -> Result<Vec<ResourceSlice>, PublishError> {
    let slices = resource_slices(node, topology, model, generation).map_err(|source| {
        PublishError::Build {
            node: node.to_string(),
            source,
        }
    })?;
    let api: Api<ResourceSlice> = Api::all(client);
    let mut stored = Vec::with_capacity(slices.len());
    for slice in &slices {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let applied = api
            .patch(&name, &apply_params(), &Patch::Apply(slice))
            .await
            .map_err(|source| PublishError::Apply { name, source })?;
        stored.push(applied);
    }
    let existing = api
        .list(&ListParams::default().fields(&own_slices_selector(node)))
        .await
        .map_err(|source| PublishError::List {
            node: node.to_string(),
            source,
        })?;
    for name in stale_names(&existing.items, &slices) {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => {
                return Err(PublishError::Delete {
                    name: name.to_string(),
                    source,
                });
            }
        }
    }
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_applied_object_is_a_complete_v1_resource_slice() {
        let topo = Topology::new(2, 2).unwrap();
        let slices = resource_slices("node-a", &topo, "SN30", 7).unwrap();
        // What `Patch::Apply(slice)` sends.
        let body = serde_json::to_value(&slices[0]).unwrap();
        assert_eq!(body["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(body["kind"], "ResourceSlice");
        assert_eq!(body["metadata"]["name"], "node-a-rdu.dev-0");
        assert_eq!(body["spec"]["driver"], "rdu.dev");
        assert_eq!(body["spec"]["nodeName"], "node-a");
        assert_eq!(
            body["spec"]["pool"],
            serde_json::json!({"name": "node-a", "generation": 7, "resourceSliceCount": 1})
        );
        assert_eq!(
            body["spec"]["devices"][3],
            serde_json::json!({
                "name": "rdu1-tile1",
                "attributes": {
                    "rdu.dev/model": {"string": "SN30"},
                    "rdu.dev/rdu": {"int": 1},
                    "rdu.dev/tile": {"int": 1},
                },
            })
        );
        let params = apply_params();
        assert_eq!(params.field_manager.as_deref(), Some("rdu-dra"));
        assert!(params.force);
    }

    #[test]
    fn only_slices_no_longer_published_are_stale() {
        let big = Topology::new(20, 16).unwrap();
        let small = Topology::new(8, 4).unwrap();
        let before = resource_slices("n", &big, "SN40", 1).unwrap();
        let after = resource_slices("n", &small, "SN40", 2).unwrap();
        assert_eq!(stale_names(&before, &after), ["n-rdu.dev-1", "n-rdu.dev-2"]);
        assert!(stale_names(&after, &after).is_empty());
        assert_eq!(
            own_slices_selector("n"),
            "spec.nodeName=n,spec.driver=rdu.dev"
        );
    }
}
