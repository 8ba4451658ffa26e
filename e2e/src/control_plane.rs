//! A real control plane in a temporary directory: etcd + kube-apiserver on free loopback ports with
//! RBAC and Node authorization, a static admin token, service-account signing keys, and optionally
//! kube-scheduler and kube-controller-manager. Everything is killed when it is dropped.

use crate::assets::Assets;
use crate::kubeconfig;
use crate::pki::{self, PkiError};
use crate::poll::{PollError, poll_until};
use crate::ports::free_port;
use crate::process::Managed;
use rdu_crds::token::new_token;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use tempfile::TempDir;

/// How long the API server may take to become ready (it runs its post-start hooks first).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// The admin user's group: unrestricted, like kubeadm's admin.conf.
const ADMIN_GROUP: &str = "system:masters";

/// Errors starting the control plane.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error("temporary directory or process")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Client(#[from] kubeconfig::ClientError),
    #[error(transparent)]
    NotReady(#[from] PollError),
    #[error(transparent)]
    Token(#[from] rdu_crds::token::TokenError),
    #[error("kubeconfig {path}: {problem}")]
    Kubeconfig { path: String, problem: String },
}

/// Which optional components run beside etcd and kube-apiserver.
#[derive(Debug, Clone, Default)]
pub struct Components {
    /// kube-scheduler: binds pods to Nodes.
    pub scheduler: bool,
    /// kube-controller-manager with the garbage collector, the ServiceAccount controller, the
    /// ValidatingAdmissionPolicy status controller (which type-checks policies) and the ClusterRole aggregation
    /// controller (which fills the built-in admin, edit and view roles).
    pub controller_manager: bool,
}

/// A running control plane.
pub struct ControlPlane {
    /// Address of the API server, `https://127.0.0.1:<port>`.
    pub server: String,
    /// Admin kubeconfig (system:masters).
    pub admin_kubeconfig: PathBuf,
    /// CA of the API server's serving certificate.
    pub ca_cert: PathBuf,
    processes: Vec<Managed>,
    dir: TempDir,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver, waits for /readyz, then the optional components.
    pub async fn start(assets: &Assets, components: Components) -> Result<Self, ControlPlaneError> {
        let dir = tempfile::Builder::new().prefix("rdu-e2e-").tempdir()?;
        let root = dir.path().to_path_buf();
        let pki = pki::generate(&root)?;
        let admin_token = new_token()?;
        let tokens = format!("{admin_token},admin,admin,\"{ADMIN_GROUP}\"\n");
        std::fs::write(root.join("tokens.csv"), tokens)?;

        let etcd_port = free_port()?;
        let etcd_peer_port = free_port()?;
        let api_port = free_port()?;
        let api_address = Ipv4Addr::LOCALHOST;
        let server = format!("https://{api_address}:{api_port}");
        let admin_kubeconfig = root.join("admin.kubeconfig");
        std::fs::write(
            &admin_kubeconfig,
            kubeconfig::render(&server, &pki.ca_cert, "admin", &admin_token, "default"),
        )?;

        let mut processes = Vec::new();
        let mut etcd = Command::new(&assets.etcd);
        etcd.arg(format!("--data-dir={}", root.join("etcd").display()))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{etcd_port}"
            ))
            .arg(format!(
                "--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}"
            ))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}"
            ))
            .arg(format!(
                "--initial-cluster=default=http://127.0.0.1:{etcd_peer_port}"
            ))
            .arg("--unsafe-no-fsync")
            .arg("--log-level=warn");
        processes.push(Managed::spawn("etcd", etcd, &root)?);

        let mut apiserver = Command::new(&assets.kube_apiserver);
        apiserver
            .arg(format!("--etcd-servers=http://127.0.0.1:{etcd_port}"))
            .arg(format!("--bind-address={api_address}"))
            .arg(format!("--advertise-address={api_address}"))
            .arg(format!("--secure-port={api_port}"))
            .arg(format!(
                "--cert-dir={}",
                root.join("apiserver-certs").display()
            ))
            .arg(format!("--tls-cert-file={}", pki.serving_cert.display()))
            .arg(format!(
                "--tls-private-key-file={}",
                pki.serving_key.display()
            ))
            .arg(format!("--client-ca-file={}", pki.ca_cert.display()))
            .arg(format!(
                "--token-auth-file={}",
                root.join("tokens.csv").display()
            ))
            .arg("--authorization-mode=RBAC,Node")
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!(
                "--service-account-key-file={}",
                pki.service_account_pub.display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                pki.service_account_key.display()
            ))
            .arg("--allow-privileged=true")
            .arg("--v=1");
        processes.push(Managed::spawn("kube-apiserver", apiserver, &root)?);

        let mut plane = Self {
            server,
            admin_kubeconfig,
            ca_cert: pki.ca_cert,
            processes,
            dir,
        };
        plane.wait_ready().await?;

        if components.scheduler {
            let port = free_port()?;
            let mut scheduler = Command::new(&assets.kube_scheduler);
            scheduler
                .arg(format!("--kubeconfig={}", plane.admin_kubeconfig.display()))
                .arg("--leader-elect=false")
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={port}"))
                .arg(format!(
                    "--cert-dir={}",
                    root.join("scheduler-certs").display()
                ));
            plane
                .processes
                .push(Managed::spawn("kube-scheduler", scheduler, &root)?);
        }
        if components.controller_manager {
            let port = free_port()?;
            let mut kcm = Command::new(&assets.kube_controller_manager);
            kcm.arg(format!("--kubeconfig={}", plane.admin_kubeconfig.display()))
                .arg("--leader-elect=false")
                .arg(
                    "--controllers=garbage-collector-controller,serviceaccount-controller,\
                     validatingadmissionpolicy-status-controller,clusterrole-aggregation-controller",
                )
                .arg(format!("--root-ca-file={}", plane.ca_cert.display()))
                .arg("--use-service-account-credentials=false")
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={port}"))
                .arg(format!("--cert-dir={}", root.join("kcm-certs").display()));
            plane
                .processes
                .push(Managed::spawn("kube-controller-manager", kcm, &root)?);
        }
        Ok(plane)
    }

    /// Polls /readyz until the API server answers ok, failing early if a process died.
    async fn wait_ready(&mut self) -> Result<(), ControlPlaneError> {
        let client = self.admin_client().await?;
        let processes = &mut self.processes;
        let outcome = poll_until("kube-apiserver /readyz", READY_TIMEOUT, || {
            let dead = processes.iter_mut().find_map(|p| p.exited());
            let client = client.clone();
            async move {
                if let Some(dead) = dead {
                    return Ok(Err(dead));
                }
                let request = http::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|e| e.to_string())?;
                match client.request_text(request).await {
                    Ok(body) if body.trim() == "ok" => Ok(Ok(())),
                    Ok(body) => Err(body),
                    Err(e) => Err(e.to_string()),
                }
            }
        })
        .await?;
        outcome.map_err(|dead| {
            ControlPlaneError::NotReady(PollError {
                what: "kube-apiserver /readyz".into(),
                waited: Duration::ZERO,
                last: dead,
            })
        })
    }

    /// An API server this process did not start (a kind cluster's), known by its admin kubeconfig: the server
    /// and CA are read from it. Processes spawned beside it (Kueue's manager) are still this value's to stop.
    pub fn attach(admin_kubeconfig: PathBuf) -> Result<Self, ControlPlaneError> {
        use base64::Engine as _;
        let bad = |problem: String| ControlPlaneError::Kubeconfig {
            path: admin_kubeconfig.display().to_string(),
            problem,
        };
        let config = kube::config::Kubeconfig::read_from(&admin_kubeconfig)
            .map_err(|e| bad(e.to_string()))?;
        let cluster = config
            .clusters
            .first()
            .and_then(|c| c.cluster.as_ref())
            .ok_or_else(|| bad("no cluster".into()))?;
        let server = cluster
            .server
            .clone()
            .ok_or_else(|| bad("no server".into()))?;
        let ca = cluster
            .certificate_authority_data
            .as_deref()
            .ok_or_else(|| bad("no certificate-authority-data".into()))?;
        let ca = base64::engine::general_purpose::STANDARD
            .decode(ca.trim())
            .map_err(|e| {
                bad(format!(
                    "certificate-authority-data: {}",
                    rdu_error_chain::Chain(&e)
                ))
            })?;
        let dir = tempfile::Builder::new().prefix("rdu-e2e-").tempdir()?;
        let ca_cert = dir.path().join("ca.crt");
        std::fs::write(&ca_cert, ca)?;
        Ok(Self {
            server,
            admin_kubeconfig,
            ca_cert,
            processes: Vec::new(),
            dir,
        })
    }

    /// A client authenticated as the admin.
    pub async fn admin_client(&self) -> Result<kube::Client, kubeconfig::ClientError> {
        kubeconfig::client(&self.admin_kubeconfig).await
    }

    /// Writes a kubeconfig for a bearer token (e.g. a ServiceAccount's) and returns its path.
    pub fn write_kubeconfig(
        &self,
        name: &str,
        user: &str,
        token: &str,
        namespace: &str,
    ) -> std::io::Result<PathBuf> {
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        std::fs::write(
            &path,
            kubeconfig::render(&self.server, &self.ca_cert, user, token, namespace),
        )?;
        Ok(path)
    }

    /// The temporary directory (logs of every process are there).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Starts another process whose log goes beside the control plane's; killed with the control plane.
    pub fn spawn(&mut self, name: &str, command: Command) -> std::io::Result<u32> {
        let process = Managed::spawn(name, command, self.dir.path())?;
        let pid = process.id();
        self.processes.push(process);
        Ok(pid)
    }

    /// Kills process `name` started by [`ControlPlane::spawn`] and forgets it (its log stays); false when no
    /// such process runs.
    pub fn stop(&mut self, name: &str) -> bool {
        match self.processes.iter().position(|p| p.name == name) {
            Some(index) => {
                drop(self.processes.remove(index));
                true
            }
            None => false,
        }
    }

    /// `Some(description)` for the first managed process that exited.
    pub fn dead_process(&mut self) -> Option<String> {
        self.processes.iter_mut().find_map(|p| p.exited())
    }

    /// The last lines of one process's log (for failure messages).
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        self.processes
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.log_tail(lines))
            .unwrap_or_default()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Stop the clients of the API server first, etcd last.
        while let Some(process) = self.processes.pop() {
            drop(process);
        }
        if std::env::var_os("RDU_E2E_KEEP").is_some() {
            let kept =
                std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir")).keep();
            eprintln!(
                "RDU_E2E_KEEP: control-plane files kept in {}",
                kept.display()
            );
        }
    }
}
