//! The RduJob controller: builders, state machine, reconcile pipeline.

pub mod builders;
