//! A minimal valid job spec shared by the worker's unit tests.

use rdu_crds::RduJobSpec;

pub(crate) const MINIMAL: &str = r#"
apiVersion: rdu.dev/v1alpha1
kind: RduJob
metadata: {name: t}
spec:
  workers: 2
  model: {name: ffn-logreg, hiddenSizes: [8]}
  data: {source: synthetic, samples: 64}
  training: {epochs: 1, batchSize: 8, learningRate: 0.1}
"#;

pub(crate) fn minimal() -> RduJobSpec {
    rdu_crds::parse_manifest(MINIMAL).unwrap().spec
}
