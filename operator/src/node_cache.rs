//! The operator's cache of Nodes (the store its node watch keeps) and what it tells one job's reconcile: which of
//! its pods' nodes are lost, and, when a generation is about to be created, the room the schedulable nodes have for
//! it. Until the first full list arrived it tells nothing (an empty cache would call every node deleted).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{ObjectRef, Store};
use rdu_crds::{RduJob, consts};

use crate::nodes::{ClusterView, Loss, RankNeeds, fully_disrupted, loss, room};

/// The node cache, whether it is complete, and whether a new generation waits for room.
#[derive(Clone)]
pub struct NodeCache {
    store: Store<Node>,
    synced: Arc<AtomicBool>,
    wait_for_room: bool,
}

impl Default for NodeCache {
    /// An empty cache that never syncs: the lifecycle learns nothing of nodes (as in tests without a node watch).
    fn default() -> Self {
        Self::new(kube::runtime::reflector::store::<Node>().0, true)
    }
}

impl NodeCache {
    /// `wait_for_room` false: a new generation is created whatever the nodes' room (`--wait-for-room=false`, for
    /// clusters whose autoscaler adds nodes for pending pods: pods held back would never make it scale).
    pub fn new(store: Store<Node>, wait_for_room: bool) -> Self {
        Self {
            store,
            synced: Arc::new(AtomicBool::new(false)),
            wait_for_room,
        }
    }

    /// The watch delivered its first full list: from now on a node missing from the cache is deleted.
    pub fn mark_synced(&self) {
        self.synced.store(true, Ordering::SeqCst);
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// What `job` (with its own `pods`) needs to know of the nodes; `all_pods` holds every RduJob's pods (what holds
    /// devices on each node), read only when a generation is about to be created.
    pub fn view(&self, job: &RduJob, pods: &[Arc<Pod>], all_pods: &Store<Pod>) -> ClusterView {
        if !self.is_synced() {
            return ClusterView::default();
        }
        let mut names: BTreeSet<&str> = pods
            .iter()
            .filter_map(|p| p.spec.as_ref()?.node_name.as_deref())
            .collect();
        let ranks = job
            .status
            .as_ref()
            .map(|s| s.ranks.as_slice())
            .unwrap_or_default();
        names.extend(ranks.iter().filter_map(|r| r.node.as_deref()));
        let every_node_unreachable = fully_disrupted(self.store.state().iter().map(AsRef::as_ref));
        let lost: BTreeMap<String, _> = names
            .into_iter()
            .filter_map(|name| {
                let node = self.store.get(&ObjectRef::new(name));
                loss(node.as_deref()).map(|l| (name.to_string(), l))
            })
            .filter(|(_, l)| !(every_node_unreachable && *l == Loss::Unreachable))
            .collect();
        let room = rank_needs(job)
            .filter(|_| self.wait_for_room && pods.is_empty())
            .map(|needs| {
                let (nodes, all_pods) = (self.store.state(), all_pods.state());
                room(
                    &needs,
                    nodes.iter().map(AsRef::as_ref),
                    all_pods.iter().map(AsRef::as_ref),
                )
            })
            .filter(|room| room.offered);
        ClusterView { lost, room }
    }
}

/// What one rank pod of `job` asks of a node: its tiles, and the template's tolerations and node selector. None for
/// tiles claimed through DRA: the scheduler allocates them from ResourceSlices, which this cache does not hold, so
/// the job does not wait for room (the scheduler's reason for a pending rank is reported instead).
pub(crate) fn rank_needs(job: &RduJob) -> Option<RankNeeds> {
    if job.spec.tile_allocation.is_dra() {
        return None;
    }
    let template = job.spec.template.as_ref().and_then(|t| t.spec.as_ref());
    Some(RankNeeds {
        resource: consts::TILE_RESOURCE.to_string(),
        count: u64::from(job.spec.tiles_per_worker),
        tolerations: template
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default(),
        node_selector: template
            .and_then(|s| s.node_selector.clone())
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::job;

    #[test]
    fn a_rank_needs_its_extended_resource_and_nothing_the_cache_can_count_through_dra() {
        let mut j = job("mnist", Some("ml"), 4);
        let needs = rank_needs(&j).expect("the device plugin's tiles");
        assert_eq!(
            (needs.resource.as_str(), needs.count),
            (consts::TILE_RESOURCE, 2)
        );
        j.spec.tile_allocation.api = rdu_crds::TileApi::Dra;
        assert!(rank_needs(&j).is_none());
    }
}
