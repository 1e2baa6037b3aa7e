//! The simulated cluster's state and the steps it takes by itself (the kubelet, a
//! ReplicaSet, the scheduler), its resourceVersions and watches.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Response;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

use super::objects::{controller_kind, node_ready, pod_ready, terminating};
use super::reply::{not_found, respond, stream};
use super::{FakeBody, Hook, Observer, Pdb, HISTORY};

/// A step the simulated cluster takes at a later time.
#[derive(Debug, Clone)]
pub(crate) enum Due {
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
    pub(crate) rv: u64,
    /// See [`World::hold_first_status_writes`]: how many more writes to hold, and the barrier.
    pub(crate) held_writes: Option<(usize, Arc<tokio::sync::Barrier>)>,
    pub(crate) due: Vec<(Instant, Due)>,
    /// For names and uids of replacement pods.
    pub(crate) serial: u64,
    pub(crate) changes: watch::Sender<u64>,
    pub(crate) node_changes: BTreeMap<String, watch::Sender<u64>>,
    pub(crate) channel_changes: watch::Sender<u64>,
    /// Requests answered, by `VERB resource` (e.g. `GET nodes`, `PUT updatechannels/status`;
    /// `LIST` and `WATCH` for collections).
    pub requests: BTreeMap<String, u64>,
    /// Changes of Nodes and channels, oldest first (at most [`HISTORY`]), for watches.
    pub(crate) history: std::collections::VecDeque<Change>,
    /// Changes before this resourceVersion were dropped from `history`.
    pub(crate) history_floor: u64,
    /// Open watches.
    pub(crate) watches: Vec<Watcher>,
    /// The resourceVersion last sent to watches, per (resource, name).
    pub(crate) emitted: BTreeMap<(&'static str, String), String>,
}

/// One change of a watched object: its resourceVersion, resource, name and the event line.
pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) resource: &'static str,
    pub(crate) name: String,
    pub(crate) line: Bytes,
}

/// One open watch: of `resource`, of the object `name` only when set.
pub(crate) struct Watcher {
    pub(crate) resource: &'static str,
    pub(crate) name: Option<String>,
    pub(crate) tx: mpsc::UnboundedSender<Bytes>,
}

impl Watcher {
    pub(crate) fn wants(&self, resource: &str, name: &str) -> bool {
        self.resource == resource && self.name.as_deref().is_none_or(|n| n == name)
    }
}

/// Merge-patch semantics (RFC 7386): objects merge, `null` removes, anything else replaces.
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
    pub(crate) fn emit(&mut self, resource: &'static str, name: &str, obj: &Value) {
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
    pub(crate) fn open_watch(
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
    pub(crate) fn channels(&self) -> impl Iterator<Item = &Value> {
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
    pub(crate) fn named_channels(&self) -> Vec<(String, Value)> {
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
    pub(crate) fn hold(&mut self) -> Option<Arc<tokio::sync::Barrier>> {
        let (left, barrier) = self.held_writes.as_mut()?;
        *left -= 1;
        let b = barrier.clone();
        if *left == 0 {
            self.held_writes = None;
        }
        Some(b)
    }

    pub(crate) fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    pub(crate) fn notify(&mut self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// Node `name` changed: wakes [`World::subscribe`] and [`World::subscribe_node`] of it.
    pub(crate) fn notify_node(&mut self, name: &str) {
        self.notify();
        if let Some(n) = self.nodes.get(name).cloned() {
            self.emit("nodes", name, &n);
        }
        if let Some(tx) = self.node_changes.get(name) {
            tx.send_modify(|n| *n += 1);
        }
    }

    /// A channel changed: wakes [`World::subscribe`] and [`World::subscribe_channels`].
    pub(crate) fn notify_channels(&mut self) {
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
    pub(crate) fn stamp_channels(&mut self) {
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

    pub(crate) fn channel_mut(&mut self, name: &str) -> Option<&mut Value> {
        std::iter::once(&mut self.channel)
            .chain(self.extra_channels.iter_mut())
            .find(|c| !c["spec"].is_null() && c["metadata"]["name"] == name)
    }

    /// Evict `namespace/name` through the Eviction API.
    pub(crate) fn evict(&mut self, namespace: &str, name: &str) -> Response<FakeBody> {
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
    pub(crate) fn pick_node(&self) -> Option<String> {
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
