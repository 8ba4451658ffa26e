//! The env of one rank's worker container in a cluster: the contract of `rdu_crds::RankEnv` as `EnvVar`s.

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, SecretKeySelector};
use rdu_crds::rank_env::{SUPPLIED, Supplied};
use rdu_crds::{RankEnv, RduJob, consts};

/// Every env var of one rank's worker container in a cluster (DESIGN 4.2), in a stable order.
pub fn rank_env(job: &RduJob, rank: u32, generation: u32) -> Vec<EnvVar> {
    container_env(&RankEnv::in_cluster(job, rank, generation))
}

/// The contract as `EnvVar`s: its literal values, then the token from the job's Secret and the node and pod IP
/// from the downward API.
pub fn container_env(contract: &RankEnv) -> Vec<EnvVar> {
    let literals = contract
        .literal_vars()
        .into_iter()
        .map(|(name, value)| literal(name, value));
    let supplied = SUPPLIED.iter().map(|(name, which)| match which {
        Supplied::Token => EnvVar {
            name: name.to_string(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: consts::token_secret_name(&contract.job_name),
                    key: consts::TOKEN_SECRET_KEY.to_string(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
        Supplied::NodeName => field_ref(name, "spec.nodeName"),
        Supplied::PodIp => field_ref(name, "status.podIP"),
    });
    literals.chain(supplied).collect()
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
    use crate::test_fixtures::job;

    fn value_of<'a>(env: &'a [EnvVar], name: &str) -> Option<&'a str> {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.as_deref())
    }

    #[test]
    fn literal_values_follow_design_4_2() {
        let job = job("mnist", Some("ml"), 4);
        let env = rank_env(&job, 3, 2);
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
        let env = rank_env(&job, 0, 0);
        let json = value_of(&env, "RDU_JOB_SPEC").expect("spec env");
        let back: rdu_crds::RduJobSpec = serde_json::from_str(json).expect("spec json");
        assert_eq!(back, job.spec);
    }

    #[test]
    fn namespace_defaults_to_default() {
        let job = job("mnist", None, 1);
        let env = rank_env(&job, 0, 0);
        assert_eq!(value_of(&env, "RDU_JOB_NAMESPACE"), Some("default"));
    }

    #[test]
    fn token_and_downward_api_come_from_references() {
        let job = job("mnist", Some("ml"), 2);
        let env = rank_env(&job, 1, 0);
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
        let names: Vec<String> = rank_env(&job, 0, 0).into_iter().map(|e| e.name).collect();
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
}
