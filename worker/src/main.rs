//! `rdu-worker`: one rank of an RduJob, configured by the env contract (DESIGN 4.2).

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "rdu-worker", version, about = "One rank of an RduJob")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train as the rank the environment names (RANK, WORLD_SIZE, MASTER_ADDR, RDU_JOB_SPEC, ...).
    Run,
    /// Compile the RduJob in FILE into a PEF (as `model.py compile --data-parallel -ws N`).
    Compile {
        /// The RduJob YAML; data paths are relative to its directory.
        file: std::path::PathBuf,
        /// Where to write the PEF.
        #[arg(long, short)]
        out: std::path::PathBuf,
    },
}

fn main() {
    // SAFETY: the first statement of main; no other thread exists yet.
    unsafe { rdu_worker::single_threaded_gemm() };
    let cli = Cli::parse();
    rdu_worker::init_logs();
    let code = match cli.command {
        Command::Run => rdu_worker::run_from_process_env(),
        Command::Compile { file, out } => rdu_worker::compile_file(&file, &out),
    };
    std::process::exit(code);
}
