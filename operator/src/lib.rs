//! The RduJob controller: builders, state machine, reconcile pipeline.

pub mod builders;
pub mod lifecycle;
pub mod validate;

pub use lifecycle::{Action, Decision, JobEvent, decide};
pub use validate::{ValidationError, ValidationErrors, validate};
