//! A control plane set up the way the control-plane tests need it: the CRD, namespaces, optionally the PodGroup
//! CRD and the chart's manifests, and the operator binary running as the chart's ServiceAccount.

use crate::assets::Assets;
use crate::cluster::{
    CHART_RELEASE, ClusterError, OperatorAddrs, SYSTEM_NAMESPACE, create_namespace, install_crd,
    kubectl, start_operator_as_chart,
};
use crate::control_plane::{Components, ControlPlane};
use crate::tools::{helm_template, workspace_root};

/// The control plane's binaries, or a panic naming what is missing. Only `#[ignore]`d tests call it: run
/// explicitly (`bash e2e/control-plane/run.sh`, or `cargo test -- --ignored`), a test must not pass by skipping.
pub fn require_assets(test: &str) -> Assets {
    Assets::from_env().unwrap_or_else(|e| panic!("{test}: {}", rdu_error_chain::Chain(&e)))
}

/// The operator flag that turns on progress reports, at the URL of the chart's progress Service.
pub fn progress_url_flag() -> String {
    format!(
        "--progress-url=http://{CHART_RELEASE}-rdu-operator-progress.{SYSTEM_NAMESPACE}.svc:8081"
    )
}

/// `kubectl apply -f -` of `manifest` (YAML or JSON) as the admin; stdout, or the refusal.
pub fn apply(plane: &ControlPlane, manifest: &str) -> Result<String, ClusterError> {
    kubectl(plane, &["apply", "-f", "-"], Some(manifest))
}

/// Starts describing a control plane for `test` (named in panics): etcd and kube-apiserver only, no namespace.
pub fn plane(test: &str) -> PlaneBuilder {
    PlaneBuilder {
        test: test.to_string(),
        components: Components::default(),
        namespaces: Vec::new(),
        pod_group_crd: false,
        chart_values: Vec::new(),
        operator_flags: Vec::new(),
    }
}

/// What to start; see [`plane`].
#[derive(Debug, Clone)]
#[must_use = "nothing starts until `start`, `start_with_chart` or `start_operator`"]
pub struct PlaneBuilder {
    test: String,
    components: Components,
    namespaces: Vec<String>,
    pod_group_crd: bool,
    chart_values: Vec<String>,
    operator_flags: Vec<String>,
}

impl PlaneBuilder {
    /// Which control-plane components run besides etcd and kube-apiserver.
    pub fn components(mut self, components: Components) -> Self {
        self.components = components;
        self
    }

    /// kube-controller-manager too (garbage collector, ServiceAccount tokens, aggregated roles).
    pub fn controller_manager(mut self) -> Self {
        self.components.controller_manager = true;
        self
    }

    /// kube-scheduler too.
    pub fn scheduler(mut self) -> Self {
        self.components.scheduler = true;
        self
    }

    /// Namespaces to create (each with its `default` ServiceAccount), in this order.
    pub fn namespaces(mut self, names: &[&str]) -> Self {
        self.namespaces.extend(names.iter().map(|n| n.to_string()));
        self
    }

    /// Applies `e2e/fixtures/podgroup-crd.yaml` (scheduler-plugins' PodGroup) and waits until it is Established,
    /// before the operator starts, so that gang jobs get a PodGroup.
    pub fn pod_group_crd(mut self) -> Self {
        self.pod_group_crd = true;
        self
    }

    /// `helm template` arguments (`--set`, `x=y`) for the chart's manifests.
    pub fn chart_values(mut self, values: &[&str]) -> Self {
        self.chart_values
            .extend(values.iter().map(|v| v.to_string()));
        self
    }

    /// Extra flags for the operator binary.
    pub fn operator_flags(mut self, flags: &[&str]) -> Self {
        self.operator_flags
            .extend(flags.iter().map(|f| f.to_string()));
        self
    }

    /// The control plane with the CRD installed, the namespaces created and, if asked, the PodGroup CRD.
    pub async fn start(self) -> ControlPlane {
        let assets = require_assets(&self.test);
        let test = &self.test;
        let plane = ControlPlane::start(&assets, self.components)
            .await
            .unwrap_or_else(|e| panic!("{test}: control plane: {}", rdu_error_chain::Chain(&e)));
        install_crd(&plane)
            .await
            .unwrap_or_else(|e| panic!("{test}: CRD: {}", rdu_error_chain::Chain(&e)));
        for namespace in &self.namespaces {
            create_namespace(&plane, namespace)
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "{test}: namespace {namespace}: {}",
                        rdu_error_chain::Chain(&e)
                    )
                });
        }
        if self.pod_group_crd {
            install_pod_group_crd(&plane)
                .unwrap_or_else(|e| panic!("{test}: PodGroup CRD: {}", rdu_error_chain::Chain(&e)));
        }
        plane
    }

    /// [`start`](Self::start), with the system namespace, and the chart's manifests (RBAC, Services,
    /// NetworkPolicies; rendered with the chart values) applied server-side in it; no operator runs.
    pub async fn start_with_chart(self) -> ControlPlane {
        let test = self.test.clone();
        let values = self.chart_values.clone();
        let plane = self.with_system_namespace().start().await;
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        let rendered = helm_template(CHART_RELEASE, SYSTEM_NAMESPACE, &values)
            .unwrap_or_else(|e| panic!("{test}: helm template: {}", rdu_error_chain::Chain(&e)));
        kubectl(
            &plane,
            &["apply", "--server-side", "-f", "-"],
            Some(&rendered),
        )
        .unwrap_or_else(|e| panic!("{test}: the chart applies: {}", rdu_error_chain::Chain(&e)));
        plane
    }

    /// [`start`](Self::start), with the system namespace, the chart's manifests, and the operator binary running
    /// as the chart's ServiceAccount (log `rdu-operator`); returns the plane and the operator's addresses
    /// (/metrics, /healthz, /readyz; progress).
    pub async fn start_operator(self) -> (ControlPlane, OperatorAddrs) {
        let test = self.test.clone();
        let (values, flags) = (self.chart_values.clone(), self.operator_flags.clone());
        let mut plane = self.with_system_namespace().start().await;
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let addrs = start_operator_as_chart(&mut plane, SYSTEM_NAMESPACE, &values, &flags)
            .unwrap_or_else(|e| {
                panic!(
                    "{test}: the operator starts: {}",
                    rdu_error_chain::Chain(&e)
                )
            });
        (plane, addrs)
    }

    /// The system namespace first, unless the test listed it.
    fn with_system_namespace(mut self) -> Self {
        if !self.namespaces.iter().any(|n| n == SYSTEM_NAMESPACE) {
            self.namespaces.insert(0, SYSTEM_NAMESPACE.to_string());
        }
        self
    }
}

/// Applies the PodGroup CRD and waits until the API server has established it.
fn install_pod_group_crd(plane: &ControlPlane) -> Result<(), ClusterError> {
    let path = workspace_root().join("e2e/fixtures/podgroup-crd.yaml");
    kubectl(plane, &["apply", "-f", &path.display().to_string()], None)?;
    kubectl(
        plane,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/podgroups.scheduling.x-k8s.io",
        ],
        None,
    )?;
    Ok(())
}
