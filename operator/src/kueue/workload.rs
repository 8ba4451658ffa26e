//! The Workload of a queued job, as Kueue's job controllers build theirs (`jobframework.ConstructWorkload`): named
//! `rdujob-<name>-<hash>`, labelled with the job's UID, controlled by the job, one pod set of `spec.workers` pods
//! whose template carries what decides quota and placement (the containers' resources, node selector, affinity,
//! tolerations, priority class), and `active` false while the job is suspended.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sha1::{Digest, Sha1};

use super::types::{API_VERSION, KIND, PodSet, PriorityClassRef, Workload, WorkloadSpec};
use super::{JOB_UID_LABEL, POD_SET};
use crate::validate::ValidJob;

/// The longest Workload name (a DNS subdomain).
const MAX_NAME: usize = 253;
/// Hex digits of the hash in the name.
const HASH_LEN: usize = 5;

/// The name Kueue gives the Workload of job `name` (UID `uid`) of kind RduJob in group rdu.dev:
/// `rdujob-<name>` (truncated) and the first 5 hex digits of sha1("RduJob\nrdu.dev\n<name>\n<uid>").
pub(crate) fn workload_name(name: &str, uid: &str) -> String {
    let mut hash = Sha1::new();
    for (i, part) in ["RduJob", rdu_crds::consts::GROUP, name, uid]
        .iter()
        .enumerate()
    {
        if i > 0 {
            hash.update(b"\n");
        }
        hash.update(part.as_bytes());
    }
    let digest: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let mut prefix = format!("rdujob-{name}");
    prefix.truncate(MAX_NAME - 1 - HASH_LEN);
    format!("{prefix}-{}", &digest[..HASH_LEN])
}

/// The pod template of the pod set: rank 0's pod reduced to what Kueue reads (containers' names, images and
/// resources; node selector, affinity, tolerations, priority class), so that the env and volumes of one rank
/// do not stand for all of them.
pub(crate) fn pod_set_template(rank0: &Pod) -> PodTemplateSpec {
    let spec = rank0.spec.clone().unwrap_or_default();
    // Requests default to limits, as the API server defaults a pod's (the template here is not defaulted).
    let slim = |c: &Container| {
        let mut resources = c.resources.clone().unwrap_or_default();
        let limits = resources.limits.clone().unwrap_or_default();
        let requests = resources.requests.get_or_insert_default();
        for (name, quantity) in limits {
            requests.entry(name).or_insert(quantity);
        }
        Container {
            name: c.name.clone(),
            image: c.image.clone(),
            resources: Some(resources),
            ..Default::default()
        }
    };
    let spec = PodSpec {
        containers: spec.containers.iter().map(slim).collect(),
        init_containers: spec
            .init_containers
            .as_ref()
            .map(|cs| cs.iter().map(slim).collect()),
        node_selector: spec.node_selector,
        affinity: spec.affinity,
        tolerations: spec.tolerations,
        priority_class_name: spec.priority_class_name,
        restart_policy: spec.restart_policy,
        ..Default::default()
    };
    PodTemplateSpec {
        metadata: None,
        spec: Some(spec),
    }
}

/// The Workload of `job` in LocalQueue `queue`; `template` from [`pod_set_template`]; `priority` the value of the
/// job's PriorityClass (Kueue orders and preempts by `spec.priority`, which the job's controller fills in).
pub(crate) fn build(
    job: &ValidJob,
    queue: &str,
    template: PodTemplateSpec,
    active: bool,
    priority: Option<i32>,
) -> Workload {
    Workload {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        metadata: ObjectMeta {
            name: Some(workload_name(job.name, job.uid())),
            namespace: Some(job.namespace.to_string()),
            labels: Some([(JOB_UID_LABEL.to_string(), job.uid().to_string())].into()),
            owner_references: Some(vec![job.owner.clone()]),
            ..ObjectMeta::default()
        },
        spec: WorkloadSpec {
            queue_name: Some(queue.to_string()),
            active: Some(active),
            pod_sets: vec![pod_set(job.workers, template)],
            priority_class_ref: job.scheduling.priority_class_name.as_ref().map(|class| {
                PriorityClassRef {
                    group: "scheduling.k8s.io".into(),
                    kind: "PriorityClass".into(),
                    name: class.clone(),
                }
            }),
            priority,
            other: Default::default(),
        },
        status: None,
    }
}

/// The pod set of `workers` ranks, each asking what `template` asks.
pub(crate) fn pod_set(workers: u32, template: PodTemplateSpec) -> PodSet {
    PodSet {
        name: POD_SET.to_string(),
        count: u64::from(workers),
        template,
        other: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_is_kueues_for_the_kind_group_name_and_uid() {
        // `printf 'RduJob\nrdu.dev\nmnist\nuid-1' | sha1sum` starts with 4f4f9.
        assert_eq!(workload_name("mnist", "uid-1"), "rdujob-mnist-4f4f9");
        let long = workload_name(&"a".repeat(300), "u");
        assert_eq!(long.len(), MAX_NAME);
        assert!(long.starts_with("rdujob-aaa"));
    }

    #[test]
    fn the_pod_set_is_the_ranks_with_what_kueue_reads() {
        use crate::test_fixtures::job;
        let mut j = job("mnist", Some("ml"), 4);
        j.spec.run_policy.scheduling_policy = Some(rdu_crds::SchedulingPolicy {
            priority_class_name: Some("high".into()),
            ..Default::default()
        });
        let valid = crate::validate::valid(&j);
        let rank0 = crate::builders::rank_pod(&valid, 0, 0, None);
        let template = pod_set_template(&rank0);
        let as_json = serde_json::to_value(&template).unwrap();
        let worker = &as_json["spec"]["containers"][0];
        assert!(
            worker["env"].is_null(),
            "one rank's env does not stand for all: {worker}"
        );
        assert_eq!(
            worker["resources"]["requests"]["rdu.dev/tile"],
            rank0.spec.as_ref().unwrap().containers[0]
                .resources
                .as_ref()
                .unwrap()
                .limits
                .as_ref()
                .unwrap()["rdu.dev/tile"]
                .0
        );
        let w = serde_json::to_value(build(&valid, "lq", template, true, Some(1000))).unwrap();
        assert_eq!(w["spec"]["podSets"][0]["count"], 4);
        assert_eq!(w["spec"]["podSets"][0]["name"], "main");
        assert_eq!(w["spec"]["queueName"], "lq");
        assert_eq!(w["spec"]["priority"], 1000);
        assert_eq!(w["spec"]["priorityClassRef"]["name"], "high");
        assert_eq!(w["metadata"]["ownerReferences"][0]["kind"], "RduJob");
        assert_eq!(w["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(
            w["metadata"]["labels"]["kueue.x-k8s.io/job-uid"],
            valid.uid()
        );
    }
}
