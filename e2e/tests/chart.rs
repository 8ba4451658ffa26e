//! The Helm chart renders, its objects are accepted by the API server (server-side dry run), and its
//! ClusterRole/Role grant exactly the operator's API use (COMMON contract), nothing more, and the device plugin's
//! role exactly the pod annotation it writes.

use rdu_device_plugin::annotate::{KubeAnnotator, PodAnnotator};
use rdu_e2e::{
    Components, ControlPlane, assets_or_skip, create_namespace, helm_template, install_crd, kubectl,
};
use serde_yaml_ng::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

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
        (
            "",
            &["pods"],
            &["list", "watch", "create", "patch", "delete"],
        ),
        ("", &["services"], &["list", "watch", "create", "patch"]),
        ("", &["secrets"], &["get", "create", "patch"]),
        (
            "networking.k8s.io",
            &["networkpolicies"],
            &["create", "patch"],
        ),
        ("events.k8s.io", &["events"], &["create", "patch"]),
        ("scheduling.x-k8s.io", &["podgroups"], &["create", "patch"]),
        (
            "apiextensions.k8s.io",
            &["customresourcedefinitions"],
            &["get"],
        ),
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
    let Some(plane) = plane_with_namespaces("chart dry run").await else {
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
async fn plane_with_namespaces(test: &str) -> Option<ControlPlane> {
    let assets = assets_or_skip(test)?;
    let plane = ControlPlane::start(&assets, Components::default())
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
async fn plane_with_chart(test: &str) -> Option<ControlPlane> {
    let plane = plane_with_namespaces(test).await?;
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
    let Some(plane) = plane_with_chart("chart service account").await else {
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
        ("create", "events.events.k8s.io"),
        ("patch", "networkpolicies.networking.k8s.io"),
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
        ("update", "pods/status", "ml"),
        ("create", "pods/exec", "ml"),
        ("update", "rdujobs.rdu.dev/status", "ml"),
        ("list", "nodes", NAMESPACE),
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
        ("deletecollection", "pods", "ml"),
        ("update", "rdujobs.rdu.dev", "ml"),
    ] {
        assert!(
            !can(verb, resource, namespace),
            "the operator must not be allowed to {verb} {resource} in {namespace}"
        );
    }
}

#[tokio::test]
async fn the_device_plugin_may_only_annotate_pods_and_its_annotator_works_under_that_role() {
    let Some(plane) = plane_with_chart("device plugin service account").await else {
        return;
    };
    let pod = r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mnist-worker-0", "namespace": "ml"},
        "spec": {"containers": [{"name": "worker", "image": "rdu-worker"}]}}"#;
    kubectl(&plane, &["apply", "-f", "-"], Some(pod)).expect("a rank pod");

    let kubeconfig = account_kubeconfig(&plane, "rdu-rdu-operator-device-plugin");
    let client = rdu_e2e::kubeconfig::client(&kubeconfig)
        .await
        .expect("client");
    let annotator = KubeAnnotator::new(client);
    annotator
        .annotate("ml", "mnist-worker-0", "rdu0-tile0,rdu0-tile1")
        .await
        .expect("the plugin's role allows the annotation");
    annotator
        .annotate("ml", "mnist-worker-0", "rdu2-tile0,rdu2-tile1")
        .await
        .expect("and rewriting it");
    let written = kubectl(
        &plane,
        &[
            "get",
            "pod",
            "mnist-worker-0",
            "-n",
            "ml",
            "-o",
            "jsonpath={.metadata.annotations.rdu\\.dev/tiles}",
        ],
        None,
    )
    .expect("read back");
    assert_eq!(written.trim(), "rdu2-tile0,rdu2-tile1");

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
