//! Builders of a job's children: the headless Service, the token Secret, a rank's Pod from its contract (hardened,
//! `hardening`) and the gang PodGroup.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, Pod, PodSpec, ResourceRequirements, Secret, Service,
    ServicePort, ServiceSpec, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use rdu_crds::RankEnv;
use rdu_crds::consts::{self, WORKER_CONTAINER};

use super::checkpoint::{CHECKPOINT_MOUNT, CheckpointStorage};
use super::env::container_env;
use super::meta::{child_meta, job_labels};
use crate::validate::{Gang, Tiles, ValidJob};

/// Label scheduler-plugins' coscheduling uses to tie a pod to its PodGroup.
pub(crate) const POD_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";
/// Group, version and kind of scheduler-plugins' PodGroup.
pub(crate) const POD_GROUP_GVK: (&str, &str, &str) =
    ("scheduling.x-k8s.io", "v1alpha1", "PodGroup");

/// The headless Service giving every rank `<pod>.<job>.<ns>.svc`, resolvable before readiness.
pub fn headless_service(job: &ValidJob) -> Service {
    let port = |name: &str, port: u16| ServicePort {
        name: Some(name.to_string()),
        port: i32::from(port),
        ..Default::default()
    };
    Service {
        metadata: child_meta(job, consts::service_name(job.name)),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            publish_not_ready_addresses: Some(true),
            selector: Some(job_labels(job.name)),
            ports: Some(vec![
                port("rendezvous", consts::MASTER_PORT),
                port("collective", consts::COLLECTIVE_PORT),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The Secret holding the token of `generation` that every collective call of its ranks must carry.
pub fn token_secret(job: &ValidJob, generation: u32, token: &str) -> Secret {
    Secret {
        metadata: child_meta(
            job,
            consts::token_secret_name(job.name, job.uid(), generation),
        ),
        string_data: Some(BTreeMap::from([(
            consts::TOKEN_SECRET_KEY.to_string(),
            token.to_string(),
        )])),
        type_: Some("Opaque".to_string()),
        ..Default::default()
    }
}

/// The API resource of scheduler-plugins' PodGroup.
pub(crate) fn pod_group_resource() -> ApiResource {
    let (group, version, kind) = POD_GROUP_GVK;
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// The coscheduling PodGroup of a gang job: none of its pods binds until `minAvailable` of them fit.
pub(crate) fn pod_group(job: &ValidJob, gang: Gang) -> DynamicObject {
    let mut group = DynamicObject::new(job.name, &pod_group_resource());
    group.metadata = child_meta(job, job.name.to_string());
    group.data = serde_json::json!({
        "spec": {"minMember": gang.min_available, "scheduleTimeoutSeconds": gang.schedule_timeout_seconds}
    });
    group
}

/// The pod of the rank `contract` describes (rank, generation, its env), with `spec.template` merged in, its
/// checkpoint storage and the restricted profile's fields the template leaves unset filled in.
pub(crate) fn contract_pod(job: &ValidJob, contract: &RankEnv) -> Pod {
    let (rank, generation) = (contract.rank, contract.generation);
    let name = job.name;
    let pod_name = consts::pod_name(name, rank);
    let template = job.template.cloned().unwrap_or_default();
    let mut meta = child_meta(job, pod_name.clone());
    let mut labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.extend(job_labels(name));
    labels.insert(consts::LABEL_RANK.to_string(), rank.to_string());
    labels.insert(consts::LABEL_GENERATION.to_string(), generation.to_string());
    if job.gang.is_some() {
        labels.insert(POD_GROUP_LABEL.to_string(), name.to_string());
    }
    meta.labels = Some(labels);
    meta.annotations = template.metadata.and_then(|m| m.annotations);

    let mut spec = template.spec.unwrap_or_default();
    let container = take_worker_container(&mut spec);
    let worker = worker_container(job, contract, container);
    spec.containers.insert(0, worker);
    if let Tiles::Claim(claim) = &job.tiles {
        super::tile_claim::claim_tiles(&mut spec, name, claim);
    }
    CheckpointStorage::of(&job.checkpoint, rank).add_to_pod(name, &mut spec);
    spec.restart_policy = Some("Never".to_string());
    spec.hostname = Some(pod_name);
    spec.subdomain = Some(consts::service_name(name));
    let scheduling = &job.scheduling;
    if scheduling.scheduler_name.is_some() {
        spec.scheduler_name.clone_from(&scheduling.scheduler_name);
    }
    if scheduling.priority_class_name.is_some() {
        spec.priority_class_name
            .clone_from(&scheduling.priority_class_name);
    }
    super::hardening::harden(&mut spec);
    Pod {
        metadata: meta,
        spec: Some(spec),
        status: None,
    }
}

/// Removes the template's container named `worker` (or its first container) to merge it into the worker.
fn take_worker_container(spec: &mut PodSpec) -> Container {
    let index = spec
        .containers
        .iter()
        .position(|c| c.name == WORKER_CONTAINER)
        .or(if spec.containers.is_empty() {
            None
        } else {
            Some(0)
        });
    index.map(|i| spec.containers.remove(i)).unwrap_or_default()
}

fn worker_container(job: &ValidJob, contract: &RankEnv, mut container: Container) -> Container {
    container.name = WORKER_CONTAINER.to_string();
    container.image = Some(job.image.clone());
    if let Some(policy) = job.image_pull_policy {
        container.image_pull_policy = Some(policy.to_string());
    }
    if container.command.is_none() && container.args.is_none() {
        container.args = Some(vec!["run".to_string()]);
    }

    let mut env = container_env(contract);
    if let Some(volume) = CheckpointStorage::of(&job.checkpoint, contract.rank).volume_name() {
        container
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                name: volume.to_string(),
                mount_path: CHECKPOINT_MOUNT.to_string(),
                ..Default::default()
            });
    }
    let user_env = container.env.take().unwrap_or_default();
    let extra: Vec<EnvVar> = user_env
        .into_iter()
        .filter(|u| !env_names_contain(&env, &u.name))
        .collect();
    env.extend(extra);
    container.env = Some(env);

    let mut resources: ResourceRequirements = container.resources.take().unwrap_or_default();
    for list in [&mut resources.requests, &mut resources.limits] {
        let list = list.get_or_insert_with(BTreeMap::new);
        // The operator owns the tiles: the spec's count of the extended resource, or (dra) none of it, the
        // pod's claim giving them (`tile_claim`), so that no pod asks for tiles both ways.
        match &job.tiles {
            Tiles::ExtendedResource { count } => {
                list.insert(
                    consts::TILE_RESOURCE.to_string(),
                    Quantity(count.to_string()),
                );
            }
            Tiles::Claim(_) => {
                list.remove(consts::TILE_RESOURCE);
            }
        }
    }
    container.resources = Some(resources);
    container.termination_message_path = Some(consts::TERMINATION_LOG_PATH.to_string());

    let mut ports = container.ports.take().unwrap_or_default();
    for (name, port) in [
        ("rendezvous", consts::MASTER_PORT),
        ("collective", consts::COLLECTIVE_PORT),
    ] {
        if !ports.iter().any(|p| p.container_port == i32::from(port)) {
            ports.push(ContainerPort {
                name: Some(name.to_string()),
                container_port: i32::from(port),
                ..Default::default()
            });
        }
    }
    container.ports = Some(ports);
    container
}

fn env_names_contain(env: &[EnvVar], name: &str) -> bool {
    env.iter().any(|e| e.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::CHECKPOINT_VOLUME;
    use crate::builders::env::rank_contract;
    use crate::test_fixtures::{job, job_from};
    use crate::validate::valid;

    fn worker_pod(job: &ValidJob, rank: u32, generation: u32) -> Pod {
        contract_pod(job, &rank_contract(job, rank, generation, None))
    }

    const TEMPLATED: &str = "apiVersion: rdu.dev/v1alpha1
kind: RduJob
metadata: {name: big, namespace: ml, uid: u-1}
spec:
  workers: 4
  tilesPerWorker: 4
  image: img:2
  imagePullPolicy: IfNotPresent
  checkpoint: {intervalSteps: 10}
  template:
    metadata:
      labels: {team: vision}
      annotations: {note: hi}
    spec:
      nodeSelector: {rdu.dev/arch: sn30}
      tolerations: [{key: rdu, operator: Exists}]
      securityContext: {runAsUser: 1000}
      containers:
      - name: sidecar
        image: busybox
      - name: worker
        env: [{name: EXTRA, value: '1'}, {name: RANK, value: '99'}]
        resources:
          requests: {cpu: '2'}
          limits: {memory: 1Gi}
  model: {name: ffn-logreg}
  data: {source: synthetic}
  training: {steps: 5, batchSize: 8, learningRate: 0.5}
  runPolicy:
    schedulingPolicy: {schedulerName: kube-scheduler-x, priorityClassName: high, minAvailable: 4}
";

    fn worker(pod: &Pod) -> &Container {
        &pod.spec.as_ref().expect("spec").containers[0]
    }

    #[test]
    fn pod_carries_identity_labels_and_owner() {
        let pod = worker_pod(&valid(&job("mnist", Some("ml"), 4)), 2, 5);
        assert_eq!(pod.metadata.name.as_deref(), Some("mnist-worker-2"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ml"));
        let labels = pod.metadata.labels.as_ref().expect("labels");
        assert_eq!(labels["rdu.dev/job-name"], "mnist");
        assert_eq!(labels["rdu.dev/rank"], "2");
        assert_eq!(labels["rdu.dev/generation"], "5");
        assert!(!labels.contains_key(POD_GROUP_LABEL));
        let owner = &pod.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("RduJob", "uid-mnist", Some(true))
        );
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.hostname.as_deref(), Some("mnist-worker-2"));
        assert_eq!(spec.subdomain.as_deref(), Some("mnist"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let c = worker(&pod);
        assert_eq!(c.image.as_deref(), Some("ghcr.io/rdu/worker:1"));
        assert_eq!(
            c.termination_message_path.as_deref(),
            Some("/dev/termination-log")
        );
        let tiles = &c
            .resources
            .as_ref()
            .expect("res")
            .limits
            .as_ref()
            .expect("limits")["rdu.dev/tile"];
        assert_eq!(tiles.0, "2");
    }

    #[test]
    fn a_dra_rank_claims_its_tiles_and_asks_for_no_extended_resource() {
        let mut j = job("mnist", Some("ml"), 4);
        j.spec.tile_allocation =
            serde_json::from_value(serde_json::json!({"api": "dra", "sameRdu": true}))
                .expect("allocation");
        // A template's own ask of the extended resource is dropped: a DRA node advertises none.
        j.spec.template = Some(
            serde_json::from_value(
                serde_json::json!({"spec": {"containers": [{"name": "worker",
                "resources": {"limits": {"rdu.dev/tile": "2", "memory": "1Gi"}}}]}}),
            )
            .expect("template"),
        );
        let valid = valid(&j);
        let Tiles::Claim(claim) = &valid.tiles else {
            panic!("a claim: {:?}", valid.tiles)
        };
        let pod = worker_pod(&valid, 1, 0);
        let spec = pod.spec.as_ref().expect("spec");
        let claims = spec.resource_claims.as_ref().expect("pod claims");
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].name, "rdu-tiles");
        assert_eq!(
            claims[0].resource_claim_template_name,
            Some(super::super::tile_claim::template_name("mnist", claim))
        );
        let res = worker(&pod).resources.as_ref().expect("res");
        assert_eq!(res.claims.as_ref().expect("claims")[0].name, "rdu-tiles");
        for list in [&res.requests, &res.limits] {
            assert!(
                !list
                    .as_ref()
                    .is_some_and(|l| l.contains_key("rdu.dev/tile")),
                "{res:?}"
            );
        }
        assert_eq!(res.limits.as_ref().expect("lim")["memory"].0, "1Gi");
    }

    #[test]
    fn template_is_merged_and_operator_fields_win() {
        let pod = worker_pod(&valid(&job_from(TEMPLATED)), 1, 0);
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(
            spec.node_selector.as_ref().expect("ns")["rdu.dev/arch"],
            "sn30"
        );
        assert_eq!(spec.tolerations.as_ref().map(Vec::len), Some(1));
        assert_eq!(
            spec.security_context.as_ref().and_then(|s| s.run_as_user),
            Some(1000)
        );
        assert_eq!(spec.scheduler_name.as_deref(), Some("kube-scheduler-x"));
        assert_eq!(spec.priority_class_name.as_deref(), Some("high"));
        let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["worker", "sidecar"]);
        let c = worker(&pod);
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        let env = c.env.as_ref().expect("env");
        let rank: Vec<_> = env.iter().filter(|e| e.name == "RANK").collect();
        assert_eq!(rank.len(), 1);
        assert_eq!(rank[0].value.as_deref(), Some("1"));
        assert!(env.iter().any(|e| e.name == "EXTRA"));
        assert!(env.iter().any(
            |e| e.name == "RDU_CHECKPOINT_DIR" && e.value.as_deref() == Some(CHECKPOINT_MOUNT)
        ));
        let res = c.resources.as_ref().expect("res");
        assert_eq!(res.requests.as_ref().expect("req")["cpu"].0, "2");
        assert_eq!(res.requests.as_ref().expect("req")["rdu.dev/tile"].0, "4");
        assert_eq!(res.limits.as_ref().expect("lim")["memory"].0, "1Gi");
        let volumes = spec.volumes.as_ref().expect("volumes");
        assert!(
            volumes
                .iter()
                .any(|v| v.name == CHECKPOINT_VOLUME && v.empty_dir.is_some())
        );
        let labels = pod.metadata.labels.as_ref().expect("labels");
        assert_eq!(labels["team"], "vision");
        assert_eq!(labels[POD_GROUP_LABEL], "big");
        assert_eq!(
            pod.metadata.annotations.as_ref().expect("ann")["note"],
            "hi"
        );
    }

    #[test]
    fn service_is_headless_and_publishes_not_ready() {
        let svc = headless_service(&valid(&job("mnist", Some("ml"), 2)));
        assert_eq!(svc.metadata.name.as_deref(), Some("mnist"));
        let spec = svc.spec.expect("spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert_eq!(spec.selector.expect("sel")["rdu.dev/job-name"], "mnist");
    }

    #[test]
    fn the_token_is_stored_under_the_contract_key() {
        let a = rdu_crds::token::new_token().expect("token");
        let secret = token_secret(&valid(&job("mnist", None, 1)), 2, &a);
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("mnist-token-2-uid-mnist")
        );
        assert_eq!(secret.string_data.expect("data")["token"], a);
    }

    #[test]
    fn pod_group_sets_min_member() {
        let j = job_from(TEMPLATED);
        let valid = valid(&j);
        let gang = valid.gang.expect("a gang job");
        assert_eq!(gang.min_available, 4);
        let group = pod_group(&valid, gang);
        assert_eq!(
            group.types.as_ref().map(|t| t.kind.as_str()),
            Some("PodGroup")
        );
        assert_eq!(group.data["spec"]["minMember"], 4);
        assert_eq!(group.data["spec"]["scheduleTimeoutSeconds"], 60);
        assert_eq!(group.metadata.name.as_deref(), Some("big"));
    }
}
