//! The validate step: a job passes every rule of the CRD's schema and CEL and of `rdu_crds::validate_job`, plus
//! what only a cluster needs (a persisted job to own the children, an image for the worker), and comes out as a
//! [`ValidJob`] the builders consume without re-checking anything: the job's options resolved into the settings
//! the builders use (`settings`). Every message names the field and the fix.

use std::fmt;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use rdu_crds::consts::{MAX_WORKERS, WORKER_CONTAINER};
use rdu_crds::validation::Checks;
use rdu_crds::{FieldError, RankEnv, RduJob, RduJobStatus, RunPolicy, job_namespace};

mod pod_policy;
mod settings;
pub use pod_policy::{Exception, Guard, PodPolicy, RULES as POD_POLICY_RULES, Rule};
pub(crate) use settings::{
    Checkpointing, Gang, Scheduling, TILE_CLAIM_NAME, TensorBoardLog, TileClaim, Tiles,
};

/// The operator's default of `--max-workers-per-job`.
pub const DEFAULT_MAX_WORKERS_PER_JOB: u32 = 1024;

/// What this operator runs at most, beside the API's own rules (its flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest `spec.workers` this operator runs (`--max-workers-per-job`, at most [`MAX_WORKERS`]).
    pub max_workers_per_job: u32,
    /// What `spec.template` may give a rank pod (`--pod-policy-*`).
    pub pod_policy: PodPolicy,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_workers_per_job: DEFAULT_MAX_WORKERS_PER_JOB,
            pod_policy: PodPolicy::default(),
        }
    }
}

/// Every rule a job breaks (never empty when returned as an error).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let messages: Vec<&str> = self.0.iter().map(|e| e.message.as_str()).collect();
        write!(f, "invalid RduJob: {}", messages.join("; "))
    }
}

/// A job that passed validation, with everything the builders need resolved and no `Option` left to check. The
/// builders read these fields, never the job's raw options.
#[derive(Clone, Debug)]
pub struct ValidJob<'a> {
    /// The job, for the env contract alone ([`ValidJob::rank_env`]).
    job: &'a RduJob,
    /// `metadata.name`, a DNS label short enough for every pod's hostname.
    pub name: &'a str,
    /// `metadata.namespace`, `default` when unset.
    pub namespace: &'a str,
    /// The controller owner reference every child carries (its `uid` is the job's).
    pub owner: OwnerReference,
    /// The worker container's image (`spec.image`, else the template's `worker` container's).
    pub image: String,
    /// `spec.imagePullPolicy` as the pod spells it.
    pub image_pull_policy: Option<&'static str>,
    /// `spec.tilesPerWorker` and how they are asked for (`spec.tileAllocation`).
    pub tiles: Tiles,
    /// `spec.template`, merged into every rank's pod.
    pub template: Option<&'a PodTemplateSpec>,
    pub checkpoint: Checkpointing,
    /// Rank 0's TensorBoard log directory, when the job asks for one.
    pub tensorboard: Option<TensorBoardLog>,
    /// Gang scheduling through a PodGroup, when the job asks for it.
    pub gang: Option<Gang>,
    pub scheduling: Scheduling,
    /// `spec.workers`.
    pub workers: u32,
    /// `spec.runPolicy`: suspension, restarts, deadlines, clean-up (the lifecycle's rules).
    pub run_policy: &'a RunPolicy,
    /// `metadata.generation`: the spec's version the status says it observed.
    pub generation: Option<i64>,
    /// The job's status as last written (the lifecycle's starting point).
    pub status: Option<&'a RduJobStatus>,
    /// Where Kueue's admission puts the pods (its flavors' node labels and tolerations, admission checks' pod set
    /// updates), for a queued job once admitted; set by the Kueue step after validation.
    pub placement: Option<crate::placement::Placement>,
}

impl ValidJob<'_> {
    /// The env contract of `rank` at `generation` in the cluster (DESIGN 4.2).
    pub fn rank_env(&self, rank: u32, generation: u32) -> RankEnv {
        RankEnv::in_cluster(self.job, rank, generation)
    }

    /// The job's UID, which its children's controller reference carries.
    pub fn uid(&self) -> &str {
        &self.owner.uid
    }
}

/// Checks every rule (the CRD's and `validate_job`'s, then what a cluster and this operator's `limits` need);
/// collects all failures, or gives the job as a [`ValidJob`].
pub fn validate<'a>(job: &'a RduJob, limits: &Limits) -> Result<ValidJob<'a>, ValidationErrors> {
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
    let workers = job.spec.workers;
    // Above the API's ceiling `validate_job` already says so.
    let within_limit = workers <= limits.max_workers_per_job || workers > MAX_WORKERS;
    cluster.check(within_limit, "spec.workers", || {
        format!(
            "spec.workers is {workers}, above this operator's limit of {} ranks per job \
             (--max-workers-per-job, chart value operator.maxWorkersPerJob): use fewer ranks, or ask the \
             cluster's administrator to raise the limit (at most {MAX_WORKERS})",
            limits.max_workers_per_job
        )
    });
    pod_policy::check_template(&mut cluster, job.spec.template.as_ref(), &limits.pod_policy);
    check_tile_claim_name(&mut cluster, job);
    let mut errors = rdu_crds::validate_job(job).err().unwrap_or_default();
    errors.extend(cluster.finish().err().unwrap_or_default());
    match (owner, image, job.metadata.name.as_deref()) {
        (Some(owner), Some(image), Some(name)) if errors.is_empty() => {
            let spec = &job.spec;
            Ok(ValidJob {
                job,
                name,
                namespace: job_namespace(job),
                owner,
                image,
                image_pull_policy: spec.image_pull_policy.map(|p| p.as_str()),
                tiles: Tiles::of(spec),
                template: spec.template.as_ref(),
                checkpoint: Checkpointing::of(spec),
                tensorboard: TensorBoardLog::of(spec),
                gang: Gang::of(spec),
                scheduling: Scheduling::of(spec),
                workers,
                run_policy: &spec.run_policy,
                generation: job.metadata.generation,
                status: job.status.as_ref(),
                placement: None,
            })
        }
        _ => Err(ValidationErrors(errors)),
    }
}

/// With `spec.tileAllocation.api: dra` the operator adds the pod claim [`TILE_CLAIM_NAME`]; the template may not
/// declare one of that name.
fn check_tile_claim_name(c: &mut Checks, job: &RduJob) {
    let taken = job.spec.tile_allocation.is_dra()
        && job
            .spec
            .template
            .as_ref()
            .and_then(|t| t.spec.as_ref())
            .and_then(|s| s.resource_claims.as_ref())
            .is_some_and(|claims| claims.iter().any(|claim| claim.name == TILE_CLAIM_NAME));
    c.check(!taken, "spec.template.spec.resourceClaims", || {
        format!(
            "spec.template.spec.resourceClaims has a claim named {TILE_CLAIM_NAME:?}, the name the operator gives \
             each rank's tiles with spec.tileAllocation.api dra: rename the template's claim"
        )
    });
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

/// A fixture as the validate step passes it on (the fixture must be valid).
#[cfg(test)]
pub(crate) fn valid(job: &RduJob) -> ValidJob<'_> {
    validate(job, &Limits::default()).expect("fixture is valid")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::job;

    fn fields(job: &RduJob) -> Vec<String> {
        match validate(job, &Limits::default()) {
            Ok(_) => vec![],
            Err(e) => e.0.into_iter().map(|e| e.field).collect(),
        }
    }

    #[test]
    fn a_valid_job_carries_its_identity_and_image() {
        let j = job("mnist", None, 4);
        let valid = validate(&j, &Limits::default()).expect("valid");
        assert_eq!((valid.name, valid.namespace), ("mnist", "default"));
        assert_eq!(valid.uid(), "uid-mnist");
        assert_eq!(valid.owner.controller, Some(true));
        assert_eq!(valid.rank_env(3, 0).world_size, 4);
        assert_eq!(valid.tiles, Tiles::ExtendedResource { count: 2 });
        assert_eq!(valid.checkpoint, Checkpointing::Off);
        assert_eq!((valid.tensorboard.clone(), valid.gang), (None, None));
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
                    j.spec.tile_allocation.api = rdu_crds::TileApi::Dra;
                    j.spec.template = Some(
                        serde_json::from_value(serde_json::json!({"spec": {"containers": [],
                            "resourceClaims": [{"name": "rdu-tiles", "resourceClaimName": "mine"}]}}))
                        .expect("template"),
                    );
                },
                &["spec.template.spec.resourceClaims"],
            ),
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
        assert_eq!(
            validate(&j, &Limits::default()).expect("valid").image,
            "from/template:1"
        );
    }

    #[test]
    fn the_operators_limit_names_the_field_the_value_and_the_limit() {
        let limits = Limits {
            max_workers_per_job: 8,
            ..Limits::default()
        };
        assert!(
            validate(&job("mnist", None, 8), &limits).is_ok(),
            "the limit itself is allowed"
        );
        let errors = validate(&job("mnist", None, 9), &limits).expect_err("one rank too many");
        assert_eq!(errors.0.len(), 1, "{errors}");
        assert_eq!(errors.0[0].field, "spec.workers");
        let message = &errors.0[0].message;
        for part in [
            "spec.workers is 9",
            "limit of 8 ranks",
            "--max-workers-per-job",
            "operator.maxWorkersPerJob",
        ] {
            assert!(message.contains(part), "{part}: {message}");
        }
        // Above the API's ceiling only the ceiling is reported.
        let errors = validate(&job("mnist", None, MAX_WORKERS + 1), &limits).expect_err("too many");
        assert_eq!(errors.0.len(), 1, "{errors}");
        assert!(
            errors.0[0]
                .message
                .starts_with(rdu_crds::consts::MAX_WORKERS_MESSAGE),
            "{errors}"
        );
        assert_eq!(
            DEFAULT_MAX_WORKERS_PER_JOB,
            Limits::default().max_workers_per_job
        );
    }

    #[test]
    fn a_template_beyond_the_pod_policy_fails_validation_unless_the_operator_allows_it() {
        let mut j = job("mnist", None, 2);
        j.spec.template = Some(
            serde_json::from_value(serde_json::json!({
                "spec": {"hostNetwork": true, "containers": []}
            }))
            .expect("template"),
        );
        assert_eq!(fields(&j), ["spec.template.spec.hostNetwork"]);
        let open = Limits {
            pod_policy: PodPolicy {
                allow: [Exception::HostNamespaces].into(),
                ..PodPolicy::default()
            },
            ..Limits::default()
        };
        assert!(validate(&j, &open).is_ok());
    }
}
