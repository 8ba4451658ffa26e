//! Kubeconfig files for the test control plane: the admin (static token, system:masters) and any
//! bearer token, such as a ServiceAccount's from the TokenRequest API.

use std::path::Path;

/// Renders a kubeconfig with one cluster, one user (a bearer token) and one current context.
pub fn render(server: &str, ca_cert: &Path, user: &str, token: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: rdu-e2e\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         users:\n- name: {user}\n  user:\n    token: {token}\n\
         contexts:\n- name: rdu-e2e\n  context:\n    cluster: rdu-e2e\n    user: {user}\n    namespace: {namespace}\n\
         current-context: rdu-e2e\n",
        ca = ca_cert.display(),
    )
}

/// Errors making a client from a kubeconfig file.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig {path}")]
    Kubeconfig {
        path: String,
        source: kube::config::KubeconfigError,
    },
    #[error("kube client")]
    Client(#[from] kube::Error),
}

/// A kube client for a kubeconfig file.
pub async fn client(path: &Path) -> Result<kube::Client, ClientError> {
    let bad = |source| ClientError::Kubeconfig {
        path: path.display().to_string(),
        source,
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(bad)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(bad)?;
    Ok(kube::Client::try_from(config)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders_a_parseable_kubeconfig() {
        let text = super::render(
            "https://127.0.0.1:6443",
            "/tmp/ca.crt".as_ref(),
            "admin",
            "t0k",
            "ns1",
        );
        let kc: kube::config::Kubeconfig = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("rdu-e2e"));
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        let context = kc.contexts[0].context.as_ref().unwrap();
        assert_eq!(context.namespace.as_deref(), Some("ns1"));
        assert!(kc.auth_infos[0].auth_info.as_ref().unwrap().token.is_some());
    }
}
