//! `rdujob` stays free of the cluster stack: its normal dependency tree has no Kubernetes client, controller
//! runtime, HTTP server framework or file watcher (they belong to the operator and the device plugin).

use std::process::Command;

const FORBIDDEN: [&str; 4] = ["kube-runtime", "kube-client", "axum", "notify"];

#[test]
fn rdujob_depends_on_no_client_server_or_watcher() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(["tree", "-p", "rdujob", "-e", "normal", "--prefix", "none"])
        .args(["--locked", "--offline", "--manifest-path", manifest])
        .output()
        .expect("cargo tree runs");
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(tree.lines().any(|l| l.starts_with("rdu-crds ")), "{tree}");
    let crates: Vec<&str> = tree.lines().filter_map(|l| l.split(' ').next()).collect();
    let found: Vec<&&str> = FORBIDDEN.iter().filter(|f| crates.contains(f)).collect();
    assert!(found.is_empty(), "rdujob depends on {found:?}:\n{tree}");
}
