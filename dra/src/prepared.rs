//! The checkpoint of prepared claims (claim UID → namespace, name, devices and their CDI IDs), kept in a JSON file
//! written atomically on every change, so prepare and unprepare stay idempotent across a restart of the driver.

use crate::atomic_file::{self, AtomicWriteError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The checkpoint file name in the driver's plugin directory.
pub const CHECKPOINT_FILE: &str = "prepared-claims.json";
/// The version of the checkpoint format this driver reads and writes.
pub const CHECKPOINT_VERSION: u32 = 1;

/// Errors reading or writing the checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum PreparedError {
    #[error("cannot read checkpoint {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "checkpoint {path} is not a valid checkpoint; move it away to start with no prepared claims"
    )]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "checkpoint {path} has version {found}, this driver reads version {CHECKPOINT_VERSION}"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("cannot encode checkpoint {path}")]
    Encode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot write checkpoint")]
    Write(#[source] AtomicWriteError),
}

/// One device of a prepared claim, as the kubelet is told about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
}

/// A prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub devices: Vec<PreparedDevice>,
    /// The shared-memory domain the claim joined (`crate::domain`), if any; absent in checkpoints written
    /// before domains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct File {
    version: u32,
    claims: BTreeMap<String, PreparedClaim>,
}

/// The prepared claims by UID, mirrored in the checkpoint file.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    claims: BTreeMap<String, PreparedClaim>,
}

impl Checkpoint {
    /// Loads the checkpoint at `path`; a missing file means nothing is prepared.
    pub fn load(path: impl Into<PathBuf>) -> Result<Checkpoint, PreparedError> {
        let path = path.into();
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checkpoint {
                    path,
                    claims: BTreeMap::new(),
                });
            }
            Err(source) => return Err(PreparedError::Read { path, source }),
        };
        let file: File = match serde_json::from_slice(&bytes) {
            Ok(file) => file,
            Err(source) => return Err(PreparedError::Decode { path, source }),
        };
        if file.version != CHECKPOINT_VERSION {
            return Err(PreparedError::Version {
                path,
                found: file.version,
            });
        }
        Ok(Checkpoint {
            path,
            claims: file.claims,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, uid: &str) -> Option<&PreparedClaim> {
        self.claims.get(uid)
    }

    /// The prepared claims by UID.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &PreparedClaim)> {
        self.claims.iter().map(|(uid, claim)| (uid.as_str(), claim))
    }

    pub fn len(&self) -> usize {
        self.claims.len()
    }

    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    /// The shared-memory domains some prepared claim joined: those that must stay.
    pub fn domains(&self) -> BTreeSet<String> {
        self.claims
            .values()
            .filter_map(|c| c.domain.clone())
            .collect()
    }

    /// Records claim `uid` as prepared and saves; on a failed save the claim is not recorded.
    pub fn insert(&mut self, uid: &str, claim: PreparedClaim) -> Result<(), PreparedError> {
        let previous = self.claims.insert(uid.to_string(), claim);
        self.save().inspect_err(|_| {
            match previous {
                Some(previous) => self.claims.insert(uid.to_string(), previous),
                None => self.claims.remove(uid),
            };
        })
    }

    /// Forgets claim `uid` and saves; returns what was recorded. Forgetting an unknown claim changes nothing.
    pub fn remove(&mut self, uid: &str) -> Result<Option<PreparedClaim>, PreparedError> {
        let Some(claim) = self.claims.remove(uid) else {
            return Ok(None);
        };
        match self.save() {
            Ok(()) => Ok(Some(claim)),
            Err(e) => {
                self.claims.insert(uid.to_string(), claim);
                Err(e)
            }
        }
    }

    fn save(&self) -> Result<(), PreparedError> {
        let file = File {
            version: CHECKPOINT_VERSION,
            claims: self.claims.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&file).map_err(|source| PreparedError::Encode {
            path: self.path.clone(),
            source,
        })?;
        atomic_file::write(&self.path, &bytes).map_err(PreparedError::Write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str) -> PreparedClaim {
        PreparedClaim {
            namespace: "ns".into(),
            name: name.into(),
            devices: vec![PreparedDevice {
                request_names: vec!["tiles".into()],
                pool_name: "node-a".into(),
                device_name: "rdu0-tile1".into(),
                cdi_device_ids: vec!["rdu.dev/tile=uid-1".into()],
            }],
            domain: None,
        }
    }

    #[test]
    fn reads_a_checkpoint_from_before_domains_and_lists_the_domains_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE);
        std::fs::write(
            &path,
            br#"{"version":1,"claims":{"uid-1":{"namespace":"ns","name":"a","devices":[]}}}"#,
        )
        .unwrap();
        let mut cp = Checkpoint::load(&path).unwrap();
        assert_eq!(cp.get("uid-1").unwrap().domain, None);
        assert!(cp.domains().is_empty());
        for (uid, domain) in [
            ("uid-2", "ns_job-a"),
            ("uid-3", "ns_job-a"),
            ("uid-4", "ns_job-b"),
        ] {
            let mut joined = claim(uid);
            joined.domain = Some(domain.into());
            cp.insert(uid, joined).unwrap();
        }
        let again = Checkpoint::load(&path).unwrap();
        let domains: Vec<String> = again.domains().into_iter().collect();
        assert_eq!(domains, ["ns_job-a", "ns_job-b"]);
    }

    #[test]
    fn a_missing_file_is_an_empty_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::load(dir.path().join(CHECKPOINT_FILE)).unwrap();
        assert!(cp.is_empty());
        assert!(!cp.path().exists());
    }

    #[test]
    fn claims_survive_a_reload_and_removal_is_saved() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugin").join(CHECKPOINT_FILE);
        let mut cp = Checkpoint::load(&path).unwrap();
        cp.insert("uid-1", claim("a")).unwrap();
        cp.insert("uid-2", claim("b")).unwrap();
        let mut again = Checkpoint::load(&path).unwrap();
        assert_eq!(again.len(), 2);
        assert_eq!(again.get("uid-1"), Some(&claim("a")));
        assert_eq!(again.remove("uid-1").unwrap(), Some(claim("a")));
        assert_eq!(again.remove("uid-1").unwrap(), None);
        let third = Checkpoint::load(&path).unwrap();
        assert_eq!(third.get("uid-1"), None);
        assert_eq!(third.get("uid-2"), Some(&claim("b")));
    }

    #[test]
    fn a_failed_save_does_not_record_the_claim() {
        let dir = tempfile::tempdir().unwrap();
        // The checkpoint's directory is a file, so no save can succeed.
        let blocker = dir.path().join("blocker");
        let mut cp = Checkpoint::load(blocker.join(CHECKPOINT_FILE)).unwrap();
        std::fs::write(&blocker, b"").unwrap();
        assert!(cp.insert("uid-1", claim("a")).is_err());
        assert_eq!(cp.get("uid-1"), None);
    }

    #[test]
    fn refuses_corrupt_or_foreign_versions_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE);
        std::fs::write(&path, b"{not json").unwrap();
        let err = Checkpoint::load(&path).unwrap_err();
        assert!(matches!(err, PreparedError::Decode { .. }), "{err}");
        assert!(err.to_string().contains(CHECKPOINT_FILE), "{err}");
        std::fs::write(&path, br#"{"version":2,"claims":{}}"#).unwrap();
        let err = Checkpoint::load(&path).unwrap_err();
        assert!(
            matches!(err, PreparedError::Version { found: 2, .. }),
            "{err}"
        );
    }
}
