//! Reading the RduJob file a user would `kubectl apply`, with `--workers` applied, validated by the
//! same rules as the CRD.

use std::path::{Path, PathBuf};

use rdu_crds::RduJob;

use crate::error::CliError;

/// A validated job and the directory its relative data paths are relative to.
#[derive(Debug, Clone)]
pub(crate) struct LocalJob {
    pub job: RduJob,
    pub dir: PathBuf,
}

/// Reads, overrides the world size with `workers` and the mode with `mode` when given, and validates.
pub(crate) fn load(
    path: &Path,
    workers: Option<u32>,
    mode: Option<rdu_crds::RunMode>,
) -> Result<LocalJob, CliError> {
    let text = std::fs::read_to_string(path).map_err(|source| CliError::ReadManifest {
        path: path.to_path_buf(),
        source,
    })?;
    let mut job = rdu_crds::parse_manifest(&text).map_err(|source| match source {
        // Decoding from the text (not from a parsed value) names the field and the line.
        rdu_crds::ManifestError::Yaml(_) => match serde_yaml_ng::from_str::<RduJob>(&text) {
            Err(located) => CliError::Invalid {
                path: path.to_path_buf(),
                errors: vec![located.to_string()],
            },
            Ok(_) => CliError::Manifest {
                path: path.to_path_buf(),
                source,
            },
        },
        other => CliError::Manifest {
            path: path.to_path_buf(),
            source: other,
        },
    })?;
    if let Some(n) = workers {
        job.spec.workers = n;
    }
    if let Some(mode) = mode {
        job.spec.mode = mode;
    }
    if let Err(errors) = rdu_crds::validate_job(&job) {
        return Err(CliError::Invalid {
            path: path.to_path_buf(),
            errors: errors.into_iter().map(|e| e.message).collect(),
        });
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let dir = dir
        .canonicalize()
        .map_err(|source| CliError::ReadManifest { path: dir, source })?;
    Ok(LocalJob { job, dir })
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = "apiVersion: rdu.dev/v1alpha1\nkind: RduJob\nmetadata: {name: t}\nspec:\n  workers: 2\n  model: {name: ffn-logreg}\n  data: {source: synthetic}\n  training: {epochs: 1, batchSize: 8, learningRate: 0.1}\n";

    #[test]
    fn workers_override_and_the_directory_is_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.yaml");
        std::fs::write(&path, JOB).unwrap();
        let job = load(&path, Some(3), None).unwrap();
        assert_eq!(job.job.spec.workers, 3);
        assert_eq!(job.dir, dir.path().canonicalize().unwrap());
        let err = load(&path, Some(0), None).unwrap_err().to_string();
        assert!(err.contains("spec.workers"), "{err}");
    }

    #[test]
    fn a_missing_file_is_a_config_error() {
        let err = load(Path::new("/nonexistent/job.yaml"), None, None).unwrap_err();
        assert_eq!(err.exit_code(), 64);
        assert!(
            matches!(&err, CliError::ReadManifest { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
        );
        let line = crate::error::chain(&err);
        assert!(
            line.starts_with("cannot read /nonexistent/job.yaml: "),
            "{line}"
        );
    }
}
