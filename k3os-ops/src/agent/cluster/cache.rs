//! What the agent watches, and the caches its loops read instead of listing.
//!
//! **Watched.** Two watches per agent, each one long request that the API server answers
//! from its watch cache: the `UpdateChannel`s of the agent's namespace (untyped, so one
//! malformed channel does not stop them; every loop of the agent needs the channels: their
//! slots, targets, `rebootTimeout`s) and the agent's own Node (a `metadata.name` field
//! selector: its annotations, cordon and Ready condition). Each watch is restarted by the
//! watcher every [`WATCH_TIMEOUT_SECS`] (the server ends it then; client-go's informers
//! restart theirs every 5 to 10 minutes), resuming from the last resourceVersion seen, so a
//! watch costs one request per ten minutes plus one list when it has to start over (410 Gone).
//! On the API server a watcher costs a few kilobytes of buffered events (the `cacher`'s
//! per-watcher channel, 100 events by default), nothing per object: 2000 watchers for a
//! 1000-node fleet are in the range the API server is built for (every kubelet watches its
//! own Node and its pods the same way).
//!
//! **What wakes the loop.** Every change of a channel; a change of the own Node only when
//! something the agent does not write itself changed: labels, `spec` (the cordon, taints),
//! the Ready condition's status, annotations other than `k3os.io/update-*` ([`node_wake_key`]).
//! The agent's own annotation writes (a new claim token each time it finds a free slot
//! and loses it, progress, phase) would otherwise wake it again at once, and a waiting agent
//! would loop at the speed of the API server without anything having changed; kubelet
//! heartbeats in the conditions would wake it every few seconds.
//!
//! **Read your own writes.** A watch lags behind a write the agent just made, and a decision
//! on a state older than the agent's own last write could repeat it (write a new claim token,
//! fence again). So the reconcile reads the caches only when they have caught up: after a
//! fresh read (GET of the Node, list of the channels) the agent remembers the
//! resourceVersions it read and how many writes it had made ([`super::client::WriteCounter`]);
//! the caches are used while the agent has written nothing since, and every object has
//! reached (been seen by the watch at) the version of that fresh read. Any write of its own
//! makes the next reconcile read fresh again. An idle agent thus reads nothing: its resyncs
//! decide on the caches.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::DynamicObject;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::task::JoinSet;

use super::client::WriteCounter;

/// Seconds a watch request lasts before the watcher starts the next one.
pub const WATCH_TIMEOUT_SECS: u32 = 600;
/// How many resourceVersions of one object a cache remembers having seen.
const SEEN: usize = 32;

/// The objects of one watch, and which versions of them it has seen.
struct Cached<K> {
    objects: BTreeMap<String, K>,
    seen: BTreeMap<String, VecDeque<String>>,
    /// The first list arrived.
    ready: bool,
    /// A list (re)started by the watcher, being filled.
    relist: Option<BTreeMap<String, K>>,
}

impl<K> Default for Cached<K> {
    fn default() -> Self {
        Cached {
            objects: BTreeMap::new(),
            seen: BTreeMap::new(),
            ready: false,
            relist: None,
        }
    }
}

impl<K: Resource + Clone> Cached<K> {
    fn note(&mut self, obj: &K) {
        let Some(rv) = obj.meta().resource_version.clone() else {
            return;
        };
        let seen = self.seen.entry(obj.name_any()).or_default();
        if seen.back() != Some(&rv) {
            seen.push_back(rv);
        }
        while seen.len() > SEEN {
            seen.pop_front();
        }
    }

    fn apply(&mut self, ev: Event<K>) {
        match ev {
            Event::Init => self.relist = Some(BTreeMap::new()),
            Event::InitApply(o) => {
                self.note(&o);
                self.relist
                    .get_or_insert_with(BTreeMap::new)
                    .insert(o.name_any(), o);
            }
            Event::InitDone => {
                self.objects = self.relist.take().unwrap_or_default();
                self.ready = true;
            }
            Event::Apply(o) => {
                self.note(&o);
                self.objects.insert(o.name_any(), o);
            }
            Event::Delete(o) => {
                self.note(&o);
                self.objects.remove(&o.name_any());
            }
        }
    }

    /// Whether this cache holds version `rv` of `name` or a later state of it (`rv` None:
    /// the object did not exist when read).
    fn reached(&self, name: &str, rv: Option<&str>) -> bool {
        match rv {
            None => true,
            Some(rv) => self
                .seen
                .get(name)
                .is_some_and(|s| s.iter().any(|v| v == rv)),
        }
    }
}

/// What of the own Node wakes the reconcile loop when it changes (see the module docs):
/// everything but the `k3os.io/update-*` annotations this agent writes, the resourceVersion
/// and managed fields, and the conditions other than Ready's status.
pub fn node_wake_key(node: &Node) -> String {
    let annotations: BTreeMap<&String, &String> = node
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with("k3os.io/update-"))
        .collect();
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str());
    serde_json::json!({
        "labels": node.metadata.labels,
        "annotations": annotations,
        "spec": node.spec,
        "ready": ready,
    })
    .to_string()
}

/// What a fresh read saw: the agent's write count before it, and the resourceVersions read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fresh {
    pub writes: u64,
    pub node_rv: Option<String>,
    /// (name, resourceVersion) of every channel listed.
    pub channels: Vec<(String, Option<String>)>,
}

/// The watch caches of one agent (see the module docs).
pub struct Watched {
    node_name: String,
    channels: Mutex<Cached<DynamicObject>>,
    node: Mutex<Cached<Node>>,
    /// This agent's own writes (counted by its client).
    pub writes: WriteCounter,
    /// Bumped on every event of either watch: the loops wait on it.
    pub changes: tokio::sync::watch::Sender<u64>,
}

impl Watched {
    pub fn new(node: &str, writes: WriteCounter) -> Arc<Watched> {
        Arc::new(Watched {
            node_name: node.to_string(),
            channels: Mutex::new(Cached::default()),
            node: Mutex::new(Cached::default()),
            writes,
            changes: tokio::sync::watch::channel(0).0,
        })
    }

    /// Start both watches on `tasks` (they end when the set is dropped).
    pub fn spawn(self: &Arc<Self>, tasks: &mut JoinSet<()>, client: &Client, namespace: &str) {
        let config = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
        let channels = crate::agent::channel::listing::dynamic_api(client.clone(), namespace);
        let me = self.clone();
        let cfg = config.clone();
        tasks.spawn(async move {
            let mut s = watcher::watcher(channels, cfg).default_backoff().boxed();
            while let Some(ev) = s.next().await {
                match ev {
                    Ok(ev) => {
                        me.channels.lock().expect("not poisoned").apply(ev);
                        me.changes.send_modify(|n| *n += 1);
                    }
                    Err(e) => tracing::debug!("watch of the UpdateChannels: {e}"),
                }
            }
        });
        let nodes: Api<Node> = Api::all(client.clone());
        let me = self.clone();
        let config = config.fields(&format!("metadata.name={}", self.node_name));
        tasks.spawn(async move {
            let mut s = watcher::watcher(nodes, config).default_backoff().boxed();
            let mut wake_key: Option<String> = None;
            while let Some(ev) = s.next().await {
                match ev {
                    Ok(ev) => {
                        let key = match &ev {
                            Event::Apply(n) | Event::InitApply(n) => Some(node_wake_key(n)),
                            _ => None,
                        };
                        me.node.lock().expect("not poisoned").apply(ev);
                        if key.is_none() || key != wake_key {
                            wake_key = key.or(wake_key);
                            me.changes.send_modify(|n| *n += 1);
                        }
                    }
                    Err(e) => tracing::debug!("watch of Node {}: {e}", me.node_name),
                }
            }
        });
    }

    /// Both watches have their first list (the agent's readiness waits for it).
    pub fn synced(&self) -> bool {
        self.node.lock().expect("not poisoned").ready
            && self.channels.lock().expect("not poisoned").ready
    }

    /// The channels as last seen (None until the first list arrived).
    pub fn channel_objects(&self) -> Option<Vec<DynamicObject>> {
        let c = self.channels.lock().expect("not poisoned");
        c.ready.then(|| c.objects.values().cloned().collect())
    }

    /// The Node and the channels, if the caches have caught up with `fresh` and the agent
    /// wrote nothing since (see the module docs).
    pub fn state_after(&self, fresh: &Fresh) -> Option<(Node, Vec<DynamicObject>)> {
        if self.writes.get() != fresh.writes {
            return None;
        }
        let node = {
            let n = self.node.lock().expect("not poisoned");
            if !n.ready || !n.reached(&self.node_name, fresh.node_rv.as_deref()) {
                return None;
            }
            n.objects.get(&self.node_name)?.clone()
        };
        let c = self.channels.lock().expect("not poisoned");
        let caught_up = c.ready
            && fresh
                .channels
                .iter()
                .all(|(name, rv)| c.reached(name, rv.as_deref()));
        caught_up.then(|| (node, c.objects.values().cloned().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn node(rv: &str, label: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                resource_version: Some(rv.into()),
                labels: Some([("l".to_string(), label.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn own_annotation_writes_and_heartbeats_do_not_wake_the_loop_but_a_cordon_does() {
        let mut a = node("1", "x");
        let key = node_wake_key(&a);
        a.metadata.resource_version = Some("2".into());
        a.metadata.annotations =
            Some([("k3os.io/update-token".to_string(), "t2".to_string())].into());
        assert_eq!(node_wake_key(&a), key, "own annotation");
        a.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            unschedulable: Some(true),
            ..Default::default()
        });
        assert_ne!(node_wake_key(&a), key, "cordon");
        let b = node("3", "y");
        assert_ne!(node_wake_key(&b), key, "labels");
    }

    #[test]
    fn the_cache_is_used_only_once_it_reached_the_fresh_read_and_nothing_was_written_since() {
        let writes = WriteCounter::new("n1");
        let w = Watched::new("n1", writes.clone());
        let fresh = Fresh {
            writes: 0,
            node_rv: Some("5".into()),
            channels: vec![],
        };
        // Nothing listed yet.
        assert!(w.state_after(&fresh).is_none());
        assert!(!w.synced());
        {
            let mut n = w.node.lock().unwrap();
            n.apply(Event::Init);
            n.apply(Event::InitApply(node("4", "old")));
            n.apply(Event::InitDone);
            let mut c = w.channels.lock().unwrap();
            c.apply(Event::Init);
            c.apply(Event::InitDone);
        }
        assert!(
            w.synced(),
            "both first lists arrived (no channel is a list too)"
        );
        // The watch is behind the fresh read (rv 4 < 5): read fresh.
        assert!(w.state_after(&fresh).is_none());
        w.node
            .lock()
            .unwrap()
            .apply(Event::Apply(node("5", "read")));
        let (n, _) = w.state_after(&fresh).expect("caught up");
        assert_eq!(n.metadata.resource_version.as_deref(), Some("5"));
        // A later change (someone else's) is newer than the read: still usable.
        w.node.lock().unwrap().apply(Event::Apply(node("9", "new")));
        let (n, _) = w.state_after(&fresh).expect("newer");
        assert_eq!(n.labels()["l"], "new");
        // A write of our own: fresh reads until the next fresh read is remembered.
        writes.note(&http::Method::PATCH, "/api/v1/nodes/n1");
        assert!(w.state_after(&fresh).is_none());
        // Reads and writes elsewhere do not count.
        writes.note(&http::Method::GET, "/api/v1/nodes/n1");
        writes.note(&http::Method::PATCH, "/api/v1/nodes/n10");
        writes.note(
            &http::Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/x/leases/l",
        );
        assert_eq!(writes.get(), 1);
        writes.note(
            &http::Method::PUT,
            "/apis/k3os.io/v1/namespaces/x/updatechannels/s/status",
        );
        assert_eq!(writes.get(), 2);
    }
}
