//! The reporter against a small HTTP/1.1 server on loopback that records what it gets and answers from a script.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use rdu_crds::{JobResult, ProgressReport, StepPoint};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::*;
use crate::model::BatchStats;

/// One request as the server saw it.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    authorization: String,
    body: Vec<u8>,
}

/// Serves on 127.0.0.1, answering each request with the next status of `answers` (202 once they run out).
fn serve(answers: Vec<u16>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let answers = Arc::new(Mutex::new(VecDeque::from(answers)));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    listener.set_nonblocking(true).expect("nonblocking");
    let record = seen.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (record, answers) = (record.clone(), answers.clone());
                tokio::spawn(async move {
                    let mut stream = BufReader::new(stream);
                    while let Some(seen) = read_request(&mut stream).await {
                        record.lock().expect("lock").push(seen);
                        let code = answers.lock().expect("lock").pop_front().unwrap_or(202);
                        let reply = format!(
                            "HTTP/1.1 {code} X\r\nContent-Length: 7\r\nRetry-After: 1\r\n\r\nrefused"
                        );
                        if stream.get_mut().write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
    });
    (url, seen)
}

async fn read_request(stream: &mut BufReader<tokio::net::TcpStream>) -> Option<Seen> {
    let mut line = String::new();
    stream.read_line(&mut line).await.ok().filter(|n| *n > 0)?;
    let path = line.split_whitespace().nth(1)?.to_string();
    let (mut length, mut authorization) = (0usize, String::new());
    loop {
        line.clear();
        stream.read_line(&mut line).await.ok()?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().ok()?,
            "authorization" => authorization = value.trim().to_string(),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.ok()?;
    Some(Seen {
        path,
        authorization,
        body,
    })
}

fn step(step: u64) -> StepDone {
    StepDone {
        point: StepPoint {
            step,
            total_steps: 40,
            start_step: 0,
            epoch: 1 + step / 20,
            epochs: 2,
            loss: 1.0 / (1.0 + step as f64),
            elapsed_seconds: 0.1 * step as f64,
            samples: step * 64,
        },
        batch: BatchStats::default(),
        learning_rate: 0.1,
    }
}

fn reporter(url: &str, token_file: &std::path::Path) -> ProgressReporter {
    let endpoint = ProgressEndpoint {
        url: format!("{url}/"),
        token_file: token_file.display().to_string(),
    };
    ProgressReporter::start(ReportTarget::new(&endpoint, "ml", "mnist", 3)).expect("start")
}

fn reports(seen: &Mutex<Vec<Seen>>) -> Vec<ProgressReport> {
    seen.lock()
        .expect("lock")
        .iter()
        .map(|s| serde_json::from_slice(&s.body).expect("a ProgressReport"))
        .collect()
}

#[test]
fn at_most_one_report_per_interval_and_always_the_last_with_the_token_to_the_jobs_path() {
    let (url, seen) = serve(vec![]);
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "tok-123\n").expect("token");
    let mut reporter = reporter(&url, &token);
    for s in 1..=40 {
        reporter.step_done(&step(s));
    }
    reporter.finished(&JobResult::default());

    let got = reports(&seen);
    let steps: Vec<u64> = got.iter().map(|r| r.progress.step).collect();
    // Step 1 is handed over at once and 2..39 within the interval are not; the sender may still be busy when
    // step 40 replaces step 1 (the newest wins), so one or two reports arrive.
    assert!(matches!(steps.as_slice(), [40] | [1, 40]), "{steps:?}");
    let last = got.last().expect("a report");
    assert_eq!((last.generation, last.progress.percent), (3, 100));
    let first = seen.lock().expect("lock")[0].clone();
    assert_eq!(first.path, "/progress/v1/namespaces/ml/rdujobs/mnist");
    assert_eq!(first.authorization, "Bearer tok-123");
}

#[test]
fn a_rate_limited_report_is_sent_again_after_retry_after() {
    let (url, seen) = serve(vec![429]);
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "tok").expect("token");
    let mut reporter = reporter(&url, &token);
    reporter.step_done(&step(7));
    reporter.finished(&JobResult::default());
    let steps: Vec<u64> = reports(&seen).iter().map(|r| r.progress.step).collect();
    assert_eq!(steps, [7, 7], "refused once, then sent again");
}

#[test]
fn a_missing_token_or_a_refusal_never_stops_training() {
    let (url, seen) = serve(vec![403, 403]);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut unreadable = reporter(&url, &dir.path().join("absent"));
    unreadable.step_done(&step(1));
    unreadable.finished(&JobResult::default());
    assert!(
        seen.lock().expect("lock").is_empty(),
        "no token, no request"
    );

    let token = dir.path().join("token");
    std::fs::write(&token, "tok").expect("token");
    let mut refused = reporter(&url, &token);
    refused.step_done(&step(1));
    refused.finished(&JobResult::default());
    assert_eq!(reports(&seen).len(), 1, "refused, logged, not retried");
}

#[test]
fn a_step_that_stands_still_is_reported_again_each_heartbeat() {
    let (url, seen) = serve(vec![]);
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "tok").expect("token");
    let endpoint = ProgressEndpoint {
        url,
        token_file: token.display().to_string(),
    };
    let target = ReportTarget {
        heartbeat: Duration::from_millis(50),
        ..ReportTarget::new(&endpoint, "ml", "mnist", 0)
    };
    let mut reporter = ProgressReporter::start(target).expect("start");
    reporter.step_done(&step(5));
    // The training loop is stuck at step 5 from here on: only the heartbeat reports.
    let deadline = Instant::now() + Duration::from_secs(10);
    while reports(&seen).len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let steps: Vec<u64> = reports(&seen).iter().map(|r| r.progress.step).collect();
    assert!(
        steps.len() >= 3 && steps.iter().all(|s| *s == 5),
        "{steps:?}"
    );
    reporter.finished(&JobResult::default());
}
