//! Routing peers' incoming streams to inboxes: each peer may open one stream to this rank, of
//! this rank's generation, whichever transport it arrives on (the TCP data port or the gRPC
//! `Collective` service); a peer's abort latches this rank's failure, and the abort that latched
//! it is handed on to be forwarded down the aborting rank's tree.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot, watch};
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
    /// Where the abort that latched this rank's failure goes to be forwarded (the communicator's
    /// abort tree).
    relay: mpsc::UnboundedSender<proto::AbortRequest>,
    shutdown: watch::Receiver<bool>,
}

impl InboundRouter {
    /// The router and the inboxes (indexed by rank; `None` for this rank).
    pub(crate) fn new(
        me: u32,
        world_size: u32,
        generation: u64,
        fail: Arc<FailState>,
        relay: mpsc::UnboundedSender<proto::AbortRequest>,
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
            relay,
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
        let first = self.fail.fail(CollectiveError::AbortedByPeer {
            by_rank: request.from_rank,
            reason: reason.clone(),
            permanent: request.permanent,
        });
        tracing::warn!(rank = self.me, generation = self.generation, by_rank = request.from_rank, %reason, first, "abort received");
        // Only the abort that failed this rank goes on: a rank that had already failed spread its
        // own abort or forwards the one that failed it (why every rank still hears one: the
        // communicator's `abort` module). Handed over without waiting, so the caller's answer,
        // which its sender waits for, does not wait on this rank's children. A rank that stopped
        // forwarding (it shut down or was dropped; its server may still answer for a moment)
        // refuses instead: an answer would tell its sender the subtree below is covered.
        if first
            && self
                .relay
                .send(proto::AbortRequest { reason, ..request })
                .is_err()
        {
            return Err(Status::unavailable(format!(
                "rank {} is shutting down and forwards no abort; its sender calls its children",
                self.me
            )));
        }
        Ok(())
    }

    fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Relayed = mpsc::UnboundedReceiver<proto::AbortRequest>;

    fn router() -> (InboundRouter, Vec<Option<Inbox>>, Arc<FailState>, Relayed) {
        let fail = Arc::new(FailState::new());
        let (_tx, rx) = watch::channel(false);
        let (relay, relayed) = mpsc::unbounded_channel();
        let (r, inboxes) = InboundRouter::new(1, 3, 7, fail.clone(), relay, rx);
        (r, inboxes, fail, relayed)
    }

    #[test]
    fn streams_are_accepted_once_per_peer_and_checked() {
        let (r, inboxes, _, _) = router();
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
    fn aborts_of_this_generation_latch_the_failure_and_the_first_is_relayed() {
        let (r, _inboxes, fail, mut relayed) = router();
        let stale = proto::AbortRequest {
            generation: 6,
            from_rank: 0,
            reason: "old".into(),
            permanent: false,
        };
        assert!(r.abort(stale).is_err());
        assert!(fail.current().is_none());
        assert!(relayed.try_recv().is_err());
        let now = proto::AbortRequest {
            generation: 7,
            from_rank: 2,
            reason: "peer lost".into(),
            permanent: true,
        };
        assert!(r.abort(now.clone()).is_ok());
        assert_eq!(relayed.try_recv().ok(), Some(now.clone()));
        // Already failed: latched once, not forwarded again.
        let other = proto::AbortRequest {
            from_rank: 0,
            ..now
        };
        assert!(r.abort(other).is_ok());
        assert!(relayed.try_recv().is_err());
        assert!(matches!(
            fail.current(),
            Some(CollectiveError::AbortedByPeer {
                by_rank: 2,
                permanent: true,
                ..
            })
        ));
    }

    #[test]
    fn a_rank_that_stopped_forwarding_refuses_the_abort_so_its_sender_takes_over() {
        let (r, _inboxes, fail, relayed) = router();
        drop(relayed);
        let request = proto::AbortRequest {
            generation: 7,
            from_rank: 2,
            reason: "worker crashed".into(),
            permanent: false,
        };
        assert_eq!(
            r.abort(request).err().map(|s| s.code()),
            Some(tonic::Code::Unavailable)
        );
        assert!(matches!(
            fail.current(),
            Some(CollectiveError::AbortedByPeer { by_rank: 2, .. })
        ));
    }
}
