//! Harness for the real control-plane tests: starts etcd and kube-apiserver (and, when a test needs them,
//! kube-scheduler and kube-controller-manager) from `KUBEBUILDER_ASSETS`, the envtest convention, and
//! gives tests a kubeconfig, a kube client, kubectl, helm and the operator binary; and kind clusters with real
//! nodes (`kind`), the images of `docker/Dockerfile` loaded and the chart installed (`testbed`).
//! The control-plane tests share `kit`; the tests with real nodes share `testbed`; the three-node test and the
//! soak of random faults (`soak`) share the cluster `three_nodes` starts.
//!
//! Every test that needs these binaries is `#[ignore]`d: `cargo test` lists it as ignored, and the scripts that
//! run it (`e2e/control-plane/run.sh`, `e2e/node/run.sh`, `e2e/multi-node/run.sh`) pass `--ignored`, where a
//! missing binary fails the test.

pub mod all_reduce_bench;
pub mod assets;
pub mod checkpoints;
pub mod cluster;
pub mod control_plane;
pub mod kind;
pub mod kit;
pub mod kubeconfig;
pub mod kueue;
pub mod local_mode;
pub mod logs;
pub mod metrics;
pub mod pki;
pub mod poll;
pub mod ports;
pub mod process;
pub mod soak;
pub mod testbed;
pub mod three_nodes;
pub mod tools;

pub use assets::{Assets, AssetsError};
pub use cluster::{
    CHART_RELEASE, ClusterError, OperatorAddrs, SYSTEM_NAMESPACE, create_namespace, install_crd,
    kubectl, kubectl_as, service_account_token, start_operator_as_chart,
};
pub use control_plane::{Components, ControlPlane, ControlPlaneError};
pub use metrics::{MetricsError, Sample};
pub use poll::{PollError, poll_until, poll_while_progressing};
pub use tools::{ToolError, helm_template, kubectl_in, operator_binary, workspace_root};
