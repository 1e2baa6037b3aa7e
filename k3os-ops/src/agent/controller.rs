//! One reconcile of the agent: read the Node and the channels, pick this node's channel
//! ([`super::channels::pick`]), ask [`decide`] for the next step and dispatch it; the
//! [`Agent`] state and its helpers (annotations, events). The steps themselves live in
//! [`super::steps`], unusable channels are reported by [`super::invalid`], the background tasks
//! in [`super::background`], the process wiring and error policy in [`super::run`].
//!
//! Per-node progress lives on the Node as `k3os.io/update-*` annotations (never on the shared
//! channel): `update-phase`, `update-target`, `update-progress`, `update-message`,
//! `update-token` (the claim token, written before the claim so a restarted agent finds its
//! slot) and `update-cordoned` (set just before this agent cordons, so only a cordon of ours is
//! undone), with their format in `update-format` ([`super::format`]): annotations of a newer
//! format stop this agent on the node (reported once, nothing written).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use rand::Rng;
use serde_json::json;

use super::crd::{SlotPhase, UpdateChannel};
use super::decide::{decide, Action, IdleReason, NodeView, Policy};
use super::errors::{AgentError, KubeContext};
use super::format::{ANN_FORMAT, NODE_FORMAT};
use super::kube_store::KubeChannelStore;
use super::metrics::Outcome;
use super::node::NodeOps;
use super::slots::{self, ClaimOutcome};

/// Node annotation keys.
pub const ANN_PHASE: &str = "k3os.io/update-phase";
pub const ANN_TARGET: &str = "k3os.io/update-target";
pub const ANN_PROGRESS: &str = "k3os.io/update-progress";
pub const ANN_MESSAGE: &str = "k3os.io/update-message";
pub const ANN_TOKEN: &str = "k3os.io/update-token";
pub const ANN_CORDONED: &str = "k3os.io/update-cordoned";

pub use super::background::{poll_loop, reclaim_loop, reclaim_period};

/// Least time between two writes of the stage progress annotation.
pub(super) const PROGRESS_PERIOD: Duration = Duration::from_secs(15);
/// How long after a healthy boot the Node may take to report Ready.
pub(super) const READY_WAIT: Duration = Duration::from_secs(300);

/// Everything the loop needs.
pub struct Agent {
    pub client: Client,
    pub namespace: String,
    pub node: String,
    /// `namespace/name` of this agent's pod.
    pub self_pod: Option<String>,
    pub ops: Arc<dyn NodeOps>,
    pub events: super::events::Publisher,
    /// Prometheus metrics of this agent (served by [`super::metrics::serve`]).
    pub metrics: Arc<super::metrics::Metrics>,
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
    /// Lease). Taken by the first reconcile that finds a held slot: a claim held through a
    /// silence of half the reboot timeout may already be judged dead by other agents, so it is
    /// forfeit and replaced by a fresh claim (a fresh token).
    pub(super) startup_silence: Mutex<Option<Duration>>,
    /// This boot's not-yet-assessed state was reported (condition + Event) by this process.
    pub(super) not_assessed_reported: std::sync::atomic::AtomicBool,
    /// Format refusals already reported (each text once per agent process).
    pub(super) format_reported: Mutex<std::collections::BTreeSet<String>>,
}

/// What the loop does after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Decide again at once (state moved on).
    Again,
    /// Wait for a change or the resync period.
    Wait,
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
            client,
            namespace: namespace.to_string(),
            node: node.to_string(),
            self_pod,
            ops,
            events,
            metrics: Arc::new(super::metrics::Metrics::new(node)),
            drain_retry: Duration::from_secs(5),
            node_ready_wait: READY_WAIT,
            node_ready_poll: Duration::from_secs(5),
            booted_at: None,
            stage_failures: AtomicU64::new(0),
            stage_not_before: AtomicU64::new(0),
            claim_failures: AtomicU64::new(0),
            claim_not_before: AtomicU64::new(0),
            node_uid: Mutex::new(None),
            last_note: Mutex::new(None),
            last_conflict: Mutex::new(None),
            startup_silence: Mutex::new(None),
            format_reported: Mutex::new(std::collections::BTreeSet::new()),
            not_assessed_reported: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Record how long this node's Lease was silent before this agent started.
    pub fn set_startup_silence(&self, silence: Option<Duration>) {
        *self.startup_silence.lock().expect("not poisoned") = silence;
    }

    pub(super) fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    pub(super) fn store(&self, channel: &str) -> KubeChannelStore {
        KubeChannelStore::new(self.client.clone(), &self.namespace, channel)
    }

    pub(super) async fn node_ref(&self) -> ObjectReference {
        let mut r = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.node.clone()),
            ..Default::default()
        };
        let cached = self.node_uid.lock().expect("not poisoned").clone();
        r.uid = match cached {
            Some(uid) => Some(uid),
            None => {
                let uid = self
                    .nodes()
                    .get(&self.node)
                    .await
                    .ok()
                    .and_then(|n| n.metadata.uid);
                self.node_uid.lock().expect("not poisoned").clone_from(&uid);
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
        if let Err(e) = self.events.publish(&node, channel.as_ref(), &n).await {
            tracing::warn!(
                "could not publish event {reason} on Node {}: {}",
                self.node,
                super::errors::kube_message(&e)
            );
        }
        if let Some(ch) = &channel {
            if let Err(e) = self.events.publish(ch, Some(&node), &n).await {
                tracing::warn!(
                    "could not publish event {reason} on UpdateChannel {}: {}",
                    ch.name.as_deref().unwrap_or_default(),
                    super::errors::kube_message(&e)
                );
            }
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
                    "{version} failed on {} node(s), reaching maxFailures {}: new claims are paused (remove status.failures entries to resume)",
                    ch.spec.max_failures, ch.spec.max_failures
                ),
            )
            .await;
        }
    }

    /// Log a failed reconciliation and publish it (once per distinct text) as a
    /// `ReconcileError` event: the error chain as `Display` text, never a debug dump.
    pub async fn report_error(&self, e: &AgentError) {
        let text = super::errors::message(e);
        self.metrics.reconciled(false);
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
            let mut last = self.last_note.lock().expect("not poisoned");
            if last.as_deref() == Some(key.as_str()) {
                return;
            }
            *last = Some(key);
        }
        self.event(channel, warning, reason, note).await;
    }

    /// Merge `annotations` into the Node's (a `None` value removes the key).
    pub async fn annotate(&self, annotations: &[(&str, Option<&str>)]) -> Result<(), AgentError> {
        if let Some((_, Some(phase))) = annotations.iter().find(|(k, _)| *k == ANN_PHASE) {
            self.metrics.set_phase(phase);
        }
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
        self.nodes()
            .patch(
                &self.node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": map}})),
            )
            .await
            .kube_ctx(|| format!("annotate Node {}", self.node))?;
        Ok(())
    }

    pub(super) async fn phase(&self, phase: &str, message: &str) -> Result<(), AgentError> {
        self.annotate(&[(ANN_PHASE, Some(phase)), (ANN_MESSAGE, Some(message))])
            .await
    }

    pub(super) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn NodeOps) -> Result<T, super::node::NodeError> + Send + 'static,
    ) -> Result<T, AgentError> {
        let ops = self.ops.clone();
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
            if let Err(err) = self.events.publish(&target, related, &n).await {
                tracing::warn!(
                    "could not publish event UnknownFormat: {}",
                    super::errors::kube_message(&err)
                );
            }
        }
    }

    /// Set this Node's [`COND_BOOT_ASSESSED`] condition (strategic merge on `status.conditions`,
    /// keyed by type: the kubelet's conditions stay).
    async fn set_assessed_condition(&self, ok: bool, message: &str) -> Result<(), AgentError> {
        let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let patch = json!({"status": {"conditions": [{
            "type": COND_BOOT_ASSESSED,
            "status": if ok { "True" } else { "False" },
            "reason": if ok { "Assessed" } else { "NotAssessed" },
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }]}});
        self.nodes()
            .patch_status(
                &self.node,
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )
            .await
            .kube_ctx(|| format!("set condition {COND_BOOT_ASSESSED} of Node {}", self.node))?;
        Ok(())
    }

    /// This boot was not assessed yet: say so once (Node condition, Event, phase) and wait.
    async fn report_not_assessed(
        &self,
        node: &Node,
        channel: Option<&UpdateChannel>,
        e: &super::node::NodeError,
    ) -> Result<(), AgentError> {
        if self.not_assessed_reported.swap(true, Ordering::Relaxed) {
            return Ok(());
        }
        let text = e.message.clone();
        if assessed_condition(node) != Some(false) {
            self.set_assessed_condition(false, &text).await?;
        }
        self.phase("NotAssessed", &text).await?;
        self.event(channel, true, "BootNotAssessed", text).await;
        Ok(())
    }

    /// The boot is assessed: turn a `False` [`COND_BOOT_ASSESSED`] (of this or an earlier
    /// process) `True`.
    async fn clear_not_assessed(&self, node: &Node) -> Result<(), AgentError> {
        self.not_assessed_reported.store(false, Ordering::Relaxed);
        if assessed_condition(node) == Some(false) {
            self.set_assessed_condition(true, "this boot was assessed by the boot-assessment core")
                .await?;
        }
        Ok(())
    }

    /// One decision and its execution.
    pub async fn reconcile(&self) -> Result<Next, AgentError> {
        let node = self
            .nodes()
            .get(&self.node)
            .await
            .kube_ctx(|| format!("read own Node {}", self.node))?;
        // Annotations of a newer agent than this one: touch nothing on this node.
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        let what = format!("the k3os.io/update-* annotations of Node {}", self.node);
        if let Err(e) = super::format::node_format(&what, &annotations) {
            self.report_format(None, &e).await;
            return Ok(Next::Wait);
        }
        let listed = super::channels::list(&self.client, &self.namespace)
            .await
            .kube_ctx(|| format!("list UpdateChannels in namespace {}", self.namespace))?;
        for newer in &listed.newer {
            let regarding = ObjectReference {
                api_version: Some("k3os.io/v1".into()),
                kind: Some("UpdateChannel".into()),
                name: Some(newer.name.clone()),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            };
            self.report_format(Some(regarding), &newer.error).await;
        }
        self.report_channels(&listed).await;
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let Some(picked) = super::channels::pick(&self.node, &listed.channels, &labels) else {
            return Ok(Next::Wait);
        };
        if !picked.losers.is_empty() {
            let losers: Vec<String> = picked
                .losers
                .iter()
                .map(|(n, why)| format!("{n} ({why})"))
                .collect();
            let note = format!(
                "several UpdateChannels select this node; {} wins because {}; not used: {}",
                picked.channel.metadata.name.as_deref().unwrap_or_default(),
                picked.why,
                losers.join(", ")
            );
            let fresh = {
                let mut last = self.last_conflict.lock().expect("not poisoned");
                let fresh = last.as_deref() != Some(note.as_str());
                *last = Some(note.clone());
                fresh
            };
            if fresh {
                self.event(Some(picked.channel), true, "ChannelConflict", note)
                    .await;
            }
        }
        let channel = picked.channel.clone();
        let name = channel.metadata.name.clone().unwrap_or_default();
        let update = match self.blocking(|ops| ops.status()).await {
            Err(AgentError::Node(e)) if e.is_not_assessed() => {
                self.report_not_assessed(&node, Some(&channel), &e).await?;
                return Ok(Next::Wait);
            }
            other => other?,
        };
        self.clear_not_assessed(&node).await?;
        let staged = match &update.inactive {
            super::decide::Inactive::Staged(v) | super::decide::Inactive::Activated(v) => {
                Some(v.as_str())
            }
            _ => None,
        };
        self.metrics
            .set_versions(update.booted_version.as_deref(), staged);
        let held = channel
            .status
            .as_ref()
            .and_then(|s| s.slot_of(&self.node))
            .map_or(0.0, |s| {
                (Utc::now() - s.claimed_at).num_milliseconds().max(0) as f64 / 1000.0
            });
        self.metrics.set_slot_held(held);
        self.metrics.reconciled(true);
        let view = NodeView {
            name: self.node.clone(),
            labels,
            unschedulable: node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            token: annotations.get(ANN_TOKEN).cloned(),
            update,
        };
        let mut action = decide(&channel, &view, Utc::now());
        // The start-up silence matters only for the slot held when the agent started.
        let silence = self.startup_silence.lock().expect("not poisoned").take();
        if let Action::Continue {
            phase: SlotPhase::Claimed | SlotPhase::Draining,
            version,
        } = &action
        {
            if forfeit(&channel, silence) {
                self.event(Some(&channel), true, "ClaimForfeit", "this agent was silent too long while holding a slot; claiming afresh with a new token".into()).await;
                action = Action::Claim {
                    version: version.clone(),
                };
            }
        }
        tracing::debug!(?action, channel = %name, "decided");
        // A cordon of ours outlives the slot only after an interrupted update (slot reclaimed
        // while draining or rebooting, health rollback without a slot): undo it as soon as no
        // step of a held slot needs it. `Claim` is not such a step: a node without a slot is
        // never left cordoned by us while it waits for one (disruption stays bounded by
        // `concurrency`); the next claim cordons again after fencing.
        let slot_action = matches!(
            action,
            Action::Continue { .. }
                | Action::Confirm { .. }
                | Action::RolledBack { .. }
                | Action::FinishRollback
                | Action::Release { .. }
                | Action::Idle(IdleReason::ForeignSlot)
        );
        if !slot_action && annotations.get(ANN_CORDONED).is_some_and(|v| v == "true") {
            self.undo_cordon().await?;
        }
        self.execute(&channel, &view, action).await
    }

    pub(super) async fn execute(
        &self,
        ch: &UpdateChannel,
        view: &NodeView,
        action: Action,
    ) -> Result<Next, AgentError> {
        let name = ch.metadata.name.clone().unwrap_or_default();
        let store = self.store(&name);
        let now = Utc::now;
        let token = view.token.clone().unwrap_or_default();
        match action {
            Action::Idle(reason) => {
                if let IdleReason::FailedHere(v) = &reason {
                    self.event_once(
                        Some(ch),
                        true,
                        "NotRetrying",
                        format!("{v} failed on this node before; not retrying it"),
                    )
                    .await;
                }
                if let IdleReason::ForeignSlot = &reason {
                    // Only one agent runs per node; a slot of this node under another token
                    // belongs to an earlier instance (or one whose claim outlived its token
                    // annotation). Take it over in place: the fence stops that instance.
                    self.event(Some(ch), true, "SlotTakenOver", "the channel holds a slot for this node under another token (an earlier agent instance); taking it over".into()).await;
                    let version = ch
                        .status
                        .as_ref()
                        .and_then(|s| s.slot_of(&self.node))
                        .and_then(|s| s.version.clone())
                        .or_else(|| ch.target_version())
                        .unwrap_or_default();
                    return Box::pin(self.execute(ch, view, Action::Claim { version })).await;
                }
                if reason == IdleReason::UpToDate {
                    self.annotate(&[
                        (ANN_PHASE, Some("UpToDate")),
                        (ANN_PROGRESS, None),
                        (ANN_MESSAGE, None),
                    ])
                    .await?;
                }
                Ok(Next::Wait)
            }
            Action::Invalid(msg) => {
                self.event_once(
                    Some(ch),
                    true,
                    "InvalidChannel",
                    format!("UpdateChannel {name}: {msg}"),
                )
                .await;
                Ok(Next::Wait)
            }
            Action::Stage { version } => self.stage(ch, &version).await,
            Action::Paused { version } => {
                self.phase(
                    "Paused",
                    &format!("claims paused: too many failures of {version}"),
                )
                .await?;
                self.event_once(
                    Some(ch),
                    true,
                    "Paused",
                    format!("not updating to {version}: the channel is paused after failures"),
                )
                .await;
                Ok(Next::Wait)
            }
            Action::WaitForWindow { next } => {
                let msg = match next {
                    Some(t) => format!("staged; waiting for the window starting {t}"),
                    None => {
                        "staged; the window is too short for drain timeout + reboot timeout".into()
                    }
                };
                self.phase("WaitingForWindow", &msg).await?;
                self.event_once(Some(ch), false, "WaitingForWindow", msg)
                    .await;
                Ok(Next::Wait)
            }
            Action::Claim { version } => {
                let now_s = Utc::now().timestamp().max(0) as u64;
                let not_before = self.claim_not_before.load(Ordering::Relaxed);
                if now_s < not_before {
                    self.phase(
                        "BackingOff",
                        &format!(
                            "the last update attempt was aborted; next claim in {}s",
                            not_before - now_s
                        ),
                    )
                    .await?;
                    return Ok(Next::Wait);
                }
                let token = format!(
                    "{:016x}{:016x}",
                    rand::thread_rng().gen::<u64>(),
                    rand::thread_rng().gen::<u64>()
                );
                self.annotate(&[(ANN_TOKEN, Some(&token))]).await?;
                match slots::claim(&store, &self.node, &token, &version, now()).await? {
                    ClaimOutcome::Claimed | ClaimOutcome::AlreadyHeld => {
                        self.phase("Claimed", &format!("holding an update slot for {version}"))
                            .await?;
                        self.event(
                            Some(ch),
                            false,
                            "SlotClaimed",
                            format!("claimed an update slot of {name} to install {version}"),
                        )
                        .await;
                        Ok(Next::Again)
                    }
                    ClaimOutcome::Full(holders) => {
                        let msg = format!("all slots taken by {}", holders.join(", "));
                        self.phase("WaitingForSlot", &msg).await?;
                        self.event_once(Some(ch), false, "WaitingForSlot", msg)
                            .await;
                        Ok(Next::Wait)
                    }
                    ClaimOutcome::Paused => Ok(Next::Again),
                    ClaimOutcome::TargetChanged(_) => Ok(Next::Again),
                }
            }
            Action::Continue { phase, version } => match phase {
                SlotPhase::Claimed | SlotPhase::Draining => {
                    self.disrupt(ch, &store, view, &token, &version).await
                }
                SlotPhase::Rebooting => self.flip_and_reboot(ch, &store, &token, &version).await,
                SlotPhase::RollingBack => {
                    self.phase("RollingBack", &format!("rebooting back from {version}"))
                        .await?;
                    self.event(
                        Some(ch),
                        true,
                        "RebootingBack",
                        format!("rebooting back from the failed {version}"),
                    )
                    .await;
                    self.blocking(|ops| ops.reboot()).await?;
                    Ok(Next::Wait)
                }
            },
            Action::Confirm { version, held } => {
                self.confirm(ch, &store, &token, &version, held).await
            }
            Action::RolledBack { version } => {
                // The boot-assessment core recorded why (its verdict and decision log): report
                // that, not a guess from which slot booted.
                let (event, reason) =
                    rolled_back_reason(&version, view.update.failed_trial.as_ref());
                self.event(Some(ch), true, event, reason.clone()).await;
                self.undo_cordon().await?;
                self.metrics.count(Outcome::Failure);
                self.metrics.count(Outcome::Rollback);
                let out = slots::record_failure(
                    &store,
                    &self.node,
                    Some(&token),
                    &version,
                    &reason,
                    false,
                    now(),
                )
                .await?;
                self.failure_recorded(
                    ch,
                    &version,
                    out,
                    "back on the old slot after a failed update",
                )
                .await;
                self.phase("Failed", &reason).await?;
                Ok(Next::Again)
            }
            Action::FinishRollback => {
                self.undo_cordon().await?;
                let released = slots::release(&store, &self.node, &token, now()).await?;
                self.phase("Failed", "back on the old slot after a failed update")
                    .await?;
                self.event(
                    Some(ch),
                    true,
                    "RollbackFinished",
                    "back on the old slot".into(),
                )
                .await;
                self.slot_released(ch, released, "back on the old slot after a failed update")
                    .await;
                Ok(Next::Again)
            }
            Action::Release { reason } => {
                self.undo_cordon().await?;
                let released = slots::release(&store, &self.node, &token, now()).await?;
                self.slot_released(ch, released, &reason).await;
                Ok(Next::Again)
            }
        }
    }
}

/// The Node condition saying whether this boot was assessed (`k3os-ops slot confirm` ran);
/// written `False` while the agent waits for it.
pub const COND_BOOT_ASSESSED: &str = "K3osBootAssessed";

/// The [`COND_BOOT_ASSESSED`] condition of `node`, if present.
fn assessed_condition(node: &Node) -> Option<bool> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == COND_BOOT_ASSESSED)
        .map(|c| c.status == "True")
}

/// The Event reason and the failure text for a node back on its old slot after trying
/// `version`, from what the boot-assessment core recorded about the failed trial.
pub fn rolled_back_reason(
    version: &str,
    recorded: Option<&super::decide::TrialFailure>,
) -> (&'static str, String) {
    use super::decide::{FALLBACK_TAKEN, HEALTH_FAILED};
    match recorded {
        Some(f) if f.event == HEALTH_FAILED => (
            "HealthCheckFailed",
            format!("{version} failed its health checks on this node and was rolled back: {}", f.reason),
        ),
        Some(f) if f.event == FALLBACK_TAKEN => (
            "RolledBack",
            format!("the node came back on its old slot instead of {version} (the bootloader fell back: {})", f.reason),
        ),
        Some(f) => (
            "RolledBack",
            format!("the node came back on its old slot instead of {version} ({}: {})", f.event, f.reason),
        ),
        None => (
            "RolledBack",
            format!("the node came back on its old slot instead of {version} (the bootloader fell back)"),
        ),
    }
}

/// Whether a claim held when the agent started is forfeit: the node's Lease had been silent
/// for half the reboot timeout or more, so other agents may already be reclaiming it.
fn forfeit(ch: &UpdateChannel, silence: Option<Duration>) -> bool {
    let Ok(policy) = Policy::from_spec(&ch.spec) else {
        return false;
    };
    silence.is_some_and(|s| s >= policy.reboot_timeout / 2)
}
