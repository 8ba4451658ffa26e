//! `Communicator`: one rank's membership in the job. Connecting serves `Collective` (and, on
//! rank 0, `Rendezvous`), joins, and dials every peer; the collectives run one at a time, in the
//! same order on every rank.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::algorithms::choice::{ChosenAlgorithm, NodeGroups};
use crate::algorithms::{self, Wire};
use crate::auth::{AttachToken, RequireToken};
use crate::config::{Algorithm, CommConfig, DataPath, PeerInfo, host_port, listen_ip_for};
use crate::error::CollectiveError;
use crate::fault::FailState;
use crate::kernels::BufferPool;
use crate::net;
use crate::proto;
use crate::proto::collective_client::CollectiveClient;
use crate::rendezvous::{self, RendezvousService, RendezvousTable};
use crate::transport::Link;
use crate::transport::grpc::{CollectiveService, GrpcLink};
use crate::transport::inbox::Inbox;
use crate::transport::router::InboundRouter;
use crate::transport::tcp::{self, DataPort};

/// Idle send buffers kept for reuse (about what is in flight: link queues plus windows).
const POOLED_BUFFERS: usize = 32;
/// Longest a shutdown waits for streams to flush and servers to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Longest an abort notice to one peer may take.
const ABORT_GRACE: Duration = Duration::from_secs(1);

type AbortClient = CollectiveClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, AttachToken>,
>;

/// State used by one collective at a time.
struct OpState {
    next_op_id: u64,
    inboxes: Vec<Option<Inbox>>,
}

/// Choices of [`Communicator::connect_with`] beyond the config.
#[derive(Debug, Default)]
pub struct ConnectOptions {
    /// How this rank sends chunks (it accepts both kinds of stream).
    pub data_path: DataPath,
    /// Rank 0 only: its rendezvous listener, already bound (lets tests and benches pick a
    /// free port before starting the other ranks).
    pub rendezvous_listener: Option<TcpListener>,
}

/// One rank's handle on the job's communication.
pub struct Communicator {
    cfg: CommConfig,
    peers: Vec<PeerInfo>,
    all_ranks: Vec<u32>,
    node_groups: NodeGroups,
    links: Vec<Option<Link>>,
    abort_clients: Vec<AbortClient>,
    fail: Arc<FailState>,
    pool: Arc<BufferPool>,
    ops: Mutex<OpState>,
    shutdown: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    span: tracing::Span,
}

impl Communicator {
    /// Serves `Collective`, serves `Rendezvous` on rank 0 (binding `master_port`), joins, and
    /// dials every peer; bounded by `cfg.timeout`.
    /// Chunks travel on the TCP data path.
    pub async fn connect(cfg: CommConfig) -> Result<Communicator, CollectiveError> {
        Self::connect_with(cfg, ConnectOptions::default()).await
    }

    /// Like [`Communicator::connect`] for rank 0, with its rendezvous listener already bound
    /// (lets tests and benches pick a free port before starting the other ranks).
    pub async fn connect_with_rendezvous_listener(
        cfg: CommConfig,
        listener: TcpListener,
    ) -> Result<Communicator, CollectiveError> {
        let options = ConnectOptions {
            rendezvous_listener: Some(listener),
            ..ConnectOptions::default()
        };
        Self::connect_with(cfg, options).await
    }

    /// [`Communicator::connect`] with a choice of data path and, on rank 0, a bound
    /// rendezvous listener.
    pub async fn connect_with(
        cfg: CommConfig,
        options: ConnectOptions,
    ) -> Result<Communicator, CollectiveError> {
        let ConnectOptions {
            data_path,
            rendezvous_listener,
        } = options;
        if rendezvous_listener.is_some() && cfg.rank != 0 {
            return Err(CollectiveError::invalid_config(
                "rank",
                "only rank 0 serves the rendezvous",
            ));
        }
        cfg.validate()?;
        let token = AttachToken::new(&cfg.identity.token)?;
        let span = tracing::info_span!("collective", rank = cfg.rank, job = %cfg.identity.job_uid);
        let deadline = Instant::now() + cfg.timeout;
        let fail = Arc::new(FailState::new());
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut comm = Communicator {
            peers: Vec::new(),
            all_ranks: (0..cfg.world_size).collect(),
            node_groups: NodeGroups {
                node_group: vec![cfg.rank],
                leaders: vec![cfg.rank],
            },
            links: Vec::new(),
            abort_clients: Vec::new(),
            fail: fail.clone(),
            pool: BufferPool::new(POOLED_BUFFERS),
            ops: Mutex::new(OpState {
                next_op_id: 0,
                inboxes: Vec::new(),
            }),
            shutdown,
            servers: Vec::new(),
            span: span.clone(),
            cfg,
        };
        let cfg = &comm.cfg;
        if cfg.world_size == 1 {
            comm.peers = vec![PeerInfo {
                rank: 0,
                address: host_port(&cfg.advertise_host, cfg.collective_port),
                node: cfg.node.clone(),
            }];
            return Ok(comm);
        }
        let max_message = cfg.chunk_elems() * 4 + 1024;

        // Collective server.
        let listener = net::bind(listen_ip_for(&cfg.advertise_host), cfg.collective_port).await?;
        let port = listener
            .local_addr()
            .map_err(|e| CollectiveError::Bind {
                addr: format!("port {}", cfg.collective_port),
                reason: e.to_string(),
            })?
            .port();
        let my_address = host_port(&cfg.advertise_host, port);
        let (router, inboxes) = InboundRouter::new(
            cfg.rank,
            cfg.world_size,
            cfg.identity.generation,
            fail.clone(),
            shutdown_rx.clone(),
        );
        let router = Arc::new(router);
        let data_port = DataPort::new(
            router.clone(),
            RequireToken::new(&cfg.identity.token),
            cfg.timeout,
        );
        let connections = {
            let _entered = span.enter();
            tcp::demux(listener, data_port, shutdown_rx.clone())
        };
        let service = proto::collective_server::CollectiveServer::new(CollectiveService(router))
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
        let guarded = tonic::service::interceptor::InterceptedService::new(
            service,
            RequireToken::new(&cfg.identity.token),
        );
        let mut stop = shutdown_rx.clone();
        let server = net::server()
            .add_service(guarded)
            .serve_with_incoming_shutdown(connections, async move {
                let _ = stop.wait_for(|down| *down).await;
            });
        comm.servers.push(tokio::spawn(
            async move {
                if let Err(e) = server.await {
                    tracing::warn!(error = %e, "collective server stopped");
                }
            }
            .instrument(span.clone()),
        ));
        comm.ops.get_mut().inboxes = inboxes;

        // Rendezvous server on rank 0.
        if cfg.rank == 0 {
            let listener = match rendezvous_listener {
                Some(l) => l,
                None => net::bind(listen_ip_for(&cfg.master_addr), cfg.master_port).await?,
            };
            let table = Arc::new(RendezvousTable::new(cfg));
            let service = tonic::service::interceptor::InterceptedService::new(
                proto::rendezvous_server::RendezvousServer::new(RendezvousService(table)),
                RequireToken::new(&cfg.identity.token),
            );
            let mut stop = shutdown_rx.clone();
            let server = net::server()
                .add_service(service)
                .serve_with_incoming_shutdown(net::incoming(listener), async move {
                    let _ = stop.wait_for(|down| *down).await;
                });
            comm.servers.push(tokio::spawn(
                async move {
                    if let Err(e) = server.await {
                        tracing::warn!(error = %e, "rendezvous server stopped");
                    }
                }
                .instrument(span.clone()),
            ));
        }

        let peers = rendezvous::join(cfg, &my_address)
            .instrument(span.clone())
            .await?;
        tracing::info!(parent: &span, world_size = cfg.world_size, address = %my_address, "rendezvous complete");

        // Open a link to every peer concurrently.
        let pool = comm.pool.clone();
        let opens = peers.iter().filter(|p| p.rank != cfg.rank).map(|p| {
            let (token, span, pool) = (&token, &span, &pool);
            async move {
                let link = match data_path {
                    DataPath::Tcp => {
                        tcp::open_link(
                            cfg.rank,
                            p.rank,
                            cfg.identity.generation,
                            &p.address,
                            &cfg.identity.token,
                            deadline,
                        )
                        .instrument(span.clone())
                        .await?
                    }
                    DataPath::Grpc => {
                        let channel = net::dial_until(&p.address, deadline, cfg.timeout)
                            .await
                            .map_err(|reason| CollectiveError::PeerLost {
                                rank: p.rank,
                                reason,
                            })?;
                        let _entered = span.enter();
                        Link::Grpc(GrpcLink::open(
                            cfg.rank,
                            p.rank,
                            cfg.identity.generation,
                            channel,
                            token,
                            max_message,
                            pool.clone(),
                        ))
                    }
                };
                Ok::<_, CollectiveError>((p.rank, link))
            }
        });
        let opened = futures::future::try_join_all(opens).await?;
        let mut links: Vec<Option<Link>> = (0..cfg.world_size).map(|_| None).collect();
        let mut abort_clients = Vec::new();
        for (rank, link) in opened {
            links[rank as usize] = Some(link);
            let address = &peers[rank as usize].address;
            let abort_channel = net::lazy_channel(address, ABORT_GRACE.min(cfg.timeout))
                .map_err(|reason| CollectiveError::PeerLost { rank, reason })?;
            abort_clients.push(CollectiveClient::with_interceptor(
                abort_channel,
                token.clone(),
            ));
        }
        comm.node_groups = NodeGroups::new(&peers, cfg.rank);
        comm.peers = peers;
        comm.links = links;
        comm.abort_clients = abort_clients;
        Ok(comm)
    }

    pub fn rank(&self) -> u32 {
        self.cfg.rank
    }

    pub fn world_size(&self) -> u32 {
        self.cfg.world_size
    }

    /// Every rank of the job, ordered by rank.
    pub fn peers(&self) -> &[PeerInfo] {
        &self.peers
    }

    /// In-place average over all ranks; bitwise identical on every rank afterwards.
    pub async fn all_reduce_mean(
        &self,
        buf: &mut [f32],
        algorithm: Algorithm,
    ) -> Result<(), CollectiveError> {
        self.all_reduce_sum(buf, algorithm).await?;
        let n = self.cfg.world_size as f32;
        if self.cfg.world_size > 1 {
            for v in buf.iter_mut() {
                *v /= n;
            }
        }
        Ok(())
    }

    /// In-place sum over all ranks; bitwise identical on every rank afterwards.
    pub async fn all_reduce_sum(
        &self,
        buf: &mut [f32],
        algorithm: Algorithm,
    ) -> Result<(), CollectiveError> {
        let chosen = self.choose(algorithm, buf.len() * 4);
        self.run(
            "all_reduce",
            buf,
            |_| Ok(()),
            move |comm, wire, inboxes, buf| {
                Box::pin(algorithms::all_reduce(
                    chosen,
                    wire,
                    inboxes,
                    &comm.all_ranks,
                    &comm.node_groups,
                    buf,
                ))
            },
        )
        .await
    }

    /// Copies `root`'s buffer into every rank's buffer (all must have the same length).
    pub async fn broadcast(&self, buf: &mut [f32], root: u32) -> Result<(), CollectiveError> {
        let world = self.cfg.world_size;
        let check = move |_: &[f32]| {
            if root < world {
                Ok(())
            } else {
                Err(CollectiveError::InvalidArgument {
                    field: "root",
                    reason: format!("root {root} is outside 0..{world}"),
                })
            }
        };
        self.run("broadcast", buf, check, move |comm, wire, inboxes, buf| {
            Box::pin(algorithms::bcast_from_root(
                wire,
                inboxes,
                &comm.all_ranks,
                root,
                buf,
            ))
        })
        .await
    }

    /// Returns once every rank has entered the barrier.
    pub async fn barrier(&self) -> Result<(), CollectiveError> {
        let mut token = [0.0f32];
        self.run(
            "barrier",
            &mut token,
            |_| Ok(()),
            |comm, wire, inboxes, buf| {
                // Rank 0 answers only after every rank's token arrived.
                Box::pin(algorithms::star(wire, inboxes, &comm.all_ranks, buf))
            },
        )
        .await
    }

    /// Marks this communicator failed and tells every peer to abort (best effort, bounded).
    pub async fn abort(&self, reason: &str) {
        self.fail.fail(CollectiveError::Aborted {
            reason: reason.to_string(),
        });
        self.tell_peers_to_abort(reason).await;
    }

    /// Stops receiving, closes the streams to peers and waits (bounded) until every peer has
    /// taken them in full, then stops the servers. Call after a final barrier so no peer still
    /// needs data from this rank.
    pub async fn shutdown(mut self) {
        let grace = SHUTDOWN_GRACE.min(self.cfg.timeout);
        // Stop receiving first: peers' streams to this rank complete, so their shutdowns,
        // which wait for their streams to be taken in full, do not wait on ours.
        self.ops.get_mut().inboxes.clear();
        let flushing: Vec<JoinHandle<()>> = std::mem::take(&mut self.links)
            .into_iter()
            .flatten()
            .map(Link::close)
            .collect();
        for task in flushing {
            if tokio::time::timeout(grace, task).await.is_err() {
                tracing::debug!(parent: &self.span, "a link did not close in time");
            }
        }
        self.shutdown.send_replace(true);
        for mut task in std::mem::take(&mut self.servers) {
            if tokio::time::timeout(grace, &mut task).await.is_err() {
                task.abort();
            }
        }
        tracing::info!(parent: &self.span, "communicator shut down");
    }

    fn choose(&self, algorithm: Algorithm, bytes: usize) -> ChosenAlgorithm {
        ChosenAlgorithm::choose(
            algorithm,
            bytes,
            self.cfg.world_size as usize,
            &self.node_groups,
        )
    }

    /// Runs one collective: serialized with the others, numbered, bounded by the timeout; a
    /// failure latches and is announced to the peers.
    async fn run<C, F>(
        &self,
        op: &'static str,
        buf: &mut [f32],
        check: C,
        body: F,
    ) -> Result<(), CollectiveError>
    where
        C: FnOnce(&[f32]) -> Result<(), CollectiveError>,
        F: for<'a> FnOnce(
            &'a Communicator,
            &'a Wire<'a>,
            &'a mut [Option<Inbox>],
            &'a mut [f32],
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(), CollectiveError>> + Send + 'a>,
        >,
    {
        check(buf)?;
        if let Some(error) = self.fail.current() {
            return Err(error);
        }
        if self.cfg.world_size == 1 {
            return Ok(());
        }
        let mut state = self.ops.lock().await;
        let op_id = state.next_op_id;
        state.next_op_id += 1;
        let wire = Wire {
            me: self.cfg.rank,
            op,
            op_id,
            generation: self.cfg.identity.generation,
            deadline: Instant::now() + self.cfg.timeout,
            timeout: self.cfg.timeout,
            chunk_elems: self.cfg.chunk_elems(),
            fail: &self.fail,
            links: &self.links,
        };
        let result = body(self, &wire, &mut state.inboxes, buf)
            .instrument(tracing::debug_span!(parent: &self.span, "op", op, op_id))
            .await;
        drop(state);
        if let Err(error) = &result {
            let first = self.fail.fail(error.clone());
            let from_peer = matches!(error, CollectiveError::AbortedByPeer { .. });
            tracing::warn!(parent: &self.span, op, op_id, %error, "collective failed");
            if first && !from_peer {
                self.tell_peers_to_abort(&error.to_string()).await;
            }
            return Err(self.fail.current().unwrap_or_else(|| error.clone()));
        }
        Ok(())
    }

    async fn tell_peers_to_abort(&self, reason: &str) {
        let request = proto::AbortRequest {
            generation: self.cfg.identity.generation,
            from_rank: self.cfg.rank,
            reason: reason.to_string(),
        };
        let bound = ABORT_GRACE.min(self.cfg.timeout);
        let calls = self.abort_clients.iter().map(|client| {
            let mut client = client.clone();
            let request = request.clone();
            async move { tokio::time::timeout(bound, client.abort(request)).await }
        });
        futures::future::join_all(calls).await;
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
    }
}
