//! The validate step: a job passes every rule of the CRD's schema and CEL and of `rdu_crds::validate_job`, plus
//! what only a cluster needs (a persisted job to own the children, an image for the worker), and comes out as a
//! [`ValidJob`] the builders consume without re-checking anything. Every message names the field and the fix.

use std::fmt;
use std::ops::Deref;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use rdu_crds::validation::Checks;
use rdu_crds::{FieldError, RduJob, job_namespace};

use crate::builders::WORKER_CONTAINER;

/// Every rule a job breaks (never empty when returned as an error).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let messages: Vec<&str> = self.0.iter().map(|e| e.message.as_str()).collect();
        write!(f, "invalid RduJob: {}", messages.join("; "))
    }
}

/// A job that passed validation, with what the builders need and no `Option` left to check. It reads as the
/// job itself (`Deref`).
#[derive(Clone, Debug)]
pub struct ValidJob<'a> {
    job: &'a RduJob,
    /// `metadata.name`, a DNS label short enough for every pod's hostname.
    pub name: &'a str,
    /// `metadata.namespace`, `default` when unset.
    pub namespace: &'a str,
    /// The controller owner reference every child carries.
    pub owner: OwnerReference,
    /// The worker container's image (`spec.image`, else the template's `worker` container's).
    pub image: String,
}

impl Deref for ValidJob<'_> {
    type Target = RduJob;

    fn deref(&self) -> &RduJob {
        self.job
    }
}

/// Checks every rule; collects all failures, or gives the job as a [`ValidJob`].
pub fn validate(job: &RduJob) -> Result<ValidJob<'_>, ValidationErrors> {
    let mut cluster = Checks::default();
    let owner = job.controller_owner_ref(&());
    cluster.check(
        job.metadata.uid.is_some() && owner.is_some(),
        "metadata.uid",
        || {
            "metadata.uid is missing: the job must come from the API server (kubectl apply it) before the \
             operator builds its pods"
                .into()
        },
    );
    let image = worker_image(job);
    cluster.check(image.is_some(), "spec.image", || {
        format!(
            "spec.image is required: set it, or give the container named {WORKER_CONTAINER:?} in \
             spec.template an image"
        )
    });
    let mut errors = rdu_crds::validate_job(job).err().unwrap_or_default();
    errors.extend(cluster.finish().err().unwrap_or_default());
    match (owner, image, job.metadata.name.as_deref()) {
        (Some(owner), Some(image), Some(name)) if errors.is_empty() => Ok(ValidJob {
            job,
            name,
            namespace: job_namespace(job),
            owner,
            image,
        }),
        _ => Err(ValidationErrors(errors)),
    }
}

/// `spec.image`, else the image of the template's worker container (or its first container).
fn worker_image(job: &RduJob) -> Option<String> {
    let from_template = || {
        let containers = &job.spec.template.as_ref()?.spec.as_ref()?.containers;
        let worker = containers
            .iter()
            .find(|c| c.name == WORKER_CONTAINER)
            .or(containers.first())?;
        worker.image.clone()
    };
    job.spec
        .image
        .clone()
        .or_else(from_template)
        .filter(|image| !image.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::test_fixtures::job;

    fn fields(job: &RduJob) -> Vec<String> {
        match validate(job) {
            Ok(_) => vec![],
            Err(e) => e.0.into_iter().map(|e| e.field).collect(),
        }
    }

    #[test]
    fn a_valid_job_carries_its_identity_and_image() {
        let j = job("mnist", None, 4);
        let valid = validate(&j).expect("valid");
        assert_eq!((valid.name, valid.namespace), ("mnist", "default"));
        assert_eq!(valid.owner.uid, "uid-mnist");
        assert_eq!(valid.owner.controller, Some(true));
        assert_eq!(valid.spec.workers, 4);
        assert!(!valid.image.is_empty());
    }

    #[test]
    fn each_cluster_rule_names_its_field_beside_the_job_rules() {
        type Breaker = fn(&mut RduJob);
        let cases: Vec<(Breaker, &[&str])> = vec![
            (|j| j.metadata.uid = None, &["metadata.uid"]),
            (|j| j.spec.image = None, &["spec.image"]),
            (|j| j.spec.image = Some(String::new()), &["spec.image"]),
            (|j| j.spec.workers = 0, &["spec.workers"]),
            (
                |j| {
                    j.metadata.name = None;
                    j.metadata.uid = None;
                },
                &["metadata.name", "metadata.uid"],
            ),
        ];
        for (i, (breaker, expected)) in cases.into_iter().enumerate() {
            let mut j = job("mnist", Some("ml"), 4);
            breaker(&mut j);
            assert_eq!(fields(&j), expected.to_vec(), "case {i}");
        }
    }

    #[test]
    fn the_template_can_give_the_image() {
        let mut j = job("mnist", None, 2);
        j.spec.image = None;
        j.spec.template = Some(
            serde_json::from_value(serde_json::json!({
                "spec": {"containers": [{"name": "worker", "image": "from/template:1"}]}
            }))
            .expect("template"),
        );
        assert_eq!(validate(&j).expect("valid").image, "from/template:1");
    }
}
