//! Rank 0's progress reports to the operator (DESIGN 4.8): a `TrainObserver` that hands the newest progress, at
//! most every [`REPORT_INTERVAL`], to a thread of its own that POSTs it with the pod's projected token, and sends
//! the newest progress again whenever [`REPORT_INTERVAL`] passes without a new one: the operator judges a hang only
//! on reports (DESIGN 5.3), so a rank 0 whose step stands still keeps saying so. Reporting never slows or fails
//! training: a refused or failed report is logged once per kind and the next one is tried.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rdu_crds::{JobResult, ProgressEndpoint, ProgressReport, TrainingProgress, consts};
use tokio::sync::watch;

use crate::train_events::{StepDone, TrainObserver};

/// Progress is handed to the sender at most this often (the operator takes one report a second per job and
/// writes status every five).
pub(crate) const REPORT_INTERVAL: Duration = Duration::from_secs(5);
/// How long the end of training waits for the last report to be delivered.
pub(crate) const FLUSH_DEADLINE: Duration = Duration::from_secs(10);
/// One request's limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Retries of a rate-limited report before the newest one is waited for.
const RATE_LIMIT_RETRIES: u32 = 3;

/// Where one job's reports go.
#[derive(Clone, Debug)]
pub(crate) struct ReportTarget {
    /// `<url>/progress/v1/namespaces/<ns>/rdujobs/<job>`.
    pub uri: String,
    pub token_file: String,
    pub generation: u32,
    /// How long without new progress before the newest is sent again ([`REPORT_INTERVAL`]).
    pub heartbeat: Duration,
}

impl ReportTarget {
    pub(crate) fn new(
        endpoint: &ProgressEndpoint,
        namespace: &str,
        job: &str,
        generation: u32,
    ) -> Self {
        ReportTarget {
            uri: format!(
                "{}{}",
                endpoint.url.trim_end_matches('/'),
                consts::progress_path(namespace, job)
            ),
            token_file: endpoint.token_file.clone(),
            generation,
            heartbeat: REPORT_INTERVAL,
        }
    }
}

/// The observer: the newest progress into a watch channel, read by the sender thread.
pub(crate) struct ProgressReporter {
    latest: Option<watch::Sender<Option<TrainingProgress>>>,
    last_handed: Option<Instant>,
    last_progress: Option<TrainingProgress>,
    done: mpsc::Receiver<()>,
}

impl ProgressReporter {
    /// Starts the sender thread (its own single-threaded runtime, off the training loop's).
    pub(crate) fn start(target: ReportTarget) -> std::io::Result<Self> {
        let (latest, receiver) = watch::channel(None);
        let (done_tx, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("progress-report".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(send_reports(target, receiver)),
                    Err(e) => tracing::warn!(error = %rdu_error_chain::Chain(&e), "cannot start the progress reporter"),
                }
                let _ = done_tx.send(());
            })?;
        Ok(ProgressReporter {
            latest: Some(latest),
            last_handed: None,
            last_progress: None,
            done,
        })
    }

    fn hand_over(&mut self, progress: TrainingProgress) {
        if let Some(latest) = &self.latest {
            latest.send_replace(Some(progress));
        }
        self.last_handed = Some(Instant::now());
    }
}

impl TrainObserver for ProgressReporter {
    fn step_done(&mut self, step: &StepDone) {
        let progress = TrainingProgress::at(step.point);
        self.last_progress = Some(progress.clone());
        if self
            .last_handed
            .is_none_or(|t| t.elapsed() >= REPORT_INTERVAL)
        {
            self.hand_over(progress);
        }
    }

    /// The last step's progress goes out whatever the interval, and the run waits (at most
    /// [`FLUSH_DEADLINE`]) for it to be delivered.
    fn finished(&mut self, _result: &JobResult) {
        if let Some(progress) = self.last_progress.take() {
            self.hand_over(progress);
        }
        self.latest = None;
        if self.done.recv_timeout(FLUSH_DEADLINE).is_err() {
            tracing::warn!(
                deadline_s = FLUSH_DEADLINE.as_secs(),
                "the last progress report was not delivered in time"
            );
        }
    }
}

/// What became of one report.
#[derive(Debug, PartialEq, Eq)]
enum Delivery {
    Accepted,
    RetryAfter(Duration),
    Refused(StatusCode, String),
    Failed(String),
}

async fn send_reports(target: ReportTarget, mut latest: watch::Receiver<Option<TrainingProgress>>) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut last_problem: Option<String> = None;
    loop {
        // New progress, or the interval passed without any (the heartbeat); the sender gone ends the reports.
        if let Ok(Err(_)) = tokio::time::timeout(target.heartbeat, latest.changed()).await {
            break;
        }
        let Some(progress) = latest.borrow_and_update().clone() else {
            continue;
        };
        let body = match serde_json::to_vec(&ProgressReport {
            generation: target.generation,
            progress,
        }) {
            Ok(body) => body,
            Err(e) => {
                tracing::warn!(error = %rdu_error_chain::Chain(&e), "cannot encode a progress report");
                continue;
            }
        };
        for _ in 0..=RATE_LIMIT_RETRIES {
            let delivery = deliver(&client, &target, body.clone()).await;
            let problem = match delivery {
                Delivery::Accepted => None,
                Delivery::RetryAfter(wait) => {
                    tokio::time::sleep(wait).await;
                    continue;
                }
                Delivery::Refused(status, message) => Some(format!("{status}: {}", message.trim())),
                Delivery::Failed(why) => Some(why),
            };
            if problem != last_problem {
                match &problem {
                    Some(p) => {
                        tracing::warn!(uri = %target.uri, problem = %p, "progress report not taken")
                    }
                    None if last_problem.is_some() => {
                        tracing::info!("progress reports are taken again")
                    }
                    None => {}
                }
                last_problem = problem;
            }
            break;
        }
    }
}

async fn deliver(
    client: &Client<HttpConnector, Full<Bytes>>,
    target: &ReportTarget,
    body: Vec<u8>,
) -> Delivery {
    let token = match std::fs::read_to_string(&target.token_file) {
        Ok(t) => t.trim().to_string(),
        Err(e) => {
            return Delivery::Failed(format!(
                "cannot read the progress token {}: {e}",
                target.token_file
            ));
        }
    };
    let request = match Request::post(&target.uri)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Full::new(Bytes::from(body)))
    {
        Ok(r) => r,
        Err(e) => return Delivery::Failed(format!("bad progress URL {}: {e}", target.uri)),
    };
    let response = match tokio::time::timeout(REQUEST_TIMEOUT, client.request(request)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Delivery::Failed(format!("cannot reach {}: {e}", target.uri)),
        Err(_) => {
            return Delivery::Failed(format!(
                "no answer from {} in {REQUEST_TIMEOUT:?}",
                target.uri
            ));
        }
    };
    let status = response.status();
    if status.is_success() {
        return Delivery::Accepted;
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        let seconds = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1)
            .clamp(1, 30);
        return Delivery::RetryAfter(Duration::from_secs(seconds));
    }
    let message = match tokio::time::timeout(REQUEST_TIMEOUT, response.into_body().collect()).await
    {
        Ok(Ok(collected)) => {
            let bytes = collected.to_bytes();
            String::from_utf8_lossy(&bytes[..bytes.len().min(1024)]).into_owned()
        }
        _ => String::new(),
    };
    Delivery::Refused(status, message)
}

#[cfg(test)]
mod tests;
