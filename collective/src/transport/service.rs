//! The `Collective` gRPC service every rank serves, on the collective port beside the data
//! port: aborts, and `Send` streams of chunks (`grpc`), each handed to its sender's inbox
//! through the router.

use std::sync::Arc;

use tokio::sync::oneshot;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use crate::proto;
use crate::transport::grpc::{FROM_RANK, GENERATION, GrpcSource};
use crate::transport::inbox::Handoff;
use crate::transport::router::ChunkReceiver;

fn metadata_u64(metadata: &MetadataMap, key: &str) -> Result<u64, Status> {
    metadata
        .get(key)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Status::invalid_argument(format!("missing or non-numeric {key} metadata")))
}

/// tonic adapter of a [`ChunkReceiver`].
pub(crate) struct CollectiveService<R>(pub(crate) Arc<R>);

#[tonic::async_trait]
impl<R: ChunkReceiver> proto::collective_server::Collective for CollectiveService<R> {
    async fn send(
        &self,
        request: Request<Streaming<proto::Chunk>>,
    ) -> Result<Response<proto::SendSummary>, Status> {
        let from = metadata_u64(request.metadata(), FROM_RANK)?;
        let from =
            u32::try_from(from).map_err(|_| Status::invalid_argument("from rank too large"))?;
        let generation = metadata_u64(request.metadata(), GENERATION)?;
        let slot = self.0.open(from, generation)?;
        let (done_tx, done_rx) = oneshot::channel();
        let handoff = Handoff::grpc(GrpcSource::new(request.into_inner()), done_tx);
        if slot.send(handoff).is_err() {
            return Err(Status::unavailable("rank is shutting down"));
        }
        let mut shutdown = self.0.shutdown_signal();
        tokio::select! {
            received = done_rx => Ok(Response::new(proto::SendSummary { chunks: received.unwrap_or_default() })),
            _ = shutdown.wait_for(|down| *down) => Err(Status::unavailable("rank is shutting down")),
        }
    }

    async fn abort(
        &self,
        request: Request<proto::AbortRequest>,
    ) -> Result<Response<proto::AbortResponse>, Status> {
        self.0.abort(request.into_inner())?;
        Ok(Response::new(proto::AbortResponse {}))
    }
}
