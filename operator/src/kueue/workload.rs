//! The Workload of a queued job, as Kueue's job controllers build theirs (`jobframework.ConstructWorkload`): named
//! `rdujob-<name>-<hash>`, labelled with the job's UID, controlled by the job, one pod set of `spec.workers` pods
//! whose template carries what decides quota and placement (the containers' resources, node selector, affinity,
//! tolerations, priority class), and `active` false while the job is suspended.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use serde_json::{Value, json};
use sha1::{Digest, Sha1};

use super::{JOB_UID_LABEL, POD_SET};
use crate::validate::ValidJob;

/// The longest Workload name (a DNS subdomain).
const MAX_NAME: usize = 253;
/// Hex digits of the hash in the name.
const HASH_LEN: usize = 5;

/// The name Kueue gives the Workload of job `name` (UID `uid`) of kind RduJob in group rdu.dev:
/// `rdujob-<name>` (truncated) and the first 5 hex digits of sha1("RduJob\nrdu.dev\n<name>\n<uid>").
pub fn workload_name(name: &str, uid: &str) -> String {
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
pub fn pod_set_template(rank0: &Pod) -> Value {
    let spec = rank0.spec.clone().unwrap_or_default();
    let slim = |c: &Container| Container {
        name: c.name.clone(),
        image: c.image.clone(),
        resources: c.resources.clone(),
        ..Default::default()
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
    json!({"spec": spec})
}

/// The Workload of `job` in LocalQueue `queue`; `template` from [`pod_set_template`].
pub fn build(job: &ValidJob, queue: &str, template: Value, active: bool) -> Value {
    let mut spec = json!({
        "queueName": queue,
        "active": active,
        "podSets": [{"name": POD_SET, "count": job.workers, "template": template}],
    });
    if let Some(class) = &job.scheduling.priority_class_name {
        spec["priorityClassRef"] = json!({
            "group": "scheduling.k8s.io",
            "kind": "PriorityClass",
            "name": class,
        });
    }
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job.name, job.uid()),
            "namespace": job.namespace,
            "labels": {JOB_UID_LABEL: job.uid()},
            "ownerReferences": [job.owner],
        },
        "spec": spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_is_kueues_for_the_kind_group_name_and_uid() {
        // sha1("RduJob\nrdu.dev\nmnist\nuid-1") starts with these five digits (computed with `sha1sum`).
        let name = workload_name("mnist", "uid-1");
        let expected = {
            let out = std::process::Command::new("sh")
                .args(["-c", "printf 'RduJob\\nrdu.dev\\nmnist\\nuid-1' | sha1sum"])
                .output()
                .expect("sha1sum");
            String::from_utf8_lossy(&out.stdout)[..HASH_LEN].to_string()
        };
        assert_eq!(name, format!("rdujob-mnist-{expected}"));
        let long = workload_name(&"a".repeat(300), "u");
        assert_eq!(long.len(), MAX_NAME);
        assert!(long.starts_with("rdujob-aaa"));
    }
}
