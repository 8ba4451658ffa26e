//! The env of one rank's worker container in a cluster: every variable of the contract, `rdu_crds::RankEnv`, is
//! decided here ([`rank_contract`]) and turned into `EnvVar`s here ([`container_env`]); nothing else sets one.

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, SecretKeySelector};
use rdu_crds::rank_env::{SUPPLIED, Supplied};
use rdu_crds::{RankEnv, consts};

use super::checkpoint::{CHECKPOINT_MOUNT, CheckpointStorage};
use super::progress::progress_endpoint;
use crate::validate::ValidJob;

/// The contract of `rank` at `generation`: the job's identity and spec, the checkpoint directory when the rank
/// mounts checkpoint storage, and for rank 0 the TensorBoard directory when the job asks for one and the progress
/// endpoint when the operator takes reports at `progress_url`.
pub(crate) fn rank_contract(
    job: &ValidJob,
    rank: u32,
    generation: u32,
    progress_url: Option<&str>,
) -> RankEnv {
    let mut contract = job.rank_env(rank, generation);
    contract.checkpoint_dir = CheckpointStorage::of(&job.checkpoint, rank)
        .volume_name()
        .map(|_| CHECKPOINT_MOUNT.to_string());
    if rank == 0 {
        contract.tensorboard_dir = job
            .tensorboard
            .as_ref()
            .map(|_| consts::TENSORBOARD_MOUNT.to_string());
        contract.progress = progress_url.map(progress_endpoint);
    }
    contract
}

/// The contract as `EnvVar`s: its literal values, then the token from its generation's Secret and the node and pod IP
/// from the downward API.
pub(crate) fn container_env(contract: &RankEnv) -> Vec<EnvVar> {
    let literals = contract
        .literal_vars()
        .into_iter()
        .map(|(name, value)| literal(name, value));
    let supplied = SUPPLIED.iter().map(|(name, which)| match which {
        Supplied::Token => EnvVar {
            name: name.to_string(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: consts::token_secret_name(
                        &contract.job_name,
                        &contract.job_uid,
                        contract.generation,
                    ),
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
    use crate::validate::valid;

    fn rank_env(job: &rdu_crds::RduJob, rank: u32, generation: u32) -> Vec<EnvVar> {
        container_env(&rank_contract(&valid(job), rank, generation, None))
    }

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
        let env = rank_env(&job, 1, 3);
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
            ("mnist-token-3-uid-mnist", "token"),
            "the token of the pod's generation"
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

    #[test]
    fn rank_zero_alone_gets_the_tensorboard_dir_and_the_progress_endpoint() {
        let mut with = job("mnist", Some("ml"), 2);
        with.spec.tensorboard = Some(Default::default());
        let valid = valid(&with);
        let rank0 = rank_contract(&valid, 0, 1, Some("http://op.sys.svc:8080/"));
        assert_eq!(
            rank0.tensorboard_dir.as_deref(),
            Some(consts::TENSORBOARD_MOUNT)
        );
        assert_eq!(
            rank0.progress,
            Some(rdu_crds::ProgressEndpoint {
                url: "http://op.sys.svc:8080".into(),
                token_file: "/var/run/secrets/rdu.dev/progress/token".into(),
            })
        );
        let rank1 = rank_contract(&valid, 1, 1, Some("http://op.sys.svc:8080/"));
        assert_eq!((rank1.tensorboard_dir, rank1.progress), (None, None));
        let quiet = rank_contract(&valid, 0, 1, None);
        assert_eq!(quiet.progress, None, "no reports without --progress-url");
        let plain = rank_contract(
            &crate::validate::valid(&job("mnist", Some("ml"), 2)),
            0,
            1,
            None,
        );
        assert_eq!(plain.tensorboard_dir, None);
    }

    #[test]
    fn every_contract_variable_of_rank_zero_is_one_env_var() {
        let mut with = job("mnist", Some("ml"), 2);
        with.spec.tensorboard = Some(Default::default());
        with.spec.checkpoint = Some(rdu_crds::CheckpointSpec {
            interval_steps: 5,
            volume: None,
            volume_claim_template: None,
            keep: 1,
        });
        let env = container_env(&rank_contract(&valid(&with), 0, 0, Some("http://op")));
        let value = |name: &str| value_of(&env, name).map(str::to_string);
        assert_eq!(
            value(consts::env::CHECKPOINT_DIR).as_deref(),
            Some(CHECKPOINT_MOUNT)
        );
        assert_eq!(
            value(consts::env::TENSORBOARD_DIR).as_deref(),
            Some(consts::TENSORBOARD_MOUNT)
        );
        assert_eq!(
            value(consts::env::PROGRESS_URL).as_deref(),
            Some("http://op")
        );
        assert!(value(consts::env::PROGRESS_TOKEN_FILE).is_some());
        let mut names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "each variable once: {names:?}");
    }
}
