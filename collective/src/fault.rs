//! The communicator's failure latch: the first failure (local or an abort from a peer) is kept,
//! wakes every operation in flight, and fails every later one.

use tokio::sync::watch;

use crate::error::CollectiveError;

pub(crate) struct FailState {
    latch: watch::Sender<Option<CollectiveError>>,
}

impl FailState {
    pub(crate) fn new() -> Self {
        FailState {
            latch: watch::Sender::new(None),
        }
    }

    /// Records `error` unless a failure is already recorded; true if this one was recorded.
    pub(crate) fn fail(&self, error: CollectiveError) -> bool {
        self.latch.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(error);
                true
            } else {
                false
            }
        })
    }

    pub(crate) fn current(&self) -> Option<CollectiveError> {
        self.latch.borrow().clone()
    }

    /// Resolves with the recorded failure once there is one.
    pub(crate) async fn failed(&self) -> CollectiveError {
        let mut rx = self.latch.subscribe();
        let recorded = match rx.wait_for(Option::is_some).await {
            Ok(value) => value.clone(),
            Err(_) => None,
        };
        recorded.unwrap_or_else(|| CollectiveError::Aborted {
            reason: "communicator dropped".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_failure_wins_and_wakes_waiters() {
        let state = std::sync::Arc::new(FailState::new());
        assert!(state.current().is_none());
        let waiter = {
            let s = state.clone();
            tokio::spawn(async move { s.failed().await })
        };
        assert!(state.fail(CollectiveError::PeerLost {
            rank: 1,
            reason: "first".into()
        }));
        assert!(!state.fail(CollectiveError::Aborted {
            reason: "second".into()
        }));
        let seen = waiter.await.expect("task");
        assert!(matches!(seen, CollectiveError::PeerLost { rank: 1, .. }));
        assert!(matches!(
            state.current(),
            Some(CollectiveError::PeerLost { .. })
        ));
    }
}
