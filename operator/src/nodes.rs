//! What the operator knows of the cluster's nodes, as pure functions of the node cache and the pod cache: which
//! nodes are lost (their pods will never report or terminate on their own: the node controller marked the node
//! unreachable, an operator tainted it `out-of-service`, or it was deleted), and how many ranks of a job the
//! schedulable nodes still have room for, so that a gang is created whole or not at all.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The taint an administrator puts on a node that is shut down for good (non-graceful node shutdown): its pods
/// may be deleted at once.
pub(crate) const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// What the lifecycle knows of the cluster beyond the job's own pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// The nodes of the job's pods (and of the ranks it last saw) whose pods are lost, with why.
    pub lost: BTreeMap<String, Loss>,
    /// Room for the job's ranks on the schedulable nodes; `None` when unknown (no node cache) or not needed (a
    /// generation is running).
    pub room: Option<Room>,
}

/// Why a node's pods are lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Its Ready condition is Unknown: the node controller has not heard from its kubelet within the grace period.
    Unreachable,
    /// It carries the `node.kubernetes.io/out-of-service` taint.
    OutOfService,
    /// The Node object is gone.
    Deleted,
}

impl Loss {
    /// For conditions and events: "node n1 is unreachable".
    pub fn describe(&self, node: &str) -> String {
        match self {
            Loss::Unreachable => format!(
                "node {node} is unreachable (its kubelet stopped reporting; Ready is Unknown)"
            ),
            Loss::OutOfService => format!("node {node} is tainted {OUT_OF_SERVICE_TAINT}"),
            Loss::Deleted => format!("node {node} was deleted"),
        }
    }
}

/// Whether the pods of `node` (None: no such Node) are lost.
pub(crate) fn loss(node: Option<&Node>) -> Option<Loss> {
    let Some(node) = node else {
        return Some(Loss::Deleted);
    };
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    if taints.is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT)) {
        return Some(Loss::OutOfService);
    }
    (ready(node).as_deref() == Some("Unknown")).then_some(Loss::Unreachable)
}

/// Whether every one of `nodes` (at least one) is unreachable at once: the node lifecycle controller's "full
/// disruption", which it takes for a fault of the control plane or of the network in front of it rather than of
/// the nodes, and evicts nothing. An API server outage leaves every kubelet's heartbeat stale together; the
/// operator then loses no node either (deleted and out-of-service nodes are still lost).
pub(crate) fn fully_disrupted<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> bool {
    let mut any = false;
    for node in nodes {
        if ready(node).as_deref() != Some("Unknown") {
            return false;
        }
        any = true;
    }
    any
}

/// The status of the node's Ready condition, if it has one.
fn ready(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

/// What of a node matters to the jobs: whether it is ready, cordoned, tainted, and how many devices it offers.
/// A node's watch events that leave this unchanged (heartbeats, images, conditions of other kinds) wake no job.
pub(crate) fn fingerprint(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    ready(node).hash(&mut hasher);
    let spec = node.spec.as_ref();
    spec.and_then(|s| s.unschedulable).hash(&mut hasher);
    for taint in spec.and_then(|s| s.taints.as_ref()).into_iter().flatten() {
        (&taint.key, &taint.value, &taint.effect).hash(&mut hasher);
    }
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    for (resource, quantity) in allocatable.into_iter().flatten() {
        (resource, &quantity.0).hash(&mut hasher);
    }
    hasher.finish()
}

/// What a rank pod needs of a node: `count` of `resource`, the pod's tolerations and node selector.
#[derive(Clone, Debug, Default)]
pub(crate) struct RankNeeds {
    pub resource: String,
    pub count: u64,
    pub tolerations: Vec<Toleration>,
    pub node_selector: BTreeMap<String, String>,
}

/// Room for a gang on the schedulable nodes.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Room {
    /// Ranks that fit, by node (eligible nodes only; zero entries kept, so the message names them).
    pub by_node: BTreeMap<String, u64>,
    /// Nodes left out, with why (not ready, cordoned, tainted, not selected).
    pub excluded: BTreeMap<String, String>,
    /// The most devices any eligible node has in all (free or not): a rank needing more never fits.
    pub largest: u64,
    /// Whether any node at all (eligible or not) advertises the resource. When none does (a cluster scaling its
    /// device nodes from zero, or without the device plugin) there is nothing to judge room by.
    pub offered: bool,
}

impl Room {
    /// How many ranks fit in all.
    pub fn ranks(&self) -> u64 {
        self.by_node.values().sum()
    }

    /// "node-1 room for 2, node-3 room for 0 (node-2 not ready)".
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .by_node
            .iter()
            .map(|(node, n)| format!("{node} room for {n}"))
            .collect();
        if parts.is_empty() {
            parts.push("no schedulable node".into());
        }
        let mut text = parts.join(", ");
        if !self.excluded.is_empty() {
            let out: Vec<String> = self
                .excluded
                .iter()
                .map(|(node, why)| format!("{node} {why}"))
                .collect();
            text.push_str(&format!(" ({})", out.join("; ")));
        }
        text
    }
}

/// How many ranks needing `needs` fit on each of `nodes`, given the pods the operator knows of (`pods`: every
/// pod of every RduJob; a terminating pod still holds its devices). Pods that request the resource outside
/// RduJobs are not seen: the scheduler stays the judge, and this only keeps a gang from starting by halves when
/// the cluster visibly cannot hold it.
pub(crate) fn room<'a>(
    needs: &RankNeeds,
    nodes: impl IntoIterator<Item = &'a Node>,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> Room {
    let mut used: BTreeMap<String, u64> = BTreeMap::new();
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_ref()) else {
            continue;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        *used.entry(node.clone()).or_default() += requested(pod, &needs.resource);
    }
    let mut room = Room::default();
    for node in nodes {
        let Some(name) = node.metadata.name.clone() else {
            continue;
        };
        let allocatable = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(&needs.resource))
            .map_or(0, quantity);
        room.offered |= allocatable > 0;
        if let Some(why) = ineligible(node, needs) {
            room.excluded.insert(name, why);
            continue;
        }
        let free = allocatable.saturating_sub(used.get(&name).copied().unwrap_or(0));
        room.largest = room.largest.max(allocatable);
        room.by_node.insert(name, free / needs.count.max(1));
    }
    room
}

/// Why a rank could not be scheduled on `node`, if it could not.
fn ineligible(node: &Node, needs: &RankNeeds) -> Option<String> {
    if let Some(loss) = loss(Some(node)) {
        return Some(match loss {
            Loss::Unreachable => "unreachable".into(),
            Loss::OutOfService => "out of service".into(),
            Loss::Deleted => "deleted".into(),
        });
    }
    if ready(node).as_deref() != Some("True") {
        return Some("not ready".into());
    }
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable) == Some(true) {
        return Some("cordoned".into());
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if let Some((key, _)) = needs
        .node_selector
        .iter()
        .find(|(k, v)| labels.get(*k) != Some(v))
    {
        return Some(format!("not selected (nodeSelector {key})"));
    }
    let taints = spec.and_then(|s| s.taints.as_ref());
    if let Some(taint) = taints.into_iter().flatten().find(|t| {
        matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
            && !needs.tolerations.iter().any(|tol| tolerates(tol, t))
    }) {
        return Some(format!("tainted {}:{}", taint.key, taint.effect));
    }
    None
}

/// Whether `toleration` tolerates `taint`, by Kubernetes' rules.
pub(crate) fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => key.is_empty() || key == taint.key,
        _ => {
            key == taint.key
                && toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
    }
}

/// What `pod` requests of `resource` (extended resources: requests equal limits), summed over its containers.
fn requested(pod: &Pod, resource: &str) -> u64 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    spec.containers
        .iter()
        .filter_map(|c| c.resources.as_ref())
        .map(|r| {
            r.requests
                .as_ref()
                .and_then(|q| q.get(resource))
                .or_else(|| r.limits.as_ref().and_then(|q| q.get(resource)))
                .map_or(0, quantity)
        })
        .sum()
}

/// A whole-number quantity (extended resources are counted in whole devices); anything else counts as 0.
fn quantity(q: &Quantity) -> u64 {
    q.0.trim().parse().unwrap_or(0)
}

#[cfg(test)]
mod tests;
