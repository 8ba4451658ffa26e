//! The sending rank's end of a data stream, shared by the stream-based links (`tcp`, and `shm`,
//! whose stream only rings and closes): the stream's read half, where the peer's answers and its
//! close arrive, the link's failure latch, and the close that waits until the peer let go of
//! the stream.

use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::task::JoinHandle;

use crate::error::CollectiveError;

/// A data stream's read half and whether sending on it already failed.
pub(crate) struct StreamEnd {
    peer: u32,
    /// Where the peer's rings arrive (and, at the end, its close).
    pub(crate) read: OwnedReadHalf,
    broken: Mutex<Option<String>>,
}

impl StreamEnd {
    pub(crate) fn new(peer: u32, read: OwnedReadHalf) -> StreamEnd {
        StreamEnd {
            peer,
            read,
            broken: Mutex::new(None),
        }
    }

    /// Fails when an earlier send broke the stream (a frame may be torn: nothing can follow).
    pub(crate) fn check_open(&self) -> Result<(), CollectiveError> {
        match self
            .broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            Some(reason) => Err(self.lost(reason)),
            None => Ok(()),
        }
    }

    /// Marks the stream broken for `reason`; the error to return.
    pub(crate) fn break_off(&self, reason: String) -> CollectiveError {
        *self.broken.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.clone());
        self.lost(reason)
    }

    /// The peer is gone for `reason`.
    pub(crate) fn lost(&self, reason: String) -> CollectiveError {
        CollectiveError::PeerLost {
            rank: self.peer,
            reason,
        }
    }

    /// A protocol violation by the peer.
    pub(crate) fn violation(&self, reason: String) -> CollectiveError {
        CollectiveError::Protocol {
            rank: self.peer,
            reason,
        }
    }

    /// Shuts `write` down after everything sent; the handle finishes when the peer has taken
    /// it all and let go of the stream.
    pub(crate) fn close(self, mut write: OwnedWriteHalf) -> JoinHandle<()> {
        let mut read = self.read;
        tokio::spawn(async move {
            if write.shutdown().await.is_err() {
                return;
            }
            // The peer closes its side once its inbox let go of the stream.
            let mut scratch = [0u8; 64];
            while let Ok(n) = read.read(&mut scratch).await {
                if n == 0 {
                    break;
                }
            }
        })
    }
}
