//! The kubelet's DRAPlugin service: NodePrepareResources reads each claim's allocation, makes its job's
//! shared-memory domain, writes its CDI spec and records it in the checkpoint; NodeUnprepareResources removes the
//! spec and the record, and the domain once no prepared claim is in it. A claim that fails gets its own error in
//! the response, never a failure of the whole call.

use crate::api::dra_plugin_server::DraPlugin;
use crate::api::{
    Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
};
use crate::cdi::{CdiDir, CdiError};
use crate::devices::DRIVER_NAME;
use crate::domain::{DomainError, Domains, domain_of};
use crate::prepared::{Checkpoint, PreparedClaim, PreparedDevice, PreparedError};
use k8s_openapi::api::resource::v1::ResourceClaim;
use rdu_tiles::topology::{ResourceMode, TileIndex, Topology, TopologyError};
use std::sync::Arc;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

/// What a [`ClaimSource`] fails with.
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// Where the driver reads ResourceClaims from: the API server, or a fake in tests.
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, SourceError>;
}

/// ResourceClaims from the API server.
#[derive(Clone)]
pub struct KubeClaims {
    client: kube::Client,
}

impl KubeClaims {
    pub fn new(client: kube::Client) -> KubeClaims {
        KubeClaims { client }
    }
}

#[tonic::async_trait]
impl ClaimSource for KubeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, SourceError> {
        let api = kube::Api::<ResourceClaim>::namespaced(self.client.clone(), namespace);
        Ok(api.get(name).await?)
    }
}

/// Errors preparing or unpreparing one claim (each reported in that claim's `error`), or starting the driver.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("cannot get ResourceClaim {namespace}/{name}")]
    Fetch {
        namespace: String,
        name: String,
        #[source]
        source: SourceError,
    },
    #[error(
        "ResourceClaim {namespace}/{name} has UID {found}, the kubelet asked for {wanted}: the claim was replaced"
    )]
    UidMismatch {
        namespace: String,
        name: String,
        wanted: String,
        found: String,
    },
    #[error("ResourceClaim {namespace}/{name} is not allocated")]
    NotAllocated { namespace: String, name: String },
    #[error(
        "ResourceClaim {namespace}/{name} was allocated device {device} of pool {pool}, which is not this node ({node})"
    )]
    OtherPool {
        namespace: String,
        name: String,
        pool: String,
        device: String,
        node: String,
    },
    #[error(
        "ResourceClaim {namespace}/{name} was allocated device {device}, which node {node} does not have"
    )]
    UnknownDevice {
        namespace: String,
        name: String,
        device: String,
        node: String,
        #[source]
        source: Box<TopologyError>,
    },
    #[error("ResourceClaim {namespace}/{name} has no device of driver {DRIVER_NAME}")]
    NoDevices { namespace: String, name: String },
    #[error("CDI spec of claim {uid}")]
    Cdi {
        uid: String,
        #[source]
        source: CdiError,
    },
    #[error("shared-memory domain of claim {uid}")]
    Domain {
        uid: String,
        #[source]
        source: DomainError,
    },
    #[error("checkpoint of claim {uid}")]
    Checkpoint {
        uid: String,
        #[source]
        source: PreparedError,
    },
    #[error("cannot load the checkpoint of prepared claims")]
    LoadCheckpoint(#[source] PreparedError),
}

/// One allocated device of a claim on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedTile {
    pub request: String,
    pub device: String,
    pub tile: TileIndex,
}

/// The tiles this node must prepare for `claim` (the kubelet's `wanted` claim): the allocation results of driver
/// `rdu.dev`, all of which must be tiles of this node's pool.
pub fn allocated_tiles(
    wanted: &Claim,
    claim: &ResourceClaim,
    node: &str,
    topology: &Topology,
) -> Result<Vec<AllocatedTile>, DriverError> {
    let namespace = || wanted.namespace.clone();
    let name = || wanted.name.clone();
    let found = claim.metadata.uid.as_deref().unwrap_or_default();
    if found != wanted.uid {
        return Err(DriverError::UidMismatch {
            namespace: namespace(),
            name: name(),
            wanted: wanted.uid.clone(),
            found: found.to_string(),
        });
    }
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .ok_or_else(|| DriverError::NotAllocated {
            namespace: namespace(),
            name: name(),
        })?;
    let mut tiles = Vec::new();
    for result in results.iter().filter(|r| r.driver == DRIVER_NAME) {
        if result.pool != node {
            return Err(DriverError::OtherPool {
                namespace: namespace(),
                name: name(),
                pool: result.pool.clone(),
                device: result.device.clone(),
                node: node.to_string(),
            });
        }
        let parsed = topology
            .parse_device(ResourceMode::Tile, &result.device)
            .map_err(|source| DriverError::UnknownDevice {
                namespace: namespace(),
                name: name(),
                device: result.device.clone(),
                node: node.to_string(),
                source: Box::new(source),
            })?;
        tiles.extend(parsed.into_iter().map(|tile| AllocatedTile {
            request: result.request.clone(),
            device: result.device.clone(),
            tile,
        }));
    }
    if tiles.is_empty() {
        return Err(DriverError::NoDevices {
            namespace: namespace(),
            name: name(),
        });
    }
    Ok(tiles)
}

/// Where the driver keeps its files and what node it serves.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    pub node_name: String,
    pub topology: Topology,
    pub cdi_dir: std::path::PathBuf,
    pub checkpoint_path: std::path::PathBuf,
    /// Where shared-memory domains are made (a path on the node, as the CDI spec mounts it).
    pub domain_dir: std::path::PathBuf,
}

/// The DRAPlugin service of one node.
pub struct Driver {
    node: String,
    topology: Topology,
    cdi: CdiDir,
    domains: Domains,
    claims: Arc<dyn ClaimSource>,
    /// Held for a whole call: claims are prepared one at a time, so the checkpoint and CDI files agree.
    prepared: Mutex<Checkpoint>,
}

impl Driver {
    /// A driver over the checkpoint at `config.checkpoint_path` (claims prepared before a restart stay prepared,
    /// their domains and CDI specs made again where a reboot took them: [`restore`]); domains no prepared claim
    /// is in (left by a driver stopped mid-unprepare) are removed ([`sweep`]).
    pub fn new(config: DriverConfig, claims: Arc<dyn ClaimSource>) -> Result<Driver, DriverError> {
        let checkpoint =
            Checkpoint::load(config.checkpoint_path).map_err(DriverError::LoadCheckpoint)?;
        let domains = Domains::new(config.domain_dir);
        let cdi = CdiDir::new(config.cdi_dir);
        sweep(&domains, &checkpoint);
        for (uid, prepared) in checkpoint.iter() {
            if let Err(e) = restore(&cdi, &domains, &config.topology, uid, prepared) {
                // The kubelet's next prepare of the claim tries again and reports it on the claim's pod.
                tracing::warn!(claim = %uid, error = %rdu_error_chain::chain(&e),
                    "cannot restore a prepared claim's files");
            }
        }
        Ok(Driver {
            node: config.node_name,
            topology: config.topology,
            cdi,
            domains,
            claims,
            prepared: Mutex::new(checkpoint),
        })
    }

    async fn prepare(
        &self,
        checkpoint: &mut Checkpoint,
        claim: &Claim,
    ) -> Result<PreparedClaim, DriverError> {
        if let Some(prepared) = checkpoint.get(&claim.uid) {
            restore(
                &self.cdi,
                &self.domains,
                &self.topology,
                &claim.uid,
                prepared,
            )?;
            return Ok(prepared.clone());
        }
        let object = self
            .claims
            .get(&claim.namespace, &claim.name)
            .await
            .map_err(|source| DriverError::Fetch {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                source,
            })?;
        let allocated = allocated_tiles(claim, &object, &self.node, &self.topology)?;
        let tiles: Vec<TileIndex> = allocated.iter().map(|a| a.tile).collect();
        let domain_error = |source| DriverError::Domain {
            uid: claim.uid.clone(),
            source,
        };
        let domain = domain_of(&object).map_err(domain_error)?;
        let domain_path = match &domain {
            Some(name) => Some(self.domains.make(name).map_err(domain_error)?),
            None => None,
        };
        let written = self
            .cdi
            .write_claim(&claim.uid, &self.topology, &tiles, domain_path.as_deref())
            .map_err(|source| DriverError::Cdi {
                uid: claim.uid.clone(),
                source,
            });
        let cdi_id = match written {
            Ok(id) => id,
            Err(e) => {
                sweep(&self.domains, checkpoint);
                return Err(e);
            }
        };
        let prepared = PreparedClaim {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            devices: allocated
                .into_iter()
                .map(|a| PreparedDevice {
                    request_names: vec![a.request],
                    pool_name: self.node.clone(),
                    device_name: a.device,
                    cdi_device_ids: vec![cdi_id.clone()],
                })
                .collect(),
            domain,
        };
        if let Err(source) = checkpoint.insert(&claim.uid, prepared.clone()) {
            // Not recorded, so not prepared: leave no spec or new domain behind for a claim the kubelet will retry.
            let _ = self.cdi.remove_claim(&claim.uid);
            sweep(&self.domains, checkpoint);
            return Err(DriverError::Checkpoint {
                uid: claim.uid.clone(),
                source,
            });
        }
        Ok(prepared)
    }

    fn unprepare(&self, checkpoint: &mut Checkpoint, claim: &Claim) -> Result<(), DriverError> {
        self.cdi
            .remove_claim(&claim.uid)
            .map_err(|source| DriverError::Cdi {
                uid: claim.uid.clone(),
                source,
            })?;
        checkpoint
            .remove(&claim.uid)
            .map_err(|source| DriverError::Checkpoint {
                uid: claim.uid.clone(),
                source,
            })?;
        sweep(&self.domains, checkpoint);
        Ok(())
    }
}

/// Makes the files of recorded claim `uid` again: its domain (kept if there) and its CDI spec, written from the
/// record. Both live on tmpfs (`/run`, `/var/run/cdi`) that a node's reboot empties while the checkpoint on disk
/// stays, and a container of a claim the kubelet holds prepared would then not start ("unresolvable CDI
/// devices").
fn restore(
    cdi: &CdiDir,
    domains: &Domains,
    topology: &Topology,
    uid: &str,
    prepared: &PreparedClaim,
) -> Result<(), DriverError> {
    let domain_path = match &prepared.domain {
        Some(name) => Some(domains.make(name).map_err(|source| DriverError::Domain {
            uid: uid.to_string(),
            source,
        })?),
        None => None,
    };
    let mut tiles = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    // A device is recorded once per tile it holds: parse each device once, in the recorded order.
    for device in prepared
        .devices
        .iter()
        .filter(|d| seen.insert(d.device_name.as_str()))
    {
        let parsed = topology
            .parse_device(ResourceMode::Tile, &device.device_name)
            .map_err(|source| DriverError::UnknownDevice {
                namespace: prepared.namespace.clone(),
                name: prepared.name.clone(),
                device: device.device_name.clone(),
                node: device.pool_name.clone(),
                source: Box::new(source),
            })?;
        tiles.extend(parsed);
    }
    cdi.write_claim(uid, topology, &tiles, domain_path.as_deref())
        .map(drop)
        .map_err(|source| DriverError::Cdi {
            uid: uid.to_string(),
            source,
        })
}

/// Removes the domains no prepared claim is in. A domain that cannot be removed (say, a rank left a directory the
/// driver may not enter) stays until a later sweep: the claims are unprepared all the same, and the driver starts.
fn sweep(domains: &Domains, checkpoint: &Checkpoint) {
    match domains.sweep(&checkpoint.domains()) {
        Ok(removed) if removed.is_empty() => {}
        Ok(removed) => tracing::info!(domains = ?removed, "removed shared-memory domains"),
        Err(e) => tracing::warn!(
            error = %rdu_error_chain::chain(&e),
            "cannot remove a shared-memory domain no prepared claim is in; the next unprepare tries again"
        ),
    }
}

#[tonic::async_trait]
impl DraPlugin for Driver {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut checkpoint = self.prepared.lock().await;
        let mut response = NodePrepareResourcesResponse::default();
        for claim in request.into_inner().claims {
            let answer = match self.prepare(&mut checkpoint, &claim).await {
                Ok(prepared) => NodePrepareResourceResponse {
                    devices: prepared
                        .devices
                        .into_iter()
                        .map(|d| Device {
                            request_names: d.request_names,
                            pool_name: d.pool_name,
                            device_name: d.device_name,
                            cdi_device_ids: d.cdi_device_ids,
                        })
                        .collect(),
                    error: String::new(),
                },
                Err(e) => {
                    let error = rdu_error_chain::chain(&e);
                    tracing::warn!(claim = %claim.uid, %error, "cannot prepare claim");
                    NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    }
                }
            };
            response.claims.insert(claim.uid, answer);
        }
        Ok(Response::new(response))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut checkpoint = self.prepared.lock().await;
        let mut response = NodeUnprepareResourcesResponse::default();
        for claim in request.into_inner().claims {
            let error = match self.unprepare(&mut checkpoint, &claim) {
                Ok(()) => String::new(),
                Err(e) => {
                    let error = rdu_error_chain::chain(&e);
                    tracing::warn!(claim = %claim.uid, %error, "cannot unprepare claim");
                    error
                }
            };
            response
                .claims
                .insert(claim.uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(response))
    }
}

#[cfg(test)]
mod tests;
