use super::*;
use serde_json::json;

fn node(name: &str, ready: &str, extra: serde_json::Value) -> Node {
    let mut value = json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {
            "conditions": [{"type": "Ready", "status": ready}],
            "allocatable": {"rdu.dev/tile": "4"}
        }
    });
    merge(&mut value, extra);
    serde_json::from_value(value).expect("node")
}

fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
    match (base, extra) {
        (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}

fn pod(node: &str, tiles: u32, phase: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("p-{node}-{tiles}")},
        "spec": {"nodeName": node, "containers": [{"name": "worker",
            "resources": {"requests": {"rdu.dev/tile": tiles.to_string()}, "limits": {"rdu.dev/tile": tiles.to_string()}}}]},
        "status": {"phase": phase}
    }))
    .expect("pod")
}

fn needs(count: u64) -> RankNeeds {
    RankNeeds {
        resource: "rdu.dev/tile".into(),
        count,
        ..RankNeeds::default()
    }
}

#[test]
fn lost_nodes_are_unreachable_out_of_service_or_gone() {
    let taint = json!({"spec": {"taints": [{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]}});
    let cases = [
        (Some(node("a", "True", json!({}))), None),
        (Some(node("a", "False", json!({}))), None),
        (
            Some(node("a", "Unknown", json!({}))),
            Some(Loss::Unreachable),
        ),
        (
            Some(node("a", "True", taint.clone())),
            Some(Loss::OutOfService),
        ),
        (Some(node("a", "Unknown", taint)), Some(Loss::OutOfService)),
        (None, Some(Loss::Deleted)),
    ];
    for (node, want) in cases {
        assert_eq!(loss(node.as_ref()), want, "{node:?}");
    }
    assert!(
        Loss::Unreachable
            .describe("n1")
            .contains("node n1 is unreachable")
    );
}

#[test]
fn room_counts_free_devices_per_eligible_node() {
    let nodes = [
        node("n1", "True", json!({})),
        node("n2", "True", json!({})),
        node("n3", "Unknown", json!({})),
        node("n4", "True", json!({"spec": {"unschedulable": true}})),
        node("n5", "False", json!({})),
    ];
    let pods = [
        pod("n1", 1, "Running"),
        pod("n1", 1, "Pending"),
        pod("n1", 1, "Succeeded"), // done: holds nothing
        pod("n2", 3, "Running"),
        pod("n3", 4, "Running"),
    ];
    let room = room(&needs(1), &nodes, &pods);
    assert_eq!(
        room.by_node,
        BTreeMap::from([("n1".into(), 2), ("n2".into(), 1)])
    );
    assert_eq!(room.ranks(), 3);
    assert_eq!(room.largest, 4);
    assert!(room.offered);
    let bare = [node(
        "b",
        "True",
        json!({"status": {"allocatable": {"rdu.dev/tile": "0"}}}),
    )];
    assert!(!super::room(&needs(1), &bare, &pods).offered);
    assert_eq!(
        room.excluded,
        BTreeMap::from([
            ("n3".into(), "unreachable".into()),
            ("n4".into(), "cordoned".into()),
            ("n5".into(), "not ready".into()),
        ])
    );
    assert_eq!(
        room.describe(),
        "n1 room for 2, n2 room for 1 (n3 unreachable; n4 cordoned; n5 not ready)"
    );
    // Two devices per rank: n1 has 2 free (one rank), n2 one (none).
    assert_eq!(super::room(&needs(2), &nodes, &pods).ranks(), 1);
}

#[test]
fn taints_and_selectors_leave_nodes_out_unless_tolerated_or_matched() {
    let tainted = node(
        "t",
        "True",
        json!({"spec": {"taints": [{"key": "rdu.dev/tile", "effect": "NoSchedule"}]}}),
    );
    let prefer = node(
        "p",
        "True",
        json!({"spec": {"taints": [{"key": "x", "effect": "PreferNoSchedule"}]}}),
    );
    let plain = needs(1);
    let r = room(&plain, [&tainted, &prefer], []);
    assert_eq!(r.excluded["t"], "tainted rdu.dev/tile:NoSchedule");
    assert_eq!(r.by_node["p"], 4, "PreferNoSchedule does not exclude");
    let tolerant = RankNeeds {
        tolerations: vec![Toleration {
            key: Some("rdu.dev/tile".into()),
            operator: Some("Exists".into()),
            ..Toleration::default()
        }],
        ..needs(1)
    };
    assert_eq!(room(&tolerant, [&tainted], []).by_node["t"], 4);
    let selective = RankNeeds {
        node_selector: BTreeMap::from([("pool".into(), "rdu".into())]),
        ..needs(1)
    };
    let r = room(&selective, [&prefer], []);
    assert_eq!(r.excluded["p"], "not selected (nodeSelector pool)");
}

#[test]
fn tolerations_match_as_kubernetes_matches_them() {
    let taint = Taint {
        key: "k".into(),
        value: Some("v".into()),
        effect: "NoSchedule".into(),
        ..Taint::default()
    };
    let tol = |key: Option<&str>, op: Option<&str>, value: Option<&str>, effect: Option<&str>| {
        Toleration {
            key: key.map(str::to_string),
            operator: op.map(str::to_string),
            value: value.map(str::to_string),
            effect: effect.map(str::to_string),
            toleration_seconds: None,
        }
    };
    let cases = [
        (tol(Some("k"), None, Some("v"), None), true),
        (tol(Some("k"), Some("Equal"), Some("w"), None), false),
        (tol(Some("k"), Some("Exists"), None, None), true),
        (tol(None, Some("Exists"), None, None), true),
        (
            tol(Some("k"), Some("Exists"), None, Some("NoExecute")),
            false,
        ),
        (
            tol(Some("k"), Some("Exists"), None, Some("NoSchedule")),
            true,
        ),
        (tol(Some("other"), Some("Exists"), None, None), false),
    ];
    for (toleration, want) in cases {
        assert_eq!(tolerates(&toleration, &taint), want, "{toleration:?}");
    }
}

#[test]
fn only_what_matters_to_jobs_changes_the_fingerprint() {
    let base = node("n", "True", json!({}));
    let heartbeat = node(
        "n",
        "True",
        json!({"status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:10Z"}],
                          "images": [{"names": ["x"], "sizeBytes": 1}]}}),
    );
    assert_eq!(fingerprint(&base), fingerprint(&heartbeat));
    for changed in [
        node("n", "Unknown", json!({})),
        node("n", "True", json!({"spec": {"unschedulable": true}})),
        node(
            "n",
            "True",
            json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}),
        ),
        node(
            "n",
            "True",
            json!({"status": {"allocatable": {"rdu.dev/tile": "2"}}}),
        ),
    ] {
        assert_ne!(fingerprint(&base), fingerprint(&changed), "{changed:?}");
    }
}

#[test]
fn every_node_unreachable_at_once_is_a_control_plane_fault_not_a_node_loss() {
    let unknown = |name| node(name, "Unknown", serde_json::json!({}));
    let ready = |name| node(name, "True", serde_json::json!({}));
    let cases: [(&str, Vec<Node>, bool); 4] = [
        (
            "all unknown",
            vec![unknown("a"), unknown("b"), unknown("c")],
            true,
        ),
        (
            "one reachable",
            vec![unknown("a"), ready("b"), unknown("c")],
            false,
        ),
        ("one unknown", vec![ready("a"), unknown("b")], false),
        ("no node", vec![], false),
    ];
    for (name, nodes, disrupted) in cases {
        assert_eq!(fully_disrupted(&nodes), disrupted, "{name}");
    }
}
