//! The node's kubelet: its configuration for this machine (cgroupfs without per-QoS cgroups, swap allowed, cgroup
//! v1 allowed, no image garbage collection or disk eviction of the test's images, a share of the machine's CPUs
//! and memory reserved away so that N nodes do not each report the whole machine), its default root directory
//! `/var/lib/kubelet` (the node's own, bound in its mount namespace), client-certificate authentication of the API
//! server and webhook authorization. Ports are the defaults: each node has its own network namespace.

use std::net::Ipv4Addr;
use std::path::Path;

/// The kubelet's root directory inside the node.
pub const ROOT: &str = "/var/lib/kubelet";
/// The device plugin API's fixed directory of `kubelet.sock`, inside the node.
pub const DEVICE_PLUGINS_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The pod-resources socket's directory, inside the node.
pub const POD_RESOURCES_DIR: &str = "/var/lib/kubelet/pod-resources";
/// The kubelet API (logs, exec) on the node's address.
pub const API_PORT: u16 = 10250;
/// /healthz on the node's loopback.
pub const HEALTHZ_PORT: u16 = 10248;

/// What the kubelet holds back from pods, so that the nodes of one machine share it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    pub cpu_millis: u64,
    pub memory_mib: u64,
}

impl Reserved {
    /// With `nodes` nodes on a machine of `cpus` CPUs and `memory_mib` MiB, each node reports about its share.
    pub fn share(nodes: u64, cpus: u64, memory_mib: u64) -> Self {
        let nodes = nodes.max(1);
        Self {
            cpu_millis: cpus * 1000 - (cpus * 1000 / nodes),
            memory_mib: memory_mib - memory_mib / nodes,
        }
    }
}

/// The KubeletConfiguration.
pub fn config(
    address: Ipv4Addr,
    client_ca: &Path,
    runtime_endpoint: &str,
    cluster_dns: Ipv4Addr,
    reserved: Reserved,
) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: "{address}"
port: {API_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {HEALTHZ_PORT}
containerRuntimeEndpoint: "{runtime_endpoint}"
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
systemReserved:
  cpu: "{cpu}m"
  memory: "{memory}Mi"
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
        client_ca = client_ca.display(),
        cpu = reserved.cpu_millis,
        memory = reserved.memory_mib,
    )
}

/// The kubelet's command-line arguments (everything else is in the config file).
pub fn args(config: &Path, kubeconfig: &Path, node_name: &str, address: Ipv4Addr) -> Vec<String> {
    vec![
        format!("--config={}", config.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--root-dir={ROOT}"),
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
        let text = config(
            Ipv4Addr::new(10, 217, 0, 11),
            Path::new("/ca.crt"),
            "unix:///run/containerd/containerd.sock",
            Ipv4Addr::new(10, 217, 0, 1),
            Reserved::share(3, 2, 24_000),
        );
        let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(value["cgroupsPerQOS"], serde_yaml_ng::Value::Bool(false));
        assert_eq!(value["failCgroupV1"], serde_yaml_ng::Value::Bool(false));
        assert_eq!(value["authorization"]["mode"], "Webhook");
        assert_eq!(value["clusterDNS"][0], "10.217.0.1");
        assert_eq!(value["address"], "10.217.0.11");
        assert_eq!(value["systemReserved"]["cpu"], "1334m");
        assert_eq!(value["systemReserved"]["memory"], "16000Mi");
    }

    #[test]
    fn one_node_reserves_nothing() {
        assert_eq!(
            Reserved::share(1, 2, 1000),
            Reserved {
                cpu_millis: 0,
                memory_mib: 0
            }
        );
    }
}
