//! Everything the agent does as itself, in one place (like controller-rs's `Context`
//! methods): its construction and memory, its reads of the node and the channels, what it
//! says (annotations, Events: [`crate::agent::cluster::publish`] has the values, this file
//! sends them), the bookkeeping effects several steps share (undo its cordon, give the node
//! and the slot back, record a failed update) and the poller's reports (ChannelStale, the
//! fleet rollouts). Below the reconcile and the loops, above the Kubernetes side (`cluster`)
//! and the node side (`host`), which never see the `Agent`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use libupgrade::rollout::Seed;
use serde_json::{json, Value};

use super::{Agent, Clients, Memory, Settings, READY_WAIT};
use crate::agent::channel::crd::{UpdateChannel, COND_CHANNEL_STALE};
use crate::agent::channel::format::{
    ANN_CORDONED, ANN_FORMAT, ANN_MESSAGE, ANN_PHASE, NODE_FORMAT,
};
use crate::agent::channel::latest::Latest;
use crate::agent::channel::pinned::Pinned;
use crate::agent::cluster::kube_store::KubeChannelStore;
use crate::agent::cluster::publish::{Report, Say};
use crate::agent::cluster::{drain, rollout_status, slots, stale};
use crate::agent::errors::{AgentError, KubeContext};
use crate::agent::host::ops::{NodeOps, StaleMetadata};
use crate::agent::phase::Phase;

impl Agent {
    pub fn new(
        client: Client,
        namespace: &str,
        node: &str,
        self_pod: Option<String>,
        ops: Arc<dyn NodeOps>,
    ) -> Agent {
        let events = crate::agent::cluster::events::Publisher::new(client.clone(), node);
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
                metrics: Arc::new(crate::agent::metrics::Metrics::new(node)),
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
    /// [`crate::agent::cluster::client::WriteCounter`]).
    pub fn with_watches(mut self, writes: crate::agent::cluster::client::WriteCounter) -> Agent {
        self.clients.watched = Some(crate::agent::cluster::cache::Watched::new(
            &self.settings.node,
            writes,
        ));
        self
    }

    /// The channels of the namespace: from the watch cache once it listed them, else listed.
    pub async fn channels_now(
        &self,
    ) -> Result<crate::agent::channel::listing::Listed, kube::Error> {
        let cached = self
            .clients
            .watched
            .as_ref()
            .and_then(|w| w.channel_objects());
        match cached {
            Some(objs) => Ok(crate::agent::channel::listing::sort_out(
                &self.settings.namespace,
                objs,
            )),
            None => {
                crate::agent::channel::listing::list(&self.clients.client, &self.settings.namespace)
                    .await
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
        f: impl FnOnce(&dyn NodeOps) -> Result<T, crate::agent::host::ops::NodeError> + Send + 'static,
    ) -> Result<T, AgentError> {
        let ops = self.clients.ops.clone();
        Ok(tokio::task::spawn_blocking(move || f(ops.as_ref())).await??)
    }

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
        let n = crate::agent::cluster::events::Note {
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
        let n = crate::agent::cluster::events::Note {
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
        let n = crate::agent::cluster::events::Note {
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

    /// Uncordon if (and only if) this agent cordoned the node (its `update-cordoned` mark).
    pub(in crate::agent) async fn undo_cordon(&self) -> Result<Option<Say>, AgentError> {
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
            drain::set_unschedulable(&self.nodes(), &self.settings.node, false).await?;
            self.annotate(&[(ANN_CORDONED, None)]).await?;
            return Ok(Some(
                Say::info(
                    "Uncordoned",
                    "uncordoned the node (the agent had cordoned it)".into(),
                )
                .about_node(),
            ));
        }
        Ok(None)
    }

    /// Give the node and the slot back: undo our cordon (a node is never left cordoned by us
    /// without a slot), release the slot held under `token`; the Events that say so
    /// (`Uncordoned`, `SlotReleased` with `why`).
    pub(in crate::agent) async fn give_back(
        &self,
        store: &KubeChannelStore,
        token: &str,
        why: &str,
    ) -> Result<Vec<Say>, AgentError> {
        let mut said: Vec<Say> = self.undo_cordon().await?.into_iter().collect();
        let released = slots::release(store, &self.settings.node, token, Utc::now()).await?;
        said.extend(crate::agent::cluster::publish::released(released, why));
        Ok(said)
    }

    /// Record that `version` failed here (counted in the metrics) with `reason`; with `token`
    /// the slot moves to `RollingBack` (`keep_slot`) or is released by the same write. The
    /// caller reports what the record caused ([`crate::agent::cluster::publish::failure_recorded`]) after its own report.
    pub(in crate::agent) async fn record_failure(
        &self,
        store: &KubeChannelStore,
        token: Option<&str>,
        version: &str,
        reason: &str,
        keep_slot: bool,
    ) -> Result<slots::FailureOutcome, AgentError> {
        self.clients
            .metrics
            .count(crate::agent::metrics::Outcome::Failure);
        let node = &self.settings.node;
        Ok(
            slots::record_failure(store, node, token, version, reason, keep_slot, Utc::now())
                .await?,
        )
    }

    /// Report what a resolve of `ch` (as read) found: the condition, the gauge, and an Event
    /// when it turned stale. A fresh resolve of a channel that does not say stale writes nothing
    /// (no extra request per poll). A failed write is logged (the next resolve tries again).
    pub(in crate::agent) async fn report_stale(
        &self,
        ch: &UpdateChannel,
        stale: Option<&StaleMetadata>,
    ) {
        let name = ch.metadata.name.clone().unwrap_or_default();
        self.clients
            .metrics
            .set_channel_stale(&name, stale.is_some());
        if stale.is_none() && !ch.status.as_ref().is_some_and(stale::is_stale) {
            return;
        }
        match stale::write(&self.store(&name), stale, Utc::now()).await {
            Ok(true) => {
                let s = stale.expect("only a stale resolve turns the condition True");
                self.event(Some(ch), true, "ChannelStale", stale::message(s))
                    .await;
            }
            Ok(false) => {}
            Err(e) => tracing::warn!("set condition {COND_CHANNEL_STALE} of {name}: {e}"),
        }
    }

    /// Publish the poller's resolution of `ch` (as read): the status write, and the Events of a
    /// new `latestVersion` (`LatestResolved`) and of a withdrawn target (`ReleaseWithdrawn`).
    /// A failed write is logged (the next poll tries again).
    pub(in crate::agent) async fn publish_latest(
        &self,
        ch: &UpdateChannel,
        latest: &Latest,
        seed: Seed,
    ) {
        let name = ch.metadata.name.clone().unwrap_or_default();
        let withdrawn =
            match rollout_status::write(&self.store(&name), latest, seed, Utc::now()).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!("write latestVersion of {name}: {e}");
                    return;
                }
            };
        if let Some(note) = withdrawn {
            self.event(Some(ch), true, "ReleaseWithdrawn", note).await;
        }
        let v = &latest.version;
        if ch.status.as_ref().and_then(|s| s.latest_version.as_deref()) != Some(v) {
            self.event(
                Some(ch),
                false,
                "LatestResolved",
                format!("newest release of {} is {v}", ch.spec.url),
            )
            .await;
        }
    }

    /// Publish the poller's resolution of `ch`'s pinned release: the status write and the Event of
    /// a withdrawn pin (`ReleaseWithdrawn`). A failed write is logged (the next poll tries again).
    pub(in crate::agent) async fn publish_pinned(
        &self,
        ch: &UpdateChannel,
        pinned: &Pinned,
        seed: Seed,
    ) {
        let name = ch.metadata.name.clone().unwrap_or_default();
        match rollout_status::write_pinned(&self.store(&name), pinned, seed, Utc::now()).await {
            Ok(Some(note)) => self.event(Some(ch), true, "ReleaseWithdrawn", note).await,
            Ok(None) => {}
            Err(e) => tracing::warn!("write fleetRollout of {name}: {e}"),
        }
    }
}
