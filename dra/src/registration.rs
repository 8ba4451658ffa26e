//! The plugin registration service the kubelet's plugin watcher calls on the registration socket: GetInfo names
//! the driver, its DRAPlugin socket and the service version; NotifyRegistrationStatus reports the outcome.

use crate::devices::DRIVER_NAME;
use crate::registration_api::registration_server::Registration;
use crate::registration_api::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use std::path::{Path, PathBuf};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// Where the kubelet's plugin watcher looks for registration sockets.
pub const DEFAULT_REGISTRATION_SOCKET: &str = "/var/lib/kubelet/plugins_registry/rdu.dev-reg.sock";
/// The driver's DRAPlugin socket, which the kubelet dials once registered.
pub const DEFAULT_PLUGIN_SOCKET: &str = "/var/lib/kubelet/plugins/rdu.dev/dra.sock";
/// The plugin type of a DRA driver (`k8s.io/kubelet/pkg/apis/pluginregistration/v1.DRAPlugin`).
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRAPlugin service version served (`k8s.io/kubelet/pkg/apis/dra/v1.DRAPluginService`, kubelet 1.34).
pub const SUPPORTED_VERSION: &str = "v1.DRAPlugin";

/// Errors setting up registration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistrationError {
    #[error("the DRAPlugin socket path {0} is not UTF-8, so the kubelet cannot be told about it")]
    NonUtf8Endpoint(PathBuf),
}

/// What the kubelet said about the registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrationState {
    /// Not told yet.
    Pending,
    Registered,
    /// The kubelet refused the plugin, with its reason.
    Refused(String),
}

/// The Registration service of the driver.
#[derive(Debug)]
pub struct Registrar {
    endpoint: String,
    state: watch::Sender<RegistrationState>,
}

impl Registrar {
    /// A registrar telling the kubelet the DRAPlugin service listens on `endpoint`.
    pub fn new(endpoint: &Path) -> Result<Registrar, RegistrationError> {
        let endpoint = endpoint
            .to_str()
            .ok_or_else(|| RegistrationError::NonUtf8Endpoint(endpoint.to_path_buf()))?
            .to_string();
        Ok(Registrar {
            endpoint,
            state: watch::Sender::new(RegistrationState::Pending),
        })
    }

    /// The outcome so far, and every later one.
    pub fn subscribe(&self) -> watch::Receiver<RegistrationState> {
        self.state.subscribe()
    }

    pub fn state(&self) -> RegistrationState {
        self.state.borrow().clone()
    }
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: DRIVER_NAME.to_string(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec![SUPPORTED_VERSION.to_string()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let state = if status.plugin_registered {
            tracing::info!(driver = DRIVER_NAME, "registered with the kubelet");
            RegistrationState::Registered
        } else {
            tracing::error!(driver = DRIVER_NAME, error = %status.error, "the kubelet refused the registration");
            RegistrationState::Refused(status.error)
        };
        self.state.send_replace(state);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn get_info_names_the_driver_and_its_socket() {
        let registrar = Registrar::new(Path::new(DEFAULT_PLUGIN_SOCKET)).unwrap();
        let info = registrar
            .get_info(Request::new(InfoRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, "rdu.dev");
        assert_eq!(info.endpoint, "/var/lib/kubelet/plugins/rdu.dev/dra.sock");
        assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    }

    #[tokio::test]
    async fn records_the_kubelets_verdict() {
        let registrar = Registrar::new(Path::new("/tmp/x.sock")).unwrap();
        let mut watcher = registrar.subscribe();
        assert_eq!(registrar.state(), RegistrationState::Pending);
        let notify = |registered: bool, error: &str| RegistrationStatus {
            plugin_registered: registered,
            error: error.to_string(),
        };
        registrar
            .notify_registration_status(Request::new(notify(false, "version not supported")))
            .await
            .unwrap();
        assert!(watcher.has_changed().unwrap());
        assert_eq!(
            *watcher.borrow_and_update(),
            RegistrationState::Refused("version not supported".into())
        );
        registrar
            .notify_registration_status(Request::new(notify(true, "")))
            .await
            .unwrap();
        assert_eq!(registrar.state(), RegistrationState::Registered);
    }

    #[test]
    fn refuses_a_non_utf8_endpoint() {
        use std::os::unix::ffi::OsStrExt;
        let path = Path::new(std::ffi::OsStr::from_bytes(b"/tmp/\xff.sock"));
        assert!(matches!(
            Registrar::new(path),
            Err(RegistrationError::NonUtf8Endpoint(_))
        ));
    }
}
