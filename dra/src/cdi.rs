//! CDI specs of prepared claims: one file `rdu.dev-<claim uid>.json` per claim in the CDI directory, with one device
//! named after the claim whose env gives the container its tiles (`SF_RNT_TILE_AFFINITY`, `RDU_VISIBLE_TILES`)
//! and, when the claim joins a shared-memory domain, mounts that domain and names it (`RDU_SHM_DOMAIN`).

use crate::atomic_file::{self, AtomicWriteError};
use rdu_crds::shm_domain;
use rdu_tiles::affinity::container_env;
use rdu_tiles::topology::{TileIndex, Topology};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where container runtimes look for CDI specs by default.
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
/// The CDI kind (`vendor/class`) of the driver's devices.
pub const CDI_KIND: &str = "rdu.dev/tile";
/// The CDI spec version written.
pub const CDI_VERSION: &str = "0.6.0";
/// Longest claim UID accepted (Kubernetes UIDs are 36 characters).
const MAX_UID_LEN: usize = 128;

/// Errors writing or removing a claim's CDI spec.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error(
        "claim UID `{0}` cannot name a CDI device or file: expected 1 to {MAX_UID_LEN} of [A-Za-z0-9_.:-], starting with a letter or digit (a CDI device name)"
    )]
    InvalidUid(String),
    #[error("cannot encode the CDI spec of claim {uid}")]
    Encode {
        uid: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot write the CDI spec of claim {uid}")]
    Write {
        uid: String,
        #[source]
        source: AtomicWriteError,
    },
    #[error("cannot remove CDI spec {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A CDI spec file (the part of the format this driver writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<SpecDevice>,
}

/// One CDI device of a spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecDevice {
    pub name: String,
    pub container_edits: ContainerEdits,
}

/// What a CDI device changes in a container: env (`NAME=value`) and mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerEdits {
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

/// A bind mount of a node's directory into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    pub options: Vec<String>,
}

/// The bind mount of shared-memory domain `dir` at [`shm_domain::MOUNT_PATH`]: read-write, no devices, no setuid.
fn domain_mount(dir: &Path) -> Mount {
    Mount {
        host_path: dir.display().to_string(),
        container_path: shm_domain::MOUNT_PATH.to_string(),
        options: ["rbind", "rw", "nosuid", "nodev", "noexec"]
            .map(String::from)
            .to_vec(),
    }
}

/// The fully qualified CDI device ID of a claim: `rdu.dev/tile=<uid>`.
pub fn device_id(uid: &str) -> String {
    format!("{CDI_KIND}={uid}")
}

/// The spec of a claim allocated `tiles`, in shared-memory domain `domain` (the node's path) if it has one.
pub fn claim_spec(
    uid: &str,
    topology: &Topology,
    tiles: &[TileIndex],
    domain: Option<&Path>,
) -> Spec {
    let mut env: Vec<String> = container_env(topology, tiles)
        .into_iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    let mut mounts = Vec::new();
    if let Some(dir) = domain {
        env.push(format!("{}={}", shm_domain::ENV, shm_domain::MOUNT_PATH));
        mounts.push(domain_mount(dir));
    }
    Spec {
        cdi_version: CDI_VERSION.to_string(),
        kind: CDI_KIND.to_string(),
        devices: vec![SpecDevice {
            name: uid.to_string(),
            container_edits: ContainerEdits { env, mounts },
        }],
    }
}

fn check_uid(uid: &str) -> Result<(), CdiError> {
    let valid_char = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-');
    if uid.is_empty()
        || uid.len() > MAX_UID_LEN
        || !uid.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !uid.bytes().all(valid_char)
    {
        return Err(CdiError::InvalidUid(uid.to_string()));
    }
    Ok(())
}

/// The CDI directory the driver writes claim specs into.
#[derive(Debug, Clone)]
pub struct CdiDir {
    dir: PathBuf,
}

impl CdiDir {
    pub fn new(dir: impl Into<PathBuf>) -> CdiDir {
        CdiDir { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<dir>/rdu.dev-<uid>.json`.
    pub fn spec_path(&self, uid: &str) -> Result<PathBuf, CdiError> {
        check_uid(uid)?;
        Ok(self.dir.join(format!("rdu.dev-{uid}.json")))
    }

    /// Writes (or replaces) the spec of claim `uid` allocated `tiles` (in `domain`, if any); returns its CDI
    /// device ID.
    pub fn write_claim(
        &self,
        uid: &str,
        topology: &Topology,
        tiles: &[TileIndex],
        domain: Option<&Path>,
    ) -> Result<String, CdiError> {
        let path = self.spec_path(uid)?;
        let spec = claim_spec(uid, topology, tiles, domain);
        let bytes = serde_json::to_vec_pretty(&spec).map_err(|source| CdiError::Encode {
            uid: uid.to_string(),
            source,
        })?;
        atomic_file::write(&path, &bytes).map_err(|source| CdiError::Write {
            uid: uid.to_string(),
            source,
        })?;
        Ok(device_id(uid))
    }

    /// Removes the spec of claim `uid`; a spec that is not there is already removed.
    pub fn remove_claim(&self, uid: &str) -> Result<(), CdiError> {
        let path = self.spec_path(uid)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(CdiError::Remove { path, source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b6c8a2e-2f3d-4d6e-9a7b-1c2d3e4f5a6b";

    #[test]
    fn writes_a_spec_with_the_mask_and_tile_names() {
        let dir = tempfile::tempdir().unwrap();
        let cdi = CdiDir::new(dir.path().join("cdi"));
        let topo = Topology::new(8, 4).unwrap();
        let tiles = [topo.tile_index(1, 1), topo.tile_index(1, 0)];
        let id = cdi.write_claim(UID, &topo, &tiles, None).unwrap();
        assert_eq!(id, format!("rdu.dev/tile={UID}"));
        let path = dir.path().join("cdi").join(format!("rdu.dev-{UID}.json"));
        let value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "cdiVersion": "0.6.0",
                "kind": "rdu.dev/tile",
                "devices": [{
                    "name": UID,
                    "containerEdits": {"env": [
                        "RDU_VISIBLE_TILES=rdu1-tile0,rdu1-tile1",
                        "SF_RNT_TILE_AFFINITY=0x30",
                    ]},
                }],
            })
        );
    }

    #[test]
    fn a_claim_in_a_domain_mounts_it_and_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let cdi = CdiDir::new(dir.path());
        let topo = Topology::new(2, 2).unwrap();
        let domain = Path::new("/run/rdu-dra/domains/ml_job-a");
        cdi.write_claim(UID, &topo, &[0], Some(domain)).unwrap();
        let value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(cdi.spec_path(UID).unwrap()).unwrap()).unwrap();
        assert_eq!(
            value["devices"][0]["containerEdits"],
            serde_json::json!({
                "env": [
                    "RDU_VISIBLE_TILES=rdu0-tile0",
                    "SF_RNT_TILE_AFFINITY=0x1",
                    "RDU_SHM_DOMAIN=/run/rdu-shm-domain",
                ],
                "mounts": [{
                    "hostPath": "/run/rdu-dra/domains/ml_job-a",
                    "containerPath": "/run/rdu-shm-domain",
                    "options": ["rbind", "rw", "nosuid", "nodev", "noexec"],
                }],
            })
        );
    }

    #[test]
    fn removing_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let cdi = CdiDir::new(dir.path());
        let topo = Topology::new(2, 2).unwrap();
        cdi.write_claim(UID, &topo, &[3], None).unwrap();
        let path = cdi.spec_path(UID).unwrap();
        assert!(path.exists());
        cdi.remove_claim(UID).unwrap();
        assert!(!path.exists());
        cdi.remove_claim(UID).unwrap();
    }

    #[test]
    fn refuses_uids_that_are_not_plain_names() {
        let dir = tempfile::tempdir().unwrap();
        let cdi = CdiDir::new(dir.path());
        let topo = Topology::new(2, 2).unwrap();
        for bad in ["", "../etc/passwd", "a/b", ".hidden", "-x", "a b"] {
            let err = cdi.write_claim(bad, &topo, &[0], None).unwrap_err();
            assert!(matches!(err, CdiError::InvalidUid(_)), "{bad}: {err}");
            assert!(cdi.remove_claim(bad).is_err(), "{bad}");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
