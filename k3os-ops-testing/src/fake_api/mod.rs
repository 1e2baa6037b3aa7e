//! A small stateful fake of the Kubernetes API server for the agent's tests, behind
//! tower-test's mock service (`kube::Client::new(mock, …)`), shared by the agent's test
//! binary (`k3os-ops/tests/agent/`: one node in `flow`, three in `fleet`) and the fleet bench.
//!
//! What it serves, with a real server's semantics where the agent depends on them:
//! - Nodes: GET, the list by `labelSelector` (`k=v` pairs), merge PATCH; PATCH of the status subresource merging `conditions` by type
//!   (the strategic merge the API server applies to them). A merge PATCH that sets an
//!   annotation outside `k3os.io/update-*` (or removes one, but for the previous release's
//!   `k3os.io/stage-preview`) is answered 403, as deploy/node-scope.yaml makes a real server
//!   answer the agent.
//! - `UpdateChannel`s of `k3os-system`: list, GET, PUT of the status subresource as a
//!   resourceVersion compare-and-swap (409 on a stale resourceVersion, 422 without one; a
//!   write that changes nothing keeps the resourceVersion); a PATCH of the status is answered
//!   403, as deploy/rbac.yaml (get and update only) makes a real server answer it.
//! - Leases of `k3os-system`: GET, POST (409 when it exists), PUT with the same CAS.
//! - Pods: the list by `spec.nodeName` field selector, GET, and the Eviction API honouring
//!   [`Pdb`]s: 429 while evicting a pod would leave fewer than `minAvailable` available pods
//!   of a budget (available: Ready, not terminating, on a Ready Node).
//! - Events (`events.k8s.io/v1`): POST, recorded in the log.
//! - Watches (`?watch=true`) of Nodes (optionally one, by `fieldSelector=metadata.name=…`)
//!   and of the channels: a streaming body of JSON lines (`ADDED`/`MODIFIED` events) that
//!   replays the changes after the `resourceVersion` asked for (410 `Expired` when they are
//!   older than the last [`HISTORY`] changes kept), then follows every real change, and ends
//!   after `timeoutSeconds` of tokio time (the paused clock of the fleet bench too). Lists
//!   carry the current `resourceVersion`, so kube's watcher (list, then watch) works as
//!   against a real server. [`World::requests`] counts a list as `LIST`, a watch as `WATCH`.
//!
//! [`World::tick`] plays the rest of the cluster for evicted pods: the kubelet removes an
//! evicted pod after [`World::termination`], its ReplicaSet creates a replacement at once, the
//! scheduler binds it to the schedulable Ready Node with the fewest pods, and it turns Ready
//! [`World::startup`] later. [`run_cluster`] ticks it in the background.
//!
//! [`World::hold_first_status_writes`] makes the first status writes of several agents race on
//! one resourceVersion, whatever the timing of the steps before them.
//!
//! Every answered request and every cluster step is shown to [`World::observer`] (when set),
//! so a test sees every state the world passes through. Real changes of Nodes and channels
//! bump [`World::subscribe`]'s counter, standing in for the agent's watches. The log records
//! Node cordons, slot writes, `Invalid` condition writes, Events and any request the fake does not know
//! (`UNEXPECTED …`), in order.

mod answer;
mod objects;
mod reply;
mod serve;
mod world;

pub use objects::{channel_object, merge, node_ready, ready_node, running_pod};
pub use serve::{client, counted_client, resource_of, run_cluster, serve};
pub use world::World;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use serde_json::Value;

/// The body of the fake's answers: whole (most) or streamed (watches).
pub type FakeBody = UnsyncBoxBody<Bytes, std::convert::Infallible>;
/// How many changes the fake keeps for watches resuming from a resourceVersion.
pub const HISTORY: usize = 20_000;

pub type Log = Arc<Mutex<Vec<String>>>;

/// Assert that the fake answered every request the agent made: no line of `log` says
/// `UNEXPECTED` (a request no resource of the fake serves).
pub fn no_unexpected(log: &Log) {
    let l = log.lock().unwrap();
    assert!(!l.iter().any(|x| x.starts_with("UNEXPECTED")), "{l:#?}");
}
/// Called with `"METHOD path"` and the channel `stable` before each request is answered.
pub type Hook = Box<dyn FnMut(&str, &mut Value) + Send>;
/// Called with the world after every answered request and every cluster step.
pub type Observer = Box<dyn FnMut(&World) + Send>;

/// The agent's namespace (channels, Leases).
pub const NS: &str = "k3os-system";
const CHANNELS: &str = "/apis/k3os.io/v1/namespaces/k3os-system/updatechannels/";

/// A PodDisruptionBudget: pods of `namespace` carrying all of `selector`'s labels.
#[derive(Debug, Clone)]
pub struct Pdb {
    pub name: String,
    pub namespace: String,
    pub selector: BTreeMap<String, String>,
    pub min_available: usize,
}
