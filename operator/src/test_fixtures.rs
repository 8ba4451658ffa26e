//! Inline YAML fixtures shared by the unit tests (the validate module's `valid` gives one as validated). Imports
//! nothing from the crate, so every module's tests may use it.

use rdu_crds::RduJob;

/// A small valid job named `name` with `workers` ranks, parsed from YAML as a user would write it.
pub(crate) fn job(name: &str, namespace: Option<&str>, workers: u32) -> RduJob {
    let ns = namespace
        .map(|n| format!("  namespace: {n}\n"))
        .unwrap_or_default();
    let yaml = format!(
        "apiVersion: rdu.dev/v1alpha1
kind: RduJob
metadata:
  name: {name}
{ns}  uid: uid-{name}
spec:
  workers: {workers}
  tilesPerWorker: 2
  image: ghcr.io/rdu/worker:1
  model: {{name: ffn-logreg, hiddenSizes: [32]}}
  data: {{source: synthetic, samples: 256}}
  training: {{epochs: 1, batchSize: 16, learningRate: 0.1}}
"
    );
    rdu_crds::parse_manifest(&yaml).expect("fixture parses")
}

/// Parses a fixture given as full YAML.
pub(crate) fn job_from(yaml: &str) -> RduJob {
    rdu_crds::parse_manifest(yaml).expect("fixture parses")
}

/// The API server's refusal `reason` with HTTP `code` and `message`, as kube returns it.
pub(crate) fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure(message, reason)
            .with_code(code)
            .boxed(),
    )
}
