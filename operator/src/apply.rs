//! Step 4 of the pipeline: carry out the decided changes. Children are created, never forced over what exists: an
//! existing object of a child's name is read and judged (`crate::ownership`). The job's own is kept (the Service,
//! NetworkPolicy and PodGroup re-applied to match the job, pinned to the version that was judged, so the write
//! cannot land on anything else); one going away (an earlier job's, or one being deleted) is waited for; anyone
//! else's stops the job with a [`ChildConflict`] and stays exactly as it was. Pods are created and deleted in
//! a slow start (`crate::slow_start`), each pod built only when its write starts.

use std::fmt::Debug;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use rdu_crds::{RduJob, consts};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::info;

use crate::builders;
use crate::context::{Context, FIELD_MANAGER};
use crate::lifecycle::Change;
use crate::ownership::{ChildConflict, JobIdentity, Ownership, ownership};
use crate::slow_start::{MAX_IN_FLIGHT, slow_start};
use crate::step::ReconcileError;
use crate::validate::{Tiles, ValidJob};

/// Why the apply step stopped before carrying out every action.
#[derive(Debug)]
pub(crate) enum Stop {
    /// A write or read failed: the reconcile fails and is retried.
    Failed(ReconcileError),
    /// An object the job needs is someone else's: the job fails.
    Conflict(ChildConflict),
    /// An object the job needs is still going away (named here): look again soon.
    Waiting(String),
}

impl From<ReconcileError> for Stop {
    fn from(error: ReconcileError) -> Self {
        Stop::Failed(error)
    }
}

/// Carries out `changes` in order; stops at the first that cannot be done. Pod writes are recorded in the
/// expectations under the job's uid (what the reconcile's `job_key` is for a valid job).
pub(crate) async fn apply(
    job: &ValidJob<'_>,
    ctx: &Context,
    changes: &[Change],
) -> Result<(), Stop> {
    for action in changes {
        match action {
            Change::CreatePods { generation, ranks } => {
                ensure_shared_children(job, ctx).await?;
                ensure_generation_token(job, ctx, *generation).await?;
                create_pods(job, ctx, *generation, ranks).await?;
                info!(
                    job = job.name,
                    namespace = job.namespace,
                    generation,
                    count = ranks.len(),
                    "created rank pods"
                );
            }
            Change::DeletePods { names } => {
                delete_pods(job, ctx, names, Grace::Default).await?;
                info!(
                    job = job.name,
                    namespace = job.namespace,
                    count = names.len(),
                    "deleted pods"
                );
            }
            Change::ForceDeletePods { names } => {
                delete_pods(job, ctx, names, Grace::None).await?;
                info!(
                    job = job.name,
                    namespace = job.namespace,
                    pods = ?names,
                    "deleted pods on lost nodes at once (no kubelet can confirm them)"
                );
            }
            Change::DeleteJob => {
                let jobs: Api<RduJob> = Api::namespaced(ctx.client.clone(), job.namespace);
                // This job, not one of the same name applied since.
                let params = DeleteParams::background().preconditions(Preconditions {
                    uid: Some(job.uid().to_string()),
                    resource_version: None,
                });
                ignore_gone(jobs.delete(job.name, &params).await)
                    .map_err(|source| ReconcileError::DeleteJob { source })?;
                ctx.expectations.forget(job.uid());
                info!(
                    job = job.name,
                    namespace = job.namespace,
                    "deleted job after ttlSecondsAfterFinished"
                );
            }
        }
    }
    Ok(())
}

/// The pods of `ranks` at `generation`, with a slow start; each created (or found to be the job's already) is
/// recorded as expected in the cache.
async fn create_pods(
    job: &ValidJob<'_>,
    ctx: &Context,
    generation: u32,
    ranks: &[u32],
) -> Result<(), Stop> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), job.namespace);
    slow_start(ranks.iter().copied(), MAX_IN_FLIGHT, |rank| {
        let pod = builders::rank_pod(job, rank, generation, ctx.settings.progress_url.as_deref());
        let pods = &pods;
        async move {
            let name = pod.name_any();
            create(pods, "Pod", &pod, job, |source| {
                ReconcileError::CreatePods {
                    pod: format!("{}/{name}", job.namespace),
                    source,
                }
            })
            .await?;
            ctx.expectations.created(job.uid(), &name);
            Ok(())
        }
    })
    .await
}

/// How a pod is deleted.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Grace {
    /// The pod's own grace period: the kubelet stops it (SIGTERM, then SIGKILL) and confirms.
    Default,
    /// None: the object goes at once, as `kubectl delete --force --grace-period=0` and the pod garbage collector
    /// for out-of-service nodes do. Only for pods whose node is lost.
    None,
}

/// Deletes pods by name with a slow start; each deleted (or already gone) is recorded as expected to leave
/// the cache.
async fn delete_pods(
    job: &ValidJob<'_>,
    ctx: &Context,
    names: &[String],
    grace: Grace,
) -> Result<(), Stop> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), job.namespace);
    let params = match grace {
        Grace::Default => DeleteParams::background(),
        Grace::None => DeleteParams::background().grace_period(0),
    };
    slow_start(names, MAX_IN_FLIGHT, |name| {
        let pods = &pods;
        // The pod the decision was made on (the cache's, by UID), not one of the same name made since: a
        // delete of another is refused (409) and counts as this one gone.
        let cached = ObjectRef::<Pod>::new(name).within(job.namespace);
        let uid = ctx.pods.get(&cached).and_then(|p| p.metadata.uid.clone());
        let params = params.clone().preconditions(Preconditions {
            uid,
            resource_version: None,
        });
        async move {
            ignore_gone(pods.delete(name, &params).await).map_err(|source| {
                ReconcileError::DeletePods {
                    pod: format!("{}/{name}", job.namespace),
                    source,
                }
            })?;
            ctx.expectations.deleted(job.uid(), name);
            Ok(())
        }
    })
    .await
}

/// Whether an existing child of the job is re-applied to match what the job wants now, or kept as created.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Existing {
    /// Re-applied (pinned to the version judged ours): the Service, NetworkPolicy and PodGroup follow the job.
    Follow,
    /// Kept as it is: a claim's spec is immutable once bound.
    Keep,
}

/// The Service, the checkpoint claim, the tiles' ResourceClaimTemplate (kept: a template's spec is immutable, and
/// a changed ask gets a template of another name), the NetworkPolicy and the PodGroup.
async fn ensure_shared_children(job: &ValidJob<'_>, ctx: &Context) -> Result<(), Stop> {
    let ns = job.namespace;
    let client = &ctx.client;
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    ensure_child(
        &services,
        "Service",
        &builders::headless_service(job),
        job,
        Existing::Follow,
    )
    .await?;
    if let Some(claim) = builders::checkpoint_claim(job) {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
        ensure_child(
            &claims,
            "PersistentVolumeClaim",
            &claim,
            job,
            Existing::Keep,
        )
        .await?;
    }
    if let Tiles::Claim(claim) = &job.tiles {
        let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), ns);
        let template = builders::claim_template(job, claim);
        ensure_child(
            &templates,
            "ResourceClaimTemplate",
            &template,
            job,
            Existing::Keep,
        )
        .await?;
    }
    if ctx.settings.network_policies {
        let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
        let policy = builders::network_policy(job);
        ensure_child(&policies, "NetworkPolicy", &policy, job, Existing::Follow).await?;
    }
    if let (Some(gang), true) = (job.gang, ctx.settings.pod_groups) {
        let groups: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &builders::pod_group_resource());
        let group = builders::pod_group(job, gang);
        ensure_child(&groups, "PodGroup", &group, job, Existing::Follow).await?;
    }
    Ok(())
}

/// The token Secret of `generation`: created, or found made by an earlier reconcile of the same generation. It is
/// never read (the operator may read no Secret): its name holds the job's UID and the generation, so an existing
/// one is this generation's, or one the job's own namespace made on purpose to break its own job. The generation
/// before it is deleted: its ranks are gone or force-deleted, and a rank of it that still runs behind a partition
/// holds a token this generation refuses (DESIGN 9).
async fn ensure_generation_token(
    job: &ValidJob<'_>,
    ctx: &Context,
    generation: u32,
) -> Result<(), Stop> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), job.namespace);
    let token = rdu_crds::token::new_token().map_err(ReconcileError::Token)?;
    let secret = builders::token_secret(job, generation, &token);
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    };
    let failed = |source| ReconcileError::SharedChildren {
        what: format!("Secret {}/{}", job.namespace, secret.name_any()),
        source,
    };
    match post(&secrets, &params, &secret).await {
        Ok(()) => info!(
            job = job.name,
            namespace = job.namespace,
            generation,
            "created the generation's token"
        ),
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(source) => return Err(failed(source).into()),
    }
    if let Some(previous) = generation.checked_sub(1) {
        let name = consts::token_secret_name(job.name, job.uid(), previous);
        ignore_not_found(secrets.delete(&name, &DeleteParams::background()).await)
            .map_err(failed)?;
    }
    Ok(())
}

/// Creates one shared child, or finds it the job's already (and re-applies it when it follows the job).
async fn ensure_child<K>(
    api: &Api<K>,
    kind: &'static str,
    child: &K,
    job: &ValidJob<'_>,
    existing: Existing,
) -> Result<(), Stop>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let what = || format!("{kind} {}/{}", job.namespace, child.name_any());
    let failed = |source| ReconcileError::SharedChildren {
        what: what(),
        source,
    };
    let Some(found) = create(api, kind, child, job, failed).await? else {
        info!(job = job.name, namespace = job.namespace, child = %what(), "created");
        return Ok(());
    };
    if existing == Existing::Keep {
        return Ok(());
    }
    // The version judged to be the job's is a precondition of the write: if anyone replaced the object since,
    // the API server refuses it, and the next reconcile judges the new one.
    let mut pinned = child.clone();
    pinned.meta_mut().resource_version = found.meta().resource_version.clone();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&child.name_any(), &params, &Patch::Apply(&pinned))
        .await
        .map_err(failed)?;
    Ok(())
}

/// Creates `child`. `None`: created. `Some(existing)`: an object of its name exists and is the job's. Someone
/// else's object is a [`Stop::Conflict`], one going away a [`Stop::Waiting`]; neither is written to.
async fn create<K>(
    api: &Api<K>,
    kind: &'static str,
    child: &K,
    job: &ValidJob<'_>,
    failed: impl Fn(kube::Error) -> ReconcileError,
) -> Result<Option<K>, Stop>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    };
    match post(api, &params, child).await {
        Ok(()) => return Ok(None),
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(source) => return Err(failed(source).into()),
    }
    let name = child.name_any();
    let what = format!("{kind} {}/{name}", job.namespace);
    let found = api
        .get_opt(&name)
        .await
        .map_err(|source| ReconcileError::Fetch {
            what: what.clone(),
            source,
        })?;
    let Some(found) = found else {
        return Err(Stop::Waiting(format!(
            "{what} was deleted as it was created"
        )));
    };
    let identity = JobIdentity {
        namespace: job.namespace,
        name: job.name,
        uid: job.uid(),
    };
    match ownership(kind, found.meta(), identity) {
        Ownership::Ours => Ok(Some(found)),
        Ownership::Leaving => Err(Stop::Waiting(format!(
            "{what} is being deleted, or is an earlier job {}'s that the garbage collector removes",
            job.name
        ))),
        Ownership::Foreign(conflict) => Err(Stop::Conflict(conflict)),
    }
}

/// POSTs `child` and drops the API server's answer unparsed: nothing reads the created object (the watch brings
/// it to the cache), and parsing a pod's answer cost the operator about as much CPU as the watch event of the same
/// pod (a 4,096-rank job's creation, issue 26). Errors are `Api::create`'s: an API status is [`kube::Error::Api`].
async fn post<K: Resource + Clone + Serialize>(
    api: &Api<K>,
    params: &PostParams,
    child: &K,
) -> Result<(), kube::Error> {
    let body = serde_json::to_vec(child).map_err(kube::Error::SerdeError)?;
    let mut request = kube::core::Request::new(api.resource_url())
        .create(params, body)
        .map_err(kube::Error::BuildRequest)?;
    request.extensions_mut().insert("create");
    api.clone().into_client().request_text(request).await?;
    Ok(())
}

/// A delete whose object is gone, or was replaced by another of the same name (its UID precondition failed).
fn ignore_gone<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 409 => {
            tracing::debug!(message = %status.message, "not deleted: another object of that name now");
            Ok(())
        }
        other => ignore_not_found(other),
    }
}

fn ignore_not_found<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}
