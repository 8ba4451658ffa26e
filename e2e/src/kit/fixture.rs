//! RduJob manifests for the tests: one valid job, whose fields each test changes, instead of a JSON literal per
//! test file.

use serde_json::{Map, Value, json};

/// The worker image the control-plane tests' jobs name (no kubelet pulls it).
pub const WORKER_IMAGE: &str = "rdu-worker:0.1.0";

/// An RduJob manifest: by default 2 ranks of 1 tile each, image [`WORKER_IMAGE`], `ffn-logreg` with one hidden
/// layer of 16 on 512 synthetic samples, one epoch of batches of 8 at learning rate 0.1.
#[derive(Debug, Clone)]
#[must_use]
pub struct JobFixture {
    namespace: String,
    name: String,
    labels: Map<String, Value>,
    spec: Map<String, Value>,
}

impl JobFixture {
    /// The default job `namespace/name`.
    pub fn new(namespace: &str, name: &str) -> Self {
        let spec = json!({
            "workers": 2, "tilesPerWorker": 1, "image": WORKER_IMAGE,
            "model": {"name": "ffn-logreg", "hiddenSizes": [16]},
            "data": {"source": "synthetic", "samples": 512},
            "training": {"epochs": 1, "batchSize": 8, "learningRate": 0.1}
        });
        let Value::Object(spec) = spec else {
            unreachable!("a JSON object literal")
        };
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            labels: Map::new(),
            spec,
        }
    }

    /// A label on the job (`kueue.x-k8s.io/queue-name` queues it).
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), json!(value));
        self
    }

    /// `spec.workers`.
    pub fn workers(self, workers: u32) -> Self {
        self.set("workers", json!(workers))
    }

    /// `spec.tilesPerWorker`.
    pub fn tiles_per_worker(self, tiles: u32) -> Self {
        self.set("tilesPerWorker", json!(tiles))
    }

    /// `spec.image`.
    pub fn image(self, image: &str) -> Self {
        self.set("image", json!(image))
    }

    /// `spec.model`.
    pub fn model(self, model: Value) -> Self {
        self.set("model", model)
    }

    /// `spec.data`.
    pub fn data(self, data: Value) -> Self {
        self.set("data", data)
    }

    /// `spec.training`.
    pub fn training(self, training: Value) -> Self {
        self.set("training", training)
    }

    /// `spec.training.epochs`, the rest of `spec.training` kept.
    pub fn epochs(mut self, epochs: u32) -> Self {
        self.spec["training"]["epochs"] = json!(epochs);
        self
    }

    /// `spec.checkpoint`.
    pub fn checkpoint(self, checkpoint: Value) -> Self {
        self.set("checkpoint", checkpoint)
    }

    /// `spec.runPolicy`.
    pub fn run_policy(self, run_policy: Value) -> Self {
        self.set("runPolicy", run_policy)
    }

    /// `spec.template` (a pod template merged into every rank's pod).
    pub fn template(self, template: Value) -> Self {
        self.set("template", template)
    }

    /// Any other field of `spec`: `spec.<field> = value`.
    pub fn set(mut self, field: &str, value: Value) -> Self {
        self.spec.insert(field.to_string(), value);
        self
    }

    /// Leaves `spec.<field>` out (for a default the API server or the operator fills in).
    pub fn without(mut self, field: &str) -> Self {
        self.spec.remove(field);
        self
    }

    /// The manifest as a JSON value.
    pub fn value(&self) -> Value {
        json!({
            "apiVersion": "rdu.dev/v1alpha1", "kind": "RduJob",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": self.labels},
            "spec": self.spec,
        })
    }

    /// The manifest as text for `kubectl apply -f -` (JSON, which is YAML too).
    pub fn manifest(&self) -> String {
        self.value().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_job_is_valid_and_the_changes_land_in_the_spec() {
        let job: rdu_crds::RduJob =
            serde_json::from_str(&JobFixture::new("jobs", "plain").manifest()).expect("an RduJob");
        assert_eq!(rdu_crds::validate_spec(&job.spec), Ok(()));
        assert_eq!(job.metadata.namespace.as_deref(), Some("jobs"));

        let changed = JobFixture::new("jobs", "changed")
            .workers(3)
            .epochs(2)
            .run_policy(json!({"backoffLimit": 3}))
            .without("image")
            .value();
        assert_eq!(changed["spec"]["workers"], 3);
        assert_eq!(
            changed["spec"]["training"],
            json!({"epochs": 2, "batchSize": 8, "learningRate": 0.1})
        );
        assert_eq!(changed["spec"]["runPolicy"], json!({"backoffLimit": 3}));
        assert!(changed["spec"].get("image").is_none());
        assert_eq!(changed["metadata"]["name"], "changed");
    }
}
