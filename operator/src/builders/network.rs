//! The per-job NetworkPolicy: only pods of the same job reach a worker's rendezvous and collective ports.
//!
//! A NetworkPolicy cannot compare label values between peers, so one policy per job selects that job's pods
//! (`rdu.dev/job-name: <job>`) and admits ingress on ports 29500-29501 only from pods with the same label value.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rdu_crds::consts;

use super::meta::{child_meta, job_labels};
use crate::validate::ValidJob;

/// Name of a job's NetworkPolicy.
pub(crate) fn network_policy_name(job: &str) -> String {
    format!("{job}-workers")
}

/// The job's NetworkPolicy (owned by the job, garbage-collected with it).
pub(crate) fn network_policy(job: &ValidJob) -> NetworkPolicy {
    let same_job = LabelSelector {
        match_labels: Some(job_labels(job.name)),
        ..Default::default()
    };
    NetworkPolicy {
        metadata: child_meta(job, network_policy_name(job.name)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(same_job.clone()),
            policy_types: Some(vec!["Ingress".to_string()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(same_job),
                    ..Default::default()
                }]),
                ports: Some(vec![NetworkPolicyPort {
                    protocol: Some("TCP".to_string()),
                    port: Some(IntOrString::Int(i32::from(consts::MASTER_PORT))),
                    end_port: Some(i32::from(consts::COLLECTIVE_PORT)),
                }]),
            }]),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::job;
    use crate::validate::valid;

    #[test]
    fn admits_only_the_same_jobs_pods_on_the_worker_ports() {
        let policy = network_policy(&valid(&job("mnist", Some("ml"), 4)));
        assert_eq!(policy.metadata.name.as_deref(), Some("mnist-workers"));
        assert_eq!(policy.metadata.namespace.as_deref(), Some("ml"));
        let owner = &policy.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(owner.controller, Some(true));
        let spec = policy.spec.expect("spec");
        let selected = spec
            .pod_selector
            .expect("selector")
            .match_labels
            .expect("labels");
        assert_eq!(
            selected.get(consts::LABEL_JOB_NAME).map(String::as_str),
            Some("mnist")
        );
        let rule = &spec.ingress.expect("ingress")[0];
        let peer = rule.from.as_ref().expect("from")[0]
            .pod_selector
            .clone()
            .expect("peer");
        assert_eq!(
            peer.match_labels
                .expect("labels")
                .get(consts::LABEL_JOB_NAME)
                .map(String::as_str),
            Some("mnist"),
            "another job's pods must not match"
        );
        let port = &rule.ports.as_ref().expect("ports")[0];
        assert_eq!(port.port, Some(IntOrString::Int(29500)));
        assert_eq!(port.end_port, Some(29501));
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    }
}
