//! What one rank reads from its environment: the contract of `rdu_crds::RankEnv` (DESIGN 4.2) and the tiles
//! the device plugin handed out (DESIGN 4.3).

use std::path::PathBuf;

use rdu_collective::DataPath;
use rdu_crds::consts::{TERMINATION_LOG_PATH, env};
use rdu_crds::{RankEnv, RduJobSpec};

use crate::error::WorkerError;

/// Everything a rank reads from its environment, checked.
#[derive(Debug, Clone)]
pub struct WorkerEnv {
    pub rank: u32,
    pub world_size: u32,
    pub master_addr: String,
    pub master_port: u16,
    pub collective_port: u16,
    pub job_name: String,
    pub namespace: String,
    pub job_uid: String,
    pub generation: u64,
    pub token: String,
    pub spec: RduJobSpec,
    pub node_name: String,
    pub pod_ip: String,
    pub result_path: PathBuf,
    pub checkpoint_dir: Option<PathBuf>,
    /// This rank's tiles: its compute threads.
    pub tiles: usize,
    /// The tiles the device plugin (or local mode) gave this rank, as it gave them:
    /// `SF_RNT_TILE_AFFINITY` and `RDU_VISIBLE_TILES` (empty when unset).
    pub tile_affinity: String,
    pub visible_tiles: String,
    /// Rank 0 in a cluster whose operator takes progress reports: where they go.
    pub progress: Option<rdu_crds::ProgressEndpoint>,
    /// Local mode's rank 0: progress as JSON lines on stdout (`RDU_PROGRESS_LINES=1`).
    pub progress_lines: bool,
    /// Rank 0 of a job with `spec.tensorboard`: where its event files go.
    pub tensorboard_dir: Option<PathBuf>,
    /// How chunks travel to peers (`RDU_DATA_PATH`, default `auto`).
    pub data_path: DataPath,
}

impl WorkerEnv {
    /// Reads the contract (`rdu_crds::RankEnv`) and the device plugin's tile env through `get` (the process env
    /// in production, a map in tests).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<WorkerEnv, WorkerError> {
        let (contract, supplied) =
            RankEnv::read(&get).map_err(|e| WorkerError::config(e.var, e.reason))?;
        let tiles = tile_count(
            get(env::TILE_AFFINITY).as_deref(),
            get(env::VISIBLE_TILES).as_deref(),
            contract.spec.tiles_per_worker,
        )?;
        Ok(WorkerEnv {
            rank: contract.rank,
            world_size: contract.world_size,
            master_addr: contract.master_addr,
            master_port: contract.master_port,
            collective_port: contract.collective_port,
            job_name: contract.job_name,
            namespace: contract.job_namespace,
            job_uid: contract.job_uid,
            generation: u64::from(contract.generation),
            token: supplied.token,
            spec: contract.spec,
            node_name: supplied.node_name,
            pod_ip: supplied.pod_ip,
            result_path: contract
                .result_path
                .unwrap_or_else(|| TERMINATION_LOG_PATH.into())
                .into(),
            checkpoint_dir: contract.checkpoint_dir.map(PathBuf::from),
            tiles,
            tile_affinity: get(env::TILE_AFFINITY).unwrap_or_default(),
            visible_tiles: get(env::VISIBLE_TILES).unwrap_or_default(),
            progress: contract.progress,
            tensorboard_dir: contract.tensorboard_dir.map(PathBuf::from),
            progress_lines: get(env::PROGRESS_LINES).as_deref() == Some("1"),
            data_path: match get(env::DATA_PATH) {
                None => DataPath::default(),
                Some(path) => path.parse().map_err(|_| {
                    WorkerError::config(
                        env::DATA_PATH,
                        format!("{path:?} is not auto, tcp or grpc; unset it for auto"),
                    )
                })?,
            },
        })
    }
}

/// Tiles from the affinity mask (bits set), else the visible tile IDs, else `tilesPerWorker`.
fn tile_count(
    affinity: Option<&str>,
    visible: Option<&str>,
    tiles_per_worker: u32,
) -> Result<usize, WorkerError> {
    if let Some(mask) = affinity.map(str::trim).filter(|m| !m.is_empty()) {
        let hex = mask.trim_start_matches("0x").trim_start_matches("0X");
        let mut bits = 0usize;
        for c in hex.chars() {
            let digit = c.to_digit(16).ok_or_else(|| {
                WorkerError::config(
                    env::TILE_AFFINITY,
                    format!("{mask:?} is not a 0x-prefixed hex tile mask"),
                )
            })?;
            bits += digit.count_ones() as usize;
        }
        if bits == 0 {
            return Err(WorkerError::config(
                env::TILE_AFFINITY,
                "the mask selects no tile",
            ));
        }
        return Ok(bits);
    }
    if let Some(list) = visible.map(str::trim).filter(|l| !l.is_empty()) {
        return Ok(list
            .split(',')
            .filter(|t| !t.trim().is_empty())
            .count()
            .max(1));
    }
    Ok(tiles_per_worker.max(1) as usize)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;

    pub(crate) fn vars(spec_yaml: &str) -> HashMap<String, String> {
        let spec = rdu_crds::parse_manifest(spec_yaml).unwrap().spec;
        [
            (env::RANK, "1".to_string()),
            (env::WORLD_SIZE, "2".into()),
            (env::MASTER_ADDR, "127.0.0.1".into()),
            (env::MASTER_PORT, "29500".into()),
            (env::JOB_NAME, "t".into()),
            (env::JOB_UID, "uid-1".into()),
            (env::JOB_TOKEN, "secret".into()),
            (env::GENERATION, "2".into()),
            (env::JOB_SPEC, serde_json::to_string(&spec).unwrap()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn read(map: &HashMap<String, String>) -> Result<WorkerEnv, WorkerError> {
        WorkerEnv::from_vars(|k| map.get(k).cloned())
    }

    #[test]
    fn the_contract_reads_with_defaults() {
        let map = vars(crate::test_fixtures::MINIMAL);
        let e = read(&map).unwrap();
        assert_eq!((e.rank, e.world_size, e.generation), (1, 2, 2));
        assert_eq!(e.namespace, "default");
        assert_eq!(e.pod_ip, "127.0.0.1");
        assert_eq!(e.result_path, PathBuf::from("/dev/termination-log"));
        assert_eq!(e.collective_port, 29501);
        assert_eq!(e.tiles, 1);
        assert_eq!(
            (e.tile_affinity.as_str(), e.visible_tiles.as_str()),
            ("", "")
        );
        assert_eq!(e.data_path, DataPath::Auto);
        let mut tcp = map.clone();
        tcp.insert(env::DATA_PATH.into(), "tcp".into());
        assert_eq!(read(&tcp).unwrap().data_path, DataPath::Tcp);
    }

    #[test]
    fn the_tiles_the_device_plugin_gave_are_kept_as_given() {
        let mut map = vars(crate::test_fixtures::MINIMAL);
        map.insert(env::TILE_AFFINITY.into(), "0x00000006".into());
        map.insert(env::VISIBLE_TILES.into(), "rdu0-tile1,rdu0-tile2".into());
        let e = read(&map).unwrap();
        assert_eq!(e.tile_affinity, "0x00000006");
        assert_eq!(e.visible_tiles, "rdu0-tile1,rdu0-tile2");
        assert_eq!(e.tiles, 2);
    }

    #[test]
    fn missing_or_bad_values_name_the_variable() {
        let base = vars(crate::test_fixtures::MINIMAL);
        for (key, value, expected) in [
            (env::RANK, "", "RANK"),
            (env::RANK, "2", "RANK"),
            (env::MASTER_PORT, "http", "MASTER_PORT"),
            (env::JOB_SPEC, "{", "RDU_JOB_SPEC"),
            (env::JOB_TOKEN, "", "RDU_JOB_TOKEN"),
            (env::TILE_AFFINITY, "0xzz", "SF_RNT_TILE_AFFINITY"),
            (env::DATA_PATH, "udp", "RDU_DATA_PATH"),
        ] {
            let mut map = base.clone();
            map.insert(key.to_string(), value.to_string());
            match read(&map) {
                Err(WorkerError::Config { field, .. }) => {
                    assert_eq!(field, expected, "{key}={value}")
                }
                other => panic!("{key}={value}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_spec_breaking_the_crd_rules_is_refused_naming_its_field() {
        let bad = crate::test_fixtures::MINIMAL.replace("batchSize: 8", "batchSize: 0");
        match read(&vars(&bad)) {
            Err(WorkerError::Config { field, reason }) => {
                assert_eq!(field, env::JOB_SPEC);
                assert!(
                    reason.contains("spec.training.batchSize must be at least 1"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tiles_come_from_the_mask_then_the_list_then_the_spec() {
        assert_eq!(tile_count(Some("0x0000000f"), Some("a,b"), 1).unwrap(), 4);
        assert_eq!(
            tile_count(None, Some("rdu0-tile0,rdu0-tile1"), 1).unwrap(),
            2
        );
        assert_eq!(tile_count(None, None, 8).unwrap(), 8);
        assert!(tile_count(Some("0x0"), None, 1).is_err());
    }
}
