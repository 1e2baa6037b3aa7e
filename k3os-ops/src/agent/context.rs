//! The agent's context, what every step is handed (like controller-rs's `Context`): its
//! [`Settings`] (fixed at start-up), its [`Clients`] (Kubernetes, the node's slots, Events,
//! metrics) and its [`Memory`] (what one process remembers between reconciles: back-offs,
//! reports already made), and the few accessors built on them. What the agent says (annotations,
//! Events) is in [`super::cluster::publish`], the shared bookkeeping effects in [`super::cluster::effects`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

use super::cluster::kube_store::KubeChannelStore;
use super::errors::AgentError;
use super::host::ops::NodeOps;
use super::reconcile::cooldown::Cooldown;

/// Least time between two writes of the stage progress annotation.
pub const PROGRESS_PERIOD: Duration = Duration::from_secs(15);
/// How long after a healthy boot the Node may take to report Ready.
pub const READY_WAIT: Duration = Duration::from_secs(300);

/// What an agent is fixed to at start-up.
#[derive(Debug, Clone)]
pub struct Settings {
    pub namespace: String,
    pub node: String,
    /// `namespace/name` of this agent's pod.
    pub self_pod: Option<String>,
    /// Pause between drain rounds (PDB retries).
    pub drain_retry: Duration,
    /// How long after the trial boot the Node may take to report Ready before Node-Ready is
    /// reported failed (default 300 s; tests shorten it).
    pub node_ready_wait: Duration,
    /// Pause between two looks at the Node's Ready condition during that wait.
    pub node_ready_poll: Duration,
    /// When the host booted (`btime` of /proc/stat, set at start-up): a Ready condition last
    /// heard before it was posted by the kubelet of the previous boot (a reboot shorter than
    /// the node controller's grace period leaves it standing) and does not count. None: not
    /// known, every Ready=True counts.
    pub booted_at: Option<k8s_openapi::jiff::Timestamp>,
    /// The clock of the stage's windows and daily quota (tests inject a virtual one).
    pub clock: Arc<dyn libupgrade::Clock>,
}

/// Whom the agent talks to.
pub struct Clients {
    pub client: Client,
    pub ops: Arc<dyn NodeOps>,
    pub events: super::cluster::events::Publisher,
    /// Prometheus metrics of this agent (served by [`super::metrics::serve`]).
    pub metrics: Arc<super::metrics::Metrics>,
    /// The watch caches (None: every read goes to the API server, as in the step tests).
    pub watched: Option<Arc<super::cluster::cache::Watched>>,
}

/// What one agent process remembers between reconciles (nothing here is needed to resume:
/// that state is persisted on the channel, the Node and the slots). Plain data behind the
/// agent's one lock (`Agent::remember`): every access is a short critical section that
/// never spans an await.
pub struct Memory {
    /// Back-off of stages after failed ones (on the stage clock).
    pub(in crate::agent) stages: Cooldown,
    /// Back-off of claims after aborted disruptions (drain/activate failed, slot lost).
    pub(in crate::agent) claims: Cooldown,
    /// UID of this node, for Event references.
    pub(in crate::agent) node_uid: Option<String>,
    /// The last `reason:note` published by [`Agent::event_once`] (the same one is not repeated).
    pub(in crate::agent) last_note: Option<String>,
    /// The last ChannelConflict note published (reported again only when it changes).
    pub(in crate::agent) last_conflict: Option<String>,
    /// How long this node's Lease had not been renewed when the agent started (`None`: no
    /// Lease). Taken by the first reconcile (its decision may forfeit a held claim, see
    /// [`super::reconcile::decide::Action::Forfeit`]).
    pub(in crate::agent) startup_silence: Option<Duration>,
    /// This boot's not-yet-assessed state was reported (condition + Event) by this process.
    pub(in crate::agent) not_assessed_reported: bool,
    /// Format refusals already reported (each text once per agent process).
    pub(in crate::agent) format_reported: BTreeSet<String>,
    /// What the last fresh read of the Node and the channels saw (see [`super::cluster::cache`]).
    pub(in crate::agent) fresh: Option<super::cluster::cache::Fresh>,
    /// The Node's annotations as last read or written (an unchanged patch is not sent).
    pub(in crate::agent) node_annotations: Option<BTreeMap<String, String>>,
}

impl Default for Memory {
    fn default() -> Memory {
        Memory {
            stages: Cooldown::stages(),
            claims: Cooldown::claims(),
            node_uid: None,
            last_note: None,
            last_conflict: None,
            startup_silence: None,
            not_assessed_reported: false,
            format_reported: BTreeSet::new(),
            fresh: None,
            node_annotations: None,
        }
    }
}

/// What the loop does after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Decide again at once (state moved on).
    Again,
    /// Wait for a change or the resync period.
    Wait,
}

/// Everything the loop needs.
pub struct Agent {
    pub settings: Settings,
    pub clients: Clients,
    memory: Mutex<Memory>,
}

impl Agent {
    pub fn new(
        client: Client,
        namespace: &str,
        node: &str,
        self_pod: Option<String>,
        ops: Arc<dyn NodeOps>,
    ) -> Agent {
        let events = super::cluster::events::Publisher::new(client.clone(), node);
        Agent {
            settings: Settings {
                namespace: namespace.to_string(),
                node: node.to_string(),
                self_pod,
                drain_retry: Duration::from_secs(5),
                node_ready_wait: READY_WAIT,
                node_ready_poll: Duration::from_secs(5),
                booted_at: None,
                clock: Arc::new(libupgrade::SystemClock),
            },
            clients: Clients {
                client,
                ops,
                events,
                metrics: Arc::new(super::metrics::Metrics::new(node)),
                watched: None,
            },
            memory: Mutex::default(),
        }
    }

    /// Read or change what this process remembers, under its one lock (held only for `f`,
    /// which must not block).
    pub(in crate::agent) fn remember<T>(&self, f: impl FnOnce(&mut Memory) -> T) -> T {
        f(&mut self.memory.lock().expect("memory lock not poisoned"))
    }

    /// This agent with watch caches; `writes` must count the requests of its client (see
    /// [`super::cluster::client::WriteCounter`]).
    pub fn with_watches(mut self, writes: super::cluster::client::WriteCounter) -> Agent {
        self.clients.watched = Some(super::cluster::cache::Watched::new(
            &self.settings.node,
            writes,
        ));
        self
    }

    /// The channels of the namespace: from the watch cache once it listed them, else listed.
    pub async fn channels_now(&self) -> Result<super::channel::listing::Listed, kube::Error> {
        let cached = self
            .clients
            .watched
            .as_ref()
            .and_then(|w| w.channel_objects());
        match cached {
            Some(objs) => Ok(super::channel::listing::sort_out(
                &self.settings.namespace,
                objs,
            )),
            None => {
                super::channel::listing::list(&self.clients.client, &self.settings.namespace).await
            }
        }
    }

    /// Remember the Node's annotations as just read.
    pub(in crate::agent) fn saw_annotations(&self, annotations: BTreeMap<String, String>) {
        self.remember(|m| m.node_annotations = Some(annotations));
    }

    pub fn set_startup_silence(&self, silence: Option<Duration>) {
        self.remember(|m| m.startup_silence = silence);
    }

    pub(in crate::agent) fn nodes(&self) -> Api<Node> {
        Api::all(self.clients.client.clone())
    }

    pub(in crate::agent) fn store(&self, channel: &str) -> KubeChannelStore {
        KubeChannelStore::new(
            self.clients.client.clone(),
            &self.settings.namespace,
            channel,
        )
    }

    pub(in crate::agent) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn NodeOps) -> Result<T, super::host::ops::NodeError> + Send + 'static,
    ) -> Result<T, AgentError> {
        let ops = self.clients.ops.clone();
        Ok(tokio::task::spawn_blocking(move || f(ops.as_ref())).await??)
    }
}
