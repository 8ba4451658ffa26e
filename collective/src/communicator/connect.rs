//! Connecting one rank, in three steps: `serve` (this rank's `Collective` server with the TCP
//! data port on the same listener, and on rank 0 the `Rendezvous` server), `join` (the rendezvous,
//! which returns the peer table) and `dial` (each peer's link, opened when a collective first
//! sends to it, and an abort client to every peer, which connects when first used: aborts go down a
//! tree, so a rank calls only a few).

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{Mutex, mpsc, watch};
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;
use tracing::Instrument;

use super::abort::{self, AbortTree};
use super::{ABORT_GRACE, Communicator, OpState};
use crate::algorithms::choice::NodeGroups;
use crate::auth::{AttachToken, RequireToken};
use crate::config::{
    CommConfig, DataPath, PeerInfo, RingMemory, RingPlace, RingSockets, host_port, listen_ip_for,
};
use crate::error::CollectiveError;
use crate::fault::FailState;
use crate::kernels::BufferPool;
use crate::net;
use crate::proto::collective_client::CollectiveClient;
use crate::proto::collective_server::CollectiveServer;
use crate::proto::rendezvous_server::RendezvousServer;
use crate::rendezvous::{self, RendezvousService, RendezvousTable};
use crate::spin::Spin;
use crate::transport::{
    CollectiveService, DataPort, InboundRouter, LinkSettings, Links, RingMaker, demux,
};

/// Idle send buffers kept for reuse (about what is in flight: link queues plus windows).
const POOLED_BUFFERS: usize = 32;

/// Choices of [`Communicator::connect_with`] beyond the config.
#[derive(Debug, Default)]
pub struct ConnectOptions {
    /// How this rank sends chunks (it accepts both kinds of stream).
    pub data_path: DataPath,
    /// Rank 0 only: its rendezvous listener, already bound (lets tests and benches pick a
    /// free port before starting the other ranks).
    pub rendezvous_listener: Option<TcpListener>,
    /// Whether waits poll before parking (small TCP frames; every wait on a shared-memory ring).
    pub spin: Spin,
    /// How much memory this rank's shared-memory rings may hold (`DataPath::Auto`).
    pub ring_memory: RingMemory,
    /// Where this rank's ring socket is, and where it finds its peers' (`DataPath::Auto`).
    pub ring_sockets: RingSockets,
}

impl Communicator {
    /// Serves `Collective`, serves `Rendezvous` on rank 0 (binding `master_port`) and joins,
    /// bounded by `cfg.timeout`; each peer is dialled when a collective first sends to it.
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
            spin,
            ring_memory,
            ring_sockets,
        } = options;
        if rendezvous_listener.is_some() && cfg.rank != 0 {
            return Err(CollectiveError::invalid_config(
                "rank",
                "only rank 0 serves the rendezvous",
            ));
        }
        cfg.validate()?;
        let ring_bytes = ring_memory.resolve()?;
        let ring_place = ring_sockets.resolve()?;
        let token = AttachToken::new(&cfg.identity.token)?;
        let mut comm = Communicator::unconnected(cfg);
        if comm.cfg.world_size == 1 {
            let cfg = &comm.cfg;
            comm.peers = vec![PeerInfo {
                rank: 0,
                address: host_port(&cfg.advertise_host, cfg.collective_port),
                node: cfg.node.clone(),
            }];
            return Ok(comm);
        }
        // Dropping `comm` on an error below stops whatever was already served.
        let address = comm.serve(&ring_place).await?;
        if comm.cfg.rank == 0 {
            comm.serve_rendezvous(rendezvous_listener).await?;
        }
        let peers = comm.join(&address).await?;
        comm.spin = spin.duration();
        comm.dial(peers, data_path, (ring_bytes, &ring_place), token)?;
        Ok(comm)
    }

    /// This rank alone: no servers, peers or links yet.
    fn unconnected(cfg: CommConfig) -> Communicator {
        let span = tracing::info_span!("collective", rank = cfg.rank, job = %cfg.identity.job_uid);
        Communicator {
            peers: Vec::new(),
            all_ranks: (0..cfg.world_size).collect(),
            node_groups: NodeGroups {
                node_group: vec![cfg.rank],
                leaders: vec![cfg.rank],
            },
            links: None,
            aborts: None,
            relayed: None,
            fail: Arc::new(FailState::new()),
            spin: None,
            pool: BufferPool::new(POOLED_BUFFERS),
            ops: Mutex::new(OpState {
                next_op_id: 0,
                inboxes: Vec::new(),
            }),
            shutdown: watch::Sender::new(false),
            servers: Vec::new(),
            span,
            cfg,
        }
    }

    /// Step 1: serves `Collective` on the collective port, with the TCP data port on the same
    /// listener, and opens the inboxes they fill, taking the rings offered to it from sockets in
    /// `rings_from`; returns the address peers reach this rank at.
    async fn serve(&mut self, rings_from: &RingPlace) -> Result<String, CollectiveError> {
        let cfg = &self.cfg;
        let listener = net::bind(listen_ip_for(&cfg.advertise_host), cfg.collective_port).await?;
        let port = listener
            .local_addr()
            .map_err(|e| CollectiveError::bind(format!("port {}", cfg.collective_port), e))?
            .port();
        let (relay, relayed) = mpsc::unbounded_channel();
        let (router, inboxes) = InboundRouter::new(
            cfg.rank,
            cfg.world_size,
            cfg.identity.generation,
            self.fail.clone(),
            relay,
            self.shutdown.subscribe(),
        );
        let router = Arc::new(router);
        // Every rank takes the rings offered to it, whatever its own data path.
        let data_port = DataPort::new(
            router.clone(),
            RequireToken::new(&cfg.identity.token),
            cfg.timeout,
            Some(rings_from.clone()),
        );
        let connections = {
            let _entered = self.span.enter();
            demux(listener, data_port, self.shutdown.subscribe())
        };
        let service = CollectiveServer::new(CollectiveService(router))
            .max_decoding_message_size(max_message(cfg))
            .max_encoding_message_size(max_message(cfg));
        let guarded = InterceptedService::new(service, RequireToken::new(&cfg.identity.token));
        let server =
            net::server().serve_with_incoming_shutdown(guarded, connections, self.stopped());
        let address = host_port(&cfg.advertise_host, port);
        self.servers.push(self.spawn_server("collective", server));
        self.ops.get_mut().inboxes = inboxes;
        self.relayed = Some(relayed);
        Ok(address)
    }

    /// Step 1 on rank 0: serves `Rendezvous` on `listener`, or on `master_port` if none.
    async fn serve_rendezvous(
        &mut self,
        listener: Option<TcpListener>,
    ) -> Result<(), CollectiveError> {
        let cfg = &self.cfg;
        let listener = match listener {
            Some(l) => l,
            None => net::bind(listen_ip_for(&cfg.master_addr), cfg.master_port).await?,
        };
        let table = Arc::new(RendezvousTable::new(cfg));
        let service = InterceptedService::new(
            RendezvousServer::new(RendezvousService(table)),
            RequireToken::new(&cfg.identity.token),
        );
        let server = net::server().serve_with_incoming_shutdown(
            service,
            net::incoming(listener),
            self.stopped(),
        );
        self.servers.push(self.spawn_server("rendezvous", server));
        Ok(())
    }

    /// Step 2: joins the rendezvous with this rank's `address`; returns the peer table (every
    /// rank, ordered by rank) once every rank has joined.
    async fn join(&self, address: &str) -> Result<Vec<PeerInfo>, CollectiveError> {
        let peers = rendezvous::join(&self.cfg, address)
            .instrument(self.span.clone())
            .await?;
        tracing::info!(parent: &self.span, world_size = self.cfg.world_size, address = %address, "rendezvous complete");
        Ok(peers)
    }

    /// Step 3: this rank's links on `data_path`, each dialled when a collective first sends to
    /// its peer (with a ring socket in `rings.1` to hand out rings, under `rings.0` bytes, on
    /// `DataPath::Auto`),
    /// an abort client to every peer (connected when first called) and the forwarding of the
    /// abort that fails this rank, and the node groups.
    fn dial(
        &mut self,
        peers: Vec<PeerInfo>,
        data_path: DataPath,
        (ring_bytes, ring_place): (u64, &RingPlace),
        token: AttachToken,
    ) -> Result<(), CollectiveError> {
        let cfg = &self.cfg;
        let grace = ABORT_GRACE.min(cfg.timeout);
        let mut abort_clients = Vec::with_capacity(peers.len());
        for peer in &peers {
            if peer.rank == cfg.rank {
                abort_clients.push(None);
                continue;
            }
            let abort_channel = net::lazy_channel(&peer.address, grace).map_err(|reason| {
                CollectiveError::PeerLost {
                    rank: peer.rank,
                    reason,
                }
            })?;
            abort_clients.push(Some(CollectiveClient::with_interceptor(
                abort_channel,
                token.clone(),
            )));
        }
        let aborts = Arc::new(AbortTree::new(
            cfg.rank,
            cfg.identity.generation,
            grace,
            abort_clients,
        ));
        let rings = match data_path {
            DataPath::Auto => {
                let _entered = self.span.enter();
                match RingMaker::start(ring_bytes, ring_place) {
                    Ok(maker) => Some(maker),
                    Err(error) => {
                        tracing::warn!(error = %rdu_error_chain::Chain(&error), "no socket to hand out shared-memory rings; frames go on TCP");
                        None
                    }
                }
            }
            DataPath::Tcp | DataPath::Grpc => None,
        };
        let settings = LinkSettings {
            me: cfg.rank,
            generation: cfg.identity.generation,
            token: cfg.identity.token.clone(),
            attach: token,
            data_path,
            node: cfg.node.clone(),
            spin: self.spin,
            max_message: max_message(cfg),
            timeout: cfg.timeout,
            span: self.span.clone(),
        };
        self.node_groups = NodeGroups::new(&peers, cfg.rank);
        self.links = Some(Links::new(
            settings,
            peers.clone(),
            rings,
            self.pool.clone(),
        ));
        self.peers = peers;
        if let Some(relayed) = self.relayed.take() {
            let forward = abort::forward_first(aborts.clone(), relayed, self.shutdown.subscribe());
            tokio::spawn(forward.instrument(self.span.clone()));
        }
        self.aborts = Some(aborts);
        tracing::info!(parent: &self.span, %data_path, ring_bytes, "peers known; links open when first used");
        Ok(())
    }

    /// Resolves once this communicator shuts down or is dropped (a server's shutdown signal).
    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stop = self.shutdown.subscribe();
        async move {
            let _ = stop.wait_for(|down| *down).await;
        }
    }

    /// Runs `server` in this communicator's span until it stops; warns if it failed.
    fn spawn_server(
        &self,
        name: &'static str,
        server: impl Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
    ) -> JoinHandle<()> {
        tokio::spawn(
            async move {
                if let Err(e) = server.await {
                    tracing::warn!(error = %rdu_error_chain::Chain(&e), "{name} server stopped");
                }
            }
            .instrument(self.span.clone()),
        )
    }
}

/// Largest gRPC message a rank sends or accepts: one chunk and the fields beside it.
fn max_message(cfg: &CommConfig) -> usize {
    cfg.chunk_elems() * 4 + 1024
}
