//! The Helm chart renders, its objects are accepted by the API server (server-side dry run), and its
//! ClusterRole/Role grant exactly the operator's API use (COMMON contract), nothing more (a Role in the watched
//! namespace with `operator.watchNamespace`, names on the CRD and Lease rules), and the device plugin's role
//! exactly the pod annotation it writes, on its own node's pods only; RduJob roles for people aggregate into the
//! built-in `edit` and `view`; NetworkPolicies guard the release's own pods. With `devicePlugin.kubeletApi=dra`,
//! the DRA plugin's role and policy (`chart/dra.rs`).

#[path = "chart/dra.rs"]
mod dra;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use rdu_crds::consts::TILES_ANNOTATION;
use rdu_device_plugin::annotate::{KubeAnnotator, PodAnnotator};
use rdu_e2e::kit::{self, JobFixture};
use rdu_e2e::{
    Components, ControlPlane, SYSTEM_NAMESPACE as NAMESPACE, helm_template, kubectl, poll_until,
};
use serde_yaml_ng::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// (apiGroup, resource, verb, resource name: empty for any) tuples.
type Grants = BTreeSet<(String, String, String, String)>;

/// A rule as (apiGroup, resources, verbs, resourceNames: none for any).
type Rule<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);

fn grants(rules: &[Rule]) -> Grants {
    let mut set = Grants::new();
    for (group, resources, verbs, names) in rules {
        let names: Vec<&str> = if names.is_empty() {
            vec![""]
        } else {
            names.to_vec()
        };
        for r in *resources {
            for v in *verbs {
                for n in &names {
                    set.insert((
                        group.to_string(),
                        r.to_string(),
                        v.to_string(),
                        n.to_string(),
                    ));
                }
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
            let mut names = strings("resourceNames");
            if names.is_empty() {
                names.push(String::new());
            }
            for g in strings("apiGroups") {
                for r in strings("resources") {
                    for v in strings("verbs") {
                        for n in &names {
                            set.insert((g.clone(), r.clone(), v.clone(), n.clone()));
                        }
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

/// The operator's grants in the namespaces of its jobs (DESIGN 5.1).
const JOB_NAMESPACE_RULES: &[Rule] = &[
    ("rdu.dev", &["rdujobs"], &["list", "watch", "delete"], &[]),
    ("rdu.dev", &["rdujobs/status"], &["patch"], &[]),
    (
        "",
        &["pods"],
        &["list", "watch", "get", "create", "delete"],
        &[],
    ),
    (
        "",
        &["services"],
        &["list", "watch", "get", "create", "patch"],
        &[],
    ),
    // Secrets: a token Secret per generation created, the one before deleted; never read, listed or changed.
    ("", &["secrets"], &["create", "delete"], &[]),
    ("", &["persistentvolumeclaims"], &["get", "create"], &[]),
    (
        "resource.k8s.io",
        &["resourceclaimtemplates"],
        &["get", "create"],
        &[],
    ),
    (
        "networking.k8s.io",
        &["networkpolicies"],
        &["get", "create", "patch"],
        &[],
    ),
    ("events.k8s.io", &["events"], &["create", "patch"], &[]),
    (
        "scheduling.x-k8s.io",
        &["podgroups"],
        &["get", "create", "patch"],
        &[],
    ),
];

/// The operator's cluster-scoped grants, whatever it watches.
const CLUSTER_RULES: &[Rule] = &[
    // Nodes: which are lost, what room they have (DESIGN 5).
    ("", &["nodes"], &["list", "watch"], &[]),
    // Is the PodGroup CRD installed? That CRD only.
    (
        "apiextensions.k8s.io",
        &["customresourcedefinitions"],
        &["get"],
        &["podgroups.scheduling.x-k8s.io"],
    ),
    // Progress reports: who sent one (DESIGN 4.8).
    ("authentication.k8s.io", &["tokenreviews"], &["create"], &[]),
];

/// Every kind of role the rendered chart holds.
fn roles(docs: &[Value]) -> Vec<(String, String)> {
    docs.iter()
        .filter(|d| d["kind"].as_str().is_some_and(|k| k.ends_with("Role")))
        .map(|d| {
            let kind = d["kind"].as_str().unwrap_or_default().to_string();
            let name = d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (kind, name)
        })
        .collect()
}

#[test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
fn the_chart_grants_exactly_the_operators_api_use() {
    kit::require_assets("chart rbac");
    let docs = documents(&helm_template("rdu", NAMESPACE, &[]).expect("helm template"));
    let mut cluster = grants(JOB_NAMESPACE_RULES);
    cluster.extend(grants(CLUSTER_RULES));
    assert_eq!(
        rendered_grants(&docs, "ClusterRole", "rdu-rdu-operator"),
        cluster
    );
    // The device plugin's own role: only writing pods' `rdu.dev/tiles` annotation.
    assert_eq!(
        rendered_grants(&docs, "ClusterRole", "rdu-rdu-operator-device-plugin"),
        grants(&[("", &["pods"], &["patch"], &[])])
    );
    let mut expected_roles = [
        ("ClusterRole", "rdu-rdu-operator"),
        ("ClusterRole", "rdu-rdu-operator-device-plugin"),
        ("ClusterRole", "rdu-rdu-operator-edit"),
        ("ClusterRole", "rdu-rdu-operator-view"),
        ("Role", "rdu-rdu-operator-leader-election"),
    ];
    expected_roles.sort();
    let mut found = roles(&docs);
    found.sort();
    assert_eq!(
        found,
        expected_roles
            .iter()
            .map(|(k, n)| (k.to_string(), n.to_string()))
            .collect::<Vec<_>>()
    );
    // The Lease: any may be created (RBAC cannot name a create's object), only the operator's read and updated;
    // the leader labels its own pod.
    let lease = grants(&[
        ("coordination.k8s.io", &["leases"], &["create"], &[]),
        (
            "coordination.k8s.io",
            &["leases"],
            &["get", "update"],
            &["rdu-operator"],
        ),
        ("", &["pods"], &["patch"], &[]),
    ]);
    assert_eq!(
        rendered_grants(&docs, "Role", "rdu-rdu-operator-leader-election"),
        lease
    );
    let role = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("Role"))
        .unwrap();
    assert_eq!(role["metadata"]["namespace"].as_str(), Some(NAMESPACE));
    let other_lease = helm_template("rdu", NAMESPACE, &["--set", "operator.leaseName=elsewhere"])
        .expect("helm template");
    assert!(
        rendered_grants(
            &documents(&other_lease),
            "Role",
            "rdu-rdu-operator-leader-election"
        )
        .iter()
        .any(|(_, _, verb, name)| verb == "update" && name == "elsewhere")
    );
}

#[test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
fn operator_replicas_spread_over_nodes_unless_told_otherwise() {
    kit::require_assets("chart operator spread");
    let spread_of = |sets: &[&str]| {
        let docs = documents(&helm_template("rdu", NAMESPACE, sets).expect("helm template"));
        let deployment = docs
            .iter()
            .find(|d| d["kind"].as_str() == Some("Deployment"))
            .cloned()
            .expect("the operator's Deployment");
        deployment["spec"]["template"]["spec"]["topologySpreadConstraints"].clone()
    };
    assert!(spread_of(&[]).is_null(), "one replica needs no spread");
    let two = spread_of(&["--set", "operator.replicas=2"]);
    assert_eq!(two[0]["topologyKey"], "kubernetes.io/hostname", "{two:?}");
    assert_eq!(two[0]["whenUnsatisfiable"], "ScheduleAnyway", "{two:?}");
    assert_eq!(
        two[0]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"], "operator",
        "{two:?}"
    );
    let own = spread_of(&[
        "--set",
        "operator.replicas=2",
        "--set",
        "operator.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
    ]);
    assert_eq!(
        own[0]["topologyKey"], "topology.kubernetes.io/zone",
        "{own:?}"
    );
}

#[test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
fn a_watched_namespace_gets_a_role_and_the_cluster_role_keeps_only_what_is_cluster_scoped() {
    kit::require_assets("chart rbac watchNamespace");
    let docs = documents(
        &helm_template("rdu", NAMESPACE, &["--set", "operator.watchNamespace=ml"])
            .expect("helm template"),
    );
    assert_eq!(
        rendered_grants(&docs, "ClusterRole", "rdu-rdu-operator"),
        grants(CLUSTER_RULES)
    );
    assert_eq!(
        rendered_grants(&docs, "Role", "rdu-rdu-operator"),
        grants(JOB_NAMESPACE_RULES)
    );
    let in_ml = |kind: &str| {
        docs.iter().any(|d| {
            d["kind"].as_str() == Some(kind)
                && d["metadata"]["name"].as_str() == Some("rdu-rdu-operator")
                && d["metadata"]["namespace"].as_str() == Some("ml")
        })
    };
    assert!(in_ml("Role") && in_ml("RoleBinding"));
}

#[test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
fn rdujobs_roles_for_people_aggregate_into_the_built_in_ones() {
    kit::require_assets("chart aggregated roles");
    let docs = documents(&helm_template("rdu", NAMESPACE, &[]).expect("helm template"));
    let everything = [
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ];
    assert_eq!(
        rendered_grants(&docs, "ClusterRole", "rdu-rdu-operator-edit"),
        grants(&[("rdu.dev", &["rdujobs"], &everything, &[])])
    );
    assert_eq!(
        rendered_grants(&docs, "ClusterRole", "rdu-rdu-operator-view"),
        grants(&[(
            "rdu.dev",
            &["rdujobs", "rdujobs/status"],
            &["get", "list", "watch"],
            &[]
        )])
    );
    let label = |name: &str, key: &str| {
        docs.iter()
            .find(|d| d["metadata"]["name"].as_str() == Some(name))
            .and_then(|d| d["metadata"]["labels"][key].as_str().map(str::to_string))
    };
    let aggregate = |to: &str| format!("rbac.authorization.k8s.io/aggregate-to-{to}");
    assert_eq!(
        label("rdu-rdu-operator-edit", &aggregate("edit")).as_deref(),
        Some("true")
    );
    assert_eq!(
        label("rdu-rdu-operator-edit", &aggregate("admin")).as_deref(),
        Some("true")
    );
    assert_eq!(
        label("rdu-rdu-operator-view", &aggregate("view")).as_deref(),
        Some("true")
    );
    let without = documents(
        &helm_template(
            "rdu",
            NAMESPACE,
            &["--set", "rbac.aggregateToDefaultRoles=false"],
        )
        .expect("helm template"),
    );
    assert!(
        !roles(&without)
            .iter()
            .any(|(_, name)| name.ends_with("-edit") || name.ends_with("-view"))
    );
}

#[test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
fn the_release_namespace_has_network_policies_for_the_operator_and_the_plugin() {
    kit::require_assets("chart network policies");
    let policy = |docs: &[Value], name: &str| -> serde_json::Value {
        let found = docs.iter().find(|d| {
            d["kind"].as_str() == Some("NetworkPolicy")
                && d["metadata"]["name"].as_str() == Some(name)
        });
        serde_json::to_value(found.expect(name)).expect("json")
    };
    let docs = documents(&helm_template("rdu", NAMESPACE, &[]).expect("helm template"));
    let operator = policy(&docs, "rdu-rdu-operator-operator");
    assert_eq!(
        operator["spec"]["policyTypes"],
        serde_json::json!(["Ingress"])
    );
    assert_eq!(
        operator["spec"]["ingress"],
        serde_json::json!([{
            "ports": [{"port": "progress", "protocol": "TCP"}],
            "from": [{"podSelector": {"matchLabels": {"rdu.dev/rank": "0"}}, "namespaceSelector": {}}]
        }]),
        "by default only rank-0 pods, on the progress port"
    );
    let plugin = policy(&docs, "rdu-rdu-operator-device-plugin");
    assert_eq!(
        plugin["spec"]["ingress"],
        serde_json::json!([]),
        "nobody reads tile status"
    );
    assert_eq!(
        plugin["spec"]["policyTypes"],
        serde_json::json!(["Ingress"])
    );

    let scrapers = documents(
        &helm_template(
            "rdu",
            NAMESPACE,
            &[
                "--set",
                "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",
                "--set",
                "operator.watchNamespace=ml",
            ],
        )
        .expect("helm template"),
    );
    let monitoring =
        serde_json::json!([{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]);
    let operator = policy(&scrapers, "rdu-rdu-operator-operator");
    let ingress = operator["spec"]["ingress"].as_array().expect("rules");
    assert_eq!(
        ingress[0]["from"][0]["namespaceSelector"],
        serde_json::json!({"matchLabels": {"kubernetes.io/metadata.name": "ml"}}),
        "rank 0 of the watched namespace only"
    );
    assert_eq!(ingress[1]["ports"][0]["port"], "metrics");
    assert_eq!(ingress[1]["from"], monitoring);
    let plugin = policy(&scrapers, "rdu-rdu-operator-device-plugin");
    assert_eq!(plugin["spec"]["ingress"][0]["ports"][0]["port"], "status");
    assert_eq!(plugin["spec"]["ingress"][0]["from"], monitoring);
    let none = documents(
        &helm_template("rdu", NAMESPACE, &["--set", "networkPolicy.system=false"])
            .expect("helm template"),
    );
    assert!(
        !none
            .iter()
            .any(|d| d["kind"].as_str() == Some("NetworkPolicy"))
    );
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn the_rendered_chart_is_accepted_by_the_api_server() {
    let plane = plane_with_namespaces("chart dry run", Components::default())
        .namespaces(&["default"])
        .start()
        .await;

    let kind_values = rdu_e2e::workspace_root().join("e2e/kind/values.yaml");
    let kind_values = kind_values.display().to_string();
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
        vec!["--set", "devicePlugin.kubeletApi=dra"],
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
            "NetworkPolicy",
        ] {
            assert!(kinds.contains(kind), "{extra:?}: no {kind} in {kinds:?}");
        }
        if extra.contains(&"devicePlugin.kubeletApi=dra") {
            assert!(kinds.contains("DeviceClass"), "{kinds:?}");
        }
        let out = kubectl(
            &plane,
            &["apply", "--server-side", "--dry-run=server", "-f", "-"],
            Some(&rendered),
        )
        .unwrap_or_else(|e| panic!("{extra:?}: refused: {}", rdu_error_chain::Chain(&e)));
        assert!(
            out.contains("deployment.apps/rdu-rdu-operator serverside-applied (server dry run)"),
            "{out}"
        );
    }
}

/// A control plane with the CRD and the namespaces `rdu-system` and `ml`.
fn plane_with_namespaces(test: &str, components: Components) -> kit::PlaneBuilder {
    kit::plane(test)
        .components(components)
        .namespaces(&[NAMESPACE, "ml"])
}

/// [`plane_with_namespaces`] with the chart applied.
async fn plane_with_chart(test: &str, components: Components) -> ControlPlane {
    plane_with_namespaces(test, components)
        .start_with_chart()
        .await
}

/// A kubeconfig authenticating as the chart's ServiceAccount `account`.
fn account_kubeconfig(plane: &ControlPlane, account: &str) -> PathBuf {
    let token = rdu_e2e::service_account_token(plane, NAMESPACE, account).expect("token");
    assert!(
        token_lifetime_seconds(&token) >= 23 * 3600,
        "a harness token must outlive a long soak (the Kueue manager keeps one for the whole run)"
    );
    plane
        .write_kubeconfig(account, account, &token, NAMESPACE)
        .expect("kubeconfig")
}

/// `exp - iat` of a JWT, as the API server issued it.
fn token_lifetime_seconds(token: &str) -> i64 {
    use base64::Engine as _;
    let payload = token.split('.').nth(1).expect("a JWT has a payload");
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64url claims");
    let claims: serde_json::Value = serde_json::from_slice(&claims).expect("JSON claims");
    claims["exp"].as_i64().expect("exp") - claims["iat"].as_i64().expect("iat")
}

/// A kubeconfig with `account`'s token as the kubelet mounts it: bound to pod `pod` (in the system namespace),
/// so that the token names the pod's node.
fn bound_kubeconfig(plane: &ControlPlane, account: &str, pod: &str, name: &str) -> PathBuf {
    let token = kubectl(
        plane,
        &[
            "create",
            "token",
            account,
            "-n",
            NAMESPACE,
            "--duration=1h",
            "--bound-object-kind=Pod",
            &format!("--bound-object-name={pod}"),
        ],
        None,
    )
    .expect("a token bound to the pod");
    plane
        .write_kubeconfig(name, account, token.trim(), NAMESPACE)
        .expect("kubeconfig")
}

/// The `status.typeChecking` of ValidatingAdmissionPolicy `policy`, once the controller checked its generation.
async fn type_checking(plane: &ControlPlane, policy: &str) -> serde_json::Value {
    poll_until(
        "the policy type-checked",
        Duration::from_secs(30),
        || async {
            let policy = kubectl(
                plane,
                &["get", "validatingadmissionpolicy", policy, "-o", "json"],
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
    .expect("type checking")
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
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn the_charts_service_account_may_do_what_the_operator_does_and_no_more() {
    let plane = plane_with_chart("chart service account", Components::default()).await;
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
    // RBAC lets it delete Secrets (a job's old token Secrets); the chart's admission policy confines that to Secrets
    // an RduJob controls.
    assert!(can("delete", "secrets", "ml"));
    kubectl(
        &plane,
        &[
            "create",
            "secret",
            "generic",
            "web",
            "-n",
            "ml",
            "--from-literal=password=web",
        ],
        None,
    )
    .expect("an admin's Secret");
    let refused = rdu_e2e::kubectl_in(&kubeconfig, &["delete", "secret", "web", "-n", "ml"], None)
        .expect("kubectl");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("deletes only Secrets an RduJob controls"),
        "{said}"
    );
    kubectl(&plane, &["get", "secret", "web", "-n", "ml"], None)
        .expect("the Secret is still there");
    let named = |verb: &str, resource: &str, name: &str| {
        let object = format!("{resource}/{name}");
        let args = ["auth", "can-i", verb, object.as_str(), "-n", NAMESPACE];
        let out = rdu_e2e::kubectl_in(&kubeconfig, &args, None).expect("kubectl");
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    let crds = "customresourcedefinitions.apiextensions.k8s.io";
    assert!(named("get", crds, "podgroups.scheduling.x-k8s.io"));
    assert!(!named("get", crds, "rdujobs.rdu.dev"), "that CRD only");
    let leases = "leases.coordination.k8s.io";
    assert!(named("update", leases, "rdu-operator"), "its own Lease");
    assert!(named("get", leases, "rdu-operator"), "its own Lease");
    assert!(can("create", leases, NAMESPACE));
    assert!(!named("update", leases, "kube-scheduler"), "no other Lease");
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
        ("get", "secrets", "ml"),
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

/// `kubectl auth can-i` as the admin impersonating `user`.
fn user_can(plane: &ControlPlane, user: &str, verb: &str, resource: &str, namespace: &str) -> bool {
    let args = [
        "auth", "can-i", verb, resource, "-n", namespace, "--as", user,
    ];
    let out = rdu_e2e::kubectl_in(&plane.admin_kubeconfig, &args, None).expect("kubectl");
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn a_team_bound_to_edit_may_run_rdujobs_and_one_bound_to_view_may_only_read_them() {
    // The controller manager fills the built-in roles from the chart's aggregated ones.
    let components = Components {
        controller_manager: true,
        ..Components::default()
    };
    let plane = plane_with_chart("chart aggregated roles", components).await;
    for (binding, role, user) in [("alice-edit", "edit", "alice"), ("bob-view", "view", "bob")] {
        let role = format!("--clusterrole={role}");
        let user = format!("--user={user}");
        kubectl(
            &plane,
            &["create", "rolebinding", binding, &role, &user, "-n", "ml"],
            None,
        )
        .expect("rolebinding");
    }
    let rdujobs = "rdujobs.rdu.dev";
    poll_until(
        "edit aggregates RduJobs",
        Duration::from_secs(30),
        || async {
            if user_can(&plane, "alice", "create", rdujobs, "ml") {
                Ok(())
            } else {
                Err("alice may not create rdujobs yet".to_string())
            }
        },
    )
    .await
    .expect("aggregated into edit");
    poll_until(
        "view aggregates RduJobs",
        Duration::from_secs(30),
        || async {
            if user_can(&plane, "bob", "watch", rdujobs, "ml") {
                Ok(())
            } else {
                Err("bob may not watch rdujobs yet".to_string())
            }
        },
    )
    .await
    .expect("aggregated into view");
    assert!(user_can(&plane, "alice", "delete", rdujobs, "ml"));
    assert!(user_can(
        &plane,
        "bob",
        "get",
        "rdujobs.rdu.dev/status",
        "ml"
    ));
    assert!(!user_can(&plane, "bob", "create", rdujobs, "ml"));
    assert!(!user_can(&plane, "bob", "delete", rdujobs, "ml"));
    assert!(
        !user_can(&plane, "alice", "create", rdujobs, NAMESPACE),
        "only where bound"
    );
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn an_operator_watching_one_namespace_runs_its_jobs_with_a_role_there() {
    let (plane, _) = plane_with_namespaces("chart watchNamespace", Components::default())
        .namespaces(&["elsewhere"])
        .chart_values(&["--set", "operator.watchNamespace=ml"])
        .operator_flags(&["--namespace=ml"])
        .start_operator()
        .await;
    let job = |namespace: &str| JobFixture::new(namespace, "scoped").manifest();
    for namespace in ["elsewhere", "ml"] {
        kit::apply(&plane, &job(namespace)).expect("apply");
    }
    let client = plane.admin_client().await.expect("client");
    let pods = |namespace: &str| Api::<Pod>::namespaced(client.clone(), namespace);
    let selector = kube::api::ListParams::default().labels("rdu.dev/job-name=scoped");
    poll_until(
        "the watched job's pods and status",
        Duration::from_secs(90),
        || async {
            let created = pods("ml")
                .list(&selector)
                .await
                .map_err(|e| e.to_string())?;
            let jobs: Api<rdu_crds::RduJob> = Api::namespaced(client.clone(), "ml");
            let phase = jobs
                .get("scoped")
                .await
                .map_err(|e| e.to_string())?
                .status
                .and_then(|s| s.phase);
            match (created.items.len(), phase) {
                (2, Some(_)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{}\n{}",
            rdu_error_chain::Chain(&e),
            plane.log_tail("rdu-operator", 40)
        )
    });
    let log = plane.log_tail("rdu-operator", 400);
    assert!(!log.contains("forbidden"), "the Role is enough:\n{log}");
    let elsewhere = pods("elsewhere").list(&selector).await.expect("list");
    assert!(
        elsewhere.items.is_empty(),
        "another namespace is not its business"
    );
    let kubeconfig = account_kubeconfig(&plane, "rdu-rdu-operator");
    assert!(can_i(&kubeconfig, "create", "pods", "ml"));
    assert!(!can_i(&kubeconfig, "create", "pods", "elsewhere"));
    assert!(!can_i(&kubeconfig, "get", "secrets", "elsewhere"));
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
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn the_device_plugin_may_only_annotate_pods_on_its_own_node() {
    let plane = plane_with_chart(
        "device plugin service account",
        // With the controller that type-checks the policy.
        Components {
            controller_manager: true,
            ..Components::default()
        },
    )
    .await;
    const PLUGIN: &str = "rdu-rdu-operator-device-plugin";
    for node in ["node-a", "node-b"] {
        let node =
            format!(r#"{{"apiVersion": "v1", "kind": "Node", "metadata": {{"name": "{node}"}}}}"#);
        kit::apply(&plane, &node).expect("a node");
    }
    for (name, namespace, node, account) in [
        ("plugin-a", NAMESPACE, "node-a", PLUGIN),
        ("mnist-worker-0", "ml", "node-a", "default"),
        ("mnist-worker-1", "ml", "node-b", "default"),
        ("mnist-worker-2", "ml", "", "default"),
    ] {
        let pod = pod_on(name, namespace, node, account);
        kit::apply(&plane, &pod).expect("a pod");
    }
    let kubeconfig = bound_kubeconfig(&plane, PLUGIN, "plugin-a", "plugin-on-node-a");
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
                Err(refused) if rdu_error_chain::chain(&refused).contains("may not annotate") => {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .expect("policy in force");
    // The API server type-checks the policy's CEL against the Pod schema; it must find nothing to warn of.
    let checked = type_checking(&plane, "rdu-rdu-operator-device-plugin-own-node").await;
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
        let message = rdu_error_chain::chain(&refused.expect_err("another node's pod"));
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
    let refused = rdu_error_chain::chain(&refused);
    assert!(refused.contains("token names no node"), "{refused}");
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
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
fn helm_lint_is_clean() {
    kit::require_assets("helm lint");
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
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
fn the_job_size_limit_is_a_chart_value() {
    kit::require_assets("chart maxWorkersPerJob");
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

#[test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
fn the_pod_policy_is_chart_values_the_operator_and_the_admission_policy_share() {
    kit::require_assets("chart podPolicy");
    let policy_args = |extra: &[&str]| {
        operator_args(extra)
            .into_iter()
            .filter(|a| a.starts_with("--pod-policy-"))
            .collect::<Vec<_>>()
    };
    assert_eq!(policy_args(&[]), Vec::<String>::new(), "strict by default");
    assert_eq!(
        policy_args(&[
            "--set",
            "podPolicy.allow.hostPath=true",
            "--set",
            "podPolicy.allow.secrets=true",
            "--set",
            "podPolicy.serviceAccounts={trainer,default}",
            "--set",
            "podPolicy.runtimeClasses={kata}",
        ]),
        [
            "--pod-policy-allow=hostPath,secrets",
            "--pod-policy-service-accounts=trainer,default",
            "--pod-policy-runtime-classes=kata",
        ]
    );
    let kinds = |extra: &[&str]| -> Vec<String> {
        documents(&helm_template("rdu", NAMESPACE, extra).expect("helm template"))
            .iter()
            .filter(|d| d["metadata"]["name"].as_str() == Some("rdu-rdu-operator-pod-policy"))
            .filter_map(|d| d["kind"].as_str().map(str::to_string))
            .collect()
    };
    assert_eq!(
        kinds(&[]),
        [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
    assert_eq!(
        kinds(&["--set", "podPolicy.admission=false"]),
        Vec::<String>::new()
    );
}

#[test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
fn with_kueue_every_job_is_queued_unless_the_chart_says_otherwise() {
    kit::require_assets("chart kueue.manageJobsWithoutQueueName");
    let queue_args = |extra: &[&str]| {
        operator_args(extra)
            .into_iter()
            .filter(|a| a.starts_with("--kueue"))
            .collect::<Vec<_>>()
    };
    assert_eq!(queue_args(&[]), ["--kueue=false"]);
    assert_eq!(
        queue_args(&["--set", "kueue.enabled=true"]),
        ["--kueue=true", "--kueue-default-queue=default"]
    );
    assert_eq!(
        queue_args(&[
            "--set",
            "kueue.enabled=true",
            "--set",
            "kueue.manageJobsWithoutQueueName=false"
        ]),
        ["--kueue=true"]
    );
}
