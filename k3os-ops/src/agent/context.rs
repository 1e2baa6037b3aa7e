//! The agent's context, what every step is handed (like controller-rs's `Context`): its
//! [`Settings`] (fixed at start-up), its [`Clients`] (Kubernetes, the node's slots, Events,
//! metrics) and its [`Memory`] (what one process remembers between reconciles: back-offs,
//! reports already made), and the few effects every step shares: annotating the Node
//! ([`Agent::annotate_phase`]), Events ([`Agent::event`], `Agent::event_once`), blocking
//! calls into libupgrade (`Agent::blocking`), and the channels as the background loops read
//! them ([`Agent::channels_now`]: from the watch cache when the agent has one).
//!
//! An annotation is written only when it changes: the Node's annotations as last read or
//! written are remembered, and a patch that would change none of them is not sent (an idle
//! agent re-deciding `UpToDate` every resync writes nothing).
//!
//! Per-node progress lives on the Node as `k3os.io/update-*` annotations (never on the shared
//! channel): `update-phase` ([`Phase`]), `update-target`, `update-progress`, `update-message`,
//! `update-token` (the claim token, written before the claim so a restarted agent finds its
//! slot) and `update-cordoned` (set just before this agent cordons, so only a cordon of ours is
//! undone), with their format in `update-format` ([`super::format`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde_json::{json, Value};

use super::crd::UpdateChannel;
use super::errors::{AgentError, KubeContext};
use super::format::{ANN_CORDONED, ANN_FORMAT, ANN_MESSAGE, ANN_PHASE, NODE_FORMAT};
use super::kube_store::KubeChannelStore;
use super::node::NodeOps;
use super::phase::Phase;
use super::slots;

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
    pub events: super::events::Publisher,
    /// Prometheus metrics of this agent (served by [`super::metrics::serve`]).
    pub metrics: Arc<super::metrics::Metrics>,
    /// The watch caches (None: every read goes to the API server, as in the step tests).
    pub watched: Option<Arc<super::cache::Watched>>,
}

/// What one agent process remembers between reconciles (nothing here is needed to resume:
/// that state is persisted on the channel, the Node and the slots).
#[derive(Default)]
pub struct Memory {
    /// Stage failures in a row, for back-off.
    pub(super) stage_failures: AtomicU64,
    /// Earliest next stage attempt (unix seconds).
    pub(super) stage_not_before: AtomicU64,
    /// Aborted disruptions (drain/activate failed, slot lost) in a row, for back-off.
    pub(super) claim_failures: AtomicU64,
    /// Earliest next claim (unix seconds).
    pub(super) claim_not_before: AtomicU64,
    /// UID of this node, for Event references.
    pub(super) node_uid: Mutex<Option<String>>,
    pub(super) last_note: Mutex<Option<String>>,
    /// The last ChannelConflict note published (reported again only when it changes).
    pub(super) last_conflict: Mutex<Option<String>>,
    /// How long this node's Lease had not been renewed when the agent started (`None`: no
    /// Lease). Taken by the first reconcile (its decision may forfeit a held claim, see
    /// [`super::decide::Action::Forfeit`]).
    pub(super) startup_silence: Mutex<Option<Duration>>,
    /// This boot's not-yet-assessed state was reported (condition + Event) by this process.
    pub(super) not_assessed_reported: AtomicBool,
    /// Format refusals already reported (each text once per agent process).
    pub(super) format_reported: Mutex<BTreeSet<String>>,
    /// What the last fresh read of the Node and the channels saw (see [`super::cache`]).
    pub(super) fresh: Mutex<Option<super::cache::Fresh>>,
    /// The Node's annotations as last read or written (an unchanged patch is not sent).
    pub(super) node_annotations: Mutex<Option<BTreeMap<String, String>>>,
}

/// An Event a step publishes with its report.
pub(super) struct Say {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
    /// Published only when the text differs from the last Event of this agent.
    pub once: bool,
}

impl Say {
    pub fn info(reason: &'static str, note: String) -> Say {
        Say {
            warning: false,
            reason,
            note,
            once: false,
        }
    }

    pub fn warn(reason: &'static str, note: String) -> Say {
        Say {
            warning: true,
            ..Say::info(reason, note)
        }
    }

    /// For a waiting state: only when the text changed (see [`Agent::report`]).
    pub fn once(self) -> Say {
        Say { once: true, ..self }
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
    pub(super) memory: Memory,
}

impl Agent {
    pub fn new(
        client: Client,
        namespace: &str,
        node: &str,
        self_pod: Option<String>,
        ops: Arc<dyn NodeOps>,
    ) -> Agent {
        let events = super::events::Publisher::new(client.clone(), node);
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
            memory: Memory::default(),
        }
    }

    /// This agent with watch caches; `writes` must count the requests of its client (see
    /// [`super::client::WriteCounter`]).
    pub fn with_watches(mut self, writes: super::client::WriteCounter) -> Agent {
        self.clients.watched = Some(super::cache::Watched::new(&self.settings.node, writes));
        self
    }

    /// The channels of the namespace: from the watch cache once it listed them, else listed.
    pub async fn channels_now(&self) -> Result<super::channels::Listed, kube::Error> {
        let cached = self
            .clients
            .watched
            .as_ref()
            .and_then(|w| w.channel_objects());
        match cached {
            Some(objs) => Ok(super::channels::sort_out(&self.settings.namespace, objs)),
            None => super::channels::list(&self.clients.client, &self.settings.namespace).await,
        }
    }

    /// Remember the Node's annotations as just read.
    pub(super) fn saw_annotations(&self, annotations: BTreeMap<String, String>) {
        *self.memory.node_annotations.lock().expect("not poisoned") = Some(annotations);
    }

    pub fn set_startup_silence(&self, silence: Option<Duration>) {
        *self.memory.startup_silence.lock().expect("not poisoned") = silence;
    }

    pub(super) fn nodes(&self) -> Api<Node> {
        Api::all(self.clients.client.clone())
    }

    pub(super) fn store(&self, channel: &str) -> KubeChannelStore {
        KubeChannelStore::new(
            self.clients.client.clone(),
            &self.settings.namespace,
            channel,
        )
    }

    pub(super) async fn node_ref(&self) -> ObjectReference {
        let mut r = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.settings.node.clone()),
            ..Default::default()
        };
        let cached = self.memory.node_uid.lock().expect("not poisoned").clone();
        r.uid = match cached {
            Some(uid) => Some(uid),
            None => {
                let uid = self
                    .nodes()
                    .get(&self.settings.node)
                    .await
                    .ok()
                    .and_then(|n| n.metadata.uid);
                self.memory
                    .node_uid
                    .lock()
                    .expect("not poisoned")
                    .clone_from(&uid);
                uid
            }
        };
        r
    }

    /// Publish a Kubernetes Event about this node and, with a channel, the same Event
    /// regarding the channel (each as the other's related object). Failures are logged, never
    /// fatal.
    pub async fn event(
        &self,
        channel: Option<&UpdateChannel>,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        if warning {
            tracing::warn!(reason, "{note}");
        } else {
            tracing::info!(reason, "{note}");
        }
        let n = super::events::Note {
            warning,
            reason,
            note: &note,
        };
        let node = self.node_ref().await;
        let channel = channel.map(|c| c.object_ref(&()));
        if let Err(e) = self
            .clients
            .events
            .publish(&node, channel.as_ref(), &n)
            .await
        {
            tracing::warn!(
                "could not publish event {reason} on Node {}: {}",
                self.settings.node,
                super::errors::kube_message(&e)
            );
        }
        if let Some(ch) = &channel {
            if let Err(e) = self.clients.events.publish(ch, Some(&node), &n).await {
                tracing::warn!(
                    "could not publish event {reason} on UpdateChannel {}: {}",
                    ch.name.as_deref().unwrap_or_default(),
                    super::errors::kube_message(&e)
                );
            }
        }
    }

    /// Publish an Event regarding the channel only (the fleet counter's: about the rollout,
    /// not about this node), this node as the related object. Failures are logged.
    pub async fn channel_event(
        &self,
        ch: &UpdateChannel,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        tracing::info!(reason, "{note}");
        let n = super::events::Note {
            warning,
            reason,
            note: &note,
        };
        let node = self.node_ref().await;
        let regarding = ch.object_ref(&());
        if let Err(e) = self
            .clients
            .events
            .publish(&regarding, Some(&node), &n)
            .await
        {
            tracing::warn!(
                "could not publish event {reason} on UpdateChannel {}: {}",
                regarding.name.as_deref().unwrap_or_default(),
                super::errors::kube_message(&e)
            );
        }
    }

    /// A `SlotReleased` Event (on the Node and the channel) when our slot was released.
    pub(super) async fn slot_released(&self, ch: &UpdateChannel, released: bool, why: &str) {
        if released {
            self.event(
                Some(ch),
                false,
                "SlotReleased",
                format!("released the update slot: {why}"),
            )
            .await;
        }
    }

    /// Events for a recorded failure's effects on the channel: the slot released with it
    /// (`SlotReleased`) and the pause it caused (`ChannelPaused`).
    pub(super) async fn failure_recorded(
        &self,
        ch: &UpdateChannel,
        version: &str,
        out: slots::FailureOutcome,
        why: &str,
    ) {
        self.slot_released(ch, out.released, why).await;
        if out.paused {
            self.event(
                Some(ch),
                true,
                "ChannelPaused",
                format!(
                    "{version} failed on {} node(s), reaching maxFailures {}: new claims are paused. {}",
                    ch.spec.max_failures,
                    ch.spec.max_failures,
                    super::slots::resume_hint(ch.metadata.name.as_deref().unwrap_or_default())
                ),
            )
            .await;
        }
    }

    /// Enter `phase` with `message` on the Node, then publish `event` (on the Node and the
    /// channel): the report every step makes when it moves on. An event marked
    /// [`Say::once`] (a waiting state re-decided every resync) is published only when its text
    /// changed.
    pub(super) async fn report(
        &self,
        ch: &UpdateChannel,
        phase: Phase,
        message: &str,
        event: Say,
    ) -> Result<(), AgentError> {
        self.phase(phase, message).await?;
        if event.once {
            self.event_once(Some(ch), event.warning, event.reason, event.note)
                .await;
        } else {
            self.event(Some(ch), event.warning, event.reason, event.note)
                .await;
        }
        Ok(())
    }

    /// Wait in `phase`, saying why (`message`, also the note of a `reason` Event published
    /// once per text).
    pub(super) async fn waiting(
        &self,
        ch: &UpdateChannel,
        phase: Phase,
        reason: &'static str,
        message: String,
    ) -> Result<(), AgentError> {
        self.report(
            ch,
            phase,
            &message,
            Say::info(reason, message.clone()).once(),
        )
        .await
    }

    /// Uncordon if (and only if) this agent cordoned the node (its `update-cordoned` mark).
    pub(super) async fn undo_cordon(&self) -> Result<(), AgentError> {
        let node = self
            .nodes()
            .get(&self.settings.node)
            .await
            .kube_ctx(|| format!("read own Node {}", self.settings.node))?;
        let ours = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_CORDONED))
            .is_some_and(|v| v == "true");
        if ours {
            super::drain::set_unschedulable(&self.nodes(), &self.settings.node, false).await?;
            self.annotate(&[(ANN_CORDONED, None)]).await?;
            self.event(
                None,
                false,
                "Uncordoned",
                "uncordoned the node (the agent had cordoned it)".into(),
            )
            .await;
        }
        Ok(())
    }

    /// Give the node and the slot back: undo our cordon (a node is never left cordoned by us
    /// without a slot), release the slot held under `token`, say why (`SlotReleased`).
    pub(super) async fn give_back(
        &self,
        ch: &UpdateChannel,
        store: &KubeChannelStore,
        token: &str,
        why: &str,
    ) -> Result<(), AgentError> {
        self.undo_cordon().await?;
        let released = slots::release(store, &self.settings.node, token, Utc::now()).await?;
        self.slot_released(ch, released, why).await;
        Ok(())
    }

    /// Record that `version` failed here (counted in the metrics) with `reason`; with `token`
    /// the slot moves to `RollingBack` (`keep_slot`) or is released by the same write. The
    /// caller reports what the record caused ([`Self::failure_recorded`]) after its own report.
    pub(super) async fn record_failure(
        &self,
        store: &KubeChannelStore,
        token: Option<&str>,
        version: &str,
        reason: &str,
        keep_slot: bool,
    ) -> Result<slots::FailureOutcome, AgentError> {
        self.clients.metrics.count(super::metrics::Outcome::Failure);
        let node = &self.settings.node;
        Ok(
            slots::record_failure(store, node, token, version, reason, keep_slot, Utc::now())
                .await?,
        )
    }

    /// Log a failed reconciliation and publish it (once per distinct text) as a
    /// `ReconcileError` event: the error chain as `Display` text, never a debug dump.
    pub async fn report_error(&self, e: &AgentError) {
        let text = super::errors::message(e);
        self.clients.metrics.reconciled(false);
        tracing::error!("reconcile: {text}");
        self.event_once(None, true, "ReconcileError", text).await;
    }

    /// Emit an event only when the note differs from the last one (for waiting states that
    /// are re-decided every resync).
    pub(super) async fn event_once(
        &self,
        channel: Option<&UpdateChannel>,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let key = format!("{reason}:{note}");
        {
            let mut last = self.memory.last_note.lock().expect("not poisoned");
            if last.as_deref() == Some(key.as_str()) {
                return;
            }
            *last = Some(key);
        }
        self.event(channel, warning, reason, note).await;
    }

    /// Set this node's phase (annotation and metric) together with `annotations`.
    pub async fn annotate_phase(
        &self,
        phase: Phase,
        annotations: &[(&str, Option<&str>)],
    ) -> Result<(), AgentError> {
        let mut all = vec![(ANN_PHASE, Some(phase.as_str()))];
        all.extend_from_slice(annotations);
        self.clients.metrics.set_phase(phase);
        self.annotate(&all).await
    }

    /// Merge `annotations` into the Node's (a `None` value removes the key).
    pub async fn annotate(&self, annotations: &[(&str, Option<&str>)]) -> Result<(), AgentError> {
        let mut map: serde_json::Map<String, serde_json::Value> = annotations
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    v.map_or(serde_json::Value::Null, |v| json!(v)),
                )
            })
            .collect();
        // Every patch states the format of the annotations it leaves behind.
        map.insert(ANN_FORMAT.into(), json!(NODE_FORMAT.to_string()));
        let unchanged = self
            .memory
            .node_annotations
            .lock()
            .expect("not poisoned")
            .as_ref()
            .is_some_and(|known| {
                map.iter()
                    .all(|(k, v)| known.get(k).map(|s| json!(s)).unwrap_or(Value::Null) == *v)
            });
        if unchanged {
            return Ok(());
        }
        let node = self
            .nodes()
            .patch(
                &self.settings.node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": map}})),
            )
            .await
            .kube_ctx(|| format!("annotate Node {}", self.settings.node))?;
        self.saw_annotations(node.metadata.annotations.unwrap_or_default());
        Ok(())
    }

    pub(super) async fn phase(&self, phase: Phase, message: &str) -> Result<(), AgentError> {
        self.annotate_phase(phase, &[(ANN_MESSAGE, Some(message))])
            .await
    }

    pub(super) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn NodeOps) -> Result<T, super::node::NodeError> + Send + 'static,
    ) -> Result<T, AgentError> {
        let ops = self.clients.ops.clone();
        Ok(tokio::task::spawn_blocking(move || f(ops.as_ref())).await??)
    }

    /// Report a format this agent cannot read, once per text: a warning Event regarding
    /// `regarding` (the Node when `None`), and regarding the Node too.
    pub(super) async fn report_format(
        &self,
        regarding: Option<ObjectReference>,
        e: &super::format::FormatError,
    ) {
        let text = e.to_string();
        if !self
            .memory
            .format_reported
            .lock()
            .expect("not poisoned")
            .insert(text.clone())
        {
            return;
        }
        tracing::error!(reason = "UnknownFormat", "{text}");
        let n = super::events::Note {
            warning: true,
            reason: "UnknownFormat",
            note: &text,
        };
        let node = self.node_ref().await;
        let targets: Vec<(ObjectReference, Option<&ObjectReference>)> = match &regarding {
            Some(r) => vec![(r.clone(), Some(&node)), (node.clone(), Some(r))],
            None => vec![(node.clone(), None)],
        };
        for (target, related) in targets {
            if let Err(err) = self.clients.events.publish(&target, related, &n).await {
                tracing::warn!(
                    "could not publish event UnknownFormat: {}",
                    super::errors::kube_message(&err)
                );
            }
        }
    }
}
