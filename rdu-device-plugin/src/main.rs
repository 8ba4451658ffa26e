//! `rdu-device-plugin`: the kubelet device plugin of a simulated RDU node (run one per node, as a DaemonSet).

use anyhow::Context;
use clap::Parser;
use rdu_device_plugin::annotate::{KubeAnnotator, TilePublisher};
use rdu_device_plugin::config::{Flags, PluginConfig};
use rdu_device_plugin::health::watch_health_file;
use rdu_device_plugin::plugin::{Timing, run_plugin};
use rdu_device_plugin::podresources::spawn_pod_resources_poller;
use rdu_device_plugin::status::serve_status;
use rdu_tiles::node::TileNode;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// How often the kubelet's pod resources are read.
const POD_RESOURCES_INTERVAL: Duration = Duration::from_secs(5);
/// How long a freshly allocated tile stays allocated without a pod listing it.
const POD_RESOURCES_GRACE: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let flags = Flags::parse();
    let config = PluginConfig::resolve(&flags)?;
    tracing::info!(
        rdus = config.topology.rdus(),
        tiles_per_rdu = config.topology.tiles_per_rdu(),
        mode = %config.resource_mode,
        dir = %config.device_plugin_dir.display(),
        "starting"
    );
    if let Some(parent) = config.checkpoint_file.parent()
        && !parent.as_os_str().is_empty()
        && let Err(e) = std::fs::create_dir_all(parent)
    {
        tracing::warn!(dir = %parent.display(), error = %rdu_error_chain::Chain(&e), "cannot create the checkpoint directory");
    }
    let node = Arc::new(
        TileNode::new(
            config.topology,
            config.resource_mode,
            config.node_name.clone(),
            Some(config.checkpoint_file.clone()),
        )
        .context("loading the allocation checkpoint (--checkpoint-file)")?,
    );
    let _health = match &config.health_file {
        Some(path) => Some(watch_health_file(node.clone(), path.clone())?),
        None => None,
    };

    let publisher = if config.annotate_pods {
        let client = kube::Client::try_default().await.context(
            "--annotate-pods needs API access (the in-cluster service account or a kubeconfig)",
        )?;
        Some(TilePublisher::new(Box::new(KubeAnnotator::new(client))))
    } else {
        None
    };
    let _pod_resources = config.pod_resources_socket.clone().map(|socket| {
        spawn_pod_resources_poller(
            node.clone(),
            socket,
            POD_RESOURCES_INTERVAL,
            POD_RESOURCES_GRACE,
            publisher,
        )
    });

    let (stop_tx, stop_rx) = watch::channel(false);
    let status_task = match config.status_addr {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding --status-addr {addr}"))?;
            tracing::info!(%addr, "status endpoint listening (/status, /metrics)");
            let mut stop = stop_rx.clone();
            Some(tokio::spawn(serve_status(
                listener,
                node.clone(),
                async move {
                    let _ = stop.wait_for(|s| *s).await;
                },
            )))
        }
        None => None,
    };

    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = sigterm.recv() => tracing::info!("SIGTERM: stopping"),
            _ = sigint.recv() => tracing::info!("SIGINT: stopping"),
        }
    };
    run_plugin(
        config.device_plugin_dir.clone(),
        node,
        Timing::default(),
        shutdown,
    )
    .await?;
    let _ = stop_tx.send(true);
    if let Some(task) = status_task {
        task.await.context("status endpoint task")??;
    }
    tracing::info!("stopped");
    Ok(())
}
