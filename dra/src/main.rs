//! `rdu-dra`: the DRA kubelet plugin of a simulated RDU node (run one per node, as a DaemonSet, instead of the
//! device plugin).

use anyhow::Context;
use clap::Parser;
use rdu_dra::config::{DraConfig, Flags};
use rdu_dra::driver::KubeClaims;
use std::sync::Arc;
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let config = DraConfig::resolve(&Flags::parse())?;
    tracing::info!(
        node = %config.node_name,
        rdus = config.topology.rdus(),
        tiles_per_rdu = config.topology.tiles_per_rdu(),
        model = %config.model,
        "starting"
    );
    let client = kube::Client::try_default().await.context(
        "rdu-dra needs API access (the in-cluster service account or a kubeconfig) to publish ResourceSlices and read ResourceClaims",
    )?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = sigterm.recv() => tracing::info!("SIGTERM"),
            _ = sigint.recv() => tracing::info!("SIGINT"),
        }
    };
    let claims = Arc::new(KubeClaims::new(client.clone()));
    rdu_dra::serve::run(config, client, claims, shutdown).await?;
    tracing::info!("stopped");
    Ok(())
}
