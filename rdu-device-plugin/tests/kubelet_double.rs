//! The device plugin against an in-process kubelet double on temporary unix sockets: registration,
//! re-registration after a kubelet restart, ListAndWatch health updates, preferred allocation, Allocate.

use rdu_device_plugin::annotate::{AnnotateError, PodAnnotator, TilePublisher};
use rdu_device_plugin::api::device_plugin_client::DevicePluginClient;
use rdu_device_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    ListAndWatchResponse, PreferredAllocationRequest, RegisterRequest,
};
use rdu_device_plugin::health::watch_health_file;
use rdu_device_plugin::kubelet_double::{KubeletDouble, PodResourcesDouble};
use rdu_device_plugin::plugin::{Timing, run_plugin};
use rdu_device_plugin::podresources::spawn_pod_resources_poller;
use rdu_tiles::node::TileNode;
use rdu_tiles::topology::{ResourceMode, Topology};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::Streaming;
use tonic::transport::Channel;

/// Records the pod annotations the plugin writes, as `namespace/name=tiles`.
#[derive(Clone, Default)]
struct Annotations(Arc<std::sync::Mutex<Vec<String>>>);

impl PodAnnotator for Annotations {
    fn annotate<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        tiles: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(), AnnotateError>> {
        self.0
            .lock()
            .unwrap()
            .push(format!("{namespace}/{name}={tiles}"));
        Box::pin(async { Ok(()) })
    }
}

/// Upper bound for anything to happen; tests poll, never sleep.
const DEADLINE: Duration = Duration::from_secs(20);

fn fast_timing() -> Timing {
    Timing {
        first_retry: Duration::from_millis(20),
        max_retry: Duration::from_millis(200),
        register_timeout: Duration::from_secs(5),
        recheck: Duration::from_millis(100),
        watch_directory: true,
    }
}

struct RunningPlugin {
    node: Arc<TileNode>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), rdu_device_plugin::plugin::PluginError>>,
}

impl RunningPlugin {
    fn start(dir: &Path, node: TileNode) -> RunningPlugin {
        RunningPlugin::start_with(dir, node, fast_timing())
    }

    fn start_with(dir: &Path, node: TileNode, timing: Timing) -> RunningPlugin {
        let node = Arc::new(node);
        let (stop, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(run_plugin(dir.to_path_buf(), node.clone(), timing, async {
            let _ = stop_rx.await;
        }));
        RunningPlugin { node, stop, task }
    }

    async fn shutdown(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("plugin stops within the deadline")
            .unwrap()
            .unwrap();
    }
}

fn node(rdus: u32, tiles: u32, mode: ResourceMode, checkpoint: Option<PathBuf>) -> TileNode {
    TileNode::new(Topology::new(rdus, tiles).unwrap(), mode, None, checkpoint).unwrap()
}

async fn registered(kubelet: &mut KubeletDouble) -> RegisterRequest {
    kubelet
        .next_registration(DEADLINE)
        .await
        .expect("the plugin registers within the deadline")
}

async fn list_and_watch(
    client: &mut DevicePluginClient<Channel>,
) -> Streaming<ListAndWatchResponse> {
    client.list_and_watch(Empty {}).await.unwrap().into_inner()
}

/// Reads ListAndWatch updates until one satisfies `wanted`.
async fn until_list(
    stream: &mut Streaming<ListAndWatchResponse>,
    wanted: impl Fn(&ListAndWatchResponse) -> bool,
) -> ListAndWatchResponse {
    tokio::time::timeout(DEADLINE, async {
        loop {
            let list = stream.message().await.unwrap().expect("stream still open");
            if wanted(&list) {
                return list;
            }
        }
    })
    .await
    .expect("the expected device list arrives within the deadline")
}

/// Polls the node's status until `wanted` holds.
async fn until_status(
    node: &TileNode,
    wanted: impl Fn(&rdu_tiles::tilestat::NodeStatus) -> bool,
) -> rdu_tiles::tilestat::NodeStatus {
    let started = std::time::Instant::now();
    loop {
        let status = node.status();
        if wanted(&status) {
            return status;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "status never matched: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn health_of<'a>(list: &'a ListAndWatchResponse, id: &str) -> &'a str {
    &list
        .devices
        .iter()
        .find(|d| d.id == id)
        .expect("device listed")
        .health
}

fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

async fn preferred(
    client: &mut DevicePluginClient<Channel>,
    available: &[String],
    must: &[String],
    size: i32,
) -> Vec<String> {
    let response = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available.to_vec(),
                must_include_device_i_ds: must.to_vec(),
                allocation_size: size,
            }],
        })
        .await
        .unwrap();
    response.into_inner().container_responses[0]
        .device_i_ds
        .clone()
}

async fn allocate(
    client: &mut DevicePluginClient<Channel>,
    containers: &[Vec<String>],
) -> Result<Vec<std::collections::HashMap<String, String>>, tonic::Status> {
    let response = client
        .allocate(AllocateRequest {
            container_requests: containers
                .iter()
                .map(|ids| ContainerAllocateRequest {
                    devices_ids: ids.clone(),
                })
                .collect(),
        })
        .await?;
    Ok(response
        .into_inner()
        .container_responses
        .into_iter()
        .map(|c| c.envs)
        .collect())
}

fn tile_ids(topo: &Topology, tiles: impl IntoIterator<Item = u32>) -> Vec<String> {
    tiles.into_iter().map(|t| topo.tile_id(t)).collect()
}

#[tokio::test]
async fn registers_then_serves_the_kubelet_calls() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = KubeletDouble::start(dir.path()).unwrap();
    let plugin = RunningPlugin::start(dir.path(), node(8, 4, ResourceMode::Tile, None));
    let registration = registered(&mut kubelet).await;
    assert_eq!(registration.version, "v1beta1");
    assert_eq!(registration.endpoint, "rdu-tile.sock");
    assert_eq!(registration.resource_name, "rdu.dev/tile");
    assert!(
        registration
            .options
            .unwrap()
            .get_preferred_allocation_available
    );

    let mut client = kubelet.dial_plugin(&registration).await.unwrap();
    let options = client
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(options.get_preferred_allocation_available);
    let mut stream = list_and_watch(&mut client).await;
    let first = stream.message().await.unwrap().unwrap();
    let topo = Topology::new(8, 4).unwrap();
    assert_eq!(
        first
            .devices
            .iter()
            .map(|d| d.id.clone())
            .collect::<Vec<_>>(),
        tile_ids(&topo, 0..32)
    );
    assert!(first.devices.iter().all(|d| d.health == "Healthy"));

    // rdu0-tile0 is in use: 4 tiles do not fit RDU 0 any more and take the whole of RDU 1.
    let available = tile_ids(&topo, 1..32);
    let chosen = preferred(&mut client, &available, &[], 4).await;
    assert_eq!(chosen, tile_ids(&topo, 4..8));
    let envs = allocate(&mut client, std::slice::from_ref(&chosen))
        .await
        .unwrap();
    assert_eq!(envs[0]["SF_RNT_TILE_AFFINITY"], "0xf0");
    assert_eq!(envs[0]["RDU_VISIBLE_TILES"], chosen.join(","));
    // Must-include devices are kept.
    let chosen = preferred(&mut client, &available, &strings(&["rdu5-tile1"]), 2).await;
    assert!(chosen.contains(&"rdu5-tile1".to_string()));
    assert_eq!(chosen.len(), 2);
    assert!(chosen.iter().all(|id| id.starts_with("rdu5-")));
    assert_eq!(plugin.node.status().tiles_allocated, 4);

    let socket = dir.path().join("rdu-tile.sock");
    assert!(socket.exists());
    plugin.shutdown().await;
    assert!(
        !socket.exists(),
        "the plugin removes its socket when it stops"
    );
}

#[tokio::test]
async fn waits_for_kubelet_sock_then_registers() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = RunningPlugin::start(dir.path(), node(2, 4, ResourceMode::Rdu, None));
    // The plugin serves before any kubelet exists.
    let socket = dir.path().join("rdu-rdu.sock");
    tokio::time::timeout(DEADLINE, async {
        while !socket.exists() {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("plugin socket appears");
    let mut kubelet = KubeletDouble::start(dir.path()).unwrap();
    let registration = registered(&mut kubelet).await;
    assert_eq!(registration.resource_name, "rdu.dev/rdu");
    assert_eq!(registration.endpoint, "rdu-rdu.sock");
    let mut client = kubelet.dial_plugin(&registration).await.unwrap();
    let list = list_and_watch(&mut client)
        .await
        .message()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        list.devices
            .iter()
            .map(|d| d.id.as_str())
            .collect::<Vec<_>>(),
        ["rdu0", "rdu1"]
    );
    let envs = allocate(&mut client, &[strings(&["rdu1"])]).await.unwrap();
    assert_eq!(envs[0]["SF_RNT_TILE_AFFINITY"], "0xf0");
    assert_eq!(
        envs[0]["RDU_VISIBLE_TILES"],
        "rdu1-tile0,rdu1-tile1,rdu1-tile2,rdu1-tile3"
    );
    plugin.shutdown().await;
}

#[tokio::test]
async fn retries_registration_while_the_kubelet_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = KubeletDouble::start_refusing(dir.path(), 3).unwrap();
    let plugin = RunningPlugin::start(dir.path(), node(8, 4, ResourceMode::Tile, None));
    let registration = registered(&mut kubelet).await;
    assert_eq!(registration.resource_name, "rdu.dev/tile");
    assert_eq!(kubelet.attempts(), 4, "three refusals, then success");
    plugin.shutdown().await;
}

#[tokio::test]
async fn re_registers_after_a_kubelet_restart_wipes_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = KubeletDouble::start(dir.path()).unwrap();
    let plugin = RunningPlugin::start(dir.path(), node(8, 4, ResourceMode::Tile, None));
    registered(&mut kubelet).await;

    // First a restart that wipes the whole directory (the plugin's socket too), then one that only
    // replaces kubelet.sock: both must lead to a new registration.
    for wipe_everything in [true, false] {
        kubelet.stop().await;
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if wipe_everything || path.ends_with("kubelet.sock") {
                std::fs::remove_file(path).unwrap();
            }
        }
        kubelet = KubeletDouble::start(dir.path()).unwrap();
        let registration = registered(&mut kubelet).await;
        assert_eq!(
            registration.resource_name, "rdu.dev/tile",
            "wipe {wipe_everything}"
        );
        let mut client = kubelet.dial_plugin(&registration).await.unwrap();
        let list = list_and_watch(&mut client)
            .await
            .message()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(list.devices.len(), 32);
    }
    plugin.shutdown().await;
}

#[tokio::test]
async fn without_inotify_the_periodic_check_still_registers_and_re_registers() {
    let dir = tempfile::tempdir().unwrap();
    let timing = Timing {
        watch_directory: false,
        recheck: Duration::from_millis(20),
        ..fast_timing()
    };
    let plugin =
        RunningPlugin::start_with(dir.path(), node(2, 2, ResourceMode::Tile, None), timing);
    let mut kubelet = KubeletDouble::start(dir.path()).unwrap();
    registered(&mut kubelet).await;
    kubelet.stop().await;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let _ = std::fs::remove_file(entry.unwrap().path());
    }
    let mut kubelet = KubeletDouble::start(dir.path()).unwrap();
    let registration = registered(&mut kubelet).await;
    let mut client = kubelet.dial_plugin(&registration).await.unwrap();
    let list = list_and_watch(&mut client)
        .await
        .message()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(list.devices.len(), 4);
    plugin.shutdown().await;
}

#[tokio::test]
async fn health_file_changes_are_streamed_and_block_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let health_dir = tempfile::tempdir().unwrap();
    let health_file = health_dir.path().join("unhealthy");
    let mut kubelet = KubeletDouble::start(dir.path()).unwrap();
    let plugin = RunningPlugin::start(dir.path(), node(8, 4, ResourceMode::Tile, None));
    let _watch = watch_health_file(plugin.node.clone(), health_file.clone()).unwrap();
    let registration = registered(&mut kubelet).await;
    let mut client = kubelet.dial_plugin(&registration).await.unwrap();
    let mut stream = list_and_watch(&mut client).await;
    until_list(&mut stream, |l| {
        l.devices.iter().all(|d| d.health == "Healthy")
    })
    .await;

    std::fs::write(&health_file, "# hung tile\nrdu1-tile2\n").unwrap();
    let list = until_list(&mut stream, |l| health_of(l, "rdu1-tile2") == "Unhealthy").await;
    assert_eq!(
        list.devices
            .iter()
            .filter(|d| d.health == "Unhealthy")
            .count(),
        1
    );
    let err = allocate(&mut client, &[strings(&["rdu1-tile1", "rdu1-tile2"])])
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().contains("rdu1-tile2"), "{}", err.message());

    // A whole RDU fails while the tile recovers.
    std::fs::write(&health_file, "rdu3\n").unwrap();
    let list = until_list(&mut stream, |l| {
        health_of(l, "rdu1-tile2") == "Healthy" && health_of(l, "rdu3-tile0") == "Unhealthy"
    })
    .await;
    assert_eq!(
        list.devices
            .iter()
            .filter(|d| d.health == "Unhealthy")
            .count(),
        4
    );
    assert!(
        allocate(&mut client, &[strings(&["rdu1-tile2"])])
            .await
            .is_ok()
    );

    std::fs::remove_file(&health_file).unwrap();
    until_list(&mut stream, |l| {
        l.devices.iter().all(|d| d.health == "Healthy")
    })
    .await;
    assert_eq!(plugin.node.status().tiles_healthy, 32);
    plugin.shutdown().await;
}

#[tokio::test]
async fn allocate_refuses_unknown_devices_with_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = KubeletDouble::start(dir.path()).unwrap();
    let plugin = RunningPlugin::start(dir.path(), node(8, 4, ResourceMode::Tile, None));
    let registration = registered(&mut kubelet).await;
    let mut client = kubelet.dial_plugin(&registration).await.unwrap();
    for bad in ["rdu8-tile0", "rdu0-tile4", "rdu0", "gpu-0"] {
        let err = allocate(&mut client, &[strings(&["rdu0-tile0", bad])])
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad}");
        assert!(err.message().contains(bad), "{bad}: {}", err.message());
    }
    let err = allocate(&mut client, &[vec![]]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(plugin.node.status().tiles_allocated, 0);
    plugin.shutdown().await;
}

#[tokio::test]
async fn masks_for_8x4_and_4x8_nodes() {
    for (rdus, tiles, groups) in [
        (
            8u32,
            4u32,
            vec![
                (vec![24u32, 25, 26, 27, 28, 29, 30, 31], "0xff000000"),
                (vec![0, 1, 2, 3], "0xf"),
                (vec![13], "0x2000"),
                (vec![3, 4], "0x18"),
            ],
        ),
        (
            4,
            8,
            vec![
                (vec![24, 25, 26, 27, 28, 29, 30, 31], "0xff000000"),
                (
                    vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
                    "0xffff",
                ),
                (vec![8, 9, 10, 11], "0xf00"),
            ],
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut kubelet = KubeletDouble::start(dir.path()).unwrap();
        let plugin = RunningPlugin::start(dir.path(), node(rdus, tiles, ResourceMode::Tile, None));
        let registration = registered(&mut kubelet).await;
        let mut client = kubelet.dial_plugin(&registration).await.unwrap();
        let topo = Topology::new(rdus, tiles).unwrap();
        for (group, mask) in groups {
            let envs = allocate(&mut client, &[tile_ids(&topo, group.clone())])
                .await
                .unwrap();
            assert_eq!(
                envs[0]["SF_RNT_TILE_AFFINITY"], mask,
                "{rdus}x{tiles} {group:?}"
            );
        }
        plugin.shutdown().await;
    }
}

#[tokio::test]
async fn fragmented_nodes_get_packed_preferred_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = KubeletDouble::start(dir.path()).unwrap();
    let plugin = RunningPlugin::start(dir.path(), node(4, 4, ResourceMode::Tile, None));
    let registration = registered(&mut kubelet).await;
    let mut client = kubelet.dial_plugin(&registration).await.unwrap();
    let topo = Topology::new(4, 4).unwrap();
    // The kubelet's own bookkeeping of free devices.
    let mut free: BTreeSet<String> = tile_ids(&topo, 0..16).into_iter().collect();
    let mut pods = Vec::new();
    for size in [1, 2, 1, 4, 3, 1] {
        let available: Vec<String> = free.iter().cloned().collect();
        let chosen = preferred(&mut client, &available, &[], size).await;
        assert_eq!(chosen.len(), size as usize);
        allocate(&mut client, std::slice::from_ref(&chosen))
            .await
            .unwrap();
        for id in &chosen {
            assert!(free.remove(id), "{id} handed out twice");
        }
        pods.push(chosen);
    }
    // Sizes 1,2,1 pack RDU 0; 4 takes RDU 1; 3 and 1 pack RDU 2: RDU 3 stays whole.
    let rdus_of = |ids: &[String]| -> BTreeSet<String> {
        ids.iter()
            .map(|id| id.split('-').next().unwrap().to_string())
            .collect()
    };
    assert!(pods.iter().all(|p| rdus_of(p).len() == 1), "{pods:?}");
    assert_eq!(free, tile_ids(&topo, 12..16).into_iter().collect());
    // Pods 0 and 2 end (the kubelet frees their tiles): the node is now fragmented.
    for pod in [&pods[0], &pods[2]] {
        free.extend(pod.iter().cloned());
    }
    let available: Vec<String> = free.iter().cloned().collect();
    // 2 tiles fit into the holes of RDU 0 rather than breaking RDU 3.
    let two = preferred(&mut client, &available, &[], 2).await;
    assert_eq!(rdus_of(&two), BTreeSet::from(["rdu0".to_string()]));
    // 6 tiles need two RDUs: all of RDU 3 plus the 2 free tiles of RDU 0.
    let six = preferred(&mut client, &available, &[], 6).await;
    assert_eq!(rdus_of(&six).len(), 2, "{six:?}");
    assert!(tile_ids(&topo, 12..16).iter().all(|id| six.contains(id)));
    plugin.shutdown().await;
}

/// A registered plugin of 8 RDUs x 4 tiles beside the kubelet's pod-resources API.
struct PodResourcesRig {
    lister: PodResourcesDouble,
    socket: PathBuf,
    plugin: RunningPlugin,
    client: DevicePluginClient<Channel>,
    _kubelet: KubeletDouble,
    _dirs: [tempfile::TempDir; 2],
}

impl PodResourcesRig {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let pod_resources_dir = tempfile::tempdir().unwrap();
        let socket = pod_resources_dir.path().join("kubelet.sock");
        let lister = PodResourcesDouble::start(&socket).unwrap();
        let mut kubelet = KubeletDouble::start(dir.path()).unwrap();
        let plugin = RunningPlugin::start(dir.path(), node(8, 4, ResourceMode::Tile, None));
        let registration = registered(&mut kubelet).await;
        let client = kubelet.dial_plugin(&registration).await.unwrap();
        PodResourcesRig {
            lister,
            socket,
            plugin,
            client,
            _kubelet: kubelet,
            _dirs: [dir, pod_resources_dir],
        }
    }
}

#[tokio::test]
async fn an_allocate_has_pod_resources_read_soon_not_at_the_next_interval() {
    // (Named bindings keep the kubelet double and the directories alive to the end.)
    let PodResourcesRig {
        lister,
        socket,
        plugin,
        mut client,
        _kubelet,
        _dirs,
    } = PodResourcesRig::start().await;
    let annotations = Annotations::default();
    // An interval no test outlives: only the first read (at start) comes from it.
    let _poller = spawn_pod_resources_poller(
        plugin.node.clone(),
        socket,
        Duration::from_secs(3600),
        Duration::from_secs(60),
        Some(TilePublisher::new(Box::new(annotations.clone()))),
    );
    let started = std::time::Instant::now();
    while lister.lists() == 0 {
        assert!(started.elapsed() < DEADLINE, "no first read");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    allocate(&mut client, &[strings(&["rdu2-tile0"])])
        .await
        .unwrap();
    // The kubelet creates the container after Allocate; only then does it list the pod.
    lister.set_pods(&[("ml", "mnist-worker-1", "rdu.dev/tile", &["rdu2-tile0"])]);
    while annotations.0.lock().unwrap().is_empty() {
        assert!(
            started.elapsed() < DEADLINE,
            "the pod's tiles waited for the interval"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        annotations.0.lock().unwrap().clone(),
        vec!["ml/mnist-worker-1=rdu2-tile0".to_string()]
    );
    plugin.shutdown().await;
}

#[tokio::test]
async fn pod_resources_name_the_pod_and_rank_and_free_ended_pods() {
    // (Named bindings keep the kubelet double and the directories alive to the end.)
    let PodResourcesRig {
        lister,
        socket,
        plugin,
        mut client,
        _kubelet,
        _dirs,
    } = PodResourcesRig::start().await;
    allocate(&mut client, &[strings(&["rdu1-tile0", "rdu1-tile1"])])
        .await
        .unwrap();
    lister.set_pods(&[
        (
            "ml",
            "mnist-worker-3",
            "rdu.dev/tile",
            &["rdu1-tile0", "rdu1-tile1"],
        ),
        ("ml", "other", "example.com/gpu", &["gpu0"]),
    ]);
    let annotations = Annotations::default();
    let _poller = spawn_pod_resources_poller(
        plugin.node.clone(),
        socket,
        Duration::from_millis(20),
        Duration::ZERO,
        Some(TilePublisher::new(Box::new(annotations.clone()))),
    );
    let status = until_status(&plugin.node, |s| {
        s.tiles[4].pod.is_some() && s.tiles[5].pod.is_some()
    })
    .await;
    assert_eq!(status.tiles[4].pod.as_deref(), Some("ml/mnist-worker-3"));
    assert_eq!(status.tiles[5].rank, Some(3));
    assert_eq!(status.tiles_allocated, 2);
    // The pod's tiles are published on it, once, for the operator's status.ranks[].tiles.
    let started = std::time::Instant::now();
    while annotations.0.lock().unwrap().is_empty() {
        assert!(started.elapsed() < DEADLINE, "no annotation written");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        annotations.0.lock().unwrap().clone(),
        vec!["ml/mnist-worker-3=rdu1-tile0,rdu1-tile1".to_string()]
    );
    // The pod ends: the kubelet no longer lists it and its tiles are free again.
    lister.set_pods(&[]);
    until_status(&plugin.node, |s| s.tiles_allocated == 0).await;
    plugin.shutdown().await;
}

#[tokio::test]
async fn allocations_survive_a_plugin_restart_through_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let checkpoint = state.path().join("allocations.json");
    let mut kubelet = KubeletDouble::start(dir.path()).unwrap();
    let plugin = RunningPlugin::start(
        dir.path(),
        node(8, 4, ResourceMode::Tile, Some(checkpoint.clone())),
    );
    let registration = registered(&mut kubelet).await;
    let mut client = kubelet.dial_plugin(&registration).await.unwrap();
    allocate(
        &mut client,
        &[
            strings(&["rdu2-tile0", "rdu2-tile1"]),
            strings(&["rdu6-tile3"]),
        ],
    )
    .await
    .unwrap();
    let before = plugin.node.status();
    plugin.shutdown().await;

    let restarted = RunningPlugin::start(
        dir.path(),
        node(8, 4, ResourceMode::Tile, Some(checkpoint.clone())),
    );
    registered(&mut kubelet).await;
    let after = restarted.node.status();
    assert_eq!(after.tiles_allocated, 3);
    assert_eq!(after, before);
    restarted.shutdown().await;
}
