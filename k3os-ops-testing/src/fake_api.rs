//! A small stateful fake of the Kubernetes API server for the agent's tests, behind
//! tower-test's mock service (`kube::Client::new(mock, …)`), shared by the agent's test
//! binary (`k3os-ops/tests/agent/`: one node in `flow`, three in `fleet`) and the fleet bench.
//!
//! What it serves, with a real server's semantics where the agent depends on them:
//! - Nodes: GET, the list by `labelSelector` (`k=v` pairs), merge PATCH; PATCH of the status subresource merging `conditions` by type
//!   (the strategic merge the API server applies to them).
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

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

/// The body of the fake's answers: whole (most) or streamed (watches).
pub type FakeBody = UnsyncBoxBody<Bytes, std::convert::Infallible>;
/// How many changes the fake keeps for watches resuming from a resourceVersion.
pub const HISTORY: usize = 20_000;

pub type Log = Arc<Mutex<Vec<String>>>;
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

/// A step the simulated cluster takes at a later time.
#[derive(Debug, Clone)]
enum Due {
    /// The kubelet finished terminating the pod of this uid.
    Gone(String),
    /// The pod of this uid passed its readiness probe.
    Ready(String),
}

pub struct World {
    /// Nodes by name.
    pub nodes: BTreeMap<String, Value>,
    /// The channel `stable` (`Value::Null`: none exists yet).
    pub channel: Value,
    /// More channels listed after `channel` (raw: they may not decode).
    pub extra_channels: Vec<Value>,
    pub pods: Vec<Value>,
    pub pdbs: Vec<Pdb>,
    /// Leases of `k3os-system` by name (node liveness and poller Leases).
    pub leases: BTreeMap<String, Value>,
    /// See [`Hook`] (to inject concurrent changes).
    pub hook: Option<Hook>,
    /// See [`Observer`].
    pub observer: Option<Observer>,
    /// Evictions answered 429 because of a disruption budget.
    pub evictions_refused: u32,
    /// Channel status writes answered 409 (stale resourceVersion).
    pub conflicts: u32,
    /// Lists of Nodes answered (the fleet counter's).
    pub node_lists: u32,
    /// How long an evicted pod takes to terminate.
    pub termination: Duration,
    /// How long a scheduled replacement takes to become Ready.
    pub startup: Duration,
    /// The last resourceVersion handed out (one counter for every object, as in etcd).
    rv: u64,
    /// See [`World::hold_first_status_writes`]: how many more writes to hold, and the barrier.
    held_writes: Option<(usize, Arc<tokio::sync::Barrier>)>,
    due: Vec<(Instant, Due)>,
    /// For names and uids of replacement pods.
    serial: u64,
    changes: watch::Sender<u64>,
    node_changes: BTreeMap<String, watch::Sender<u64>>,
    channel_changes: watch::Sender<u64>,
    /// Requests answered, by `VERB resource` (e.g. `GET nodes`, `PUT updatechannels/status`;
    /// `LIST` and `WATCH` for collections).
    pub requests: BTreeMap<String, u64>,
    /// Changes of Nodes and channels, oldest first (at most [`HISTORY`]), for watches.
    history: std::collections::VecDeque<Change>,
    /// Changes before this resourceVersion were dropped from `history`.
    history_floor: u64,
    /// Open watches.
    watches: Vec<Watcher>,
    /// The resourceVersion last sent to watches, per (resource, name).
    emitted: BTreeMap<(&'static str, String), String>,
}

/// One change of a watched object: its resourceVersion, resource, name and the event line.
struct Change {
    rv: u64,
    resource: &'static str,
    name: String,
    line: Bytes,
}

/// One open watch: of `resource`, of the object `name` only when set.
struct Watcher {
    resource: &'static str,
    name: Option<String>,
    tx: mpsc::UnboundedSender<Bytes>,
}

impl Watcher {
    fn wants(&self, resource: &str, name: &str) -> bool {
        self.resource == resource && self.name.as_deref().is_none_or(|n| n == name)
    }
}

/// Merge-patch semantics (RFC 7386): objects merge, `null` removes, anything else replaces.
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

fn respond(status: u16, body: &Value) -> Response<FakeBody> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())).boxed_unsync())
        .unwrap()
}

/// A streamed answer: the lines `rx` receives until `deadline` (tokio time).
fn stream(
    rx: mpsc::UnboundedReceiver<Bytes>,
    deadline: tokio::time::Instant,
) -> Response<FakeBody> {
    let lines = futures::stream::unfold(rx, move |mut rx| async move {
        tokio::select! {
            line = rx.recv() => line.map(|l| (Ok(Frame::data(l)), rx)),
            _ = tokio::time::sleep_until(deadline) => None,
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(StreamBody::new(lines).boxed_unsync())
        .unwrap()
}

fn failure(code: u16, reason: &str, message: &str) -> Response<FakeBody> {
    respond(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "reason": reason, "code": code, "message": message}),
    )
}

fn not_found(what: &str) -> Response<FakeBody> {
    failure(404, "NotFound", &format!("{what} not found"))
}

fn conflict(what: &str) -> Response<FakeBody> {
    failure(
        409,
        "Conflict",
        &format!("Operation cannot be fulfilled on {what}: the object has been modified; please apply your changes to the latest version and try again"),
    )
}

/// Whether a Node's `Ready` condition is `True`.
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

fn pod_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn terminating(pod: &Value) -> bool {
    !pod["metadata"]["deletionTimestamp"].is_null()
}

fn controller_kind(pod: &Value) -> Option<&str> {
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

/// The `%XX` escapes of a query string decoded (`+` is not used by kube's encoder).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

impl World {
    /// `nodes` and the channel `stable` (`Value::Null` for none), no pods, no Leases.
    pub fn new(nodes: impl IntoIterator<Item = Value>, channel: Value) -> World {
        let mut w = World {
            nodes: BTreeMap::new(),
            channel,
            extra_channels: Vec::new(),
            pods: Vec::new(),
            pdbs: Vec::new(),
            leases: BTreeMap::new(),
            hook: None,
            observer: None,
            evictions_refused: 0,
            conflicts: 0,
            node_lists: 0,
            held_writes: None,
            termination: Duration::from_millis(50),
            startup: Duration::from_millis(200),
            rv: 0,
            due: Vec::new(),
            serial: 0,
            changes: watch::channel(0).0,
            node_changes: BTreeMap::new(),
            channel_changes: watch::channel(0).0,
            requests: BTreeMap::new(),
            history: std::collections::VecDeque::new(),
            history_floor: 0,
            watches: Vec::new(),
            emitted: BTreeMap::new(),
        };
        for mut n in nodes {
            let name = n["metadata"]["name"].as_str().unwrap().to_string();
            if n["metadata"]["resourceVersion"].is_null() {
                n["metadata"]["resourceVersion"] = json!(w.next_rv());
            }
            w.nodes.insert(name, n);
        }
        w.stamp_channels();
        w
    }

    /// Send a change of `resource` `name` (now `obj`) to the watches and keep it for those
    /// that resume later; nothing when its resourceVersion was sent already.
    fn emit(&mut self, resource: &'static str, name: &str, obj: &Value) {
        let rv_text = obj["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let key = (resource, name.to_string());
        let kind = match self.emitted.get(&key) {
            Some(last) if *last == rv_text => return,
            Some(_) => "MODIFIED",
            None => "ADDED",
        };
        self.emitted.insert(key, rv_text.clone());
        let line = Bytes::from(format!("{}\n", json!({"type": kind, "object": obj})));
        let rv = rv_text.parse().unwrap_or(0);
        self.watches
            .retain(|w| !w.wants(resource, name) || w.tx.send(line.clone()).is_ok());
        self.history.push_back(Change {
            rv,
            resource,
            name: name.to_string(),
            line,
        });
        while self.history.len() > HISTORY {
            let old = self.history.pop_front().unwrap();
            self.history_floor = old.rv;
        }
    }

    /// Open a watch of `resource` (`name`: one object) from resourceVersion `from`, ending at
    /// `deadline`: the changes after `from`, then every new one.
    fn open_watch(
        &mut self,
        resource: &'static str,
        name: Option<String>,
        from: &str,
        deadline: tokio::time::Instant,
    ) -> Response<FakeBody> {
        let (tx, rx) = mpsc::unbounded_channel();
        let watcher = Watcher { resource, name, tx };
        match from.parse::<u64>().ok().filter(|rv| *rv > 0) {
            Some(rv) if rv < self.history_floor => {
                let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                    "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
                    "message": format!("too old resource version: {rv} ({})", self.history_floor)}});
                let _ = watcher.tx.send(Bytes::from(format!("{gone}\n")));
                return stream(rx, deadline);
            }
            Some(rv) => {
                let start = self.history.partition_point(|c| c.rv <= rv);
                for c in self.history.range(start..) {
                    if watcher.wants(c.resource, &c.name) {
                        let _ = watcher.tx.send(c.line.clone());
                    }
                }
            }
            // resourceVersion 0 or none: every object as it is now, then the changes.
            None => {
                let objects: Vec<(String, Value)> = if resource == "nodes" {
                    self.nodes
                        .iter()
                        .map(|(n, v)| (n.clone(), v.clone()))
                        .collect()
                } else {
                    self.named_channels()
                };
                for (n, obj) in objects {
                    if watcher.wants(resource, &n) {
                        let line = json!({"type": "ADDED", "object": obj});
                        let _ = watcher.tx.send(Bytes::from(format!("{line}\n")));
                    }
                }
            }
        }
        self.watches.push(watcher);
        stream(rx, deadline)
    }

    /// The channels that exist (`channel` unless it is `Null`, then `extra_channels`).
    fn channels(&self) -> impl Iterator<Item = &Value> {
        std::iter::once(&self.channel)
            .filter(|c| !c["spec"].is_null())
            .chain(self.extra_channels.iter())
    }

    /// The condition of type `type_` in the (first) channel's status, if set.
    pub fn condition(&self, type_: &str) -> Option<Value> {
        self.channel["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_)
            .cloned()
    }

    /// Every channel with its name, copied (what a watch sends).
    fn named_channels(&self) -> Vec<(String, Value)> {
        self.channels()
            .map(|c| {
                let name = c["metadata"]["name"].as_str().unwrap_or_default();
                (name.to_string(), c.clone())
            })
            .collect()
    }

    /// Open watches (for tests: a watch ends after its `timeoutSeconds`).
    pub fn open_watches(&self) -> usize {
        self.watches.iter().filter(|w| !w.tx.is_closed()).count()
    }

    pub fn node(&self, name: &str) -> &Value {
        &self.nodes[name]
    }

    pub fn node_mut(&mut self, name: &str) -> &mut Value {
        self.nodes.get_mut(name).unwrap()
    }

    /// A counter bumped on every real change of a Node or a channel (the agent's watches).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Set the `Ready` condition of `node` (the kubelet going away or coming back).
    pub fn set_node_ready(&mut self, node: &str, ready: bool) {
        let rv = self.next_rv();
        let n = self.node_mut(node);
        n["status"]["conditions"] =
            json!([{"type": "Ready", "status": if ready { "True" } else { "False" }}]);
        n["metadata"]["resourceVersion"] = json!(rv);
        self.notify_node(node);
        self.observe();
    }

    /// Whether `pod` counts for a disruption budget: Ready, not terminating, on a Ready Node.
    pub fn pod_available(&self, pod: &Value) -> bool {
        pod_ready(pod)
            && !terminating(pod)
            && pod["spec"]["nodeName"]
                .as_str()
                .and_then(|n| self.nodes.get(n))
                .is_some_and(node_ready)
    }

    pub fn pdb_selects(pdb: &Pdb, pod: &Value) -> bool {
        pod["metadata"]["namespace"] == pdb.namespace.as_str()
            && pdb
                .selector
                .iter()
                .all(|(k, v)| pod["metadata"]["labels"][k] == v.as_str())
    }

    /// Available pods of `pdb`.
    pub fn available(&self, pdb: &Pdb) -> usize {
        self.pods
            .iter()
            .filter(|p| Self::pdb_selects(pdb, p) && self.pod_available(p))
            .count()
    }

    /// Pods bound to `node` and not terminating, except DaemonSet pods.
    pub fn workload_on(&self, node: &str) -> Vec<String> {
        self.pods
            .iter()
            .filter(|p| {
                p["spec"]["nodeName"] == node
                    && !terminating(p)
                    && controller_kind(p) != Some("DaemonSet")
            })
            .map(|p| {
                format!(
                    "{}/{}",
                    p["metadata"]["namespace"].as_str().unwrap(),
                    p["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    }

    /// Hold the first `n` channel status writes (PUT) until all `n` have arrived, then answer
    /// them: `n` agents' first compare-and-swaps (their claims) then carry the same
    /// resourceVersion, however their stages were timed, and all but one must get 409.
    pub fn hold_first_status_writes(&mut self, n: usize) {
        self.held_writes = Some((n, Arc::new(tokio::sync::Barrier::new(n))));
    }

    /// The barrier a status write arriving now must wait at, if it is one of the held ones.
    fn hold(&mut self) -> Option<Arc<tokio::sync::Barrier>> {
        let (left, barrier) = self.held_writes.as_mut()?;
        *left -= 1;
        let b = barrier.clone();
        if *left == 0 {
            self.held_writes = None;
        }
        Some(b)
    }

    fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    fn notify(&mut self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// Node `name` changed: wakes [`World::subscribe`] and [`World::subscribe_node`] of it.
    fn notify_node(&mut self, name: &str) {
        self.notify();
        if let Some(n) = self.nodes.get(name).cloned() {
            self.emit("nodes", name, &n);
        }
        if let Some(tx) = self.node_changes.get(name) {
            tx.send_modify(|n| *n += 1);
        }
    }

    /// A channel changed: wakes [`World::subscribe`] and [`World::subscribe_channels`].
    fn notify_channels(&mut self) {
        self.notify();
        let changed = self.named_channels();
        for (name, c) in changed {
            self.emit("updatechannels", &name, &c);
        }
        self.channel_changes.send_modify(|n| *n += 1);
    }

    /// Changes of Node `name` only (what an agent's watch of its own Node sees).
    pub fn subscribe_node(&mut self, name: &str) -> watch::Receiver<u64> {
        self.node_changes
            .entry(name.to_string())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// Changes of the channels only (what an agent's watch of the channels sees).
    pub fn subscribe_channels(&self) -> watch::Receiver<u64> {
        self.channel_changes.subscribe()
    }

    /// Show the world to the observer.
    pub fn observe(&mut self) {
        if let Some(mut o) = self.observer.take() {
            o(self);
            self.observer = Some(o);
        }
    }

    /// Give every channel without a resourceVersion one (tests write channels directly).
    fn stamp_channels(&mut self) {
        let mut rv = self.rv;
        for c in std::iter::once(&mut self.channel).chain(self.extra_channels.iter_mut()) {
            if !c.is_null() && c["metadata"]["resourceVersion"].is_null() {
                rv += 1;
                c["metadata"]["resourceVersion"] = json!(rv.to_string());
            }
        }
        self.rv = rv;
    }

    /// A human edits the channel `stable`'s spec: `edit` it, bump its generation and
    /// resourceVersion, wake the watchers.
    pub fn edit_channel_spec(&mut self, edit: impl FnOnce(&mut Value)) {
        edit(&mut self.channel["spec"]);
        let generation = self.channel["metadata"]["generation"].as_i64().unwrap_or(1);
        self.channel["metadata"]["generation"] = json!(generation + 1);
        let rv = self.next_rv();
        self.channel["metadata"]["resourceVersion"] = json!(rv);
        self.notify_channels();
    }

    fn channel_mut(&mut self, name: &str) -> Option<&mut Value> {
        std::iter::once(&mut self.channel)
            .chain(self.extra_channels.iter_mut())
            .find(|c| !c["spec"].is_null() && c["metadata"]["name"] == name)
    }

    /// Evict `namespace/name` through the Eviction API.
    fn evict(&mut self, namespace: &str, name: &str) -> Response<FakeBody> {
        let Some(i) = self
            .pods
            .iter()
            .position(|p| p["metadata"]["namespace"] == namespace && p["metadata"]["name"] == name)
        else {
            return not_found(&format!("pods \"{name}\""));
        };
        let pod = self.pods[i].clone();
        let done = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
        if terminating(&pod) {
            return respond(201, &done);
        }
        let refused = self
            .pdbs
            .iter()
            .filter(|b| self.pod_available(&pod) && Self::pdb_selects(b, &pod))
            .map(|b| (b, self.available(b)))
            .find(|(b, healthy)| *healthy <= b.min_available)
            .map(|(b, healthy)| {
                format!(
                    "The disruption budget {} needs {} healthy pods and has {healthy} currently",
                    b.name, b.min_available
                )
            });
        if let Some(cause) = refused {
            self.evictions_refused += 1;
            return respond(
                429,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "reason": "TooManyRequests", "code": 429,
                        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                        "details": {"causes": [{"reason": "DisruptionBudget", "message": cause}]}}),
            );
        }
        let now = Instant::now();
        let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
        self.pods[i]["metadata"]["deletionTimestamp"] = json!(chrono::Utc::now().to_rfc3339());
        self.due.push((now + self.termination, Due::Gone(uid)));
        if controller_kind(&pod) == Some("ReplicaSet") {
            self.serial += 1;
            let owner = pod["metadata"]["ownerReferences"][0]["name"]
                .as_str()
                .unwrap();
            let mut new = pod.clone();
            let new_name = format!("{owner}-r{}", self.serial);
            new["metadata"]["uid"] = json!(format!("{namespace}-{new_name}-uid"));
            new["metadata"]["name"] = json!(new_name);
            new["spec"]["nodeName"] = Value::Null;
            new["status"] =
                json!({"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]});
            self.pods.push(new);
        }
        respond(201, &done)
    }

    /// The schedulable Ready Node with the fewest workload pods (then the smallest name).
    fn pick_node(&self) -> Option<String> {
        self.nodes
            .iter()
            .filter(|(_, n)| node_ready(n) && n["spec"]["unschedulable"] != true)
            .min_by_key(|(name, _)| (self.workload_on(name).len(), (*name).clone()))
            .map(|(name, _)| name.clone())
    }

    /// One step of the simulated kubelets, ReplicaSet and scheduler at `now`; whether anything
    /// changed.
    pub fn tick(&mut self, now: Instant) -> bool {
        let mut changed = false;
        let (ripe, later): (Vec<_>, Vec<_>) = self.due.drain(..).partition(|(at, _)| *at <= now);
        self.due = later;
        for (_, due) in ripe {
            changed = true;
            match due {
                Due::Gone(uid) => self.pods.retain(|p| p["metadata"]["uid"] != uid.as_str()),
                Due::Ready(uid) => {
                    if let Some(p) = self
                        .pods
                        .iter_mut()
                        .find(|p| p["metadata"]["uid"] == uid.as_str())
                    {
                        p["status"] = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
                    }
                }
            }
        }
        while let Some(i) = self
            .pods
            .iter()
            .position(|p| p["spec"]["nodeName"].is_null() && !terminating(p))
        {
            let Some(node) = self.pick_node() else { break };
            let uid = self.pods[i]["metadata"]["uid"]
                .as_str()
                .unwrap()
                .to_string();
            self.pods[i]["spec"]["nodeName"] = json!(node);
            self.pods[i]["status"]["phase"] = json!("Running");
            self.due.push((now + self.startup, Due::Ready(uid)));
            changed = true;
        }
        changed
    }
}

/// Tick the simulated cluster every `period`, forever.
pub async fn run_cluster(world: Arc<Mutex<World>>, period: Duration) {
    loop {
        {
            let mut w = world.lock().unwrap();
            if w.tick(Instant::now()) {
                w.observe();
            }
        }
        tokio::time::sleep(period).await;
    }
}

/// A kube client of its own over the shared world (its own serving task).
pub fn client(world: &Arc<Mutex<World>>, log: &Log) -> Client {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<FakeBody>>();
    tokio::spawn(serve(handle, world.clone(), log.clone()));
    Client::new(svc, "default")
}

/// Answer the requests of one mock client from `world` until the client is dropped.
pub async fn serve(
    mut h: tower_test::mock::Handle<Request<Body>, Response<FakeBody>>,
    world: Arc<Mutex<World>>,
    log: Log,
) {
    while let Some((req, send)) = h.next_request().await {
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let query = percent_decode(req.uri().query().unwrap_or(""));
        let bytes = req.into_body().collect_bytes().await.unwrap();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        if method == Method::PUT && path.starts_with(CHANNELS) && path.ends_with("/status") {
            let held = world.lock().unwrap().hold();
            if let Some(barrier) = held {
                barrier.wait().await;
            }
        }
        let mut guard = world.lock().unwrap();
        let w = &mut *guard;
        w.stamp_channels();
        if let Some(hook) = w.hook.as_mut() {
            let mut ch = w.channel.clone();
            hook(&format!("{method} {path}"), &mut ch);
            if ch != w.channel {
                ch["metadata"]["resourceVersion"] = json!(w.next_rv());
                w.channel = ch;
                w.notify_channels();
            }
        }
        let resource = resource_of(&path);
        let verb = match (&method, is_collection(&path)) {
            (&Method::GET, true) if query.contains("watch=true") => "WATCH".to_string(),
            (&Method::GET, true) => "LIST".to_string(),
            _ => method.to_string(),
        };
        *w.requests.entry(format!("{verb} {resource}")).or_default() += 1;
        let resp = if verb == "WATCH" {
            watch_request(w, &log, &path, &query)
        } else {
            answer(w, &log, &method, &path, &query, &body)
        };
        w.observe();
        drop(guard);
        send.send_response(resp);
    }
}

/// Whether `path` names a collection (a list or watch when read) rather than one object.
fn is_collection(path: &str) -> bool {
    path == "/api/v1/nodes"
        || path == "/api/v1/pods"
        || path.trim_end_matches('/') == CHANNELS.trim_end_matches('/')
}

/// The value of query parameter `key`.
fn param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// `GET …?watch=true` of the Nodes or the channels.
fn watch_request(w: &mut World, log: &Log, path: &str, query: &str) -> Response<FakeBody> {
    let secs: u64 = param(query, "timeoutSeconds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1800);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    let from = param(query, "resourceVersion").unwrap_or("");
    let name = param(query, "fieldSelector")
        .and_then(|f| f.strip_prefix("metadata.name="))
        .map(String::from);
    if path == "/api/v1/nodes" {
        w.open_watch("nodes", name, from, deadline)
    } else if path.trim_end_matches('/') == CHANNELS.trim_end_matches('/') {
        w.open_watch("updatechannels", name, from, deadline)
    } else {
        unexpected(log, &Method::GET, &format!("{path}?{query}"))
    }
}

fn answer(
    w: &mut World,
    log: &Log,
    method: &Method,
    path: &str,
    query: &str,
    body: &Value,
) -> Response<FakeBody> {
    let seg: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method.clone(), seg.as_slice()) {
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
            // Strategic merge as the API server does for Node conditions: by `type`.
            let rv = w.next_rv();
            let Some(node) = w.nodes.get_mut(*name) else {
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
        ) => {
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

/// The resource a request path names (`nodes`, `pods/eviction`, `updatechannels/status`, …):
/// the path without its API prefix, namespace and object names.
pub fn resource_of(path: &str) -> String {
    let seg: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let rest = match seg.as_slice() {
        ["api", _, rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        other => other,
    };
    let rest = match rest {
        ["namespaces", _, rest @ ..] => rest,
        other => other,
    };
    match rest {
        [kind] | [kind, _] => kind.to_string(),
        [kind, _, sub, ..] => format!("{kind}/{sub}"),
        [] => "?".into(),
    }
}

fn unexpected(log: &Log, method: &Method, path: &str) -> Response<FakeBody> {
    log.lock()
        .unwrap()
        .push(format!("UNEXPECTED {method} {path}"));
    not_found(path)
}

/// A kube client over the shared world whose writes `writes` counts, as the agent's own
/// client does (`k3os_ops::agent::cluster::client::infer`): for agents with watch caches.
pub fn counted_client(
    world: &Arc<Mutex<World>>,
    log: &Log,
    writes: &k3os_ops::agent::cluster::client::WriteCounter,
) -> Client {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<FakeBody>>();
    tokio::spawn(serve(handle, world.clone(), log.clone()));
    kube::client::ClientBuilder::new(svc, "default")
        .with_layer(&writes.layer())
        .build()
}
