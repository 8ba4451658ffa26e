//! Who uses which tile, from the kubelet's pod-resources API (`List` on
//! /var/lib/kubelet/pod-resources/kubelet.sock): fills in pod and rank in the tile status, and frees tiles
//! of pods that are gone (the device plugin API never tells a plugin about frees).

use crate::annotate::TilePublisher;
use crate::podresources_api::ListPodResourcesRequest;
use crate::podresources_api::pod_resources_lister_client::PodResourcesListerClient;
use crate::unix_socket::{TransportError, unix_channel};
use rdu_tiles::node::{PodDevices, TileNode};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Default socket of the kubelet's pod-resources API.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// How long `List` may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors reading the pod-resources API.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error(transparent)]
    Dial(#[from] TransportError),
    #[error("pod-resources List failed: {0}")]
    List(tonic::Status),
    #[error("pod-resources List timed out after {LIST_TIMEOUT:?}")]
    Timeout,
}

/// The rank in a pod name of the form `<job>-worker-<rank>`.
pub fn rank_from_pod_name(name: &str) -> Option<u32> {
    let (_, rank) = name.rsplit_once("-worker-")?;
    if rank.is_empty() || !rank.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rank.parse().ok()
}

/// Lists the pods holding devices of `resource_name`.
pub async fn list_pod_devices(
    socket: &Path,
    resource_name: &str,
) -> Result<Vec<PodDevices>, PodResourcesError> {
    let call = async {
        let channel = unix_channel(socket).await?;
        let response = PodResourcesListerClient::new(channel)
            .list(ListPodResourcesRequest {})
            .await
            .map_err(PodResourcesError::List)?;
        Ok::<_, PodResourcesError>(response.into_inner())
    };
    let response = tokio::time::timeout(LIST_TIMEOUT, call)
        .await
        .map_err(|_| PodResourcesError::Timeout)??;
    Ok(response
        .pod_resources
        .into_iter()
        .filter_map(|pod| {
            let device_ids: Vec<String> = pod
                .containers
                .iter()
                .flat_map(|c| c.devices.iter())
                .filter(|d| d.resource_name == resource_name)
                .flat_map(|d| d.device_ids.iter().cloned())
                .collect();
            (!device_ids.is_empty()).then(|| PodDevices {
                rank: rank_from_pod_name(&pod.name),
                pod: format!("{}/{}", pod.namespace, pod.name),
                device_ids,
            })
        })
        .collect())
}

/// Pod resources are read this often for a while after a kubelet Allocate: the kubelet lists the pod once
/// its container exists, usually within a second, and its tiles should not wait a whole `interval`.
const AFTER_ALLOCATE_EVERY: Duration = Duration::from_millis(250);
/// How many such reads follow one Allocate (3 s in all).
const AFTER_ALLOCATE_READS: u32 = 12;

/// Polls the pod-resources API every `interval`, and every [`AFTER_ALLOCATE_EVERY`] for a while after each
/// Allocate, and reconciles the node's allocations with it; tiles allocated less than `grace` ago are kept
/// even when no pod lists them yet. With a `publisher`, each pod's tiles are also written on the pod as the
/// `rdu.dev/tiles` annotation.
pub fn spawn_pod_resources_poller(
    node: Arc<TileNode>,
    socket: PathBuf,
    interval: Duration,
    grace: Duration,
    mut publisher: Option<TilePublisher>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut warned = false;
        let mut quick_reads = 0u32;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = node.allocation_made() => quick_reads = AFTER_ALLOCATE_READS,
                _ = tokio::time::sleep(AFTER_ALLOCATE_EVERY), if quick_reads > 0 => quick_reads -= 1,
            }
            if !socket.exists() {
                continue;
            }
            match list_pod_devices(&socket, node.mode().resource_name()).await {
                Ok(pods) => {
                    warned = false;
                    if node.reconcile_with_pods(&pods, grace) {
                        tracing::info!(
                            pods = pods.len(),
                            "allocations reconciled with the kubelet's pod resources"
                        );
                    }
                    if let Some(publisher) = publisher.as_mut()
                        && let Err(e) = publisher.publish(&pods).await
                    {
                        tracing::warn!(error = %rdu_error_chain::Chain(&e), "cannot publish a pod's tiles; retrying at the next poll");
                    }
                }
                Err(e) if !warned => {
                    warned = true;
                    tracing::warn!(socket = %socket.display(), error = %rdu_error_chain::Chain(&e), "cannot read pod resources; pod and rank unknown");
                }
                Err(e) => {
                    tracing::debug!(error = %rdu_error_chain::Chain(&e), "pod resources still unavailable")
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_come_from_worker_pod_names() {
        assert_eq!(rank_from_pod_name("mnist-worker-3"), Some(3));
        assert_eq!(rank_from_pod_name("a-worker-b-worker-12"), Some(12));
        assert_eq!(rank_from_pod_name("mnist-worker-"), None);
        assert_eq!(rank_from_pod_name("mnist-worker-x1"), None);
        assert_eq!(rank_from_pod_name("nginx"), None);
    }
}
