//! A whole test cluster on this machine, for the tests with real pods: the control plane (etcd, kube-apiserver,
//! kube-scheduler, kube-controller-manager with every default controller), CoreDNS, and N real nodes
//! (`node`), with the three images assembled from the Dockerfiles and imported into every node. The chart is
//! installed with `helm install` as a user would. Tests drive it with kubectl and a kube client, and fault it:
//! crash, partition or reboot a node, restart a kubelet.
//!
//! Tests that need it are `#[ignore]`d (they need root and the Go-built binaries), so `cargo test` lists them as
//! ignored, never as passed; `bash e2e/node/run.sh` and `bash e2e/multi-node/run.sh` run them with `--ignored`,
//! and then anything missing is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
use kube::Api;
use kube::api::{ListParams, LogParams};
use rdu_crds::RduJob;
use serde_json::Value;
use tempfile::TempDir;

use crate::assets::Assets;
pub use crate::cluster::SYSTEM_NAMESPACE;
use crate::cluster::kubectl;
use crate::control_plane::{Components, ControlPlane, NodeAccess};
use crate::image::{self, Inputs};
use crate::node::kubelet::Reserved;
use crate::node::network::{self, HostNetwork};
use crate::node::sandbox::MountPoints;
use crate::node::{self, Image, Node, NodeBins, NodeConfig, services};
use crate::poll::poll_until;
use crate::process::Managed;
use crate::tools::{helm_binary, run_ok, workspace_root};

mod operator_home;

/// The chart's release (its namespace is `SYSTEM_NAMESPACE`).
pub const RELEASE: &str = crate::cluster::CHART_RELEASE;
/// The operator's Deployment, as the chart names it.
pub const OPERATOR_DEPLOYMENT: &str = "rdu-rdu-operator";
/// Env var naming the directory of the binaries the images are assembled from (default target/debug).
pub const IMAGE_BINARIES_ENV: &str = "RDU_E2E_IMAGE_BINARIES";

/// What the cluster is made of.
#[derive(Debug, Clone)]
pub struct TestbedSpec {
    /// How many nodes (1..=15).
    pub nodes: u8,
}

/// The control plane's binaries and the nodes', or a panic naming what is missing. Only `#[ignore]`d tests call
/// it: a test run explicitly must not pass by skipping.
pub fn require(test: &str) -> (Assets, NodeBins) {
    let assets = Assets::from_env().unwrap_or_else(|e| panic!("{test}: {e}"));
    let bins = node::bins_from_env().unwrap_or_else(|e| panic!("{test}: {e}"));
    (assets, bins)
}

/// A running cluster. Dropped in field order: nodes (and their pods) first, the network last.
pub struct Testbed {
    pub nodes: Vec<Node>,
    dns: Option<Managed>,
    pub plane: ControlPlane,
    pub client: kube::Client,
    _mount_points: MountPoints,
    pub network: HostNetwork,
    _images: TempDir,
    /// When `start` was called.
    pub started: Instant,
}

impl Testbed {
    /// Assembles the images, starts the network, the control plane, CoreDNS and the nodes, and waits until every
    /// node is Ready.
    pub async fn start(assets: &Assets, bins: NodeBins, spec: &TestbedSpec) -> Self {
        let started = Instant::now();
        node::sweep();
        // Interrupted, the run kills its children (above all the nodes' processes and containers) and removes the
        // nodes' namespaces, links and rules; drops would not run.
        crate::process::on_interrupt(interrupted);
        let images_dir = tempfile::Builder::new()
            .prefix("rdu-images-")
            .tempdir()
            .expect("tempdir");
        let images = assemble_images(images_dir.path());
        let names: Vec<String> = (1..=spec.nodes).map(node::node_name).collect();
        let components = Components {
            scheduler: true,
            controller_manager: true,
            node: Some(NodeAccess {
                address: network::control_plane_address(),
                service_cidr: network::SERVICE_CIDR,
                names,
            }),
        };
        // The bridge first: the API server binds the control plane's address on it.
        let network = HostNetwork::create().unwrap_or_else(|e| panic!("network: {e}"));
        let mount_points =
            MountPoints::ensure(&node::bind_targets()).expect("the nodes' mount points");
        let plane = ControlPlane::start(assets, components)
            .await
            .expect("control plane");
        let corefile = plane.dir().join("Corefile");
        std::fs::write(
            &corefile,
            services::corefile(
                network::control_plane_address(),
                &plane.admin_kubeconfig,
                "rdu-e2e",
            ),
        )
        .expect("Corefile");
        let mut dns = Command::new(&bins.coredns);
        dns.arg("-conf").arg(&corefile);
        let dns = Managed::spawn("coredns", dns, plane.dir()).expect("coredns");
        let client = plane.admin_client().await.expect("client");
        let (cpus, memory_mib) = machine_size();
        let mut nodes = Vec::new();
        for index in 1..=spec.nodes {
            network
                .add_node(index, spec.nodes)
                .unwrap_or_else(|e| panic!("node {index}'s network: {e}"));
            let name = node::node_name(index);
            let config = NodeConfig {
                index,
                bins: bins.clone(),
                kubelet_kubeconfig: plane
                    .node_kubeconfig(&name)
                    .expect("a kubeconfig per node")
                    .to_path_buf(),
                admin_kubeconfig: plane.admin_kubeconfig.clone(),
                client_ca: plane.ca_cert.clone(),
                reserved: Reserved::share(u64::from(spec.nodes), cpus, memory_mib),
            };
            let node = Node::start(&plane, config, &images)
                .await
                .unwrap_or_else(|e| panic!("node {name}: {e}"));
            nodes.push(node);
        }
        Self {
            nodes,
            dns: Some(dns),
            plane,
            client,
            _mount_points: mount_points,
            network,
            _images: images_dir,
            started,
        }
    }

    /// Node `index` (1-based).
    pub fn node(&self, index: u8) -> &Node {
        &self.nodes[usize::from(index) - 1]
    }

    /// Node `index` (1-based), to change it.
    pub fn node_mut(&mut self, index: u8) -> &mut Node {
        &mut self.nodes[usize::from(index) - 1]
    }

    /// The 1-based index of the node called `name`.
    pub fn index_of(&self, name: &str) -> u8 {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .map(|n| n.index)
            .unwrap_or_else(|| panic!("no node called {name}"))
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
        run_ok(&helm_binary(), &args, None).unwrap_or_else(|e| panic!("helm install: {e}"));
    }

    /// `kubectl args…` as the admin; panics with diagnostics when it fails.
    pub fn kubectl(&self, args: &[&str]) -> String {
        kubectl(&self.plane, args, None).unwrap_or_else(|e| panic!("{e}\n{}", self.diagnose()))
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) {
        kubectl(&self.plane, &["apply", "-f", "-"], Some(yaml))
            .unwrap_or_else(|e| panic!("{e}\n{}", self.diagnose()));
    }

    /// What a person would look at when something is stuck.
    pub fn diagnose(&self) -> String {
        let run = |args: &[&str]| {
            kubectl(&self.plane, args, None)
                .unwrap_or_else(|e| format!("(kubectl {}: {e})", args.join(" ")))
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
                node.log_tail("kubelet", 20),
                node.name,
                node.log_tail("containerd", 10)
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
        outcome.unwrap_or_else(|e| panic!("{e}\n{}", self.diagnose()))
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
            .map_err(|e| format!("get {name}: {e}"))?;
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
            .map_err(|e| format!("logs of {pod}: {e}"))
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
    pub async fn wait_ready_heartbeat_after(
        &self,
        name: &str,
        after: std::time::SystemTime,
        timeout: Duration,
    ) {
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
                if heartbeat > after {
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

    /// Crashes node `index`: its link goes down, then every process of it is killed at once.
    pub fn crash(&mut self, index: u8) {
        self.network
            .set_link(index, false)
            .unwrap_or_else(|e| panic!("link of node {index}: {e}"));
        self.node_mut(index)
            .crash()
            .unwrap_or_else(|e| panic!("crash of node {index}: {e}"));
    }

    /// Boots a crashed node `index` again: link up, new processes on the same disk; waits until it is Ready.
    pub async fn reboot(&mut self, index: u8) {
        self.network
            .set_link(index, true)
            .unwrap_or_else(|e| panic!("link of node {index}: {e}"));
        let Self { nodes, plane, .. } = self;
        nodes[usize::from(index) - 1]
            .reboot(plane)
            .await
            .unwrap_or_else(|e| panic!("reboot of node {index}: {e}"));
    }

    /// Takes node `index`'s link down (`up` false) or up: a network partition.
    pub fn set_link(&self, index: u8, up: bool) {
        self.network
            .set_link(index, up)
            .unwrap_or_else(|e| panic!("link of node {index}: {e}"));
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        // The nodes go first (their pods with them); CoreDNS and the control plane after.
        self.nodes.clear();
        self.dns.take();
    }
}

/// The nodes' part of the clean-up of an interrupted run: their cgroups' processes killed, their namespaces,
/// the bridge and the rules removed.
fn interrupted() {
    node::sweep();
    network::sweep();
}

/// The machine's CPUs and memory (MiB), which the nodes share.
fn machine_size() -> (u64, u64) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let memory_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .unwrap_or(4 << 20);
    (cpus, memory_kib / 1024)
}

/// The three images, assembled from their stages of `docker/Dockerfile` and checked against them.
pub fn assemble_images(out: &Path) -> Vec<Image> {
    let root = workspace_root();
    let binaries = std::env::var_os(IMAGE_BINARIES_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/debug"));
    let inputs = Inputs {
        context: root.clone(),
        binaries,
    };
    let mut images = Vec::new();
    for (target, repository) in [
        ("operator", "rdu-operator"),
        ("device-plugin", "rdu-device-plugin"),
        ("worker", "rdu-worker"),
    ] {
        let tag = chart_app_version();
        let dockerfile = format!("docker/Dockerfile, target {target}");
        let assembled = image::assemble(
            &root.join("docker/Dockerfile"),
            target,
            repository,
            &tag,
            &inputs,
            out,
        )
        .unwrap_or_else(|e| panic!("{dockerfile}: {e}"));
        let facts = image::inspect(&assembled.layout, &assembled.tag).expect("inspect");
        let drift = image::drift(&assembled.stage, &facts);
        assert!(
            drift.is_empty(),
            "{dockerfile} and its image differ: {drift:?}"
        );
        images.push(Image {
            name: format!("{repository}:{tag}"),
            tar: assembled.tar,
        });
    }
    images
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
