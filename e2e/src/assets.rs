//! Finds the control-plane binaries through `KUBEBUILDER_ASSETS` and decides whether a test skips.

use std::path::{Path, PathBuf};

/// Env var naming the directory of etcd, kube-apiserver, kube-scheduler, kube-controller-manager.
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";
/// Env var that turns a skip into a failure (CI sets it to 1).
pub const REQUIRE_ENV: &str = "RDU_REQUIRE_CONTROL_PLANE";

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

/// What a test does when the binaries are missing.
#[derive(Debug, PartialEq, Eq)]
pub enum Missing {
    Skip(String),
    Fail(String),
}

/// Pure decision: skip, unless the environment requires the control plane.
pub fn on_missing(error: &AssetsError, require: Option<&str>) -> Missing {
    if require == Some("1") {
        Missing::Fail(format!("{REQUIRE_ENV}=1 but {error}"))
    } else {
        Missing::Skip(format!("skipped: {error}"))
    }
}

/// The binaries, or `None` after printing why the test skips. Panics (failing the test) when they are
/// missing and `RDU_REQUIRE_CONTROL_PLANE=1`.
pub fn assets_or_skip(test: &str) -> Option<Assets> {
    match Assets::from_env() {
        Ok(assets) => Some(assets),
        Err(error) => match on_missing(&error, std::env::var(REQUIRE_ENV).ok().as_deref()) {
            Missing::Skip(message) => {
                eprintln!("{test}: {message}");
                None
            }
            Missing::Fail(message) => panic!("{test}: {message}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_assets_skip_unless_required() {
        assert!(matches!(
            on_missing(&AssetsError::NotSet, None),
            Missing::Skip(_)
        ));
        assert!(matches!(
            on_missing(&AssetsError::NotSet, Some("0")),
            Missing::Skip(_)
        ));
        match on_missing(&AssetsError::NotSet, Some("1")) {
            Missing::Fail(m) => assert!(m.contains("KUBEBUILDER_ASSETS is not set"), "{m}"),
            other => panic!("expected a failure, got {other:?}"),
        }
    }

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
