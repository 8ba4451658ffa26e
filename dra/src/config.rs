//! The `rdu-dra` binary's flags, and the configuration they resolve to (validated once, here).

use crate::cdi::DEFAULT_CDI_DIR;
use crate::domain::DEFAULT_DOMAIN_DIR;
use crate::registration::{DEFAULT_PLUGIN_SOCKET, DEFAULT_REGISTRATION_SOCKET};
use rdu_tiles::topology::{Topology, TopologyError};
use std::path::PathBuf;
use std::time::Duration;

/// Where prepared claims are recorded by default (outside the kubelet's directories, which a kubelet restart may
/// clear).
pub const DEFAULT_CHECKPOINT_FILE: &str = "/var/lib/rdu-dra/prepared-claims.json";
/// How often the node's ResourceSlices are applied again by default (the kubelet deletes them when it starts).
pub const DEFAULT_RESYNC_SECONDS: u64 = 30;

/// Errors in the flags; each names the flag and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "--node-name (or env NODE_NAME) is required: the pool and the ResourceSlices are named after the node; \
         in a DaemonSet set NODE_NAME from fieldRef spec.nodeName"
    )]
    NoNodeName,
    #[error("--model is empty; set it to the model of the node's RDUs (e.g. SN30)")]
    EmptyModel,
    #[error("--rdus-per-node / --tiles-per-rdu: invalid topology")]
    Topology(#[source] TopologyError),
    #[error("--resync-seconds must be at least 1 (the ResourceSlices are re-applied that often)")]
    ZeroResync,
    #[error(
        "--shm-domain-dir `{0}` must be an absolute path on the node (CDI specs mount domains from it)"
    )]
    RelativeDomainDir(PathBuf),
}

/// The flags of the `rdu-dra` binary.
#[derive(Debug, Clone, Default, clap::Parser)]
#[command(
    name = "rdu-dra",
    about = "DRA kubelet plugin publishing simulated RDU tiles as resource.k8s.io/v1 devices of driver rdu.dev"
)]
pub struct Flags {
    /// The node this plugin runs on: the pool and the ResourceSlices are named after it.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// RDUs on this node.
    #[arg(long, default_value_t = 8)]
    pub rdus_per_node: u32,
    /// Tiles per RDU: 4 as on an SN10-8, 8 as on an SN30.
    #[arg(long, default_value_t = 4)]
    pub tiles_per_rdu: u32,
    /// The RDU model, the `rdu.dev/model` attribute of every device.
    #[arg(long, default_value = "SN10")]
    pub model: String,
    /// The DRAPlugin socket the kubelet dials.
    #[arg(long, default_value = DEFAULT_PLUGIN_SOCKET)]
    pub plugin_socket: PathBuf,
    /// The registration socket, in the directory the kubelet's plugin watcher watches.
    #[arg(long, default_value = DEFAULT_REGISTRATION_SOCKET)]
    pub registration_socket: PathBuf,
    /// Where CDI specs of prepared claims are written (a directory the container runtime reads CDI specs from).
    #[arg(long, default_value = DEFAULT_CDI_DIR)]
    pub cdi_dir: PathBuf,
    /// The checkpoint of prepared claims, kept across restarts of the plugin.
    #[arg(long, default_value = DEFAULT_CHECKPOINT_FILE)]
    pub checkpoint_file: PathBuf,
    /// Where jobs' shared-memory domains are made: a directory of the node, mounted at the same path.
    #[arg(long, default_value = DEFAULT_DOMAIN_DIR)]
    pub shm_domain_dir: PathBuf,
    /// Seconds between re-applies of the node's ResourceSlices.
    #[arg(long, default_value_t = DEFAULT_RESYNC_SECONDS)]
    pub resync_seconds: u64,
}

/// What the plugin runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraConfig {
    pub node_name: String,
    pub topology: Topology,
    pub model: String,
    pub plugin_socket: PathBuf,
    pub registration_socket: PathBuf,
    pub cdi_dir: PathBuf,
    pub checkpoint_file: PathBuf,
    pub shm_domain_dir: PathBuf,
    pub resync: Duration,
}

impl DraConfig {
    pub fn resolve(flags: &Flags) -> Result<DraConfig, ConfigError> {
        let node_name = flags
            .node_name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or(ConfigError::NoNodeName)?;
        if flags.model.is_empty() {
            return Err(ConfigError::EmptyModel);
        }
        if flags.resync_seconds == 0 {
            return Err(ConfigError::ZeroResync);
        }
        if !flags.shm_domain_dir.is_absolute() {
            return Err(ConfigError::RelativeDomainDir(flags.shm_domain_dir.clone()));
        }
        let topology = Topology::new(flags.rdus_per_node, flags.tiles_per_rdu)
            .map_err(ConfigError::Topology)?;
        Ok(DraConfig {
            node_name,
            topology,
            model: flags.model.clone(),
            plugin_socket: flags.plugin_socket.clone(),
            registration_socket: flags.registration_socket.clone(),
            cdi_dir: flags.cdi_dir.clone(),
            checkpoint_file: flags.checkpoint_file.clone(),
            shm_domain_dir: flags.shm_domain_dir.clone(),
            resync: Duration::from_secs(flags.resync_seconds),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<DraConfig, ConfigError> {
        let flags = Flags::try_parse_from(std::iter::once("rdu-dra").chain(args.iter().copied()))
            .expect("flags parse");
        DraConfig::resolve(&flags)
    }

    #[test]
    fn defaults_are_the_kubelets_paths() {
        let config = parse(&["--node-name", "node-a"]).unwrap();
        assert_eq!(config.node_name, "node-a");
        assert_eq!(config.topology, Topology::new(8, 4).unwrap());
        assert_eq!(config.model, "SN10");
        assert_eq!(
            config.plugin_socket,
            PathBuf::from("/var/lib/kubelet/plugins/rdu.dev/dra.sock")
        );
        assert_eq!(
            config.registration_socket,
            PathBuf::from("/var/lib/kubelet/plugins_registry/rdu.dev-reg.sock")
        );
        assert_eq!(config.cdi_dir, PathBuf::from("/var/run/cdi"));
        assert_eq!(config.shm_domain_dir, PathBuf::from("/run/rdu-dra/domains"));
        assert_eq!(config.resync, Duration::from_secs(30));
    }

    #[test]
    fn every_bad_flag_is_named() {
        // NODE_NAME may be set where the tests run: an empty --node-name wins over it and is refused.
        let no_node = parse(&["--node-name", ""]).unwrap_err();
        assert!(matches!(no_node, ConfigError::NoNodeName));
        assert!(no_node.to_string().contains("--node-name"), "{no_node}");
        let cases: [(&[&str], &str); 4] = [
            (&["--node-name", "n", "--model", ""], "--model"),
            (
                &["--node-name", "n", "--tiles-per-rdu", "0"],
                "--tiles-per-rdu",
            ),
            (
                &["--node-name", "n", "--resync-seconds", "0"],
                "--resync-seconds",
            ),
            (
                &["--node-name", "n", "--shm-domain-dir", "domains"],
                "--shm-domain-dir `domains` must be an absolute path",
            ),
        ];
        for (args, flag) in cases {
            let err = parse(args).unwrap_err();
            assert!(err.to_string().contains(flag), "{args:?}: {err}");
        }
    }
}
