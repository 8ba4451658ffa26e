//! Rendezvous at rank 0: every rank joins with its address, and once all have joined each gets
//! the peer table ordered by rank. The table logic is plain Rust; the tonic service adapts it.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::config::{CommConfig, PeerInfo, host_port};
use crate::error::CollectiveError;
use crate::net;
use crate::proto;

/// What rank 0 does with a join; the gRPC service is a thin adapter over it.
pub trait RendezvousHandler: Send + Sync + 'static {
    fn join(
        &self,
        request: proto::JoinRequest,
    ) -> impl Future<Output = Result<Vec<PeerInfo>, Status>> + Send;
}

/// Who may join, and who has.
pub struct RendezvousTable {
    job_uid: String,
    generation: u64,
    world_size: u32,
    chunk_bytes: u64,
    timeout: Duration,
    joined: Mutex<BTreeMap<u32, PeerInfo>>,
    complete: watch::Sender<Option<Arc<Vec<PeerInfo>>>>,
}

impl RendezvousTable {
    pub fn new(cfg: &CommConfig) -> Self {
        RendezvousTable {
            job_uid: cfg.identity.job_uid.clone(),
            generation: cfg.identity.generation,
            world_size: cfg.world_size,
            chunk_bytes: cfg.chunk_bytes as u64,
            timeout: cfg.timeout,
            joined: Mutex::new(BTreeMap::new()),
            complete: watch::Sender::new(None),
        }
    }

    fn admit(&self, r: &proto::JoinRequest) -> Result<usize, Status> {
        if r.job_uid != self.job_uid {
            return Err(Status::permission_denied(format!(
                "job uid {:?} is not this job ({:?})",
                r.job_uid, self.job_uid
            )));
        }
        if r.generation != self.generation {
            return Err(Status::failed_precondition(format!(
                "generation {} is not the current generation {}",
                r.generation, self.generation
            )));
        }
        if r.world_size != self.world_size {
            return Err(Status::failed_precondition(format!(
                "world size {} differs from rank 0's world size {}",
                r.world_size, self.world_size
            )));
        }
        if r.chunk_bytes != self.chunk_bytes {
            return Err(Status::failed_precondition(format!(
                "chunk size {} bytes differs from rank 0's {} bytes",
                r.chunk_bytes, self.chunk_bytes
            )));
        }
        if r.rank >= self.world_size {
            return Err(Status::invalid_argument(format!(
                "rank {} is outside 0..{}",
                r.rank, self.world_size
            )));
        }
        if r.address.is_empty() || r.address.len() > 512 || r.node.len() > 512 {
            return Err(Status::invalid_argument(
                "address must be a non-empty host:port and node at most 512 bytes",
            ));
        }
        let mut joined = self.joined.lock().unwrap_or_else(|p| p.into_inner());
        if joined.contains_key(&r.rank) {
            return Err(Status::already_exists(format!(
                "rank {} already joined generation {}",
                r.rank, self.generation
            )));
        }
        joined.insert(
            r.rank,
            PeerInfo {
                rank: r.rank,
                address: r.address.clone(),
                node: r.node.clone(),
            },
        );
        if joined.len() == self.world_size as usize {
            let table: Vec<PeerInfo> = joined.values().cloned().collect();
            self.complete.send_replace(Some(Arc::new(table)));
        }
        Ok(joined.len())
    }
}

impl RendezvousHandler for RendezvousTable {
    async fn join(&self, request: proto::JoinRequest) -> Result<Vec<PeerInfo>, Status> {
        let count = self.admit(&request)?;
        tracing::debug!(rank = request.rank, joined = count, "rank joined");
        let mut done = self.complete.subscribe();
        match tokio::time::timeout(self.timeout, done.wait_for(Option::is_some)).await {
            Ok(Ok(table)) => Ok(table.as_deref().cloned().unwrap_or_default()),
            Ok(Err(_)) => Err(Status::unavailable("rendezvous is shutting down")),
            Err(_) => {
                let joined = self.joined.lock().map(|j| j.len()).unwrap_or_default();
                Err(Status::deadline_exceeded(format!(
                    "only {joined} of {} ranks joined within {:?}",
                    self.world_size, self.timeout
                )))
            }
        }
    }
}

/// tonic adapter.
pub struct RendezvousService<H>(pub Arc<H>);

#[tonic::async_trait]
impl<H: RendezvousHandler> proto::rendezvous_server::Rendezvous for RendezvousService<H> {
    async fn join(
        &self,
        request: Request<proto::JoinRequest>,
    ) -> Result<Response<proto::JoinResponse>, Status> {
        let peers = self.0.join(request.into_inner()).await?;
        Ok(Response::new(proto::JoinResponse {
            peers: peers
                .into_iter()
                .map(|p| proto::Peer {
                    rank: p.rank,
                    address: p.address,
                    node: p.node,
                })
                .collect(),
        }))
    }
}

/// Joins at rank 0 and returns the peer table. Retries only while rank 0 is not reachable yet;
/// the whole call is bounded by `cfg.timeout`.
pub(crate) async fn join(
    cfg: &CommConfig,
    my_address: &str,
) -> Result<Vec<PeerInfo>, CollectiveError> {
    let master = host_port(&cfg.master_addr, cfg.master_port);
    let deadline = Instant::now() + cfg.timeout;
    let failed = |reason: String| CollectiveError::RendezvousFailed {
        master: master.clone(),
        reason,
    };
    let channel = net::dial_until(&master, deadline, cfg.timeout)
        .await
        .map_err(failed)?;
    let mut client = proto::rendezvous_client::RendezvousClient::with_interceptor(
        channel,
        crate::auth::AttachToken::new(&cfg.identity.token)?,
    );
    let request = proto::JoinRequest {
        job_uid: cfg.identity.job_uid.clone(),
        generation: cfg.identity.generation,
        rank: cfg.rank,
        world_size: cfg.world_size,
        address: my_address.to_string(),
        node: cfg.node.clone(),
        chunk_bytes: cfg.chunk_bytes as u64,
    };
    let response = match tokio::time::timeout_at(deadline, client.join(request)).await {
        Err(_) => {
            return Err(failed(format!(
                "not every rank joined within {:?}",
                cfg.timeout
            )));
        }
        Ok(Err(status)) => return Err(status_to_error(&master, status)),
        Ok(Ok(response)) => response.into_inner(),
    };
    let peers: Vec<PeerInfo> = response
        .peers
        .into_iter()
        .map(|p| PeerInfo {
            rank: p.rank,
            address: p.address,
            node: p.node,
        })
        .collect();
    check_table(&peers, cfg.world_size, cfg.rank, my_address).map_err(failed)?;
    Ok(peers)
}

fn status_to_error(master: &str, status: Status) -> CollectiveError {
    use tonic::Code;
    match status.code() {
        Code::Unauthenticated
        | Code::PermissionDenied
        | Code::InvalidArgument
        | Code::FailedPrecondition
        | Code::AlreadyExists
        | Code::DeadlineExceeded => CollectiveError::RendezvousRefused {
            code: status.code(),
            message: status.message().to_string(),
        },
        _ => CollectiveError::RendezvousFailed {
            master: master.to_string(),
            reason: format!("{:?}: {}", status.code(), status.message()),
        },
    }
}

/// The table from rank 0 must list every rank once, in order, with this rank as it joined.
fn check_table(peers: &[PeerInfo], world: u32, me: u32, my_address: &str) -> Result<(), String> {
    if peers.len() != world as usize {
        return Err(format!(
            "peer table has {} entries, expected {world}",
            peers.len()
        ));
    }
    for (i, p) in peers.iter().enumerate() {
        if p.rank as usize != i {
            return Err(format!("peer table entry {i} is rank {}", p.rank));
        }
    }
    if peers[me as usize].address != my_address {
        return Err(format!(
            "peer table lists this rank at {}, not {my_address}",
            peers[me as usize].address
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DEFAULT_CHUNK_BYTES, JobIdentity};

    fn cfg(world: u32) -> CommConfig {
        CommConfig {
            identity: JobIdentity {
                job_uid: "job".into(),
                token: "t".into(),
                generation: 1,
            },
            rank: 0,
            world_size: world,
            master_addr: "127.0.0.1".into(),
            master_port: 1,
            advertise_host: "127.0.0.1".into(),
            collective_port: 0,
            node: "n".into(),
            timeout: Duration::from_secs(5),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
        }
    }

    fn req(rank: u32) -> proto::JoinRequest {
        proto::JoinRequest {
            job_uid: "job".into(),
            generation: 1,
            rank,
            world_size: 2,
            address: format!("h:{rank}"),
            node: "n".into(),
            chunk_bytes: DEFAULT_CHUNK_BYTES as u64,
        }
    }

    #[tokio::test]
    async fn answers_everyone_once_all_joined_in_rank_order() {
        let table = Arc::new(RendezvousTable::new(&cfg(2)));
        let t1 = table.clone();
        let late = tokio::spawn(async move { t1.join(req(1)).await });
        let first = table.join(req(0)).await.expect("join 0");
        let second = late.await.expect("task").expect("join 1");
        assert_eq!(first, second);
        assert_eq!(first.iter().map(|p| p.rank).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(first[1].address, "h:1");
    }

    #[tokio::test]
    async fn refuses_with_the_matching_code() {
        let table = RendezvousTable::new(&cfg(2));
        let cases: Vec<(tonic::Code, proto::JoinRequest)> = vec![
            (
                tonic::Code::PermissionDenied,
                proto::JoinRequest {
                    job_uid: "other".into(),
                    ..req(0)
                },
            ),
            (
                tonic::Code::FailedPrecondition,
                proto::JoinRequest {
                    generation: 2,
                    ..req(0)
                },
            ),
            (
                tonic::Code::FailedPrecondition,
                proto::JoinRequest {
                    world_size: 3,
                    ..req(0)
                },
            ),
            (
                tonic::Code::FailedPrecondition,
                proto::JoinRequest {
                    chunk_bytes: 8,
                    ..req(0)
                },
            ),
            (
                tonic::Code::InvalidArgument,
                proto::JoinRequest { rank: 2, ..req(0) },
            ),
            (
                tonic::Code::InvalidArgument,
                proto::JoinRequest {
                    address: String::new(),
                    ..req(0)
                },
            ),
        ];
        for (code, r) in cases {
            let err = table.admit(&r).expect_err("must refuse");
            assert_eq!(err.code(), code, "{r:?}");
        }
        table.admit(&req(0)).expect("first join");
        let dup = table.admit(&req(0)).expect_err("duplicate");
        assert_eq!(dup.code(), tonic::Code::AlreadyExists);
    }

    #[tokio::test]
    async fn times_out_when_a_rank_never_comes() {
        let mut c = cfg(2);
        c.timeout = Duration::from_millis(50);
        let table = RendezvousTable::new(&c);
        let err = table.join(req(0)).await.expect_err("incomplete");
        assert_eq!(err.code(), tonic::Code::DeadlineExceeded);
    }

    #[test]
    fn peer_tables_are_checked() {
        let p = |rank: u32, a: &str| PeerInfo {
            rank,
            address: a.into(),
            node: String::new(),
        };
        assert!(check_table(&[p(0, "a"), p(1, "b")], 2, 1, "b").is_ok());
        assert!(check_table(&[p(0, "a")], 2, 0, "a").is_err());
        assert!(check_table(&[p(1, "a"), p(0, "b")], 2, 0, "a").is_err());
        assert!(check_table(&[p(0, "a"), p(1, "b")], 2, 1, "c").is_err());
    }
}
