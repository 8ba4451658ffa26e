//! Through one root: reduce to the root, and the star all-reduce that reduces and broadcasts
//! chunk by chunk ("through the host"). The reduce is also the hierarchical algorithm's first
//! step within a node.

use crate::error::CollectiveError;
use crate::kernels::Apply;
use crate::segments::ChunkGrid;
use crate::transport::Inbox;

use super::{Exchange, PHASE_BCAST, PHASE_GATHER, Wire, position};

/// Sums `buf` of every rank of `group` into the root's `buf` (the root must be `group[0]`,
/// the lowest rank): the root adds the others' chunks in group order, so the result is the
/// same however the network interleaves. Other ranks' `buf` is left unchanged.
pub(crate) async fn reduce_to_root(
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    group: &[u32],
    buf: &mut [f32],
) -> Result<(), CollectiveError> {
    let Some(&root) = group.first() else {
        return Ok(());
    };
    position(group, wire.me)?;
    let grid = ChunkGrid::new(buf, 1, wire.chunk_elems);
    let chunks = grid.chunks_in(0);
    if wire.me != root {
        for k in 0..chunks {
            wire.send(
                root,
                wire.id(PHASE_GATHER, 0, k),
                &mut grid.lock(0, k).await,
            )
            .await?;
        }
        return Ok(());
    }
    for k in 0..chunks {
        add_chunk_of_each(wire, inboxes, &group[1..], k, &mut grid.lock(0, k).await).await?;
    }
    Ok(())
}

/// A root's share of a gather: adds chunk `k` of each of `srcs`, in that order, into `cell`.
async fn add_chunk_of_each(
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    srcs: &[u32],
    k: usize,
    cell: &mut [f32],
) -> Result<(), CollectiveError> {
    for &src in srcs {
        let id = wire.id(PHASE_GATHER, 0, k);
        wire.recv(inboxes, src, id, cell, Apply::Add).await?;
    }
    Ok(())
}

/// Star all-reduce over `group` with root `group[0]` ("through the host"), pipelined: the
/// root adds chunk `k` of every rank in group order and sends the sum of chunk `k` back while
/// later chunks are still arriving; other ranks send and receive concurrently.
pub(crate) async fn star(
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    group: &[u32],
    buf: &mut [f32],
) -> Result<(), CollectiveError> {
    let Some(&root) = group.first() else {
        return Ok(());
    };
    position(group, wire.me)?;
    if group.len() == 1 {
        return Ok(());
    }
    let grid = ChunkGrid::new(buf, 1, wire.chunk_elems);
    let chunks = grid.chunks_in(0);
    if wire.me == root {
        for k in 0..chunks {
            let mut cell = grid.lock(0, k).await;
            add_chunk_of_each(wire, inboxes, &group[1..], k, &mut cell).await?;
            for &dst in &group[1..] {
                wire.send(dst, wire.id(PHASE_BCAST, 0, k), &mut cell)
                    .await?;
            }
        }
        return Ok(());
    }
    let to_root = Exchange {
        to: root,
        send_phase: PHASE_GATHER,
        from: root,
        receive_phase: PHASE_BCAST,
        // The sum of chunk k cannot exist before this rank sent chunk k; the exchange keeps the
        // overwrite after the send even so.
        apply: Apply::Copy,
    };
    to_root.run(wire, inboxes, &grid).await
}
