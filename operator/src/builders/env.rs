//! The env of one rank's worker container (DESIGN 4.2): the single source of truth for cluster and local mode.

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, SecretKeySelector};
use rdu_crds::{RduJob, consts};

/// Where rank 0's rendezvous and every rank's collective server listen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankPlacement<'a> {
    /// Host of rank 0 (`<job>-worker-0.<job>.<ns>.svc` in a cluster, `127.0.0.1` locally).
    pub master_addr: &'a str,
    /// Port of the rendezvous on rank 0.
    pub master_port: u16,
    /// Port of this rank's collective server.
    pub collective_port: u16,
}

impl RankPlacement<'_> {
    /// The placement of a rank in a cluster: fixed ports, rank 0 by its stable DNS name.
    pub fn in_cluster(master_addr: &str) -> RankPlacement<'_> {
        RankPlacement {
            master_addr,
            master_port: consts::MASTER_PORT,
            collective_port: consts::COLLECTIVE_PORT,
        }
    }
}

/// Namespace of a job, `default` when the manifest names none (as kubectl does).
pub fn job_namespace(job: &RduJob) -> &str {
    job.metadata.namespace.as_deref().unwrap_or("default")
}

/// Name of a job (empty when the manifest names none; validation rejects that before any build).
pub fn job_name(job: &RduJob) -> &str {
    job.metadata.name.as_deref().unwrap_or_default()
}

/// Every env var of one rank's worker container (DESIGN 4.2), in a stable order.
pub fn rank_env(
    job: &RduJob,
    rank: u32,
    generation: u32,
    placement: &RankPlacement,
) -> Vec<EnvVar> {
    let name = job_name(job);
    // The spec holds only string-keyed maps and plain values, which serde_json always serializes.
    let spec_json = serde_json::to_string(&job.spec).unwrap_or_default();
    vec![
        literal(consts::env::RANK, rank.to_string()),
        literal(consts::env::WORLD_SIZE, job.spec.workers.to_string()),
        literal(consts::env::LOCAL_RANK, "0".to_string()),
        literal(consts::env::MASTER_ADDR, placement.master_addr.to_string()),
        literal(consts::env::MASTER_PORT, placement.master_port.to_string()),
        literal(
            consts::env::COLLECTIVE_PORT,
            placement.collective_port.to_string(),
        ),
        literal(consts::env::JOB_NAME, name.to_string()),
        literal(consts::env::JOB_NAMESPACE, job_namespace(job).to_string()),
        literal(
            consts::env::JOB_UID,
            job.metadata.uid.clone().unwrap_or_default(),
        ),
        literal(consts::env::GENERATION, generation.to_string()),
        literal(consts::env::JOB_SPEC, spec_json),
        EnvVar {
            name: consts::env::JOB_TOKEN.to_string(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: consts::token_secret_name(name),
                    key: consts::TOKEN_SECRET_KEY.to_string(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
        field_ref(consts::env::NODE_NAME, "spec.nodeName"),
        field_ref(consts::env::POD_IP, "status.podIP"),
    ]
}

fn literal(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value),
        value_from: None,
    }
}

fn field_ref(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".to_string()),
                field_path: path.to_string(),
            }),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::test_fixtures::job;

    fn value_of<'a>(env: &'a [EnvVar], name: &str) -> Option<&'a str> {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.as_deref())
    }

    #[test]
    fn literal_values_follow_design_4_2() {
        let job = job("mnist", Some("ml"), 4);
        let addr = consts::master_addr("mnist", "ml");
        let env = rank_env(&job, 3, 2, &RankPlacement::in_cluster(&addr));
        assert_eq!(value_of(&env, "RANK"), Some("3"));
        assert_eq!(value_of(&env, "WORLD_SIZE"), Some("4"));
        assert_eq!(value_of(&env, "LOCAL_RANK"), Some("0"));
        assert_eq!(
            value_of(&env, "MASTER_ADDR"),
            Some("mnist-worker-0.mnist.ml.svc")
        );
        assert_eq!(value_of(&env, "MASTER_PORT"), Some("29500"));
        assert_eq!(value_of(&env, "RDU_COLLECTIVE_PORT"), Some("29501"));
        assert_eq!(value_of(&env, "RDU_JOB_NAME"), Some("mnist"));
        assert_eq!(value_of(&env, "RDU_JOB_NAMESPACE"), Some("ml"));
        assert_eq!(value_of(&env, "RDU_JOB_UID"), Some("uid-mnist"));
        assert_eq!(value_of(&env, "RDU_GENERATION"), Some("2"));
    }

    #[test]
    fn spec_round_trips_through_its_json_env() {
        let job = job("mnist", Some("ml"), 4);
        let env = rank_env(&job, 0, 0, &RankPlacement::in_cluster("x"));
        let json = value_of(&env, "RDU_JOB_SPEC").expect("spec env");
        let back: rdu_crds::RduJobSpec = serde_json::from_str(json).expect("spec json");
        assert_eq!(back, job.spec);
    }

    #[test]
    fn namespace_defaults_to_default() {
        let job = job("mnist", None, 1);
        let env = rank_env(&job, 0, 0, &RankPlacement::in_cluster("x"));
        assert_eq!(value_of(&env, "RDU_JOB_NAMESPACE"), Some("default"));
    }

    #[test]
    fn token_and_downward_api_come_from_references() {
        let job = job("mnist", Some("ml"), 2);
        let env = rank_env(&job, 1, 0, &RankPlacement::in_cluster("x"));
        let token = env
            .iter()
            .find(|e| e.name == "RDU_JOB_TOKEN")
            .expect("token");
        let secret = token
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .expect("secretKeyRef");
        assert_eq!(
            (secret.name.as_str(), secret.key.as_str()),
            ("mnist-token", "token")
        );
        assert!(token.value.is_none());
        for (name, path) in [("NODE_NAME", "spec.nodeName"), ("POD_IP", "status.podIP")] {
            let var = env.iter().find(|e| e.name == name).expect(name);
            let field = var
                .value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .expect(name);
            assert_eq!(field.field_path, path);
        }
    }

    #[test]
    fn order_is_stable_and_names_unique() {
        let job = job("mnist", Some("ml"), 2);
        let names: Vec<String> = rank_env(&job, 0, 0, &RankPlacement::in_cluster("x"))
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(
            names,
            [
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "MASTER_ADDR",
                "MASTER_PORT",
                "RDU_COLLECTIVE_PORT",
                "RDU_JOB_NAME",
                "RDU_JOB_NAMESPACE",
                "RDU_JOB_UID",
                "RDU_GENERATION",
                "RDU_JOB_SPEC",
                "RDU_JOB_TOKEN",
                "NODE_NAME",
                "POD_IP"
            ]
        );
    }

    #[test]
    fn local_placement_is_used_verbatim() {
        let job = job("mnist", None, 2);
        let placement = RankPlacement {
            master_addr: "127.0.0.1",
            master_port: 40001,
            collective_port: 40007,
        };
        let env = rank_env(&job, 1, 0, &placement);
        assert_eq!(value_of(&env, "MASTER_ADDR"), Some("127.0.0.1"));
        assert_eq!(value_of(&env, "MASTER_PORT"), Some("40001"));
        assert_eq!(value_of(&env, "RDU_COLLECTIVE_PORT"), Some("40007"));
    }
}
