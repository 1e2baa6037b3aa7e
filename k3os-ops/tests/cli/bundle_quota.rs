//! The publisher frees a node's bundle quota, end to end through the binary: a real
//! `collector serve` on SQLite refuses a node's third bundle with 507 naming the command;
//! `collector delete-bundles` removes the ones it selects, printing each, and the node's next
//! bundle is stored again. A mistyped node id removes nothing and says so.

use std::process::Output;

use collector::Store;
use ed25519_dalek::SigningKey;
use fleet_report::{Bundle, Failure, NodeId, Section};
use k3os_ops_testing::release as release_support;

use crate::fleet_reports::{free_port, post, Collector};

/// The node's bundle of `attempt` of `version`, sealed with its key.
fn sealed(key: &SigningKey, version: &str, attempt: u32) -> Vec<u8> {
    Bundle {
        format: fleet_report::BUNDLE_FORMAT,
        node: NodeId::of(&key.verifying_key()),
        version: version.into(),
        generation: 6,
        attempt,
        slot: "B".into(),
        time: "2027-01-15T08:00:00Z".into(),
        failure: Failure::HealthCheck,
        why: "health check 20-kubelet failed".into(),
        versions: "k3os-ops=0.2.0\n".into(),
        redacted: 0,
        sections: vec![Section {
            name: "health/20-kubelet".into(),
            text: "kubelet: failed to load config\n".into(),
            cut_bytes: 0,
        }],
    }
    .seal(key)
    .unwrap()
}

/// `k3os-ops collector delete-bundles ARGS`.
fn delete(args: &[&str]) -> Output {
    std::process::Command::new(release_support::bin())
        .args(["collector", "delete-bundles"])
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

#[test]
fn the_publisher_frees_a_full_node_s_bundle_quota_and_its_next_bundle_is_stored() {
    let work = tempfile::tempdir().unwrap();
    let key = SigningKey::from_bytes(&[42; 32]);
    let id = NodeId::of(&key.verifying_key()).to_string();
    let allow = work.path().join("allow");
    std::fs::write(&allow, format!("{id} site-q\n")).unwrap();
    let db = work.path().join("reports.db");
    let dbarg = format!("sqlite:{}", db.display());
    let port = free_port();
    let (_collector, _) = Collector::start_with(port, &db, &allow, &["--bundles-per-node", "2"]);
    let (one, two, three) = (
        sealed(&key, "v2", 1),
        sealed(&key, "v2", 2),
        sealed(&key, "v3", 1),
    );
    for b in [&one, &two] {
        let (s, why) = post(port, "/v1/bundles", b);
        assert_eq!(s, 201, "{why}");
    }
    let (s, why) = post(port, "/v1/bundles", &three);
    assert_eq!(s, 507, "{why}");
    assert!(
        why.contains(&format!("k3os-ops collector delete-bundles --node {id}")),
        "{why}"
    );

    // A time before everything was received selects nothing: nothing removed, both kept.
    let o = delete(&[
        "--db",
        &dbarg,
        "--node",
        &id,
        "--before",
        "2000-01-01T00:00:00Z",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let size = (one.len() + two.len()) as u64;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("node {id}: removed 0 bundle(s), 0 bytes, from {dbarg}; 2 kept ({size} bytes)\n")
    );
    // v2's two, received before a time to come: removed and printed, by attempt.
    let o = delete(&[
        "--db",
        &dbarg,
        "--node",
        &id,
        "--version",
        "v2",
        "--before",
        "2100-01-01T00:00:00Z",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    for (line, (attempt, b)) in lines.iter().zip([(1, &one), (2, &two)]) {
        assert!(
            line.starts_with(&format!(
                "removed: v2 attempt {attempt} (health_check, {} bytes, received 20",
                b.len()
            )) && line.ends_with("): health check 20-kubelet failed"),
            "{out}"
        );
    }
    assert_eq!(
        lines[2],
        format!("node {id}: removed 2 bundle(s), {size} bytes, from {dbarg}; 0 kept (0 bytes)")
    );
    // The quota is free: the waiting bundle is stored at its next try.
    let (s, why) = post(port, "/v1/bundles", &three);
    assert_eq!(s, 201, "{why}");

    // A mistyped node id: an error naming it and the database, exit 1, nothing removed.
    let other = NodeId::of(&SigningKey::from_bytes(&[43; 32]).verifying_key()).to_string();
    let o = delete(&["--db", &dbarg, "--node", &other]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "node {other} has no reports and no bundles in {dbarg}: nothing removed"
        )),
        "{}",
        text(&o)
    );
    let rows = collector::SqliteStore::open(&db)
        .unwrap()
        .bundles()
        .unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| (r.version.as_str(), r.attempt))
            .collect::<Vec<_>>(),
        vec![("v3", 1)]
    );
}
