//! The `rdu-device-plugin` binary: flags, registration with a kubelet double, status endpoint,
//! and a clean exit on SIGTERM that removes its socket.

use rdu_device_plugin::kubelet_double::KubeletDouble;
use rdu_tiles::tilestat::fetch;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn binary_registers_serves_status_and_exits_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut kubelet = KubeletDouble::start(dir.path()).unwrap();
    // Reserve a free loopback port for the status endpoint.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rdu-device-plugin"))
        .args(["--device-plugin-dir", dir.path().to_str().unwrap()])
        .args(["--rdus-per-node", "4", "--tiles-per-rdu", "8"])
        .args(["--node-name", "sim-node-1"])
        .args(["--status-addr", &format!("127.0.0.1:{port}")])
        .args([
            "--checkpoint-file",
            state.path().join("alloc.json").to_str().unwrap(),
        ])
        .args(["--pod-resources-socket", "off"])
        .args([
            "--health-file",
            state.path().join("unhealthy").to_str().unwrap(),
        ])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let registration = kubelet
        .next_registration(DEADLINE)
        .await
        .expect("the binary registers");
    assert_eq!(registration.resource_name, "rdu.dev/tile");
    let socket = dir.path().join(&registration.endpoint);
    assert!(socket.exists());

    // The status endpoint may start a moment after registration: poll it with a deadline.
    let url = format!("http://127.0.0.1:{port}/status");
    let started = Instant::now();
    let status = loop {
        match fetch(&url).await {
            Ok(status) => break status,
            Err(e) if started.elapsed() < DEADLINE => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("status endpoint never answered: {e}"),
        }
    };
    assert_eq!(status.node.as_deref(), Some("sim-node-1"));
    assert_eq!(status.tiles_total, 32);
    assert_eq!(status.tiles_healthy, 32);

    // Fault injection through the health file shows in the status.
    std::fs::write(state.path().join("unhealthy"), "rdu2\n").unwrap();
    let started = Instant::now();
    loop {
        let status = fetch(&url).await.unwrap();
        if status.tiles_healthy == 24 {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "health file not applied: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let exit = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Some((status, child));
            }
            if started.elapsed() > DEADLINE {
                let _ = child.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    })
    .await
    .unwrap();
    let (status, mut child) = exit.expect("the binary exits after SIGTERM");
    assert!(status.success(), "exit status {status}");
    assert!(!socket.exists(), "socket removed on SIGTERM");
    let logs: Vec<String> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .collect();
    assert!(
        logs.iter()
            .any(|l| l.contains("registered with the kubelet")),
        "{logs:?}"
    );
    assert!(logs.iter().any(|l| l.contains("SIGTERM")), "{logs:?}");
}
