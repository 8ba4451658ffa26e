//! The training process of one rank: sharded data, the `ffn-logreg` model, SGD/Adam, gradients
//! averaged over the job's ranks through `rdu-collective`, checkpoints, and the result JSON.
//!
//! Entry point: [`run::run`] (used by the `rdu-worker run` binary and by `rdujob`'s local mode), which runs the
//! rank's [`session`] in its job with the spec's mode from [`modes`].

mod buckets;
mod checkpoint;
mod checkpoint_schedule;
mod data;
mod env;
mod error;
mod fault;
mod kernels;
mod latency;
mod model;
mod model_run;
mod modes;
mod observe;
mod optim;
mod overlap;
mod pef;
mod progress_lines;
mod progress_reporter;
mod reduce;
mod result;
mod rng;
mod run;
mod sampler;
mod session;
mod step_phases;
mod stop;
mod tensorboard;
#[cfg(test)]
mod test_fixtures;
mod train_events;

pub use buckets::{cap_bytes as bucket_cap_bytes, partition as partition_buckets};
pub use checkpoint::file_name as checkpoint_file_name;
pub use env::WorkerEnv;
pub use error::WorkerError;
pub use kernels::{Kernel, KernelPlan, Product, best_gflops, filled};
pub use model::Mlp;
pub use modes::all_reduce_benchmark::{
    is_json_line as is_benchmark_json_line, json_lines as benchmark_json_lines,
};
pub use observe::Observers;
pub use pef::compile_file;
pub use progress_lines::ProgressLine;
pub use run::{run, run_from_process_env, run_rank, run_rank_observed, run_stoppable};
pub use stop::StopRequest;
pub use train_events::{EpochDone, StepDone, TrainObserver};

/// A rank's logs: plain text on stderr, `RUST_LOG` or `info` (local mode prefixes each line with the rank;
/// in a pod, `kubectl logs` shows them as they are).
pub fn init_logs() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

/// The env var that sizes matrixmultiply's own thread pool (read once, at the first sgemm).
const GEMM_THREADS_VAR: &str = "MATMUL_NUM_THREADS";

/// Makes every sgemm single-threaded unless the user chose otherwise: a rank's parallelism is its
/// tiles (one compute thread each, see [`model::Mlp::batch_grad`]), and a nested pool would
/// oversubscribe the cores.
///
/// # Safety
/// It writes the process environment: the caller must call it while no other thread exists that could read or
/// write the environment (first thing in `main`, before any runtime, logger or pool starts a thread).
pub unsafe fn single_threaded_gemm() {
    if std::env::var_os(GEMM_THREADS_VAR).is_none() {
        // SAFETY: the caller guarantees no other thread exists (this function's contract).
        unsafe { std::env::set_var(GEMM_THREADS_VAR, "1") };
    }
}
