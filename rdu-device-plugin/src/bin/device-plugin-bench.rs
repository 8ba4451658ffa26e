//! Device plugin benchmarks, printed as JSON lines: registration latency after kubelet.sock appears
//! (target < 1 s), health change → ListAndWatch update latency (target < 100 ms), and Allocate /
//! GetPreferredAllocation latency on a node of 1,024 tiles (target p99 < 1 ms). Run with `--release`.

use anyhow::{Context, bail};
use rdu_device_plugin::api::device_plugin_client::DevicePluginClient;
use rdu_device_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    PreferredAllocationRequest,
};
use rdu_device_plugin::health::watch_health_file;
use rdu_device_plugin::kubelet_double::KubeletDouble;
use rdu_device_plugin::plugin::{Timing, run_plugin};
use rdu_tiles::node::TileNode;
use rdu_tiles::topology::{ResourceMode, Topology};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(30);

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index].as_secs_f64() * 1e3
}

fn report(bench: &str, extra: serde_json::Value, mut samples: Vec<Duration>, target_ms: f64) {
    samples.sort();
    let p99 = percentile(&samples, 0.99);
    let mut line = json!({
        "bench": bench,
        "samples": samples.len(),
        "p50_ms": percentile(&samples, 0.5),
        "p99_ms": p99,
        "max_ms": percentile(&samples, 1.0),
        "target_ms": target_ms,
        "meets_target": p99 < target_ms,
    });
    if let (Some(line), Some(extra)) = (line.as_object_mut(), extra.as_object()) {
        line.extend(extra.clone());
    }
    println!("{line}");
}

struct Plugin {
    node: Arc<TileNode>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), rdu_device_plugin::plugin::PluginError>>,
}

fn start_plugin(dir: &Path, node: TileNode) -> Plugin {
    let node = Arc::new(node);
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run_plugin(
        dir.to_path_buf(),
        node.clone(),
        Timing::default(),
        async {
            let _ = stop_rx.await;
        },
    ));
    Plugin { node, stop, task }
}

async fn stop_plugin(plugin: Plugin) -> anyhow::Result<()> {
    let _ = plugin.stop.send(());
    tokio::time::timeout(DEADLINE, plugin.task)
        .await
        .context("plugin stop")???;
    Ok(())
}

async fn wait_for_file(path: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    while !path.exists() {
        if started.elapsed() > DEADLINE {
            bail!("{} never appeared", path.display());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// Time from kubelet.sock appearing to the plugin's Register call, over repeated kubelet restarts.
async fn registration_latency(rounds: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let plugin = start_plugin(
        dir.path(),
        TileNode::in_memory(Topology::new(8, 4)?, ResourceMode::Tile, None),
    );
    let socket = dir.path().join(ResourceMode::Tile.socket_name());
    let mut wiped = Vec::new();
    let mut replaced = Vec::new();
    for round in 0..rounds {
        let wipe_everything = round % 2 == 0;
        if wipe_everything {
            for entry in std::fs::read_dir(dir.path())? {
                // The plugin may be replacing its own socket at this very moment.
                match std::fs::remove_file(entry?.path()) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                    _ => {}
                }
            }
            // Measure from kubelet.sock's appearance: let the plugin serve again first.
            wait_for_file(&socket).await?;
        } else {
            let _ = std::fs::remove_file(dir.path().join("kubelet.sock"));
        }
        let started = Instant::now();
        let mut kubelet = KubeletDouble::start(dir.path())?;
        kubelet
            .next_registration(DEADLINE)
            .await
            .context("no registration")?;
        let elapsed = started.elapsed();
        if wipe_everything {
            wiped.push(elapsed);
        } else {
            replaced.push(elapsed);
        }
        kubelet.stop().await;
    }
    report(
        "registration_latency",
        json!({"case": "directory wiped, kubelet.sock recreated"}),
        wiped,
        1000.0,
    );
    report(
        "registration_latency",
        json!({"case": "kubelet.sock replaced"}),
        replaced,
        1000.0,
    );
    stop_plugin(plugin).await
}

async fn dial(dir: &Path) -> anyhow::Result<(KubeletDouble, DevicePluginClient<Channel>)> {
    let mut kubelet = KubeletDouble::start(dir)?;
    let registration = kubelet
        .next_registration(DEADLINE)
        .await
        .context("no registration")?;
    let client = kubelet.dial_plugin(&registration).await?;
    Ok((kubelet, client))
}

/// Time from writing the health file to the ListAndWatch update that reflects it.
async fn health_latency(rounds: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let health_dir = tempfile::tempdir()?;
    let health_file = health_dir.path().join("unhealthy");
    let plugin = start_plugin(
        dir.path(),
        TileNode::in_memory(Topology::new(8, 4)?, ResourceMode::Tile, None),
    );
    let _watch = watch_health_file(plugin.node.clone(), health_file.clone())?;
    let (_kubelet, mut client) = dial(dir.path()).await?;
    let mut stream = client.list_and_watch(Empty {}).await?.into_inner();
    stream.message().await?.context("first list")?;
    let mut samples = Vec::new();
    for round in 0..rounds {
        let fail = round % 2 == 0;
        let started = Instant::now();
        std::fs::write(&health_file, if fail { "rdu3-tile1\n" } else { "" })?;
        let wanted = if fail { "Unhealthy" } else { "Healthy" };
        loop {
            let list = tokio::time::timeout(DEADLINE, stream.message())
                .await
                .context("no ListAndWatch update")??
                .context("stream ended")?;
            if list
                .devices
                .iter()
                .any(|d| d.id == "rdu3-tile1" && d.health == wanted)
            {
                break;
            }
        }
        samples.push(started.elapsed());
        tracing::debug!(round, elapsed = ?started.elapsed(), "health round");
    }
    report(
        "health_to_list_and_watch_latency",
        json!({"node": "8x4"}),
        samples,
        100.0,
    );
    stop_plugin(plugin).await
}

/// Allocate and GetPreferredAllocation latency over the unix socket, and the in-process Allocate.
async fn allocate_latency(rdus: u32, tiles: u32, rounds: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let state = tempfile::tempdir()?;
    let topology = Topology::new(rdus, tiles)?;
    let node = TileNode::new(
        topology,
        ResourceMode::Tile,
        None,
        Some(state.path().join("allocations.json")),
    )?;
    let plugin = start_plugin(dir.path(), node);
    let (_kubelet, mut client) = dial(dir.path()).await?;
    let total = topology.total_tiles();
    let all: Vec<String> = (0..total).map(|t| topology.tile_id(t)).collect();
    let group = 4u32;
    let mut allocate_samples = Vec::with_capacity(rounds);
    let mut preferred_samples = Vec::with_capacity(rounds);
    for round in 0..rounds {
        // The kubelet's view: a sliding half of the node is free, so the packer works on a fragmented node.
        let offset = (round as u32 * 7) % total;
        let available: Vec<String> = (0..total / 2)
            .map(|i| all[((offset + i * 2) % total) as usize].clone())
            .collect();
        let started = Instant::now();
        let response = client
            .get_preferred_allocation(PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_i_ds: available,
                    must_include_device_i_ds: vec![],
                    allocation_size: group as i32,
                }],
            })
            .await?
            .into_inner();
        preferred_samples.push(started.elapsed());
        let chosen = response
            .container_responses
            .into_iter()
            .next()
            .context("no preferred allocation")?
            .device_i_ds;
        let started = Instant::now();
        client
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: chosen,
                }],
            })
            .await?;
        allocate_samples.push(started.elapsed());
    }
    let shape = format!("{rdus}x{tiles}");
    report(
        "allocate_grpc_latency",
        json!({"node": shape, "tiles": total, "tiles_per_request": group, "checkpoint": true}),
        allocate_samples,
        1.0,
    );
    report(
        "get_preferred_allocation_grpc_latency",
        json!({"node": shape, "tiles": total, "available": total / 2, "tiles_per_request": group}),
        preferred_samples,
        1.0,
    );
    let mut in_process = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let first = (round as u32 * group) % total;
        let ids: Vec<String> = (first..first + group)
            .map(|t| topology.tile_id(t % total))
            .collect();
        let started = Instant::now();
        plugin.node.allocate(&ids)?;
        in_process.push(started.elapsed());
    }
    report(
        "allocate_in_process_latency",
        json!({"node": shape, "tiles": total, "tiles_per_request": group, "checkpoint": true}),
        in_process,
        1.0,
    );
    stop_plugin(plugin).await
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    // BENCH_ONLY=registration|health runs one part (for investigating tails).
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    if only.is_empty() || only == "registration" {
        registration_latency(100).await?;
    }
    if only.is_empty() || only == "health" {
        health_latency(200).await?;
    }
    if !only.is_empty() {
        return Ok(());
    }
    allocate_latency(32, 32, 2000).await?;
    allocate_latency(128, 8, 2000).await?;
    Ok(())
}
