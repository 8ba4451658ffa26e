//! The test node's network: a pod bridge with the node's address as its gateway, CNI configuration for
//! it, and guards so that nothing the node starts sends a packet anywhere but the bridge's subnet and
//! loopback (a REJECT rule for pod traffic leaving the subnet, an unreachable route for the Service
//! CIDR until kube-proxy rewrites it). Everything is undone by [`teardown`], also after a crashed run.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use super::NodeError;

/// The pod bridge's name (one test node at a time on a machine).
pub const BRIDGE: &str = "rdue2e0";
/// The CNI network's name; the CNI cache files of its pods start with it.
pub const CNI_NETWORK: &str = "rdu-e2e";
/// The pod subnet; its first address is the node's (the bridge gateway).
pub const POD_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 217, 0, 0), 24);
/// The Service CIDR (virtual: kube-proxy's rules rewrite it; otherwise unreachable).
pub const SERVICE_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 217, 1, 0), 24);
/// The comment on every iptables rule the harness adds.
const RULE_COMMENT: &str = "rdu-e2e-node guard";
/// Host settings the node's programs change (the CNI bridge turns on forwarding; the kubelet sets its
/// kernel tunables), restored at teardown.
const SAVED_SYSCTLS: &[&str] = &[
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// The node's address: the pod bridge's gateway.
pub fn node_address() -> Ipv4Addr {
    Ipv4Addr::from(u32::from(POD_CIDR.0) + 1)
}

fn cidr((ip, bits): (Ipv4Addr, u8)) -> String {
    format!("{ip}/{bits}")
}

/// The CNI network list: a bridge with host-local addresses from the pod subnet, no masquerading
/// (pods talk only to each other and to the node).
pub fn cni_conflist(ipam_dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "dataDir": ipam_dir,
                "ranges": [[{"subnet": cidr(POD_CIDR), "gateway": node_address().to_string()}]],
                "routes": [{"dst": "0.0.0.0/0"}]
            }
        }]
    })
    .to_string()
}

/// The host settings as they were before the node started, which [`teardown`] restores.
#[derive(Debug, Clone)]
pub struct Saved {
    sysctls: Vec<(String, String)>,
}

/// The node's network while it exists: the bridge (so the API server can bind the node's address before
/// the node starts) and the guards. Torn down when dropped.
#[derive(Debug)]
pub struct Network {
    saved: Saved,
}

impl Network {
    /// Creates the bridge with the node's address and puts the guards in place.
    pub fn create() -> Result<Self, NodeError> {
        setup().map(|saved| Self { saved })
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        teardown(Some(&self.saved));
    }
}

/// Creates the bridge with the node's address and puts the guards in place.
fn setup() -> Result<Saved, NodeError> {
    // A crashed earlier run may have left its bridge and rules.
    teardown(None);
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
    let gateway = format!("{}/{}", node_address(), POD_CIDR.1);
    run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
    run("ip", &["addr", "add", &gateway, "dev", BRIDGE])?;
    run("ip", &["link", "set", BRIDGE, "up"])?;
    run("ip", &["route", "add", "unreachable", &cidr(SERVICE_CIDR)])?;
    run("iptables", &guard_rule(&["-I", "FORWARD", "1"]))?;
    Ok(saved)
}

/// The guard rule (pod traffic leaving the pod subnet is rejected) after `action` (insert or delete).
fn guard_rule(action: &[&str]) -> Vec<String> {
    let pods = cidr(POD_CIDR);
    let rule = [
        "-s",
        &pods,
        "!",
        "-d",
        &pods,
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

/// Removes the bridge, the route and the guard rules; restores the host settings `saved` recorded.
/// Best effort: every step runs whatever the others did.
pub fn teardown(saved: Option<&Saved>) {
    let _ = run("ip", &["link", "del", BRIDGE]);
    let _ = run("ip", &["route", "del", "unreachable", &cidr(SERVICE_CIDR)]);
    while run("iptables", &guard_rule(&["-D", "FORWARD"])).is_ok() {}
    remove_kubernetes_chains();
    for (path, value) in saved.map(|s| s.sysctls.as_slice()).unwrap_or_default() {
        if std::fs::read_to_string(path).is_ok_and(|now| now.trim() != value) {
            let _ = std::fs::write(path, value);
        }
    }
    // CNI's result cache of this network's pods (CNI DEL removes them; a killed runtime leaves them).
    if let Ok(entries) = std::fs::read_dir("/var/lib/cni/results") {
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("{CNI_NETWORK}-"))
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// Packets kube-proxy's `KUBE-FORWARD` chain dropped as conntrack INVALID (its rule when
/// `nf_conntrack_tcp_be_liberal` is 0; known to stall long TCP streams, kubernetes#74839), if the rule exists.
pub fn invalid_forward_drops() -> Option<u64> {
    let out = Command::new("iptables")
        .args(["-t", "filter", "-L", "KUBE-FORWARD", "-v", "-n", "-x"])
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

/// The kubelet's and kube-proxy's iptables chains (`KUBE-*`: the kubelet's `KUBE-FIREWALL`, canaries and
/// hints survive `kube-proxy --cleanup`), and the rules of other chains that jump to them, for IPv4 and IPv6.
fn remove_kubernetes_chains() {
    for program in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle", "raw"] {
            let Ok(out) = Command::new(program).args(["-t", table, "-S"]).output() else {
                continue;
            };
            let rules = String::from_utf8_lossy(&out.stdout).into_owned();
            for (delete, chain) in kubernetes_rules(&rules) {
                match delete {
                    // -S prints shell-quoted rules: let the shell split them again.
                    Some(rule) => {
                        let _ = Command::new("sh")
                            .arg("-c")
                            .arg(format!("{program} -t {table} {rule}"))
                            .output();
                    }
                    None => {
                        let _ = Command::new(program)
                            .args(["-t", table, "-F", &chain])
                            .output();
                        let _ = Command::new(program)
                            .args(["-t", table, "-X", &chain])
                            .output();
                    }
                }
            }
        }
    }
}

/// From `iptables -S` text: first `(Some("-D <rule>"), chain)` for every rule outside a `KUBE-*` chain that
/// jumps to one, then `(None, chain)` for every `KUBE-*` chain (to flush and delete).
fn kubernetes_rules(rules: &str) -> Vec<(Option<String>, String)> {
    let mut jumps = Vec::new();
    let mut chains = Vec::new();
    for line in rules.lines() {
        if let Some(chain) = line.strip_prefix("-N ").filter(|c| c.starts_with("KUBE-")) {
            chains.push((None, chain.trim().to_string()));
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let chain = rule.split_whitespace().next().unwrap_or_default();
            if !chain.starts_with("KUBE-") && line.contains(" -j KUBE-") {
                jumps.push((Some(format!("-D {rule}")), chain.to_string()));
            }
        }
    }
    jumps.extend(chains);
    jumps
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
    fn the_guard_rule_is_inserted_and_deleted_as_the_same_rule() {
        let insert = guard_rule(&["-I", "FORWARD", "1"]);
        let delete = guard_rule(&["-D", "FORWARD"]);
        assert_eq!(insert[3..], delete[2..]);
        assert_eq!(
            insert[3..8],
            ["-s", "10.217.0.0/24", "!", "-d", "10.217.0.0/24"]
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
    fn kubernetes_chains_and_the_jumps_to_them_are_found() {
        let rules = "-P INPUT ACCEPT\n-N KUBE-FIREWALL\n-N MINE\n-A INPUT -j KUBE-FIREWALL\n\
                     -A INPUT -j MINE\n-A KUBE-FIREWALL -d 127.0.0.0/8 -j DROP\n";
        assert_eq!(
            kubernetes_rules(rules),
            vec![
                (
                    Some("-D INPUT -j KUBE-FIREWALL".to_string()),
                    "INPUT".to_string()
                ),
                (None, "KUBE-FIREWALL".to_string()),
            ]
        );
    }

    #[test]
    fn the_cni_config_keeps_pods_on_the_bridge_subnet() {
        let conf: serde_json::Value =
            serde_json::from_str(&cni_conflist(Path::new("/x/ipam"))).unwrap();
        let bridge = &conf["plugins"][0];
        assert_eq!(bridge["bridge"], BRIDGE);
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.217.0.0/24");
        assert_eq!(bridge["ipam"]["ranges"][0][0]["gateway"], "10.217.0.1");
        assert_eq!(bridge["ipam"]["dataDir"], "/x/ipam");
    }
}
