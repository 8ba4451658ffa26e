//! Rank 0's checkpoint directory, fenced by generation. At start ([`CheckpointStore::fence`]), under the
//! exclusive lock: read the fence, refuse to start if a newer generation of this job holds it, choose the
//! checkpoint to resume from by lineage, write the fence for this generation. To save ([`CheckpointStore::save`]):
//! stage the file, then under the shared lock read the fence and either rename the file into place or refuse
//! (a newer generation or another job fenced the directory), then prune this lineage to `keep`.
//!
//! The lock makes "written before the fence" and "refused after it" the only two outcomes: a write that
//! passed the fence check holds the shared lock until its rename is on disk, so a starting generation that
//! chooses a lineage sees it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::CheckpointError;
use super::fence::{self, Candidate, Fence, Standing};
use super::files::{self, LockKind};
use super::format::{self, Checkpoint, Snapshot, Writer};

/// Checkpoint writes this process refused because a newer generation or another job fenced the directory
/// (logged with each refusal).
static STALE_WRITES_REFUSED: AtomicU64 = AtomicU64::new(0);

/// Rank 0's fenced checkpoint directory.
#[derive(Debug)]
pub(crate) struct CheckpointStore {
    dir: PathBuf,
    me: Writer,
    keep: usize,
    /// The step of the checkpoint this generation resumed from.
    resumed_step: Option<u64>,
    lock_wait: Duration,
}

impl CheckpointStore {
    /// Fences `dir` for `me` and returns the store with the checkpoint to resume from (of `params`
    /// parameters), if any. Refused ([`CheckpointError::Superseded`]) when a newer generation of the job
    /// fenced it first. A lock held longer than `lock_wait` fails too.
    pub(crate) fn fence(
        dir: &Path,
        me: Writer,
        keep: usize,
        params: usize,
        lock_wait: Duration,
    ) -> Result<(CheckpointStore, Option<Checkpoint>), CheckpointError> {
        std::fs::create_dir_all(dir).map_err(|e| CheckpointError::io("create", dir, e))?;
        let _lock = files::lock(dir, LockKind::Exclusive, lock_wait)?;
        let found = fence::read(dir)?;
        match fence::standing(found.as_ref(), &me) {
            Standing::Current => {}
            Standing::Superseded { by } => {
                tracing::warn!(
                    generation = me.generation,
                    fence_generation = by,
                    dir = %dir.display(),
                    "a newer generation of this job fenced the checkpoint directory: not starting"
                );
                return Err(CheckpointError::Superseded {
                    dir: dir.display().to_string(),
                    mine: me.generation,
                    fence: by,
                });
            }
            Standing::OtherJob { holder } => tracing::info!(
                fence_job_uid = holder.job_uid,
                fence_generation = holder.generation,
                dir = %dir.display(),
                "the checkpoint directory was another job's: this job takes it over and resumes its lineage"
            ),
        }
        files::remove_staged(dir, "ckpt-")?;
        let chosen = choose(dir, found.as_ref(), params)?;
        fence::write(
            dir,
            &Fence {
                job_uid: me.job_uid.clone(),
                generation: me.generation,
                resumed_from: chosen.as_ref().map(|(name, _)| name.clone()),
            },
        )?;
        tracing::info!(
            generation = me.generation,
            resumed_from = chosen.as_ref().map(|(name, _)| name.as_str()),
            "fenced the checkpoint directory"
        );
        let store = CheckpointStore {
            dir: dir.to_path_buf(),
            me,
            keep,
            resumed_step: chosen.as_ref().map(|(_, c)| c.step),
            lock_wait,
        };
        Ok((store, chosen.map(|(_, c)| c)))
    }

    /// Writes `ckpt` as this store's writer unless a newer generation or another job fenced the directory
    /// since this one started; then deletes what this lineage no longer needs beyond `keep`. Returns the new
    /// file.
    pub(crate) fn save(&self, ckpt: &Snapshot<'_>) -> Result<PathBuf, CheckpointError> {
        self.save_checked(ckpt, || {})
    }

    /// [`CheckpointStore::save`], calling `before_commit` after the fence check passed and before the rename
    /// (tests hold a writer there while a new generation fences).
    pub(crate) fn save_checked(
        &self,
        ckpt: &Snapshot<'_>,
        before_commit: impl FnOnce(),
    ) -> Result<PathBuf, CheckpointError> {
        let name = format::file_name(ckpt.step, self.me.generation);
        let staged = files::stage(&self.dir, &name, &format::encode(&self.me, ckpt))?;
        let _lock = files::lock(&self.dir, LockKind::Shared, self.lock_wait)?;
        let found = fence::read(&self.dir)?;
        let refusal = match fence::standing(found.as_ref(), &self.me) {
            Standing::Current => None,
            Standing::Superseded { by } => Some(CheckpointError::Superseded {
                dir: self.dir.display().to_string(),
                mine: self.me.generation,
                fence: by,
            }),
            Standing::OtherJob { holder } => Some(CheckpointError::TakenOver {
                dir: self.dir.display().to_string(),
                by: holder.job_uid,
                generation: holder.generation,
            }),
        };
        if let Some(refusal) = refusal {
            let refused = STALE_WRITES_REFUSED.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(
                generation = self.me.generation,
                fence_generation = found.as_ref().map(|f| f.generation),
                fence_job_uid = found.as_ref().map(|f| f.job_uid.as_str()),
                step = ckpt.step,
                stale_writes_refused = refused,
                "checkpoint refused: {refusal}"
            );
            return Err(refusal);
        }
        before_commit();
        let path = files::commit(&self.dir, staged, &name)?;
        self.prune()?;
        Ok(path)
    }

    fn prune(&self) -> Result<(), CheckpointError> {
        let listed = files::list(&self.dir)?;
        let doomed = fence::prunable(&listed, self.me.generation, self.resumed_step, self.keep);
        for name in &doomed {
            let path = self.dir.join(name);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %rdu_error_chain::Chain(&e), "cannot delete an old checkpoint");
            }
        }
        if !doomed.is_empty() {
            files::sync_dir(&self.dir)?;
        }
        Ok(())
    }
}

/// The checkpoint a reader (inference) takes from `dir`: the lineage's newest intact one, without fencing.
pub(crate) fn read_lineage(
    dir: &Path,
    params: usize,
    lock_wait: Duration,
) -> Result<Option<Checkpoint>, CheckpointError> {
    if !dir.exists() {
        return Ok(None);
    }
    // A reader needs no lock to be safe (renames are atomic): on a read-only volume it goes without.
    let _lock = files::lock(dir, LockKind::Shared, lock_wait)
        .inspect_err(|e| tracing::debug!(error = %rdu_error_chain::Chain(e), "reading checkpoints without the lock"))
        .ok();
    let found = fence::read(dir)?;
    Ok(choose(dir, found.as_ref(), params)?.map(|(_, c)| c))
}

/// The first intact candidate of the lineage under `found`, with its file name.
fn choose(
    dir: &Path,
    found: Option<&Fence>,
    params: usize,
) -> Result<Option<(String, Checkpoint)>, CheckpointError> {
    let candidates = fence::lineage(found, &files::list(dir)?);
    for Candidate { name, written_by } in &candidates {
        let path = dir.join(name);
        let read = match files::read_bounded(&path, format::max_len(params)) {
            Ok(bytes) => bytes.and_then(|b| format::decode(&b)),
            Err(e) => {
                tracing::warn!(error = %rdu_error_chain::Chain(&e), "skipping a checkpoint that cannot be read");
                None
            }
        };
        match read {
            Some(c) if c.params.len() != params => {
                tracing::warn!(path = %path.display(), params = c.params.len(), expected = params, "skipping a checkpoint of another model");
            }
            Some(c) if written_by.as_ref().is_some_and(|w| *w != c.writer) => {
                tracing::warn!(path = %path.display(), writer = ?c.writer, "skipping a checkpoint its name does not describe");
            }
            Some(c) => return Ok(Some((name.clone(), c))),
            None => {
                tracing::warn!(path = %path.display(), "skipping a missing, unreadable or damaged checkpoint")
            }
        }
    }
    if !candidates.is_empty() {
        tracing::warn!(
            dir = %dir.display(),
            candidates = candidates.len(),
            "no intact checkpoint in this job's lineage: starting from step 0"
        );
    }
    Ok(None)
}

#[cfg(test)]
mod tests;
