//! The deploy manifests grant exactly what the agent uses and mount what libupgrade needs.

use serde_yaml::Value;

fn docs(file: &str) -> Vec<Value> {
    let path = format!("{}/deploy/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{path}: {e}")))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn rules(kind: &str) -> Vec<(String, String, Vec<String>)> {
    let doc = docs("rbac.yaml")
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"));
    doc["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| {
            let verbs: Vec<String> = r["verbs"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            let groups: Vec<String> = r["apiGroups"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            let resources: Vec<String> = r["resources"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            groups
                .into_iter()
                .flat_map(move |g| {
                    resources
                        .clone()
                        .into_iter()
                        .map(move |res| (g.clone(), res))
                })
                .map(move |(g, res)| (g, res, verbs.clone()))
        })
        .collect()
}

fn allowed(
    rules: &[(String, String, Vec<String>)],
    group: &str,
    resource: &str,
    verb: &str,
) -> bool {
    rules
        .iter()
        .any(|(g, r, v)| g == group && r == resource && v.iter().any(|x| x == verb || x == "*"))
}

#[test]
fn rbac_grants_what_the_agent_uses_and_no_more() {
    let cluster = rules("ClusterRole");
    let ns = rules("Role");
    for (g, r, v) in [
        ("", "nodes", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "nodes", "patch"),
        ("", "nodes/status", "patch"),
        ("", "pods", "list"),
        ("", "pods", "get"),
        ("", "pods/eviction", "create"),
        ("events.k8s.io", "events", "create"),
    ] {
        assert!(allowed(&cluster, g, r, v), "ClusterRole lacks {v} {g}/{r}");
    }
    for (g, r, v) in [
        ("k3os.io", "updatechannels", "get"),
        ("k3os.io", "updatechannels", "list"),
        ("k3os.io", "updatechannels", "watch"),
        ("k3os.io", "updatechannels/status", "update"),
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    ] {
        assert!(allowed(&ns, g, r, v), "Role lacks {v} {g}/{r}");
    }
    // Never: patching the slot list, writing the spec, deleting pods, wildcards, secrets.
    let all: Vec<_> = cluster.iter().chain(ns.iter()).cloned().collect();
    assert!(
        !allowed(&all, "k3os.io", "updatechannels/status", "patch"),
        "status must only be replaced (CAS)"
    );
    assert!(!allowed(&all, "k3os.io", "updatechannels", "update"));
    assert!(!allowed(&all, "k3os.io", "updatechannels", "patch"));
    assert!(!allowed(&all, "", "pods", "delete"));
    assert!(
        !all.iter()
            .any(|(g, r, v)| g == "*" || r == "*" || v.iter().any(|x| x == "*")),
        "wildcard in RBAC"
    );
    assert!(!all.iter().any(|(_, r, _)| r == "secrets"));
}

#[test]
fn daemonset_is_privileged_with_the_host_mounts() {
    let ds = docs("daemonset.yaml").remove(0);
    assert_eq!(ds["kind"], "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "k3os-ops-agent");
    assert_eq!(pod["hostPID"], true);
    let c = &pod["containers"][0];
    assert_eq!(c["securityContext"]["privileged"], true);
    assert_eq!(c["args"][0], "agent");
    let env: Vec<&str> = c["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    for var in ["NODE_NAME", "POD_NAME", "POD_NAMESPACE"] {
        assert!(env.contains(&var), "env {var} missing");
    }
    let mounts: Vec<&str> = c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    for path in ["/boot", "/var/lib/k3os-ops", "/dev", "/etc/k3os-ops"] {
        assert!(mounts.contains(&path), "mount {path} missing");
    }
    // runc refuses mount destinations inside /proc and /sys ("cannot be mounted because it
    // is inside /proc"): such a DaemonSet never starts on k3s. /proc/cmdline is read from the
    // container's own /proc (the kernel command line is not namespaced).
    for m in &mounts {
        assert!(
            !(m.starts_with("/proc/") || m.starts_with("/sys/") || *m == "/proc"),
            "mount {m} is inside /proc or /sys: runc refuses it"
        );
    }
    // Probes on the agent's listener (agent/metrics.rs, default 0.0.0.0:9479).
    let port = &c["ports"][0];
    assert_eq!(port["containerPort"].as_u64(), Some(9479));
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(c[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], port["name"], "{probe}");
    }
    let host: Vec<&str> = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v["hostPath"]["path"].as_str().unwrap())
        .collect();
    for path in ["/boot", "/var/lib/k3os-ops", "/dev"] {
        assert!(host.contains(&path), "hostPath {path} missing");
    }
    // k3s's airgap directory: the agent's confirm links the booted slot's image archives
    // there; without the host's directory they land in the container's own filesystem and
    // k3s never imports them. Mounted at the host's path (the links point into the state
    // directory, also at its host path).
    let airgap = libupgrade::payload::airgap::DEFAULT_DIR;
    assert!(host.contains(&airgap), "hostPath {airgap} missing");
    let mounted = c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|m| m["mountPath"] == airgap && m["readOnly"].as_bool() != Some(true));
    assert!(
        mounted,
        "{airgap} must be mounted writable at the host's path"
    );
    // The offline bundle directory: the host's, read-only, where K3OS_OPS_BUNDLE_DIR says.
    let bundle_dir = c["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"] == crate::agent::host::ops::BUNDLE_DIR_ENV)
        .and_then(|e| e["value"].as_str())
        .expect("K3OS_OPS_BUNDLE_DIR set");
    let mount = c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == bundle_dir)
        .expect("the bundle directory is mounted");
    assert_eq!(mount["readOnly"], true);
    let vol = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(vol["hostPath"]["path"], "/var/lib/k3os-ops-bundles");
}

#[test]
fn example_channel_and_kustomization_are_consistent() {
    let k = docs("kustomization.yaml").remove(0);
    for r in k["resources"].as_sequence().unwrap() {
        let f = r.as_str().unwrap();
        assert!(!docs(f).is_empty(), "{f} listed but empty");
    }
    let ex = docs("updatechannel-example.yaml").remove(0);
    assert_eq!(ex["apiVersion"], "k3os.io/v1");
    assert_eq!(ex["kind"], "UpdateChannel");
}
