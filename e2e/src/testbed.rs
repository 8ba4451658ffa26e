//! A whole test cluster on this machine, for the tests with real pods: a kind cluster (`kind`: one control plane
//! and N RDU nodes, each a container of podman or docker) from the node image CI assembles offline or kind's
//! own, with the three images of `docker/Dockerfile` loaded into it and the chart installed with `helm install`
//! as a user would. Tests drive it with kubectl and a kube client, and fault it: crash, partition or reboot a
//! node, restart a kubelet or containerd, kill or OOM-kill a container's process.
//!
//! Tests that need it are `#[ignore]`d (they need kind, a container engine and the images), so `cargo test`
//! lists them as ignored, never as passed; `bash e2e/node/run.sh` and `bash e2e/multi-node/run.sh` run them with
//! `--ignored`, and then anything missing is a failure.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
use kube::Api;
use kube::api::{ListParams, LogParams};
use rdu_crds::RduJob;
use serde_json::Value;
use tempfile::TempDir;

pub use crate::cluster::SYSTEM_NAMESPACE;
use crate::cluster::kubectl;
use crate::control_plane::ControlPlane;
use crate::kind::{Kind, KindSpec};
use crate::poll::{poll_until, wait_for_file};
use crate::tools::{helm_binary, run_ok, workspace_root};

mod control_plane_faults;
mod node_faults;
mod operator_home;

/// The chart's release (its namespace is `SYSTEM_NAMESPACE`).
pub const RELEASE: &str = crate::cluster::CHART_RELEASE;
/// The operator's Deployment, as the chart names it.
pub const OPERATOR_DEPLOYMENT: &str = "rdu-rdu-operator";
/// The images the chart runs, as `docker/build.sh` tags them (`<repository>:<appVersion>`).
/// How long [`Testbed::apply`] applies again while the API server is away.
pub const APPLY_DEADLINE: Duration = Duration::from_secs(180);

/// Each rank's CPU limit in the jobs that only have to be running through a fault (the three-node test's spread and
/// fault jobs, the one-node test's checkpointed job). Unlimited, such a job takes what CPU its ranks get for as long
/// as it trains, from the stages CI runs beside it (`.ci/run`): an 8-rank digits job alone on a four-node cluster
/// made 708 steps/s on 1.17 cores (2026-12-02), at 100m 218 steps/s on 0.44 cores; 4 ranks on one node at 100m made
/// 546 to 639 steps/s (2026-12-07). Such jobs are sized to train minutes at the limited rate.
pub const FAULT_JOB_RANK_CPU: &str = "100m";

/// The `containers` of a job's `spec.template.spec` that put its workers under [`FAULT_JOB_RANK_CPU`].
pub fn cpu_limited_worker() -> Value {
    serde_json::json!([{"name": "worker", "resources": {"limits": {"cpu": FAULT_JOB_RANK_CPU}}}])
}
const APPLY_RETRY_PAUSE: Duration = Duration::from_secs(2);

/// Whether kubectl failed because the API server was away or did not answer in time (as after its restart),
/// not because of what was sent.
fn is_transient(error: &crate::cluster::ClusterError) -> bool {
    let text = error.to_string();
    [
        "connection refused",
        "Client.Timeout",
        "context deadline exceeded",
        "TLS handshake timeout",
        "i/o timeout",
        "connection reset by peer",
        "http2: client connection lost",
        "the server is currently unable to handle the request",
        "the server was unable to return a response in the time allotted",
        "etcdserver: request timed out",
    ]
    .iter()
    .any(|marker| text.contains(marker))
}

const IMAGES: [&str; 3] = ["rdu-operator", "rdu-device-plugin", "rdu-worker"];
/// When set, names a file whose existence says the images are built: the cluster is created at once and the images
/// are loaded once the file is there (CI creates the three-node cluster while the images' release build runs).
pub const IMAGES_READY_ENV: &str = "RDU_E2E_IMAGES_READY_FILE";
/// How long a testbed waits for [`IMAGES_READY_ENV`]'s file (the images' build from an empty cache takes about
/// 20 minutes on 2 cores).
const IMAGES_READY_DEADLINE: Duration = Duration::from_secs(3600);

/// What the cluster is made of.
#[derive(Debug, Clone)]
pub struct TestbedSpec {
    /// The kind cluster's name (one per test, so that a run killed outright is swept by the next).
    pub name: &'static str,
    /// How many RDU nodes (kind workers, 1..=9).
    pub nodes: u8,
}

/// One RDU node of the testbed.
#[derive(Debug, Clone)]
pub struct Node {
    /// 1-based.
    pub index: u8,
    /// The Node's name (its container's).
    pub name: String,
    pod_logs: PathBuf,
}

impl Node {
    /// The node's `/var/log/pods`, kept on the host: readable while the node is down or cut off.
    pub fn pod_logs(&self) -> &std::path::Path {
        &self.pod_logs
    }
}

/// A running cluster. Dropped in field order: the processes beside the control plane (Kueue) first, the
/// cluster, then the directories its nodes mounted.
pub struct Testbed {
    pub nodes: Vec<Node>,
    pub plane: ControlPlane,
    pub client: kube::Client,
    kind: Kind,
    shared: TempDir,
    _logs: TempDir,
    /// kind's configuration and kubeconfig.
    _work: TempDir,
    /// When `start` was called.
    pub started: Instant,
}

impl Testbed {
    /// Creates the kind cluster, loads the three images (built by `bash docker/build.sh`) and waits until every
    /// node is Ready.
    pub async fn start(spec: &TestbedSpec) -> Self {
        let started = Instant::now();
        let shared = tempdir("rdu-shared-storage-");
        set_mode(shared.path(), 0o777);
        let logs = tempdir("rdu-pod-logs-");
        let work = tempdir("rdu-kind-");
        let kind_spec = KindSpec {
            name: spec.name.to_string(),
            workers: spec.nodes,
            shared: shared.path().to_path_buf(),
            logs: logs.path().to_path_buf(),
        };
        let kind = Kind::create(&kind_spec, work.path()).unwrap_or_else(|e| {
            panic!("kind cluster {}: {}", spec.name, rdu_error_chain::Chain(&e))
        });
        if let Some(ready) = std::env::var_os(IMAGES_READY_ENV) {
            wait_for_file(std::path::Path::new(&ready), IMAGES_READY_DEADLINE)
                .await
                .unwrap_or_else(|e| panic!("the images: {e}"));
        }
        let tag = chart_app_version();
        for image in IMAGES {
            kind.load_image(&format!("{image}:{tag}"), work.path())
                .unwrap_or_else(|e| {
                    panic!("loading {image}:{tag}: {}", rdu_error_chain::Chain(&e))
                });
        }
        let plane = ControlPlane::attach(kind.kubeconfig.clone()).expect("kind's API server");
        // No dynamic provisioner: a claim binds the PersistentVolume its test made (on `shared_dir`, or a node's
        // disk), as on a cluster whose storage an administrator provides; kind's default StorageClass would
        // provision a volume of its own instead.
        kubectl(&plane, &["delete", "storageclass", "--all"], None).unwrap_or_else(|e| {
            panic!(
                "removing kind's StorageClass: {}",
                rdu_error_chain::Chain(&e)
            )
        });
        let client = plane.admin_client().await.expect("client");
        let nodes = kind
            .workers
            .iter()
            .zip(1..)
            .map(|(name, index)| Node {
                index,
                name: name.clone(),
                pod_logs: kind.pod_logs(name),
            })
            .collect();
        Self {
            nodes,
            plane,
            client,
            kind,
            shared,
            _logs: logs,
            _work: work,
            started,
        }
    }

    /// Node `index` (1-based).
    pub fn node(&self, index: u8) -> &Node {
        &self.nodes[usize::from(index) - 1]
    }

    /// The 1-based index of the node called `name`.
    pub fn index_of(&self, name: &str) -> u8 {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .map(|n| n.index)
            .unwrap_or_else(|| panic!("no node called {name}"))
    }

    /// A host directory every node sees at the same path (storage shared by the nodes, as network storage is):
    /// a hostPath PersistentVolume on it is ReadWriteMany.
    pub fn shared_dir(&self) -> &std::path::Path {
        self.shared.path()
    }

    /// A ReadWriteMany PersistentVolume for job `job`'s checkpoint claim, on `<shared_dir>/<job>`, a directory
    /// every node sees at the same path; returns the directory. Its reclaim policy is Retain: the test deletes
    /// it (`PersistentVolume <job>-shared`) when it is done with the job.
    pub fn shared_volume(&self, job: &str) -> PathBuf {
        let dir = self.shared_dir().join(job);
        std::fs::create_dir_all(&dir).expect("job's shared directory");
        set_mode(&dir, 0o777);
        let claim = rdu_crds::consts::checkpoint_claim_name(job);
        self.apply(&format!(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {job}-shared}}\nspec:\n  capacity: {{storage: 1Gi}}\n  \
             accessModes: [ReadWriteMany]\n  persistentVolumeReclaimPolicy: Retain\n  \
             claimRef: {{namespace: default, name: {claim}}}\n  hostPath: {{path: {}, type: Directory}}\n",
            dir.display()
        ));
        dir
    }

    /// `helm install` of the chart with `--set` values (the nodes' paths are the chart's defaults).
    pub fn helm_install(&self, sets: &[String]) {
        let chart = workspace_root().join("charts/rdu-operator");
        let kubeconfig = format!("--kubeconfig={}", self.plane.admin_kubeconfig.display());
        let chart = chart.display().to_string();
        let mut args = vec![
            "install",
            RELEASE,
            chart.as_str(),
            "--namespace",
            SYSTEM_NAMESPACE,
            "--create-namespace",
            kubeconfig.as_str(),
        ];
        for set in sets {
            args.extend(["--set", set.as_str()]);
        }
        run_ok(&helm_binary(), &args, None)
            .unwrap_or_else(|e| panic!("helm install: {}", rdu_error_chain::Chain(&e)));
    }

    /// `kubectl args…` as the admin; panics with diagnostics when it fails.
    pub fn kubectl(&self, args: &[&str]) -> String {
        kubectl(&self.plane, args, None)
            .unwrap_or_else(|e| panic!("{}\n{}", rdu_error_chain::Chain(&e), self.diagnose()))
    }

    /// `kubectl apply -f -` of `yaml`, applied again (it is idempotent) while the API server is away or slow to
    /// answer, for up to [`APPLY_DEADLINE`]; any other failure panics at once.
    pub fn apply(&self, yaml: &str) {
        let deadline = Instant::now() + APPLY_DEADLINE;
        loop {
            match kubectl(&self.plane, &["apply", "-f", "-"], Some(yaml)) {
                Ok(_) => return,
                Err(e) if is_transient(&e) && Instant::now() < deadline => {
                    eprintln!(
                        "kubectl apply: {} (applying again)",
                        rdu_error_chain::Chain(&e)
                    );
                    std::thread::sleep(APPLY_RETRY_PAUSE);
                }
                Err(e) => panic!("{}\n{}", rdu_error_chain::Chain(&e), self.diagnose()),
            }
        }
    }

    /// The last lines of every node's kubelet journal that mention `needle` (a job's name: its pods' and claims'
    /// names start with it), at most 40 per node.
    pub fn kubelet_lines_about(&self, needle: &str) -> String {
        let mut text = String::new();
        for node in &self.nodes {
            let journal = self.kind.journal_tail(&node.name, "kubelet", 20_000);
            let lines: Vec<&str> = journal.lines().filter(|l| l.contains(needle)).collect();
            let shown = &lines[lines.len().saturating_sub(40)..];
            text.push_str(&format!(
                "--- {} kubelet ({} lines)\n",
                node.name,
                lines.len()
            ));
            for line in shown {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }

    /// What a person would look at when something is stuck.
    pub fn diagnose(&self) -> String {
        let run = |args: &[&str]| {
            kubectl(&self.plane, args, None).unwrap_or_else(|e| {
                format!(
                    "(kubectl {}: {})",
                    args.join(" "),
                    rdu_error_chain::Chain(&e)
                )
            })
        };
        let operator_logs = run(&[
            "logs",
            "-n",
            SYSTEM_NAMESPACE,
            &format!("deploy/{OPERATOR_DEPLOYMENT}"),
            "--tail=40",
        ]);
        let plugins = run(&[
            "logs",
            "-n",
            SYSTEM_NAMESPACE,
            "-l",
            "app.kubernetes.io/component=device-plugin",
            "--prefix",
            "--tail=15",
        ]);
        let mut text = format!(
            "--- nodes\n{}\n--- pods\n{}\n--- rdujobs\n{}\n--- events\n{}\n--- operator\n{operator_logs}\n--- device plugins\n{plugins}",
            run(&["get", "nodes", "-o", "wide"]),
            run(&["get", "pods", "-A", "-o", "wide"]),
            run(&["get", "rdujobs", "-A", "-o", "yaml"]),
            run(&["get", "events", "-A", "--sort-by=.lastTimestamp"]),
        );
        for node in &self.nodes {
            text.push_str(&format!(
                "\n--- {} kubelet\n{}\n--- {} containerd\n{}",
                node.name,
                self.kind.journal_tail(&node.name, "kubelet", 20),
                node.name,
                self.kind.journal_tail(&node.name, "containerd", 10)
            ));
        }
        text
    }

    /// Polls `check` until it yields a value, failing with diagnostics.
    pub async fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        check: impl AsyncFn() -> Result<T, String>,
    ) -> T {
        let outcome = poll_until(what, timeout, check).await;
        outcome.unwrap_or_else(|e| panic!("{}\n{}", rdu_error_chain::Chain(&e), self.diagnose()))
    }

    /// An object as JSON, or what went wrong.
    pub async fn get<K>(&self, api: Api<K>, name: &str) -> Result<Value, String>
    where
        K: kube::Resource
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let object = api
            .get(name)
            .await
            .map_err(|e| format!("get {name}: {}", rdu_error_chain::Chain(&e)))?;
        serde_json::to_value(object).map_err(|e| e.to_string())
    }

    /// RduJob `name` in `default`.
    pub async fn job(&self, name: &str) -> Result<Value, String> {
        self.get(
            Api::<RduJob>::namespaced(self.client.clone(), "default"),
            name,
        )
        .await
    }

    /// Pod `name` in `default`.
    pub async fn pod(&self, name: &str) -> Result<Value, String> {
        self.get(Api::<Pod>::namespaced(self.client.clone(), "default"), name)
            .await
    }

    /// Node object `name`.
    pub async fn node_object(&self, name: &str) -> Result<Value, String> {
        self.get(Api::<NodeObject>::all(self.client.clone()), name)
            .await
    }

    /// A pod's log through the API server (which asks the kubelet), as `kubectl logs` reads it.
    pub async fn logs_in(&self, namespace: &str, pod: &str) -> Result<String, String> {
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .logs(pod, &LogParams::default())
            .await
            .map_err(|e| format!("logs of {pod}: {}", rdu_error_chain::Chain(&e)))
    }

    /// Waits until RduJob `name` runs again after a gang restart (its generation 1 or later).
    pub async fn wait_restarted_running(&self, name: &str, timeout: Duration) {
        self.wait("generation 1 running", timeout, async || {
            let job = self.job(name).await?;
            let status = &job["status"];
            if status["restarts"].as_u64() >= Some(1) && status["phase"] == "Running" {
                Ok(())
            } else {
                Err(format!("{status}"))
            }
        })
        .await;
    }

    /// Waits until RduJob `name` is in `phase`; Failed (when not awaited) fails the test.
    pub async fn wait_phase(&self, name: &str, phase: &str, timeout: Duration) -> Value {
        self.wait(
            &format!("RduJob {name} to be {phase}"),
            timeout,
            async || {
                let job = self.job(name).await?;
                let have = job["status"]["phase"].as_str().unwrap_or("").to_string();
                if have == phase {
                    Ok(job)
                } else if have == "Failed" {
                    panic!(
                        "RduJob {name} failed: {}\n{}",
                        job["status"],
                        self.diagnose()
                    );
                } else {
                    Err(format!("phase {have:?}"))
                }
            },
        )
        .await
    }

    /// Waits until node `name`'s allocatable `rdu.dev/tile` is `count`.
    pub async fn wait_tiles(&self, name: &str, count: u32, when: &str, timeout: Duration) {
        let want = count.to_string();
        self.wait(
            &format!("{count} allocatable rdu.dev/tile on {name} {when}"),
            timeout,
            async || {
                let node = self.node_object(name).await?;
                let have = node["status"]["allocatable"]["rdu.dev/tile"]
                    .as_str()
                    .unwrap_or("none")
                    .to_string();
                if have == want {
                    Ok(())
                } else {
                    Err(format!("allocatable rdu.dev/tile: {have}"))
                }
            },
        )
        .await;
    }

    /// Waits until node `name` posted a Ready heartbeat after `after` (its kubelet is the one started since).
    /// The heartbeat's time has whole seconds: one posted in the second the kubelet restarted counts (a kubelet
    /// posts its status as it starts, often within that second; the one before posts every 5 minutes).
    pub async fn wait_ready_heartbeat_after(
        &self,
        name: &str,
        after: std::time::SystemTime,
        timeout: Duration,
    ) {
        let after_second = after
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| std::time::UNIX_EPOCH + Duration::from_secs(d.as_secs()))
            .unwrap_or(after);
        self.wait(
            &format!("a Ready heartbeat of {name} newer than {after:?}"),
            timeout,
            async || {
                let node = self.node_object(name).await?;
                let heartbeat = node["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "Ready" && c["status"] == "True")
                    .and_then(|c| c["lastHeartbeatTime"].as_str())
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                    .map(std::time::SystemTime::from)
                    .ok_or("no Ready heartbeat")?;
                if heartbeat >= after_second {
                    Ok(())
                } else {
                    Err(format!("last Ready heartbeat {heartbeat:?}"))
                }
            },
        )
        .await;
    }

    /// The pods of `namespace` matching `selector`.
    pub async fn pods(&self, namespace: &str, selector: &str) -> Result<Vec<Pod>, String> {
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .list(&ListParams::default().labels(selector))
            .await
            .map(|l| l.items)
            .map_err(|e| e.to_string())
    }

    /// The device plugin's ready pod on node `node` (not being deleted).
    pub async fn plugin_pod(&self, node: &str) -> Result<String, String> {
        let pods = self
            .pods(
                SYSTEM_NAMESPACE,
                "app.kubernetes.io/component=device-plugin",
            )
            .await?;
        let pods = serde_json::to_value(pods).map_err(|e| e.to_string())?;
        pods.as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter(|p| p["spec"]["nodeName"] == node)
            .filter(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
            .find_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .ok_or_else(|| format!("no ready device plugin pod on {node}"))
    }

    /// Waits until node `node`'s device plugin, started after `since` (a reboot), is ready and the node offers
    /// `tiles`: until then the node may still advertise the devices of its last boot (the kubelet's checkpoint)
    /// without a plugin to allocate them, and pods sent there fail admission (UnexpectedAdmissionError).
    pub async fn wait_device_plugin(
        &self,
        node: &str,
        since: std::time::SystemTime,
        tiles: u32,
        timeout: Duration,
    ) {
        self.wait(
            &format!("the device plugin on {node} started after its reboot"),
            timeout,
            async || {
                let name = self.plugin_pod(node).await?;
                let pod = self
                    .get(
                        Api::<Pod>::namespaced(self.client.clone(), SYSTEM_NAMESPACE),
                        &name,
                    )
                    .await?;
                let started =
                    pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
                        .as_str()
                        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                        .map(std::time::SystemTime::from)
                        .ok_or("not running")?;
                // startedAt has whole seconds.
                let since = since - Duration::from_secs(1);
                if started >= since {
                    Ok(())
                } else {
                    Err(format!("{name} started before the reboot"))
                }
            },
        )
        .await;
        self.wait_tiles(node, tiles, "after the device plugin registered", timeout)
            .await;
    }

    /// `kubectl-rdujob args…` in the default namespace as the admin (built beside the test binaries).
    pub fn cluster_cli(&self, args: &[&str]) -> String {
        let exe = std::env::current_exe().expect("test binary");
        let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
        let out = Command::new(dir.join("kubectl-rdujob"))
            .arg("--kubeconfig")
            .arg(&self.plane.admin_kubeconfig)
            .args(["-n", "default"])
            .args(args)
            .output()
            .expect("kubectl-rdujob runs (cargo build -p kubectl-rdujob)");
        assert!(
            out.status.success(),
            "kubectl-rdujob {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Crashes node `index`: its container is killed, every process of the node at once.
    pub fn crash(&mut self, index: u8) {
        let name = self.node(index).name.clone();
        self.kind
            .kill(&name)
            .unwrap_or_else(|e| panic!("crash of {name}: {}", rdu_error_chain::Chain(&e)));
    }

    /// Boots a crashed node `index` again on the same disk and waits until it posts a Ready heartbeat.
    pub async fn reboot(&mut self, index: u8) {
        let name = self.node(index).name.clone();
        let booted = std::time::SystemTime::now();
        self.kind
            .start(&name)
            .unwrap_or_else(|e| panic!("reboot of {name}: {}", rdu_error_chain::Chain(&e)));
        self.wait_ready_heartbeat_after(&name, booted, Duration::from_secs(300))
            .await;
    }

    /// Takes node `index` off the cluster's network (`up` false) or puts it back with its address: a partition.
    pub fn set_link(&self, index: u8, up: bool) {
        let name = &self.node(index).name;
        self.kind
            .set_connected(name, up)
            .unwrap_or_else(|e| panic!("link of {name}: {}", rdu_error_chain::Chain(&e)));
    }

    /// Runs `args` in node `index` (its container); its stdout.
    pub fn node_exec(&self, index: u8, args: &[&str]) -> Result<String, String> {
        let name = &self.node(index).name;
        self.kind
            .exec(name, args)
            .map_err(|e| format!("{args:?} on {name}: {}", rdu_error_chain::Chain(&e)))
    }

    /// An image with Perl already on node `index`: the node image's component base (DESIGN 7), for probe pods.
    pub fn shell_image(&self, index: u8) -> String {
        let images = self
            .node_exec(index, &["ctr", "-n", "k8s.io", "images", "ls", "-q"])
            .expect("the node's images");
        images
            .lines()
            .find(|i| i.contains("rdu-kind-component-base"))
            .unwrap_or_else(|| panic!("no rdu-kind-component-base image on the node: {images}"))
            .to_string()
    }

    /// Restarts node `index`'s kubelet (`systemctl restart kubelet` in the node).
    pub fn restart_kubelet(&self, index: u8) {
        let name = &self.node(index).name;
        self.kind
            .exec(name, &["systemctl", "restart", "kubelet"])
            .unwrap_or_else(|e| {
                panic!("kubelet restart on {name}: {}", rdu_error_chain::Chain(&e))
            });
    }

    /// SIGKILLs the process of container `container_id` (`containerd://…`, as pod status names it) on node
    /// `index`, as the kernel would.
    pub fn kill_container(&self, index: u8, container_id: &str) {
        let name = &self.node(index).name;
        let id = container_id
            .strip_prefix("containerd://")
            .unwrap_or(container_id);
        self.kind
            .exec(
                name,
                &["ctr", "-n", "k8s.io", "task", "kill", "-s", "SIGKILL", id],
            )
            .unwrap_or_else(|e| {
                panic!(
                    "kill of container {id} on {name}: {}",
                    rdu_error_chain::Chain(&e)
                )
            });
    }

    /// The packets kube-proxy's `KUBE-FORWARD` chain dropped as conntrack-INVALID on node `index` (connections
    /// the node's conntrack lost track of), if the chain is there. kube-proxy's image writes through nftables
    /// while the node's own `iptables` may be the legacy one, so `iptables-nft` is asked first.
    pub fn invalid_forward_drops(&self, index: u8) -> Option<u64> {
        ["iptables-nft", "iptables"]
            .into_iter()
            .find_map(|iptables| {
                let listing = self
                    .kind
                    .exec(
                        &self.node(index).name,
                        &[
                            iptables,
                            "-t",
                            "filter",
                            "-L",
                            "KUBE-FORWARD",
                            "-v",
                            "-n",
                            "-x",
                        ],
                    )
                    .ok()?;
                invalid_drops_in(&listing)
            })
    }
}

/// The packet count of the INVALID DROP rule in `iptables -L -v -n -x` text.
fn invalid_drops_in(listing: &str) -> Option<u64> {
    listing
        .lines()
        .find(|l| l.contains("DROP") && l.contains("INVALID"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
}

fn tempdir(prefix: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("tempdir")
}

/// Sets `path`'s mode (a directory the pods' non-root user writes).
pub fn set_mode(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// The chart's appVersion: the images' tag.
pub fn chart_app_version() -> String {
    let chart = std::fs::read_to_string(workspace_root().join("charts/rdu-operator/Chart.yaml"))
        .expect("Chart.yaml");
    let chart: Value = serde_yaml_ng::from_str(&chart).expect("Chart.yaml");
    chart["appVersion"]
        .as_str()
        .expect("appVersion")
        .to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_invalid_drop_rule_is_counted() {
        let listing = "Chain KUBE-FORWARD (1 references)\n    pkts      bytes target     prot opt in     out     source               destination\n      17     1020 DROP       0    --  *      *       0.0.0.0/0            0.0.0.0/0            ctstate INVALID\n       0        0 ACCEPT     0    --  *      *       0.0.0.0/0            0.0.0.0/0            mark match 0x4000/0x4000\n";
        assert_eq!(super::invalid_drops_in(listing), Some(17));
        assert_eq!(super::invalid_drops_in("Chain KUBE-FORWARD\n"), None);
    }

    #[test]
    fn only_an_api_server_away_or_slow_is_applied_again() {
        let kubectl = |stderr: &str| crate::cluster::ClusterError::Kubectl {
            args: "apply -f -".into(),
            stderr: stderr.into(),
        };
        let transient = [
            "The connection to the server 172.18.0.2:6443 was refused - did you specify the right host or port? dial tcp 172.18.0.2:6443: connect: connection refused",
            "Unable to connect to the server: net/http: request canceled (Client.Timeout exceeded while awaiting headers)",
            "Error from server (ServiceUnavailable): the server is currently unable to handle the request",
            "Unable to connect to the server: net/http: TLS handshake timeout",
        ];
        for stderr in transient {
            assert!(super::is_transient(&kubectl(stderr)), "{stderr}");
        }
        let refused = [
            "The RduJob \"x\" is invalid: spec.workers: Invalid value: 0: spec.workers must be at least 1",
            "error: error parsing STDIN: error converting YAML to JSON",
            "Error from server (Forbidden): rdujobs.rdu.dev is forbidden",
        ];
        for stderr in refused {
            assert!(!super::is_transient(&kubectl(stderr)), "{stderr}");
        }
    }
}
