//! One look at a generation, for both modes: given the run policy, the restarts so far, what the generation is
//! already blamed on and what its ranks were seen doing, what the gang does next (fail the job, stop the
//! generation, settle its end, succeed, create the missing ranks, or run on). The operator looks at pods and
//! `status`, local mode at its child processes; both apply the same turn, each in its own way (deletes and creates
//! through the API, signals and spawns).

use rdu_crds::{EndCause, RunPolicy};

use crate::{
    Culprit, Deadline, FailureReason, RankExit, Restarts, Ruling, Settlement, Verdict, blame_key,
    judge, settle,
};

/// An end that blames a generation, with whatever more the mode knows of it (the operator: the pod, its node and
/// a sentence for people; local mode: the process's exit).
pub trait Evidence {
    /// The rank, its exit and its cause: what the blame order reads (`blame_key`).
    fn end(&self) -> (u32, RankExit, EndCause);
    /// What the failure rules match of it.
    fn culprit(&self) -> Culprit;
    /// Whether `other` records the same end (a record may have been written with other words).
    fn same_end(&self, other: &Self) -> bool;
}

impl Evidence for Culprit {
    fn end(&self) -> (u32, RankExit, EndCause) {
        (self.rank, self.exit, self.cause)
    }

    fn culprit(&self) -> Culprit {
        self.clone()
    }

    fn same_end(&self, other: &Self) -> bool {
        self == other
    }
}

/// How many of the generation's ranks were seen in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankTally {
    /// The world size.
    pub workers: u32,
    /// Ranks of the current generation that were started (a pod or process that is not going away).
    pub started: u32,
    /// Ranks of the current generation that exited 0.
    pub succeeded: u32,
    /// Pods or processes of the job that still exist, of any generation and in any state: a failed generation
    /// has ended once none is left.
    pub present: u32,
}

/// What one look sees of a generation.
#[derive(Clone, Debug)]
pub struct Look<'a, E> {
    pub policy: &'a RunPolicy,
    /// The gang's restarts so far.
    pub restarts: Restarts,
    /// `activeDeadlineSeconds` against the job's start.
    pub deadline: Deadline,
    /// What the generation is already blamed on (it is stopping), as recorded at an earlier look.
    pub stopping: Option<E>,
    /// Ends seen at this look that blame the generation: failed, lost or disrupted ranks, rank 0 hung.
    pub evidence: Vec<E>,
    pub ranks: RankTally,
}

/// What the gang does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Turn<E> {
    /// `activeDeadlineSeconds` passed: the job fails (`DeadlineExceeded`), every rank is stopped.
    DeadlineExceeded { limit: u64 },
    /// A rule fails the job whatever else arrives (a permanent failure, `restartPolicy: Never`, a `FailJob`
    /// rule): it fails now and every rank is stopped. A spent budget is not such a rule: evidence arriving while
    /// the generation stops may blame a rank whose end another rule or budget judges.
    Fail {
        culprit: E,
        ruling: Ruling,
        reason: FailureReason,
    },
    /// The generation failed and some of it is left: stop it, blamed on `culprit`; `news` when that is not what
    /// it was blamed on before (or nothing was).
    Stop { culprit: E, news: bool },
    /// The generation failed and nothing of it is left: its end settled by the rules (the next generation, or
    /// the job fails on a spent budget). `news` as in `Stop`.
    Ended {
        culprit: E,
        news: bool,
        settlement: Settlement,
    },
    /// Every rank of the generation exited 0: the job succeeded.
    Succeeded,
    /// Ranks of the generation are missing: create them.
    Create,
    /// Every rank was started and none failed: run on.
    Run,
}

/// The gang's next turn after `look` (DESIGN 5): the deadline first, then the surest evidence against the
/// generation (with what it was blamed on before) judged by the rules, then success, then the missing ranks.
pub fn turn<E: Evidence>(look: Look<'_, E>) -> Turn<E> {
    let Look {
        policy,
        restarts,
        deadline,
        stopping,
        evidence,
        ranks,
    } = look;
    if let Deadline::Passed { limit } = deadline {
        return Turn::DeadlineExceeded { limit };
    }
    let key = |e: &E| {
        let (rank, exit, cause) = e.end();
        blame_key(rank, exit, cause)
    };
    let failed = |e: &E| !e.end().1.is_success();
    let seen = evidence.into_iter().filter(failed).min_by_key(key);
    let (culprit, news) = match (seen, stopping.filter(failed)) {
        (None, None) => return untroubled(ranks),
        (Some(seen), None) => (seen, true),
        (None, Some(recorded)) => (recorded, false),
        // What is seen now wins among equals: it may say more of the same end.
        (Some(seen), Some(recorded)) if key(&seen) <= key(&recorded) => {
            let news = !seen.same_end(&recorded);
            (seen, news)
        }
        (Some(_), Some(recorded)) => (recorded, false),
    };
    let ruling = judge(policy, restarts, &culprit.culprit());
    if let Verdict::Fail(reason) = ruling.verdict
        && !reason.is_spent_budget()
    {
        return Turn::Fail {
            culprit,
            ruling,
            reason,
        };
    }
    if ranks.present > 0 {
        return Turn::Stop { culprit, news };
    }
    let settlement = settle(policy, restarts, &culprit.culprit());
    Turn::Ended {
        culprit,
        news,
        settlement,
    }
}

/// No evidence against the generation: it succeeded, lacks ranks, or runs.
fn untroubled<E>(ranks: RankTally) -> Turn<E> {
    if ranks.succeeded >= ranks.workers {
        Turn::Succeeded
    } else if ranks.started < ranks.workers {
        Turn::Create
    } else {
        Turn::Run
    }
}

#[cfg(test)]
mod tests;
