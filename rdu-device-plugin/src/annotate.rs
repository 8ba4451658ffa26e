//! Publishes the tiles each pod holds as the pod annotation `rdu.dev/tiles`, so that the operator can report
//! them in `status.ranks[].tiles`: only the kubelet and this plugin know which devices a pod was given.

use std::collections::HashMap;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use rdu_crds::consts::TILES_ANNOTATION;

use rdu_tiles::node::PodDevices;

/// The field manager of the plugin's writes.
pub const FIELD_MANAGER: &str = "rdu-device-plugin";

/// Errors writing an annotation.
#[derive(Debug, thiserror::Error)]
pub enum AnnotateError {
    #[error("annotating pod {pod}")]
    Patch {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("pod {0:?} is not namespace/name")]
    PodName(String),
}

/// Writes one pod's annotation; a plain trait so the poller is testable without an API server.
pub trait PodAnnotator: Send + Sync {
    /// Sets `rdu.dev/tiles` of pod `namespace/name` to `tiles`.
    fn annotate<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        tiles: &'a str,
    ) -> BoxFuture<'a, Result<(), AnnotateError>>;
}

/// The annotation through the API server, by server-side apply of just that annotation.
pub struct KubeAnnotator {
    client: kube::Client,
}

impl KubeAnnotator {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl PodAnnotator for KubeAnnotator {
    fn annotate<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        tiles: &'a str,
    ) -> BoxFuture<'a, Result<(), AnnotateError>> {
        Box::pin(async move {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            let patch = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "annotations": {TILES_ANNOTATION: tiles}},
            });
            pods.patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map(|_| ())
            .map_err(|source| AnnotateError::Patch {
                pod: format!("{namespace}/{name}"),
                source,
            })
        })
    }
}

/// The annotation value: the pod's device IDs, sorted, comma-separated.
pub fn tiles_value(device_ids: &[String]) -> String {
    let mut ids: Vec<&str> = device_ids.iter().map(String::as_str).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.join(",")
}

/// Annotates pods whose tiles are not yet published as they are now, remembering what it wrote.
pub struct TilePublisher {
    annotator: Box<dyn PodAnnotator>,
    /// `namespace/name` → the value last written.
    published: HashMap<String, String>,
}

impl TilePublisher {
    pub fn new(annotator: Box<dyn PodAnnotator>) -> Self {
        Self {
            annotator,
            published: HashMap::new(),
        }
    }

    /// The pods (`namespace/name`, value) whose annotation must be written.
    pub fn pending(&self, pods: &[PodDevices]) -> Vec<(String, String)> {
        pods.iter()
            .map(|p| (p.pod.clone(), tiles_value(&p.device_ids)))
            .filter(|(pod, value)| self.published.get(pod) != Some(value))
            .collect()
    }

    /// Writes what is pending and forgets pods the kubelet no longer lists; returns how many were written.
    /// A failed write is retried at the next call.
    pub async fn publish(&mut self, pods: &[PodDevices]) -> Result<usize, AnnotateError> {
        self.published
            .retain(|pod, _| pods.iter().any(|p| &p.pod == pod));
        let mut written = 0;
        for (pod, value) in self.pending(pods) {
            let (namespace, name) = pod
                .split_once('/')
                .ok_or_else(|| AnnotateError::PodName(pod.clone()))?;
            self.annotator.annotate(namespace, name, &value).await?;
            tracing::debug!(%pod, tiles = %value, "published the pod's tiles");
            self.published.insert(pod, value);
            written += 1;
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    type Writes = Arc<Mutex<Vec<(String, String, String)>>>;

    /// Records writes; fails for pods named `broken`.
    struct Recorder(Writes);

    impl PodAnnotator for Recorder {
        fn annotate<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
            tiles: &'a str,
        ) -> BoxFuture<'a, Result<(), AnnotateError>> {
            Box::pin(async move {
                if name == "broken" {
                    return Err(AnnotateError::PodName(name.into()));
                }
                self.0
                    .lock()
                    .unwrap()
                    .push((namespace.into(), name.into(), tiles.into()));
                Ok(())
            })
        }
    }

    fn pod(pod: &str, ids: &[&str]) -> PodDevices {
        PodDevices {
            pod: pod.into(),
            rank: None,
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn the_value_is_sorted_and_deduplicated() {
        let ids = ["rdu1-tile1", "rdu0-tile3", "rdu1-tile1"].map(String::from);
        assert_eq!(tiles_value(&ids), "rdu0-tile3,rdu1-tile1");
    }

    #[tokio::test]
    async fn each_pod_is_written_once_and_again_only_when_its_tiles_change() {
        let writes = Writes::default();
        let mut publisher = TilePublisher::new(Box::new(Recorder(writes.clone())));
        let a = pod("ml/a-worker-0", &["rdu0-tile1", "rdu0-tile0"]);
        let b = pod("ml/a-worker-1", &["rdu1-tile0"]);
        assert_eq!(publisher.publish(&[a.clone(), b.clone()]).await.unwrap(), 2);
        assert_eq!(publisher.publish(&[a.clone(), b.clone()]).await.unwrap(), 0);
        let b2 = pod("ml/a-worker-1", &["rdu2-tile0"]);
        assert_eq!(publisher.publish(&[a.clone(), b2]).await.unwrap(), 1);
        assert_eq!(
            publisher.publish(std::slice::from_ref(&b)).await.unwrap(),
            1
        );
        // A pod that left and came back (same name, a new incarnation) is written again.
        assert_eq!(publisher.publish(&[a, b]).await.unwrap(), 1);
        let writes = writes.lock().unwrap().clone();
        assert_eq!(
            writes[0],
            (
                "ml".into(),
                "a-worker-0".into(),
                "rdu0-tile0,rdu0-tile1".into()
            )
        );
        assert_eq!(writes.len(), 5, "{writes:?}");
    }

    #[tokio::test]
    async fn a_failed_write_is_retried_at_the_next_poll() {
        let writes = Writes::default();
        let mut publisher = TilePublisher::new(Box::new(Recorder(writes.clone())));
        let broken = pod("ml/broken", &["rdu0-tile0"]);
        assert!(
            publisher
                .publish(std::slice::from_ref(&broken))
                .await
                .is_err()
        );
        assert_eq!(publisher.pending(&[broken]).len(), 1);
        let unnamed = pod("no-namespace", &["rdu0-tile0"]);
        assert!(matches!(
            publisher.publish(&[unnamed]).await,
            Err(AnnotateError::PodName(_))
        ));
    }
}
