//! Shared-memory domains (DESIGN 4.4.1): one directory per job and node under the driver's domain root, made
//! when the first of the job's claims on the node is prepared, mounted by the CDI spec into that job's rank
//! containers only, and removed once no prepared claim names it. The ranks serve their ring sockets in it.

use crate::devices::DRIVER_NAME;
use k8s_openapi::api::resource::v1::ResourceClaim;
use rdu_crds::shm_domain::{DomainConfig, DomainConfigError};
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Where domains are made by default: a tmpfs on most nodes, so a reboot leaves none behind.
pub const DEFAULT_DOMAIN_DIR: &str = "/run/rdu-dra/domains";
/// The root's mode: only the driver walks it; a container reaches its domain through its own mount.
const ROOT_MODE: u32 = 0o700;
/// A domain's mode: any uid of the job's ranks may serve a socket; the sticky bit keeps each rank's socket its own.
const DOMAIN_MODE: u32 = 0o1777;
/// Longest namespace (a DNS label).
const MAX_NAMESPACE_LEN: usize = 63;

/// Errors finding, making or removing domains.
#[derive(Debug, thiserror::Error)]
pub enum DomainError {
    #[error(
        "ResourceClaim {namespace}/{name} has more than one opaque configuration of driver {DRIVER_NAME}"
    )]
    TwoConfigs { namespace: String, name: String },
    #[error("ResourceClaim {namespace}/{name}: status.allocation.devices.config")]
    Config {
        namespace: String,
        name: String,
        #[source]
        source: DomainConfigError,
    },
    #[error("namespace `{0}` is not a DNS label, so it cannot name a domain")]
    Namespace(String),
    #[error("cannot make shared-memory domain {path}")]
    Make {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot list shared-memory domains in {path}")]
    List {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot remove shared-memory domain {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The domain a prepared claim joins, if its allocation carries the driver's [`DomainConfig`]; the name of its
/// directory is `<claim namespace>_<job>`, so claims of another namespace never share it.
pub fn domain_of(claim: &ResourceClaim) -> Result<Option<String>, DomainError> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let configs: Vec<&serde_json::Value> = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.opaque.as_ref())
        .filter(|o| o.driver == DRIVER_NAME)
        .map(|o| &o.parameters.0)
        .collect();
    let parameters = match configs.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        _ => return Err(DomainError::TwoConfigs { namespace, name }),
    };
    let config = DomainConfig::parse(parameters).map_err(|source| DomainError::Config {
        namespace: namespace.clone(),
        name,
        source,
    })?;
    domain_name(&namespace, &config.job).map(Some)
}

fn domain_name(namespace: &str, job: &str) -> Result<String, DomainError> {
    let label = namespace.as_bytes();
    let valid = !label.is_empty()
        && label.len() <= MAX_NAMESPACE_LEN
        && label[0].is_ascii_alphanumeric()
        && label
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    if !valid {
        return Err(DomainError::Namespace(namespace.to_string()));
    }
    // A DNS label has no '_', and DomainConfig::parse let only letters, digits and '-' into `job`.
    Ok(format!("{namespace}_{job}"))
}

/// The directory domains are made in.
#[derive(Debug, Clone)]
pub struct Domains {
    root: PathBuf,
}

impl Domains {
    pub fn new(root: impl Into<PathBuf>) -> Domains {
        Domains { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Makes domain `name` (a name [`domain_of`] returned) if it is not there; its path on the node.
    pub fn make(&self, name: &str) -> Result<PathBuf, DomainError> {
        let made = |path: &Path, mode: u32| -> Result<(), DomainError> {
            let make = |source| DomainError::Make {
                path: path.to_path_buf(),
                source,
            };
            match std::fs::create_dir(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(source) => return Err(make(source)),
            }
            // Set after creating: the umask would take the write bits off.
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(make)
        };
        if let Some(parent) = self.root.parent() {
            std::fs::create_dir_all(parent).map_err(|source| DomainError::Make {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        made(&self.root, ROOT_MODE)?;
        let path = self.root.join(name);
        made(&path, DOMAIN_MODE)?;
        Ok(path)
    }

    /// Removes every domain not in `keep` (with the sockets left in it); the names removed. One that cannot be
    /// removed does not keep the others: the first such failure is returned once every other has been tried.
    pub fn sweep(&self, keep: &BTreeSet<String>) -> Result<Vec<String>, DomainError> {
        self.sweep_with(keep, |path, is_dir| {
            if is_dir {
                std::fs::remove_dir_all(path)
            } else {
                std::fs::remove_file(path)
            }
        })
    }

    /// [`Domains::sweep`] with `remove(path, is_dir)` removing each entry.
    fn sweep_with(
        &self,
        keep: &BTreeSet<String>,
        remove: impl Fn(&Path, bool) -> std::io::Result<()>,
    ) -> Result<Vec<String>, DomainError> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(DomainError::List {
                    path: self.root.clone(),
                    source,
                });
            }
        };
        let mut removed = Vec::new();
        let mut failed = None;
        for entry in entries {
            let entry = entry.map_err(|source| DomainError::List {
                path: self.root.clone(),
                source,
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if keep.contains(&name) {
                continue;
            }
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            match remove(&path, is_dir) {
                Ok(()) => removed.push(name),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    failed.get_or_insert(DomainError::Remove { path, source });
                }
            }
        }
        removed.sort();
        failed.map_or(Ok(removed), Err)
    }
}

#[cfg(test)]
mod tests;
