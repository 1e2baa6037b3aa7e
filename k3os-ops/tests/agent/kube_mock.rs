//! The agent against tower-test's mock service (`kube::Client::new(mock, "default")`): the
//! test scripts the API server's answers and checks the exact requests. The request-level
//! checks of single calls (the slot CAS, the drain's evictions, the `Invalid` condition's PUT)
//! are unit tests beside that code (over the same mock, `agent::testing::mock`); here the whole
//! reconcile: the agent's own Node missing is an error naming it.

use k3os_ops::agent;

use std::sync::Arc;

use agent::testing::{answer, mock, status_body};
use http::Method;
use k3os_ops_testing::sim_node::SimNode;

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
