//! Which tokens the API server is asked about, and how often. Only a token whose claims already name a current
//! rank-0 pod gets here (`super::claims`, then the caches); on top of that an answer is remembered per token
//! ([`SUCCESS_TTL`] when the token was accepted, [`REFUSAL_TTL`] when it was refused), a pod's tokens are reviewed at
//! most once per [`PER_POD_INTERVAL`], and at most [`MAX_CONCURRENT_REVIEWS`] reviews run at once in the whole
//! operator. So the TokenReviews a flood can cause are bounded by the number of current rank-0 pods, whatever
//! the number of requests, and never outrun the API server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::token_review::{PodIdentity, ReviewError, TokenReviewer};

/// How long an accepted token is taken without asking again (every report still needs its pod to be the job's
/// current rank 0 in the pod cache, so a deleted pod's token is refused at once). Long, so that rank 0 needs a
/// review about once per token the kubelet rotates in, and one that a flood of forged tokens delays is rare.
pub(crate) const SUCCESS_TTL: Duration = Duration::from_secs(600);
/// How long a refused token is refused without asking again.
pub(crate) const REFUSAL_TTL: Duration = Duration::from_secs(10);
/// Tokens naming one pod are reviewed at most this often.
pub(crate) const PER_POD_INTERVAL: Duration = Duration::from_secs(1);
/// Reviews in flight at once, for every job together.
pub(crate) const MAX_CONCURRENT_REVIEWS: usize = 4;
/// How long a review waits for a turn among the concurrent ones before the report is refused.
pub(crate) const QUEUE_WAIT: Duration = Duration::from_secs(2);
/// Most tokens remembered (a full table first drops what expired, then its oldest answer), and the size past which
/// the pods' turns drop those older than the interval (only pods that passed the claims check take turns).
const MAX_ENTRIES: usize = 1024;

/// Why a token was not reviewed, or the review's refusal.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotReviewed {
    #[error(transparent)]
    Review(#[from] ReviewError),
    #[error(
        "another token of this pod was reviewed less than {}s ago; retry in {}s",
        PER_POD_INTERVAL.as_secs(),
        retry_after.as_secs().max(1)
    )]
    Throttled { retry_after: Duration },
    #[error("too many progress tokens are being reviewed at once; retry in a second")]
    Busy,
}

/// What was answered, and when each pod's tokens were last reviewed.
#[derive(Default)]
struct Memory {
    answers: HashMap<String, (Result<PodIdentity, ReviewError>, Instant)>,
    last_review: HashMap<String, Instant>,
}

impl Memory {
    /// The answer remembered for `token`, if it has not expired at `now`.
    fn answer(&self, token: &str, now: Instant) -> Option<Result<PodIdentity, ReviewError>> {
        let (answer, at) = self.answers.get(token)?;
        let ttl = if answer.is_ok() {
            SUCCESS_TTL
        } else {
            REFUSAL_TTL
        };
        (now.saturating_duration_since(*at) < ttl).then(|| answer.clone())
    }

    /// Keeps `answer` for `token`; an API server that could not answer is asked again next time.
    fn remember(&mut self, token: &str, answer: &Result<PodIdentity, ReviewError>, now: Instant) {
        if matches!(answer, Err(ReviewError::Unavailable(_))) {
            return;
        }
        if self.answers.len() >= MAX_ENTRIES {
            self.answers.retain(|_, (answer, at)| {
                let ttl = if answer.is_ok() {
                    SUCCESS_TTL
                } else {
                    REFUSAL_TTL
                };
                now.saturating_duration_since(*at) < ttl
            });
            // Still full of live answers: one goes, the oldest refusal before any acceptance, so that a flood of
            // forged tokens cannot make the operator forget the tokens of every job's rank 0 at once.
            if self.answers.len() >= MAX_ENTRIES {
                let oldest = self
                    .answers
                    .iter()
                    .min_by_key(|(_, (answer, at))| (answer.is_ok(), *at))
                    .map(|(token, _)| token.clone());
                if let Some(oldest) = oldest {
                    self.answers.remove(&oldest);
                }
            }
        }
        self.answers
            .insert(token.to_string(), (answer.clone(), now));
    }

    /// Takes pod `pod_uid`'s turn at `now`, or says how long until its next one.
    fn take_turn(&mut self, pod_uid: &str, now: Instant) -> Result<(), Duration> {
        if let Some(last) = self.last_review.get(pod_uid) {
            let since = now.saturating_duration_since(*last);
            if since < PER_POD_INTERVAL {
                return Err(PER_POD_INTERVAL - since);
            }
        }
        if self.last_review.len() >= MAX_ENTRIES {
            self.last_review
                .retain(|_, at| now.saturating_duration_since(*at) < PER_POD_INTERVAL);
        }
        self.last_review.insert(pod_uid.to_string(), now);
        Ok(())
    }
}

/// The operator's TokenReviews of progress tokens, remembered and bounded.
pub struct Reviews {
    reviewer: Arc<dyn TokenReviewer>,
    memory: Mutex<Memory>,
    in_flight: Semaphore,
}

impl Reviews {
    pub fn new(reviewer: Arc<dyn TokenReviewer>) -> Self {
        Reviews {
            reviewer,
            memory: Mutex::default(),
            in_flight: Semaphore::new(MAX_CONCURRENT_REVIEWS),
        }
    }

    fn memory(&self) -> MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pod `token` belongs to, from memory or a TokenReview; `claimed` is the pod its unverified claims name,
    /// whose turn the review takes.
    pub async fn review(
        &self,
        token: &str,
        claimed: &PodIdentity,
    ) -> Result<PodIdentity, NotReviewed> {
        {
            let mut memory = self.memory();
            let now = Instant::now();
            if let Some(answer) = memory.answer(token, now) {
                return answer.map_err(NotReviewed::from);
            }
            memory
                .take_turn(&claimed.pod_uid, now)
                .map_err(|retry_after| NotReviewed::Throttled { retry_after })?;
        }
        let _permit = tokio::time::timeout(QUEUE_WAIT, self.in_flight.acquire())
            .await
            .map_err(|_| NotReviewed::Busy)?
            .map_err(|_| NotReviewed::Busy)?;
        let answer = self.reviewer.review(token).await;
        self.memory().remember(token, &answer, Instant::now());
        answer.map_err(NotReviewed::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::future::BoxFuture;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn pod(uid: &str) -> PodIdentity {
        PodIdentity {
            namespace: "ml".into(),
            pod_name: "mnist-worker-0".into(),
            pod_uid: uid.into(),
        }
    }

    /// Accepts tokens starting with `good`, refuses the others; counts the calls and the most at once.
    #[derive(Default)]
    struct Counting {
        calls: AtomicUsize,
        running: AtomicUsize,
        most: AtomicUsize,
        delay: Duration,
        unavailable: bool,
    }

    impl TokenReviewer for Counting {
        fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<PodIdentity, ReviewError>> {
            Box::pin(async move {
                self.calls.fetch_add(1, Ordering::SeqCst);
                let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
                self.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(self.delay).await;
                self.running.fetch_sub(1, Ordering::SeqCst);
                if self.unavailable {
                    Err(ReviewError::Unavailable("connection refused".into()))
                } else if token.starts_with("good") {
                    Ok(pod(token.trim_start_matches("good-")))
                } else {
                    Err(ReviewError::Rejected("invalid signature".into()))
                }
            })
        }
    }

    fn reviews(reviewer: Counting) -> (Reviews, Arc<Counting>) {
        let reviewer = Arc::new(reviewer);
        (Reviews::new(reviewer.clone()), reviewer)
    }

    #[tokio::test]
    async fn answers_are_remembered_and_a_pods_tokens_are_reviewed_once_a_second() {
        let (reviews, api) = reviews(Counting::default());
        assert_eq!(reviews.review("good-u0", &pod("u0")).await, Ok(pod("u0")));
        assert_eq!(reviews.review("good-u0", &pod("u0")).await, Ok(pod("u0")));
        let forged = reviews.review("forged-1", &pod("u1")).await;
        assert!(matches!(
            forged,
            Err(NotReviewed::Review(ReviewError::Rejected(_)))
        ));
        assert_eq!(
            reviews.review("forged-1", &pod("u1")).await,
            forged,
            "refusal remembered"
        );
        assert_eq!(api.calls.load(Ordering::SeqCst), 2);
        // Another forged token naming the same pod within the second: refused without a review.
        let throttled = reviews.review("forged-2", &pod("u1")).await;
        assert!(
            matches!(throttled, Err(NotReviewed::Throttled { retry_after }) if retry_after <= PER_POD_INTERVAL),
            "{throttled:?}"
        );
        assert_eq!(api.calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn accepted_tokens_are_remembered_longer_than_refused_ones_and_unavailable_never() {
        let mut memory = Memory::default();
        let t0 = Instant::now();
        memory.remember("good", &Ok(pod("u0")), t0);
        memory.remember("bad", &Err(ReviewError::Rejected("no".into())), t0);
        memory.remember("down", &Err(ReviewError::Unavailable("no".into())), t0);
        let later = t0 + REFUSAL_TTL;
        assert_eq!(memory.answer("good", later), Some(Ok(pod("u0"))));
        assert_eq!(
            memory
                .answer("bad", later - Duration::from_millis(1))
                .map(|a| a.is_err()),
            Some(true)
        );
        assert_eq!(memory.answer("bad", later), None);
        assert_eq!(memory.answer("down", t0), None);
        assert_eq!(memory.answer("good", t0 + SUCCESS_TTL), None);
    }

    #[test]
    fn a_pods_turn_comes_back_after_the_interval_and_other_pods_are_not_held() {
        let mut memory = Memory::default();
        let t0 = Instant::now();
        assert_eq!(memory.take_turn("u0", t0), Ok(()));
        assert_eq!(
            memory.take_turn("u0", t0 + Duration::from_millis(300)),
            Err(Duration::from_millis(700))
        );
        assert_eq!(memory.take_turn("u1", t0), Ok(()));
        assert_eq!(memory.take_turn("u0", t0 + PER_POD_INTERVAL), Ok(()));
    }

    #[test]
    fn the_tables_stay_bounded() {
        let mut memory = Memory::default();
        let t0 = Instant::now();
        for i in 0..3 * MAX_ENTRIES {
            memory.remember(&format!("t{i}"), &Ok(pod("u")), t0);
            assert_eq!(memory.take_turn(&format!("u{i}"), t0), Ok(()));
        }
        assert!(memory.answers.len() <= MAX_ENTRIES);
        // Turns within the interval are all kept (only current rank-0 pods get one); the next insert after it
        // drops the old ones.
        let later = t0 + PER_POD_INTERVAL;
        assert_eq!(memory.take_turn("fresh", later), Ok(()));
        assert!(memory.last_review.len() <= MAX_ENTRIES);
    }

    #[test]
    fn a_flood_of_refused_tokens_evicts_refusals_one_by_one_and_keeps_accepted_tokens() {
        let mut memory = Memory::default();
        let t0 = Instant::now();
        memory.remember("good", &Ok(pod("u0")), t0);
        let refused = Err(ReviewError::Rejected("invalid signature".into()));
        for i in 0..3 * MAX_ENTRIES {
            memory.remember(
                &format!("forged-{i}"),
                &refused,
                t0 + Duration::from_millis(1),
            );
        }
        assert_eq!(memory.answers.len(), MAX_ENTRIES);
        assert_eq!(memory.answer("good", t0), Some(Ok(pod("u0"))));
        let last = format!("forged-{}", 3 * MAX_ENTRIES - 1);
        assert!(
            memory.answer(&last, t0).is_some(),
            "the newest refusal is kept"
        );
    }

    #[tokio::test]
    async fn at_most_a_few_reviews_run_at_once_and_the_rest_wait_their_turn() {
        let (reviews, api) = reviews(Counting {
            delay: Duration::from_millis(100),
            ..Default::default()
        });
        let reviews = Arc::new(reviews);
        let tasks: Vec<_> = (0..3 * MAX_CONCURRENT_REVIEWS)
            .map(|i| {
                let reviews = reviews.clone();
                tokio::spawn(async move {
                    let token = format!("good-u{i}");
                    reviews.review(&token, &pod(&format!("u{i}"))).await
                })
            })
            .collect();
        for task in tasks {
            assert!(task.await.expect("task").is_ok());
        }
        assert_eq!(api.most.load(Ordering::SeqCst), MAX_CONCURRENT_REVIEWS);
        assert_eq!(api.calls.load(Ordering::SeqCst), 3 * MAX_CONCURRENT_REVIEWS);
    }

    #[tokio::test]
    async fn an_api_server_that_cannot_answer_is_asked_again_once_the_pods_turn_comes() {
        let (reviews, api) = reviews(Counting {
            unavailable: true,
            ..Default::default()
        });
        let first = reviews.review("good-u0", &pod("u0")).await;
        assert!(matches!(
            first,
            Err(NotReviewed::Review(ReviewError::Unavailable(_)))
        ));
        assert!(matches!(
            reviews.review("good-u0", &pod("u0")).await,
            Err(NotReviewed::Throttled { .. })
        ));
        assert_eq!(api.calls.load(Ordering::SeqCst), 1);
    }
}
