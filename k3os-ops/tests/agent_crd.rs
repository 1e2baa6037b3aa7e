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

/// Issue 11 bugs 3, 9, 10: the server validates what it can. No `format: uint32` (a warning on
/// every apply), integer bounds, duration patterns, CEL rules for rebootTimeout > 0 and the
/// window; the Updating column shows every holder.
#[test]
fn crd_schema_bounds_and_validates_the_spec() {
    let text = crd_yaml();
    assert!(!text.contains("uint32"), "format uint32 left in the CRD");
    let doc: serde_yaml::Value = serde_yaml::from_str(text.split_once("---\n").unwrap().1).unwrap();
    let v = &doc["spec"]["versions"][0];
    let spec = &v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(spec["concurrency"]["minimum"].as_f64(), Some(1.0));
    assert!(
        spec["concurrency"]["maximum"]
            .as_f64()
            .is_some_and(|m| m < f64::from(u32::MAX)),
        "concurrency needs a maximum below u32::MAX: {:?}",
        spec["concurrency"]
    );
    assert!(spec["maxFailures"]["maximum"].as_f64().is_some());
    let rules = |v: &serde_yaml::Value| -> Vec<String> {
        v["x-kubernetes-validations"]
            .as_sequence()
            .map(|s| {
                s.iter()
                    .map(|r| r["rule"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    for (what, field) in [
        ("rebootTimeout", &spec["rebootTimeout"]),
        ("drain.timeout", &spec["drain"]["properties"]["timeout"]),
        ("window.length", &spec["window"]["properties"]["length"]),
    ] {
        assert!(field["pattern"].is_string(), "{what} has no pattern");
        assert!(!rules(field).is_empty(), "{what} has no CEL rule");
        assert!(
            field["maxLength"].is_number(),
            "{what}: CEL needs maxLength"
        );
    }
    let window = &spec["window"]["properties"];
    for f in ["start", "timeZone"] {
        assert!(!rules(&window[f]).is_empty(), "window.{f} has no CEL rule");
    }
    // The patterns the server applies agree with the agent's own parser.
    let pat = &spec["rebootTimeout"]["pattern"];
    assert_eq!(pat.as_str(), Some(k3os_ops::agent::crd::DURATION_PATTERN));
    let cols = v["additionalPrinterColumns"].as_sequence().unwrap();
    let updating = cols.iter().find(|c| c["name"] == "Updating").unwrap();
    assert_eq!(updating["jsonPath"], ".status.updating");
}
