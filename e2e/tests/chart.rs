//! The Helm chart renders, its objects are accepted by the API server (server-side dry run), and its
//! ClusterRole/Role grant exactly the operator's API use (COMMON contract), nothing more, and the device plugin's
//! role exactly the pod annotation it writes, on its own node's pods only.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use rdu_crds::consts::TILES_ANNOTATION;
use rdu_device_plugin::annotate::{KubeAnnotator, PodAnnotator};
use rdu_e2e::{
    Components, ControlPlane, assets_or_skip, create_namespace, helm_template, install_crd,
    kubectl, poll_until,
};
use serde_yaml_ng::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NAMESPACE: &str = "rdu-system";

/// (apiGroup, resource, verb) triples.
type Grants = BTreeSet<(String, String, String)>;

fn grants(rules: &[(&str, &[&str], &[&str])]) -> Grants {
    let mut set = Grants::new();
    for (group, resources, verbs) in rules {
        for r in *resources {
            for v in *verbs {
                set.insert((group.to_string(), r.to_string(), v.to_string()));
            }
        }
    }
    set
}

/// What the rendered `kind` objects named `name` grant.
fn rendered_grants(docs: &[Value], kind: &str, name: &str) -> Grants {
    let mut set = Grants::new();
    for doc in docs.iter().filter(|d| {
        d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name)
    }) {
        for rule in doc["rules"].as_sequence().into_iter().flatten() {
            let strings = |key: &str| -> Vec<String> {
                rule[key]
                    .as_sequence()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            };
            for g in strings("apiGroups") {
                for r in strings("resources") {
                    for v in strings("verbs") {
                        set.insert((g.clone(), r.clone(), v));
                    }
                }
            }
        }
    }
    set
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("rendered YAML parses"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

#[test]
fn the_chart_grants_exactly_the_operators_api_use() {
    let Some(_assets) = assets_or_skip("chart rbac") else {
        return;
    };
    let docs = documents(&helm_template("rdu", NAMESPACE, &[]).expect("helm template"));
    let cluster = grants(&[
        ("rdu.dev", &["rdujobs"], &["list", "watch", "delete"]),
        ("rdu.dev", &["rdujobs/status"], &["patch"]),
        ("", &["pods"], &["list", "watch", "get", "create", "delete"]),
        (
            "",
            &["services"],
            &["list", "watch", "get", "create", "patch"],
        ),
        ("", &["secrets"], &["get", "create"]),
        ("", &["persistentvolumeclaims"], &["get", "create"]),
        (
            "networking.k8s.io",
            &["networkpolicies"],
            &["get", "create", "patch"],
        ),
        ("events.k8s.io", &["events"], &["create", "patch"]),
        (
            "scheduling.x-k8s.io",
            &["podgroups"],
            &["get", "create", "patch"],
        ),
        // Nodes: which are lost, what room they have (DESIGN 5).
        ("", &["nodes"], &["list", "watch"]),
        (
            "apiextensions.k8s.io",
            &["customresourcedefinitions"],
            &["get"],
        ),
        // Progress reports: who sent one (DESIGN 4.8).
        ("authentication.k8s.io", &["tokenreviews"], &["create"]),
    ]);
    assert_eq!(
        rendered_grants(&docs, "ClusterRole", "rdu-rdu-operator"),
        cluster
    );
    // The device plugin's own role: only writing pods' `rdu.dev/tiles` annotation.
    assert_eq!(
        rendered_grants(&docs, "ClusterRole", "rdu-rdu-operator-device-plugin"),
        grants(&[("", &["pods"], &["patch"])])
    );
    let roles = docs
        .iter()
        .filter(|d| d["kind"].as_str().is_some_and(|k| k.ends_with("Role")))
        .count();
    assert_eq!(
        roles, 3,
        "the operator's ClusterRole and Role, the plugin's ClusterRole"
    );
    let lease = grants(&[(
        "coordination.k8s.io",
        &["leases"],
        &["get", "create", "update"],
    )]);
    assert_eq!(
        rendered_grants(&docs, "Role", "rdu-rdu-operator-leader-election"),
        lease
    );
    let role = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("Role"))
        .unwrap();
    assert_eq!(role["metadata"]["namespace"].as_str(), Some(NAMESPACE));
}

#[tokio::test]
async fn the_rendered_chart_is_accepted_by_the_api_server() {
    let Some(plane) = plane_with_namespaces("chart dry run", Components::default()).await else {
        return;
    };

    let kind_values = rdu_e2e::workspace_root().join("e2e/kind/values.yaml");
    let kind_values = kind_values.display().to_string();
    create_namespace(&plane, "default")
        .await
        .expect("namespace");
    for extra in [
        vec![],
        vec!["--values", kind_values.as_str()],
        vec![
            "--set",
            "networkPolicy.enabled=false",
            "--set",
            "operator.watchNamespace=ml",
        ],
        vec![
            "--set",
            "devicePlugin.resourceMode=rdu",
            "--set",
            "devicePlugin.kubeletPodResourcesDir=",
        ],
    ] {
        let rendered = helm_template("rdu", NAMESPACE, &extra).expect("helm template");
        let kinds: BTreeSet<String> = documents(&rendered)
            .iter()
            .filter_map(|d| d["kind"].as_str().map(str::to_string))
            .collect();
        for kind in [
            "Deployment",
            "DaemonSet",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Service",
        ] {
            assert!(kinds.contains(kind), "{extra:?}: no {kind} in {kinds:?}");
        }
        let out = kubectl(
            &plane,
            &["apply", "--server-side", "--dry-run=server", "-f", "-"],
            Some(&rendered),
        )
        .unwrap_or_else(|e| panic!("{extra:?}: refused: {e}"));
        assert!(
            out.contains("deployment.apps/rdu-rdu-operator serverside-applied (server dry run)"),
            "{out}"
        );
    }
}

/// A control plane with the CRD and the namespaces `rdu-system` and `ml`; `None` when the control-plane
/// binaries are missing and not required.
async fn plane_with_namespaces(test: &str, components: Components) -> Option<ControlPlane> {
    let assets = assets_or_skip(test)?;
    let plane = ControlPlane::start(&assets, components)
        .await
        .expect("control plane");
    install_crd(&plane).await.expect("CRD");
    create_namespace(&plane, NAMESPACE)
        .await
        .expect("namespace");
    create_namespace(&plane, "ml").await.expect("namespace");
    Some(plane)
}

/// [`plane_with_namespaces`] with the chart applied.
async fn plane_with_chart(test: &str, components: Components) -> Option<ControlPlane> {
    let plane = plane_with_namespaces(test, components).await?;
    let rendered = helm_template("rdu", NAMESPACE, &[]).expect("helm template");
    kubectl(
        &plane,
        &["apply", "--server-side", "-f", "-"],
        Some(&rendered),
    )
    .expect("chart applies");
    Some(plane)
}

/// A kubeconfig authenticating as the chart's ServiceAccount `account`.
fn account_kubeconfig(plane: &ControlPlane, account: &str) -> PathBuf {
    let token = rdu_e2e::service_account_token(plane, NAMESPACE, account).expect("token");
    plane
        .write_kubeconfig(account, account, &token, NAMESPACE)
        .expect("kubeconfig")
}

/// `kubectl auth can-i` as the kubeconfig's user; `kind/status` style resources are asked as a subresource
/// (as one argument they would name an object called "status").
fn can_i(kubeconfig: &Path, verb: &str, resource: &str, namespace: &str) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((resource, sub)) => (resource, Some(format!("--subresource={sub}"))),
        None => (resource, None),
    };
    let mut args = vec!["auth", "can-i", verb, resource, "-n", namespace];
    args.extend(subresource.as_deref());
    let out = rdu_e2e::kubectl_in(kubeconfig, &args, None).expect("kubectl");
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

#[tokio::test]
async fn the_charts_service_account_may_do_what_the_operator_does_and_no_more() {
    let Some(plane) = plane_with_chart("chart service account", Components::default()).await else {
        return;
    };
    let kubeconfig = account_kubeconfig(&plane, "rdu-rdu-operator");
    let can =
        |verb: &str, resource: &str, namespace: &str| can_i(&kubeconfig, verb, resource, namespace);
    for (verb, resource) in [
        ("watch", "rdujobs.rdu.dev"),
        ("patch", "rdujobs.rdu.dev/status"),
        ("delete", "pods"),
        ("create", "secrets"),
        ("patch", "services"),
        ("create", "persistentvolumeclaims"),
        ("get", "persistentvolumeclaims"),
        ("create", "events.events.k8s.io"),
        ("patch", "networkpolicies.networking.k8s.io"),
        ("watch", "nodes"),
    ] {
        // (podgroups: kubectl cannot resolve a resource whose CRD is absent; the exact ClusterRole test covers it.)
        assert!(
            can(verb, resource, "ml"),
            "the operator must be allowed to {verb} {resource}"
        );
    }
    assert!(can(
        "get",
        "customresourcedefinitions.apiextensions.k8s.io",
        NAMESPACE
    ));
    assert!(
        can("update", "leases.coordination.k8s.io", NAMESPACE),
        "its own Lease"
    );
    for (verb, resource, namespace) in [
        ("update", "leases.coordination.k8s.io", "ml"),
        ("create", "rdujobs.rdu.dev", "ml"),
        ("update", "pods", "ml"),
        ("patch", "pods", "ml"),
        ("patch", "secrets", "ml"),
        ("patch", "persistentvolumeclaims", "ml"),
        ("update", "pods/status", "ml"),
        ("create", "pods/exec", "ml"),
        ("update", "rdujobs.rdu.dev/status", "ml"),
        ("get", "nodes", NAMESPACE),
        ("patch", "nodes", NAMESPACE),
        (
            "create",
            "customresourcedefinitions.apiextensions.k8s.io",
            NAMESPACE,
        ),
        (
            "create",
            "clusterroles.rbac.authorization.k8s.io",
            NAMESPACE,
        ),
        ("get", "configmaps", "ml"),
        ("list", "secrets", "ml"),
        ("delete", "persistentvolumeclaims", "ml"),
        ("update", "persistentvolumeclaims", "ml"),
        ("deletecollection", "pods", "ml"),
        ("update", "rdujobs.rdu.dev", "ml"),
    ] {
        assert!(
            !can(verb, resource, namespace),
            "the operator must not be allowed to {verb} {resource} in {namespace}"
        );
    }
}

/// A pod `name` in `namespace` bound to `node` (none when empty), running as `account`.
fn pod_on(name: &str, namespace: &str, node: &str, account: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "rdu"}},
        "spec": {
            "nodeName": (!node.is_empty()).then_some(node),
            "serviceAccountName": account,
            "containers": [{"name": "main", "image": "rdu-worker"}],
        },
    })
    .to_string()
}

/// The `rdu.dev/tiles` annotation of pod `ml/name`.
fn tiles_of(plane: &ControlPlane, name: &str) -> String {
    let path = format!(
        "jsonpath={{.metadata.annotations.{}}}",
        TILES_ANNOTATION.replace('.', "\\.")
    );
    let out =
        kubectl(plane, &["get", "pod", name, "-n", "ml", "-o", &path], None).expect("read back");
    out.trim().to_string()
}

/// A merge patch of pod `ml/name` as `client`'s user (sent without reading the pod, which the plugin may not).
async fn patch_as(
    client: &kube::Client,
    name: &str,
    patch: &str,
    dry_run: bool,
) -> Result<Pod, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ml");
    let patch: serde_json::Value = serde_json::from_str(patch).expect("patch JSON");
    let params = PatchParams {
        dry_run,
        ..PatchParams::default()
    };
    pods.patch(name, &params, &Patch::Merge(patch)).await
}

#[tokio::test]
async fn the_device_plugin_may_only_annotate_pods_on_its_own_node() {
    let Some(plane) = plane_with_chart(
        "device plugin service account",
        // With the controller that type-checks the policy.
        Components {
            controller_manager: true,
            ..Components::default()
        },
    )
    .await
    else {
        return;
    };
    const PLUGIN: &str = "rdu-rdu-operator-device-plugin";
    for node in ["node-a", "node-b"] {
        let node =
            format!(r#"{{"apiVersion": "v1", "kind": "Node", "metadata": {{"name": "{node}"}}}}"#);
        kubectl(&plane, &["apply", "-f", "-"], Some(&node)).expect("a node");
    }
    for (name, namespace, node, account) in [
        ("plugin-a", NAMESPACE, "node-a", PLUGIN),
        ("mnist-worker-0", "ml", "node-a", "default"),
        ("mnist-worker-1", "ml", "node-b", "default"),
        ("mnist-worker-2", "ml", "", "default"),
    ] {
        let pod = pod_on(name, namespace, node, account);
        kubectl(&plane, &["apply", "-f", "-"], Some(&pod)).expect("a pod");
    }
    // The plugin's token as the kubelet mounts it: bound to its pod, which names the node.
    let token = kubectl(
        &plane,
        &[
            "create",
            "token",
            PLUGIN,
            "-n",
            NAMESPACE,
            "--duration=1h",
            "--bound-object-kind=Pod",
            "--bound-object-name=plugin-a",
        ],
        None,
    )
    .expect("a token bound to the plugin's pod");
    let kubeconfig = plane
        .write_kubeconfig("plugin-on-node-a", PLUGIN, token.trim(), NAMESPACE)
        .expect("kubeconfig");
    // The API server enforces a new policy once its informer has it: wait for a server-side dry run
    // (admitted, never stored) of an annotation the policy refuses to be refused.
    let client = rdu_e2e::kubeconfig::client(&kubeconfig)
        .await
        .expect("client");
    poll_until(
        "the device plugin's policy in force",
        Duration::from_secs(30),
        || async {
            let tiles = r#"{"metadata": {"annotations": {"rdu.dev/tiles": "x"}}}"#;
            match patch_as(&client, "mnist-worker-1", tiles, true).await {
                Err(refused) if refused.to_string().contains("may not annotate") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .expect("policy in force");
    // The API server type-checks the policy's CEL against the Pod schema; it must find nothing to warn of.
    let checked = poll_until(
        "the policy type-checked",
        Duration::from_secs(30),
        || async {
            let policy = kubectl(
                &plane,
                &[
                    "get",
                    "validatingadmissionpolicy",
                    "rdu-rdu-operator-device-plugin-own-node",
                    "-o",
                    "json",
                ],
                None,
            )
            .map_err(|e| e.to_string())?;
            let policy: serde_json::Value =
                serde_json::from_str(&policy).map_err(|e| e.to_string())?;
            let status = &policy["status"];
            if status["observedGeneration"] == policy["metadata"]["generation"]
                && !status["typeChecking"].is_null()
            {
                Ok(status["typeChecking"].clone())
            } else {
                Err(format!("status {status}"))
            }
        },
    )
    .await
    .expect("type checking");
    assert!(checked.get("expressionWarnings").is_none(), "{checked}");
    let annotator = KubeAnnotator::new(client.clone());
    annotator
        .annotate("ml", "mnist-worker-0", "rdu0-tile0,rdu0-tile1")
        .await
        .expect("the plugin may annotate a pod on its node");
    annotator
        .annotate("ml", "mnist-worker-0", "rdu2-tile0,rdu2-tile1")
        .await
        .expect("and rewrite the annotation");
    assert_eq!(tiles_of(&plane, "mnist-worker-0"), "rdu2-tile0,rdu2-tile1");

    for (pod, why) in [
        (
            "mnist-worker-1",
            "may not annotate pod mnist-worker-1 on node node-b",
        ),
        (
            "mnist-worker-2",
            "may not annotate pod mnist-worker-2, which is on no node",
        ),
    ] {
        let refused = annotator.annotate("ml", pod, "rdu0-tile0").await;
        let message = refused.expect_err("another node's pod").to_string();
        assert!(message.contains(why), "{message}");
        assert_eq!(tiles_of(&plane, pod), "");
    }
    let only_tiles = "may change only the rdu.dev/tiles annotation";
    for change in [
        r#"{"metadata": {"labels": {"app": "other"}}}"#,
        r#"{"metadata": {"labels": {"app": null}}}"#,
        r#"{"metadata": {"annotations": {"other": "1"}}}"#,
        r#"{"metadata": {"finalizers": ["example.com/keep"]}}"#,
        r#"{"spec": {"activeDeadlineSeconds": 5}}"#,
    ] {
        let refused = patch_as(&client, "mnist-worker-0", change, false)
            .await
            .expect_err("only the tiles annotation");
        assert!(
            refused.to_string().contains(only_tiles),
            "{change}: {refused}"
        );
    }

    // A token that names no node (not from a pod) is refused with the reason.
    let unbound = account_kubeconfig(&plane, PLUGIN);
    let client = rdu_e2e::kubeconfig::client(&unbound).await.expect("client");
    let refused = KubeAnnotator::new(client)
        .annotate("ml", "mnist-worker-0", "rdu0-tile0")
        .await
        .expect_err("no node in the token");
    assert!(
        refused.to_string().contains("token names no node"),
        "{refused}"
    );
    assert_eq!(tiles_of(&plane, "mnist-worker-0"), "rdu2-tile0,rdu2-tile1");

    let can = |verb: &str, resource: &str| can_i(&kubeconfig, verb, resource, "ml");
    assert!(can("patch", "pods"));
    for (verb, resource) in [
        ("get", "pods"),
        ("delete", "pods"),
        ("create", "pods"),
        ("get", "secrets"),
        ("patch", "rdujobs.rdu.dev"),
    ] {
        assert!(
            !can(verb, resource),
            "the device plugin must not be allowed to {verb} {resource}"
        );
    }
}

#[test]
fn helm_lint_is_clean() {
    let Some(_assets) = assets_or_skip("helm lint") else {
        return;
    };
    let chart = rdu_e2e::workspace_root().join("charts/rdu-operator");
    let out = rdu_e2e::tools::run_ok(
        &rdu_e2e::tools::helm_binary(),
        &["lint", "--strict", &chart.display().to_string()],
        None,
    )
    .expect("helm lint --strict");
    assert!(out.contains("0 chart(s) failed"), "{out}");
    assert!(
        !out.contains("[WARNING]") && !out.contains("[ERROR]"),
        "{out}"
    );
}

/// The operator container's args in the rendered chart.
fn operator_args(extra: &[&str]) -> Vec<String> {
    let docs = documents(&helm_template("rdu", NAMESPACE, extra).expect("helm template"));
    let deployment = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("Deployment"))
        .expect("the operator's Deployment");
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}

#[test]
fn the_job_size_limit_is_a_chart_value() {
    let Some(_assets) = assets_or_skip("chart maxWorkersPerJob") else {
        return;
    };
    let limit = |extra: &[&str]| {
        operator_args(extra)
            .into_iter()
            .filter(|a| a.starts_with("--max-workers-per-job="))
            .collect::<Vec<_>>()
    };
    assert_eq!(limit(&[]), ["--max-workers-per-job=1024"]);
    assert_eq!(
        limit(&["--set", "operator.maxWorkersPerJob=4096"]),
        ["--max-workers-per-job=4096"]
    );
}
