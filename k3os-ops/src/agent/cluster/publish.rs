//! What the agent says: the `k3os.io/update-*` annotations of its Node and the Events about
//! the Node and its channel. Every report of a step goes through here: `Agent::report` (a
//! phase and its Event), `Agent::publish` (a `Report` a tick returned), Events once per
//! text for waiting states (`Agent::event_once`), and format refusals once per agent process.
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

    /// For a waiting state: only when the text changed (see `Agent::report`).
    pub fn once(self) -> Say {
        Say { once: true, ..self }
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

impl Agent {
    pub(in crate::agent) async fn node_ref(&self) -> ObjectReference {
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

    /// A `SlotReleased` Event (on the Node and the channel) when our slot was released.
    pub(in crate::agent) async fn slot_released(
        &self,
        ch: &UpdateChannel,
        released: bool,
        why: &str,
    ) {
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
    pub(in crate::agent) async fn failure_recorded(
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
    pub(in crate::agent) async fn report(
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
                    crate::agent::errors::kube_message(&err)
                );
            }
        }
    }

    /// Publish what a tick did: its phase, then its Event (on the Node and `ch`).
    pub(in crate::agent) async fn publish(
        &self,
        ch: &UpdateChannel,
        r: Report,
    ) -> Result<(), AgentError> {
        match r.event {
            Some(event) => self.report(ch, r.phase, &r.message, event).await,
            None => self.phase(r.phase, &r.message).await,
        }
    }
}
