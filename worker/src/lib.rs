//! The training process of one rank: sharded data, the `ffn-logreg` model, SGD/Adam, gradients
//! averaged over the job's ranks through `rdu-collective`, checkpoints, and the result JSON.
//!
//! Entry point: [`run::run`] (used by the `rdu-worker run` binary and by `rdujob`'s local mode).

pub mod checkpoint;
pub mod data;
pub mod env;
pub mod error;
pub mod model;
pub mod optim;
pub mod result;
pub mod rng;
pub mod run;
pub mod sampler;
pub mod spec_check;
pub mod train;

pub use error::WorkerError;
pub use run::{run, run_from_process_env};
pub use spec_check::{FieldError, validate};
