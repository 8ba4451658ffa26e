//! The test cluster's network, made only of namespaces and links the harness creates. A bridge on this machine
//! (`rdue2e0`, 10.217.0.1: the control plane's address, where the API server and CoreDNS listen) and, per node,
//! a network namespace joined to the bridge by a veth pair (node k at 10.217.0.(10+k)), with its pods on a CNI
//! bridge of their own subnet 10.217.(16+k).0/24 routed between nodes through the node addresses, as a flat
//! host-gateway pod network (flannel's host-gw, kindnet) does. A node has no default route, so nothing it runs
//! reaches beyond these subnets; a REJECT rule for pod traffic leaving them guards the bridge and every node,
//! and the Service CIDR is unreachable unless kube-proxy rewrote the destination. Taking a node's link down
//! partitions it. Everything is undone by [`HostNetwork`]'s drop and [`sweep`], also after a crashed run.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::NodeError;

/// The bridge joining the control plane and the nodes (one cluster at a time on a machine).
pub const BRIDGE: &str = "rdue2e0";
/// Network namespace names of the nodes start with this (and nothing else of this machine's does).
pub const NETNS_PREFIX: &str = "rdu-e2e-";
/// Host-side veth names start with this.
const VETH_PREFIX: &str = "rdue2e-h";
/// The CNI network's name.
pub const CNI_NETWORK: &str = "rdu-e2e";
/// The pod bridge inside each node.
pub const POD_BRIDGE: &str = "cni0";
/// The bridge's subnet: the control plane and the node addresses.
pub const NODE_SUBNET: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 217, 0, 0), 24);
/// The Service CIDR (virtual: kube-proxy's rules rewrite it; otherwise unreachable).
pub const SERVICE_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 217, 1, 0), 24);
/// Every node's pod subnet is inside this one.
pub const CLUSTER_POD_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 217, 16, 0), 20);
/// Everything the cluster may send to: the node subnet, the Service CIDR and the pods.
const CLUSTER_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 217, 0, 0), 16);
/// Nodes are numbered 1..=MAX_NODES.
pub const MAX_NODES: u8 = 15;
/// The comment on every iptables rule the harness adds.
const RULE_COMMENT: &str = "rdu-e2e guard";
/// Host settings the node's programs change (the kubelet sets its kernel tunables), restored at teardown. The
/// `net.*` settings live in each node's network namespace and go with it.
const SAVED_SYSCTLS: &[&str] = &[
    "net/ipv4/ip_forward",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// The control plane's address: the bridge's.
pub fn control_plane_address() -> Ipv4Addr {
    Ipv4Addr::from(u32::from(NODE_SUBNET.0) + 1)
}

/// Node `index`'s address (1-based) on the bridge.
pub fn node_address(index: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(NODE_SUBNET.0) + 10 + u32::from(index))
}

/// Node `index`'s pod subnet.
pub fn pod_cidr(index: u8) -> (Ipv4Addr, u8) {
    (
        Ipv4Addr::from(u32::from(CLUSTER_POD_CIDR.0) + (u32::from(index) << 8)),
        24,
    )
}

/// The gateway of node `index`'s pods: its pod bridge.
pub fn pod_gateway(index: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(pod_cidr(index).0) + 1)
}

/// Node `index`'s network namespace.
pub fn netns_name(index: u8) -> String {
    format!("{NETNS_PREFIX}{index}")
}

/// Where `ip netns` keeps node `index`'s network namespace.
pub fn netns_path(index: u8) -> PathBuf {
    Path::new("/run/netns").join(netns_name(index))
}

/// The host side of node `index`'s link: down partitions the node.
pub fn host_veth(index: u8) -> String {
    format!("{VETH_PREFIX}{index}")
}

pub fn cidr((ip, bits): (Ipv4Addr, u8)) -> String {
    format!("{ip}/{bits}")
}

/// Node `index`'s CNI network list: its pod bridge with host-local addresses from its pod subnet (state under
/// `/var/lib/cni`, the node's own), no masquerading: pods talk to pods, nodes and the control plane only.
pub fn cni_conflist(index: u8) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [{
            "type": "bridge",
            "bridge": POD_BRIDGE,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": cidr(pod_cidr(index)), "gateway": pod_gateway(index).to_string()}]],
                "routes": [{"dst": "0.0.0.0/0"}]
            }
        }]
    })
    .to_string()
}

/// The host settings as they were before the cluster started.
#[derive(Debug, Clone)]
pub struct Saved {
    sysctls: Vec<(String, String)>,
}

/// The bridge, its guard and routes while the cluster exists. Torn down (with every node link) when dropped.
#[derive(Debug)]
pub struct HostNetwork {
    saved: Saved,
}

impl HostNetwork {
    /// Removes what a crashed earlier run left, then creates the bridge with the control plane's address (so the
    /// API server can bind it before any node exists) and puts the guards in place.
    pub fn create() -> Result<Self, NodeError> {
        sweep();
        let saved = Saved {
            sysctls: SAVED_SYSCTLS
                .iter()
                .filter_map(|name| {
                    let path = format!("/proc/sys/{name}");
                    std::fs::read_to_string(&path)
                        .ok()
                        .map(|v| (path, v.trim().to_string()))
                })
                .collect(),
        };
        let network = Self { saved };
        let address = format!("{}/{}", control_plane_address(), NODE_SUBNET.1);
        run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
        run("ip", &["addr", "add", &address, "dev", BRIDGE])?;
        run("ip", &["link", "set", BRIDGE, "up"])?;
        run("ip", &["route", "add", "unreachable", &cidr(SERVICE_CIDR)])?;
        run("iptables", &guard_rule(&["-I", "FORWARD", "1"]))?;
        Ok(network)
    }

    /// Creates node `index`'s network namespace and link (of `total` nodes: it routes to every other node's
    /// pods), with its guards. The link is up.
    pub fn add_node(&self, index: u8, total: u8) -> Result<(), NodeError> {
        if index == 0 || index > MAX_NODES || total > MAX_NODES {
            return Err(NodeError::Command(format!(
                "node {index} of {total}: nodes are numbered 1..={MAX_NODES}"
            )));
        }
        let ns = netns_name(index);
        let host = host_veth(index);
        let peer = format!("rdue2e-p{index}");
        run("ip", &["netns", "add", &ns])?;
        run(
            "ip",
            &[
                "link", "add", &host, "type", "veth", "peer", "name", &peer, "netns", &ns,
            ],
        )?;
        run("ip", &["link", "set", &host, "master", BRIDGE, "up"])?;
        let address = format!("{}/{}", node_address(index), NODE_SUBNET.1);
        in_netns(&ns, "ip", &["link", "set", &peer, "name", "eth0"])?;
        in_netns(&ns, "ip", &["addr", "add", &address, "dev", "eth0"])?;
        in_netns(&ns, "ip", &["link", "set", "eth0", "up"])?;
        in_netns(&ns, "ip", &["link", "set", "lo", "up"])?;
        for other in (1..=total).filter(|o| *o != index) {
            in_netns(
                &ns,
                "ip",
                &[
                    "route",
                    "add",
                    &cidr(pod_cidr(other)),
                    "via",
                    &node_address(other).to_string(),
                ],
            )?;
        }
        in_netns(
            &ns,
            "ip",
            &["route", "add", "unreachable", &cidr(SERVICE_CIDR)],
        )?;
        in_netns(&ns, "iptables", &guard_rule(&["-I", "FORWARD", "1"]))?;
        run(
            "ip",
            &[
                "route",
                "add",
                &cidr(pod_cidr(index)),
                "via",
                &node_address(index).to_string(),
            ],
        )?;
        Ok(())
    }

    /// Takes node `index`'s link down (a partition, or half of a crash) or up again.
    pub fn set_link(&self, index: u8, up: bool) -> Result<(), NodeError> {
        let state = if up { "up" } else { "down" };
        run("ip", &["link", "set", &host_veth(index), state])?;
        if up {
            // The route through the node goes when its link does.
            let _ = run(
                "ip",
                &[
                    "route",
                    "replace",
                    &cidr(pod_cidr(index)),
                    "via",
                    &node_address(index).to_string(),
                ],
            );
        }
        Ok(())
    }
}

impl Drop for HostNetwork {
    fn drop(&mut self) {
        sweep();
        for (path, value) in &self.saved.sysctls {
            if std::fs::read_to_string(path).is_ok_and(|now| now.trim() != value) {
                let _ = std::fs::write(path, value);
            }
        }
    }
}

/// Removes every node namespace (and with it its links, pods' links and rules), the bridge, the route and the
/// guard rules. Best effort: every step runs whatever the others did. The nodes' processes must be gone first
/// (a namespace a process still uses lives on unnamed).
pub fn sweep() {
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(NETNS_PREFIX) {
                let _ = run("ip", &["netns", "del", &name]);
            }
        }
    }
    let _ = run("ip", &["link", "del", BRIDGE]);
    let _ = run("ip", &["route", "del", "unreachable", &cidr(SERVICE_CIDR)]);
    while run("iptables", &guard_rule(&["-D", "FORWARD"])).is_ok() {}
}

/// The guard rule (traffic from the cluster to anywhere else is rejected) after `action` (insert or delete).
fn guard_rule(action: &[&str]) -> Vec<String> {
    let cluster = cidr(CLUSTER_CIDR);
    let rule = [
        "-s",
        &cluster,
        "!",
        "-d",
        &cluster,
        "-m",
        "comment",
        "--comment",
        RULE_COMMENT,
        "-j",
        "REJECT",
    ];
    action
        .iter()
        .chain(rule.iter())
        .map(|a| a.to_string())
        .collect()
}

/// Packets kube-proxy's `KUBE-FORWARD` chain in node `index` dropped as conntrack INVALID (its rule when
/// `nf_conntrack_tcp_be_liberal` is 0; known to stall long TCP streams, kubernetes#74839), if the rule exists.
pub fn invalid_forward_drops(index: u8) -> Option<u64> {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", netns_path(index).display()))
        .args([
            "iptables",
            "-t",
            "filter",
            "-L",
            "KUBE-FORWARD",
            "-v",
            "-n",
            "-x",
        ])
        .output()
        .ok()?;
    invalid_drops_in(&String::from_utf8_lossy(&out.stdout))
}

/// The packet count of the INVALID DROP rule in `iptables -L -v -n -x` text.
fn invalid_drops_in(listing: &str) -> Option<u64> {
    listing
        .lines()
        .find(|l| l.contains("DROP") && l.contains("INVALID"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
}

/// `program args…` inside network namespace `ns` only (`nsenter --net`, which leaves /sys and the cgroups alone).
fn in_netns(ns: &str, program: &str, args: &[impl AsRef<str>]) -> Result<(), NodeError> {
    let path = Path::new("/run/netns").join(ns).display().to_string();
    let mut all = vec![format!("--net={path}"), program.to_string()];
    all.extend(args.iter().map(|a| a.as_ref().to_string()));
    run("nsenter", &all)
}

fn run(program: &str, args: &[impl AsRef<str>]) -> Result<(), NodeError> {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    let out = Command::new(program)
        .args(&args)
        .output()
        .map_err(|e| NodeError::Command(format!("{program} {}: {e}", args.join(" "))))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NodeError::Command(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_follow_the_plan() {
        assert_eq!(control_plane_address(), Ipv4Addr::new(10, 217, 0, 1));
        assert_eq!(node_address(1), Ipv4Addr::new(10, 217, 0, 11));
        assert_eq!(node_address(3), Ipv4Addr::new(10, 217, 0, 13));
        assert_eq!(cidr(pod_cidr(1)), "10.217.17.0/24");
        assert_eq!(cidr(pod_cidr(MAX_NODES)), "10.217.31.0/24");
        assert_eq!(pod_gateway(2), Ipv4Addr::new(10, 217, 18, 1));
        // Every pod subnet lies inside the cluster's pod CIDR, and none overlaps the nodes' or Services'.
        for index in 1..=MAX_NODES {
            let net = u32::from(pod_cidr(index).0);
            let base = u32::from(CLUSTER_POD_CIDR.0);
            assert!(net >= base && net < base + (1 << (32 - CLUSTER_POD_CIDR.1)));
            assert_ne!(net, u32::from(NODE_SUBNET.0));
            assert_ne!(net, u32::from(SERVICE_CIDR.0));
        }
        assert_eq!(netns_path(2), Path::new("/run/netns/rdu-e2e-2"));
        assert_eq!(host_veth(2), "rdue2e-h2");
        assert!(
            host_veth(MAX_NODES).len() <= 15,
            "interface names are at most 15 bytes"
        );
    }

    #[test]
    fn the_guard_rule_is_inserted_and_deleted_as_the_same_rule() {
        let insert = guard_rule(&["-I", "FORWARD", "1"]);
        let delete = guard_rule(&["-D", "FORWARD"]);
        assert_eq!(insert[3..], delete[2..]);
        assert_eq!(
            insert[3..8],
            ["-s", "10.217.0.0/16", "!", "-d", "10.217.0.0/16"]
        );
        assert_eq!(insert.last().map(String::as_str), Some("REJECT"));
    }

    #[test]
    fn the_invalid_drop_counter_is_read_from_the_listing() {
        let listing = "Chain KUBE-FORWARD (1 references)\n    pkts      bytes target     prot opt in     out     source               destination\n      \
                       17     1234 DROP       0    --  *      *       0.0.0.0/0            0.0.0.0/0            ctstate INVALID\n       \
                       0        0 ACCEPT     0    --  *      *       0.0.0.0/0            0.0.0.0/0            mark match 0x4000/0x4000\n";
        assert_eq!(invalid_drops_in(listing), Some(17));
        assert_eq!(invalid_drops_in("Chain KUBE-FORWARD\n"), None);
    }

    #[test]
    fn the_cni_config_keeps_pods_on_their_nodes_subnet() {
        let conf: serde_json::Value = serde_json::from_str(&cni_conflist(2)).unwrap();
        let bridge = &conf["plugins"][0];
        assert_eq!(bridge["bridge"], POD_BRIDGE);
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.217.18.0/24");
        assert_eq!(bridge["ipam"]["ranges"][0][0]["gateway"], "10.217.18.1");
    }
}
