//! `kubectl-rdujob` (also `kubectl rdujob`, and `rdujob logs|status`): a cluster RduJob's status and its ranks' logs.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use futures::StreamExt;
use kubectl_rdujob::{cluster, logs, status};

#[derive(Parser)]
#[command(
    name = "kubectl-rdujob",
    version,
    about = "Status and logs of RduJobs on a cluster"
)]
struct Cli {
    /// The kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the in-cluster account).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: the current one).
    #[arg(long, global = true)]
    context: Option<String>,
    /// The namespace (default: the context's).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// The job's phase, progress and result, and a table of its ranks (pod, node, tiles, phase, restarts).
    Status {
        job: String,
        /// `json` prints the job's status object.
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Every rank's log (or one rank's), each line prefixed `[rank N]`, merged in time order.
    Logs {
        job: String,
        /// Only this rank.
        #[arg(long)]
        rank: Option<u32>,
        /// Follow the logs as they are written until the ranks end.
        #[arg(short, long)]
        follow: bool,
        /// The log of the container's previous run.
        #[arg(short, long, conflicts_with = "follow")]
        previous: bool,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kubectl-rdujob: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let target = cluster::connect(cli.kubeconfig, cli.context, cli.namespace).await?;
    match cli.command {
        Command::Status { job, output } => {
            let job = target.job(&job).await?;
            match output {
                Output::Json => {
                    let text =
                        serde_json::to_string_pretty(&job.status).context("encoding the status")?;
                    println!("{text}");
                }
                Output::Text => {
                    let name = job.metadata.name.clone().unwrap_or_default();
                    let pods = target.pods(&name).await?;
                    print!("{}", status::render(&job, &pods, jiff::Timestamp::now()));
                }
            }
        }
        Command::Logs {
            job,
            rank,
            follow,
            previous,
        } => {
            let job = target.job(&job).await?;
            let name = job.metadata.name.clone().unwrap_or_default();
            let pods = target.pods(&name).await?;
            let ranks = cluster::rank_pods(&job, &pods, rank)?;
            let mut out = std::io::stdout().lock();
            if follow {
                let mut streams = Vec::new();
                for (rank, pod) in &ranks {
                    streams.push((*rank, target.follow(pod).await?));
                }
                drop(out);
                let mut merged = logs::interleave(streams);
                while let Some(line) = merged.next().await {
                    let line = line.context("reading a log")?;
                    println!("{line}");
                }
            } else {
                let mut texts = Vec::new();
                for (rank, pod) in &ranks {
                    texts.push((*rank, target.log(pod, previous).await?));
                }
                for line in logs::merge_by_time(&texts) {
                    writeln!(out, "{line}").context("writing to stdout")?;
                }
            }
        }
    }
    Ok(())
}
