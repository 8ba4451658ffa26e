//! Routing peers' incoming streams to inboxes: each peer may open one stream to this rank, of
//! this rank's generation, whichever transport it arrives on (the TCP data port or the gRPC
//! `Collective` service); a peer's abort latches this rank's failure.

use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, watch};
use tonic::Status;

use crate::error::CollectiveError;
use crate::fault::FailState;
use crate::proto;
use crate::transport::inbox::{Handoff, Inbox};

/// What a rank does with incoming streams and aborts; the gRPC service adapts it.
pub(crate) trait ChunkReceiver: Send + Sync + 'static {
    /// Accepts the stream of `from_rank` (returning where to hand it), or refuses it.
    fn open(&self, from_rank: u32, generation: u64) -> Result<oneshot::Sender<Handoff>, Status>;
    /// A peer says the job failed.
    fn abort(&self, request: proto::AbortRequest) -> Result<(), Status>;
    /// Becomes true when this rank shuts down.
    fn shutdown_signal(&self) -> watch::Receiver<bool>;
}

/// Routes streams to inboxes, one slot per peer rank, each usable once.
pub(crate) struct InboundRouter {
    me: u32,
    generation: u64,
    slots: Vec<Mutex<Option<oneshot::Sender<Handoff>>>>,
    fail: Arc<FailState>,
    shutdown: watch::Receiver<bool>,
}

impl InboundRouter {
    /// The router and the inboxes (indexed by rank; `None` for this rank).
    pub(crate) fn new(
        me: u32,
        world_size: u32,
        generation: u64,
        fail: Arc<FailState>,
        shutdown: watch::Receiver<bool>,
    ) -> (Self, Vec<Option<Inbox>>) {
        let mut slots = Vec::with_capacity(world_size as usize);
        let mut inboxes = Vec::with_capacity(world_size as usize);
        for rank in 0..world_size {
            if rank == me {
                slots.push(Mutex::new(None));
                inboxes.push(None);
            } else {
                let (tx, rx) = oneshot::channel();
                slots.push(Mutex::new(Some(tx)));
                inboxes.push(Some(Inbox::Waiting(rx)));
            }
        }
        let router = InboundRouter {
            me,
            generation,
            slots,
            fail,
            shutdown,
        };
        (router, inboxes)
    }

    fn check_generation(&self, generation: u64) -> Result<(), Status> {
        if generation == self.generation {
            Ok(())
        } else {
            Err(Status::failed_precondition(format!(
                "generation {generation} is not this rank's generation {}",
                self.generation
            )))
        }
    }
}

impl ChunkReceiver for InboundRouter {
    fn open(&self, from_rank: u32, generation: u64) -> Result<oneshot::Sender<Handoff>, Status> {
        self.check_generation(generation)?;
        if from_rank == self.me {
            return Err(Status::invalid_argument("a rank does not stream to itself"));
        }
        let slot = self.slots.get(from_rank as usize).ok_or_else(|| {
            Status::invalid_argument(format!(
                "from rank {from_rank} is outside 0..{}",
                self.slots.len()
            ))
        })?;
        slot.lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| {
                Status::already_exists(format!("rank {from_rank} already has a stream open"))
            })
    }

    fn abort(&self, request: proto::AbortRequest) -> Result<(), Status> {
        self.check_generation(request.generation)?;
        if request.from_rank as usize >= self.slots.len() {
            return Err(Status::invalid_argument("from_rank outside the world"));
        }
        let reason: String = request.reason.chars().take(1024).collect();
        tracing::warn!(rank = self.me, by_rank = request.from_rank, %reason, "abort received");
        self.fail.fail(CollectiveError::AbortedByPeer {
            by_rank: request.from_rank,
            reason,
            permanent: request.permanent,
        });
        Ok(())
    }

    fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> (InboundRouter, Vec<Option<Inbox>>, Arc<FailState>) {
        let fail = Arc::new(FailState::new());
        let (_tx, rx) = watch::channel(false);
        let (r, inboxes) = InboundRouter::new(1, 3, 7, fail.clone(), rx);
        (r, inboxes, fail)
    }

    #[test]
    fn streams_are_accepted_once_per_peer_and_checked() {
        let (r, inboxes, _) = router();
        assert!(inboxes[1].is_none() && inboxes[0].is_some());
        assert!(r.open(0, 7).is_ok());
        assert_eq!(
            r.open(0, 7).err().map(|s| s.code()),
            Some(tonic::Code::AlreadyExists)
        );
        assert_eq!(
            r.open(2, 6).err().map(|s| s.code()),
            Some(tonic::Code::FailedPrecondition)
        );
        assert_eq!(
            r.open(1, 7).err().map(|s| s.code()),
            Some(tonic::Code::InvalidArgument)
        );
        assert_eq!(
            r.open(3, 7).err().map(|s| s.code()),
            Some(tonic::Code::InvalidArgument)
        );
        assert!(r.open(2, 7).is_ok());
    }

    #[test]
    fn aborts_of_this_generation_latch_the_failure() {
        let (r, _inboxes, fail) = router();
        let stale = proto::AbortRequest {
            generation: 6,
            from_rank: 0,
            reason: "old".into(),
            permanent: false,
        };
        assert!(r.abort(stale).is_err());
        assert!(fail.current().is_none());
        let now = proto::AbortRequest {
            generation: 7,
            from_rank: 2,
            reason: "peer lost".into(),
            permanent: true,
        };
        assert!(r.abort(now).is_ok());
        assert!(matches!(
            fail.current(),
            Some(CollectiveError::AbortedByPeer {
                by_rank: 2,
                permanent: true,
                ..
            })
        ));
    }
}
