//! The shared-memory domain of a job on a node (issue 37, DESIGN 4.4.1), on `dra.rs`'s node once the DRA plugin
//! runs: four rank pods of one job time the all-reduce over their domain's rings, the same job with
//! `RDU_DATA_PATH=tcp` over the pod network, and local mode's rings beside them; then pods whose claims name one
//! job share its domain (a socket one serves, the other connects to) while a pod of another job, and a pod of
//! another namespace whose claim names the same job, both as the same uid, cannot reach it; every domain is gone
//! once its pods are.

use std::time::Duration;

use rdu_e2e::all_reduce_bench;
use rdu_e2e::local_mode::run_local;
use rdu_e2e::testbed::Testbed;
use serde_json::{Value, json};

const NODE: u8 = 1;
const LONG: Duration = Duration::from_secs(300);
const SIZES: [&str; 3] = ["64Ki", "1Mi", "16Mi"];
const RANKS: u32 = 4;
/// The plugin's domain root on the node (the chart's `devicePlugin.shmDomainDir`).
const DOMAINS: &str = "/run/rdu-dra/domains";
/// Where a domain is in a container (`rdu_crds::shm_domain::MOUNT_PATH`).
const MOUNT: &str = rdu_crds::shm_domain::MOUNT_PATH;
/// The uid of every pod here, the worker image's.
const UID: u32 = 65532;
const OTHER_NAMESPACE: &str = "shm-foreign";

/// The domain bench, the isolation check and their summary keys.
pub(crate) async fn run(bed: &Testbed, shell: &str) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    let domain = bench_in_pods(bed, "shm-bench", None).await;
    assert!(
        domain["sharedMemoryPeers"].as_u64().unwrap_or_default() > 0,
        "ranks on one node with a domain share memory: {domain}"
    );
    wait_no_domains(bed).await;
    let tcp = bench_in_pods(bed, "tcp-bench", Some("tcp")).await;
    assert_eq!(tcp["sharedMemoryPeers"], 0, "RDU_DATA_PATH=tcp: {tcp}");
    assert_eq!(tcp["dataPath"], "tcp", "{tcp}");
    wait_no_domains(bed).await;
    let local = run_local(&bench_job("local-bench", None), &[]);
    let rings = &local["allReduce"];
    assert!(
        rings["sharedMemoryPeers"].as_u64().unwrap_or_default() > 0,
        "local mode's ranks share memory: {rings}"
    );
    let (domain, tcp, rings) = (
        all_reduce_bench::busbw_by_size(&domain, &SIZES, "domain"),
        all_reduce_bench::busbw_by_size(&tcp, &SIZES, "pod TCP"),
        all_reduce_bench::busbw_by_size(rings, &SIZES, "local rings"),
    );
    let largest = SIZES[SIZES.len() - 1];
    out.insert(
        "shm_domain_vs_local_rings_16mib".into(),
        json!(
            domain[largest].as_f64().unwrap_or_default() / rings[largest].as_f64().unwrap_or(1.0)
        ),
    );
    out.insert("shm_domain_busbw_gbps".into(), domain.into());
    out.insert("pod_tcp_busbw_gbps".into(), tcp.into());
    out.insert("local_rings_busbw_gbps".into(), rings.into());

    isolation(bed, shell).await;
    out.insert("foreign_pod_access_refused".into(), json!(true));
    out
}

/// The all-reduce benchmark with `RANKS` one-tile ranks through DRA, its data path `RDU_DATA_PATH` if given.
fn bench_job(name: &str, data_path: Option<&str>) -> Value {
    let mut job = all_reduce_bench::dra_job(name, RANKS, &SIZES);
    if let Some(path) = data_path {
        job["spec"]["template"] = json!({"spec": {"containers": [{
            "name": "worker", "env": [{"name": rdu_crds::consts::env::DATA_PATH, "value": path}]}]}});
    }
    job
}

/// Runs the benchmark in pods on the node; rank 0's `allReduce` result, every value checked.
async fn bench_in_pods(bed: &Testbed, name: &str, data_path: Option<&str>) -> Value {
    let done = all_reduce_bench::run_in_pods(bed, &bench_job(name, data_path), 1, LONG).await;
    all_reduce_bench::result_of(&done)
}

/// The domains on the node.
fn domains(bed: &Testbed) -> Vec<String> {
    bed.node_exec(NODE, &["ls", "-1", DOMAINS])
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

async fn wait_no_domains(bed: &Testbed) {
    bed.wait(
        "no shared-memory domain left",
        LONG,
        async || match domains(bed) {
            left if left.is_empty() => Ok(()),
            left => Err(format!("domains {left:?}")),
        },
    )
    .await;
}

/// A claim template in `namespace` for one tile, whose driver config names job `job`'s domain (as the operator's
/// templates do, `rdu_crds::shm_domain::DomainConfig`).
fn template(namespace: &str, job: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": format!("shm-{job}"), "namespace": namespace},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "tiles", "exactly": {"deviceClassName": "rdu.dev", "count": 1}}],
            "config": [{"requests": ["tiles"], "opaque": {"driver": "rdu.dev",
                "parameters": rdu_crds::shm_domain::DomainConfig::for_job(job)}}]}}}
    })
}

/// Pod `name` in `namespace` with a claim from job `job`'s template, running `script` in Perl as uid [`UID`].
fn shell_pod(name: &str, namespace: &str, job: &str, image: &str, script: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "shm-e2e"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsUser": UID, "runAsGroup": UID},
            "tolerations": [{"key": "rdu.dev/tile", "operator": "Exists", "effect": "NoSchedule"}],
            "resourceClaims": [{"name": "tiles", "resourceClaimTemplateName": format!("shm-{job}")}],
            "containers": [{
                "name": "main", "image": image, "imagePullPolicy": "Never",
                "command": ["perl", "-MIO::Socket::UNIX", "-e", script],
                "resources": {"claims": [{"name": "tiles"}]},
            }],
        },
    })
}

/// Serves `<domain>/a.sock`, answering every connection with `hello`.
const SERVE: &str = r#"$| = 1; my $p = "$ENV{RDU_SHM_DOMAIN}/a.sock";
my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Local => $p, Listen => 5) or die "bind $p: $!";
print "listening $p\n";
while (my $c = $s->accept) { print $c "hello\n"; close $c }"#;

/// Connects to `<domain>/a.sock` (retrying for a minute) and prints what it read.
const CONNECT: &str = r#"$| = 1; my $p = "$ENV{RDU_SHM_DOMAIN}/a.sock";
for (1 .. 600) {
  my $c = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => $p);
  if ($c) { my $l = <$c>; print "connected $p: $l"; sleep 3600; exit }
  select(undef, undef, undef, 0.1);
}
print "never connected $p: $!\n"; sleep 3600"#;

/// Tries job A's socket in its own domain and at the node's path, and the node's directory; prints each outcome.
fn probe(job_a_domain: &str) -> String {
    format!(
        r#"$| = 1; my $own = "$ENV{{RDU_SHM_DOMAIN}}";
for my $p ("$own/a.sock", "{DOMAINS}/{job_a_domain}/a.sock") {{
  my $c = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => $p);
  print $c ? "OPENED $p\n" : "refused $p: $!\n";
}}
for my $d ("{DOMAINS}/{job_a_domain}", "{DOMAINS}") {{
  print opendir(my $h, $d) ? "OPENED $d\n" : "refused $d: $!\n";
}}
opendir(my $h, $own) or die "own domain $own: $!";
print "own domain holds: ", join(",", grep {{ !/^\./ }} readdir $h), "\n";
print "probed\n"; sleep 3600"#
    )
}

/// Pods of job A share its domain; a pod of job B and a pod of another namespace naming job A cannot reach it.
async fn isolation(bed: &Testbed, shell: &str) {
    let (job_a, job_b) = ("e2e-job-a", "e2e-job-b");
    let domain_a = format!("default_{job_a}");
    bed.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OTHER_NAMESPACE}})
            .to_string(),
    );
    for (namespace, job) in [
        ("default", job_a),
        ("default", job_b),
        (OTHER_NAMESPACE, job_a),
    ] {
        bed.apply(&template(namespace, job).to_string());
    }
    bed.apply(&shell_pod("shm-a-server", "default", job_a, shell, SERVE).to_string());
    wait_log(bed, "default", "shm-a-server", "listening").await;
    bed.apply(&shell_pod("shm-a-peer", "default", job_a, shell, CONNECT).to_string());
    let peer = wait_log(bed, "default", "shm-a-peer", "connected").await;
    assert!(
        peer.contains(&format!("connected {MOUNT}/a.sock: hello")),
        "a pod of the same job reaches the socket: {peer}"
    );
    let probe = probe(&domain_a);
    bed.apply(&shell_pod("shm-b", "default", job_b, shell, &probe).to_string());
    bed.apply(&shell_pod("shm-x", OTHER_NAMESPACE, job_a, shell, &probe).to_string());
    for (namespace, pod) in [("default", "shm-b"), (OTHER_NAMESPACE, "shm-x")] {
        let log = wait_log(bed, namespace, pod, "probed").await;
        assert!(
            !log.contains("OPENED"),
            "{namespace}/{pod} reached job A's domain: {log}"
        );
        for path in [
            format!("{MOUNT}/a.sock"),
            format!("{DOMAINS}/{domain_a}/a.sock"),
            format!("{DOMAINS}/{domain_a}"),
        ] {
            assert!(
                log.contains(&format!("refused {path}: No such file or directory")),
                "{namespace}/{pod}: {path}: {log}"
            );
        }
        assert!(
            log.contains("own domain holds: \n"),
            "{namespace}/{pod}: {log}"
        );
    }
    let mut on_node = domains(bed);
    on_node.sort();
    assert_eq!(
        on_node,
        [
            domain_a.clone(),
            format!("default_{job_b}"),
            format!("{OTHER_NAMESPACE}_{job_a}")
        ],
        "a domain per namespace and job"
    );
    let sockets = bed
        .node_exec(NODE, &["ls", "-1", &format!("{DOMAINS}/{domain_a}")])
        .expect("job A's domain");
    assert_eq!(sockets.trim(), "a.sock", "job A's domain holds its socket");

    bed.kubectl(&[
        "delete",
        "pods",
        "-n",
        "default",
        "-l",
        "app=shm-e2e",
        "--wait=true",
    ]);
    bed.kubectl(&["delete", "namespace", OTHER_NAMESPACE, "--wait=true"]);
    bed.kubectl(&[
        "delete",
        "resourceclaimtemplates",
        "-n",
        "default",
        &format!("shm-{job_a}"),
        &format!("shm-{job_b}"),
    ]);
    wait_no_domains(bed).await;
}

/// Pod `name`'s log once it has a line containing `marker`.
async fn wait_log(bed: &Testbed, namespace: &str, name: &str, marker: &str) -> String {
    bed.wait(
        &format!("{namespace}/{name} logs {marker:?}"),
        LONG,
        async || {
            let log = bed.logs_in(namespace, name).await?;
            if log.contains(marker) {
                Ok(log)
            } else {
                Err(format!("log {log:?}"))
            }
        },
    )
    .await
}
