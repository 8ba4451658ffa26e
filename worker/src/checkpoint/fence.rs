//! The fence: which generation of which job owns the checkpoint directory, and which checkpoint it resumed
//! from. A starting rank 0 writes it (under the exclusive lock); every checkpoint write reads it (under the
//! shared lock) and is refused when it names a newer generation or another job. The decisions here are pure
//! functions; `store` does the I/O around them.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::CheckpointError;
use super::files::{self, Listed};
use super::format::{Writer, parse_name};

/// The fence file in the checkpoint directory.
pub(crate) const FENCE_FILE: &str = "FENCE";
/// A fence file is a line of JSON; anything longer is not one.
const MAX_FENCE_BYTES: u64 = 4096;

/// `FENCE`: `{"jobUid": …, "generation": G, "resumedFrom": "<file>" | null}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Fence {
    pub job_uid: String,
    pub generation: u64,
    /// The checkpoint this generation resumed from (a file name of this directory), if any.
    pub resumed_from: Option<String>,
}

impl Fence {
    pub(crate) fn holder(&self) -> Writer {
        Writer {
            job_uid: self.job_uid.clone(),
            generation: self.generation,
        }
    }
}

/// What the fence says to a rank 0 that would start, or write a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Standing {
    /// No newer generation of this job holds the directory.
    Current,
    /// A newer generation of the same job fenced the directory: this rank 0 is stale.
    Superseded { by: u64 },
    /// Another job (another UID) holds the directory. A start takes it over and resumes from its lineage;
    /// a write is refused.
    OtherJob { holder: Writer },
}

/// Where `me` stands under `fence` (none: the directory is new, or was fenced by no one).
pub(super) fn standing(fence: Option<&Fence>, me: &Writer) -> Standing {
    match fence {
        None => Standing::Current,
        Some(f) if f.job_uid != me.job_uid => Standing::OtherJob { holder: f.holder() },
        Some(f) if f.generation > me.generation => Standing::Superseded { by: f.generation },
        Some(_) => Standing::Current,
    }
}

/// A checkpoint a start may resume from, and whose it must be to qualify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Candidate {
    pub name: String,
    /// The writer its header must name; `None` when any intact checkpoint of this name will do.
    pub written_by: Option<Writer>,
}

/// The checkpoints a start may resume from, best first, following the lineage. Under a fence: those the fenced
/// generation wrote (newest first), then the one it resumed from, then, should all of those be damaged, the
/// older ones at or before that step (the states the lineage passed through). Without a fence: every checkpoint,
/// newest first. A file written after a fence moved on is never on disk (the write was refused), so whatever a
/// later step of another generation holds is not a candidate: it is outside the lineage.
pub(super) fn lineage(fence: Option<&Fence>, files: &[Listed]) -> Vec<Candidate> {
    let mut files: Vec<&Listed> = files.iter().collect();
    files.sort_by_key(|f| std::cmp::Reverse((f.step, f.generation)));
    let any = |f: &Listed| Candidate {
        name: f.name.clone(),
        written_by: None,
    };
    let Some(fence) = fence else {
        return files.into_iter().map(any).collect();
    };
    let mut candidates: Vec<Candidate> = files
        .iter()
        .filter(|f| f.generation == fence.generation)
        .map(|f| Candidate {
            name: f.name.clone(),
            written_by: Some(fence.holder()),
        })
        .collect();
    let resumed = fence
        .resumed_from
        .as_ref()
        .and_then(|name| Some((name, parse_name(name)?)));
    if let Some((name, parts)) = resumed {
        candidates.push(Candidate {
            name: name.clone(),
            written_by: None,
        });
        candidates.extend(
            files
                .into_iter()
                .filter(|f| {
                    f.step <= parts.step && f.name != *name && f.generation != fence.generation
                })
                .map(any),
        );
    }
    candidates
}

/// The checkpoints a writer of `generation` that resumed from step `resumed_step` deletes to keep `keep`:
/// of its own lineage (the files of its generation, and those at or before the step it resumed from, which its
/// own supersede), all but the newest `keep`. Files outside the lineage stay.
pub(super) fn prunable(
    files: &[Listed],
    generation: u64,
    resumed_step: Option<u64>,
    keep: usize,
) -> Vec<String> {
    let mut own: Vec<&Listed> = files
        .iter()
        .filter(|f| f.generation == generation || resumed_step.is_some_and(|s| f.step <= s))
        .collect();
    own.sort_by_key(|f| std::cmp::Reverse((f.step, f.generation)));
    own.into_iter()
        .skip(keep.max(1))
        .map(|f| f.name.clone())
        .collect()
}

/// The fence of `dir`, if there is one. One that does not parse is an error: it may name a newer generation.
pub(super) fn read(dir: &Path) -> Result<Option<Fence>, CheckpointError> {
    let path = dir.join(FENCE_FILE);
    let Some(bytes) = files::read_bounded(&path, MAX_FENCE_BYTES)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| CheckpointError::BadFence {
            path: path.display().to_string(),
            source,
        })
}

/// Replaces `dir`'s fence with `fence`, atomically and durably. Call under the exclusive lock.
pub(super) fn write(dir: &Path, fence: &Fence) -> Result<(), CheckpointError> {
    let mut bytes = serde_json::to_vec(fence).map_err(|source| CheckpointError::BadFence {
        path: dir.join(FENCE_FILE).display().to_string(),
        source,
    })?;
    bytes.push(b'\n');
    let tmp = files::stage(dir, FENCE_FILE, &bytes)?;
    files::commit(dir, tmp, FENCE_FILE)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(uid: &str, generation: u64, resumed_from: Option<&str>) -> Fence {
        Fence {
            job_uid: uid.into(),
            generation,
            resumed_from: resumed_from.map(str::to_string),
        }
    }

    fn me(uid: &str, generation: u64) -> Writer {
        Writer {
            job_uid: uid.into(),
            generation,
        }
    }

    fn listed(step: u64, generation: u64) -> Listed {
        Listed {
            name: super::super::format::file_name(step, generation),
            step,
            generation,
        }
    }

    #[test]
    fn standing_under_every_fence() {
        let table = [
            (None, me("a", 3), Standing::Current),
            (Some(fence("a", 3, None)), me("a", 3), Standing::Current),
            (Some(fence("a", 2, None)), me("a", 3), Standing::Current),
            (
                Some(fence("a", 4, None)),
                me("a", 3),
                Standing::Superseded { by: 4 },
            ),
            (
                Some(fence("b", 0, None)),
                me("a", 3),
                Standing::OtherJob { holder: me("b", 0) },
            ),
            (
                Some(fence("b", 9, None)),
                me("a", 3),
                Standing::OtherJob { holder: me("b", 9) },
            ),
        ];
        for (f, writer, expected) in table {
            assert_eq!(standing(f.as_ref(), &writer), expected, "{f:?} {writer:?}");
        }
    }

    #[test]
    fn the_lineage_is_the_fenced_generations_newest_then_what_it_resumed_from() {
        // Generation 1 resumed from generation 0's step 20 and wrote 30 and 40; a stale generation 0 wrote 50
        // before generation 2 fenced (then it was generation 1's to choose: it was not, so it is not a
        // candidate now); a legacy file sits at step 60.
        let files = [
            listed(10, 0),
            listed(20, 0),
            listed(30, 1),
            listed(40, 1),
            listed(50, 0),
            Listed {
                name: "ckpt-000000000060.bin".into(),
                step: 60,
                generation: 0,
            },
        ];
        let names = |c: Vec<Candidate>| c.into_iter().map(|c| c.name).collect::<Vec<_>>();
        let gen1 = fence("a", 1, Some(&listed(20, 0).name));
        let chosen = lineage(Some(&gen1), &files);
        assert_eq!(
            names(chosen.clone())[..3],
            [listed(40, 1).name, listed(30, 1).name, listed(20, 0).name]
        );
        assert_eq!(chosen[0].written_by, Some(me("a", 1)));
        assert_eq!(chosen[2].written_by, None);
        // Generation 1's lineage ends with the older states at or before step 20; the stray 50 is not one.
        assert_eq!(
            names(lineage(Some(&gen1), &files))[3..],
            [listed(10, 0).name]
        );
        // Generation 3 fenced and wrote nothing yet: what it resumed from.
        let gen3 = fence("a", 3, Some(&listed(40, 1).name));
        assert_eq!(
            names(lineage(Some(&gen3), &files)),
            [
                listed(40, 1).name,
                listed(30, 1).name,
                listed(20, 0).name,
                listed(10, 0).name
            ]
        );
        // A fresh fence: nothing to resume.
        assert!(lineage(Some(&fence("a", 0, None)), &[]).is_empty());
        // A fence naming something that is no checkpoint name is not followed.
        let odd = fence("a", 7, Some("../../etc/passwd"));
        assert!(lineage(Some(&odd), &files).is_empty());
        // No fence (a directory of the first format): newest first, whatever wrote it.
        assert_eq!(
            names(lineage(None, &files))[..2],
            ["ckpt-000000000060.bin".to_string(), listed(50, 0).name]
        );
    }

    #[test]
    fn pruning_keeps_the_newest_of_its_own_lineage_and_touches_nothing_else() {
        let files = [
            listed(10, 0),
            listed(20, 0),
            listed(25, 0), // not chosen by generation 1 (it was unreadable): outside the lineage
            listed(30, 1),
            listed(40, 1),
            listed(50, 1),
            listed(45, 2), // a newer generation's: never touched
        ];
        let mut pruned = prunable(&files, 1, Some(20), 2);
        pruned.sort();
        assert_eq!(
            pruned,
            [listed(10, 0).name, listed(20, 0).name, listed(30, 1).name]
        );
        // Keep 3: generation 1's three files stay, the ancestors go.
        let mut pruned = prunable(&files, 1, Some(20), 3);
        pruned.sort();
        assert_eq!(pruned, [listed(10, 0).name, listed(20, 0).name]);
        // Resumed from nothing: only its own files are its lineage.
        assert_eq!(
            prunable(&files, 1, None, 1),
            [listed(40, 1).name, listed(30, 1).name]
        );
        // keep 0 means keep 1: the newest is never deleted.
        assert_eq!(prunable(&[listed(30, 1)], 1, None, 0), Vec::<String>::new());
    }

    #[test]
    fn the_fence_round_trips_and_a_damaged_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let f = fence("uid-a", 4, Some("ckpt-000000000030-g000003.bin"));
        write(dir.path(), &f).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(f));
        let text = std::fs::read_to_string(dir.path().join(FENCE_FILE)).unwrap();
        assert_eq!(
            text,
            "{\"jobUid\":\"uid-a\",\"generation\":4,\"resumedFrom\":\"ckpt-000000000030-g000003.bin\"}\n"
        );
        std::fs::write(dir.path().join(FENCE_FILE), "{\"generation\":").unwrap();
        let err = read(dir.path()).unwrap_err();
        assert!(matches!(err, CheckpointError::BadFence { .. }), "{err}");
        let cause =
            std::error::Error::source(&err).expect("the parser's error is kept as the source");
        assert!(cause.is::<serde_json::Error>(), "{cause}");
    }
}
