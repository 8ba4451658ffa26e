//! A real Kubernetes node for the e2e tests, on this machine, without Docker or a registry: its own
//! containerd (runc, CNI bridge), a kubelet registered with the test control plane, kube-proxy and CoreDNS
//! as host processes, and images assembled from the Dockerfiles and imported into containerd.
//!
//! Binaries come from `e2e/node/build.sh` through `RDU_E2E_NODE_BIN`; Debian's containerd, runc,
//! containernetworking-plugins, umoci and iptables must be installed, and the tests run as root. Without
//! them a test skips, unless `RDU_REQUIRE_NODE=1` (CI). Every process, mount, bridge, route and rule the
//! node made is removed when it is dropped, also when a test fails.

pub mod containerd;
pub mod kubelet;
pub mod network;
pub mod services;
mod teardown;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Api;
use tempfile::TempDir;

use crate::assets::{Assets, assets_or_skip};
use crate::control_plane::{ControlPlane, NodeAccess};
use crate::image::{self, ImageError};
use crate::poll::{PollError, poll_until};
use crate::ports::free_port;
use crate::process::Managed;

/// The node's name.
pub const NODE_NAME: &str = "rdu-e2e-node";
/// Env var naming the directory of kubelet, kube-proxy, coredns, pause and cri-teardown.
pub const NODE_BIN_ENV: &str = "RDU_E2E_NODE_BIN";
/// Env var that turns a skip into a failure (CI sets it to 1).
pub const REQUIRE_NODE_ENV: &str = "RDU_REQUIRE_NODE";
/// The sandbox image the node's containerd runs every pod's network namespace in.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// How long the node may take to become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long containerd may take to answer.
const CONTAINERD_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors starting a node.
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

/// The node's binaries, from `e2e/node/build.sh`.
#[derive(Debug, Clone)]
pub struct NodeBins {
    pub kubelet: PathBuf,
    pub kube_proxy: PathBuf,
    pub coredns: PathBuf,
    pub pause: PathBuf,
    pub cri_teardown: PathBuf,
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
            cri_teardown: find("cri-teardown")?,
        })
    }
}

/// What this machine must have for a node: root, and Debian's packages.
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
        problems.push("a node needs root (containerd, the kubelet, CNI and iptables)".into());
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

/// The control plane's side of the node: bind and advertise the node's address, its Service CIDR.
pub fn access() -> NodeAccess {
    NodeAccess {
        address: network::node_address(),
        service_cidr: network::SERVICE_CIDR,
        name: NODE_NAME,
    }
}

/// The control-plane binaries and the node's, or `None` (the test skips) when something is missing,
/// unless `RDU_REQUIRE_NODE=1`, where it panics naming what is missing.
pub fn node_or_skip(test: &str) -> Option<(Assets, NodeBins)> {
    let assets = assets_or_skip(test)?;
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
    if problems.is_empty() {
        return bins.map(|b| (assets, b));
    }
    let text = problems.join("; ");
    if std::env::var(REQUIRE_NODE_ENV).as_deref() == Ok("1") {
        panic!("{test}: {REQUIRE_NODE_ENV}=1 but {text}");
    }
    eprintln!("{test}: skipped: {text}");
    None
}

/// An image to import: the tar of an OCI layout and the name pods use for it.
#[derive(Debug, Clone)]
pub struct Image {
    pub name: String,
    pub tar: PathBuf,
}

/// A running node.
pub struct Node {
    pub name: &'static str,
    pub address: Ipv4Addr,
    pub kubelet_paths: kubelet::Paths,
    containerd_paths: containerd::Paths,
    bins: NodeBins,
    kubelet_args: Vec<String>,
    kubelet_starts: u32,
    kubelet: Option<Managed>,
    services: Vec<Managed>,
    containerd: Option<Managed>,
    network: Option<network::Network>,
    /// The first missing ancestor of the device plugins' directory that the kubelet made (removed at the end).
    created_device_plugins_dir: Option<PathBuf>,
    dir: TempDir,
}

impl Node {
    /// Starts the node on `plane` (started with [`access`] after `network` was created), imports `images`,
    /// and waits until it is Ready. The node owns the network from then on.
    pub async fn start(
        plane: &ControlPlane,
        network: network::Network,
        bins: NodeBins,
        images: &[Image],
    ) -> Result<Self, NodeError> {
        let node_kubeconfig = plane.node_kubeconfig.clone().ok_or_else(|| {
            NodeError::Missing("the control plane was started without node access".into())
        })?;
        let dir = tempfile::Builder::new().prefix("rdu-node-").tempdir()?;
        let containerd_paths = containerd::Paths::under(dir.path());
        let kubelet_paths = kubelet::Paths::under(dir.path());
        let address = network::node_address();
        let mut node = Self {
            name: NODE_NAME,
            address,
            kubelet_paths,
            containerd_paths,
            bins,
            kubelet_args: Vec::new(),
            kubelet_starts: 0,
            kubelet: None,
            services: Vec::new(),
            containerd: None,
            network: Some(network),
            created_device_plugins_dir: None,
            dir,
        };
        node.created_device_plugins_dir =
            claim_device_plugins_dir(&node.kubelet_paths.device_plugins())?;
        node.start_containerd().await?;
        let pause_tag = PAUSE_IMAGE
            .rsplit_once(':')
            .map_or("latest", |(_, tag)| tag);
        let pause =
            image::pause_image(&node.bins.pause, pause_tag, &node.dir.path().join("images"))?;
        containerd::import(&node.containerd_paths, &pause, PAUSE_IMAGE)?;
        for image in images {
            containerd::import(
                &node.containerd_paths,
                &image.tar,
                &containerd::normalized(&image.name),
            )?;
        }

        let root = node.dir.path().to_path_buf();
        let ports = kubelet::Ports {
            api: free_port()?,
            healthz: free_port()?,
        };
        std::fs::create_dir_all(&node.kubelet_paths.root)?;
        std::fs::write(
            &node.kubelet_paths.config,
            kubelet::config(
                &node.kubelet_paths,
                address,
                ports,
                &plane.ca_cert,
                &node.containerd_paths.endpoint(),
                address,
            ),
        )?;
        node.kubelet_args =
            kubelet::args(&node.kubelet_paths, &node_kubeconfig, NODE_NAME, address);
        node.start_kubelet()?;

        let mut proxy = Command::new(&node.bins.kube_proxy);
        proxy.args(services::kube_proxy_args(
            &plane.admin_kubeconfig,
            NODE_NAME,
            network::POD_CIDR,
            free_port()?,
            free_port()?,
        ));
        node.services
            .push(Managed::spawn("kube-proxy", proxy, &root)?);
        let corefile = root.join("Corefile");
        std::fs::write(
            &corefile,
            services::corefile(address, &plane.admin_kubeconfig, "rdu-e2e"),
        )?;
        let mut dns = Command::new(&node.bins.coredns);
        dns.arg("-conf").arg(&corefile);
        node.services.push(Managed::spawn("coredns", dns, &root)?);

        node.wait_ready(plane).await?;
        Ok(node)
    }

    async fn start_containerd(&mut self) -> Result<(), NodeError> {
        let paths = &self.containerd_paths;
        for dir in [&paths.root, &paths.state, &paths.cni_conf_dir] {
            std::fs::create_dir_all(dir)?;
        }
        let config = self.dir.path().join("containerd.toml");
        std::fs::write(&config, containerd::config(paths, PAUSE_IMAGE))?;
        std::fs::write(
            paths.cni_conf_dir.join("10-rdu-e2e.conflist"),
            network::cni_conflist(&self.dir.path().join("cni/ipam")),
        )?;
        let mut command = Command::new("containerd");
        command.arg("--config").arg(&config);
        self.containerd = Some(Managed::spawn("containerd", command, self.dir.path())?);
        let paths = self.containerd_paths.clone();
        let containerd = self.containerd.as_mut().expect("just started");
        poll_until("containerd to answer", CONTAINERD_TIMEOUT, || {
            let dead = containerd.exited();
            let paths = paths.clone();
            async move {
                match dead {
                    Some(dead) => Ok(Err(dead)),
                    None => containerd::answers(&paths).map(Ok),
                }
            }
        })
        .await?
        .map_err(NodeError::Command)
    }

    fn start_kubelet(&mut self) -> Result<(), NodeError> {
        self.kubelet_starts += 1;
        let name = match self.kubelet_starts {
            1 => "kubelet".to_string(),
            n => format!("kubelet-{n}"),
        };
        let mut command = Command::new(&self.bins.kubelet);
        command.args(&self.kubelet_args);
        self.kubelet = Some(Managed::spawn(&name, command, self.dir.path())?);
        Ok(())
    }

    /// Stops the kubelet and starts it again (its log goes to `kubelet-<n>.log`); pods keep running.
    pub fn restart_kubelet(&mut self) -> Result<(), NodeError> {
        self.kubelet.take();
        self.start_kubelet()
    }

    async fn wait_ready(&mut self, plane: &ControlPlane) -> Result<(), NodeError> {
        let nodes: Api<NodeObject> = Api::all(plane.admin_client().await?);
        poll_until("the node to be Ready", READY_TIMEOUT, || {
            let dead = self.dead_process();
            let nodes = nodes.clone();
            async move {
                if let Some(dead) = dead {
                    return Ok(Err(dead));
                }
                let node = nodes.get(NODE_NAME).await.map_err(|e| e.to_string())?;
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
        .map_err(NodeError::Command)
    }

    /// The host PID of a running container, from its status's `containerID` (`containerd://<id>`).
    pub fn container_pid(&self, container_id: &str) -> Result<Option<u32>, NodeError> {
        let id = container_id
            .strip_prefix("containerd://")
            .unwrap_or(container_id);
        containerd::task_pid(&self.containerd_paths, id)
    }

    /// `Some(description)` for the first of the node's processes that exited.
    pub fn dead_process(&mut self) -> Option<String> {
        let managed = self
            .containerd
            .iter_mut()
            .chain(self.kubelet.iter_mut())
            .chain(self.services.iter_mut());
        managed.into_iter().find_map(Managed::exited)
    }

    /// The last lines of one of the node's logs (`containerd`, `kubelet`, `kube-proxy`, `coredns`).
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(format!("{name}.log")))
            .unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The node's directory (logs, containerd, kubelet root).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The kubelet's device plugins' directory is fixed, so two kubelets cannot share a machine: refuses when a
/// kubelet already answers there. Returns the first missing ancestor (the node removes it at the end).
fn claim_device_plugins_dir(dir: &Path) -> Result<Option<PathBuf>, NodeError> {
    let socket = dir.join("kubelet.sock");
    if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
        return Err(NodeError::Missing(format!(
            "a kubelet already serves {}: a test node needs the machine's device plugin directory to itself",
            socket.display()
        )));
    }
    let mut missing = None;
    let mut current = Some(dir);
    while let Some(path) = current {
        if path.exists() {
            break;
        }
        missing = Some(path.to_path_buf());
        current = path.parent();
    }
    Ok(missing)
}

impl Drop for Node {
    fn drop(&mut self) {
        // No kubelet to start pods again, then every sandbox stopped through the CRI (CNI DEL).
        self.kubelet.take();
        if self
            .containerd
            .as_mut()
            .is_some_and(|c| c.exited().is_none())
        {
            let out = Command::new(&self.bins.cri_teardown)
                .arg(self.containerd_paths.endpoint())
                .output();
            if let Ok(out) = out {
                eprintln!(
                    "node teardown: {}{}",
                    String::from_utf8_lossy(&out.stdout).trim(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        self.services.clear();
        let _ = Command::new(&self.bins.kube_proxy)
            .arg("--cleanup")
            .output();
        self.containerd.take();
        teardown::kill_processes_mentioning(&self.containerd_paths.socket.display().to_string());
        teardown::unmount_below(self.dir.path());
        teardown::remove_log_links(self.dir.path());
        self.network.take();
        if let Some(dir) = self.created_device_plugins_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
        if std::env::var_os("RDU_E2E_KEEP").is_some() {
            let kept =
                std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir")).keep();
            eprintln!("RDU_E2E_KEEP: node files kept in {}", kept.display());
        }
    }
}
