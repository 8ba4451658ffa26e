//! The `DevicePlugin` gRPC service: a thin tonic adapter over the plain [`DeviceBackend`] trait.

use crate::api::device_plugin_server::DevicePlugin;
use crate::api::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse,
};
use rdu_tiles::node::{ContainerAllocation, DeviceHealth, NodeError, TileNode};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// Health value of a healthy device in the kubelet API.
pub const HEALTHY: &str = "Healthy";
/// Health value of an unhealthy device in the kubelet API.
pub const UNHEALTHY: &str = "Unhealthy";

/// What the device plugin service needs from the node, in plain Rust.
pub trait DeviceBackend: Send + Sync + 'static {
    /// The device list now and every later change.
    fn watch_devices(&self) -> watch::Receiver<Arc<Vec<DeviceHealth>>>;
    /// A preferred set of `size` devices from `available`, keeping `must_include`.
    fn preferred(
        &self,
        available: &[String],
        must_include: &[String],
        size: i64,
    ) -> Result<Vec<String>, NodeError>;
    /// Allocates the devices of every container of one request (all or nothing).
    fn allocate(&self, containers: &[Vec<String>]) -> Result<Vec<ContainerAllocation>, NodeError>;
}

impl DeviceBackend for TileNode {
    fn watch_devices(&self) -> watch::Receiver<Arc<Vec<DeviceHealth>>> {
        TileNode::watch_devices(self)
    }
    fn preferred(
        &self,
        available: &[String],
        must_include: &[String],
        size: i64,
    ) -> Result<Vec<String>, NodeError> {
        TileNode::preferred(self, available, must_include, size)
    }
    fn allocate(&self, containers: &[Vec<String>]) -> Result<Vec<ContainerAllocation>, NodeError> {
        TileNode::allocate_containers(self, containers)
    }
}

/// The tonic service. `stop` turning true ends every ListAndWatch stream (so a graceful shutdown completes).
pub struct DevicePluginService<B> {
    backend: Arc<B>,
    stop: watch::Receiver<bool>,
}

impl<B: DeviceBackend> DevicePluginService<B> {
    pub fn new(backend: Arc<B>, stop: watch::Receiver<bool>) -> Self {
        DevicePluginService { backend, stop }
    }
}

/// The kubelet's view of a device list.
pub fn to_response(devices: &[DeviceHealth]) -> ListAndWatchResponse {
    ListAndWatchResponse {
        devices: devices
            .iter()
            .map(|d| Device {
                id: d.id.clone(),
                health: if d.healthy { HEALTHY } else { UNHEALTHY }.to_string(),
                topology: None,
            })
            .collect(),
    }
}

/// The gRPC status of a node error: bad input is INVALID_ARGUMENT, an unhealthy device FAILED_PRECONDITION.
pub fn to_status(error: NodeError) -> Status {
    match &error {
        NodeError::UnknownDevice(_) | NodeError::EmptyRequest | NodeError::BadSize(_) => {
            Status::invalid_argument(rdu_error_chain::chain(&error))
        }
        NodeError::Unhealthy { .. } => Status::failed_precondition(rdu_error_chain::chain(&error)),
        NodeError::Packing(_) => Status::resource_exhausted(rdu_error_chain::chain(&error)),
        NodeError::SavedAllocations(_) => Status::internal(rdu_error_chain::chain(&error)),
    }
}

#[tonic::async_trait]
impl<B: DeviceBackend> DevicePlugin for DevicePluginService<B> {
    async fn get_device_plugin_options(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut devices = self.backend.watch_devices();
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let list = to_response(&devices.borrow_and_update());
                if tx.send(Ok(list)).await.is_err() {
                    return;
                }
                tokio::select! {
                    changed = devices.changed() => if changed.is_err() { return },
                    _ = stop.wait_for(|s| *s) => return,
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let mut container_responses = Vec::new();
        for container in request.into_inner().container_requests {
            let device_i_ds = self
                .backend
                .preferred(
                    &container.available_device_i_ds,
                    &container.must_include_device_i_ds,
                    i64::from(container.allocation_size),
                )
                .map_err(to_status)?;
            container_responses.push(ContainerPreferredAllocationResponse { device_i_ds });
        }
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let containers: Vec<Vec<String>> = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| c.devices_ids)
            .collect();
        let allocations = self.backend.allocate(&containers).map_err(|e| {
            tracing::warn!(devices = ?containers, error = %rdu_error_chain::Chain(&e), "Allocate refused");
            to_status(e)
        })?;
        tracing::info!(devices = ?containers, "allocated");
        let container_responses = allocations
            .into_iter()
            .map(|allocation| ContainerAllocateResponse {
                envs: allocation.env.into_iter().collect(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ContainerAllocateRequest, ContainerPreferredAllocationRequest};
    use rdu_tiles::topology::{ResourceMode, Topology};
    use std::collections::BTreeSet;
    use tokio_stream::StreamExt;

    fn service() -> (
        Arc<TileNode>,
        DevicePluginService<TileNode>,
        watch::Sender<bool>,
    ) {
        let node = Arc::new(TileNode::in_memory(
            Topology::new(8, 4).unwrap(),
            ResourceMode::Tile,
            None,
        ));
        let (stop_tx, stop_rx) = watch::channel(false);
        (
            node.clone(),
            DevicePluginService::new(node, stop_rx),
            stop_tx,
        )
    }

    #[tokio::test]
    async fn options_offer_preferred_allocation() {
        let (_, svc, _) = service();
        let options = svc
            .get_device_plugin_options(Request::new(Empty {}))
            .await
            .unwrap();
        assert!(options.get_ref().get_preferred_allocation_available);
        assert!(!options.get_ref().pre_start_required);
    }

    #[tokio::test]
    async fn allocate_maps_errors_to_grpc_codes() {
        let (node, svc, _) = service();
        let request = |ids: &[&str]| {
            Request::new(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids.iter().map(|s| s.to_string()).collect(),
                }],
            })
        };
        let err = svc.allocate(request(&["rdu42-tile0"])).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("rdu42-tile0"));
        node.set_unhealthy(&BTreeSet::from([0]));
        let err = svc.allocate(request(&["rdu0-tile0"])).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(err.message().contains("rdu0-tile0"));
        let ok = svc.allocate(request(&["rdu0-tile1"])).await.unwrap();
        assert_eq!(
            ok.get_ref().container_responses[0].envs["SF_RNT_TILE_AFFINITY"],
            "0x2"
        );
    }

    #[tokio::test]
    async fn preferred_answers_each_container() {
        let (_, svc, _) = service();
        let avail: Vec<String> = (2..32)
            .map(|t| Topology::new(8, 4).unwrap().tile_id(t))
            .collect();
        let response = svc
            .get_preferred_allocation(Request::new(PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_i_ds: avail,
                    must_include_device_i_ds: vec![],
                    allocation_size: 2,
                }],
            }))
            .await
            .unwrap();
        assert_eq!(
            response.get_ref().container_responses[0].device_i_ds,
            vec!["rdu0-tile2", "rdu0-tile3"]
        );
    }

    #[tokio::test]
    async fn list_and_watch_streams_changes_and_ends_on_stop() {
        let (node, svc, stop) = service();
        let mut stream = svc
            .list_and_watch(Request::new(Empty {}))
            .await
            .unwrap()
            .into_inner();
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(first.devices.len(), 32);
        assert!(first.devices.iter().all(|d| d.health == HEALTHY));
        node.set_unhealthy(&BTreeSet::from([5]));
        let second = stream.next().await.unwrap().unwrap();
        assert_eq!(second.devices[5].health, UNHEALTHY);
        stop.send(true).unwrap();
        assert!(stream.next().await.is_none());
    }
}
