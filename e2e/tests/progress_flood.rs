//! The progress endpoint under a flood (issue 22, item 2), against a real API server, with the operator running as
//! the chart's ServiceAccount: thousands of reports with bogus tokens (garbage, forged claims of a job that does
//! not exist, forged claims of a real rank 0 with its real UID, a real token of rank 1) and a slow-loris of
//! connections that never finish their request head. The TokenReviews the API server itself counts
//! (`apiserver_request_total{resource="tokenreviews"}`) stay bounded by one review per second for each rank 0
//! whose UID the forger knows, whatever the number of reports, `/healthz` keeps answering on its own listener, the
//! slow connections are cut at the header timeout and one address holds at most its share of the listener (the
//! flood comes from 8 loopback addresses and the slow-loris from another, as from other pods),
//! rank 0's real reports are still accepted (its token remembered, and a fresh one after), and a stranger gets
//! the same answer for a job of another namespace as for one that does not exist.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use rdu_crds::RduJob;
use rdu_crds::consts;
use rdu_e2e::kit::{
    self, JobFixture, TIMEOUT, job_status, or_operator_log, pod_token, post_progress,
    progress_report, progress_url_flag, report_running, wait_phase,
};
use rdu_e2e::metrics::{http_get, http_post_from};
use rdu_e2e::poll_until;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const JOBS: &str = "jobs";
const OTHER: &str = "other-team";
/// Bogus reports sent, and how many at once.
const FLOOD: usize = 4000;
const FLOOD_CONCURRENCY: usize = 32;
/// Connections that dribble a request head one byte at a time.
const SLOW_LORIS: usize = 100;
/// The operator's header-read timeout (`rdu_operator::PROGRESS_LIMITS`).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Source addresses the flood comes from; the slow-loris has one of its own, rank 0 and the stranger 127.0.0.1.
const ATTACKERS: usize = 8;
const SLOW_LORIS_SOURCE: [u8; 4] = [127, 0, 0, 20];
/// A connection closed unanswered (over its client's share of the listener).
const CLOSED: u16 = 0;

/// Hang detection's deadline of the watched job, the least the API takes.
const PROGRESS_DEADLINE_SECONDS: u64 = 20;

fn job_yaml(name: &str, namespace: &str) -> String {
    JobFixture::new(namespace, name)
        .epochs(2)
        .run_policy(
            json!({"backoffLimit": 3, "progressDeadlineSeconds": PROGRESS_DEADLINE_SECONDS}),
        )
        .manifest()
}

async fn pod(client: &kube::Client, namespace: &str, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    poll_until(&format!("pod {namespace}/{name}"), TIMEOUT, || async {
        pods.get(name).await.map_err(|e| e.to_string())
    })
    .await
    .expect("pod")
}

/// A token with the claims the API server would write for `namespace/pod` (UID `uid`), signed by no one.
fn forged(namespace: &str, pod: &str, uid: &str, salt: usize) -> String {
    let exp = jiff::Timestamp::now().as_second() + 600;
    let claims = json!({
        "aud": [consts::PROGRESS_TOKEN_AUDIENCE], "exp": exp, "iat": exp - 600, "nbf": exp - 600,
        "iss": "https://kubernetes.default.svc", "jti": salt.to_string(),
        "kubernetes.io": {"namespace": namespace, "pod": {"name": pod, "uid": uid},
                          "serviceaccount": {"name": "default", "uid": "x"}},
        "sub": format!("system:serviceaccount:{namespace}:default"),
    });
    let part = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
    format!(
        "{}.{}.{}",
        part(br#"{"alg":"RS256","kid":"forged"}"#),
        part(claims.to_string().as_bytes()),
        part(format!("signature-{salt}").as_bytes())
    )
}

fn report(step: u64) -> Vec<u8> {
    progress_report(0, step)
}

/// What the flood sends.
struct Bogus {
    rank0_uid: String,
    hidden_uid: String,
    rank1_token: String,
}

impl Bogus {
    /// The `i`-th bogus report's namespace, job and token.
    fn nth(&self, i: usize) -> (&'static str, &'static str, String) {
        match i % 5 {
            0 => (JOBS, "watched", format!("garbage-{i}")),
            1 => (
                JOBS,
                "ghost",
                forged(JOBS, "ghost-worker-0", "no-such-uid", i),
            ),
            2 => (
                JOBS,
                "watched",
                forged(JOBS, "watched-worker-0", &self.rank0_uid, i),
            ),
            3 => (JOBS, "watched", self.rank1_token.clone()),
            _ => (
                OTHER,
                "hidden",
                forged(OTHER, "hidden-worker-0", &self.hidden_uid, i),
            ),
        }
    }
}

async fn post(addr: SocketAddr, namespace: &str, job: &str, token: &str, step: u64) -> u16 {
    post_full(addr, namespace, job, token, step).await.0
}

/// The loopback address flood sender `worker` sends from: eight attacker pods, as far as the operator can tell.
fn attacker(worker: usize) -> IpAddr {
    IpAddr::from([127, 0, 0, 2 + (worker % ATTACKERS) as u8])
}

/// A bogus report from `source`: its status, or [`CLOSED`] when the operator closed the connection unanswered
/// (its client already had as many connections open as one may).
async fn post_from(
    source: IpAddr,
    addr: SocketAddr,
    namespace: &str,
    job: &str,
    token: &str,
) -> u16 {
    let bearer = format!("Bearer {token}");
    let headers = [
        ("Content-Type", "application/json"),
        ("Authorization", bearer.as_str()),
    ];
    let path = consts::progress_path(namespace, job);
    match http_post_from(source, addr, &path, &headers, &report(2)).await {
        Ok((code, _)) => code,
        Err(_) => CLOSED,
    }
}

async fn post_full(
    addr: SocketAddr,
    namespace: &str,
    job: &str,
    token: &str,
    step: u64,
) -> (u16, String) {
    post_progress(addr, namespace, job, Some(token), &report(step)).await
}

/// TokenReviews the API server has served so far.
async fn token_reviews(client: &kube::Client) -> f64 {
    let text = rdu_e2e::metrics::apiserver_metrics(client)
        .await
        .expect("API server metrics");
    let samples = rdu_e2e::metrics::parse(&text);
    rdu_e2e::metrics::sum(
        &samples,
        "apiserver_request_total",
        &[("resource", "tokenreviews")],
    )
}

/// Opens a connection that sends a request head one byte every 200 ms; how long until the server closes it.
async fn slow_loris(addr: SocketAddr, give_up: Duration) -> Option<Duration> {
    let started = Instant::now();
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind(SocketAddr::from((SLOW_LORIS_SOURCE, 0))).ok()?;
    let mut stream = socket.connect(addr).await.ok()?;
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: op\r\nX-Slow: ",
        consts::progress_path(JOBS, "watched")
    );
    stream.write_all(head.as_bytes()).await.ok()?;
    let mut byte = [0u8; 1];
    while started.elapsed() < give_up {
        if stream.write_all(b"z").await.is_err() {
            return Some(started.elapsed());
        }
        let read = tokio::time::timeout(Duration::from_millis(200), stream.read(&mut byte));
        if let Ok(Ok(0) | Err(_)) = read.await {
            return Some(started.elapsed());
        }
    }
    None
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn a_flood_of_bogus_reports_costs_bounded_token_reviews_and_starves_no_one() {
    let (plane, addrs) = kit::plane("progress flood")
        .controller_manager()
        .namespaces(&[JOBS, OTHER])
        .operator_flags(&[&progress_url_flag()])
        .start_operator()
        .await;
    let client = plane.admin_client().await.expect("client");
    for (name, namespace) in [("watched", JOBS), ("hidden", OTHER)] {
        kit::apply(&plane, &job_yaml(name, namespace)).expect("apply");
    }
    let rank0 = pod(&client, JOBS, "watched-worker-0").await;
    let rank1 = pod(&client, JOBS, "watched-worker-1").await;
    let hidden0 = pod(&client, OTHER, "hidden-worker-0").await;
    let uid = |pod: &Pod| pod.metadata.uid.clone().expect("uid");
    let token0 = pod_token(&client, &rank0, consts::PROGRESS_TOKEN_AUDIENCE).await;
    let token1 = pod_token(&client, &rank1, consts::PROGRESS_TOKEN_AUDIENCE).await;

    // The watched job runs, so hang detection judges it through the flood.
    let pods: Api<Pod> = Api::namespaced(client.clone(), JOBS);
    let jobs: Api<RduJob> = Api::namespaced(client.clone(), JOBS);
    for name in ["watched-worker-0", "watched-worker-1"] {
        report_running(&pods, name).await;
    }
    wait_phase(&plane, &jobs, "watched", "Running").await;

    // Rank 0's first report: accepted, its token reviewed once and remembered.
    let progress = addrs.progress;
    let waited = poll_until("rank 0's first report", TIMEOUT, || async {
        match post(progress, JOBS, "watched", &token0, 1).await {
            202 => Ok(()),
            other => Err(format!("status {other}")),
        }
    })
    .await;
    or_operator_log(&plane, waited);

    // A stranger learns nothing from the answers: a job of another namespace whose rank 0 it names (with a guessed
    // UID) answers exactly as a job that does not exist.
    let stranger = |job: &str, pod: &str| {
        let token = forged(OTHER, pod, "guessed-uid", 0);
        let job = job.to_string();
        async move { post_full(progress, OTHER, &job, &token, 1).await }
    };
    let (hidden_code, hidden_text) = stranger("hidden", "hidden-worker-0").await;
    let (ghost_code, ghost_text) = stranger("ghost", "ghost-worker-0").await;
    assert_eq!(hidden_code, 403, "{hidden_text}");
    assert_eq!(
        (hidden_code, hidden_text.replace("hidden", "JOB")),
        (ghost_code, ghost_text.replace("ghost", "JOB"))
    );

    let reviews_before = token_reviews(&client).await;
    let flood_started = Instant::now();

    // The slow-loris: connections that never finish their request head.
    let slow: Vec<_> = (0..SLOW_LORIS)
        .map(|_| tokio::spawn(slow_loris(progress, 4 * HEADER_TIMEOUT)))
        .collect();

    // The probes' listener, watched while everything else runs.
    let metrics = addrs.metrics;
    let probing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let probe = {
        let probing = probing.clone();
        tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            let mut answered = 0;
            while probing.load(std::sync::atomic::Ordering::SeqCst) {
                let started = Instant::now();
                let (code, _) =
                    tokio::time::timeout(Duration::from_secs(5), http_get(metrics, "/healthz"))
                        .await
                        .expect("/healthz answers within 5 s")
                        .expect("/healthz");
                assert_eq!(code, 200);
                slowest = slowest.max(started.elapsed());
                answered += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (answered, slowest)
        })
    };

    // The flood: bogus tokens of every kind, round robin.
    let bogus = Arc::new(Bogus {
        rank0_uid: uid(&rank0),
        hidden_uid: uid(&hidden0),
        rank1_token: token1.clone(),
    });
    let senders: Vec<_> = (0..FLOOD_CONCURRENCY)
        .map(|worker| {
            let bogus = bogus.clone();
            tokio::spawn(async move {
                let mut codes = std::collections::BTreeMap::<u16, usize>::new();
                for i in (worker..FLOOD).step_by(FLOOD_CONCURRENCY) {
                    let (namespace, job, token) = bogus.nth(i);
                    let code = post_from(attacker(worker), progress, namespace, job, &token).await;
                    *codes.entry(code).or_default() += 1;
                }
                codes
            })
        })
        .collect();

    // Meanwhile rank 0 keeps reporting (its token remembered): accepted despite the flood.
    poll_until("rank 0 accepted during the flood", TIMEOUT, || async {
        match post(progress, JOBS, "watched", &token0, 3).await {
            202 => Ok(()),
            other => Err(format!("status {other}")),
        }
    })
    .await
    .expect("rank 0 served");
    // And its step moves, every 2 s as a training rank 0 reports, until the flood and a whole progress deadline
    // after it are over: a report starved by the flood would look like a hang to a judge that counted silence.
    let reporting = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let reporter = {
        let (reporting, token) = (reporting.clone(), token0.clone());
        tokio::spawn(async move {
            let mut accepted = 0u64;
            let mut step = 10;
            while reporting.load(std::sync::atomic::Ordering::SeqCst) {
                if post(progress, JOBS, "watched", &token, step).await == 202 {
                    accepted += 1;
                }
                step += 1;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            accepted
        })
    };

    let mut codes = std::collections::BTreeMap::<u16, usize>::new();
    for sender in senders {
        for (code, n) in sender.await.expect("sender") {
            *codes.entry(code).or_default() += n;
        }
    }
    let flood_seconds = flood_started.elapsed().as_secs_f64();
    eprintln!("{FLOOD} bogus reports in {flood_seconds:.1} s: {codes:?}");
    assert_eq!(codes.values().sum::<usize>(), FLOOD);
    assert!(
        codes
            .keys()
            .all(|code| [CLOSED, 401, 403, 429].contains(code)),
        "only refusals: {codes:?}"
    );

    let mut held = Vec::new();
    for connection in slow {
        held.push(
            connection
                .await
                .expect("slow-loris task")
                .expect("the operator closed the slow connection"),
        );
    }
    let longest = held.iter().max().copied().unwrap_or_default();
    let held_long = held
        .iter()
        .filter(|h| **h >= HEADER_TIMEOUT - Duration::from_millis(500))
        .count();
    eprintln!(
        "slow-loris: {SLOW_LORIS} connections from one address, {held_long} held to the header timeout, the \
         longest {longest:?}"
    );
    assert!(
        held_long <= rdu_operator::PROGRESS_LIMITS.max_per_client,
        "one client holds at most its share of the listener: {held_long}"
    );
    assert!(
        longest >= HEADER_TIMEOUT - Duration::from_millis(500),
        "{longest:?}"
    );
    assert!(
        longest < 2 * HEADER_TIMEOUT,
        "cut at the header timeout: {longest:?}"
    );

    probing.store(false, std::sync::atomic::Ordering::SeqCst);
    // A whole progress deadline and a recheck after the flood, rank 0 still reporting: never Hung.
    let deadline_passed = flood_started + Duration::from_secs(2 * PROGRESS_DEADLINE_SECONDS + 5);
    tokio::time::sleep_until(deadline_passed.into()).await;
    reporting.store(false, std::sync::atomic::Ordering::SeqCst);
    let reported = reporter.await.expect("reporter");
    let watched = job_status(&jobs, "watched")
        .await
        .expect("watched's status");
    let hung_restarts = watched["history"]
        .as_array()
        .map_or(0, |h| h.iter().filter(|e| e["reason"] == "Hung").count());
    println!(
        "{}",
        json!({"bench": "admin_safety_flood", "bogus_reports": FLOOD, "flood_seconds": flood_seconds,
               "hung_restarts_under_port_flood": hung_restarts, "restarts": watched["restarts"],
               "rank0_reports_accepted_under_flood": reported})
    );
    assert_eq!(watched["phase"], "Running", "{watched}");
    assert_eq!(
        watched["restarts"], 0,
        "no restart under the flood: {watched}"
    );
    assert_eq!(hung_restarts, 0, "{watched}");
    assert!(reported > 0, "rank 0's reports kept arriving");
    let (answered, slowest) = probe.await.expect("probe");
    eprintln!("/healthz: {answered} probes, the slowest {slowest:?}");
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");

    // The API server's own count: forged claims naming a current rank 0 with its real UID (the flood's two such
    // kinds, one per job) cost at most one review per second each over the flood's own seconds (not the
    // slow-loris' hold, which sends no token), plus rank 0's own first review; everything else none. One review
    // per bogus report would be hundreds.
    let reviews = token_reviews(&client).await - reviews_before;
    let bound = 2.0 * flood_seconds.ceil() + 2.0;
    eprintln!("TokenReviews during the flood: {reviews} (bound {bound})");
    assert!(
        reviews <= bound,
        "{reviews} TokenReviews for {FLOOD} bogus reports"
    );

    // A fresh token of rank 0 (the kubelet rotated it) is reviewed and accepted.
    let fresh = pod_token(&client, &rank0, consts::PROGRESS_TOKEN_AUDIENCE).await;
    poll_until("a fresh rank-0 token accepted", TIMEOUT, || async {
        match post(progress, JOBS, "watched", &fresh, 4).await {
            202 => Ok(()),
            other => Err(format!("status {other}")),
        }
    })
    .await
    .expect("fresh token accepted");
    let metrics = rdu_e2e::metrics::scrape(addrs.metrics)
        .await
        .expect("metrics");
    assert!(
        metrics.contains(&format!(
            "rdu_operator_progress_reports_total{{outcome=\"accepted\"}} {}",
            3 + reported
        )),
        "{metrics}"
    );
}
