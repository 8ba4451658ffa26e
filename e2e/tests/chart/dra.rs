//! The chart with `devicePlugin.kubeletApi=dra`: the DRA plugin's ServiceAccount may publish, change and delete
//! ResourceSlices of driver rdu.dev on its own node only (a ValidatingAdmissionPolicy, as for the device plugin's
//! annotations), and read ResourceClaims; nothing else.

use super::{NAMESPACE, can_i, plane_with_namespaces, pod_on};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, Patch};
use rdu_dra::publish::{apply_params, publish};
use rdu_e2e::{Components, kit, poll_until};
use rdu_tiles::topology::Topology;
use std::time::Duration;

const PLUGIN: &str = "rdu-rdu-operator-dra-plugin";
const POLICY: &str = "rdu-rdu-operator-dra-plugin-own-node";

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn the_dra_plugin_may_publish_and_delete_only_its_own_nodes_slices() {
    let plane = plane_with_namespaces(
        "DRA plugin service account",
        // With the controller that type-checks the policy.
        Components {
            controller_manager: true,
            ..Components::default()
        },
    )
    .chart_values(&["--set", "devicePlugin.kubeletApi=dra"])
    .start_with_chart()
    .await;
    for node in ["node-a", "node-b"] {
        let node =
            format!(r#"{{"apiVersion": "v1", "kind": "Node", "metadata": {{"name": "{node}"}}}}"#);
        kit::apply(&plane, &node).expect("a node");
    }
    kit::apply(&plane, &pod_on("dra-a", NAMESPACE, "node-a", PLUGIN)).expect("the plugin's pod");
    let kubeconfig = super::bound_kubeconfig(&plane, PLUGIN, "dra-a", "dra-on-node-a");
    let plugin = rdu_e2e::kubeconfig::client(&kubeconfig)
        .await
        .expect("client");
    let admin = rdu_e2e::kubeconfig::client(&plane.admin_kubeconfig)
        .await
        .expect("admin client");
    let topology = Topology::new(2, 4).expect("topology");

    // Another node's slices, published by the admin; the plugin is refused them once the policy is in force.
    publish(admin.clone(), "node-b", &topology, "SN10", 1)
        .await
        .expect("the admin publishes node-b's slices");
    let refused = poll_until(
        "the DRA plugin's policy in force",
        Duration::from_secs(30),
        || async {
            match publish(plugin.clone(), "node-b", &topology, "SN10", 2).await {
                Err(refused) => Ok(rdu_error_chain::chain(&refused)),
                Ok(_) => Err("node-b's slices applied by node-a's plugin".to_string()),
            }
        },
    )
    .await
    .expect("policy in force");
    assert!(
        refused.contains(
            "the DRA plugin on node node-a may not UPDATE ResourceSlice node-b-rdu.dev-0 of node node-b"
        ),
        "{refused}"
    );
    let checked = super::type_checking(&plane, POLICY).await;
    assert!(checked.get("expressionWarnings").is_none(), "{checked}");

    // Its own node's slices: created, applied again, and stale ones deleted (a smaller topology).
    let stored = publish(plugin.clone(), "node-a", &topology, "SN10", 1)
        .await
        .expect("the plugin publishes its own node's slices");
    assert_eq!(stored.len(), 1);
    publish(
        plugin.clone(),
        "node-a",
        &Topology::new(1, 4).expect("topology"),
        "SN10",
        2,
    )
    .await
    .expect("and applies them again");

    let slices: Api<ResourceSlice> = Api::all(plugin.clone());
    let foreign = [
        (
            "a slice of no node",
            serde_json::json!({"nodeName": null, "allNodes": true, "driver": "rdu.dev",
                "pool": {"name": "all", "generation": 1, "resourceSliceCount": 1}, "devices": []}),
            "may not CREATE ResourceSlice x-slice, which is on no node",
        ),
        (
            "another driver's slice",
            serde_json::json!({"nodeName": "node-a", "driver": "gpu.example.com",
                "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1}, "devices": []}),
            "may only publish ResourceSlices of driver rdu.dev, not gpu.example.com",
        ),
        (
            "a slice of node-b",
            serde_json::json!({"nodeName": "node-b", "driver": "rdu.dev",
                "pool": {"name": "node-b", "generation": 1, "resourceSliceCount": 1}, "devices": []}),
            "may not CREATE ResourceSlice x-slice of node node-b",
        ),
    ];
    for (what, spec, why) in foreign {
        let slice = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "x-slice"}, "spec": spec,
        });
        let refused = slices
            .patch("x-slice", &apply_params(), &Patch::Apply(&slice))
            .await
            .expect_err(what);
        let refused = rdu_error_chain::chain(&refused);
        assert!(refused.contains(why), "{what}: {refused}");
    }
    let refused = slices
        .delete("node-b-rdu.dev-0", &DeleteParams::default())
        .await
        .expect_err("another node's slice is not the plugin's to delete");
    let refused = rdu_error_chain::chain(&refused);
    assert!(
        refused.contains("may not DELETE ResourceSlice node-b-rdu.dev-0 of node node-b"),
        "{refused}"
    );
    // A token that names no node (not from a pod) is refused with the reason.
    let unbound = super::account_kubeconfig(&plane, PLUGIN);
    let unbound = rdu_e2e::kubeconfig::client(&unbound).await.expect("client");
    let refused = publish(unbound, "node-a", &topology, "SN10", 3)
        .await
        .expect_err("no node in the token");
    let refused = rdu_error_chain::chain(&refused);
    assert!(refused.contains("token names no node"), "{refused}");

    let can = |verb: &str, resource: &str| can_i(&kubeconfig, verb, resource, "ml");
    assert!(can("get", "resourceclaims.resource.k8s.io"));
    for (verb, resource) in [
        ("update", "resourceclaims.resource.k8s.io"),
        ("list", "resourceclaims.resource.k8s.io"),
        ("get", "pods"),
        ("patch", "pods"),
        ("get", "secrets"),
        ("create", "deviceclasses.resource.k8s.io"),
        ("patch", "rdujobs.rdu.dev"),
    ] {
        assert!(
            !can(verb, resource),
            "the DRA plugin must not be allowed to {verb} {resource}"
        );
    }
}

#[test]
#[ignore = "needs the control-plane binaries (helm): bash e2e/control-plane/run.sh"]
fn a_node_runs_the_device_plugin_or_the_dra_plugin_never_both() {
    kit::require_assets("chart kubeletApi");
    let rendered = |extra: &[&str]| {
        let docs = super::documents(
            &rdu_e2e::helm_template("rdu", NAMESPACE, extra).expect("helm template"),
        );
        let named = |kind: &str| -> Vec<String> {
            docs.iter()
                .filter(|d| d["kind"].as_str() == Some(kind))
                .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_string))
                .collect()
        };
        (
            named("DaemonSet"),
            named("DeviceClass"),
            named("ValidatingAdmissionPolicy"),
        )
    };
    let (daemonsets, classes, policies) = rendered(&[]);
    assert_eq!(daemonsets, ["rdu-rdu-operator-device-plugin"]);
    assert!(classes.is_empty(), "{classes:?}");
    assert!(!policies.contains(&POLICY.to_string()), "{policies:?}");

    let (daemonsets, classes, policies) = rendered(&["--set", "devicePlugin.kubeletApi=dra"]);
    assert_eq!(daemonsets, ["rdu-rdu-operator-dra-plugin"]);
    assert_eq!(classes, ["rdu.dev"]);
    assert!(policies.contains(&POLICY.to_string()), "{policies:?}");
    assert!(
        !policies.contains(&"rdu-rdu-operator-device-plugin-own-node".to_string()),
        "{policies:?}"
    );

    let (daemonsets, classes, _) = rendered(&[
        "--set",
        "devicePlugin.kubeletApi=dra",
        "--set",
        "devicePlugin.enabled=false",
    ]);
    assert!(daemonsets.is_empty() && classes.is_empty());

    let wrong = rdu_e2e::helm_template("rdu", NAMESPACE, &["--set", "devicePlugin.kubeletApi=DRA"])
        .expect_err("an unknown kubeletApi");
    let wrong = rdu_error_chain::chain(&wrong);
    assert!(
        wrong.contains(r#"devicePlugin.kubeletApi is "DRA": set it to devicePlugin"#),
        "{wrong}"
    );
}
