//! Hierarchical all-reduce: reduce within each node to its leader, ring between the node
//! leaders, broadcast back within each node; for ranks that share nodes.

use crate::error::CollectiveError;
use crate::transport::Inbox;

use super::Wire;
use super::choice::NodeGroups;
use super::ring::ring;
use super::star::reduce_to_root;
use super::tree::broadcast;

/// All-reduce (sum) of `buf` over every rank: within this rank's node group (whose lowest rank
/// leads it), then around the ring of node leaders, then back within the node group.
pub(crate) async fn hierarchical(
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    groups: &NodeGroups,
    buf: &mut [f32],
) -> Result<(), CollectiveError> {
    let node = &groups.node_group;
    let leader = node.first().copied().unwrap_or(wire.me);
    if node.len() > 1 {
        reduce_to_root(wire, inboxes, node, buf).await?;
    }
    if leader == wire.me && groups.leaders.len() > 1 {
        ring(wire, inboxes, &groups.leaders, buf).await?;
    }
    if node.len() > 1 {
        broadcast(wire, inboxes, node, leader, buf).await?;
    }
    Ok(())
}
