//! The RduJob controller: builders, state machine, reconcile pipeline.

pub mod builders;
pub mod validate;

pub use validate::{ValidationError, ValidationErrors, validate};
