//! The `rdu-operator` binary without a reachable cluster: a clear message and a non-zero exit, never a hang.

use std::process::Command;

fn run_with_kubeconfig(path: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rdu-operator"))
        .args(["--metrics-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", path)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("binary runs")
}

#[test]
fn no_kubeconfig_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run_with_kubeconfig(&dir.path().join("missing"));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no Kubernetes cluster configured: set KUBECONFIG"),
        "{stderr}"
    );
}

#[test]
fn unreachable_api_server_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n\
         contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {token: t}}]\n",
    )
    .expect("write kubeconfig");
    let out = run_with_kubeconfig(&path);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot reach the Kubernetes API server"),
        "{stderr}"
    );
}
