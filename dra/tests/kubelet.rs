//! The kubelet's side of a DRA driver, over real unix sockets: registration, prepare (twice), a restart of the
//! driver, unprepare.

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rdu_dra::api::dra_plugin_client::DraPluginClient;
use rdu_dra::api::dra_plugin_server::DraPluginServer;
use rdu_dra::api::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use rdu_dra::driver::{ClaimSource, Driver, DriverConfig, SourceError};
use rdu_dra::registration::{Registrar, RegistrationState};
use rdu_dra::registration_api::registration_client::RegistrationClient;
use rdu_dra::registration_api::registration_server::RegistrationServer;
use rdu_dra::registration_api::{InfoRequest, RegistrationStatus};
use rdu_tiles::topology::Topology;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::UnixStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint, Server, Uri};

const UID: &str = "5a1e4b7c-0d2f-4e8a-9b3c-6d7e8f9a0b1c";

/// One ResourceClaim, `ns/train`, allocated two tiles of RDU 3 on node-a.
struct OneClaim;

#[tonic::async_trait]
impl ClaimSource for OneClaim {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, SourceError> {
        if (namespace, name) != ("ns", "train") {
            return Err(format!("resourceclaims \"{name}\" not found").into());
        }
        let result = |device: &str| DeviceRequestAllocationResult {
            driver: "rdu.dev".into(),
            pool: "node-a".into(),
            device: device.into(),
            request: "tiles".into(),
            ..Default::default()
        };
        Ok(ResourceClaim {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("train".into()),
                uid: Some(UID.into()),
                ..Default::default()
            },
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(vec![result("rdu3-tile2"), result("rdu3-tile3")]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

async fn unix_channel(path: &Path) -> Channel {
    let socket = path.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .expect("dial")
}

/// A running gRPC server; dropping the sender stops it.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.expect("server task").expect("server");
    }
}

fn serve_driver(dir: &Path, socket: &Path) -> Running {
    let driver = Driver::new(
        DriverConfig {
            node_name: "node-a".into(),
            topology: Topology::new(8, 4).expect("topology"),
            cdi_dir: dir.join("cdi"),
            checkpoint_path: dir.join("plugin").join("prepared-claims.json"),
            domain_dir: dir.join("domains"),
        },
        Arc::new(OneClaim),
    )
    .expect("driver");
    let incoming = rdu_dra::socket::listen(socket).expect("listen");
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(
        Server::builder()
            .add_service(DraPluginServer::new(driver))
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            }),
    );
    Running { stop, task }
}

fn claim() -> Claim {
    Claim {
        namespace: "ns".into(),
        uid: UID.into(),
        name: "train".into(),
    }
}

#[tokio::test]
async fn the_kubelet_registers_prepares_and_unprepares_across_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin_socket: PathBuf = dir.path().join("plugins/rdu.dev/dra.sock");
    let reg_socket = dir.path().join("plugins_registry/rdu.dev-reg.sock");

    // Registration.
    let registrar = Arc::new(Registrar::new(&plugin_socket).expect("registrar"));
    let mut state = registrar.subscribe();
    let (reg_stop, reg_stopped) = oneshot::channel();
    let reg_task = tokio::spawn(
        Server::builder()
            .add_service(RegistrationServer::from_arc(registrar.clone()))
            .serve_with_incoming_shutdown(
                rdu_dra::socket::listen(&reg_socket).expect("listen"),
                async {
                    let _ = reg_stopped.await;
                },
            ),
    );
    let mut registration = RegistrationClient::new(unix_channel(&reg_socket).await);
    let info = registration
        .get_info(InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "rdu.dev");
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    assert_eq!(Path::new(&info.endpoint), plugin_socket);
    registration
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .expect("NotifyRegistrationStatus");
    state.changed().await.expect("state");
    assert_eq!(*state.borrow(), RegistrationState::Registered);

    // Prepare, at the endpoint GetInfo named.
    let running = serve_driver(dir.path(), Path::new(&info.endpoint));
    let mut plugin = DraPluginClient::new(unix_channel(Path::new(&info.endpoint)).await);
    let prepare = NodePrepareResourcesRequest {
        claims: vec![claim()],
    };
    let first = plugin
        .node_prepare_resources(prepare.clone())
        .await
        .expect("prepare")
        .into_inner();
    let answer = &first.claims[UID];
    assert_eq!(answer.error, "");
    let devices: Vec<(&str, &str)> = answer
        .devices
        .iter()
        .map(|d| (d.pool_name.as_str(), d.device_name.as_str()))
        .collect();
    assert_eq!(
        devices,
        [("node-a", "rdu3-tile2"), ("node-a", "rdu3-tile3")]
    );
    let cdi_id = format!("rdu.dev/tile={UID}");
    assert!(
        answer
            .devices
            .iter()
            .all(|d| d.cdi_device_ids == [cdi_id.clone()] && d.request_names == ["tiles"])
    );

    let spec_path = dir.path().join("cdi").join(format!("rdu.dev-{UID}.json"));
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&spec_path).expect("CDI spec")).expect("CDI JSON");
    assert_eq!(spec["kind"], "rdu.dev/tile");
    assert_eq!(spec["devices"][0]["name"], UID);
    // Tiles 3*4+2 and 3*4+3: bits 14 and 15.
    assert_eq!(
        spec["devices"][0]["containerEdits"]["env"],
        serde_json::json!([
            "RDU_VISIBLE_TILES=rdu3-tile2,rdu3-tile3",
            "SF_RNT_TILE_AFFINITY=0xc000"
        ])
    );

    let second = plugin
        .node_prepare_resources(prepare)
        .await
        .expect("prepare again")
        .into_inner();
    assert_eq!(second, first);

    // Restart the driver over the same directories, then unprepare.
    drop(plugin);
    running.stop().await;
    let running = serve_driver(dir.path(), &plugin_socket);
    let mut plugin = DraPluginClient::new(unix_channel(&plugin_socket).await);
    let unprepared = plugin
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![claim()],
        })
        .await
        .expect("unprepare")
        .into_inner();
    assert_eq!(unprepared.claims[UID].error, "");
    assert!(!spec_path.exists(), "the CDI spec is removed");
    let checkpoint =
        rdu_dra::prepared::Checkpoint::load(dir.path().join("plugin/prepared-claims.json"))
            .expect("checkpoint");
    assert!(
        checkpoint.get(UID).is_none(),
        "the checkpoint forgets the claim"
    );
    let again = plugin
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![claim()],
        })
        .await
        .expect("unprepare again")
        .into_inner();
    assert_eq!(again.claims[UID].error, "");

    drop(plugin);
    running.stop().await;
    let _ = reg_stop.send(());
    reg_task
        .await
        .expect("registration task")
        .expect("registration server");
}
