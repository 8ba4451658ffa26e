//! Four ranks on two nodes, two on each (issue 37, item 5), after the bandwidth test on the same cluster: the chart
//! switched to the DRA plugin (`helm upgrade --set devicePlugin.kubeletApi=dra`), the hierarchical all-reduce over
//! each node's shared-memory domain and TCP between the node leaders, the same job on TCP alone
//! (`RDU_DATA_PATH=tcp`), and a raw TCP stream between pods on the two nodes as the network's own ceiling; then
//! the device plugin back, every node offering its tiles again, for the fault stages after.

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::ListParams;
use rdu_e2e::all_reduce_bench;
use rdu_e2e::testbed::Testbed;
use rdu_e2e::three_nodes::{LONG, TILES_PER_NODE};
use serde_json::{Value, json};

const SIZES: [&str; 3] = ["64Ki", "1Mi", "16Mi"];
const RANKS: u32 = 4;
/// Bytes the stream sends.
const STREAM_BYTES: u64 = 1 << 30;
const STREAM_PORT: u16 = 5201;

/// The two-node measurements' summary keys (`nodes`, `ranks` and the busbw and stream figures).
pub(crate) async fn two_nodes_with_domains(bed: &Testbed) -> serde_json::Map<String, Value> {
    let nodes = [bed.node(1).name.clone(), bed.node(2).name.clone()];
    bed.helm_upgrade(&["devicePlugin.kubeletApi=dra".into()]);
    for node in &nodes {
        wait_slices(bed, node).await;
    }
    let hierarchical = bench(bed, "twonode-domains", &nodes, None).await;
    assert!(
        hierarchical["sharedMemoryPeers"]
            .as_u64()
            .unwrap_or_default()
            > 0,
        "two ranks on each node share memory through their domain: {hierarchical}"
    );
    let tcp = bench(bed, "twonode-tcp", &nodes, Some("tcp")).await;
    assert_eq!(tcp["sharedMemoryPeers"], 0, "{tcp}");
    let stream = stream_between(bed, &nodes).await;

    bed.helm_upgrade(&["devicePlugin.kubeletApi=devicePlugin".into()]);
    for node in &bed.nodes {
        bed.wait_tiles(
            &node.name,
            TILES_PER_NODE,
            "with the device plugin back",
            LONG,
        )
        .await;
    }
    let mut out = serde_json::Map::new();
    out.insert("nodes".into(), json!(nodes.len()));
    out.insert("ranks".into(), json!(RANKS));
    out.insert(
        "two_nodes_hierarchical_busbw_gbps".into(),
        all_reduce_bench::busbw_by_size(&hierarchical, &SIZES, "domains").into(),
    );
    out.insert(
        "two_nodes_tcp_only_busbw_gbps".into(),
        all_reduce_bench::busbw_by_size(&tcp, &SIZES, "TCP only").into(),
    );
    out.insert("pod_to_pod_stream_gbps".into(), json!(stream));
    out
}

/// Waits until `node` publishes a device per tile.
async fn wait_slices(bed: &Testbed, node: &str) {
    let slices: Api<ResourceSlice> = Api::all(bed.client.clone());
    let selector = rdu_dra::publish::own_slices_selector(node);
    bed.wait(&format!("{node}'s ResourceSlices"), LONG, async || {
        let devices: usize = slices
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .sum();
        if devices == TILES_PER_NODE as usize {
            Ok(())
        } else {
            Err(format!("{devices} devices"))
        }
    })
    .await;
}

/// The benchmark with two ranks on each of `nodes` through DRA, hierarchical; rank 0's result, checked.
async fn bench(bed: &Testbed, name: &str, nodes: &[String; 2], data_path: Option<&str>) -> Value {
    let mut job = all_reduce_bench::dra_job(name, RANKS, &SIZES);
    job["spec"]["dataParallel"]["algorithm"] = json!("hierarchical");
    let env: Vec<Value> = data_path
        .map(|p| json!({"name": rdu_crds::consts::env::DATA_PATH, "value": p}))
        .into_iter()
        .collect();
    job["spec"]["template"] = json!({"spec": {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
            "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}}},
        "topologySpreadConstraints": [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"rdu.dev/job-name": name}}}],
        "containers": [{"name": "worker", "env": env}],
    }});
    let done = all_reduce_bench::run_in_pods(bed, &job, 2, LONG).await;
    all_reduce_bench::result_of(&done)
}

/// A pod on `node` running the Perl `script`.
fn perl_pod(name: &str, node: &str, image: &str, script: &str, env: &[(&str, &str)]) -> Value {
    let env: Vec<Value> = env
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "stream-e2e"}},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsUser": 65532, "runAsGroup": 65532},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "main", "image": image, "imagePullPolicy": "Never",
                "command": ["perl", "-MIO::Socket::INET", "-MTime::HiRes=time", "-e", script],
                "env": env,
            }],
        },
    })
}

/// Reads everything the client sends, then answers `done`.
const RECEIVE: &str = r#"$| = 1;
my $s = IO::Socket::INET->new(LocalPort => $ENV{PORT}, Listen => 1, ReuseAddr => 1) or die "listen: $!";
print "listening\n";
my $c = $s->accept or die "accept: $!"; my ($buf, $n) = ('', 0);
while (my $r = sysread($c, $buf, 4 << 20)) { $n += $r }
print $c "done\n"; close $c; print "received $n\n"; sleep 3600"#;

/// Sends `BYTES` to `SERVER` in 4 MiB writes and waits for its `done`; prints the rate.
const SEND: &str = r#"$| = 1; my $c;
for (1 .. 600) { $c = IO::Socket::INET->new(PeerAddr => "$ENV{SERVER}:$ENV{PORT}") and last; select(undef, undef, undef, 0.1) }
$c or die "connect: $!";
my $buf = "x" x (4 << 20); my ($sent, $t0) = (0, time);
while ($sent < $ENV{BYTES}) { my $w = syswrite($c, $buf) // die "write: $!"; $sent += $w }
shutdown($c, 1); my $ack = <$c>; my $dt = time - $t0;
printf "stream bytes=%d seconds=%.4f ack=%s", $sent, $dt, $ack; sleep 3600"#;

/// GB/s of one TCP stream from a pod on `nodes[0]` to a pod on `nodes[1]`.
async fn stream_between(bed: &Testbed, nodes: &[String; 2]) -> f64 {
    let image = bed.shell_image(1);
    let port = STREAM_PORT.to_string();
    bed.apply(
        &perl_pod(
            "stream-receiver",
            &nodes[1],
            &image,
            RECEIVE,
            &[("PORT", &port)],
        )
        .to_string(),
    );
    let ip = bed
        .wait("the receiver listening", LONG, async || {
            let pod = bed.pod("stream-receiver").await?;
            let log = bed.logs_in("default", "stream-receiver").await?;
            match pod["status"]["podIP"].as_str() {
                Some(ip) if log.contains("listening") => Ok(ip.to_string()),
                _ => Err(format!("{log:?}")),
            }
        })
        .await;
    let bytes = STREAM_BYTES.to_string();
    let env = [
        ("SERVER", ip.as_str()),
        ("PORT", port.as_str()),
        ("BYTES", bytes.as_str()),
    ];
    bed.apply(&perl_pod("stream-sender", &nodes[0], &image, SEND, &env).to_string());
    let line = bed
        .wait("the stream sent", LONG, async || {
            let log = bed.logs_in("default", "stream-sender").await?;
            log.lines()
                .find(|l| l.starts_with("stream "))
                .map(str::to_string)
                .ok_or_else(|| format!("{log:?}"))
        })
        .await;
    bed.kubectl(&[
        "delete",
        "pods",
        "-n",
        "default",
        "-l",
        "app=stream-e2e",
        "--wait=true",
    ]);
    let field = |key: &str| -> f64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line:?}"))
    };
    assert!(
        line.contains("ack=done"),
        "the receiver read every byte: {line}"
    );
    assert_eq!(field("bytes") as u64, STREAM_BYTES, "{line}");
    field("bytes") / field("seconds") / 1e9
}
