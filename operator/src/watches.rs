//! The controller's watches, each driven by a task of its own that fills its cache before it wakes jobs: the pod
//! watch (only pods an RduJob controls, slimmed), the node watch (only changes that matter wake jobs), and when the
//! caches are synced.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use rdu_crds::{JobPhase, RduJob};
use tracing::{info, warn};

use crate::health::Health;
use crate::node_cache::NodeCache;
use crate::nodes::fingerprint;
use crate::slim;

/// The pod watch, driven by a task of its own that fills the pod cache and then passes each touched pod on to the
/// controller as a trigger. Driven inside the controller's task instead, a gang's burst of events was read too
/// slowly and the API server closed the watch as unresponsive, again and again, leaving the cache seconds behind.
/// The watch backs off on errors itself (the controller's trigger backoff would only slow the channel) and its
/// errors are logged here.
pub fn pod_watch(
    pods: Api<Pod>,
    config: watcher::Config,
    writer: reflector::store::Writer<Pod>,
    synced: Arc<Synced>,
) -> impl futures::Stream<Item = Result<Pod, watcher::Error>> + Send + 'static {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let events = watcher(pods, config)
        .default_backoff()
        // The label selects server-side, but anyone may set it: only pods an RduJob controls are cached, and of
        // those only what the operator reads (without managedFields alone, a 2,000-rank job's pods took half the
        // memory; without the template's fields, a tenant's large pods cost nothing).
        .try_filter_map(|event| std::future::ready(Ok(slim::own_pods_only(event))))
        .reflect(writer)
        .inspect_ok(on_first_sync(synced))
        .touched_objects();
    tokio::spawn(events.for_each(move |event| {
        match event {
            Ok(pod) => {
                // The controller is gone only at shutdown.
                let _ = tx.unbounded_send(Ok(pod));
            }
            Err(error) => warn!(error = %rdu_error_chain::Chain(&error), "pod watch failed; retrying with backoff"),
        }
        std::future::ready(())
    }));
    rx
}

/// The node watch, driven by a task of its own like the pod watch. The cache holds every node without its image
/// list and managedFields (the lifecycle reads readiness, taints, cordons and allocatable devices); only changes
/// of those wake jobs (`nodes::fingerprint`), not the kubelets' heartbeats.
pub fn node_watch(
    nodes: Api<Node>,
    writer: reflector::store::Writer<Node>,
    cache: NodeCache,
    synced: Arc<Synced>,
) -> impl futures::Stream<Item = Result<Node, watcher::Error>> + Send + 'static {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let mut first = on_first_sync(synced);
    let events = watcher(nodes, watcher::Config::default())
        .default_backoff()
        .modify(|node| {
            node.managed_fields_mut().clear();
            if let Some(status) = node.status.as_mut() {
                status.images = None;
            }
        })
        .reflect(writer);
    // What each node looked like when it last woke jobs; a deleted node always wakes them.
    let mut seen: HashMap<String, u64> = HashMap::new();
    tokio::spawn(events.for_each(move |event| {
        match event {
            Ok(event) => {
                first(&event);
                let woken = match event {
                    watcher::Event::InitDone => {
                        cache.mark_synced();
                        None
                    }
                    watcher::Event::Apply(node) | watcher::Event::InitApply(node) => {
                        let print = fingerprint(&node);
                        let name = node.name_any();
                        (seen.insert(name, print) != Some(print)).then_some(node)
                    }
                    watcher::Event::Delete(node) => {
                        seen.remove(&node.name_any());
                        Some(node)
                    }
                    watcher::Event::Init => None,
                };
                if let Some(node) = woken {
                    let _ = tx.unbounded_send(Ok(node));
                }
            }
            Err(error) => warn!(error = %rdu_error_chain::Chain(&error), "node watch failed; retrying with backoff"),
        }
        std::future::ready(())
    }));
    rx
}

/// The jobs a change of `node` may concern: those with ranks on it, and those not running (one may wait for
/// room).
pub fn jobs_woken_by(jobs: &Store<RduJob>, node: &Node) -> Vec<ObjectRef<RduJob>> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    jobs.state()
        .iter()
        .filter(|job| {
            let status = job.status.as_ref();
            let on_node =
                status.is_some_and(|s| s.ranks.iter().any(|r| r.node.as_deref() == Some(name)));
            let waiting = status
                .and_then(|s| s.phase)
                .is_none_or(|p| matches!(p, JobPhase::Pending | JobPhase::Restarting));
            on_node || waiting
        })
        .map(|job| ObjectRef::from_obj(job.as_ref()))
        .collect()
}

/// The caches still waiting for their first full list; the operator is ready when none is.
pub struct Synced {
    health: Arc<Health>,
    left: AtomicUsize,
}

impl Synced {
    /// Waits for `caches` first lists before it marks `health` synced.
    pub fn new(health: Arc<Health>, caches: usize) -> Arc<Self> {
        Arc::new(Synced {
            health,
            left: AtomicUsize::new(caches),
        })
    }
}

/// Counts a cache as synced at its stream's first `InitDone`.
pub fn on_first_sync<K>(synced: Arc<Synced>) -> impl FnMut(&watcher::Event<K>) {
    let mut counted = false;
    move |event| {
        if matches!(event, watcher::Event::InitDone) && !counted {
            counted = true;
            if synced.left.fetch_sub(1, Ordering::SeqCst) == 1 {
                synced.health.set_synced(true);
                info!("caches synced; ready");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::job;

    fn with_status(name: &str, status: serde_json::Value) -> RduJob {
        let mut job = job(name, Some("ml"), 2);
        job.status = Some(serde_json::from_value(status).expect("status"));
        job
    }

    #[test]
    fn a_node_wakes_the_jobs_with_ranks_on_it_and_those_waiting_for_room() {
        let (store, mut writer) = reflector::store::<RduJob>();
        for job in [
            with_status(
                "on-a",
                serde_json::json!({"phase": "Running", "ranks": [{"rank": 0, "pod": "on-a-worker-0", "node": "a"}]}),
            ),
            with_status(
                "on-b",
                serde_json::json!({"phase": "Running", "ranks": [{"rank": 0, "pod": "on-b-worker-0", "node": "b"}]}),
            ),
            with_status("pending", serde_json::json!({"phase": "Pending"})),
            with_status("restarting", serde_json::json!({"phase": "Restarting"})),
            with_status("done", serde_json::json!({"phase": "Succeeded"})),
            job("new", Some("ml"), 2),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(job));
        }
        let node: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "a"}})).expect("node");
        let mut woken: Vec<String> = jobs_woken_by(&store, &node)
            .into_iter()
            .map(|r| r.name)
            .collect();
        woken.sort();
        assert_eq!(woken, ["new", "on-a", "pending", "restarting"]);
    }
}
