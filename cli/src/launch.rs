//! Local mode's launch of one gang generation: every rank's env is the job's `RankEnv` contract with the values a
//! cluster would supply filled in locally, plus its tiles from a simulated node.

use std::collections::BTreeMap;
use std::path::Path;

use rdu_crds::rank_env::SuppliedValues;
use rdu_crds::{RankEnv, RduJob};

/// What local mode substitutes for the cluster: the token Secret, the downward API, the rendezvous port, the
/// tiles, and where rank 0's result and the checkpoints go.
#[derive(Debug, Clone)]
pub(crate) struct LocalContext<'a> {
    pub supplied: SuppliedValues,
    /// Port of rank 0's rendezvous; every rank's collective server binds a free port of its own (port 0), which
    /// the rendezvous advertises.
    pub master_port: u16,
    /// One tile allocation env (SF_RNT_TILE_AFFINITY, RDU_VISIBLE_TILES) per rank.
    pub tiles: &'a [BTreeMap<String, String>],
    pub result_path: &'a Path,
    pub checkpoint_dir: Option<&'a Path>,
    /// Rank 0's TensorBoard directory, when the job asks for one.
    pub tensorboard_dir: Option<&'a Path>,
    /// Rank 0 writes its progress as JSON lines on stdout (`RDU_PROGRESS_LINES`) for the console.
    pub progress_lines: bool,
}

/// One rank's process environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RankLaunch {
    pub rank: u32,
    pub env: Vec<(String, String)>,
}

/// Where the ranks of a local job find rank 0.
pub(crate) const LOCALHOST: &str = "127.0.0.1";

/// Every rank's env for `generation`.
pub(crate) fn rank_launches(job: &RduJob, generation: u32, ctx: &LocalContext) -> Vec<RankLaunch> {
    (0..job.spec.workers)
        .map(|rank| {
            let mut contract =
                RankEnv::new(job, rank, generation, LOCALHOST.into(), ctx.master_port, 0);
            contract.result_path = Some(ctx.result_path.display().to_string());
            contract.checkpoint_dir = ctx.checkpoint_dir.map(|d| d.display().to_string());
            if rank == 0 {
                contract.tensorboard_dir = ctx.tensorboard_dir.map(|d| d.display().to_string());
                contract.progress_lines = ctx.progress_lines;
            }
            let mut env: Vec<(String, String)> = contract
                .vars_with(&ctx.supplied)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            if let Some(tiles) = ctx.tiles.get(rank as usize) {
                env.extend(tiles.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            RankLaunch { rank, env }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdu_crds::consts::env;

    fn job(workers: u32) -> RduJob {
        let yaml = format!(
            "apiVersion: rdu.dev/v1alpha1\nkind: RduJob\nmetadata: {{name: t}}\nspec:\n  workers: {workers}\n  model: {{name: ffn-logreg}}\n  data: {{source: synthetic}}\n  training: {{epochs: 1, batchSize: 8, learningRate: 0.1}}\n"
        );
        rdu_crds::parse_manifest(&yaml).unwrap()
    }

    fn get<'a>(l: &'a RankLaunch, key: &str) -> Option<&'a str> {
        l.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn every_rank_gets_the_contract_with_local_values() {
        let tiles = |t: &str| BTreeMap::from([(env::VISIBLE_TILES.to_string(), t.to_string())]);
        let tiles = [tiles("rdu0-tile0"), tiles("rdu0-tile1")];
        let ctx = LocalContext {
            supplied: SuppliedValues {
                token: "tok".into(),
                node_name: "host1".into(),
                pod_ip: LOCALHOST.into(),
            },
            master_port: 4000,
            tiles: &tiles,
            result_path: Path::new("/tmp/r.json"),
            checkpoint_dir: None,
            tensorboard_dir: Some(Path::new("/tmp/tb")),
            progress_lines: true,
        };
        let launches = rank_launches(&job(2), 3, &ctx);
        assert_eq!(launches.len(), 2);
        let r1 = &launches[1];
        assert_eq!(get(r1, env::RANK), Some("1"));
        assert_eq!(get(r1, env::WORLD_SIZE), Some("2"));
        assert_eq!(get(r1, env::MASTER_ADDR), Some("127.0.0.1"));
        assert_eq!(get(r1, env::MASTER_PORT), Some("4000"));
        assert_eq!(get(r1, env::COLLECTIVE_PORT), Some("0"));
        assert_eq!(get(r1, env::GENERATION), Some("3"));
        assert_eq!(get(r1, env::JOB_TOKEN), Some("tok"));
        assert_eq!(get(r1, env::NODE_NAME), Some("host1"));
        assert_eq!(get(r1, env::POD_IP), Some("127.0.0.1"));
        assert_eq!(get(r1, env::VISIBLE_TILES), Some("rdu0-tile1"));
        assert_eq!(get(r1, env::RESULT_PATH), Some("/tmp/r.json"));
        assert_eq!(get(r1, env::CHECKPOINT_DIR), None);
        assert!(get(r1, env::JOB_SPEC).is_some_and(|s| s.contains("\"workers\":2")));
        assert_eq!(
            get(&launches[0], env::PROGRESS_LINES),
            Some("1"),
            "rank 0 reports"
        );
        assert_eq!(get(r1, env::PROGRESS_LINES), None, "rank 1 does not");
        assert_eq!(get(&launches[0], env::TENSORBOARD_DIR), Some("/tmp/tb"));
        assert_eq!(get(r1, env::TENSORBOARD_DIR), None);
    }
}
