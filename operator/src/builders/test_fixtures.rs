//! Inline YAML fixtures shared by the builder and state-machine tests.

use rdu_crds::RduJob;

use crate::validate::{ValidJob, validate};

/// A small valid job named `name` with `workers` ranks, parsed from YAML as a user would write it.
pub fn job(name: &str, namespace: Option<&str>, workers: u32) -> RduJob {
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
pub fn job_from(yaml: &str) -> RduJob {
    rdu_crds::parse_manifest(yaml).expect("fixture parses")
}

/// The job as the validate step passes it on (the fixture must be valid).
pub fn valid(job: &RduJob) -> ValidJob<'_> {
    validate(job).expect("fixture is valid")
}
