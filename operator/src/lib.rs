//! The RduJob controller: builders, state machine, reconcile pipeline (reading pods from the controller's cache),
//! metrics and leader election.

pub mod builders;
pub mod expectations;
pub mod health;
pub mod leader;
pub mod lifecycle;
pub mod metrics;
pub mod progress;
pub mod reconcile;
pub mod validate;

pub use lifecycle::{Action, Decision, JobEvent, decide};
pub use reconcile::{Context, FIELD_MANAGER, ReconcileError, Step, error_policy, reconcile};
pub use validate::{ValidJob, ValidationErrors, validate};
