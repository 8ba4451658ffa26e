//! A rank's tiles through Dynamic Resource Allocation (`spec.tileAllocation.api: dra`, DESIGN 4.3.1): the job's
//! ResourceClaimTemplate, from which Kubernetes makes each rank pod a ResourceClaim of its own, and the pod's and
//! worker container's references to that claim.

use k8s_openapi::api::core::v1::{PodResourceClaim, PodSpec, ResourceClaim};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClaim, DeviceClaimConfiguration, DeviceConstraint, DeviceRequest,
    DeviceSelector, ExactDeviceRequest, OpaqueDeviceConfiguration, ResourceClaimSpec,
    ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use rdu_crds::consts::WORKER_CONTAINER;
use rdu_crds::shm_domain::DomainConfig;
use rdu_crds::tile_allocation::{DRIVER, MODEL_ATTRIBUTE, RDU_ATTRIBUTE};
use sha1::{Digest, Sha1};

use super::meta::child_meta;
use crate::validate::{TILE_CLAIM_NAME, TileClaim, ValidJob};

/// The one device request of a claim.
const REQUEST: &str = "tiles";
/// Hex digits of the claim's hash in the template's name.
const HASH_DIGITS: usize = 10;

/// `<job>-tiles-<hash of the ask>`: a job whose ask changes (a new `tilesPerWorker`, `sameRdu` or `model`) gets
/// a new template for its next generation, since a template's spec is kept as created.
pub(crate) fn template_name(job: &str, claim: &TileClaim) -> String {
    let ask = serde_json::to_vec(claim).unwrap_or_default();
    let digest = Sha1::digest(&ask);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{job}-tiles-{}", &hex[..HASH_DIGITS])
}

/// The job's ResourceClaimTemplate: `count` devices of class `rdu.dev`, of `model` when given, and all with one
/// `rdu.dev/rdu` when `same_rdu`; the driver's opaque configuration names the job, so that the ranks on one node
/// share a shared-memory domain (DESIGN 4.4.1).
pub(crate) fn claim_template(job: &ValidJob, claim: &TileClaim) -> ResourceClaimTemplate {
    let selectors = claim.model.as_ref().map(|model| {
        vec![DeviceSelector {
            cel: Some(CELDeviceSelector {
                expression: model_selector(model),
            }),
        }]
    });
    let constraints = claim.same_rdu.then(|| {
        vec![DeviceConstraint {
            requests: Some(vec![REQUEST.to_string()]),
            match_attribute: Some(RDU_ATTRIBUTE.to_string()),
            ..Default::default()
        }]
    });
    ResourceClaimTemplate {
        metadata: child_meta(job, template_name(job.name, claim)),
        spec: ResourceClaimTemplateSpec {
            metadata: None,
            spec: ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: REQUEST.to_string(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: DRIVER.to_string(),
                            allocation_mode: Some("ExactCount".to_string()),
                            count: Some(i64::from(claim.count)),
                            selectors,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    constraints,
                    config: Some(vec![domain_config(&job.owner.uid)]),
                }),
            },
        },
    }
}

/// [`DomainConfig`] of the job with UID `uid`, for the driver `rdu.dev`.
fn domain_config(uid: &str) -> DeviceClaimConfiguration {
    DeviceClaimConfiguration {
        requests: Some(vec![REQUEST.to_string()]),
        opaque: Some(OpaqueDeviceConfiguration {
            driver: DRIVER.to_string(),
            parameters: RawExtension(
                serde_json::to_value(DomainConfig::for_job(uid)).unwrap_or_default(),
            ),
        }),
    }
}

/// `device.attributes["rdu.dev"].model == "<model>"`; validation let only letters, digits, '.', '_' and '-'
/// through, so the literal cannot be broken out of.
fn model_selector(model: &str) -> String {
    let (domain, id) = MODEL_ATTRIBUTE
        .split_once('/')
        .unwrap_or((DRIVER, MODEL_ATTRIBUTE));
    format!("device.attributes[\"{domain}\"].{id} == \"{model}\"")
}

/// Gives the pod the claim [`TILE_CLAIM_NAME`] from the job's template and its worker container the use of it.
pub(crate) fn claim_tiles(spec: &mut PodSpec, job: &str, claim: &TileClaim) {
    spec.resource_claims
        .get_or_insert_with(Vec::new)
        .push(PodResourceClaim {
            name: TILE_CLAIM_NAME.to_string(),
            resource_claim_template_name: Some(template_name(job, claim)),
            resource_claim_name: None,
        });
    if let Some(worker) = spec
        .containers
        .iter_mut()
        .find(|c| c.name == WORKER_CONTAINER)
    {
        worker
            .resources
            .get_or_insert_with(Default::default)
            .claims
            .get_or_insert_with(Vec::new)
            .push(ResourceClaim {
                name: TILE_CLAIM_NAME.to_string(),
                request: None,
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::job;
    use crate::validate::valid;
    use serde_json::json;

    fn ask(count: u32, same_rdu: bool, model: Option<&str>) -> TileClaim {
        TileClaim {
            count,
            same_rdu,
            model: model.map(Into::into),
        }
    }

    #[test]
    fn the_template_asks_for_the_count_on_one_rdu_of_the_model() {
        let j = job("mnist", Some("ml"), 2);
        let template = claim_template(&valid(&j), &ask(4, true, Some("SN30")));
        let value = serde_json::to_value(&template).expect("json");
        assert_eq!(value["metadata"]["namespace"], "ml");
        assert_eq!(value["metadata"]["ownerReferences"][0]["uid"], "uid-mnist");
        assert_eq!(
            value["spec"]["spec"]["devices"],
            json!({
                "requests": [{"name": "tiles", "exactly": {
                    "deviceClassName": "rdu.dev", "allocationMode": "ExactCount", "count": 4,
                    "selectors": [{"cel": {"expression": "device.attributes[\"rdu.dev\"].model == \"SN30\""}}]}}],
                "constraints": [{"requests": ["tiles"], "matchAttribute": "rdu.dev/rdu"}],
                "config": [{"requests": ["tiles"], "opaque": {"driver": "rdu.dev", "parameters": {
                    "apiVersion": "rdu.dev/v1alpha1", "kind": "SharedMemoryDomain", "job": "uid-mnist"}}}]
            })
        );
    }

    #[test]
    fn without_placement_or_model_the_template_asks_for_the_count_alone() {
        let j = job("mnist", Some("ml"), 2);
        let template = claim_template(&valid(&j), &ask(2, false, None));
        assert_eq!(
            serde_json::to_value(&template.spec.spec).expect("json"),
            json!({"devices": {
                "requests": [{"name": "tiles", "exactly": {
                    "deviceClassName": "rdu.dev", "allocationMode": "ExactCount", "count": 2}}],
                "config": [{"requests": ["tiles"], "opaque": {"driver": "rdu.dev", "parameters": {
                    "apiVersion": "rdu.dev/v1alpha1", "kind": "SharedMemoryDomain", "job": "uid-mnist"}}}]}})
        );
    }

    #[test]
    fn each_ask_has_a_template_name_of_its_own() {
        let asks = [
            ask(2, false, None),
            ask(4, false, None),
            ask(2, true, None),
            ask(2, true, Some("SN30")),
            ask(2, true, Some("SN10")),
        ];
        let names: std::collections::BTreeSet<String> =
            asks.iter().map(|a| template_name("mnist", a)).collect();
        assert_eq!(names.len(), asks.len(), "{names:?}");
        let name = template_name("mnist", &asks[0]);
        assert_eq!(name, template_name("mnist", &asks[0].clone()));
        assert!(name.starts_with("mnist-tiles-") && name.len() == "mnist-tiles-".len() + 10);
    }

    #[test]
    fn the_pod_claims_the_tiles_and_the_worker_uses_them() {
        let mut spec: PodSpec = serde_json::from_value(json!({
            "containers": [{"name": "sidecar"}, {"name": "worker"}],
            "resourceClaims": [{"name": "scratch", "resourceClaimName": "mine"}]
        }))
        .expect("spec");
        let claim = ask(2, true, None);
        claim_tiles(&mut spec, "mnist", &claim);
        let value = serde_json::to_value(&spec).expect("json");
        assert_eq!(
            value["resourceClaims"],
            json!([{"name": "scratch", "resourceClaimName": "mine"},
                   {"name": "rdu-tiles", "resourceClaimTemplateName": template_name("mnist", &claim)}])
        );
        assert_eq!(
            value["containers"][1]["resources"]["claims"],
            json!([{"name": "rdu-tiles"}])
        );
        assert!(value["containers"][0].get("resources").is_none());
    }
}
