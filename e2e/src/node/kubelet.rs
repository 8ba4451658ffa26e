//! The node's kubelet: its configuration for this machine (cgroupfs without per-QoS cgroups, swap
//! allowed, cgroup v1 allowed, no image garbage collection or disk eviction of the test's images), its
//! own root directory, client-certificate authentication of the API server and webhook authorization.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The device plugin API's fixed directory of `kubelet.sock`.
pub const DEVICE_PLUGINS_DIR: &str = "/var/lib/kubelet/device-plugins";

/// Where the kubelet keeps its state; the device plugin's and pod-resources sockets are below it.
#[derive(Debug, Clone)]
pub struct Paths {
    pub root: PathBuf,
    pub config: PathBuf,
    pub pod_logs: PathBuf,
}

impl Paths {
    /// Everything under `dir`.
    pub fn under(dir: &Path) -> Self {
        Self {
            root: dir.join("kubelet"),
            config: dir.join("kubelet-config.yaml"),
            pod_logs: dir.join("pod-logs"),
        }
    }

    /// The directory of `kubelet.sock` and the device plugins' sockets. The kubelet does not put it
    /// below `--root-dir`: the device plugin API fixes it (`pluginapi.KubeletSocket`).
    pub fn device_plugins(&self) -> PathBuf {
        PathBuf::from(DEVICE_PLUGINS_DIR)
    }

    /// The directory of the pod-resources socket.
    pub fn pod_resources(&self) -> PathBuf {
        self.root.join("pod-resources")
    }
}

/// The ports the kubelet serves on.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    /// The kubelet API (logs, exec), on the node's address.
    pub api: u16,
    /// /healthz on loopback.
    pub healthz: u16,
}

/// The KubeletConfiguration.
pub fn config(
    paths: &Paths,
    address: Ipv4Addr,
    ports: Ports,
    client_ca: &Path,
    runtime_endpoint: &str,
    cluster_dns: Ipv4Addr,
) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: "{address}"
port: {api}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
containerRuntimeEndpoint: "{runtime_endpoint}"
podLogsDir: "{pod_logs}"
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: "{client_ca}"
authorization:
  mode: Webhook
clusterDomain: cluster.local
clusterDNS: ["{cluster_dns}"]
resolvConf: ""
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
serializeImagePulls: false
maxPods: 40
nodeStatusReportFrequency: 10s
syncFrequency: 10s
fileCheckFrequency: 20s
"#,
        api = ports.api,
        healthz = ports.healthz,
        pod_logs = paths.pod_logs.display(),
        client_ca = client_ca.display(),
    )
}

/// The kubelet's command-line arguments (everything else is in the config file).
pub fn args(paths: &Paths, kubeconfig: &Path, node_name: &str, address: Ipv4Addr) -> Vec<String> {
    vec![
        format!("--config={}", paths.config.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--root-dir={}", paths.root.display()),
        format!("--cert-dir={}", paths.root.join("pki").display()),
        format!("--hostname-override={node_name}"),
        format!("--node-ip={address}"),
        "--v=1".to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_is_yaml_with_this_machines_settings() {
        let paths = Paths::under(Path::new("/n"));
        let text = config(
            &paths,
            Ipv4Addr::new(10, 217, 0, 1),
            Ports { api: 1, healthz: 2 },
            Path::new("/ca.crt"),
            "unix:///n/c.sock",
            Ipv4Addr::new(10, 217, 0, 1),
        );
        let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(value["cgroupsPerQOS"], serde_yaml_ng::Value::Bool(false));
        assert_eq!(value["failCgroupV1"], serde_yaml_ng::Value::Bool(false));
        assert_eq!(value["authorization"]["mode"], "Webhook");
        assert_eq!(value["clusterDNS"][0], "10.217.0.1");
        assert_eq!(value["podLogsDir"], "/n/pod-logs");
        assert_eq!(
            paths.device_plugins(),
            Path::new("/var/lib/kubelet/device-plugins")
        );
        assert_eq!(paths.pod_resources(), Path::new("/n/kubelet/pod-resources"));
    }
}
