//! What the agent says: the `k3os.io/update-*` annotations of its Node and the Events about
//! the Node and its channel. Every report of a step goes through here: `Agent::publish` (a
//! `Report`: a phase and its Event), the `Done` a tick returns (its Events, then its report),
//! `Agent::announce` (a report published before a long step), Events once per text for
//! waiting states (`Agent::event_once`), and format refusals once per agent process.
//!
//! An annotation is written only when it changes: the Node's annotations as last read or
//! written are remembered, and a patch that would change none of them is not sent (an idle
//! agent re-deciding `UpToDate` every resync writes nothing).
//!
//! Per-node progress lives on the Node as `k3os.io/update-*` annotations (never on the shared
//! channel): `update-phase` ([`Phase`]), `update-target`, `update-progress`, `update-message`,
//! `update-token` (the claim token, written before the claim so a restarted agent finds its
//! slot) and `update-cordoned` (set just before this agent cordons, so only a cordon of ours is
//! undone), with their format in `update-format` ([`crate::agent::channel::format`]).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::Resource;
use serde_json::{json, Value};

use super::slots;
use crate::agent::channel::crd::UpdateChannel;
use crate::agent::channel::format::{ANN_FORMAT, ANN_MESSAGE, ANN_PHASE, NODE_FORMAT};
use crate::agent::context::Agent;
use crate::agent::errors::{AgentError, KubeContext};
use crate::agent::phase::Phase;

/// An Event a step publishes with its report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) struct Say {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
    /// Published only when the text differs from the last Event of this agent.
    pub once: bool,
    /// About the Node alone (not also regarding the channel).
    pub node_only: bool,
}

impl Say {
    pub fn info(reason: &'static str, note: String) -> Say {
        Say {
            warning: false,
            reason,
            note,
            once: false,
            node_only: false,
        }
    }

    pub fn warn(reason: &'static str, note: String) -> Say {
        Say {
            warning: true,
            ..Say::info(reason, note)
        }
    }

    /// For a waiting state: only when the text changed (see `Agent::say`).
    pub fn once(self) -> Say {
        Say { once: true, ..self }
    }

    /// About the Node alone: published regarding the Node, not the channel.
    pub fn about_node(self) -> Say {
        Say {
            node_only: true,
            ..self
        }
    }
}

/// What a tick did, for the controller to publish once: the phase entered with its message
/// and the Event that says so, if one does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) struct Report {
    pub phase: Phase,
    pub message: String,
    pub event: Option<Say>,
}

impl Report {
    /// Wait in `phase`, saying why (`message`, also the note of a `reason` Event published
    /// once per text).
    pub fn waiting(phase: Phase, reason: &'static str, message: String) -> Report {
        Report {
            phase,
            event: Some(Say::info(reason, message.clone()).once()),
            message,
        }
    }
}

/// A channel condition or Node annotation that a tick's outcome sets or clears, published by
/// the controller with the tick's Events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) enum Mark {
    /// This node's line of `StageWillMissWindow` (None: on time, the line goes).
    StageDeadline(Option<crate::agent::channel::thin::Miss>),
    /// `ChannelStale`: the role whose metadata expired (None: the channel is fresh again).
    Stale(Option<crate::agent::host::ops::StaleMetadata>),
    /// A Node annotation set (Some) or removed (None).
    Annotation(&'static str, Option<String>),
}

/// What a tick did, for the controller to publish once and in this order: the conditions and
/// annotations its outcome sets (`marks`), the Events of the steps it carried out (`said`),
/// then the phase it entered (`report`); then `then`. A tick publishes nothing itself, except
/// write-ahead records, progress, and an announcement before a step that takes long or does
/// not return ([`Agent::announce`]).
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) struct Done {
    pub marks: Vec<Mark>,
    pub said: Vec<Say>,
    pub report: Option<Report>,
    pub then: Then,
}

/// What follows a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::agent) enum Then {
    /// Decide again at once.
    Again,
    /// Wait for a change or the resync period.
    Wait,
    /// Reboot the node (after publishing: the reboot does not return).
    Reboot,
}

impl Done {
    /// Nothing to publish; go on as `then` says.
    pub fn then(then: Then) -> Done {
        Done {
            marks: Vec::new(),
            said: Vec::new(),
            report: None,
            then,
        }
    }

    /// `report` published, then `then`.
    pub fn report(report: Report, then: Then) -> Done {
        Done {
            report: Some(report),
            ..Done::then(then)
        }
    }

    /// The same, also setting `marks` (published before its Events).
    pub fn marked(mut self, mut marks: Vec<Mark>) -> Done {
        self.marks.append(&mut marks);
        self
    }

    /// The Events `before` go first (steps carried out before this outcome).
    pub fn after(mut self, mut before: Vec<Say>) -> Done {
        before.append(&mut self.said);
        self.said = before;
        self
    }
}

impl Report {
    /// Enter `phase` with `message`, saying so with `event`.
    pub fn new(phase: Phase, message: impl Into<String>, event: Say) -> Report {
        Report {
            phase,
            message: message.into(),
            event: Some(event),
        }
    }

    /// Enter `phase` with `message`, no Event.
    pub fn quiet(phase: Phase, message: impl Into<String>) -> Report {
        Report {
            phase,
            message: message.into(),
            event: None,
        }
    }
}

/// The `SlotReleased` Event when our slot was released.
pub(in crate::agent) fn released(released: bool, why: &str) -> Option<Say> {
    released.then(|| Say::info("SlotReleased", format!("released the update slot: {why}")))
}

/// The Events of a recorded failure's effects on the channel: the slot released with it
/// (`SlotReleased`) and the pause it caused (`ChannelPaused`).
pub(in crate::agent) fn failure_recorded(
    ch: &UpdateChannel,
    version: &str,
    out: slots::FailureOutcome,
    why: &str,
) -> Vec<Say> {
    let mut said: Vec<Say> = released(out.released, why).into_iter().collect();
    if out.paused {
        said.push(Say::warn(
            "ChannelPaused",
            format!(
                "{version} failed on {} node(s), reaching maxFailures {}: new claims are paused. {}",
                ch.spec.max_failures,
                ch.spec.max_failures,
                super::slots::resume_hint(ch.metadata.name.as_deref().unwrap_or_default())
            ),
        ));
    }
    said
}

impl Agent {
    pub(in crate::agent) async fn node_ref(&self) -> ObjectReference {
        let mut r = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.settings.node.clone()),
            ..Default::default()
        };
        let cached = self.remember(|m| m.node_uid.clone());
        r.uid = match cached {
            Some(uid) => Some(uid),
            None => {
                let uid = self
                    .nodes()
                    .get(&self.settings.node)
                    .await
                    .ok()
                    .and_then(|n| n.metadata.uid);
                self.remember(|m| m.node_uid.clone_from(&uid));
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
                crate::agent::errors::kube_message(&e)
            );
        }
        if let Some(ch) = &channel {
            if let Err(e) = self.clients.events.publish(ch, Some(&node), &n).await {
                tracing::warn!(
                    "could not publish event {reason} on UpdateChannel {}: {}",
                    ch.name.as_deref().unwrap_or_default(),
                    crate::agent::errors::kube_message(&e)
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
                crate::agent::errors::kube_message(&e)
            );
        }
    }

    /// Publish `said` in order (on the Node and, unless about the Node alone, `ch`).
    pub(in crate::agent) async fn say_all(&self, ch: &UpdateChannel, said: Vec<Say>) {
        for s in said {
            self.say(ch, s).await;
        }
    }

    /// Publish one Event (on the Node and, unless about the Node alone, `ch`); one marked
    /// [`Say::once`] only when its text changed.
    pub(in crate::agent) async fn say(&self, ch: &UpdateChannel, s: Say) {
        let channel = (!s.node_only).then_some(ch);
        if s.once {
            self.event_once(channel, s.warning, s.reason, s.note).await;
        } else {
            self.event(channel, s.warning, s.reason, s.note).await;
        }
    }

    /// Publish now what a tick is about to do, before a step that takes long or does not
    /// return (a drain, the health checks' wait): the one report a tick does not return.
    pub(in crate::agent) async fn announce(
        &self,
        ch: &UpdateChannel,
        said: Vec<Say>,
        r: Report,
    ) -> Result<(), AgentError> {
        self.say_all(ch, said).await;
        self.publish(ch, r).await
    }

    /// Log a failed reconciliation and publish it (once per distinct text) as a
    /// `ReconcileError` event: the error chain as `Display` text, never a debug dump.
    pub async fn report_error(&self, e: &AgentError) {
        let text = crate::agent::errors::message(e);
        self.clients.metrics.reconciled(false);
        tracing::error!("reconcile: {text}");
        self.event_once(None, true, "ReconcileError", text).await;
    }

    /// Emit an event only when the note differs from the last one (for waiting states that
    /// are re-decided every resync).
    pub(in crate::agent) async fn event_once(
        &self,
        channel: Option<&UpdateChannel>,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let key = format!("{reason}:{note}");
        let repeated = self.remember(|m| {
            let repeated = m.last_note.as_deref() == Some(key.as_str());
            m.last_note = Some(key);
            repeated
        });
        if repeated {
            return;
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
        let unchanged = self.remember(|m| {
            m.node_annotations.as_ref().is_some_and(|known| {
                map.iter()
                    .all(|(k, v)| known.get(k).map(|s| json!(s)).unwrap_or(Value::Null) == *v)
            })
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

    pub(in crate::agent) async fn phase(
        &self,
        phase: Phase,
        message: &str,
    ) -> Result<(), AgentError> {
        self.annotate_phase(phase, &[(ANN_MESSAGE, Some(message))])
            .await
    }

    /// Report a format this agent cannot read, once per text: a warning Event regarding
    /// `regarding` (the Node when `None`), and regarding the Node too.
    pub(in crate::agent) async fn report_format(
        &self,
        regarding: Option<ObjectReference>,
        e: &crate::agent::channel::format::FormatError,
    ) {
        let text = e.to_string();
        if !self.remember(|m| m.format_reported.insert(text.clone())) {
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
                    crate::agent::errors::kube_message(&err)
                );
            }
        }
    }

    /// Publish a report: enter its phase with its message on the Node, then publish its Event
    /// (on the Node and `ch`; one marked [`Say::once`], a waiting state re-decided every
    /// resync, only when its text changed).
    pub(in crate::agent) async fn publish(
        &self,
        ch: &UpdateChannel,
        r: Report,
    ) -> Result<(), AgentError> {
        self.phase(r.phase, &r.message).await?;
        if let Some(event) = r.event {
            self.say(ch, event).await;
        }
        Ok(())
    }
}
