//! Fails when the committed CRD YAML differs from what the Rust types generate.
use std::path::PathBuf;

#[test]
fn committed_crd_yaml_matches_the_types() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let generated = rdu_crds::crd_yaml();
    for rel in rdu_crds::CRD_YAML_PATHS {
        let committed = std::fs::read_to_string(root.join(rel)).unwrap_or_default();
        assert!(
            committed == generated,
            "{rel} is stale: run `cargo run -p rdu-crds --bin crdgen` and commit the result"
        );
    }
}

#[test]
fn crd_carries_cel_rules_with_field_names() {
    let yaml = rdu_crds::crd_yaml();
    assert!(yaml.contains("x-kubernetes-validations"));
    for field in [
        "spec.workers",
        "spec.tilesPerWorker",
        "spec.training.batchSize",
        "spec.training.learningRate",
    ] {
        assert!(yaml.contains(field), "no CEL message names {field}");
    }
}

#[test]
fn the_world_size_has_a_schema_maximum_and_a_cel_rule_with_rusts_message() {
    let crd: serde_json::Value =
        serde_json::to_value(<rdu_crds::RduJob as kube::CustomResourceExt>::crd()).expect("json");
    let workers = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["workers"];
    assert_eq!(
        workers["maximum"].as_f64(),
        Some(f64::from(rdu_crds::consts::MAX_WORKERS))
    );
    let rules = workers["x-kubernetes-validations"]
        .as_array()
        .expect("CEL rules");
    assert!(
        rules.iter().any(|r| r["rule"] == "self <= 4096"
            && r["message"] == rdu_crds::consts::MAX_WORKERS_MESSAGE),
        "{rules:?}"
    );
}

#[test]
fn hidden_layers_and_data_files_have_schema_maxima_and_cel_rules_with_rusts_messages() {
    let crd: serde_json::Value =
        serde_json::to_value(<rdu_crds::RduJob as kube::CustomResourceExt>::crd()).expect("json");
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let hidden = &spec["model"]["properties"]["hiddenSizes"];
    assert_eq!(
        hidden["items"]["maximum"].as_f64(),
        Some(f64::from(rdu_crds::consts::MAX_HIDDEN_SIZE)),
        "{hidden}"
    );
    let has_rule = |field: &serde_json::Value, rule: &str, message: &str| {
        field["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["rule"] == rule && r["message"] == message)
    };
    assert!(
        has_rule(
            hidden,
            "self.all(h, h <= 16384)",
            rdu_crds::consts::MAX_HIDDEN_SIZE_MESSAGE
        ),
        "{hidden}"
    );
    let cap = &spec["data"]["properties"]["maxFileMiB"];
    assert_eq!(
        cap["maximum"].as_f64(),
        Some(f64::from(rdu_crds::consts::MAX_DATA_FILE_MIB))
    );
    assert!(
        has_rule(
            cap,
            "self >= 1 && self <= 65536",
            rdu_crds::consts::DATA_FILE_MIB_MESSAGE
        ),
        "{cap}"
    );
}
