//! The one error type of the crate, and which failures a restart of the job generation can fix.
//! It is `Clone` (a communicator's first failure is handed to every operation that follows), so
//! the errors it keeps as its source are shared behind an `Arc`.

use std::sync::Arc;
use std::time::Duration;

/// Everything a rendezvous or a collective can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CollectiveError {
    /// A configuration value is unusable; restarting with the same config fails again.
    #[error("invalid collective config: {field}: {reason}")]
    InvalidConfig {
        field: &'static str,
        reason: String,
        /// The error that showed the value unusable, if one did.
        #[source]
        source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// An argument of one call is unusable (e.g. a broadcast root outside the world).
    #[error("invalid argument {field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    /// A listening socket could not be opened.
    #[error("cannot listen on {addr}")]
    Bind {
        addr: String,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// Rank 0 could not be reached, or not every rank joined in time.
    #[error("rendezvous with {master} failed: {reason}")]
    RendezvousFailed { master: String, reason: String },
    /// Rank 0 refused this rank's join (wrong token, job, generation, world size, duplicate rank).
    #[error("rendezvous refused by rank 0 ({code:?}): {message}")]
    RendezvousRefused { code: tonic::Code, message: String },
    /// A peer went away (connection refused or reset, its stream ended) while it was needed.
    #[error("peer rank {rank} lost: {reason}")]
    PeerLost { rank: u32, reason: String },
    /// The operation did not finish within the job's timeout.
    #[error("{op} timed out after {after:?}")]
    Timeout { op: &'static str, after: Duration },
    /// Another rank failed and told this one to stop; `permanent` when that rank's failure
    /// cannot be fixed by a restart, so this rank's cannot either.
    #[error("aborted by rank {by_rank}: {reason}")]
    AbortedByPeer {
        by_rank: u32,
        reason: String,
        permanent: bool,
    },
    /// This rank aborted (a previous collective failed, or `abort` was called); the
    /// communicator cannot be used any more.
    #[error("communicator is aborted: {reason}")]
    Aborted { reason: String },
    /// A peer sent something that does not fit the protocol (wrong size, order or generation).
    #[error("protocol violation by rank {rank}: {reason}")]
    Protocol { rank: u32, reason: String },
}

impl CollectiveError {
    /// True when restarting the job generation can succeed: lost peers, timeouts, a failed
    /// rendezvous, an abort by a peer. False for configuration and programming errors.
    pub fn is_retryable(&self) -> bool {
        match self {
            CollectiveError::InvalidConfig { .. }
            | CollectiveError::InvalidArgument { .. }
            | CollectiveError::Protocol { .. } => false,
            CollectiveError::AbortedByPeer { permanent, .. } => !permanent,
            CollectiveError::RendezvousRefused { code, .. } => matches!(
                code,
                tonic::Code::FailedPrecondition
                    | tonic::Code::AlreadyExists
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Unavailable
                    | tonic::Code::Aborted
            ),
            CollectiveError::Bind { .. }
            | CollectiveError::RendezvousFailed { .. }
            | CollectiveError::PeerLost { .. }
            | CollectiveError::Timeout { .. }
            | CollectiveError::Aborted { .. } => true,
        }
    }

    pub(crate) fn invalid_config(field: &'static str, reason: impl Into<String>) -> Self {
        CollectiveError::InvalidConfig {
            field,
            reason: reason.into(),
            source: None,
        }
    }

    /// An unusable `field`, shown so by `source`.
    pub(crate) fn invalid_config_from(
        field: &'static str,
        reason: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        CollectiveError::InvalidConfig {
            field,
            reason: reason.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// `addr` could not be listened on.
    pub(crate) fn bind(addr: impl Into<String>, source: std::io::Error) -> Self {
        CollectiveError::Bind {
            addr: addr.into(),
            source: Arc::new(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_of_the_world_are_retryable_and_config_errors_are_not() {
        let retryable = [
            CollectiveError::PeerLost {
                rank: 1,
                reason: "reset".into(),
            },
            CollectiveError::Timeout {
                op: "all_reduce",
                after: Duration::from_secs(1),
            },
            CollectiveError::AbortedByPeer {
                by_rank: 2,
                reason: "x".into(),
                permanent: false,
            },
            CollectiveError::RendezvousFailed {
                master: "m:1".into(),
                reason: "refused".into(),
            },
            CollectiveError::RendezvousRefused {
                code: tonic::Code::FailedPrecondition,
                message: "generation".into(),
            },
        ];
        for e in retryable {
            assert!(e.is_retryable(), "{e}");
        }
        let fatal = [
            CollectiveError::invalid_config("world_size", "0"),
            CollectiveError::RendezvousRefused {
                code: tonic::Code::Unauthenticated,
                message: "token".into(),
            },
            CollectiveError::RendezvousRefused {
                code: tonic::Code::PermissionDenied,
                message: "job".into(),
            },
            CollectiveError::Protocol {
                rank: 0,
                reason: "size".into(),
            },
            CollectiveError::AbortedByPeer {
                by_rank: 0,
                reason: "bad config".into(),
                permanent: true,
            },
        ];
        for e in fatal {
            assert!(!e.is_retryable(), "{e}");
        }
    }

    #[test]
    fn an_error_that_came_from_another_keeps_it_as_its_source() {
        use std::error::Error;
        let refused = std::io::Error::new(std::io::ErrorKind::AddrInUse, "in use");
        let bind = CollectiveError::bind("127.0.0.1:1", refused);
        assert_eq!(bind.to_string(), "cannot listen on 127.0.0.1:1");
        assert_eq!(
            rdu_error_chain::chain(&bind),
            "cannot listen on 127.0.0.1:1: in use"
        );
        let source = bind.source().expect("the io error");
        assert_eq!(source.to_string(), "in use");
        let cloned = bind.clone();
        assert!(cloned.source().is_some(), "a clone keeps it too");
        let config =
            CollectiveError::invalid_config_from("identity.token", "too long", refused_again());
        assert_eq!(config.source().map(ToString::to_string), Some("why".into()));
        assert!(
            CollectiveError::invalid_config("rank", "x")
                .source()
                .is_none()
        );
    }

    fn refused_again() -> std::io::Error {
        std::io::Error::other("why")
    }
}
