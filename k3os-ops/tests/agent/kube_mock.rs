//! The agent against tower-test's mock service (`kube::Client::new(mock, "default")`): the
//! test scripts the API server's answers and checks the exact requests. The request-level
//! checks of single calls (the slot CAS, the drain's evictions, the `Invalid` condition's PUT)
//! are unit tests beside that code (over `src/agent/cluster/mock_api.rs`); here the whole
//! reconcile: the agent's own Node missing is an error naming it.

use k3os_ops::agent;

use std::sync::Arc;
use std::time::Duration;

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

#[tokio::test]
async fn own_node_missing_is_an_error_naming_it() {
    let (client, mut h) = mock();
    let agent = agent::testing::Agent::new(
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
