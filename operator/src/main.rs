//! The `rdu-operator` binary: flags, logging, leader election, the controller, the metrics/health server and the
//! progress endpoint's server.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::{Parser, ValueEnum};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::{Store, store::Writer};
use kube::runtime::{Controller, WatchStreamExt, reflector, watcher};
use rdu_crds::RduJob;
use rdu_operator::{
    ApiTokenReviewer, Context, DEFAULT_MAX_WORKERS_PER_JOB, Exception, HEALTH_LIMITS, Health,
    KUEUE_JOB_UID_LABEL, LeaderElector, Limits, Metrics, NodeCache, OwnPod, PROGRESS_LIMITS,
    PodPolicy, ProgressService, Settings, Synced, error_policy, jobs_woken_by, node_watch,
    on_first_sync, pod_watch, reconcile, serve, slim_job, workload_resource, write_progress,
};
use tracing::{error, info, warn};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Reconciles RduJobs into one pod per rank and runs the job lifecycle.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "RDU_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, env = "RDU_LEASE_NAME", default_value = "rdu-operator")]
    lease_name: String,
    /// This replica's identity in the Lease (default: the hostname).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// This replica's own pod, in the Lease's namespace: labelled `rdu.dev/operator-leader=true` while it leads,
    /// so that the progress Service (which selects the label) reaches the leader only. Unset outside a pod.
    #[arg(long, env = "RDU_LEADER_POD")]
    leader_pod: Option<String>,
    /// Log format.
    #[arg(long, env = "RDU_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "RDU_WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Give every job a NetworkPolicy admitting only its own pods to the worker ports (needs RBAC for
    /// networking.k8s.io networkpolicies; `--network-policy=false` where the chart grants none).
    #[arg(long, env = "RDU_NETWORK_POLICY", default_value_t = true, action = clap::ArgAction::Set)]
    network_policy: bool,
    /// Create a job's next generation only when the schedulable nodes have room for every rank, so a gang never
    /// starts by halves (PodsBlocked InsufficientCapacity meanwhile). Set false where an autoscaler adds nodes for
    /// pending pods: pods held back would never make it scale.
    #[arg(long, env = "RDU_WAIT_FOR_ROOM", default_value_t = true, action = clap::ArgAction::Set)]
    wait_for_room: bool,
    /// Queue jobs labelled `kueue.x-k8s.io/queue-name` in Kueue (needs Kueue installed with
    /// `integrations.externalFrameworks: ["RduJob.v1alpha1.rdu.dev"]` and RBAC for its Workloads and
    /// ResourceFlavors; chart value `kueue.enabled`). Off: the label is ignored and such jobs run at once.
    #[arg(long, env = "RDU_KUEUE", default_value_t = false, action = clap::ArgAction::Set)]
    kueue: bool,
    /// With --kueue, the LocalQueue of jobs without the queue label, so that every job waits for admission
    /// within a quota (Kueue's `manageJobsWithoutQueueName`; chart values `kueue.manageJobsWithoutQueueName`,
    /// `kueue.defaultQueue`). Unset: such jobs run at once, outside every quota.
    #[arg(long, env = "RDU_KUEUE_DEFAULT_QUEUE")]
    kueue_default_queue: Option<String>,
    /// This operator's progress endpoint as rank 0's pods reach it (`http://<service>.<namespace>.svc:<port>`,
    /// a Service in front of --progress-addr): rank 0 reports progress there with a projected ServiceAccount token
    /// (DESIGN 4.8). Unset: no progress in status, and no progress listener.
    #[arg(long, env = "RDU_PROGRESS_URL")]
    progress_url: Option<String>,
    /// Address of the progress endpoint, a listener of its own (with --progress-url): a flood of reports never
    /// reaches /healthz.
    #[arg(long, env = "RDU_PROGRESS_ADDR", default_value = "0.0.0.0:8081")]
    progress_addr: SocketAddr,
    /// The largest `spec.workers` this operator runs (1 to 4096, the API's ceiling): a larger job fails with a
    /// Failed condition naming spec.workers, its value and this limit.
    #[arg(long, env = "RDU_MAX_WORKERS_PER_JOB", default_value_t = DEFAULT_MAX_WORKERS_PER_JOB,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(rdu_crds::consts::MAX_WORKERS)))]
    max_workers_per_job: u32,
    /// What `spec.template` may give rank pods beyond Pod Security `restricted`, no node, the namespace's default
    /// ServiceAccount without a token, no Secret (comma-separated; chart values `podPolicy.allow.*`). A job whose
    /// template asks for more fails with a message naming the field and the value that allows it.
    #[arg(long, env = "RDU_POD_POLICY_ALLOW", value_delimiter = ',')]
    pod_policy_allow: Vec<Exception>,
    /// ServiceAccounts rank pods may run as, with their token (chart value `podPolicy.serviceAccounts`).
    #[arg(long, env = "RDU_POD_POLICY_SERVICE_ACCOUNTS", value_delimiter = ',')]
    pod_policy_service_accounts: Vec<String>,
    /// Runtime classes rank pods may name (chart value `podPolicy.runtimeClasses`).
    #[arg(long, env = "RDU_POD_POLICY_RUNTIME_CLASSES", value_delimiter = ',')]
    pod_policy_runtime_classes: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_logging(args.log_format);
    let identity = args.identity.clone().unwrap_or_else(hostname);
    let client = connect().await?;
    let (caches, writers) = Caches::new(&client, args.wait_for_room);
    serve_endpoints(&args, &caches).await?;
    let leadership = Leadership::new(&args, &client, &identity);
    if !leadership.acquire(&caches.health).await? {
        info!("shutting down before becoming leader");
        return Ok(());
    }
    let settings = settings(&args, pod_group_crd_installed(&client).await?);
    tokio::spawn(write_progress(caches.progress.clone(), client.clone()));
    let outcome = tokio::select! {
        _ = run_controller(&args, &client, identity, &caches, writers, settings) => Ok(()),
        lost = leadership.elector.keep() => Err(lost),
    };
    caches.health.set_synced(false);
    leadership.step_down(outcome).await
}

/// The controller's caches and what reads them before this replica leads: /metrics counts the job cache (all
/// phases 0 until it leads), and the progress endpoint finds rank 0's pod in the pod cache (every report refused
/// as not ready until then).
struct Caches {
    jobs: Store<RduJob>,
    /// The pods reconcile reads instead of listing them.
    pods: Store<Pod>,
    /// Which nodes are lost and what room they have (the lifecycle reads it).
    nodes: NodeCache,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    progress: Arc<ProgressService>,
}

/// The caches' writers, which the controller's watches take.
struct Writers {
    jobs: Writer<RduJob>,
    pods: Writer<Pod>,
    nodes: Writer<Node>,
}

impl Caches {
    fn new(client: &Client, wait_for_room: bool) -> (Caches, Writers) {
        let (jobs, job_writer) = reflector::store::<RduJob>();
        let (pods, pod_writer) = reflector::store::<Pod>();
        let (node_store, node_writer) = reflector::store::<Node>();
        let metrics = Arc::new(Metrics::new(jobs.clone()));
        let health = Arc::new(Health::new(metrics.clone()));
        let progress = Arc::new(ProgressService::new(
            Arc::new(ApiTokenReviewer::new(client.clone())),
            jobs.clone(),
            pods.clone(),
            health.clone(),
        ));
        let writers = Writers {
            jobs: job_writer,
            pods: pod_writer,
            nodes: node_writer,
        };
        let caches = Caches {
            jobs,
            pods,
            nodes: NodeCache::new(node_store, wait_for_room),
            metrics,
            health,
            progress,
        };
        (caches, writers)
    }
}

/// The metrics and health server, and the progress endpoint's when ranks report (`--progress-url`): both serve
/// from start, before this replica leads.
async fn serve_endpoints(args: &Args, caches: &Caches) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("cannot listen on --metrics-addr {}", args.metrics_addr))?;
    let routes = rdu_operator::health_router(caches.health.clone());
    tokio::spawn(async move {
        if let Err(e) = serve(listener, routes, HEALTH_LIMITS).await {
            error!(error = %rdu_error_chain::Chain(&e), "metrics server stopped");
        }
    });
    if args.progress_url.is_some() {
        let listener = tokio::net::TcpListener::bind(args.progress_addr)
            .await
            .with_context(|| format!("cannot listen on --progress-addr {}", args.progress_addr))?;
        let routes = rdu_operator::progress_router(caches.progress.clone(), caches.metrics.clone());
        tokio::spawn(async move {
            if let Err(e) = serve(listener, routes, PROGRESS_LIMITS).await {
                error!(error = %rdu_error_chain::Chain(&e), "progress server stopped");
            }
        });
    }
    Ok(())
}

/// The Lease this replica leads by, and the label its pod carries while it leads (the progress Service selects it).
struct Leadership {
    elector: LeaderElector,
    own_pod: Option<Arc<OwnPod>>,
    identity: String,
    lease: String,
    namespace: String,
}

impl Leadership {
    fn new(args: &Args, client: &Client, identity: &str) -> Leadership {
        let elector = LeaderElector::new(
            client.clone(),
            &args.lease_namespace,
            &args.lease_name,
            identity,
        );
        let own_pod = args
            .leader_pod
            .as_deref()
            .map(|pod| Arc::new(OwnPod::new(client.clone(), &args.lease_namespace, pod)));
        Leadership {
            elector,
            own_pod,
            identity: identity.to_string(),
            lease: args.lease_name.clone(),
            namespace: args.lease_namespace.clone(),
        }
    }

    /// Waits for the Lease, standing by (/readyz says so) until then; false when told to shut down first.
    async fn acquire(&self, health: &Health) -> anyhow::Result<bool> {
        if let Some(pod) = &self.own_pod {
            // A replica restarted after it lost the Lease still carries the label: progress would reach a standby.
            pod.unlabel().await;
        }
        health.set_standby(true);
        info!(identity = %self.identity, lease = %self.lease, namespace = %self.namespace, "waiting for leadership");
        tokio::select! {
            acquired = self.elector.acquire() => acquired.context("leader election failed")?,
            _ = shutdown_signal() => return Ok(false),
        }
        health.set_standby(false);
        info!(identity = %self.identity, "became leader");
        if let Some(pod) = self.own_pod.clone() {
            tokio::spawn(async move { pod.label_until_done().await });
        }
        Ok(true)
    }

    /// Ends the term: the pod's label removed, then the Lease released after a shutdown, or an error after the
    /// Lease was lost.
    async fn step_down(&self, outcome: Result<(), impl std::fmt::Display>) -> anyhow::Result<()> {
        if let Some(pod) = &self.own_pod {
            pod.unlabel().await;
        }
        match outcome {
            Ok(()) => {
                info!("shut down; releasing the lease");
                if let Err(e) = self.elector.release().await {
                    error!(error = %rdu_error_chain::Chain(&e), "could not release the lease; it expires on its own");
                }
                Ok(())
            }
            Err(lost) => bail!("stopping: {lost}"),
        }
    }
}

/// The operator's settings from its flags and what it found at start.
fn settings(args: &Args, pod_groups: bool) -> Settings {
    Settings {
        pod_groups,
        network_policies: args.network_policy,
        kueue: args.kueue,
        kueue_default_queue: args.kueue_default_queue.clone().filter(|q| !q.is_empty()),
        progress_url: args.progress_url.clone(),
        limits: Limits {
            max_workers_per_job: args.max_workers_per_job,
            pod_policy: PodPolicy {
                allow: args.pod_policy_allow.iter().copied().collect(),
                service_accounts: args.pod_policy_service_accounts.clone(),
                runtime_classes: args.pod_policy_runtime_classes.clone(),
            },
        },
    }
}

/// Watches the jobs, their pods, Services (and Workloads) and the nodes into the caches and reconciles every job
/// they wake, until a shutdown signal.
async fn run_controller(
    args: &Args,
    client: &Client,
    identity: String,
    caches: &Caches,
    writers: Writers,
    settings: Settings,
) {
    let ctx = Arc::new(Context::new(
        client.clone(),
        Some(identity),
        caches.metrics.clone(),
        caches.pods.clone(),
        caches.nodes.clone(),
        caches.health.clone(),
        settings,
    ));
    let (jobs, pods, services) = match &args.namespace {
        Some(ns) => (
            Api::<RduJob>::namespaced(client.clone(), ns),
            Api::<Pod>::namespaced(client.clone(), ns),
            Api::<Service>::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
        ),
    };
    let child_watch = watcher::Config::default().labels(rdu_crds::consts::LABEL_JOB_NAME);
    // What `Controller::new(jobs).owns(pods)` does, but with the stores kept: the job watch fills the job cache
    // (/metrics reads it), and the pod watch (whole pods, not metadata: the lifecycle reads their status) fills the
    // pod cache before it triggers the owner's reconcile, so a reconcile always sees the event that woke it.
    // Ready once both caches hold their first full list. Seen on the streams themselves: a second task awaiting
    // `Store::wait_until_ready` beside the controller's own wait was never woken (its one-shot keeps one waker),
    // so /readyz stayed 503.
    let synced = Synced::new(caches.health.clone(), 3);
    let job_events = watcher(jobs, watcher::Config::default())
        .modify(slim_job)
        .reflect(writers.jobs)
        .inspect_ok(on_first_sync(synced.clone()))
        .applied_objects();
    let pod_events = pod_watch(pods, child_watch.clone(), writers.pods, synced.clone());
    let node_events = node_watch(
        Api::all(client.clone()),
        writers.nodes,
        caches.nodes.clone(),
        synced,
    );
    let jobs_of_nodes = caches.jobs.clone();
    let mut controller = Controller::for_stream(job_events, caches.jobs.clone())
        .owns_stream(pod_events)
        .owns(services, child_watch)
        .watches_stream(node_events, move |node| {
            jobs_woken_by(&jobs_of_nodes, &node)
        });
    if args.kueue {
        // A Workload's admission, eviction or finish wakes the job that controls it.
        let resource = workload_resource();
        let workloads: Api<DynamicObject> = match &args.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let owned = watcher::Config::default().labels(KUEUE_JOB_UID_LABEL);
        controller = controller.owns_with(workloads, resource, owned);
    }
    controller
        .graceful_shutdown_on(shutdown_signal())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                // A job deleted between its watch event and its reconcile: nothing left to do.
                Err(kube::runtime::controller::Error::ObjectNotFound(obj)) => {
                    tracing::debug!(job = %obj.name, "job gone before its reconcile")
                }
                Err(error) => {
                    warn!(error = %rdu_error_chain::Chain(&error), "reconcile loop error")
                }
                Ok(_) => {}
            }
        })
        .await;
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "rdu-operator".to_string())
}

/// A client from KUBECONFIG or the in-cluster config, checked against the API server once.
async fn connect() -> anyhow::Result<Client> {
    let client = Client::try_default().await.context(
        "no Kubernetes cluster configured: set KUBECONFIG (or ~/.kube/config) or run in a pod with a service account",
    )?;
    client.apiserver_version().await.context(
        "cannot reach the Kubernetes API server: check KUBECONFIG's server address and that the cluster is up",
    )?;
    Ok(client)
}

/// Whether scheduler-plugins' PodGroup CRD exists (gang scheduling is skipped otherwise).
async fn pod_group_crd_installed(client: &Client) -> anyhow::Result<bool> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.get_opt("podgroups.scheduling.x-k8s.io").await {
        Ok(found) => Ok(found.is_some()),
        Err(e) => {
            warn!(error = %rdu_error_chain::Chain(&e), "cannot read CRDs; gang scheduling with PodGroups is off");
            Ok(false)
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
