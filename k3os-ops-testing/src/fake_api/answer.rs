//! The answer to one request that is not a watch, by resource.

use http::{Method, Response};
use serde_json::{json, Value};

use super::objects::merge;
use super::reply::{conflict, failure, not_found, param, respond, unexpected};
use super::world::World;
use super::{FakeBody, Log, NS};

/// Answer one request that is not a watch: by its API group and resource.
pub(crate) fn answer(
    w: &mut World,
    log: &Log,
    method: &Method,
    path: &str,
    query: &str,
    body: &Value,
) -> Response<FakeBody> {
    let seg: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match seg.as_slice() {
        ["api", "v1", "nodes", ..] => nodes(w, log, method, &seg, path, query, body),
        ["api", "v1", ..] => pods(w, log, method, &seg, path, query),
        ["apis", "k3os.io", ..] => channels(w, log, method, &seg, path, body),
        ["apis", "coordination.k8s.io", ..] => leases(w, log, method, &seg, path, body),
        ["apis", "events.k8s.io", ..] => events(log, method, &seg, path, body),
        _ => unexpected(log, method, path),
    }
}

/// Nodes: the list (by label or name), GET, merge PATCH, PATCH of the status.
fn nodes(
    w: &mut World,
    log: &Log,
    method: &Method,
    seg: &[&str],
    path: &str,
    query: &str,
    body: &Value,
) -> Response<FakeBody> {
    match (method.clone(), seg) {
        (Method::GET, ["api", "v1", "nodes"]) => {
            // The fleet counter's list: `labelSelector` of `k=v` pairs (matchLabels).
            let selector: Vec<(&str, &str)> = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("labelSelector="))
                .unwrap_or("")
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .collect();
            let named =
                param(query, "fieldSelector").and_then(|f| f.strip_prefix("metadata.name="));
            if named.is_none() {
                w.node_lists += 1;
            }
            let items: Vec<&Value> = w
                .nodes
                .values()
                .filter(|n| named.is_none_or(|name| n["metadata"]["name"] == name))
                .filter(|n| {
                    selector
                        .iter()
                        .all(|(k, v)| n["metadata"]["labels"][*k].as_str() == Some(*v))
                })
                .collect();
            respond(
                200,
                &json!({"kind": "NodeList", "apiVersion": "v1",
                        "metadata": {"resourceVersion": w.rv.to_string()}, "items": items}),
            )
        }
        (Method::GET, ["api", "v1", "nodes", name]) => match w.nodes.get(*name) {
            Some(n) => respond(200, n),
            None => not_found(&format!("nodes \"{name}\"")),
        },
        (Method::PATCH, ["api", "v1", "nodes", name]) => {
            let rv = w.next_rv();
            let Some(node) = w.nodes.get_mut(*name) else {
                return not_found(&format!("nodes \"{name}\""));
            };
            if let Some(refused) = outside_annotation_space(body) {
                return failure(403, "Forbidden", &refused);
            }
            if let Some(u) = body.pointer("/spec/unschedulable") {
                log.lock()
                    .unwrap()
                    .push(format!("api: node {name} unschedulable={u}"));
            }
            let before = node.clone();
            merge(node, body);
            let changed = *node != before;
            if changed {
                node["metadata"]["resourceVersion"] = json!(rv);
            }
            let out = node.clone();
            if changed {
                w.notify_node(name);
            }
            respond(200, &out)
        }
        (Method::PATCH, ["api", "v1", "nodes", name, "status"]) => {
            patch_node_status(w, log, name, body)
        }
        _ => unexpected(log, method, path),
    }
}

/// The agent's annotation writes as deploy/node-scope.yaml judges them (`ownAnnotationsOnly`):
/// it sets only `k3os.io/update-*` keys and removes no other key but the previous release's
/// `k3os.io/stage-preview`. The policy's message for a patch that breaks that, else `None`.
/// (The fake serves only the agent, so every patch is judged; the real-server tests check the
/// policy itself.)
fn outside_annotation_space(body: &Value) -> Option<String> {
    let ann = body.pointer("/metadata/annotations")?.as_object()?;
    let bad: Vec<&String> = ann
        .iter()
        .filter(|(k, v)| {
            let legacy_removed = v.is_null() && *k == "k3os.io/stage-preview";
            !(k.starts_with("k3os.io/update-") || legacy_removed)
        })
        .map(|(k, _)| k)
        .collect();
    (!bad.is_empty()).then(|| {
        format!("the k3os-ops agent may change only its own Node (k3os.io/update-* annotations, …): {bad:?}")
    })
}

/// PATCH of a Node's status: strategic merge of `conditions` by `type`, as the API server does.
fn patch_node_status(w: &mut World, log: &Log, name: &str, body: &Value) -> Response<FakeBody> {
    // Strategic merge as the API server does for Node conditions: by `type`.
    let rv = w.next_rv();
    let Some(node) = w.nodes.get_mut(name) else {
        return not_found(&format!("nodes \"{name}\""));
    };
    let mut patch = body.clone();
    let conditions = patch
        .pointer_mut("/status")
        .and_then(|s| s.as_object_mut())
        .and_then(|s| s.remove("conditions"));
    for c in conditions
        .and_then(|c| c.as_array().cloned())
        .unwrap_or_default()
    {
        log.lock().unwrap().push(format!(
            "api: node {name} condition {}={} {}",
            c["type"].as_str().unwrap_or("?"),
            c["status"].as_str().unwrap_or("?"),
            c["message"].as_str().unwrap_or("")
        ));
        let list = node["status"]["conditions"]
            .as_array_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        let mut list: Vec<Value> = list
            .into_iter()
            .filter(|o| o["type"] != c["type"])
            .collect();
        list.push(c);
        node["status"]["conditions"] = Value::Array(list);
    }
    merge(node, &patch);
    node["metadata"]["resourceVersion"] = json!(rv);
    let out = node.clone();
    w.notify_node(name);
    respond(200, &out)
}

/// Pods: the list by node, GET, the Eviction API.
fn pods(
    w: &mut World,
    log: &Log,
    method: &Method,
    seg: &[&str],
    path: &str,
    query: &str,
) -> Response<FakeBody> {
    match (method.clone(), seg) {
        (Method::GET, ["api", "v1", "pods"]) => {
            let on = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("fieldSelector=spec.nodeName="));
            let items: Vec<&Value> = w
                .pods
                .iter()
                .filter(|p| on.is_none_or(|n| p["spec"]["nodeName"] == n))
                .collect();
            respond(
                200,
                &json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}),
            )
        }
        (Method::GET, ["api", "v1", "namespaces", ns, "pods", name]) => {
            match w
                .pods
                .iter()
                .find(|p| p["metadata"]["namespace"] == *ns && p["metadata"]["name"] == *name)
            {
                Some(p) => respond(200, p),
                None => not_found(&format!("pods \"{name}\"")),
            }
        }
        (Method::POST, ["api", "v1", "namespaces", ns, "pods", name, "eviction"]) => {
            w.evict(ns, name)
        }
        _ => unexpected(log, method, path),
    }
}

/// UpdateChannels: list, GET, the status PUT (CAS) and the refused status PATCH.
fn channels(
    w: &mut World,
    log: &Log,
    method: &Method,
    seg: &[&str],
    path: &str,
    body: &Value,
) -> Response<FakeBody> {
    match (method.clone(), seg) {
        (Method::GET, ["apis", "k3os.io", "v1", "namespaces", NS, "updatechannels"]) => {
            let items: Vec<&Value> = w.channels().collect();
            respond(
                200,
                &json!({"kind": "UpdateChannelList", "apiVersion": "k3os.io/v1",
                        "metadata": {"resourceVersion": w.rv.to_string()}, "items": items}),
            )
        }
        (Method::GET, ["apis", "k3os.io", "v1", "namespaces", NS, "updatechannels", name]) => {
            match w.channel_mut(name) {
                Some(c) => respond(200, c),
                None => not_found(&format!("updatechannels.k3os.io \"{name}\"")),
            }
        }
        (
            Method::PUT,
            ["apis", "k3os.io", "v1", "namespaces", NS, "updatechannels", name, "status"],
        ) => put_channel_status(w, log, name, body),
        (
            Method::PATCH,
            ["apis", "k3os.io", "v1", "namespaces", NS, "updatechannels", name, "status"],
        ) => {
            // deploy/rbac.yaml grants updatechannels/status get and update only: a real API
            // server answers a patch of it from the agent's ServiceAccount with 403.
            log.lock().unwrap().push(format!(
                "UNEXPECTED PATCH updatechannels/{name}/status (forbidden)"
            ));
            failure(
                403,
                "Forbidden",
                &format!("updatechannels.k3os.io \"{name}\" is forbidden: User \"system:serviceaccount:k3os-system:k3os-ops-agent\" cannot patch resource \"updatechannels/status\" in API group \"k3os.io\" in the namespace \"k3os-system\""),
            )
        }
        _ => unexpected(log, method, path),
    }
}

/// PUT of a channel's status: a compare-and-swap on its resourceVersion (422 without one,
/// 409 on a stale one; a write that changes nothing keeps it).
fn put_channel_status(w: &mut World, log: &Log, name: &str, body: &Value) -> Response<FakeBody> {
    let rv = w.next_rv();
    let Some(ch) = w.channel_mut(name) else {
        return not_found(&format!("updatechannels.k3os.io \"{name}\""));
    };
    let sent = &body["metadata"]["resourceVersion"];
    if sent.is_null() {
        return failure(
            422,
            "Invalid",
            "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
        );
    }
    if *sent != ch["metadata"]["resourceVersion"] {
        w.conflicts += 1;
        return conflict(&format!("updatechannels.k3os.io \"{name}\""));
    }
    let invalid = |status: &Value| {
        status["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Invalid"))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let cond = invalid(&body["status"]);
    if cond != invalid(&ch["status"]) {
        // The Invalid condition (invalid.rs): the only status write that changes it.
        log.lock().unwrap().push(format!(
            "api: condition {name} Invalid={} {}",
            cond["status"].as_str().unwrap_or("-"),
            cond["message"].as_str().unwrap_or("")
        ));
    } else {
        let slots: Vec<String> = body["status"]["slots"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|s| {
                format!(
                    "{}:{}",
                    s["node"].as_str().unwrap(),
                    s["phase"].as_str().unwrap()
                )
            })
            .collect();
        let failures = body["status"]["failures"].as_array().map_or(0, Vec::len);
        log.lock().unwrap().push(format!(
            "api: slots=[{}] failures={failures}",
            slots.join(",")
        ));
    }
    if ch["status"] == body["status"] {
        return respond(200, ch);
    }
    ch["status"] = body["status"].clone();
    ch["metadata"]["resourceVersion"] = json!(rv);
    let out = ch.clone();
    w.notify_channels();
    respond(200, &out)
}

/// Leases: GET, POST (409 when it exists), PUT (CAS).
fn leases(
    w: &mut World,
    log: &Log,
    method: &Method,
    seg: &[&str],
    path: &str,
    body: &Value,
) -> Response<FakeBody> {
    match (method.clone(), seg) {
        (m, ["apis", "coordination.k8s.io", "v1", "namespaces", NS, "leases", rest @ ..]) => {
            let what = |n: &str| format!("leases.coordination.k8s.io \"{n}\"");
            let rv = w.next_rv();
            match (m, rest) {
                (Method::GET, [name]) => match w.leases.get(*name) {
                    Some(l) => respond(200, l),
                    None => not_found(&what(name)),
                },
                (Method::POST, []) => {
                    let mut l = body.clone();
                    let name = l["metadata"]["name"].as_str().unwrap().to_string();
                    if w.leases.contains_key(&name) {
                        return failure(
                            409,
                            "AlreadyExists",
                            &format!("{} already exists", what(&name)),
                        );
                    }
                    l["metadata"]["resourceVersion"] = json!(rv);
                    w.leases.insert(name, l.clone());
                    respond(201, &l)
                }
                (Method::PUT, [name]) => {
                    let Some(stored) = w.leases.get_mut(*name) else {
                        return not_found(&what(name));
                    };
                    if body["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]
                    {
                        return conflict(&what(name));
                    }
                    let mut l = body.clone();
                    l["metadata"]["resourceVersion"] = json!(rv);
                    *stored = l.clone();
                    respond(200, &l)
                }
                _ => unexpected(log, method, path),
            }
        }
        _ => unexpected(log, method, path),
    }
}

/// Events: POST, recorded in the log.
fn events(
    log: &Log,
    method: &Method,
    seg: &[&str],
    path: &str,
    body: &Value,
) -> Response<FakeBody> {
    match (method.clone(), seg) {
        (Method::POST, ["apis", "events.k8s.io", "v1", "namespaces", _, "events"]) => {
            let mut l = log.lock().unwrap();
            l.push(format!("event: {}", body["reason"].as_str().unwrap_or("?")));
            l.push(format!(
                "event-on: {} {}/{}: {}",
                body["regarding"]["kind"].as_str().unwrap_or("?"),
                body["regarding"]["namespace"].as_str().unwrap_or("-"),
                body["regarding"]["name"].as_str().unwrap_or("?"),
                body["note"].as_str().unwrap_or("")
            ));
            respond(201, body)
        }
        _ => unexpected(log, method, path),
    }
}
