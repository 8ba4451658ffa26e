//! Dynamic Resource Allocation on a real kubelet and containerd 2 (issue 37), on `node.rs`'s one-node cluster after its
//! other stages: `helm upgrade --set devicePlugin.kubeletApi=dra` swaps the device plugin for the DRA plugin, which
//! registers with the kubelet and publishes every tile; pods whose claims come from `examples/dra/claim-templates.yaml`
//! get exactly their claim's tiles in `SF_RNT_TILE_AFFINITY` and `RDU_VISIBLE_TILES` (through CDI); claims pack (four
//! 2-tile claims fill two RDUs, a 3-tile claim never spans two); prepared claims survive a restart of the plugin and
//! are unprepared by the new one; the slices come back after a kubelet restart; no CDI spec is left behind;
//! `examples/digits-dra.yaml` trains with each rank's tiles claimed through the operator's claim template; then
//! `shm_domain.rs`'s jobs share memory on the node. Its summary is `node.rs`'s third JSON line (`{"bench":"dra",…}`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use rdu_e2e::logs::field_of;
use rdu_e2e::testbed::{SYSTEM_NAMESPACE, Testbed};
use rdu_e2e::workspace_root;
use rdu_tiles::affinity::affinity_mask;
use rdu_tiles::topology::{ResourceMode, Topology};
use serde_json::{Value, json};

const RDUS: u32 = 2;
const TILES_PER_RDU: u32 = 4;
const NODE: u8 = 1;
const SHORT: Duration = Duration::from_secs(90);
const LONG: Duration = Duration::from_secs(300);
const CDI_DIR: &str = "/var/run/cdi";
/// Made by this test beside the examples' templates: three tiles on one RDU.
const THREE_TILES: &str = r#"{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
  "metadata": {"name": "rdu-three-tiles-one-rdu", "namespace": "default"},
  "spec": {"spec": {"devices": {
    "requests": [{"name": "tiles", "exactly": {"deviceClassName": "rdu.dev", "count": 3}}],
    "constraints": [{"requests": ["tiles"], "matchAttribute": "rdu.dev/rdu"}]}}}}"#;

/// The DRA stages on the node's cluster; their summary.
pub(crate) async fn run(bed: &Testbed) -> serde_json::Map<String, Value> {
    let topology = Topology::new(RDUS, TILES_PER_RDU).expect("topology");
    let node = bed.node(NODE).name.clone();
    let mut summary = serde_json::Map::new();
    summary.insert("bench".into(), json!("dra"));

    let upgraded = Instant::now();
    bed.helm_upgrade(&[
        "devicePlugin.kubeletApi=dra".into(),
        format!("devicePlugin.rdusPerNode={RDUS}"),
        format!("devicePlugin.tilesPerRdu={TILES_PER_RDU}"),
    ]);
    let devices = wait_slices(bed, &node, "after helm upgrade").await;
    let expected: Vec<String> = (0..topology.total_tiles())
        .map(|t| topology.tile_id(t))
        .collect();
    assert_eq!(devices, expected, "one device per tile, in tile order");
    summary.insert("tiles_published".into(), json!(devices.len()));
    summary.insert(
        "helm_upgrade_to_slices_seconds".into(),
        json!(upgraded.elapsed().as_secs_f64()),
    );
    bed.wait(
        "the device plugin's DaemonSet gone",
        SHORT,
        async || match bed
            .pods(
                SYSTEM_NAMESPACE,
                "app.kubernetes.io/component=device-plugin",
            )
            .await?
        {
            pods if pods.is_empty() => Ok(()),
            pods => Err(format!("{} device plugin pods left", pods.len())),
        },
    )
    .await;

    let templates = workspace_root().join("examples/dra/claim-templates.yaml");
    bed.kubectl(&[
        "apply",
        "-n",
        "default",
        "-f",
        &templates.display().to_string(),
    ]);
    bed.apply(THREE_TILES);
    let shell = bed.shell_image(NODE);

    // A whole RDU.
    let created = Instant::now();
    create_pod(bed, "dra-whole", "rdu-whole-rdu", &shell);
    let whole = wait_tiles(bed, "dra-whole", &topology).await;
    summary.insert(
        "claim_to_running_seconds".into(),
        json!(created.elapsed().as_secs_f64()),
    );
    assert_eq!(whole.len(), TILES_PER_RDU as usize, "{whole:?}");
    let whole_rdu = one_rdu(&whole);

    // Two tiles on one RDU, twice: the other RDU. A third finds no RDU with two free tiles.
    let mut pairs = Vec::new();
    for name in ["dra-pair-1", "dra-pair-2"] {
        create_pod(bed, name, "rdu-two-tiles-one-rdu", &shell);
        let tiles = wait_tiles(bed, name, &topology).await;
        assert_eq!(tiles.len(), 2, "{name}: {tiles:?}");
        assert_ne!(one_rdu(&tiles), whole_rdu, "{name} shares the whole RDU");
        pairs.push((name, tiles));
    }
    create_pod(bed, "dra-pair-3", "rdu-two-tiles-one-rdu", &shell);
    wait_unschedulable(bed, "dra-pair-3").await;
    delete_pod(bed, "dra-whole").await;
    create_pod(bed, "dra-pair-4", "rdu-two-tiles-one-rdu", &shell);
    for name in ["dra-pair-3", "dra-pair-4"] {
        let tiles = wait_tiles(bed, name, &topology).await;
        assert_eq!(tiles.len(), 2, "{name}: {tiles:?}");
        one_rdu(&tiles);
        pairs.push((name, tiles));
    }
    let held: BTreeSet<u32> = pairs.iter().flat_map(|(_, t)| t.iter().copied()).collect();
    assert_eq!(
        held.len(),
        topology.total_tiles() as usize,
        "four 2-tile claims fill both RDUs: {pairs:?}"
    );
    summary.insert("two_tile_claims_packed".into(), json!(pairs.len()));

    // Free one pair on each RDU: four free tiles, two per RDU, and a 3-tile claim must not take them.
    let on_rdu = |rdu: u32| -> Vec<&str> {
        pairs
            .iter()
            .filter(|(_, t)| one_rdu(t) == rdu)
            .map(|(n, _)| *n)
            .collect()
    };
    let (rdu0, rdu1) = (on_rdu(0), on_rdu(1));
    delete_pod(bed, rdu0[0]).await;
    delete_pod(bed, rdu1[0]).await;
    create_pod(bed, "dra-three", "rdu-three-tiles-one-rdu", &shell);
    wait_unschedulable(bed, "dra-three").await;
    delete_pod(bed, rdu0[1]).await;
    let three = wait_tiles(bed, "dra-three", &topology).await;
    assert_eq!(three.len(), 3, "{three:?}");
    assert_eq!(
        one_rdu(&three),
        0,
        "the 3-tile claim on the RDU with four free tiles"
    );

    // The plugin restarts: the prepared claim stays (checkpoint), the new plugin unprepares it and prepares more.
    let three_claim = claim_uid(bed, "dra-three").await;
    assert!(
        cdi_specs(bed).contains(&three_claim),
        "dra-three's CDI spec"
    );
    let restarted = Instant::now();
    restart_plugin(bed).await;
    delete_pod(bed, "dra-three").await;
    bed.wait(
        "dra-three's claim unprepared",
        SHORT,
        async || match cdi_specs(bed) {
            specs if specs.contains(&three_claim) => Err(format!("specs {specs:?}")),
            _ => Ok(()),
        },
    )
    .await;
    create_pod(bed, "dra-after-restart", "rdu-two-tiles-one-rdu", &shell);
    let tiles = wait_tiles(bed, "dra-after-restart", &topology).await;
    one_rdu(&tiles);
    summary.insert(
        "plugin_restart_to_prepared_seconds".into(),
        json!(restarted.elapsed().as_secs_f64()),
    );

    // The kubelet restarts: it deletes the node's slices as it starts; the plugin, registered again, publishes
    // them again, and a new claim is allocated from them.
    let before = SystemTime::now();
    let kubelet = Instant::now();
    bed.restart_kubelet(NODE);
    bed.wait_lease_renewed_after(&node, before, LONG).await;
    let devices = wait_slices(bed, &node, "after a kubelet restart").await;
    assert_eq!(devices, expected);
    summary.insert(
        "kubelet_restart_to_slices_seconds".into(),
        json!(kubelet.elapsed().as_secs_f64()),
    );
    create_pod(bed, "dra-after-kubelet", "rdu-two-tiles-one-rdu", &shell);
    wait_tiles(bed, "dra-after-kubelet", &topology).await;

    // Every pod gone: every claim unprepared, no CDI spec left.
    let left: Vec<String> = bed
        .pods("default", "app=dra-e2e")
        .await
        .expect("pods")
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    for name in &left {
        delete_pod(bed, name).await;
    }
    bed.wait("every claim unprepared", SHORT, async || {
        match cdi_specs(bed) {
            specs if specs.is_empty() => Ok(()),
            specs => Err(format!("CDI specs left: {specs:?}")),
        }
    })
    .await;
    summary.insert("cdi_specs_left".into(), json!(0));

    digits_through_dra(bed, &topology, &mut summary).await;
    summary.extend(super::shm_domain::run(bed, &shell).await);
    summary
}

/// `examples/digits-dra.yaml` as a user applies it: the operator makes the job's ResourceClaimTemplate (two tiles on
/// one RDU), each rank's pod gets a claim of its own from it and trains with two tiles of one RDU, no tile shared;
/// deleting the job leaves no claim, CDI spec or template.
async fn digits_through_dra(
    bed: &Testbed,
    topology: &Topology,
    summary: &mut serde_json::Map<String, Value>,
) {
    const JOB: &str = "digits-dra";
    let yaml = std::fs::read_to_string(workspace_root().join("examples/digits-dra.yaml"))
        .expect("examples/digits-dra.yaml");
    let applied = Instant::now();
    bed.apply(&yaml);
    let job = bed.wait_phase(JOB, "Succeeded", LONG).await;
    summary.insert(
        "digits_dra_apply_to_succeeded_seconds".into(),
        json!(applied.elapsed().as_secs_f64()),
    );
    let accuracy = job["status"]["result"]["testAccuracy"]
        .as_f64()
        .unwrap_or_else(|| panic!("no status.result.testAccuracy: {}", job["status"]));
    assert!(accuracy > 0.8, "test accuracy {accuracy}");
    summary.insert("digits_dra_test_accuracy".into(), json!(accuracy));

    let templates: Api<ResourceClaimTemplate> = Api::namespaced(bed.client.clone(), "default");
    let by_job = ListParams::default().labels(&format!("rdu.dev/job-name={JOB}"));
    let made = templates
        .list(&by_job)
        .await
        .expect("claim templates")
        .items;
    assert_eq!(made.len(), 1, "one template for the job's one ask");
    let owner = made[0]
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert!(
        owner.iter().any(|o| o.kind == "RduJob" && o.name == JOB),
        "{owner:?}"
    );
    let devices = serde_json::to_value(&made[0].spec.spec.devices).expect("json");
    assert_eq!(devices["requests"][0]["exactly"]["count"], 2, "{devices}");
    assert_eq!(
        devices["constraints"][0]["matchAttribute"], "rdu.dev/rdu",
        "{devices}"
    );

    // Kubernetes deletes a pod's generated claim once the pod has finished, so each rank's tiles are read from
    // what its claim's CDI spec gave it (its log's RDU_VISIBLE_TILES and SF_RNT_TILE_AFFINITY); that the CDI
    // spec gives exactly the claim's allocation is checked above with pods that keep running.
    let mut held = BTreeSet::new();
    let workers = job["spec"]["workers"].as_u64().expect("workers");
    for rank in 0..workers {
        let pod = format!("{JOB}-worker-{rank}");
        let statuses =
            bed.pod(&pod).await.expect("rank pod")["status"]["resourceClaimStatuses"].clone();
        assert!(
            statuses.as_array().is_some_and(|s| s
                .iter()
                .any(|c| c["name"] == "rdu-tiles" && c["resourceClaimName"].is_string())),
            "{pod}: no claim made for rdu-tiles: {statuses}"
        );
        let log = bed.logs_in("default", &pod).await.expect("rank log");
        let visible = list_field(&log, "visible_tiles")
            .unwrap_or_else(|| panic!("{pod}: no visible_tiles\n{log}"));
        let mut tiles: Vec<u32> = visible
            .split(',')
            .map(|id| {
                topology
                    .parse_device(ResourceMode::Tile, id)
                    .unwrap_or_else(|e| panic!("{pod}: tile {id:?}: {e}"))[0]
            })
            .collect();
        tiles.sort_unstable();
        assert_eq!(tiles.len(), 2, "{pod}: {tiles:?}");
        one_rdu(&tiles);
        let affinity = field_of(&log, "tile_affinity")
            .unwrap_or_else(|| panic!("{pod}: no tile_affinity\n{log}"));
        assert_eq!(
            affinity,
            affinity_mask(topology, &tiles),
            "{pod}: SF_RNT_TILE_AFFINITY against its tiles {tiles:?}"
        );
        held.extend(tiles);
    }
    assert_eq!(
        held.len() as u64,
        2 * workers,
        "ranks share tiles: {held:?}"
    );

    bed.kubectl(&["delete", "rdujob", JOB, "-n", "default", "--wait=true"]);
    let claims: Api<ResourceClaim> = Api::namespaced(bed.client.clone(), "default");
    bed.wait(
        "the job's claims, CDI specs and template gone",
        LONG,
        async || {
            let left = claims
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            let made = templates
                .list(&by_job)
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            match (left, made, cdi_specs(bed)) {
                (0, 0, specs) if specs.is_empty() => Ok(()),
                (left, made, specs) => Err(format!(
                    "{left} claims, {made} templates, CDI specs {specs:?}"
                )),
            }
        },
    )
    .await;
}

/// The device names of `node`'s ResourceSlices of driver rdu.dev, once every slice of its pool is there.
async fn wait_slices(bed: &Testbed, node: &str, when: &str) -> Vec<String> {
    let slices: Api<ResourceSlice> = Api::all(bed.client.clone());
    let selector = rdu_dra::publish::own_slices_selector(node);
    bed.wait(
        &format!("{node}'s ResourceSlices {when}"),
        LONG,
        async || {
            let list = slices
                .list(&ListParams::default().fields(&selector))
                .await
                .map_err(|e| e.to_string())?;
            let Some(first) = list.items.first() else {
                return Err("no slice".into());
            };
            let count = usize::try_from(first.spec.pool.resource_slice_count).unwrap_or(0);
            if list.items.len() != count {
                return Err(format!("{} of {count} slices", list.items.len()));
            }
            Ok(list
                .items
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
                .collect())
        },
    )
    .await
}

/// Pod `name` in `default` with a claim from `template`, printing the tiles it was given and then waiting.
fn create_pod(bed: &Testbed, name: &str, template: &str, image: &str) {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "dra-e2e"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"key": "rdu.dev/tile", "operator": "Exists", "effect": "NoSchedule"}],
            "resourceClaims": [{"name": "tiles", "resourceClaimTemplateName": template}],
            "containers": [{
                "name": "main", "image": image, "imagePullPolicy": "Never",
                "command": ["sh", "-c",
                    "echo \"tiles=$RDU_VISIBLE_TILES affinity=$SF_RNT_TILE_AFFINITY\"; exec sleep 3600"],
                "resources": {"claims": [{"name": "tiles"}]},
            }],
        },
    });
    bed.apply(&pod.to_string());
}

/// The tiles pod `name` was given, once it runs and printed them: those of its claim's allocation, in its env as
/// `RDU_VISIBLE_TILES` and as the `SF_RNT_TILE_AFFINITY` mask.
async fn wait_tiles(bed: &Testbed, name: &str, topology: &Topology) -> Vec<u32> {
    let line = bed
        .wait(
            &format!("{name} running with its tiles"),
            LONG,
            async || {
                let pod = bed.pod(name).await?;
                if pod["status"]["phase"] != "Running" {
                    return Err(format!("phase {}", pod["status"]["phase"]));
                }
                let log = bed.logs_in("default", name).await?;
                log.lines()
                    .find(|l| l.starts_with("tiles="))
                    .map(str::to_string)
                    .ok_or_else(|| format!("log {log:?}"))
            },
        )
        .await;
    let (visible, affinity) = line
        .strip_prefix("tiles=")
        .and_then(|l| l.split_once(" affinity="))
        .unwrap_or_else(|| panic!("{name}: {line}"));
    let tiles: Vec<u32> = visible
        .split(',')
        .map(|id| {
            let parsed = topology
                .parse_device(ResourceMode::Tile, id)
                .unwrap_or_else(|e| panic!("{name}: tile {id:?}: {e}"));
            parsed[0]
        })
        .collect();
    assert_eq!(affinity, affinity_mask(topology, &tiles), "{name}: {line}");
    let mut allocated: Vec<String> = allocated_devices(bed, name).await;
    allocated.sort_by_key(|id| {
        topology
            .parse_device(ResourceMode::Tile, id)
            .map(|t| t[0])
            .ok()
    });
    assert_eq!(
        visible.split(',').collect::<Vec<_>>(),
        allocated,
        "{name}: the env names the claim's devices"
    );
    tiles
}

/// The comma-separated `key=a,b,c` of the last tracing line that has it (`field_of` stops at a comma).
fn list_field(log: &str, key: &str) -> Option<String> {
    let needle = format!(" {key}=");
    let at = log.rfind(&needle)? + needle.len();
    let value = log[at..].split(char::is_whitespace).next()?;
    Some(value.trim_matches('"').to_string())
}

/// The ResourceClaim made for pod `name`'s claim `tiles`.
async fn claim_of(bed: &Testbed, name: &str) -> ResourceClaim {
    let pod: Pod = Api::<Pod>::namespaced(bed.client.clone(), "default")
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("pod {name}: {e}"));
    let claim = pod
        .status
        .and_then(|s| s.resource_claim_statuses)
        .and_then(|c| c.into_iter().find(|c| c.name == "tiles"))
        .and_then(|c| c.resource_claim_name)
        .unwrap_or_else(|| panic!("pod {name} names no claim"));
    Api::<ResourceClaim>::namespaced(bed.client.clone(), "default")
        .get(&claim)
        .await
        .unwrap_or_else(|e| panic!("claim {claim}: {e}"))
}

async fn allocated_devices(bed: &Testbed, name: &str) -> Vec<String> {
    claim_of(bed, name)
        .await
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.device)
        .collect()
}

async fn claim_uid(bed: &Testbed, name: &str) -> String {
    claim_of(bed, name)
        .await
        .metadata
        .uid
        .expect("a claim's uid")
}

/// The RDU every tile is on.
fn one_rdu(tiles: &[u32]) -> u32 {
    let rdus: BTreeSet<u32> = tiles.iter().map(|t| t / TILES_PER_RDU).collect();
    assert_eq!(rdus.len(), 1, "tiles {tiles:?} span RDUs {rdus:?}");
    rdus.into_iter().next().unwrap_or_default()
}

/// Waits until the scheduler reports pod `name` unschedulable (no allocation of its claim fits).
async fn wait_unschedulable(bed: &Testbed, name: &str) {
    bed.wait(&format!("{name} unschedulable"), SHORT, async || {
        let pod = bed.pod(name).await?;
        let conditions = pod["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let unschedulable = conditions
            .iter()
            .any(|c| c["type"] == "PodScheduled" && c["reason"] == "Unschedulable");
        if unschedulable && pod["spec"]["nodeName"].is_null() {
            Ok(())
        } else {
            Err(format!("conditions {conditions:?}"))
        }
    })
    .await;
}

async fn delete_pod(bed: &Testbed, name: &str) {
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), "default");
    pods.delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete pod {name}: {e}"));
    bed.wait(&format!("{name} gone"), SHORT, async || {
        match pods.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".into()),
        }
    })
    .await;
}

/// The claim UIDs whose CDI spec is on the node.
fn cdi_specs(bed: &Testbed) -> Vec<String> {
    let listing = bed
        .node_exec(NODE, &["ls", "-1", CDI_DIR])
        .unwrap_or_default();
    listing
        .lines()
        .filter_map(|f| f.strip_prefix("rdu.dev-")?.strip_suffix(".json"))
        .map(str::to_string)
        .collect()
}

/// Deletes the DRA plugin's pod and waits until its replacement is registered (it logs so).
async fn restart_plugin(bed: &Testbed) {
    let selector = "app.kubernetes.io/component=dra-plugin";
    let old: Vec<String> = bed
        .pods(SYSTEM_NAMESPACE, selector)
        .await
        .expect("the DRA plugin's pods")
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(old.len(), 1, "{old:?}");
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), SYSTEM_NAMESPACE);
    pods.delete(&old[0], &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {}: {e}", old[0]));
    bed.wait("the DRA plugin registered again", LONG, async || {
        let pods = bed.pods(SYSTEM_NAMESPACE, selector).await?;
        let new = pods
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .find(|n| *n != old[0])
            .ok_or("no new plugin pod")?;
        let log = bed.logs_in(SYSTEM_NAMESPACE, &new).await?;
        if log.contains("registered with the kubelet") {
            Ok(())
        } else {
            Err(format!("{new}: {log}"))
        }
    })
    .await;
}

#[test]
fn a_list_field_is_read_whole() {
    let line = "INFO worker{rank=1}: training starts tile_affinity=0x3 visible_tiles=rdu0-tile0,rdu0-tile1 samples=4";
    assert_eq!(
        list_field(line, "visible_tiles").as_deref(),
        Some("rdu0-tile0,rdu0-tile1")
    );
    assert_eq!(list_field(line, "missing"), None);
}
