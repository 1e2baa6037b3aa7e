//! The committed `deploy/crd.yaml` must be exactly what the types generate
//! (`k3os-ops agent crd > k3os-ops/deploy/crd.yaml` after changing `src/agent/crd.rs`).

use k3os_ops::agent;

use agent::crd::{crd_yaml, UpdateChannel};

#[test]
fn committed_crd_equals_generated() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/crd.yaml");
    let committed = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let generated = crd_yaml();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map(|i| i + 1)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()) + 1);
        panic!(
            "{path} differs from the CRD generated from src/agent/crd.rs (first difference at line {line}); \
             regenerate it with `cargo run -p k3os-ops -- agent crd > k3os-ops/deploy/crd.yaml`"
        );
    }
}

#[test]
fn crd_has_the_required_names_columns_and_status_subresource() {
    let doc: serde_yaml::Value =
        serde_yaml::from_str(crd_yaml().split_once("---\n").unwrap().1).unwrap();
    let spec = &doc["spec"];
    assert_eq!(spec["group"], "k3os.io");
    assert_eq!(spec["scope"], "Namespaced");
    assert_eq!(spec["names"]["shortNames"][0], "upchan");
    let v = &spec["versions"][0];
    assert_eq!(v["name"], "v1");
    assert!(
        v["subresources"]["status"].is_mapping(),
        "status subresource missing"
    );
    let cols: Vec<String> = v["additionalPrinterColumns"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_lowercase())
        .collect();
    assert_eq!(
        cols,
        ["version", "latest", "updating", "concurrency", "age"]
    );
    let status = &v["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
    for field in [
        "latestVersion",
        "slots",
        "failures",
        "conditions",
        "observedGeneration",
    ] {
        assert!(
            !status[field].is_null(),
            "status.{field} missing from the schema"
        );
    }
    let slot = &status["slots"]["items"]["properties"];
    for field in ["node", "token", "claimedAt", "phase", "wasUnschedulable"] {
        assert!(
            !slot[field].is_null(),
            "status.slots[].{field} missing from the schema"
        );
    }
}

#[test]
fn example_channel_round_trips_with_defaults() {
    let yaml = r#"
apiVersion: k3os.io/v1
kind: UpdateChannel
metadata: {name: stable, namespace: k3os-system}
spec:
  url: github-releases://rancher/k3os
  version: latest
  window: {days: [sat, sun], start: "23:00", length: 3h, timeZone: Europe/Berlin}
"#;
    let ch: UpdateChannel = serde_yaml::from_str(yaml).unwrap();
    assert_eq!(ch.spec.concurrency, 1);
    assert_eq!(ch.spec.max_failures, 1);
    assert_eq!(ch.spec.reboot_timeout, "15m");
    assert!(ch.spec.drain.ignore_daemon_sets);
    assert_eq!(
        ch.spec.pinned_version(),
        None,
        "'latest' must follow status.latestVersion"
    );
    assert_eq!(ch.target_version(), None);
}
