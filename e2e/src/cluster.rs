//! Steps the tests share on a running control plane: install the CRD, make a namespace ready for pods,
//! apply YAML with kubectl, log in as a ServiceAccount, and run the operator as the chart's ServiceAccount.

use crate::control_plane::ControlPlane;
use crate::poll::{PollError, poll_until};
use crate::tools::{ToolError, kubectl_in, workspace_root};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the API server may take to establish the CRD.
const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(60);

/// Errors of the shared steps.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error("kubectl {args}: {stderr}")]
    Kubectl { args: String, stderr: String },
    #[error("kube API")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Timeout(#[from] PollError),
    #[error("io")]
    Io(#[from] std::io::Error),
}

/// The generated CRD committed in the repository.
pub fn crd_path() -> PathBuf {
    workspace_root().join("crds/rdujob.yaml")
}

/// `kubectl <args>` as the admin; stdout on success, the stderr in the error otherwise.
pub fn kubectl(
    plane: &ControlPlane,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, ClusterError> {
    kubectl_as(&plane.admin_kubeconfig, args, stdin)
}

/// `kubectl <args>` with another kubeconfig.
pub fn kubectl_as(
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, ClusterError> {
    let out = kubectl_in(kubeconfig, args, stdin)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(ClusterError::Kubectl {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// Applies `crds/rdujob.yaml` and waits until the CRD is Established; returns the stored CRD.
pub async fn install_crd(plane: &ControlPlane) -> Result<CustomResourceDefinition, ClusterError> {
    let path = crd_path();
    kubectl(
        plane,
        &["apply", "--server-side", "-f", &path.display().to_string()],
        None,
    )?;
    let crds: Api<CustomResourceDefinition> =
        Api::all(plane.admin_client().await.map_err(client_error)?);
    let crd = poll_until("CRD rdujobs.rdu.dev Established", ESTABLISH_TIMEOUT, || {
        let crds = crds.clone();
        async move {
            let crd = crds
                .get("rdujobs.rdu.dev")
                .await
                .map_err(|e| e.to_string())?;
            let conditions = crd
                .status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default();
            let established = conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                Ok(crd)
            } else {
                Err(format!("conditions: {conditions:?}"))
            }
        }
    })
    .await?;
    // Discovery must serve the new resource before kubectl can use it.
    poll_until("kubectl to discover rdujobs", ESTABLISH_TIMEOUT, || async {
        kubectl(plane, &["get", "rdujobs", "-A"], None)
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await?;
    Ok(crd)
}

/// Creates `name` and its `default` ServiceAccount (what the ServiceAccount controller would do), so that
/// pods can be admitted at once.
pub async fn create_namespace(plane: &ControlPlane, name: &str) -> Result<(), ClusterError> {
    let client = plane.admin_client().await.map_err(client_error)?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(name.to_string());
    ignore_exists(namespaces.create(&PostParams::default(), &namespace).await)?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client, name);
    let mut account = ServiceAccount::default();
    account.metadata.name = Some("default".to_string());
    ignore_exists(accounts.create(&PostParams::default(), &account).await)?;
    Ok(())
}

/// The chart's release name in the tests; its operator's ServiceAccount is `<release>-rdu-operator`.
pub const CHART_RELEASE: &str = "rdu";
/// The namespace the chart is installed in and the operator runs in (its Lease, its ServiceAccount).
pub const SYSTEM_NAMESPACE: &str = "rdu-system";

/// Where an operator started by [`start_operator_as_chart`] listens, and its process.
#[derive(Clone, Copy, Debug)]
pub struct OperatorAddrs {
    /// /metrics, /healthz and /readyz.
    pub metrics: std::net::SocketAddr,
    /// The progress endpoint (listening only with `--progress-url`).
    pub progress: std::net::SocketAddr,
    /// The operator's process id.
    pub pid: u32,
}

/// Applies the chart's manifests (its RBAC among them), rendered with `helm` arguments `values` (`--set`, `x=y`),
/// into `namespace` server-side and starts the operator binary with `flags` beside the control plane (log
/// `rdu-operator`), authenticated as the chart's ServiceAccount with a TokenRequest token, so every API call it
/// makes is checked against the chart's RBAC. Returns where it listens, and its process.
pub fn start_operator_as_chart(
    plane: &mut ControlPlane,
    namespace: &str,
    values: &[&str],
    flags: &[&str],
) -> Result<OperatorAddrs, ClusterError> {
    let binary = crate::tools::operator_binary()?;
    let chart = crate::tools::helm_template(CHART_RELEASE, namespace, values)?;
    kubectl(plane, &["apply", "--server-side", "-f", "-"], Some(&chart))?;
    let account = format!("{CHART_RELEASE}-rdu-operator");
    let token = service_account_token(plane, namespace, &account)?;
    let kubeconfig = plane.write_kubeconfig(
        "operator",
        &format!("system:serviceaccount:{namespace}:{account}"),
        &token,
        namespace,
    )?;
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], crate::ports::free_port()?));
    let progress = std::net::SocketAddr::from(([127, 0, 0, 1], crate::ports::free_port()?));
    let mut operator = std::process::Command::new(binary);
    operator
        .arg(format!("--metrics-addr={metrics}"))
        .arg(format!("--progress-addr={progress}"))
        .arg(format!("--lease-namespace={namespace}"))
        .arg("--identity=e2e-operator")
        .arg("--log-format=text")
        .args(flags)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info");
    let pid = plane.spawn("rdu-operator", operator)?;
    Ok(OperatorAddrs {
        metrics,
        progress,
        pid,
    })
}

/// How long a token from [`service_account_token`] is valid: longer than any run, since the processes given one
/// keep it to the end (the operator of the control-plane tests, the Kueue manager beside a kind cluster). With an
/// hour, a long soak's Kueue had every write refused as Unauthorized after 60 minutes and admitted no job again.
pub const TOKEN_LIFETIME: &str = "24h";

/// A token of `namespace/account` from the TokenRequest API, valid for [`TOKEN_LIFETIME`].
pub fn service_account_token(
    plane: &ControlPlane,
    namespace: &str,
    account: &str,
) -> Result<String, ClusterError> {
    let token = kubectl(
        plane,
        &[
            "create",
            "token",
            account,
            "-n",
            namespace,
            &format!("--duration={TOKEN_LIFETIME}"),
        ],
        None,
    )?;
    Ok(token.trim().to_string())
}

fn ignore_exists<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

fn client_error(e: crate::kubeconfig::ClientError) -> ClusterError {
    match e {
        crate::kubeconfig::ClientError::Client(e) => ClusterError::Kube(e),
        other => ClusterError::Io(std::io::Error::other(other.to_string())),
    }
}
