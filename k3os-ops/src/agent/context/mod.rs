//! The agent's context, what every step is handed (like controller-rs's `Context`): its
//! [`Settings`] (fixed at start-up), its [`Clients`] (Kubernetes, the node's slots, Events,
//! metrics) and its [`Memory`] (what one process remembers between reconciles: back-offs,
//! reports already made). Everything the agent does as itself (its accessors, what it says,
//! the bookkeeping effects several steps share) is the one `impl Agent` of [`agent`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;

use super::cooldown::Cooldown;
use super::host::ops::NodeOps;

mod agent;

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
