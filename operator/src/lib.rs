//! The RduJob controller: builders, state machine, reconcile pipeline (reading pods from the controller's cache),
//! metrics and leader election.

mod apply;
pub mod builders;
mod context;
mod expectations;
pub mod health;
pub mod kueue;
pub mod leader;
mod lifecycle;
pub mod metrics;
pub mod node_cache;
pub mod nodes;
mod ownership;
mod placement;
pub mod progress;
pub mod reconcile;
pub mod serve;
pub mod slim;
mod slow_start;
mod status_writes;
mod step;
#[cfg(test)]
pub(crate) mod test_fixtures;
pub mod validate;
pub mod watches;

pub use context::{Context, FIELD_MANAGER, Settings};
pub use lifecycle::{Change, Decision, JobEvent, decide};
pub use reconcile::{error_policy, reconcile};
pub use step::{ReconcileError, Step};
pub use validate::{Limits, ValidJob, ValidationErrors, validate};
