//! The objects of the fake cluster as JSON: merge-patch semantics, Nodes and Pods and
//! their readiness.

use k3os_ops::agent::testing::crd::UpdateChannel;
use serde_json::{json, Value};

pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

pub fn node_ready(node: &Value) -> bool {
    node["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// A Node with the given labels, schedulable and Ready.
pub fn ready_node(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": format!("{name}-uid"), "labels": labels, "annotations": {}},
        "spec": {"unschedulable": false},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    })
}

pub(crate) fn pod_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

pub(crate) fn terminating(pod: &Value) -> bool {
    !pod["metadata"]["deletionTimestamp"].is_null()
}

pub(crate) fn controller_kind(pod: &Value) -> Option<&str> {
    pod["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["controller"] == true)?["kind"]
        .as_str()
}

/// A Running, Ready pod of `owner_kind` `owner` bound to `node`.
pub fn running_pod(
    namespace: &str,
    name: &str,
    labels: Value,
    owner_kind: &str,
    owner: &str,
    node: &str,
) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("{namespace}-{name}-uid"),
                     "labels": labels,
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner_kind, "name": owner,
                                          "uid": format!("{owner}-uid"), "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

/// `ch` (built from [`UpdateChannel::test`]) as the fake API server holds it: in the agent's
/// namespace, with a UID (`ch-uid`, the cluster seed's input) and generation 1.
pub fn channel_object(ch: &UpdateChannel) -> Value {
    let mut v = serde_json::to_value(ch).expect("a channel serializes");
    merge(
        &mut v,
        &json!({"metadata": {"namespace": super::NS, "uid": "ch-uid", "generation": 1}}),
    );
    v
}
