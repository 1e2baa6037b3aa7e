//! Request-level tests of the agent's Kubernetes calls against tower-test's mock service
//! (`kube::Client::new(mock, "default")`): each test scripts the API server's answers and
//! checks the exact requests (method, path, resourceVersion, bodies).
//! - 409 on `replace_status`: the claim re-reads and decides again; never PATCH.
//! - the `Invalid` condition is a PUT of the status with the resourceVersion read (the RBAC
//!   grants no patch there), keeping the rest of the status; a 409 means another agent wrote it.
//! - 429 on eviction (PodDisruptionBudget): retried until accepted; timeout when it never is.
//! - 404 Node: a deleted holder's slot is reclaimed; the agent's own Node missing is an error
//!   naming it.

use k3os_ops::agent;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agent::channel::crd::*;
use agent::cluster::kube_store::KubeChannelStore;
use agent::cluster::slots::{self, ClaimOutcome, DeadReason, LivenessObserver};
use http::{Method, Request, Response};
use k3os_ops_testing::sim_node::SimNode;
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn mock() -> (Client, Handle) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(svc, "default"), handle)
}

/// Answer the next request, after checking its method and path; returns its URI and body.
async fn answer(
    h: &mut Handle,
    method: Method,
    path: &str,
    status: u16,
    body: Value,
) -> (String, Value) {
    let (req, send) = tokio::time::timeout(Duration::from_secs(5), h.next_request())
        .await
        .unwrap_or_else(|_| panic!("no request came; expected {method} {path}"))
        .expect("client dropped");
    let uri = req.uri().to_string();
    assert_eq!(req.method(), method, "request {uri}");
    assert_eq!(req.uri().path(), path, "request {method} {uri}");
    let bytes = req.into_body().collect_bytes().await.unwrap();
    let sent = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    send.send_response(
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
    (uri, sent)
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

const CH_PATH: &str = "/apis/k3os.io/v1/namespaces/k3os-system/updatechannels/stable";

fn channel_json(rv: &str, slots: Value) -> Value {
    json!({
        "apiVersion": "k3os.io/v1", "kind": "UpdateChannel",
        "metadata": {"name": "stable", "namespace": "k3os-system", "resourceVersion": rv, "generation": 3},
        "spec": {"url": "https://releases.example/", "version": "v2", "concurrency": 1},
        "status": {"slots": slots}
    })
}

fn slot(node: &str, token: &str, phase: &str) -> Value {
    json!({"node": node, "token": token, "claimedAt": "2026-12-01T00:00:00Z", "phase": phase, "version": "v2"})
}

#[tokio::test]
async fn conflict_on_replace_status_rereads_and_finds_the_slot_taken() {
    let (client, mut h) = mock();
    let store = KubeChannelStore::new(client, "k3os-system", "stable");
    let server = tokio::spawn(async move {
        answer(
            &mut h,
            Method::GET,
            CH_PATH,
            200,
            channel_json("10", json!([])),
        )
        .await;
        let (_, sent) = answer(
            &mut h,
            Method::PUT,
            &format!("{CH_PATH}/status"),
            409,
            status_body(409, "Conflict", "the object has been modified"),
        )
        .await;
        // The write is a compare-and-swap on what was read.
        assert_eq!(sent["metadata"]["resourceVersion"], "10");
        assert_eq!(sent["status"]["slots"][0]["node"], "n1");
        // Someone else took the only slot meanwhile.
        answer(
            &mut h,
            Method::GET,
            CH_PATH,
            200,
            channel_json("11", json!([slot("n2", "t2", "Claimed")])),
        )
        .await;
    });
    let out = slots::claim(&store, "n1", "t1", "v2", chrono::Utc::now())
        .await
        .unwrap();
    assert_eq!(out, ClaimOutcome::Full(vec!["n2".into()]));
    server.await.unwrap();
}

#[tokio::test]
async fn conflict_then_success_claims_with_the_new_resource_version() {
    let (client, mut h) = mock();
    let store = KubeChannelStore::new(client, "k3os-system", "stable");
    let server = tokio::spawn(async move {
        answer(
            &mut h,
            Method::GET,
            CH_PATH,
            200,
            channel_json("10", json!([])),
        )
        .await;
        answer(
            &mut h,
            Method::PUT,
            &format!("{CH_PATH}/status"),
            409,
            status_body(409, "Conflict", "modified"),
        )
        .await;
        answer(
            &mut h,
            Method::GET,
            CH_PATH,
            200,
            channel_json("12", json!([])),
        )
        .await;
        let (_, sent) = answer(
            &mut h,
            Method::PUT,
            &format!("{CH_PATH}/status"),
            200,
            channel_json("13", json!([slot("n1", "t1", "Claimed")])),
        )
        .await;
        assert_eq!(sent["metadata"]["resourceVersion"], "12");
        assert_eq!(sent["status"]["slots"].as_array().unwrap().len(), 1);
        assert_eq!(sent["status"]["slots"][0]["token"], "t1");
        assert_eq!(sent["status"]["observedGeneration"], 3);
    });
    let out = slots::claim(&store, "n1", "t1", "v2", chrono::Utc::now())
        .await
        .unwrap();
    assert_eq!(out, ClaimOutcome::Claimed);
    server.await.unwrap();
}

#[tokio::test]
async fn fence_with_a_foreign_token_is_lost_without_writing() {
    let (client, mut h) = mock();
    let store = KubeChannelStore::new(client, "k3os-system", "stable");
    let server = tokio::spawn(async move {
        answer(
            &mut h,
            Method::GET,
            CH_PATH,
            200,
            channel_json("5", json!([slot("n1", "newer", "Claimed")])),
        )
        .await;
    });
    let out = slots::fence(
        &store,
        "n1",
        "older",
        SlotPhase::Draining,
        Some(false),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    assert_eq!(out, slots::FenceOutcome::Lost);
    server.await.unwrap();
}

fn pod(name: &str, owner_kind: Option<&str>, extra: Value) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "apps", "uid": format!("uid-{name}"), "labels": {"app": name}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running"}
    });
    if let Some(kind) = owner_kind {
        p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u", "controller": true}]);
    }
    if let Value::Object(m) = extra {
        for (k, v) in m {
            p["metadata"][k] = v;
        }
    }
    p
}

fn pod_list() -> Value {
    let mut me = pod("agent", Some("DaemonSet"), json!({}));
    me["metadata"]["namespace"] = json!("k3os-system");
    let items = vec![
        pod("web", Some("ReplicaSet"), json!({})),
        pod("ds", Some("DaemonSet"), json!({})),
        pod(
            "static",
            None,
            json!({"annotations": {"kubernetes.io/config.mirror": "x"}}),
        ),
        me,
    ];
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items})
}

#[tokio::test]
async fn eviction_429_is_retried_until_the_budget_allows() {
    let (client, mut h) = mock();
    let server = tokio::spawn(async move {
        let (uri, _) = answer(&mut h, Method::GET, "/api/v1/pods", 200, pod_list()).await;
        assert!(uri.contains("fieldSelector=spec.nodeName%3Dn1"), "{uri}");
        let evict = "/api/v1/namespaces/apps/pods/web/eviction";
        let (_, body) = answer(
            &mut h,
            Method::POST,
            evict,
            429,
            status_body(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            ),
        )
        .await;
        assert_eq!(body["kind"], "Eviction");
        assert_eq!(body["apiVersion"], "policy/v1");
        assert_eq!(body["metadata"]["name"], "web");
        assert_eq!(
            body["deleteOptions"]["gracePeriodSeconds"], 30,
            "grace period lost: {body}"
        );
        answer(&mut h, Method::POST, evict, 201, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})).await;
        answer(
            &mut h,
            Method::GET,
            "/api/v1/namespaces/apps/pods/web",
            404,
            status_body(404, "NotFound", "pods \"web\" not found"),
        )
        .await;
    });
    let spec = DrainSpec {
        grace_period: Some(30),
        ..DrainSpec::default()
    };
    let report = agent::cluster::drain::drain(
        &client,
        "n1",
        &spec,
        Some("k3os-system/agent"),
        Duration::from_secs(30),
        Duration::from_millis(10),
    )
    .await
    .unwrap();
    assert_eq!(report.evicted, vec!["apps/web".to_string()]);
    assert_eq!(report.budget_retries, 1);
    server.await.unwrap();
}

#[tokio::test]
async fn eviction_blocked_by_a_budget_times_out_naming_the_pod() {
    let (client, mut h) = mock();
    let server = tokio::spawn(async move {
        answer(&mut h, Method::GET, "/api/v1/pods", 200, pod_list()).await;
        // Answer 429 for as long as the drain keeps asking.
        while let Ok(Some((req, send))) =
            tokio::time::timeout(Duration::from_secs(2), h.next_request()).await
        {
            assert_eq!(
                req.uri().path(),
                "/api/v1/namespaces/apps/pods/web/eviction"
            );
            send.send_response(
                Response::builder()
                    .status(429)
                    .body(Body::from(
                        serde_json::to_vec(&status_body(429, "TooManyRequests", "pdb")).unwrap(),
                    ))
                    .unwrap(),
            );
        }
    });
    let err = agent::cluster::drain::drain(
        &client,
        "n1",
        &DrainSpec::default(),
        Some("k3os-system/agent"),
        Duration::from_millis(200),
        Duration::from_millis(20),
    )
    .await
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("timed out") && msg.contains("apps/web"),
        "{msg}"
    );
    server.await.unwrap();
}

#[tokio::test]
async fn drain_refuses_unmanaged_and_emptydir_pods_before_evicting() {
    let (client, mut h) = mock();
    let server = tokio::spawn(async move {
        let mut list = pod_list();
        list["items"]
            .as_array_mut()
            .unwrap()
            .push(pod("bare", None, json!({})));
        let mut cache = pod("cache", Some("ReplicaSet"), json!({}));
        cache["spec"]["volumes"] = json!([{"name": "tmp", "emptyDir": {}}]);
        list["items"].as_array_mut().unwrap().push(cache);
        answer(&mut h, Method::GET, "/api/v1/pods", 200, list).await;
        // No eviction may follow.
        assert!(
            tokio::time::timeout(Duration::from_millis(300), h.next_request())
                .await
                .map(|r| r.is_none())
                .unwrap_or(true)
        );
    });
    let err = agent::cluster::drain::drain(
        &client,
        "n1",
        &DrainSpec::default(),
        None,
        Duration::from_secs(5),
        Duration::from_millis(10),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("apps/bare is not managed by a controller"),
        "{err}"
    );
    assert!(err.contains("apps/cache has emptyDir data"), "{err}");
    server.await.unwrap();
}

#[tokio::test]
async fn deleted_node_slot_is_reclaimed_by_cas() {
    let (client, mut h) = mock();
    let store = KubeChannelStore::new(client, "k3os-system", "stable");
    let server = tokio::spawn(async move {
        let held = json!([slot("gone", "tg", "Draining")]);
        answer(&mut h, Method::GET, CH_PATH, 200, channel_json("20", held)).await;
        answer(
            &mut h,
            Method::GET,
            "/api/v1/nodes/gone",
            404,
            status_body(404, "NotFound", "nodes \"gone\" not found"),
        )
        .await;
        // The write is conditional on the read the judgement was made from: no re-read.
        let (_, sent) = answer(
            &mut h,
            Method::PUT,
            &format!("{CH_PATH}/status"),
            200,
            channel_json("21", json!([])),
        )
        .await;
        assert_eq!(sent["metadata"]["resourceVersion"], "20");
        assert_eq!(sent["status"]["slots"], json!([]));
        // A deleted node is not a failure of the release.
        assert_eq!(sent["status"]["failures"], json!([]));
    });
    let mut obs = LivenessObserver::default();
    let done = slots::reclaim_dead(
        &store,
        "n1",
        &mut obs,
        Duration::from_secs(600),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].slot.node, "gone");
    assert_eq!(done[0].reason, DeadReason::NodeDeleted);
    server.await.unwrap();
}

#[tokio::test]
async fn own_node_missing_is_an_error_naming_it() {
    let (client, mut h) = mock();
    let agent = agent::context::Agent::new(
        client,
        "k3os-system",
        "n1",
        None,
        Arc::new(SimNode::new("v1")),
    );
    let server = tokio::spawn(async move {
        answer(
            &mut h,
            Method::GET,
            "/api/v1/nodes/n1",
            404,
            status_body(404, "NotFound", "nodes \"n1\" not found"),
        )
        .await;
    });
    let err = agent.reconcile().await.unwrap_err();
    assert!(format!("{err:#}").contains("read own Node n1"), "{err:#}");
    server.await.unwrap();
}

#[tokio::test]
async fn poller_writes_latest_into_status_never_spec() {
    let (client, mut h) = mock();
    let store = KubeChannelStore::new(client, "k3os-system", "stable");
    let server = tokio::spawn(async move {
        let mut ch = channel_json("7", json!([]));
        ch["spec"]["version"] = json!("latest");
        answer(&mut h, Method::GET, CH_PATH, 200, ch.clone()).await;
        let (_, sent) = answer(&mut h, Method::PUT, &format!("{CH_PATH}/status"), 200, ch).await;
        assert_eq!(sent["status"]["latestVersion"], "v9");
        assert_eq!(
            sent["spec"]["version"], "latest",
            "the spec must be sent back unchanged"
        );
        let conds: BTreeMap<String, String> = sent["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["type"].as_str().unwrap().to_string(),
                    c["status"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(
            conds.get("LatestResolved").map(String::as_str),
            Some("True")
        );
        assert_eq!(conds.get("Paused").map(String::as_str), Some("False"));
    });
    slots::set_latest(&store, Ok("v9"), chrono::Utc::now())
        .await
        .unwrap();
    server.await.unwrap();
}

/// The `Invalid` condition of a channel that does not decode is written as a PUT of the
/// status subresource carrying the resourceVersion read and the whole status as read (its
/// slot stays): `deploy/rbac.yaml` grants `updatechannels/status` get and update, no patch,
/// so the merge PATCH written before was forbidden on a real server. A 409 (another agent
/// wrote first) is not an error and not reported as this agent's write.
#[tokio::test]
async fn invalid_condition_is_a_put_with_resource_version() {
    let (client, mut h) = mock();
    let api = agent::channel::listing::dynamic_api(client, "k3os-system");
    let mut raw = channel_json("41", json!([slot("n2", "t2", "Draining")]));
    raw["spec"]["concurrency"] = json!(5_000_000_000u64);
    let bad =
        agent::channel::listing::decode(serde_json::from_value(raw.clone()).unwrap()).unwrap_err();
    let now = chrono::Utc::now();
    let write = tokio::spawn(async move {
        let first = agent::reconcile::invalid::write_invalid(
            &api,
            &bad.object,
            Some("bad concurrency"),
            now,
        )
        .await
        .unwrap();
        let second = agent::reconcile::invalid::write_invalid(
            &api,
            &bad.object,
            Some("bad concurrency"),
            now,
        )
        .await
        .unwrap();
        (first, second)
    });
    let path = format!("{CH_PATH}/status");
    let mut stored = raw.clone();
    stored["metadata"]["resourceVersion"] = json!("42");
    let (_, sent) = answer(&mut h, Method::PUT, &path, 200, stored).await;
    assert_eq!(sent["metadata"]["resourceVersion"], "41");
    assert_eq!(sent["status"]["slots"], raw["status"]["slots"]);
    let cond = &sent["status"]["conditions"][0];
    assert_eq!(cond["type"], "Invalid");
    assert_eq!(cond["status"], "True");
    assert_eq!(cond["message"], "bad concurrency");
    answer(
        &mut h,
        Method::PUT,
        &path,
        409,
        status_body(409, "Conflict", "the object has been modified"),
    )
    .await;
    assert_eq!(write.await.unwrap(), (true, false));
}
