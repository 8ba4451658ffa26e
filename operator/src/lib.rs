//! The RduJob controller: builders, state machine, reconcile pipeline.
