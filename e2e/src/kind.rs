//! A kind cluster for the tests with real pods: `kind create cluster` on podman or docker, from the node image
//! `RDU_KIND_NODE_IMAGE` (CI's offline one, `e2e/kind/offline/prepare.sh`) or kind's default; images loaded
//! from the engine's storage; a node's faults made on its container (kill, start, network disconnect and
//! connect with its old address, `systemctl` and `ctr` inside it). Deleted when dropped or interrupted.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

/// Env var naming the node image (`kind create cluster --image`); kind's default when unset.
pub const NODE_IMAGE_ENV: &str = "RDU_KIND_NODE_IMAGE";
/// The container network kind puts its nodes on.
const NETWORK: &str = "kind";
/// A node's pod logs, which each worker keeps in a host directory of its own (`KindSpec::logs`).
const LOG_DIR: &str = "/var/log/pods";

/// Clusters to delete if the test process is interrupted (drops do not run then).
static LIVE: Mutex<Vec<(Engine, String)>> = Mutex::new(Vec::new());

/// Errors of kind and the container engine.
#[derive(Debug, thiserror::Error)]
pub enum KindError {
    #[error("cannot run {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed: {stderr}")]
    Failed { command: String, stderr: String },
    #[error("{0}")]
    Missing(String),
    #[error("io")]
    Io(#[from] std::io::Error),
}

/// The container engine kind runs its nodes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Podman,
    Docker,
}

impl Engine {
    /// As `e2e/kind/run.sh` picks it: `KIND_EXPERIMENTAL_PROVIDER` when set, docker when it answers, podman
    /// otherwise.
    pub fn detect() -> Self {
        match std::env::var("KIND_EXPERIMENTAL_PROVIDER").as_deref() {
            Ok("podman") => return Self::Podman,
            Ok("docker") => return Self::Docker,
            _ => {}
        }
        let docker_answers = Command::new("docker")
            .arg("info")
            .output()
            .is_ok_and(|o| o.status.success());
        if docker_answers {
            Self::Docker
        } else {
            Self::Podman
        }
    }

    /// The engine's command.
    pub fn program(self) -> &'static str {
        match self {
            Self::Podman => "podman",
            Self::Docker => "docker",
        }
    }
}

/// What the cluster is made of.
#[derive(Debug, Clone)]
pub struct KindSpec {
    /// The cluster's name (its nodes are `<name>-control-plane`, `<name>-worker`, `<name>-worker2`, …).
    pub name: String,
    /// Worker nodes, each labelled `rdu.dev/simulated=true` (1..=9).
    pub workers: u8,
    /// A host directory every worker sees at the same path.
    pub shared: PathBuf,
    /// A host directory under which worker `<node>`'s `/var/log/pods` lives (`<logs>/<node>`), so that its pods'
    /// logs stay readable when the node is down.
    pub logs: PathBuf,
}

/// Every node's kubelet caps its crash back-off at 10 s (`crashLoopBackOff.maxContainerRestartPeriod`, behind the
/// `KubeletCrashLoopBackOffMax` gate, KEP-4603; GKE offers the same setting). The fault tests restart etcd, the
/// scheduler and the API server every few minutes, and the scheduler, the controller manager and the operator end
/// themselves when their lease lapses while the API server is away: with the default back-off (doubling up to
/// 5 minutes, reset only after 10 quiet minutes) a soak left pods unscheduled for minutes after every third fault.
const KUBELET_BACK_OFF_PATCH: &str = "kubeadmConfigPatches:\n  - |\n    kind: KubeletConfiguration\n    \
     featureGates:\n      KubeletCrashLoopBackOffMax: true\n    crashLoopBackOff:\n      \
     maxContainerRestartPeriod: 10s\n";

/// kind's cluster configuration for `spec`.
pub fn config(spec: &KindSpec) -> String {
    let mut text = format!(
        "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\n{KUBELET_BACK_OFF_PATCH}nodes:\n  - role: control-plane\n",
    );
    for index in 1..=spec.workers {
        let node = worker_name(&spec.name, index);
        text.push_str(&format!(
            "  - role: worker\n    labels:\n      rdu.dev/simulated: \"true\"\n    extraMounts:\n\
             \x20     - {{hostPath: {shared}, containerPath: {shared}}}\n\
             \x20     - {{hostPath: {logs}, containerPath: {LOG_DIR}}}\n",
            shared = spec.shared.display(),
            logs = spec.logs.join(&node).display(),
        ));
    }
    text
}

/// The name kind gives worker `index` (1-based) of cluster `cluster`.
pub fn worker_name(cluster: &str, index: u8) -> String {
    if index == 1 {
        format!("{cluster}-worker")
    } else {
        format!("{cluster}-worker{index}")
    }
}

/// A kind cluster this process created.
pub struct Kind {
    pub name: String,
    pub engine: Engine,
    /// The admin kubeconfig kind wrote (server `https://127.0.0.1:<port>`).
    pub kubeconfig: PathBuf,
    /// The workers' node names, in order.
    pub workers: Vec<String>,
    /// Each worker's address on kind's network, to connect it again with the same one after a partition.
    addresses: Vec<String>,
    logs: PathBuf,
}

impl Kind {
    /// Creates the cluster (deleting one of the same name an earlier run left) and waits until every node is
    /// Ready; the kubeconfig goes to `dir`.
    pub fn create(spec: &KindSpec, dir: &Path) -> Result<Self, KindError> {
        let engine = Engine::detect();
        let kind = which("kind")?;
        let clusters = output(Command::new(&kind).args(["get", "clusters"]))?;
        if clusters.lines().any(|l| l.trim() == spec.name) {
            eprintln!(
                "deleting kind cluster {}, left by an earlier run",
                spec.name
            );
            delete(engine, &spec.name);
        }
        std::fs::create_dir_all(&spec.shared)?;
        let workers: Vec<String> = (1..=spec.workers)
            .map(|i| worker_name(&spec.name, i))
            .collect();
        for node in &workers {
            std::fs::create_dir_all(spec.logs.join(node))?;
        }
        let config_path = dir.join("kind.yaml");
        std::fs::write(&config_path, config(spec))?;
        let kubeconfig = dir.join("admin.kubeconfig");
        if let Ok(mut live) = LIVE.lock() {
            live.push((engine, spec.name.clone()));
        }
        crate::process::on_interrupt(sweep);
        let mut create = Command::new(&kind);
        create
            .args(["create", "cluster", "--name", &spec.name, "--wait", "300s"])
            .arg("--config")
            .arg(&config_path)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env("KIND_EXPERIMENTAL_PROVIDER", engine.program());
        if let Some(image) = std::env::var_os(NODE_IMAGE_ENV) {
            create.arg("--image").arg(image);
        }
        let mut cluster = Self {
            name: spec.name.clone(),
            engine,
            kubeconfig,
            workers,
            addresses: Vec::new(),
            logs: spec.logs.clone(),
        };
        output(&mut create)?;
        for node in &cluster.workers {
            cluster.addresses.push(cluster.address(node)?);
        }
        Ok(cluster)
    }

    /// Loads image `name` (as the chart names it, e.g. `rdu-worker:0.1.0`) from the engine's storage into every
    /// node. podman stores a local build as `localhost/<name>`, which the nodes' containerd would not match
    /// with the chart's `<name>` (read as `docker.io/library/<name>`): it is saved under that name.
    pub fn load_image(&self, name: &str, scratch: &Path) -> Result<(), KindError> {
        let kind = which("kind")?;
        let mut check = self.engine_command();
        check.args(["image", "inspect", "--format", "{{.Id}}", name]);
        output(&mut check).map_err(|_| {
            KindError::Missing(format!(
                "image {name} is not in {}'s storage: build it with `bash docker/build.sh`",
                self.engine.program()
            ))
        })?;
        match self.engine {
            Engine::Docker => {
                output(Command::new(&kind).args([
                    "load",
                    "docker-image",
                    name,
                    "--name",
                    &self.name,
                ]))?;
            }
            Engine::Podman => {
                let qualified = format!("docker.io/library/{name}");
                output(self.engine_command().args(["tag", name, &qualified]))?;
                let archive = scratch.join("image.tar");
                let archive_arg = archive.display().to_string();
                output(self.engine_command().args([
                    "save",
                    "--quiet",
                    "--format",
                    "docker-archive",
                    "-o",
                    &archive_arg,
                    &qualified,
                ]))?;
                let loaded = output(Command::new(&kind).args([
                    "load",
                    "image-archive",
                    &archive_arg,
                    "--name",
                    &self.name,
                ]));
                std::fs::remove_file(&archive)?;
                loaded?;
            }
        }
        Ok(())
    }

    /// Kills node `node`'s container: every process of the node dies at once (a crash).
    pub fn kill(&self, node: &str) -> Result<(), KindError> {
        output(self.engine_command().args(["kill", node])).map(drop)
    }

    /// Starts node `node`'s container again on the same disk and with the same address (a reboot after a crash).
    /// Started as it is, the engine may give it another address on kind's network while its Node object, its
    /// kubelet (`--node-ip`) and its peers' routes to its pods keep the old one: pods elsewhere could no longer
    /// reach the pods on it. So it is taken off the network and put back with its address before it starts.
    pub fn start(&self, node: &str) -> Result<(), KindError> {
        self.set_connected(node, false)?;
        self.set_connected(node, true)?;
        output(self.engine_command().args(["start", node])).map(drop)
    }

    /// Takes node `node` off kind's network (`connected` false: a partition) or puts it back with the address
    /// it had, so that its Node object, its pods and its peers still name the right one.
    pub fn set_connected(&self, node: &str, connected: bool) -> Result<(), KindError> {
        if !connected {
            return output(
                self.engine_command()
                    .args(["network", "disconnect", NETWORK, node]),
            )
            .map(drop);
        }
        let index = self
            .workers
            .iter()
            .position(|w| w == node)
            .ok_or_else(|| KindError::Missing(format!("no worker called {node}")))?;
        let address = &self.addresses[index];
        output(
            self.engine_command()
                .args(["network", "connect", "--ip", address, NETWORK, node]),
        )
        .map(drop)
    }

    /// Runs `args` inside node `node` (`exec`); its stdout.
    pub fn exec(&self, node: &str, args: &[&str]) -> Result<String, KindError> {
        output(self.engine_command().arg("exec").arg(node).args(args))
    }

    /// Where worker `node`'s `/var/log/pods` is on the host.
    pub fn pod_logs(&self, node: &str) -> PathBuf {
        self.logs.join(node)
    }

    /// The last `lines` of a systemd unit's journal on `node` (for failure messages).
    pub fn journal_tail(&self, node: &str, unit: &str, lines: usize) -> String {
        let lines = lines.to_string();
        self.exec(
            node,
            &[
                "journalctl",
                "-u",
                unit,
                "--no-pager",
                "-o",
                "cat",
                "-n",
                &lines,
            ],
        )
        .unwrap_or_else(|e| format!("({})", rdu_error_chain::Chain(&e)))
    }

    fn address(&self, node: &str) -> Result<String, KindError> {
        let format = format!("{{{{(index .NetworkSettings.Networks \"{NETWORK}\").IPAddress}}}}");
        let address = output(
            self.engine_command()
                .args(["inspect", "--format", &format, node]),
        )?;
        let address = address.trim().to_string();
        if address.is_empty() {
            Err(KindError::Missing(format!(
                "{node} has no address on the {NETWORK} network"
            )))
        } else {
            Ok(address)
        }
    }

    fn engine_command(&self) -> Command {
        Command::new(self.engine.program())
    }
}

impl Drop for Kind {
    fn drop(&mut self) {
        if std::env::var_os("RDU_E2E_KEEP").is_some() {
            eprintln!(
                "RDU_E2E_KEEP: kind cluster {} kept (kind delete cluster --name {}); kubeconfig {}",
                self.name,
                self.name,
                self.kubeconfig.display()
            );
            return;
        }
        delete(self.engine, &self.name);
        if let Ok(mut live) = LIVE.lock() {
            live.retain(|(_, name)| *name != self.name);
        }
    }
}

/// Deletes every cluster this process created (the interruption handler's step).
fn sweep() {
    let live: Vec<(Engine, String)> = LIVE.lock().map(|l| l.clone()).unwrap_or_default();
    for (engine, name) in live {
        delete(engine, &name);
    }
}

fn delete(engine: Engine, name: &str) {
    let deleted = Command::new("kind")
        .args(["delete", "cluster", "--name", name])
        .env("KIND_EXPERIMENTAL_PROVIDER", engine.program())
        .output();
    if let Ok(out) = deleted
        && !out.status.success()
    {
        eprintln!(
            "kind delete cluster --name {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `program` on PATH, or an error naming what provides it.
fn which(program: &str) -> Result<PathBuf, KindError> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            KindError::Missing(format!(
                "{program} is not on PATH: install kind (go install sigs.k8s.io/kind@v0.33.0), or run the \
                 test through its script (bash e2e/multi-node/run.sh), which builds it"
            ))
        })
}

/// Runs `command`; its stdout, or an error with its stderr.
fn output(command: &mut Command) -> Result<String, KindError> {
    let program = command.get_program().to_string_lossy().into_owned();
    let out: Output = command.output().map_err(|source| KindError::Spawn {
        program: program.clone(),
        source,
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let args: Vec<String> = command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        Err(KindError::Failed {
            command: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_are_named_as_kind_names_them() {
        assert_eq!(worker_name("rdu", 1), "rdu-worker");
        assert_eq!(worker_name("rdu", 3), "rdu-worker3");
    }

    #[test]
    fn every_worker_mounts_the_shared_directory_and_its_own_pod_logs() {
        let spec = KindSpec {
            name: "c".into(),
            workers: 2,
            shared: "/tmp/shared".into(),
            logs: "/tmp/logs".into(),
        };
        let parsed: serde_json::Value = serde_yaml_ng::from_str(&config(&spec)).expect("YAML");
        let patch: serde_json::Value = serde_yaml_ng::from_str(
            parsed["kubeadmConfigPatches"][0]
                .as_str()
                .expect("a kubelet patch"),
        )
        .expect("the patch is YAML");
        assert_eq!(patch["kind"], "KubeletConfiguration");
        assert_eq!(patch["featureGates"]["KubeletCrashLoopBackOffMax"], true);
        assert_eq!(
            patch["crashLoopBackOff"]["maxContainerRestartPeriod"],
            "10s"
        );
        let nodes = parsed["nodes"].as_array().expect("nodes");
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0]["role"], "control-plane");
        assert!(nodes[0].get("extraMounts").is_none());
        for (node, name) in nodes[1..].iter().zip(["c-worker", "c-worker2"]) {
            assert_eq!(node["role"], "worker");
            assert_eq!(node["labels"]["rdu.dev/simulated"], "true");
            let mounts = node["extraMounts"].as_array().expect("extraMounts");
            assert_eq!(mounts[0]["hostPath"], "/tmp/shared");
            assert_eq!(mounts[0]["containerPath"], "/tmp/shared");
            assert_eq!(mounts[1]["hostPath"], format!("/tmp/logs/{name}"));
            assert_eq!(mounts[1]["containerPath"], LOG_DIR);
        }
    }
}
