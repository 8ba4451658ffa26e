//! The rdujob command line: `run` an RduJob locally (like `mpirun -np N`), `tilestat` a node.

mod bench;
mod capacity;
mod cluster_cli;
mod console;
mod error;
mod gang;
mod launch;
mod local;
mod manifest;
mod ports;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

const DEFAULT_TILESTAT_URL: &str = "http://127.0.0.1:9464/status";

#[derive(Parser)]
#[command(
    name = "rdujob",
    version,
    about = "Run RduJobs locally; show RDU tile status"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the RduJob in FILE on this machine: one process per rank on 127.0.0.1.
    Run {
        /// The RduJob YAML (as for `kubectl apply -f`).
        file: PathBuf,
        /// Override spec.workers (the world size).
        #[arg(long)]
        workers: Option<u32>,
        /// Override spec.mode: `train`, `measure-performance` (the seeds' `measure-performance`), `inference`
        /// (the seeds' `run --inference`; needs --checkpoint-dir with a training run's checkpoints) or
        /// `all-reduce-benchmark` (nccl-tests' all_reduce_perf across the ranks: spec.allReduceBenchmark's sizes).
        #[arg(long, value_parser = parse_mode)]
        mode: Option<rdu_crds::RunMode>,
        /// Keep checkpoints in DIR (created if missing) instead of the scratch directory, which goes at the end:
        /// a later `--mode inference` run reads them.
        #[arg(long)]
        checkpoint_dir: Option<PathBuf>,
        /// Every rank's every log line (`[rank N]`-prefixed) instead of one progress line, warnings and errors;
        /// also when RUST_LOG is set.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Measure the job's samples/s at 1 rank and at each of --ranks, as JSON lines with the
    /// scaling efficiency against the 1-rank run.
    Bench {
        file: PathBuf,
        /// World sizes to measure besides the 1-rank baseline.
        #[arg(long, value_delimiter = ',', default_values_t = [2u32, 4])]
        ranks: Vec<u32>,
        /// Runs per world size; the fastest counts.
        #[arg(long, default_value_t = 3)]
        repeat: u32,
    },
    /// Compile the RduJob in FILE into a PEF that `spec.pef` can name (as `model.py compile`).
    Compile {
        file: PathBuf,
        /// Where to write the PEF.
        #[arg(long, short)]
        out: PathBuf,
    },
    /// Show the tiles of a node as `sntilestat` does (the device plugin's status endpoint).
    Tilestat {
        #[arg(default_value = DEFAULT_TILESTAT_URL)]
        url: String,
    },
    /// A cluster job's phase, progress, ranks and result (runs `kubectl-rdujob status`).
    Status {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// A cluster job's rank logs, `[rank N]`-prefixed (runs `kubectl-rdujob logs`: `--rank N`, `-f`).
    Logs {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// One rank of a local job (started by `run`; reads the env contract).
    #[command(hide = true)]
    Worker,
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Worker => {
            // SAFETY: only argument parsing ran before; it starts no thread, so none exists yet.
            unsafe { rdu_worker::single_threaded_gemm() };
            rdu_worker::init_logs();
            rdu_worker::run_from_process_env()
        }
        Command::Run {
            file,
            workers,
            mode,
            checkpoint_dir,
            verbose,
        } => {
            let options = local::RunOptions {
                workers,
                mode,
                checkpoint_dir,
                verbose: verbose || std::env::var_os("RUST_LOG").is_some(),
            };
            with_runtime(|| async move { local::run(&file, options).await })
        }
        Command::Bench {
            file,
            ranks,
            repeat,
        } => with_runtime(|| async move { bench::run(&file, &ranks, repeat).await }),
        Command::Compile { file, out } => {
            rdu_worker::init_logs();
            rdu_worker::compile_file(&file, &out)
        }
        Command::Status { args } => cluster_cli::run("status", &args).unwrap_or_else(|e| {
            eprintln!("rdujob: {}", error::chain(&e));
            e.exit_code()
        }),
        Command::Logs { args } => cluster_cli::run("logs", &args).unwrap_or_else(|e| {
            eprintln!("rdujob: {}", error::chain(&e));
            e.exit_code()
        }),
        Command::Tilestat { url } => with_runtime(|| async move {
            match rdu_tiles::tilestat::fetch_and_render(&url).await {
                Ok(table) => {
                    print!("{table}");
                    Ok(0)
                }
                Err(e) => {
                    eprintln!("rdujob tilestat: {}", error::chain(&e));
                    Ok(1)
                }
            }
        }),
    };
    std::process::exit(code);
}

/// `--mode` as the seeds' commands spell it, or as the spec does.
fn parse_mode(text: &str) -> Result<rdu_crds::RunMode, String> {
    match text {
        "train" | "run" => Ok(rdu_crds::RunMode::Train),
        "measure-performance" | "measurePerformance" => Ok(rdu_crds::RunMode::MeasurePerformance),
        "inference" => Ok(rdu_crds::RunMode::Inference),
        "all-reduce-benchmark" | "allReduceBenchmark" => Ok(rdu_crds::RunMode::AllReduceBenchmark),
        other => Err(format!(
            "unknown mode {other:?}: use train, measure-performance, inference or all-reduce-benchmark"
        )),
    }
}

fn with_runtime<F, Fut>(f: F) -> i32
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<i32, error::CliError>>,
{
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rdujob: cannot start the async runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(f()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rdujob: {}", error::chain(&e));
            e.exit_code()
        }
    }
}
