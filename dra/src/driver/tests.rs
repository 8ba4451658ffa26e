//! Unit tests of the DRAPlugin service against a fake ClaimSource.

use super::*;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use std::sync::Mutex as StdMutex;

/// ResourceClaims by `namespace/name`, counting the gets.
#[derive(Default)]
struct FakeClaims {
    claims: StdMutex<BTreeMap<String, ResourceClaim>>,
    gets: StdMutex<usize>,
}

impl FakeClaims {
    fn put(&self, claim: ResourceClaim) {
        let meta = &claim.metadata;
        let key = format!(
            "{}/{}",
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default()
        );
        self.claims.lock().unwrap().insert(key, claim);
    }
    fn gets(&self) -> usize {
        *self.gets.lock().unwrap()
    }
}

#[tonic::async_trait]
impl ClaimSource for FakeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, SourceError> {
        *self.gets.lock().unwrap() += 1;
        self.claims
            .lock()
            .unwrap()
            .get(&format!("{namespace}/{name}"))
            .cloned()
            .ok_or_else(|| format!("resourceclaims \"{name}\" not found").into())
    }
}

fn result(driver: &str, pool: &str, device: &str) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        driver: driver.into(),
        pool: pool.into(),
        device: device.into(),
        request: "tiles".into(),
        ..Default::default()
    }
}

fn claim_object(
    name: &str,
    uid: &str,
    results: Vec<DeviceRequestAllocationResult>,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn claim(name: &str, uid: &str) -> Claim {
    Claim {
        namespace: "ns".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

struct Setup {
    dir: tempfile::TempDir,
    claims: Arc<FakeClaims>,
    driver: Driver,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let claims = Arc::new(FakeClaims::default());
    let driver = new_driver(dir.path(), claims.clone());
    Setup {
        dir,
        claims,
        driver,
    }
}

fn new_driver(dir: &std::path::Path, claims: Arc<FakeClaims>) -> Driver {
    Driver::new(
        DriverConfig {
            node_name: "node-a".into(),
            topology: Topology::new(8, 4).unwrap(),
            cdi_dir: dir.join("cdi"),
            checkpoint_path: dir.join("plugin").join("prepared-claims.json"),
            domain_dir: dir.join("domains"),
        },
        claims,
    )
    .unwrap()
}

async fn prepare(driver: &Driver, claims: Vec<Claim>) -> NodePrepareResourcesResponse {
    driver
        .node_prepare_resources(Request::new(NodePrepareResourcesRequest { claims }))
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn prepares_a_claim_with_a_cdi_spec_and_answers_from_the_checkpoint_after() {
    let s = setup();
    s.claims.put(claim_object(
        "c1",
        "uid-1",
        vec![
            result("rdu.dev", "node-a", "rdu2-tile0"),
            result("gpu.example.com", "node-a", "gpu0"),
            result("rdu.dev", "node-a", "rdu2-tile1"),
        ],
    ));
    let first = prepare(&s.driver, vec![claim("c1", "uid-1")]).await;
    let answer = &first.claims["uid-1"];
    assert_eq!(answer.error, "");
    let names: Vec<&str> = answer
        .devices
        .iter()
        .map(|d| d.device_name.as_str())
        .collect();
    assert_eq!(names, ["rdu2-tile0", "rdu2-tile1"]);
    for d in &answer.devices {
        assert_eq!(d.pool_name, "node-a");
        assert_eq!(d.request_names, ["tiles"]);
        assert_eq!(d.cdi_device_ids, ["rdu.dev/tile=uid-1"]);
    }
    let spec = std::fs::read_to_string(s.dir.path().join("cdi/rdu.dev-uid-1.json")).unwrap();
    assert!(spec.contains("SF_RNT_TILE_AFFINITY=0x300"), "{spec}");

    // The claim object is gone now; a second prepare answers the same from the checkpoint.
    s.claims.claims.lock().unwrap().clear();
    let second = prepare(&s.driver, vec![claim("c1", "uid-1")]).await;
    assert_eq!(second, first);
    assert_eq!(s.claims.gets(), 1);
}

#[tokio::test]
async fn each_claim_gets_its_own_error() {
    let s = setup();
    s.claims.put(claim_object(
        "good",
        "uid-g",
        vec![result("rdu.dev", "node-a", "rdu0-tile0")],
    ));
    s.claims.put(claim_object(
        "replaced",
        "uid-new",
        vec![result("rdu.dev", "node-a", "rdu0-tile1")],
    ));
    s.claims.put(claim_object(
        "foreign",
        "uid-f",
        vec![result("rdu.dev", "node-b", "rdu0-tile2")],
    ));
    s.claims.put(claim_object(
        "bogus",
        "uid-b",
        vec![result("rdu.dev", "node-a", "rdu9-tile0")],
    ));
    s.claims.put(claim_object(
        "other-driver",
        "uid-o",
        vec![result("gpu.example.com", "node-a", "gpu0")],
    ));
    let mut unallocated = claim_object("pending", "uid-p", vec![]);
    unallocated.status = None;
    s.claims.put(unallocated);
    let response = prepare(
        &s.driver,
        vec![
            claim("good", "uid-g"),
            claim("replaced", "uid-old"),
            claim("foreign", "uid-f"),
            claim("bogus", "uid-b"),
            claim("other-driver", "uid-o"),
            claim("pending", "uid-p"),
            claim("missing", "uid-m"),
        ],
    )
    .await;
    assert_eq!(response.claims.len(), 7);
    assert_eq!(response.claims["uid-g"].error, "");
    let expect = [
        ("uid-old", "has UID uid-new, the kubelet asked for uid-old"),
        (
            "uid-f",
            "device rdu0-tile2 of pool node-b, which is not this node (node-a)",
        ),
        (
            "uid-b",
            "device rdu9-tile0, which node node-a does not have: unknown device `rdu9-tile0`",
        ),
        ("uid-o", "has no device of driver rdu.dev"),
        ("uid-p", "ns/pending is not allocated"),
        (
            "uid-m",
            "cannot get ResourceClaim ns/missing: resourceclaims \"missing\" not found",
        ),
    ];
    for (uid, text) in expect {
        let answer = &response.claims[uid];
        assert!(answer.devices.is_empty(), "{uid}");
        assert!(answer.error.contains(text), "{uid}: {}", answer.error);
        assert!(
            !s.dir
                .path()
                .join(format!("cdi/rdu.dev-{uid}.json"))
                .exists(),
            "{uid}"
        );
    }
    let files = std::fs::read_dir(s.dir.path().join("cdi")).unwrap().count();
    assert_eq!(files, 1);
}

#[tokio::test]
async fn unprepare_survives_a_restart_and_unknown_claims_are_fine() {
    let s = setup();
    s.claims.put(claim_object(
        "c1",
        "uid-1",
        vec![result("rdu.dev", "node-a", "rdu7-tile3")],
    ));
    assert_eq!(
        prepare(&s.driver, vec![claim("c1", "uid-1")]).await.claims["uid-1"].error,
        ""
    );
    let spec = s.dir.path().join("cdi/rdu.dev-uid-1.json");
    assert!(spec.exists());
    drop(s.driver);

    let restarted = new_driver(s.dir.path(), s.claims.clone());
    let again = prepare(&restarted, vec![claim("c1", "uid-1")]).await;
    assert_eq!(again.claims["uid-1"].devices[0].device_name, "rdu7-tile3");
    assert_eq!(
        s.claims.gets(),
        1,
        "a restarted driver answers prepared claims from its checkpoint"
    );

    let response = restarted
        .node_unprepare_resources(Request::new(NodeUnprepareResourcesRequest {
            claims: vec![claim("c1", "uid-1"), claim("never", "uid-never")],
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.claims["uid-1"].error, "");
    assert_eq!(response.claims["uid-never"].error, "");
    assert!(!spec.exists());
    let checkpoint = Checkpoint::load(s.dir.path().join("plugin/prepared-claims.json")).unwrap();
    assert!(checkpoint.is_empty());
}

#[tokio::test]
async fn a_claim_that_cannot_be_recorded_leaves_no_cdi_spec() {
    let dir = tempfile::tempdir().unwrap();
    let claims = Arc::new(FakeClaims::default());
    claims.put(claim_object(
        "c1",
        "uid-1",
        vec![result("rdu.dev", "node-a", "rdu0-tile0")],
    ));
    let driver = new_driver(dir.path(), claims);
    // The checkpoint's directory becomes a file, so recording fails.
    std::fs::write(dir.path().join("plugin"), b"").unwrap();
    let response = prepare(&driver, vec![claim("c1", "uid-1")]).await;
    assert!(
        response.claims["uid-1"]
            .error
            .contains("checkpoint of claim uid-1"),
        "{:?}",
        response
    );
    assert!(!dir.path().join("cdi/rdu.dev-uid-1.json").exists());
}

/// A claim of job `job` (its domain config) allocated one tile.
fn job_claim(name: &str, uid: &str, job: &str, device: &str) -> ResourceClaim {
    use k8s_openapi::api::resource::v1::{
        DeviceAllocationConfiguration, OpaqueDeviceConfiguration,
    };
    let mut object = claim_object(name, uid, vec![result("rdu.dev", "node-a", device)]);
    let devices = object
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .unwrap();
    devices.config = Some(vec![DeviceAllocationConfiguration {
        source: "FromClaim".into(),
        requests: Some(vec!["tiles".into()]),
        opaque: Some(OpaqueDeviceConfiguration {
            driver: "rdu.dev".into(),
            parameters: k8s_openapi::apimachinery::pkg::runtime::RawExtension(
                serde_json::to_value(rdu_crds::shm_domain::DomainConfig::for_job(job)).unwrap(),
            ),
        }),
    }]);
    object
}

async fn unprepare(driver: &Driver, claims: Vec<Claim>) {
    let response = driver
        .node_unprepare_resources(Request::new(NodeUnprepareResourcesRequest { claims }))
        .await
        .unwrap()
        .into_inner();
    for (uid, answer) in response.claims {
        assert_eq!(answer.error, "", "{uid}");
    }
}

#[tokio::test]
async fn a_jobs_claims_share_its_domain_until_the_last_is_unprepared_even_across_a_restart() {
    let s = setup();
    s.claims
        .put(job_claim("a0", "uid-a0", "job-a", "rdu0-tile0"));
    s.claims
        .put(job_claim("a1", "uid-a1", "job-a", "rdu0-tile1"));
    s.claims
        .put(job_claim("b0", "uid-b0", "job-b", "rdu1-tile0"));
    s.claims.put(claim_object(
        "plain",
        "uid-p",
        vec![result("rdu.dev", "node-a", "rdu2-tile0")],
    ));
    let response = prepare(
        &s.driver,
        ["a0", "a1", "b0"]
            .iter()
            .map(|n| claim(n, &format!("uid-{n}")))
            .chain([claim("plain", "uid-p")])
            .collect(),
    )
    .await;
    for answer in response.claims.values() {
        assert_eq!(answer.error, "");
    }
    let domains = s.dir.path().join("domains");
    let mounted = |uid: &str| -> Vec<String> {
        let spec: serde_json::Value = serde_json::from_slice(
            &std::fs::read(s.dir.path().join(format!("cdi/rdu.dev-{uid}.json"))).unwrap(),
        )
        .unwrap();
        spec["devices"][0]["containerEdits"]["mounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| m["hostPath"].as_str().unwrap().to_string())
            .collect()
    };
    let a = domains.join("ns_job-a").display().to_string();
    let b = domains.join("ns_job-b").display().to_string();
    assert_eq!(mounted("uid-a0"), [a.as_str()]);
    assert_eq!(mounted("uid-a1"), [a.as_str()]);
    assert_eq!(mounted("uid-b0"), [b.as_str()]);
    assert!(
        mounted("uid-p").is_empty(),
        "a claim with no config has no domain"
    );

    unprepare(&s.driver, vec![claim("a0", "uid-a0")]).await;
    assert!(domains.join("ns_job-a").is_dir(), "a1 is still in it");
    // A socket a rank left behind does not keep the domain.
    std::os::unix::net::UnixListener::bind(domains.join("ns_job-a/rdu-rings-1")).unwrap();
    drop(s.driver);

    let restarted = new_driver(s.dir.path(), s.claims.clone());
    assert!(domains.join("ns_job-a").is_dir() && domains.join("ns_job-b").is_dir());
    unprepare(&restarted, vec![claim("a1", "uid-a1")]).await;
    assert!(
        !domains.join("ns_job-a").exists(),
        "the job's last claim went"
    );
    assert!(domains.join("ns_job-b").is_dir());

    // A domain left by a driver stopped between forgetting a claim and removing it goes at the next start.
    std::fs::create_dir(domains.join("ns_job-gone")).unwrap();
    drop(restarted);
    let _again = new_driver(s.dir.path(), s.claims.clone());
    assert!(!domains.join("ns_job-gone").exists());
    assert!(domains.join("ns_job-b").is_dir());
}

#[tokio::test]
async fn a_claim_with_a_bad_domain_config_is_refused_and_makes_nothing() {
    let s = setup();
    s.claims
        .put(job_claim("a0", "uid-a0", "../../etc", "rdu0-tile0"));
    let response = prepare(&s.driver, vec![claim("a0", "uid-a0")]).await;
    let error = &response.claims["uid-a0"].error;
    assert!(
        error.contains("shared-memory domain of claim uid-a0")
            && error.contains("job `../../etc` must be 1 to 64"),
        "{error}"
    );
    assert!(!s.dir.path().join("cdi/rdu.dev-uid-a0.json").exists());
    assert!(!s.dir.path().join("domains").exists());
}

#[tokio::test]
async fn a_domain_that_cannot_be_removed_does_not_fail_the_unprepare_or_the_start() {
    let s = setup();
    s.claims
        .put(job_claim("a0", "uid-a0", "job-a", "rdu0-tile0"));
    let response = prepare(&s.driver, vec![claim("a0", "uid-a0")]).await;
    assert_eq!(response.claims["uid-a0"].error, "");
    // The domain root becomes a file: no sweep can list it.
    let root = s.dir.path().join("domains");
    std::fs::rename(&root, s.dir.path().join("domains-away")).unwrap();
    std::fs::write(&root, b"").unwrap();
    unprepare(&s.driver, vec![claim("a0", "uid-a0")]).await;
    assert!(!s.dir.path().join("cdi/rdu.dev-uid-a0.json").exists());
    drop(s.driver);
    let restarted = new_driver(s.dir.path(), s.claims.clone());
    let checkpoint = restarted.prepared.lock().await;
    assert!(checkpoint.is_empty(), "the claim was unprepared");
}

#[tokio::test]
async fn a_prepared_claim_whose_domain_and_spec_went_with_a_reboot_gets_them_again() {
    let s = setup();
    s.claims
        .put(job_claim("a0", "uid-a0", "job-a", "rdu0-tile0"));
    let first = prepare(&s.driver, vec![claim("a0", "uid-a0")]).await;
    assert_eq!(first.claims["uid-a0"].error, "");
    let domain = s.dir.path().join("domains/ns_job-a");
    let spec = s.dir.path().join("cdi/rdu.dev-uid-a0.json");
    let written = std::fs::read(&spec).unwrap();
    std::fs::remove_dir(&domain).unwrap();
    std::fs::remove_file(&spec).unwrap();
    let again = prepare(&s.driver, vec![claim("a0", "uid-a0")]).await;
    assert_eq!(again, first);
    assert!(domain.is_dir());
    assert_eq!(
        std::fs::read(&spec).unwrap(),
        written,
        "the spec as first written"
    );
}

#[tokio::test]
async fn a_restarted_driver_makes_the_files_of_recorded_claims_again_before_any_prepare() {
    let s = setup();
    s.claims
        .put(job_claim("a0", "uid-a0", "job-a", "rdu0-tile0"));
    s.claims.put(claim_object(
        "b0",
        "uid-b0",
        vec![result(DRIVER_NAME, "node-a", "rdu1-tile2")],
    ));
    for name in ["a0", "b0"] {
        let uid = format!("uid-{name}");
        let answer = prepare(&s.driver, vec![claim(name, &uid)]).await;
        assert_eq!(answer.claims[&uid].error, "", "{name}");
    }
    let specs: Vec<_> = ["uid-a0", "uid-b0"]
        .map(|uid| s.dir.path().join(format!("cdi/rdu.dev-{uid}.json")))
        .into();
    let written: Vec<Vec<u8>> = specs.iter().map(|p| std::fs::read(p).unwrap()).collect();
    drop(s.driver);
    // A reboot: the tmpfs under /run and /var/run/cdi is empty, the checkpoint is on disk.
    std::fs::remove_dir_all(s.dir.path().join("domains")).unwrap();
    std::fs::remove_dir_all(s.dir.path().join("cdi")).unwrap();
    let _restarted = new_driver(s.dir.path(), s.claims.clone());
    assert!(s.dir.path().join("domains/ns_job-a").is_dir());
    for (path, before) in specs.iter().zip(&written) {
        assert_eq!(&std::fs::read(path).unwrap(), before, "{}", path.display());
    }
}
