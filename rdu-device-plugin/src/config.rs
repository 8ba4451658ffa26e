//! Configuration: command-line flags over an optional YAML file over defaults.

use crate::podresources::DEFAULT_POD_RESOURCES_SOCKET;
use rdu_tiles::topology::{ResourceMode, Topology, TopologyError};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Where the kubelet expects device plugin sockets.
pub const DEFAULT_DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Default allocation checkpoint, outside the device plugin directory (which a kubelet restart wipes).
pub const DEFAULT_CHECKPOINT_FILE: &str = "/var/lib/rdu-device-plugin/allocations.json";
/// Default address of the status endpoint.
pub const DEFAULT_STATUS_ADDR: &str = "0.0.0.0:9464";

/// Errors in the configuration; each names the flag or field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read --config {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--config {path} is not valid")]
    Parse {
        path: PathBuf,
        source: serde_yaml_ng::Error,
    },
    #[error("invalid topology (rdusPerNode / tilesPerRdu)")]
    Topology(#[from] TopologyError),
    #[error(
        "--status-addr / statusAddr `{value}` is not HOST:PORT (e.g. 0.0.0.0:9464, or `off`): {source}"
    )]
    StatusAddr {
        value: String,
        #[source]
        source: std::net::AddrParseError,
    },
    #[error(
        "--annotate-pods / annotatePods learns each pod's tiles from the kubelet's pod-resources API: set \
         --pod-resources-socket to its socket, or drop --annotate-pods"
    )]
    AnnotateWithoutPodResources,
}

/// The flags of the `rdu-device-plugin` binary; any flag set wins over the config file.
#[derive(Debug, Clone, Default, clap::Parser)]
#[command(
    name = "rdu-device-plugin",
    about = "Kubelet device plugin advertising simulated RDU tiles"
)]
pub struct Flags {
    /// YAML config file (camelCase keys: devicePluginDir, rdusPerNode, tilesPerRdu, resourceMode, nodeName,
    /// healthFile, statusAddr, checkpointFile, podResourcesSocket, annotatePods).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory of kubelet.sock and the plugin's socket [default: /var/lib/kubelet/device-plugins].
    #[arg(long)]
    pub device_plugin_dir: Option<PathBuf>,
    /// RDUs on this node [default: 8].
    #[arg(long)]
    pub rdus_per_node: Option<u32>,
    /// Tiles per RDU: 4 as on an SN10-8, 8 as on an SN30 [default: 4].
    #[arg(long)]
    pub tiles_per_rdu: Option<u32>,
    /// `tile` (rdu.dev/tile, one device per tile) or `rdu` (rdu.dev/rdu, one per RDU) [default: tile].
    #[arg(long)]
    pub resource_mode: Option<ResourceMode>,
    /// Node name shown in the status.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// File listing unhealthy tiles (rdu3-tile1) or whole RDUs (rdu5), one per line with an optional reason
    /// after the ID (`rdu3-tile1 hung`); watched for changes.
    #[arg(long)]
    pub health_file: Option<PathBuf>,
    /// HTTP status endpoint address, or `off` [default: 0.0.0.0:9464].
    #[arg(long)]
    pub status_addr: Option<String>,
    /// Allocation checkpoint file [default: /var/lib/rdu-device-plugin/allocations.json].
    #[arg(long)]
    pub checkpoint_file: Option<PathBuf>,
    /// The kubelet's pod-resources socket, read for pod and rank of each tile, or `off`
    /// [default: /var/lib/kubelet/pod-resources/kubelet.sock].
    #[arg(long)]
    pub pod_resources_socket: Option<PathBuf>,
    /// Write each pod's tiles on the pod as the annotation `rdu.dev/tiles` (the operator reports them in
    /// status.ranks[].tiles); needs the pod-resources socket and API access to patch pods.
    #[arg(long)]
    pub annotate_pods: bool,
}

/// The YAML config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileConfig {
    pub device_plugin_dir: Option<PathBuf>,
    pub rdus_per_node: Option<u32>,
    pub tiles_per_rdu: Option<u32>,
    pub resource_mode: Option<ResourceMode>,
    pub node_name: Option<String>,
    pub health_file: Option<PathBuf>,
    pub status_addr: Option<String>,
    pub checkpoint_file: Option<PathBuf>,
    pub pod_resources_socket: Option<PathBuf>,
    pub annotate_pods: Option<bool>,
}

/// The resolved configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginConfig {
    pub device_plugin_dir: PathBuf,
    pub topology: Topology,
    pub resource_mode: ResourceMode,
    pub node_name: Option<String>,
    pub health_file: Option<PathBuf>,
    pub status_addr: Option<SocketAddr>,
    pub checkpoint_file: PathBuf,
    /// `None` when reading pod resources is off.
    pub pod_resources_socket: Option<PathBuf>,
    /// Publish each pod's tiles as the `rdu.dev/tiles` annotation.
    pub annotate_pods: bool,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        serde_yaml_ng::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }
}

impl PluginConfig {
    /// Flags, then the file named by `--config`, then defaults.
    pub fn resolve(flags: &Flags) -> Result<PluginConfig, ConfigError> {
        let file = match &flags.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        PluginConfig::merge(flags, file)
    }

    pub fn merge(flags: &Flags, file: FileConfig) -> Result<PluginConfig, ConfigError> {
        let topology = Topology::new(
            flags.rdus_per_node.or(file.rdus_per_node).unwrap_or(8),
            flags.tiles_per_rdu.or(file.tiles_per_rdu).unwrap_or(4),
        )?;
        let status_text = flags
            .status_addr
            .clone()
            .or(file.status_addr)
            .unwrap_or_else(|| DEFAULT_STATUS_ADDR.to_string());
        let status_addr = if status_text == "off" {
            None
        } else {
            Some(
                status_text
                    .parse()
                    .map_err(|source: std::net::AddrParseError| ConfigError::StatusAddr {
                        value: status_text.clone(),
                        source,
                    })?,
            )
        };
        let pod_resources_socket = Some(
            flags
                .pod_resources_socket
                .clone()
                .or(file.pod_resources_socket)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_POD_RESOURCES_SOCKET)),
        )
        .filter(|p| p.as_os_str() != "off");
        let annotate_pods = flags.annotate_pods || file.annotate_pods.unwrap_or(false);
        if annotate_pods && pod_resources_socket.is_none() {
            return Err(ConfigError::AnnotateWithoutPodResources);
        }
        Ok(PluginConfig {
            device_plugin_dir: flags
                .device_plugin_dir
                .clone()
                .or(file.device_plugin_dir)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_DEVICE_PLUGIN_DIR)),
            topology,
            resource_mode: flags
                .resource_mode
                .or(file.resource_mode)
                .unwrap_or_default(),
            node_name: flags.node_name.clone().or(file.node_name),
            health_file: flags.health_file.clone().or(file.health_file),
            status_addr,
            checkpoint_file: flags
                .checkpoint_file
                .clone()
                .or(file.checkpoint_file)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_CHECKPOINT_FILE)),
            pod_resources_socket,
            annotate_pods,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn defaults_follow_the_design() {
        let config = PluginConfig::merge(&Flags::default(), FileConfig::default()).unwrap();
        assert_eq!(
            config.device_plugin_dir,
            PathBuf::from(DEFAULT_DEVICE_PLUGIN_DIR)
        );
        assert_eq!(config.topology, Topology::new(8, 4).unwrap());
        assert_eq!(config.resource_mode, ResourceMode::Tile);
        assert_eq!(config.status_addr, Some("0.0.0.0:9464".parse().unwrap()));
        assert_eq!(
            config.pod_resources_socket,
            Some(PathBuf::from(DEFAULT_POD_RESOURCES_SOCKET))
        );
    }

    #[test]
    fn flags_win_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(
            &path,
            "rdusPerNode: 4\ntilesPerRdu: 8\nresourceMode: rdu\nstatusAddr: \"off\"\n",
        )
        .unwrap();
        let flags = Flags::try_parse_from([
            "rdu-device-plugin",
            "--config",
            path.to_str().unwrap(),
            "--rdus-per-node",
            "2",
            "--pod-resources-socket",
            "off",
        ])
        .unwrap();
        let config = PluginConfig::resolve(&flags).unwrap();
        assert_eq!(config.topology, Topology::new(2, 8).unwrap());
        assert_eq!(config.resource_mode, ResourceMode::Rdu);
        assert_eq!(config.status_addr, None);
        assert_eq!(config.pod_resources_socket, None);
    }

    #[test]
    fn annotating_pods_needs_the_pod_resources_socket() {
        let on = Flags::try_parse_from(["rdu-device-plugin", "--annotate-pods"]).unwrap();
        assert!(PluginConfig::resolve(&on).unwrap().annotate_pods);
        let off = Flags::try_parse_from([
            "rdu-device-plugin",
            "--annotate-pods",
            "--pod-resources-socket",
            "off",
        ])
        .unwrap();
        let err = PluginConfig::resolve(&off).unwrap_err().to_string();
        assert!(err.contains("--pod-resources-socket"), "{err}");
        let file: FileConfig = serde_yaml_ng::from_str("annotatePods: true").unwrap();
        assert!(
            PluginConfig::merge(&Flags::default(), file)
                .unwrap()
                .annotate_pods
        );
    }

    #[test]
    fn the_shipped_example_config_is_valid() {
        let file: FileConfig =
            serde_yaml_ng::from_str(include_str!("../config/device-plugin.yaml")).unwrap();
        let config = PluginConfig::merge(&Flags::default(), file).unwrap();
        assert_eq!(config.topology, Topology::new(8, 4).unwrap());
        assert_eq!(
            config.health_file,
            Some(PathBuf::from("/var/run/rdu/unhealthy"))
        );
    }

    #[test]
    fn bad_values_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "rdusPerNodes: 4\n").unwrap();
        let flags = Flags {
            config: Some(path),
            ..Flags::default()
        };
        let err = PluginConfig::resolve(&flags).unwrap_err();
        let text = rdu_error_chain::chain(&err);
        assert!(text.contains("rdusPerNodes"), "{text}");
        let flags = Flags {
            tiles_per_rdu: Some(0),
            ..Flags::default()
        };
        assert!(
            PluginConfig::resolve(&flags)
                .unwrap_err()
                .to_string()
                .contains("tilesPerRdu")
        );
        let flags = Flags {
            status_addr: Some("localhost".into()),
            ..Flags::default()
        };
        assert!(
            PluginConfig::resolve(&flags)
                .unwrap_err()
                .to_string()
                .contains("localhost")
        );
        assert!(Flags::try_parse_from(["x", "--resource-mode", "gpu"]).is_err());
    }
}
