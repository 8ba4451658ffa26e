//! The steps of the reconcile pipeline and how each fails: the `step` label of
//! `rdu_operator_reconcile_errors_total` and the error a failed reconcile returns (it is retried with backoff).
//! Its own module so that the metrics and the pipeline both import it without importing each other.

/// The step of the pipeline an error comes from: the `step` label of `rdu_operator_reconcile_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Reading what the cache does not hold (an existing child whose owner must be checked).
    Fetch,
    /// Building the children: making the job's token (the builders themselves cannot fail on a validated job).
    Build,
    /// Creating and deleting children, or the job after its TTL.
    Apply,
    /// Writing the status subresource.
    Status,
}

impl Step {
    pub const ALL: [Step; 4] = [Step::Fetch, Step::Build, Step::Apply, Step::Status];

    pub fn as_str(self) -> &'static str {
        match self {
            Step::Fetch => "fetch",
            Step::Build => "build",
            Step::Apply => "apply",
            Step::Status => "status",
        }
    }
}

/// Why one reconcile failed (it is retried with backoff): one variant per step, with what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("cannot read {what}")]
    Fetch { what: String, source: kube::Error },
    #[error("cannot make the job's token")]
    Token(#[from] rdu_crds::token::TokenError),
    #[error("cannot create pod {pod}")]
    CreatePods { pod: String, source: kube::Error },
    #[error("cannot delete pod {pod}")]
    DeletePods { pod: String, source: kube::Error },
    #[error("cannot apply {what}")]
    SharedChildren { what: String, source: kube::Error },
    #[error("cannot delete the job after ttlSecondsAfterFinished")]
    DeleteJob { source: kube::Error },
    #[error("cannot write the job's status")]
    Status { source: kube::Error },
    #[error(transparent)]
    Kueue(#[from] crate::kueue::sync::KueueError),
}

impl ReconcileError {
    /// The pipeline step that failed.
    pub fn step(&self) -> Step {
        match self {
            ReconcileError::Fetch { .. } => Step::Fetch,
            ReconcileError::Token(_) => Step::Build,
            ReconcileError::CreatePods { .. }
            | ReconcileError::DeletePods { .. }
            | ReconcileError::SharedChildren { .. }
            | ReconcileError::DeleteJob { .. } => Step::Apply,
            ReconcileError::Status { .. } => Step::Status,
            ReconcileError::Kueue(e) if e.is_read() => Step::Fetch,
            ReconcileError::Kueue(_) => Step::Apply,
        }
    }

    /// Whether a write was refused with 409 `Conflict`: the object changed since this reconcile read it (a write
    /// that carries the `resourceVersion` it read, as the Workload's admission status does; a pod delete's refused
    /// precondition is handled where it is made). That is optimistic concurrency at work, not a failure: the next
    /// reconcile reads the object again and decides from what it is now. A create refused because the object
    /// exists (`AlreadyExists`, also 409) is not one.
    pub fn is_conflict(&self) -> bool {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(error) = cause {
            if let Some(kube::Error::Api(status)) = error.downcast_ref::<kube::Error>() {
                return status.is_conflict();
            }
            cause = error.source();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kueue::sync::KueueError;
    use crate::test_fixtures;

    fn api_error() -> kube::Error {
        test_fixtures::api_error(403, "Forbidden", "pods is forbidden")
    }

    #[test]
    fn each_error_maps_to_its_step_label() {
        let cases = [
            (
                ReconcileError::Fetch {
                    what: "Service ml/a".into(),
                    source: api_error(),
                },
                "fetch",
            ),
            (
                ReconcileError::Token(rdu_crds::token::TokenError("no entropy".into())),
                "build",
            ),
            (
                ReconcileError::CreatePods {
                    pod: "ml/a-worker-0".into(),
                    source: api_error(),
                },
                "apply",
            ),
            (
                ReconcileError::DeletePods {
                    pod: "ml/a-worker-0".into(),
                    source: api_error(),
                },
                "apply",
            ),
            (
                ReconcileError::SharedChildren {
                    what: "Service ml/a".into(),
                    source: api_error(),
                },
                "apply",
            ),
            (
                ReconcileError::DeleteJob {
                    source: api_error(),
                },
                "apply",
            ),
            (
                ReconcileError::Status {
                    source: api_error(),
                },
                "status",
            ),
            (
                KueueError::ReadWorkload {
                    name: "rdujob-a-1a2b3".into(),
                    source: api_error(),
                }
                .into(),
                "fetch",
            ),
            (
                KueueError::DecodeWorkload {
                    name: "rdujob-a-1a2b3".into(),
                    source: serde_json::from_str::<u8>("x").unwrap_err(),
                }
                .into(),
                "fetch",
            ),
            (
                KueueError::PriorityClass {
                    name: "high".into(),
                    source: api_error(),
                }
                .into(),
                "fetch",
            ),
            (
                KueueError::WriteWorkload {
                    action: "create",
                    name: "rdujob-a-1a2b3".into(),
                    source: api_error(),
                }
                .into(),
                "apply",
            ),
        ];
        for (error, label) in cases {
            assert_eq!(error.step().as_str(), label, "{error}");
        }
        let all: Vec<&str> = Step::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(all, ["fetch", "build", "apply", "status"]);
    }

    fn status(code: u16, reason: &str) -> kube::Error {
        test_fixtures::api_error(code, reason, "the object has been modified")
    }

    #[test]
    fn only_a_write_refused_as_conflicting_is_a_conflict() {
        let cases = [
            (
                KueueError::WriteWorkload {
                    action: "finish",
                    name: "rdujob-a-1a2b3".into(),
                    source: status(409, "Conflict"),
                }
                .into(),
                true,
            ),
            (
                ReconcileError::Status {
                    source: status(409, "Conflict"),
                },
                true,
            ),
            (
                ReconcileError::CreatePods {
                    pod: "ml/a-worker-0".into(),
                    source: status(409, "AlreadyExists"),
                },
                false,
            ),
            (
                ReconcileError::Status {
                    source: status(500, "InternalError"),
                },
                false,
            ),
            (
                ReconcileError::Status {
                    source: api_error(),
                },
                false,
            ),
            (
                ReconcileError::Token(rdu_crds::token::TokenError("no entropy".into())),
                false,
            ),
            (
                KueueError::DecodeWorkload {
                    name: "rdujob-a-1a2b3".into(),
                    source: serde_json::from_str::<u8>("x").unwrap_err(),
                }
                .into(),
                false,
            ),
        ];
        for (error, conflict) in cases {
            assert_eq!(error.is_conflict(), conflict, "{error:?}");
        }
    }

    #[test]
    fn errors_say_what_was_being_done() {
        let error = ReconcileError::CreatePods {
            pod: "ml/a-worker-3".into(),
            source: api_error(),
        };
        // The message says what was being done; its cause is the source, shown by the chain.
        assert!(!error.to_string().contains("forbidden"), "{error}");
        let text = rdu_error_chain::chain(&error);
        assert!(text.contains("cannot create pod ml/a-worker-3: "), "{text}");
        assert!(text.contains("forbidden"), "{text}");
        assert!(std::error::Error::source(&error).is_some());
    }
}
