//! The shared-memory domain of a job on a node (DESIGN 4.4.1), the contract between the operator and the DRA
//! driver: the opaque configuration the operator puts in every rank's ResourceClaim, and where the driver mounts
//! the domain's directory in the rank's container.

use serde::{Deserialize, Serialize};

/// `apiVersion` of [`DomainConfig`].
pub const API_VERSION: &str = "rdu.dev/v1alpha1";
/// `kind` of [`DomainConfig`].
pub const KIND: &str = "SharedMemoryDomain";
/// Where the domain's directory appears in a rank's container (short: ring sockets are named inside it).
pub const MOUNT_PATH: &str = "/run/rdu-shm-domain";
/// The variable naming [`MOUNT_PATH`] in the container; the collective serves and finds ring sockets there.
pub const ENV: &str = "RDU_SHM_DOMAIN";
/// Longest `job`: a Kubernetes UID is 36 characters.
pub const MAX_JOB_LEN: usize = 64;

/// Errors reading a claim's domain configuration; each names the field.
#[derive(Debug, thiserror::Error)]
pub enum DomainConfigError {
    #[error(
        "the rdu.dev opaque parameters are not a {KIND} (apiVersion, kind and job, nothing else)"
    )]
    Decode(#[source] serde_json::Error),
    #[error("the rdu.dev opaque parameters have apiVersion `{0}`; this driver reads {API_VERSION}")]
    ApiVersion(String),
    #[error("the rdu.dev opaque parameters have kind `{0}`; this driver reads {KIND}")]
    Kind(String),
    #[error(
        "the rdu.dev opaque parameters' job `{0}` must be 1 to {MAX_JOB_LEN} letters, digits or '-', starting \
         with a letter or digit (the job's UID)"
    )]
    Job(String),
}

/// The opaque parameters of driver `rdu.dev` in a rank's claim: the ranks whose claims name the same `job` in
/// the same namespace share one domain on each node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DomainConfig {
    pub api_version: String,
    pub kind: String,
    /// The job's UID.
    pub job: String,
}

impl DomainConfig {
    /// The configuration of the job with UID `uid`.
    pub fn for_job(uid: &str) -> DomainConfig {
        DomainConfig {
            api_version: API_VERSION.to_string(),
            kind: KIND.to_string(),
            job: uid.to_string(),
        }
    }

    /// Reads and checks parameters written by anybody who can write a ResourceClaim.
    pub fn parse(parameters: &serde_json::Value) -> Result<DomainConfig, DomainConfigError> {
        let config: DomainConfig =
            serde_json::from_value(parameters.clone()).map_err(DomainConfigError::Decode)?;
        if config.api_version != API_VERSION {
            return Err(DomainConfigError::ApiVersion(config.api_version));
        }
        if config.kind != KIND {
            return Err(DomainConfigError::Kind(config.kind));
        }
        let job = config.job.as_bytes();
        let valid = !job.is_empty()
            && job.len() <= MAX_JOB_LEN
            && job[0].is_ascii_alphanumeric()
            && job.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-');
        if !valid {
            return Err(DomainConfigError::Job(config.job));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_jobs_config_reads_back() {
        let config = DomainConfig::for_job("0b6c8a2e-2f3d-4d6e-9a7b-1c2d3e4f5a6b");
        let value = serde_json::to_value(&config).unwrap();
        assert_eq!(
            value,
            json!({"apiVersion": API_VERSION, "kind": KIND, "job": "0b6c8a2e-2f3d-4d6e-9a7b-1c2d3e4f5a6b"})
        );
        assert_eq!(DomainConfig::parse(&value).unwrap(), config);
    }

    #[test]
    fn refuses_what_is_not_a_plain_config() {
        let cases = [
            (json!("text"), "not a SharedMemoryDomain"),
            (
                json!({"apiVersion": API_VERSION, "kind": KIND, "job": "a", "extra": 1}),
                "nothing else",
            ),
            (
                json!({"apiVersion": "v2", "kind": KIND, "job": "a"}),
                "apiVersion `v2`",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "Other", "job": "a"}),
                "kind `Other`",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": KIND, "job": "../etc"}),
                "job `../etc`",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": KIND, "job": ""}),
                "job ``",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": KIND, "job": "a".repeat(65)}),
                "1 to 64",
            ),
        ];
        for (value, expected) in cases {
            let err = DomainConfig::parse(&value).unwrap_err().to_string();
            assert!(err.contains(expected), "{value}: {err}");
        }
    }
}
