//! Real Kubernetes nodes for the e2e tests, on this machine, without Docker or a registry. Each node is a set of
//! namespaces and a cgroup of its own ([`sandbox`]) on the cluster's network ([`network`]), running its own
//! containerd (runc, CNI bridge), a kubelet registered with the test control plane and kube-proxy; images are
//! assembled from the Dockerfiles and imported into every node's containerd. A node can be crashed (its link
//! down, every process killed at once), partitioned (its link down), rebooted (the same disk, new processes), or
//! have its kubelet restarted.
//!
//! Binaries come from `e2e/node/build.sh` through `RDU_E2E_NODE_BIN`; Debian's containerd, runc,
//! containernetworking-plugins, umoci, iptables and util-linux's nsenter/unshare must be installed, and the tests
//! run as root. Every process, namespace, cgroup, mount, link, route and rule the nodes made is removed when they
//! are dropped, also when a test fails; a run killed outright is cleaned up by the next one.

pub mod cgroups;
pub mod containerd;
pub mod kubelet;
pub mod network;
pub mod sandbox;
pub mod services;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Api;
use tempfile::TempDir;

use crate::control_plane::ControlPlane;
use crate::image::{self, ImageError};
use crate::poll::{PollError, poll_until};
use crate::process::Managed;
use sandbox::{Bind, Sandbox};

/// Env var naming the directory of kubelet, kube-proxy, coredns and pause.
pub const NODE_BIN_ENV: &str = "RDU_E2E_NODE_BIN";
/// The sandbox image every node's containerd runs each pod's network namespace in.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// Node cgroups are named with this prefix (and nothing else of this machine's is).
const CGROUP_PREFIX: &str = "rdu-e2e-node-";
/// How long a node may take to become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long containerd may take to answer.
const CONTAINERD_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors starting or changing a node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("{0}")]
    Missing(String),
    #[error("{0}")]
    Command(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    NotReady(#[from] PollError),
    #[error("kube client: {0}")]
    Client(#[from] crate::kubeconfig::ClientError),
}

/// Node `index`'s name (1-based).
pub fn node_name(index: u8) -> String {
    format!("{CGROUP_PREFIX}{index}")
}

/// The node's binaries, from `e2e/node/build.sh`.
#[derive(Debug, Clone)]
pub struct NodeBins {
    pub kubelet: PathBuf,
    pub kube_proxy: PathBuf,
    pub coredns: PathBuf,
    pub pause: PathBuf,
}

impl NodeBins {
    /// Checks that every binary exists in `dir`.
    pub fn in_dir(dir: &Path) -> Result<Self, NodeError> {
        let find = |name: &str| {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(NodeError::Missing(format!(
                    "{NODE_BIN_ENV}={} has no `{name}`: run `bash e2e/node/build.sh`",
                    dir.display()
                )))
            }
        };
        Ok(Self {
            kubelet: find("kubelet")?,
            kube_proxy: find("kube-proxy")?,
            coredns: find("coredns")?,
            pause: find("pause")?,
        })
    }
}

/// What this machine must have for nodes: root, and Debian's packages.
pub fn machine_problems() -> Vec<String> {
    let mut problems = Vec::new();
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| {
                    l.strip_prefix("Uid:")
                        .map(|r| r.split_whitespace().next().map(str::to_string))
                })
                .flatten()
        });
    if uid.as_deref() != Some("0") {
        problems.push(
            "a node needs root (namespaces, cgroups, containerd, the kubelet, iptables)".into(),
        );
    }
    let on_path = |tool: &str| {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(tool).is_file()))
    };
    for (tool, package) in [
        ("containerd", "containerd"),
        ("ctr", "containerd"),
        ("umoci", "umoci"),
        ("iptables", "iptables"),
        ("ip", "iproute2"),
        ("nsenter", "util-linux"),
        ("unshare", "util-linux"),
    ] {
        if !on_path(tool) {
            problems.push(format!(
                "`{tool}` is not on PATH (apt-get install {package})"
            ));
        }
    }
    for (file, package) in [
        (containerd::RUNC.to_string(), "runc"),
        (
            format!("{}/bridge", containerd::CNI_BIN_DIR),
            "containernetworking-plugins",
        ),
        (
            format!("{}/host-local", containerd::CNI_BIN_DIR),
            "containernetworking-plugins",
        ),
    ] {
        if !Path::new(&file).is_file() {
            problems.push(format!("{file} is missing (apt-get install {package})"));
        }
    }
    problems
}

/// The node binaries, or the reasons there are none (`RDU_E2E_NODE_BIN` unset or incomplete, or this machine
/// lacking what a node needs).
pub fn bins_from_env() -> Result<NodeBins, String> {
    let mut problems = machine_problems();
    let bins = match std::env::var_os(NODE_BIN_ENV) {
        Some(dir) if !dir.is_empty() => match NodeBins::in_dir(Path::new(&dir)) {
            Ok(bins) => Some(bins),
            Err(e) => {
                problems.push(e.to_string());
                None
            }
        },
        _ => {
            problems.push(format!(
                "{NODE_BIN_ENV} is not set: run `bash e2e/node/run.sh`, which builds the node's binaries"
            ));
            None
        }
    };
    match bins {
        Some(bins) if problems.is_empty() => Ok(bins),
        _ => Err(problems.join("; ")),
    }
}

/// An image to import: the tar of an OCI layout and the name pods use for it.
#[derive(Debug, Clone)]
pub struct Image {
    pub name: String,
    pub tar: PathBuf,
}

/// The paths of this machine every node binds its own directory over (created by the cluster if missing).
pub fn bind_targets() -> Vec<PathBuf> {
    BOUND.iter().map(PathBuf::from).collect()
}

/// The node-owned paths: the kubelet's root (the device plugin API fixes `device-plugins/kubelet.sock` there),
/// containerd's root, CNI's state and configuration, the pod logs, and the device plugin's state directory.
const BOUND: &[&str] = &[
    kubelet::ROOT,
    "/var/lib/containerd",
    "/var/lib/cni",
    containerd::CNI_CONF_DIR,
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/rdu-device-plugin",
];

/// How a node is started: which of how many, with what, against which control plane.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub index: u8,
    pub bins: NodeBins,
    pub kubelet_kubeconfig: PathBuf,
    pub admin_kubeconfig: PathBuf,
    pub client_ca: PathBuf,
    pub reserved: kubelet::Reserved,
}

/// A node: its disk (a directory that outlives crashes) and, while it runs, its namespaces and processes.
pub struct Node {
    pub index: u8,
    pub name: String,
    pub address: Ipv4Addr,
    config: NodeConfig,
    boots: u32,
    kubelet_starts: u32,
    // Dropped in this order: the processes, then their namespaces and cgroup.
    kubelet: Option<Managed>,
    proxy: Option<Managed>,
    containerd: Option<Managed>,
    sandbox: Option<Sandbox>,
    disk: TempDir,
}

impl Node {
    /// Boots node `config.index` in its network namespace (already made by `network::HostNetwork::add_node`),
    /// imports `images` (and the pause image), and waits until it is Ready on `plane`.
    pub async fn start(
        plane: &ControlPlane,
        config: NodeConfig,
        images: &[Image],
    ) -> Result<Self, NodeError> {
        let disk = tempfile::Builder::new()
            .prefix(&format!("rdu-{}-", node_name(config.index)))
            .tempdir()?;
        let mut node = Self {
            index: config.index,
            name: node_name(config.index),
            address: network::node_address(config.index),
            config,
            boots: 0,
            kubelet_starts: 0,
            kubelet: None,
            proxy: None,
            containerd: None,
            sandbox: None,
            disk,
        };
        node.start_processes(images).await?;
        node.wait_ready(plane).await?;
        Ok(node)
    }

    /// Boots the node again after [`Node::crash`]: the same disk (images, the kubelet's certificates and state),
    /// new namespaces and processes. Its link must be up again (`HostNetwork::set_link`).
    pub async fn reboot(&mut self, plane: &ControlPlane) -> Result<(), NodeError> {
        self.stop();
        self.start_processes(&[]).await?;
        self.wait_ready(plane).await
    }

    async fn start_processes(&mut self, images: &[Image]) -> Result<(), NodeError> {
        self.boots += 1;
        let binds: Vec<Bind> = BOUND
            .iter()
            .map(|target| Bind {
                source: self.disk_path(target),
                target: PathBuf::from(target),
            })
            .collect();
        let sandbox = Sandbox::start(
            &self.name,
            &network::netns_path(self.index),
            &binds,
            self.disk.path(),
        )?;
        self.sandbox = Some(sandbox);
        self.start_containerd().await?;
        if self.boots == 1 {
            let sandbox = self.sandbox.as_ref().expect("booted");
            let pause_tag = PAUSE_IMAGE
                .rsplit_once(':')
                .map_or("latest", |(_, tag)| tag);
            let pause = image::pause_image(
                &self.config.bins.pause,
                pause_tag,
                &self.disk.path().join("images"),
            )?;
            containerd::import(sandbox, &pause, PAUSE_IMAGE)?;
            for image in images {
                containerd::import(sandbox, &image.tar, &containerd::normalized(&image.name))?;
            }
        }
        let config_file = self.disk.path().join("kubelet-config.yaml");
        std::fs::write(
            &config_file,
            kubelet::config(
                self.address,
                &self.config.client_ca,
                &containerd::endpoint(),
                network::control_plane_address(),
                self.config.reserved,
            ),
        )?;
        self.start_kubelet()?;
        let sandbox = self.sandbox.as_ref().expect("booted");
        let mut proxy = sandbox.command(&self.config.bins.kube_proxy);
        proxy.args(services::kube_proxy_args(
            &self.config.admin_kubeconfig,
            &self.name,
            network::CLUSTER_POD_CIDR,
        ));
        self.proxy = Some(Managed::spawn(
            &self.log_name("kube-proxy", self.boots),
            proxy,
            self.disk.path(),
        )?);
        Ok(())
    }

    /// Where node path `target` (e.g. `/var/lib/kubelet`) lives on the node's disk.
    pub fn disk_path(&self, target: &str) -> PathBuf {
        self.disk
            .path()
            .join("disk")
            .join(target.trim_start_matches('/'))
    }

    fn log_name(&self, process: &str, nth: u32) -> String {
        match nth {
            1 => process.to_string(),
            n => format!("{process}-{n}"),
        }
    }

    async fn start_containerd(&mut self) -> Result<(), NodeError> {
        let config = self.disk.path().join("containerd.toml");
        std::fs::write(&config, containerd::config(PAUSE_IMAGE))?;
        let cni = self.disk_path(containerd::CNI_CONF_DIR);
        std::fs::create_dir_all(&cni)?;
        std::fs::write(
            cni.join("10-rdu-e2e.conflist"),
            network::cni_conflist(self.index),
        )?;
        let sandbox = self.sandbox.as_ref().expect("booted");
        let mut command = sandbox.command("containerd");
        command.arg("--config").arg(&config);
        self.containerd = Some(Managed::spawn(
            &self.log_name("containerd", self.boots),
            command,
            self.disk.path(),
        )?);
        let sandbox = self.sandbox.as_ref().expect("booted");
        let containerd = self.containerd.as_mut().expect("just started");
        poll_until("containerd to answer", CONTAINERD_TIMEOUT, || {
            let dead = containerd.exited();
            let answer = containerd::answers(sandbox);
            async move {
                match dead {
                    Some(dead) => Ok(Err(dead)),
                    None => answer.map(Ok),
                }
            }
        })
        .await?
        .map_err(NodeError::Command)
    }

    fn start_kubelet(&mut self) -> Result<(), NodeError> {
        self.kubelet_starts += 1;
        let sandbox = self.sandbox.as_ref().expect("booted");
        let mut command = sandbox.command(&self.config.bins.kubelet);
        command.args(kubelet::args(
            &self.disk.path().join("kubelet-config.yaml"),
            &self.config.kubelet_kubeconfig,
            &self.name,
            self.address,
        ));
        self.kubelet = Some(Managed::spawn(
            &self.log_name("kubelet", self.kubelet_starts),
            command,
            self.disk.path(),
        )?);
        Ok(())
    }

    /// Stops the kubelet and starts it again (its log goes to `kubelet-<n>.log`); pods keep running.
    pub fn restart_kubelet(&mut self) -> Result<(), NodeError> {
        self.kubelet.take();
        self.start_kubelet()
    }

    /// Every process of the node killed at once (containers too), as a power cut does. Take the link down first
    /// (`HostNetwork::set_link`) for a crash that the peers see only as silence.
    pub fn crash(&mut self) -> Result<(), NodeError> {
        let killed = match self.sandbox.as_mut() {
            Some(sandbox) => sandbox.kill_all(),
            None => Ok(()),
        };
        self.stop();
        killed
    }

    /// Drops the process handles and the namespaces (what is still running is killed).
    fn stop(&mut self) {
        self.kubelet.take();
        self.proxy.take();
        self.containerd.take();
        self.sandbox.take();
    }

    async fn wait_ready(&mut self, plane: &ControlPlane) -> Result<(), NodeError> {
        let nodes: Api<NodeObject> = Api::all(plane.admin_client().await?);
        let name = self.name.clone();
        poll_until(&format!("node {name} to be Ready"), READY_TIMEOUT, || {
            let dead = self.dead_process();
            let nodes = nodes.clone();
            let name = name.clone();
            async move {
                if let Some(dead) = dead {
                    return Ok(Err(dead));
                }
                let node = nodes.get(&name).await.map_err(|e| e.to_string())?;
                let ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == "Ready");
                match ready {
                    Some(c) if c.status == "True" => Ok(Ok(())),
                    other => Err(format!("Ready condition: {other:?}")),
                }
            }
        })
        .await?
        .map_err(NodeError::Command)?;
        self.check_kubelet_root_not_rebound()
    }

    /// The kubelet binds its root over itself at start when it finds it not shared, concurrently with moving its
    /// pod-resources socket into place, which then fails once in many boots (EXDEV). The node binds it shared so
    /// the kubelet has no reason to; a second mount there means that stopped holding.
    fn check_kubelet_root_not_rebound(&self) -> Result<(), NodeError> {
        let sandbox = self.sandbox.as_ref().expect("booted");
        match sandbox.mounts_at(Path::new(kubelet::ROOT))? {
            1 => Ok(()),
            n => Err(NodeError::Command(format!(
                "{n} mounts at {}, expected the node's one shared bind (the kubelet re-binds it when it is not \
                 shared)",
                kubelet::ROOT
            ))),
        }
    }

    /// `program` run inside the node (its namespaces and cgroup).
    pub fn command(&self, program: &str) -> Option<Command> {
        self.sandbox.as_ref().map(|s| s.command(program))
    }

    /// The host PID of a running container, from its status's `containerID` (`containerd://<id>`).
    pub fn container_pid(&self, container_id: &str) -> Result<Option<u32>, NodeError> {
        let id = container_id
            .strip_prefix("containerd://")
            .unwrap_or(container_id);
        let sandbox = self
            .sandbox
            .as_ref()
            .ok_or_else(|| NodeError::Command(format!("node {} is down", self.name)))?;
        containerd::task_pid(sandbox, id)
    }

    /// `Some(description)` for the first of the node's processes that exited.
    pub fn dead_process(&mut self) -> Option<String> {
        let managed = self
            .containerd
            .iter_mut()
            .chain(self.kubelet.iter_mut())
            .chain(self.proxy.iter_mut());
        managed.into_iter().find_map(Managed::exited)
    }

    /// The last lines of one of the node's current logs (`containerd`, `kubelet`, `kube-proxy`).
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let process = match name {
            "containerd" => self.containerd.as_ref(),
            "kubelet" => self.kubelet.as_ref(),
            "kube-proxy" => self.proxy.as_ref(),
            _ => None,
        };
        process.map(|p| p.log_tail(lines)).unwrap_or_default()
    }

    /// The node's directory (logs, its disk).
    pub fn dir(&self) -> &Path {
        self.disk.path()
    }

    /// Whether the node's processes run (it was not crashed, or was rebooted).
    pub fn is_up(&self) -> bool {
        self.sandbox.is_some()
    }
}

/// Removes the cgroups of nodes a killed earlier run left behind (their processes are killed first).
pub fn sweep() {
    cgroups::sweep(CGROUP_PREFIX);
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(sandbox) = self.sandbox.as_mut() {
            let _ = sandbox.kill_all();
        }
        self.stop();
        if std::env::var_os("RDU_E2E_KEEP").is_some() {
            let kept =
                std::mem::replace(&mut self.disk, tempfile::tempdir().expect("tempdir")).keep();
            eprintln!(
                "RDU_E2E_KEEP: node {} files kept in {}",
                self.name,
                kept.display()
            );
        }
    }
}
