//! Unit-test plumbing for the request-level tests of the agent's Kubernetes calls: a kube
//! [`Client`] over tower-test's mock service, whose test scripts the API server's answers one
//! request at a time and checks each request's method, path and body. The tests beside
//! [`super::kube_store`], [`super::drain`] and `reconcile::invalid` use it.

use std::time::Duration;

use http::{Method, Request, Response};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};

/// The test's end of the mock service.
pub type MockHandle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// The path of the channel `k3os-system/stable` the fixtures here describe.
#[cfg(test)]
pub const CH_PATH: &str = "/apis/k3os.io/v1/namespaces/k3os-system/updatechannels/stable";

/// A client whose requests the returned handle answers.
pub fn mock() -> (Client, MockHandle) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(svc, "default"), handle)
}

/// Answer the next request, after checking its method and path; returns its URI and body.
pub async fn answer(
    h: &mut MockHandle,
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

/// A Kubernetes `Status` failure body.
pub fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// The channel `stable` at resourceVersion `rv` with `slots` in its status.
#[cfg(test)]
pub fn channel_json(rv: &str, slots: Value) -> Value {
    json!({
        "apiVersion": "k3os.io/v1", "kind": "UpdateChannel",
        "metadata": {"name": "stable", "namespace": "k3os-system", "resourceVersion": rv, "generation": 3},
        "spec": {"url": "https://releases.example/", "version": "v2", "concurrency": 1},
        "status": {"slots": slots}
    })
}

/// A slot of `node` under `token` at `phase`, for v2.
#[cfg(test)]
pub fn slot(node: &str, token: &str, phase: &str) -> Value {
    json!({"node": node, "token": token, "claimedAt": "2026-12-01T00:00:00Z", "phase": phase, "version": "v2"})
}
