//! The job's options resolved once, at validation, into what the builders use: where checkpoints and TensorBoard
//! events go, gang scheduling, the scheduler. The builders read these and never the raw spec's options.

use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
use rdu_crds::RduJobSpec;

/// Access mode of the checkpoint claim when its template gives none: one pod (rank 0) mounts it.
const DEFAULT_CLAIM_ACCESS_MODE: &str = "ReadWriteOnce";
/// The shortest time a PodGroup waits for its gang to fit, in seconds.
const MIN_SCHEDULE_TIMEOUT_SECONDS: u32 = 60;

/// Where rank 0 keeps checkpoints (`spec.checkpoint`).
#[derive(Clone, Debug, PartialEq)]
pub enum Checkpointing {
    /// No `spec.checkpoint`.
    Off,
    /// An emptyDir in every pod (`spec.checkpoint` names no storage): it dies with the pod.
    EmptyDir,
    /// A volume of `spec.template` (`spec.checkpoint.volume`).
    TemplateVolume(String),
    /// The job's claim `<job>-checkpoints` made from this spec (`spec.checkpoint.volumeClaimTemplate`, access mode
    /// defaulted to ReadWriteOnce), mounted by rank 0 alone.
    Claim(Box<PersistentVolumeClaimSpec>),
}

impl Checkpointing {
    pub fn of(spec: &RduJobSpec) -> Self {
        let Some(checkpoint) = &spec.checkpoint else {
            return Checkpointing::Off;
        };
        match (&checkpoint.volume, &checkpoint.volume_claim_template) {
            (Some(volume), _) => Checkpointing::TemplateVolume(volume.clone()),
            (None, Some(template)) => {
                let mut claim = template.clone();
                if claim.access_modes.as_ref().is_none_or(Vec::is_empty) {
                    claim.access_modes = Some(vec![DEFAULT_CLAIM_ACCESS_MODE.to_string()]);
                }
                Checkpointing::Claim(Box::new(claim))
            }
            (None, None) => Checkpointing::EmptyDir,
        }
    }
}

/// Where rank 0 writes TensorBoard events (`spec.tensorboard`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TensorBoardLog {
    /// An emptyDir (no `spec.tensorboard.volume`).
    EmptyDir,
    /// A volume of `spec.template`.
    TemplateVolume(String),
}

impl TensorBoardLog {
    pub fn of(spec: &RduJobSpec) -> Option<Self> {
        let tensorboard = spec.tensorboard.as_ref()?;
        Some(match &tensorboard.volume {
            Some(volume) => TensorBoardLog::TemplateVolume(volume.clone()),
            None => TensorBoardLog::EmptyDir,
        })
    }
}

/// The name of a rank pod's claim of its tiles (`spec.resourceClaims[].name`, `api: dra`), which the template may
/// not use for a claim of its own.
pub(crate) const TILE_CLAIM_NAME: &str = "rdu-tiles";

/// How each rank asks for its tiles (`spec.tilesPerWorker`, `spec.tileAllocation`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tiles {
    /// `count` of the device plugin's extended resource `rdu.dev/tile` (`api: devicePlugin`).
    ExtendedResource { count: u32 },
    /// A ResourceClaim per rank from the job's ResourceClaimTemplate (`api: dra`).
    Claim(TileClaim),
}

/// What every rank's ResourceClaim asks for (`spec.tileAllocation.api: dra`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TileClaim {
    /// Tiles per rank.
    pub count: u32,
    /// All on one RDU.
    pub same_rdu: bool,
    /// Of this RDU model only (checked to be a plain name: it goes into a CEL selector).
    pub model: Option<String>,
}

impl Tiles {
    pub fn of(spec: &RduJobSpec) -> Self {
        let allocation = &spec.tile_allocation;
        let count = spec.tiles_per_worker;
        if allocation.is_dra() {
            Tiles::Claim(TileClaim {
                count,
                same_rdu: allocation.same_rdu,
                model: allocation.model.clone(),
            })
        } else {
            Tiles::ExtendedResource { count }
        }
    }

    /// Tiles per rank.
    pub fn count(&self) -> u32 {
        match self {
            Tiles::ExtendedResource { count } | Tiles::Claim(TileClaim { count, .. }) => *count,
        }
    }
}

/// Gang scheduling through a coscheduling PodGroup (`spec.runPolicy.schedulingPolicy.minAvailable`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gang {
    /// Pods that must fit together before any binds.
    pub min_available: u32,
    /// How long the PodGroup waits for them: the job's rendezvous timeout, at least a minute.
    pub schedule_timeout_seconds: u32,
}

impl Gang {
    pub fn of(spec: &RduJobSpec) -> Option<Self> {
        let min_available = spec.run_policy.scheduling_policy.as_ref()?.min_available?;
        Some(Gang {
            min_available,
            schedule_timeout_seconds: spec
                .data_parallel
                .timeout_seconds
                .max(MIN_SCHEDULE_TIMEOUT_SECONDS),
        })
    }
}

/// The scheduler and priority class of every rank's pod (`spec.runPolicy.schedulingPolicy`); unset keeps the
/// template's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scheduling {
    pub scheduler_name: Option<String>,
    pub priority_class_name: Option<String>,
}

impl Scheduling {
    pub fn of(spec: &RduJobSpec) -> Self {
        let policy = spec.run_policy.scheduling_policy.as_ref();
        Scheduling {
            scheduler_name: policy.and_then(|p| p.scheduler_name.clone()),
            priority_class_name: policy.and_then(|p| p.priority_class_name.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::job;

    fn spec(change: impl FnOnce(&mut serde_json::Value)) -> RduJobSpec {
        let mut value = serde_json::to_value(job("mnist", Some("ml"), 4).spec).expect("json");
        change(&mut value);
        serde_json::from_value(value).expect("spec")
    }

    fn claim(value: serde_json::Value) -> Box<PersistentVolumeClaimSpec> {
        Box::new(serde_json::from_value(value).expect("claim"))
    }

    #[test]
    fn checkpointing_follows_the_spec() {
        let sized = serde_json::json!({"resources": {"requests": {"storage": "1Gi"}}});
        let cases = [
            (serde_json::Value::Null, Checkpointing::Off),
            (
                serde_json::json!({"intervalSteps": 5}),
                Checkpointing::EmptyDir,
            ),
            (
                serde_json::json!({"intervalSteps": 5, "volume": "ckpt"}),
                Checkpointing::TemplateVolume("ckpt".into()),
            ),
            (
                serde_json::json!({"intervalSteps": 5, "volumeClaimTemplate": sized}),
                Checkpointing::Claim(claim(serde_json::json!({
                    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}))),
            ),
            (
                serde_json::json!({"intervalSteps": 5, "volumeClaimTemplate": {
                    "accessModes": ["ReadWriteMany"], "storageClassName": "fast",
                    "resources": {"requests": {"storage": "1Gi"}}}}),
                Checkpointing::Claim(claim(serde_json::json!({
                    "accessModes": ["ReadWriteMany"], "storageClassName": "fast",
                    "resources": {"requests": {"storage": "1Gi"}}}))),
            ),
        ];
        for (checkpoint, want) in cases {
            let s = spec(|v| v["checkpoint"] = checkpoint.clone());
            assert_eq!(Checkpointing::of(&s), want, "{checkpoint}");
        }
    }

    #[test]
    fn tiles_follow_the_allocation_api() {
        let plugin = spec(|v| v["tilesPerWorker"] = serde_json::json!(2));
        assert_eq!(Tiles::of(&plugin), Tiles::ExtendedResource { count: 2 });
        let dra = spec(|v| {
            v["tilesPerWorker"] = serde_json::json!(4);
            v["tileAllocation"] =
                serde_json::json!({"api": "dra", "sameRdu": true, "model": "SN30"});
        });
        let tiles = Tiles::of(&dra);
        assert_eq!(
            tiles,
            Tiles::Claim(TileClaim {
                count: 4,
                same_rdu: true,
                model: Some("SN30".into())
            })
        );
        assert_eq!((Tiles::of(&plugin).count(), tiles.count()), (2, 4));
    }

    #[test]
    fn tensorboard_gang_and_scheduler_follow_the_spec() {
        assert_eq!(TensorBoardLog::of(&spec(|_| {})), None);
        assert_eq!(
            TensorBoardLog::of(&spec(|v| v["tensorboard"] = serde_json::json!({}))),
            Some(TensorBoardLog::EmptyDir)
        );
        assert_eq!(
            TensorBoardLog::of(&spec(
                |v| v["tensorboard"] = serde_json::json!({"volume": "runs"})
            )),
            Some(TensorBoardLog::TemplateVolume("runs".into()))
        );

        assert_eq!(Gang::of(&spec(|_| {})), None);
        let policy = |v: &mut serde_json::Value| {
            v["runPolicy"]["schedulingPolicy"] = serde_json::json!({
                "schedulerName": "s", "priorityClassName": "high", "minAvailable": 3});
        };
        assert_eq!(
            Gang::of(&spec(policy)),
            Some(Gang {
                min_available: 3,
                schedule_timeout_seconds: 60
            }),
            "the rendezvous timeout (60 s by default), at least a minute"
        );
        let slow = spec(|v| {
            policy(v);
            v["dataParallel"]["timeoutSeconds"] = serde_json::json!(300);
        });
        assert_eq!(
            Gang::of(&slow).map(|g| g.schedule_timeout_seconds),
            Some(300)
        );
        let fast = spec(|v| {
            policy(v);
            v["dataParallel"]["timeoutSeconds"] = serde_json::json!(5);
        });
        assert_eq!(
            Gang::of(&fast).map(|g| g.schedule_timeout_seconds),
            Some(60)
        );

        assert_eq!(Scheduling::of(&spec(|_| {})), Scheduling::default());
        assert_eq!(
            Scheduling::of(&spec(policy)),
            Scheduling {
                scheduler_name: Some("s".into()),
                priority_class_name: Some("high".into())
            }
        );
    }
}
