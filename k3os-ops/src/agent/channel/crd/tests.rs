//! The committed `deploy/crd.yaml` must be exactly what the types generate
//! (`k3os-ops agent crd > k3os-ops/deploy/crd.yaml` after changing `src/agent/channel/crd/`).

use crate::agent;

use agent::channel::crd::{crd_yaml, UpdateChannel};

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
            "{path} differs from the CRD generated from src/agent/crd/ (first difference at line {line}); \
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
        [
            "version",
            "latest",
            "updating",
            "updated",
            "concurrency",
            "age"
        ]
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

/// The server validates what it can. No `format: uint32` (a warning on
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
    assert_eq!(
        pat.as_str(),
        Some(crate::agent::channel::crd::DURATION_PATTERN)
    );
    let cols = v["additionalPrinterColumns"].as_sequence().unwrap();
    let updating = cols.iter().find(|c| c["name"] == "Updating").unwrap();
    assert_eq!(updating["jsonPath"], ".status.updating");
}

fn v010_fixture(name: &str) -> serde_json::Value {
    let path = format!(
        "{}/tests/fixtures/v0.1.0/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The status the v0.1.0 agents wrote (no format marker) decodes into
/// today's types as format 1 and means the same; the next write migrates it to format 2,
/// keeping every field v0.1.0 wrote.
#[test]
fn a_v010_status_is_read_as_format_1_and_migrated_by_the_next_write() {
    use crate::agent::channel::format;
    use crate::agent::cluster::slots;
    let raw = v010_fixture("updatechannel.json");
    assert_eq!(
        format::status_format("the fixture", &raw),
        Ok(format::STATUS_FORMAT_V010)
    );
    let mut ch: UpdateChannel = serde_json::from_value(raw.clone()).unwrap();
    let st = ch.status.clone().unwrap();
    assert_eq!(st.format_version, None);
    assert_eq!(st.slots.len(), 1);
    let slot = &st.slots[0];
    assert_eq!(slot.node, "node-1");
    assert_eq!(slot.phase, agent::channel::crd::SlotPhase::Rebooting);
    assert_eq!(slot.token, raw["status"]["slots"][0]["token"]);
    assert_eq!(slot.was_unschedulable, Some(false));
    assert_eq!(slot.version.as_deref(), Some("v2"));
    assert_eq!(st.failures_for("v2"), 1);
    assert!(!ch.paused_for("v2"), "maxFailures 2, one failure");

    slots::refresh_conditions(&mut ch, chrono::Utc::now());
    let written = serde_json::to_value(&ch).unwrap();
    assert_eq!(written["status"]["formatVersion"], 2);
    assert_eq!(written["status"]["updating"], "node-1");
    for key in ["slots", "failures", "latestVersion", "observedGeneration"] {
        assert_eq!(
            written["status"][key], raw["status"][key],
            "status.{key} changed by the migration"
        );
    }
    // Conditions keep their transition times (same status).
    assert_eq!(written["status"]["conditions"], raw["status"]["conditions"]);
}

/// The CRD stays backward compatible with v0.1.0's: still served and stored as `v1`, and the
/// status schema has every field v0.1.0 writes (the API server prunes unknown fields, so a
/// field missing here would be dropped from what v0.1.0 agents write during the DaemonSet
/// roll). Everything added since is optional.
#[test]
fn the_crd_keeps_every_field_v010_writes() {
    let doc: serde_yaml::Value =
        serde_yaml::from_str(crd_yaml().split_once("---\n").unwrap().1).unwrap();
    let versions = doc["spec"]["versions"].as_sequence().unwrap();
    assert_eq!(versions.len(), 1);
    let v = &versions[0];
    assert_eq!(v["name"], "v1");
    assert_eq!(v["served"], true);
    assert_eq!(v["storage"], true);
    let status = &v["schema"]["openAPIV3Schema"]["properties"]["status"];
    fn covered(schema: &serde_yaml::Value, value: &serde_json::Value, path: &str) {
        match value {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let sub = &schema["properties"][k.as_str()];
                    assert!(!sub.is_null(), "{path}.{k} is not in the CRD schema");
                    covered(sub, v, &format!("{path}.{k}"));
                }
            }
            serde_json::Value::Array(a) => {
                for v in a {
                    covered(&schema["items"], v, &format!("{path}[]"));
                }
            }
            _ => {}
        }
    }
    covered(
        status,
        &v010_fixture("updatechannel.json")["status"],
        "status",
    );
    let required: Vec<&str> = status["required"]
        .as_sequence()
        .map(|r| r.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default();
    assert!(
        !required.contains(&"formatVersion") && !required.contains(&"updating"),
        "fields added after v0.1.0 must be optional: {required:?}"
    );
}
