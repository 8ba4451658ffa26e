//! The RduJob controller: builders, state machine, reconcile pipeline (reading pods from the controller's cache),
//! metrics and leader election.

pub mod apply;
pub mod builders;
pub mod context;
pub mod expectations;
pub mod health;
pub mod kueue;
pub mod leader;
pub mod lifecycle;
pub mod metrics;
pub mod node_cache;
pub mod nodes;
pub mod ownership;
pub mod placement;
pub mod progress;
pub mod reconcile;
pub mod serve;
pub mod slim;
pub mod slow_start;
pub mod status_writes;
pub mod step;
#[cfg(test)]
pub(crate) mod test_fixtures;
pub mod validate;
pub mod watches;

pub use context::{Context, FIELD_MANAGER};
pub use lifecycle::{Action, Decision, JobEvent, decide};
pub use reconcile::{error_policy, reconcile};
pub use step::{ReconcileError, Step};
pub use validate::{Limits, ValidJob, ValidationErrors, validate};
