//! Cluster services: CoreDNS (cluster DNS on the control plane's address, port 53, answering from the API server
//! with its `kubernetes` plugin; a process of this machine, as a cluster's DNS outlives any one node) and each
//! node's kube-proxy (iptables mode in the node's network namespace: the Service ClusterIPs, among them the
//! `kubernetes` Service that pods reach the API server through).

use std::net::Ipv4Addr;
use std::path::Path;

/// CoreDNS's Corefile: the cluster domain and reverse zones, from the API server; nothing else is
/// answered (no forwarding: a test node has no upstream).
pub fn corefile(address: Ipv4Addr, kubeconfig: &Path, context: &str) -> String {
    format!(
        "cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {{\n    bind {address}\n    errors\n    \
         kubernetes cluster.local in-addr.arpa ip6.arpa {{\n        kubeconfig {kubeconfig} {context}\n        \
         pods insecure\n        ttl 5\n    }}\n}}\n",
        kubeconfig = kubeconfig.display(),
    )
}

/// kube-proxy's metrics port on the node's loopback.
pub const PROXY_METRICS_PORT: u16 = 10249;
/// kube-proxy's health port on the node's loopback.
pub const PROXY_HEALTHZ_PORT: u16 = 10256;

/// kube-proxy's arguments. It leaves conntrack sysctls and route_localnet alone (conntrack tables are shared by
/// the machine's namespaces) and serves its metrics and health on the node's loopback.
pub fn kube_proxy_args(
    kubeconfig: &Path,
    node_name: &str,
    pod_cidr: (Ipv4Addr, u8),
) -> Vec<String> {
    let (metrics_port, healthz_port) = (PROXY_METRICS_PORT, PROXY_HEALTHZ_PORT);
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--hostname-override={node_name}"),
        "--proxy-mode=iptables".into(),
        format!("--cluster-cidr={}/{}", pod_cidr.0, pod_cidr.1),
        format!("--metrics-bind-address=127.0.0.1:{metrics_port}"),
        format!("--healthz-bind-address=127.0.0.1:{healthz_port}"),
        "--conntrack-max-per-core=0".into(),
        "--conntrack-tcp-timeout-established=0".into(),
        "--conntrack-tcp-timeout-close-wait=0".into(),
        "--iptables-localhost-nodeports=false".into(),
        "--v=1".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coredns_serves_only_the_cluster_zones_on_the_node_address() {
        let text = corefile(Ipv4Addr::new(10, 217, 0, 1), Path::new("/k.conf"), "ctx");
        assert!(text.starts_with("cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {"));
        assert!(text.contains("bind 10.217.0.1"));
        assert!(text.contains("kubeconfig /k.conf ctx"));
        assert!(!text.contains("forward"));
    }
}
