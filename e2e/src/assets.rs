//! Finds the control-plane binaries through `KUBEBUILDER_ASSETS`.

use std::path::{Path, PathBuf};

/// Env var naming the directory of etcd, kube-apiserver, kube-scheduler, kube-controller-manager.
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";

/// Errors locating the binaries.
#[derive(Debug, thiserror::Error)]
pub enum AssetsError {
    #[error(
        "{ASSETS_ENV} is not set: run `bash e2e/control-plane/run.sh`, or point it at a directory holding etcd, kube-apiserver, kube-scheduler and kube-controller-manager (e.g. from setup-envtest)"
    )]
    NotSet,
    #[error(
        "{ASSETS_ENV}={dir} has no executable `{binary}`: rebuild with `bash e2e/control-plane/build.sh`"
    )]
    Missing { dir: String, binary: &'static str },
}

/// Paths of the control-plane binaries.
#[derive(Debug, Clone)]
pub struct Assets {
    pub dir: PathBuf,
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kube_controller_manager: PathBuf,
}

impl Assets {
    /// Checks that every binary exists in `dir`.
    pub fn in_dir(dir: &Path) -> Result<Self, AssetsError> {
        let find = |binary: &'static str| {
            let path = dir.join(binary);
            if path.is_file() {
                Ok(path)
            } else {
                Err(AssetsError::Missing {
                    dir: dir.display().to_string(),
                    binary,
                })
            }
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            etcd: find("etcd")?,
            kube_apiserver: find("kube-apiserver")?,
            kube_scheduler: find("kube-scheduler")?,
            kube_controller_manager: find("kube-controller-manager")?,
        })
    }

    /// The binaries named by `KUBEBUILDER_ASSETS`.
    pub fn from_env() -> Result<Self, AssetsError> {
        match std::env::var_os(ASSETS_ENV) {
            Some(dir) if !dir.is_empty() => Self::in_dir(Path::new(&dir)),
            _ => Err(AssetsError::NotSet),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_without_the_binaries_names_the_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("etcd"), b"").unwrap();
        match Assets::in_dir(dir.path()) {
            Err(AssetsError::Missing { binary, .. }) => assert_eq!(binary, "kube-apiserver"),
            other => panic!("expected Missing, got {other:?}"),
        }
    }
}
