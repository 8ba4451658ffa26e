//! Unit tests of finding, making and removing shared-memory domains.

use super::*;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    OpaqueDeviceConfiguration, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;

const UID: &str = "0b6c8a2e-2f3d-4d6e-9a7b-1c2d3e4f5a6b";

fn config(driver: &str, parameters: serde_json::Value) -> DeviceAllocationConfiguration {
    DeviceAllocationConfiguration {
        source: "FromClaim".into(),
        requests: Some(vec!["tiles".into()]),
        opaque: Some(OpaqueDeviceConfiguration {
            driver: driver.into(),
            parameters: RawExtension(parameters),
        }),
    }
}

fn claim(namespace: &str, configs: Vec<DeviceAllocationConfiguration>) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            namespace: Some(namespace.into()),
            name: Some("rank-0-rdu-tiles-x".into()),
            ..Default::default()
        },
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    config: Some(configs),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn job_config() -> serde_json::Value {
    serde_json::to_value(DomainConfig::for_job(UID)).unwrap()
}

#[test]
fn a_claim_with_the_jobs_config_names_its_namespace_and_job() {
    let found = domain_of(&claim("ml", vec![config(DRIVER_NAME, job_config())])).unwrap();
    assert_eq!(found.as_deref(), Some(&*format!("ml_{UID}")));
    let mut other = job_config();
    other["job"] = json!("another-job");
    let found = domain_of(&claim(
        "ml",
        vec![
            config("gpu.example.com", json!({"anything": 1})),
            config(DRIVER_NAME, other),
        ],
    ))
    .unwrap();
    assert_eq!(found.as_deref(), Some("ml_another-job"));
}

#[test]
fn a_claim_without_the_drivers_config_has_no_domain() {
    assert_eq!(domain_of(&claim("ml", vec![])).unwrap(), None);
    let only_other = claim("ml", vec![config("gpu.example.com", job_config())]);
    assert_eq!(domain_of(&only_other).unwrap(), None);
    let mut unallocated = claim("ml", vec![]);
    unallocated.status = None;
    assert_eq!(domain_of(&unallocated).unwrap(), None);
}

#[test]
fn bad_configs_and_namespaces_are_refused_naming_the_claim() {
    let mut bad_job = job_config();
    bad_job["job"] = json!("../../etc");
    let cases = [
        (
            claim("ml", vec![config(DRIVER_NAME, bad_job)]),
            "ml/rank-0-rdu-tiles-x: status.allocation.devices.config: the rdu.dev opaque parameters' job `../../etc`",
        ),
        (
            claim(
                "ml",
                vec![
                    config(DRIVER_NAME, job_config()),
                    config(DRIVER_NAME, job_config()),
                ],
            ),
            "more than one opaque configuration",
        ),
        (
            claim("Bad_NS", vec![config(DRIVER_NAME, job_config())]),
            "namespace `Bad_NS` is not a DNS label",
        ),
    ];
    for (claim, expected) in cases {
        let err = rdu_error_chain::chain(&domain_of(&claim).unwrap_err());
        assert!(err.contains(expected), "{err}");
    }
}

#[test]
fn a_domain_is_made_open_to_its_ranks_under_a_closed_root_and_again_without_harm() {
    let dir = tempfile::tempdir().unwrap();
    let domains = Domains::new(dir.path().join("rdu-dra/domains"));
    let path = domains.make("ml_job-a").unwrap();
    assert_eq!(path, dir.path().join("rdu-dra/domains/ml_job-a"));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(domains.root()), 0o700);
    assert_eq!(mode(&path), 0o1777);
    std::fs::write(path.join("rdu-rings-1"), b"").unwrap();
    assert_eq!(domains.make("ml_job-a").unwrap(), path);
    assert!(path.join("rdu-rings-1").exists(), "making again keeps it");
}

#[test]
fn sweeping_removes_every_domain_not_kept_with_what_is_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let domains = Domains::new(dir.path().join("domains"));
    assert!(domains.sweep(&BTreeSet::new()).unwrap().is_empty());
    for name in ["ml_a", "ml_b", "ops_c"] {
        let path = domains.make(name).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(path.join("rdu-rings-1")).unwrap();
        drop(listener);
    }
    std::fs::write(domains.root().join("stray"), b"").unwrap();
    let keep: BTreeSet<String> = ["ml_b".to_string()].into();
    let removed = domains.sweep(&keep).unwrap();
    assert_eq!(removed, ["ml_a", "ops_c", "stray"]);
    let left: Vec<String> = std::fs::read_dir(domains.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["ml_b"]);
    assert!(domains.root().join("ml_b/rdu-rings-1").exists());
}

#[test]
fn a_domain_that_cannot_be_removed_does_not_keep_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let domains = Domains::new(dir.path().join("domains"));
    for name in ["ml_a", "ml_b", "ml_c"] {
        domains.make(name).unwrap();
    }
    // The first the sweep lists is the one it cannot remove, so that the others all come after it.
    let first = std::fs::read_dir(domains.root())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name()
        .to_string_lossy()
        .into_owned();
    let stuck = domains.root().join(&first);
    let err = domains
        .sweep_with(&BTreeSet::new(), |path, is_dir| {
            assert!(is_dir);
            if path == stuck {
                Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied))
            } else {
                std::fs::remove_dir_all(path)
            }
        })
        .unwrap_err();
    assert!(err.to_string().contains(&first), "{err}");
    let mut left: Vec<String> = std::fs::read_dir(domains.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, [first], "the others were removed");
}
