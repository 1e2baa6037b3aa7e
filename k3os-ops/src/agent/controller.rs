//! The agent's control loop: reads the state, asks [`decide`] for the next step, executes it,
//! and repeats. Background tasks renew this node's liveness Lease, reclaim slots of dead nodes
//! and (while holding the poller Lease) resolve `latest`.
//!
//! Per-node progress lives on the Node as `k3os.io/update-*` annotations (never on the shared
//! channel): `update-phase`, `update-target`, `update-progress`, `update-message`,
//! `update-token` (the claim token, written before the claim so a restarted agent finds its
//! slot) and `update-cordoned` (set just before this agent cordons, so only a cordon of ours is
//! undone).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use rand::Rng;
use serde_json::json;

use super::crd::{SlotPhase, UpdateChannel, COND_INVALID};
use super::decide::{decide, Action, IdleReason, NodeView, Policy};
use super::drain;
use super::kube_store::{
    acquire_lease, node_lease_name, poller_lease_name, KubeChannelStore, LeaseOutcome,
};
use super::metrics::Outcome;
use super::node::{ConfirmResult, NodeOps, StageProgress};
use super::slots::{self, ClaimOutcome, FenceOutcome, LivenessObserver};
use super::AgentArgs;

/// Node annotation keys.
pub const ANN_PHASE: &str = "k3os.io/update-phase";
pub const ANN_TARGET: &str = "k3os.io/update-target";
pub const ANN_PROGRESS: &str = "k3os.io/update-progress";
pub const ANN_MESSAGE: &str = "k3os.io/update-message";
pub const ANN_TOKEN: &str = "k3os.io/update-token";
pub const ANN_CORDONED: &str = "k3os.io/update-cordoned";

/// Seconds a node liveness Lease is declared valid (informational: staleness is judged by
/// observers against `spec.rebootTimeout` on their own clocks).
const NODE_LEASE_SECS: i32 = 60;
/// How often the node Lease is renewed.
const LIVENESS_PERIOD: Duration = Duration::from_secs(15);
/// Bounds of the period between looks for dead slot holders.
const MIN_RECLAIM_PERIOD: Duration = Duration::from_secs(10);
const MAX_RECLAIM_PERIOD: Duration = Duration::from_secs(120);

/// Period between looks for dead holders: a quarter of the shortest reboot timeout, within
/// [10 s, 120 s], ±25 % jitter; the shortest period while no valid channel exists (so a channel
/// created after the agent started is looked at within seconds, not after the 2-minute cap).
/// Every agent looks (any may reclaim), so on a large fleet this bounds the reads (two per
/// held slot per look) while detection stays within a fraction of the timeout.
pub fn reclaim_period(shortest_reboot_timeout: Option<Duration>) -> Duration {
    let base = shortest_reboot_timeout
        .map_or(MIN_RECLAIM_PERIOD, |t| t / 4)
        .clamp(MIN_RECLAIM_PERIOD, MAX_RECLAIM_PERIOD);
    base.mul_f64(rand::thread_rng().gen_range(0.75..1.25))
}
/// How often the poller looks for new or changed channels (a list), so `latest` is resolved
/// within seconds of a channel's creation or spec change instead of on the next poll tick.
const POLL_LOOK_PERIOD: Duration = Duration::from_secs(10);
/// Least time between two writes of the stage progress annotation.
const PROGRESS_PERIOD: Duration = Duration::from_secs(15);
/// How long after a healthy boot the Node may take to report Ready.
const READY_WAIT: Duration = Duration::from_secs(300);

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
    /// Stage failures in a row, for back-off.
    stage_failures: AtomicU64,
    /// Earliest next stage attempt (unix seconds).
    stage_not_before: AtomicU64,
    /// Aborted disruptions (drain/activate failed, slot lost) in a row, for back-off.
    claim_failures: AtomicU64,
    /// Earliest next claim (unix seconds).
    claim_not_before: AtomicU64,
    /// UID of this node, for Event references.
    node_uid: Mutex<Option<String>>,
    last_note: Mutex<Option<String>>,
    /// The last ChannelConflict note published (reported again only when it changes).
    last_conflict: Mutex<Option<String>>,
    /// How long this node's Lease had not been renewed when the agent started (`None`: no
    /// Lease). Taken by the first reconcile that finds a held slot: a claim held through a
    /// silence of half the reboot timeout may already be judged dead by other agents, so it is
    /// forfeit and replaced by a fresh claim (a fresh token).
    startup_silence: Mutex<Option<Duration>>,
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
            stage_failures: AtomicU64::new(0),
            stage_not_before: AtomicU64::new(0),
            claim_failures: AtomicU64::new(0),
            claim_not_before: AtomicU64::new(0),
            node_uid: Mutex::new(None),
            last_note: Mutex::new(None),
            last_conflict: Mutex::new(None),
            startup_silence: Mutex::new(None),
        }
    }

    /// Record how long this node's Lease was silent before this agent started.
    pub fn set_startup_silence(&self, silence: Option<Duration>) {
        *self.startup_silence.lock().expect("not poisoned") = silence;
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn store(&self, channel: &str) -> KubeChannelStore {
        KubeChannelStore::new(self.client.clone(), &self.namespace, channel)
    }

    async fn node_ref(&self) -> ObjectReference {
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

    /// Log a failed reconciliation and publish it (once per distinct text) as a
    /// `ReconcileError` event: the error chain as `Display` text, never a debug dump.
    pub async fn report_error(&self, e: &anyhow::Error) {
        let text = super::errors::anyhow_message(e);
        self.metrics.reconciled(false);
        tracing::error!("reconcile: {text}");
        self.event_once(None, true, "ReconcileError", text).await;
    }

    /// Emit an event only when the note differs from the last one (for waiting states that
    /// are re-decided every resync).
    async fn event_once(
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
    pub async fn annotate(&self, annotations: &[(&str, Option<&str>)]) -> anyhow::Result<()> {
        if let Some((_, Some(phase))) = annotations.iter().find(|(k, _)| *k == ANN_PHASE) {
            self.metrics.set_phase(phase);
        }
        let map: serde_json::Map<String, serde_json::Value> = annotations
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    v.map_or(serde_json::Value::Null, |v| json!(v)),
                )
            })
            .collect();
        self.nodes()
            .patch(
                &self.node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": map}})),
            )
            .await
            .with_context(|| format!("annotate Node {}", self.node))?;
        Ok(())
    }

    async fn phase(&self, phase: &str, message: &str) -> anyhow::Result<()> {
        self.annotate(&[(ANN_PHASE, Some(phase)), (ANN_MESSAGE, Some(message))])
            .await
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn NodeOps) -> Result<T, super::node::NodeError> + Send + 'static,
    ) -> anyhow::Result<T> {
        let ops = self.ops.clone();
        Ok(tokio::task::spawn_blocking(move || f(ops.as_ref())).await??)
    }

    /// Write the `Invalid` condition of channel `name` (`Some(problem)`: True, `None`:
    /// False) unless it already says so; a merge patch of the status carrying the
    /// resourceVersion read, so concurrent agents write it once. Returns whether this agent
    /// wrote it (and so reports it as an Event).
    async fn set_invalid(
        &self,
        name: &str,
        resource_version: Option<&str>,
        conditions: &serde_json::Value,
        problem: Option<&str>,
    ) -> bool {
        let current: Vec<serde_json::Value> = conditions.as_array().cloned().unwrap_or_default();
        let old = current.iter().find(|c| c["type"] == COND_INVALID);
        let status = if problem.is_some() { "True" } else { "False" };
        let message = problem.unwrap_or_default();
        match old {
            Some(c) if c["status"] == status && c["message"] == message => return false,
            None if problem.is_none() => return false,
            _ => {}
        }
        let mut next: Vec<serde_json::Value> = current
            .iter()
            .filter(|c| c["type"] != COND_INVALID)
            .cloned()
            .collect();
        next.push(json!({
            "type": COND_INVALID,
            "status": status,
            "reason": if problem.is_some() { "InvalidSpec" } else { "ValidSpec" },
            "message": message,
            "lastTransitionTime": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        }));
        let patch = json!({
            "metadata": {"resourceVersion": resource_version},
            "status": {"conditions": next},
        });
        let api = super::channels::dynamic_api(self.client.clone(), &self.namespace);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(
                    "set condition Invalid of UpdateChannel {}/{name}: {}",
                    self.namespace,
                    super::errors::kube_message(&e)
                );
                false
            }
        }
    }

    /// Report channels that do not decode or do not validate on the channel itself
    /// (condition `Invalid` + an Event, by the one agent whose write lands), and clear the
    /// condition of channels that are valid again.
    async fn report_channels(&self, listed: &super::channels::Listed) {
        for bad in &listed.bad {
            let problem = format!("UpdateChannel {}: {}", bad.name, bad.error);
            if self
                .set_invalid(
                    &bad.name,
                    bad.resource_version.as_deref(),
                    &bad.conditions,
                    Some(&problem),
                )
                .await
            {
                let regarding = ObjectReference {
                    api_version: Some("k3os.io/v1".into()),
                    kind: Some("UpdateChannel".into()),
                    name: Some(bad.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..Default::default()
                };
                tracing::warn!(reason = "InvalidChannel", "{problem}");
                let n = super::events::Note {
                    warning: true,
                    reason: "InvalidChannel",
                    note: &problem,
                };
                if let Err(e) = self.events.publish(&regarding, None, &n).await {
                    tracing::warn!(
                        "could not publish event InvalidChannel on UpdateChannel {}: {}",
                        bad.name,
                        super::errors::kube_message(&e)
                    );
                }
            }
        }
        for ch in &listed.channels {
            let name = ch.metadata.name.clone().unwrap_or_default();
            let problem = Policy::from_spec(&ch.spec)
                .err()
                .map(|e| format!("UpdateChannel {name}: {e}"));
            let conditions = serde_json::to_value(
                ch.status
                    .as_ref()
                    .map(|s| s.conditions.clone())
                    .unwrap_or_default(),
            )
            .unwrap_or_default();
            if self
                .set_invalid(
                    &name,
                    ch.metadata.resource_version.as_deref(),
                    &conditions,
                    problem.as_deref(),
                )
                .await
            {
                if let Some(p) = problem {
                    self.event(Some(ch), true, "InvalidChannel", p).await;
                }
            }
        }
    }

    /// One decision and its execution.
    pub async fn reconcile(&self) -> anyhow::Result<Next> {
        let node = self
            .nodes()
            .get(&self.node)
            .await
            .with_context(|| format!("read own Node {}", self.node))?;
        let listed = super::channels::list(&self.client, &self.namespace)
            .await
            .with_context(|| format!("list UpdateChannels in namespace {}", self.namespace))?;
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
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        let update = self.blocking(|ops| ops.status()).await?;
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

    async fn execute(
        &self,
        ch: &UpdateChannel,
        view: &NodeView,
        action: Action,
    ) -> anyhow::Result<Next> {
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
                let reason = format!("the node came back on its old slot instead of {version} (the bootloader fell back)");
                self.event(Some(ch), true, "RolledBack", reason.clone())
                    .await;
                self.undo_cordon().await?;
                self.metrics.count(Outcome::Failure);
                self.metrics.count(Outcome::Rollback);
                slots::record_failure(
                    &store,
                    &self.node,
                    Some(&token),
                    &version,
                    &reason,
                    false,
                    now(),
                )
                .await?;
                self.phase("Failed", &reason).await?;
                Ok(Next::Again)
            }
            Action::FinishRollback => {
                self.undo_cordon().await?;
                slots::release(&store, &self.node, &token, now()).await?;
                self.phase("Failed", "back on the old slot after a failed update")
                    .await?;
                self.event(
                    Some(ch),
                    true,
                    "RollbackFinished",
                    "back on the old slot; slot released".into(),
                )
                .await;
                Ok(Next::Again)
            }
            Action::Release { reason } => {
                self.undo_cordon().await?;
                slots::release(&store, &self.node, &token, now()).await?;
                self.event(
                    Some(ch),
                    false,
                    "SlotReleased",
                    format!("released the update slot: {reason}"),
                )
                .await;
                Ok(Next::Again)
            }
        }
    }

    async fn stage(&self, ch: &UpdateChannel, version: &str) -> anyhow::Result<Next> {
        let now_s = Utc::now().timestamp().max(0) as u64;
        if now_s < self.stage_not_before.load(Ordering::Relaxed) {
            return Ok(Next::Wait);
        }
        self.annotate(&[
            (ANN_PHASE, Some("Staging")),
            (ANN_TARGET, Some(version)),
            (
                ANN_MESSAGE,
                Some("downloading and verifying into the inactive slot"),
            ),
        ])
        .await?;
        self.event(
            Some(ch),
            false,
            "Staging",
            format!(
                "staging {version} from {} into the inactive slot",
                ch.spec.url
            ),
        )
        .await;
        let (tx, mut rx) = tokio::sync::watch::channel(String::new());
        rx.mark_unchanged();
        let progress = Arc::new(AnnotationProgress::new(tx, self.metrics.clone()));
        let url = ch.spec.url.clone();
        let v = version.to_string();
        let p = progress.clone();
        let pinned = ch.spec.pinned_version().is_some();
        let work = self.blocking(move |ops| ops.stage(&url, &v, pinned, p.as_ref()));
        tokio::pin!(work);
        // The annotation is written at most every PROGRESS_PERIOD (the Node object is shared
        // with the kubelet; a byte counter must not flood the API server).
        let mut last_write: Option<tokio::time::Instant> = None;
        let mut ticker = tokio::time::interval(PROGRESS_PERIOD);
        let result = loop {
            tokio::select! {
                r = &mut work => break r,
                _ = ticker.tick() => {
                    let due = last_write.is_none_or(|t| t.elapsed() >= PROGRESS_PERIOD);
                    if due && rx.has_changed().unwrap_or(false) {
                        let text = rx.borrow_and_update().clone();
                        if let Err(e) = self.annotate(&[(ANN_PROGRESS, Some(&text))]).await {
                            tracing::warn!("progress annotation: {e:#}");
                        }
                        last_write = Some(tokio::time::Instant::now());
                    }
                }
            }
        };
        match result {
            Ok(()) => {
                self.stage_failures.store(0, Ordering::Relaxed);
                self.annotate(&[
                    (ANN_PHASE, Some("Staged")),
                    (ANN_PROGRESS, None),
                    (ANN_MESSAGE, Some("verified and staged")),
                ])
                .await?;
                self.event(
                    Some(ch),
                    false,
                    "Staged",
                    format!("{version} verified and staged in the inactive slot"),
                )
                .await;
                Ok(Next::Again)
            }
            Err(e) => {
                let n = self.stage_failures.fetch_add(1, Ordering::Relaxed) + 1;
                let backoff = (60u64 << n.min(6)).min(3600);
                self.stage_not_before
                    .store(now_s + backoff, Ordering::Relaxed);
                let msg = format!(
                    "staging {version} failed (attempt {n}, next in {backoff}s): {}",
                    super::errors::anyhow_message(&e)
                );
                self.phase("StageFailed", &msg).await?;
                self.event(Some(ch), true, "StageFailed", msg).await;
                Ok(Next::Wait)
            }
        }
    }

    /// After an aborted disruption: wait 5 min, doubling per abort in a row, up to 1 h, before
    /// claiming again (a drain that is refused must not cordon the node every resync).
    fn back_off_claims(&self) {
        let n = self.claim_failures.fetch_add(1, Ordering::Relaxed) + 1;
        let secs = (300u64 << (n - 1).min(4)).min(3600);
        let now_s = Utc::now().timestamp().max(0) as u64;
        self.claim_not_before.store(now_s + secs, Ordering::Relaxed);
    }

    /// Uncordon if (and only if) this agent cordoned the node.
    async fn undo_cordon(&self) -> anyhow::Result<()> {
        let node = self.nodes().get(&self.node).await?;
        let ours = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_CORDONED))
            .is_some_and(|v| v == "true");
        if ours {
            drain::set_unschedulable(&self.nodes(), &self.node, false).await?;
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

    /// Abort after losing the slot: undo our cordon, tell why.
    async fn abort_lost(&self, ch: &UpdateChannel, step: &str) -> anyhow::Result<Next> {
        self.back_off_claims();
        self.undo_cordon().await?;
        self.phase("Aborted", &format!("lost the update slot before {step}"))
            .await?;
        self.event(Some(ch), true, "SlotLost", format!("the update slot is gone or carries another token; aborted before {step} and undid the cordon")).await;
        Ok(Next::Again)
    }

    async fn disrupt(
        &self,
        ch: &UpdateChannel,
        store: &KubeChannelStore,
        view: &NodeView,
        token: &str,
        version: &str,
    ) -> anyhow::Result<Next> {
        let policy = Policy::from_spec(&ch.spec).map_err(anyhow::Error::msg)?;
        let entry = match slots::fence(
            store,
            &self.node,
            token,
            SlotPhase::Draining,
            Some(view.unschedulable),
            Utc::now(),
        )
        .await?
        {
            FenceOutcome::Held(e) => e,
            FenceOutcome::Lost => return self.abort_lost(ch, "cordon").await,
        };
        if !entry.was_unschedulable.unwrap_or(false) && !view.unschedulable {
            self.annotate(&[(ANN_CORDONED, Some("true"))]).await?;
            drain::set_unschedulable(&self.nodes(), &self.node, true).await?;
            self.event(Some(ch), false, "Cordoned", "cordoned the node".into())
                .await;
        }
        if !ch.spec.drain.skip {
            self.phase(
                "Draining",
                &format!("evicting pods (timeout {:?})", policy.drain_timeout),
            )
            .await?;
            self.event(
                Some(ch),
                false,
                "Draining",
                "evicting pods through the Eviction API".into(),
            )
            .await;
            let drain_started = tokio::time::Instant::now();
            let drained = drain::drain(
                &self.client,
                &self.node,
                &ch.spec.drain,
                self.self_pod.as_deref(),
                policy.drain_timeout,
                self.drain_retry,
            )
            .await;
            self.metrics
                .observe_drain(drain_started.elapsed().as_secs_f64());
            match drained {
                Ok(r) => {
                    self.event(
                        Some(ch),
                        false,
                        "Drained",
                        format!(
                            "evicted {} pod(s) ({} disruption-budget retries)",
                            r.evicted.len(),
                            r.budget_retries
                        ),
                    )
                    .await;
                }
                Err(e) => {
                    self.back_off_claims();
                    self.event(
                        Some(ch),
                        true,
                        "DrainFailed",
                        format!("{e}; giving up this update attempt"),
                    )
                    .await;
                    self.undo_cordon().await?;
                    slots::release(store, &self.node, token, Utc::now()).await?;
                    self.phase("DrainFailed", &e.to_string()).await?;
                    return Ok(Next::Wait);
                }
            }
        }
        self.flip_and_reboot(ch, store, token, version).await
    }

    async fn flip_and_reboot(
        &self,
        ch: &UpdateChannel,
        store: &KubeChannelStore,
        token: &str,
        version: &str,
    ) -> anyhow::Result<Next> {
        match slots::fence(
            store,
            &self.node,
            token,
            SlotPhase::Rebooting,
            None,
            Utc::now(),
        )
        .await?
        {
            FenceOutcome::Held(_) => {}
            FenceOutcome::Lost => return self.abort_lost(ch, "the bootloader flip").await,
        }
        if let Err(e) = self.blocking(|ops| ops.activate()).await {
            self.back_off_claims();
            self.event(
                Some(ch),
                true,
                "ActivateFailed",
                super::errors::anyhow_message(&e),
            )
            .await;
            self.undo_cordon().await?;
            slots::release(store, &self.node, token, Utc::now()).await?;
            self.phase("ActivateFailed", &super::errors::anyhow_message(&e))
                .await?;
            return Ok(Next::Wait);
        }
        self.event(
            Some(ch),
            false,
            "Activated",
            format!("the bootloader tries {version} at the next boot"),
        )
        .await;
        // Last fence before the point of no return.
        match slots::fence(
            store,
            &self.node,
            token,
            SlotPhase::Rebooting,
            None,
            Utc::now(),
        )
        .await?
        {
            FenceOutcome::Held(_) => {}
            FenceOutcome::Lost => return self.abort_lost(ch, "the reboot").await,
        }
        self.phase("Rebooting", &format!("rebooting into {version}"))
            .await?;
        self.event(
            Some(ch),
            false,
            "Rebooting",
            format!("syncing and rebooting into {version}"),
        )
        .await;
        self.blocking(|ops| ops.reboot()).await?;
        Ok(Next::Wait)
    }

    async fn node_ready(&self) -> anyhow::Result<bool> {
        let node = self.nodes().get(&self.node).await?;
        Ok(node
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"))
    }

    async fn confirm(
        &self,
        ch: &UpdateChannel,
        store: &KubeChannelStore,
        token: &str,
        version: &str,
        held: bool,
    ) -> anyhow::Result<Next> {
        self.phase("Confirming", &format!("checking health of {version}"))
            .await?;
        self.event(
            Some(ch),
            false,
            "Confirming",
            format!(
                "booted {version} on trial; waiting for Node Ready and running the health checks"
            ),
        )
        .await;
        let start = tokio::time::Instant::now();
        let mut ready = self.node_ready().await?;
        while !ready && start.elapsed() < READY_WAIT {
            tokio::time::sleep(Duration::from_secs(5)).await;
            ready = self.node_ready().await?;
        }
        let verdict = if ready {
            self.blocking(|ops| ops.confirm()).await?
        } else {
            let reason = format!("Node not Ready within {READY_WAIT:?} after booting {version}");
            let r = reason.clone();
            self.blocking(move |ops| ops.rollback(&r)).await?;
            ConfirmResult::RolledBack(reason)
        };
        match verdict {
            ConfirmResult::Healthy => {
                self.claim_failures.store(0, Ordering::Relaxed);
                self.undo_cordon().await?;
                if held {
                    slots::release(store, &self.node, token, Utc::now()).await?;
                }
                self.annotate(&[
                    (ANN_PHASE, Some("UpToDate")),
                    (ANN_MESSAGE, Some(&format!("running {version}"))),
                    (ANN_PROGRESS, None),
                ])
                .await?;
                self.event(
                    Some(ch),
                    false,
                    "UpdateSucceeded",
                    format!("{version} is healthy and confirmed; slot released"),
                )
                .await;
                Ok(Next::Again)
            }
            ConfirmResult::RolledBack(reason) => {
                self.metrics.count(Outcome::Failure);
                self.metrics.count(Outcome::Rollback);
                let t = held.then_some(token);
                slots::record_failure(store, &self.node, t, version, &reason, true, Utc::now())
                    .await?;
                self.phase("RollingBack", &reason).await?;
                self.event(
                    Some(ch),
                    true,
                    "HealthCheckFailed",
                    format!("{version}: {reason}; rebooting back"),
                )
                .await;
                self.blocking(|ops| ops.reboot()).await?;
                Ok(Next::Wait)
            }
        }
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

/// Stage progress turned into a short text, sent to the loop that writes the annotation.
struct AnnotationProgress {
    tx: tokio::sync::watch::Sender<String>,
    metrics: Arc<super::metrics::Metrics>,
    state: Mutex<(String, u64, u64)>,
}

impl AnnotationProgress {
    fn new(tx: tokio::sync::watch::Sender<String>, metrics: Arc<super::metrics::Metrics>) -> Self {
        AnnotationProgress {
            tx,
            metrics,
            state: Mutex::new((String::new(), 0, 0)),
        }
    }
    fn send(&self) {
        let s = self.state.lock().expect("not poisoned");
        let pct = s.1.saturating_mul(100).checked_div(s.2).unwrap_or(100);
        let _ = self.tx.send(format!(
            "{} {pct}% ({} of {} MiB)",
            s.0,
            s.1 >> 20,
            s.2 >> 20
        ));
    }
}

impl StageProgress for AnnotationProgress {
    fn begin(&self, what: &str, total: u64, already: u64) {
        *self.state.lock().expect("not poisoned") = (what.to_string(), already, total);
        self.send();
    }
    fn advance(&self, bytes: u64) {
        self.metrics.add_downloaded(bytes);
        self.state.lock().expect("not poisoned").1 += bytes;
        self.send();
    }
    fn end(&self) {
        let mut s = self.state.lock().expect("not poisoned");
        s.1 = s.2;
        drop(s);
        self.send();
    }
}

/// Renew this node's liveness Lease forever.
async fn renew_node_lease(client: Client, namespace: String, node: String) {
    let leases: Api<Lease> = Api::namespaced(client, &namespace);
    let name = node_lease_name(&node);
    loop {
        if let Err(e) = acquire_lease(&leases, &name, &node, NODE_LEASE_SECS).await {
            tracing::warn!("renew Lease {namespace}/{name}: {e}");
        }
        tokio::time::sleep(LIVENESS_PERIOD).await;
    }
}

/// Reclaim dead holders' slots in every channel, forever.
pub async fn reclaim_loop(agent: Arc<Agent>) {
    let mut observers: BTreeMap<String, LivenessObserver> = BTreeMap::new();
    loop {
        let mut shortest: Option<Duration> = None;
        match super::channels::list(&agent.client, &agent.namespace).await {
            Ok(list) => {
                for ch in list.channels {
                    let name = ch.metadata.name.clone().unwrap_or_default();
                    let Ok(policy) = Policy::from_spec(&ch.spec) else {
                        continue;
                    };
                    shortest = Some(shortest.map_or(policy.reboot_timeout, |s: Duration| {
                        s.min(policy.reboot_timeout)
                    }));
                    let obs = observers.entry(name.clone()).or_default();
                    let store = agent.store(&name);
                    match slots::reclaim_dead(
                        &store,
                        &agent.node,
                        obs,
                        policy.reboot_timeout,
                        tokio::time::Instant::now(),
                        Utc::now(),
                    )
                    .await
                    {
                        Ok(done) => {
                            for r in done {
                                agent.metrics.count(Outcome::Reclaim);
                                let why = match r.reason {
                                    slots::DeadReason::NodeDeleted => {
                                        "its Node was deleted".to_string()
                                    }
                                    slots::DeadReason::LeaseStale(d) => {
                                        format!("its Lease was not renewed for {}s", d.as_secs())
                                    }
                                };
                                let failure = if r.failure_recorded {
                                    " (recorded as a failure of its version)"
                                } else {
                                    ""
                                };
                                agent
                                    .event(
                                        Some(&ch),
                                        true,
                                        "SlotReclaimed",
                                        format!(
                                            "reclaimed the slot of node {}: {why}{failure}",
                                            r.slot.node
                                        ),
                                    )
                                    .await;
                            }
                        }
                        Err(e) => tracing::warn!("reclaim in {name}: {e}"),
                    }
                }
            }
            Err(e) => tracing::warn!("list UpdateChannels: {}", super::errors::kube_message(&e)),
        }
        tokio::time::sleep(reclaim_period(shortest)).await;
    }
}

/// Resolve `latest` for each channel whose poller Lease this node holds, forever: every
/// `period`, and at once (within [`POLL_LOOK_PERIOD`]) when a channel appears or its spec
/// changes (new `metadata.generation`).
pub async fn poll_loop(agent: Arc<Agent>, period: Duration) {
    let leases: Api<Lease> = Api::namespaced(agent.client.clone(), &agent.namespace);
    let lease_secs = i32::try_from(period.as_secs().saturating_mul(3)).unwrap_or(i32::MAX);
    // Per channel: (uid, generation) last looked at, and when.
    type Seen = (Option<String>, Option<i64>);
    let mut looked: BTreeMap<String, (Seen, tokio::time::Instant)> = BTreeMap::new();
    loop {
        if let Ok(list) = super::channels::list(&agent.client, &agent.namespace).await {
            let names: Vec<String> = list
                .channels
                .iter()
                .filter_map(|c| c.metadata.name.clone())
                .collect();
            looked.retain(|n, _| names.contains(n));
            for ch in list.channels {
                if ch.spec.pinned_version().is_some() {
                    continue;
                }
                let name = ch.metadata.name.clone().unwrap_or_default();
                let key = (ch.metadata.uid.clone(), ch.metadata.generation);
                let now = tokio::time::Instant::now();
                let due = looked
                    .get(&name)
                    .is_none_or(|(k, at)| *k != key || now.duration_since(*at) >= period);
                if !due {
                    continue;
                }
                looked.insert(name.clone(), (key, now));
                match acquire_lease(&leases, &poller_lease_name(&name), &agent.node, lease_secs)
                    .await
                {
                    Ok(LeaseOutcome::Held) => {}
                    Ok(LeaseOutcome::HeldBy(_)) => continue,
                    Err(e) => {
                        tracing::warn!("poller Lease of {name}: {e}");
                        continue;
                    }
                }
                let url = ch.spec.url.clone();
                let resolved = agent.blocking(move |ops| ops.resolve_latest(&url)).await;
                let store = agent.store(&name);
                let res = match &resolved {
                    Ok(v) => slots::set_latest(&store, Ok(v), Utc::now()).await,
                    Err(e) => slots::set_latest(&store, Err(&format!("{e:#}")), Utc::now()).await,
                };
                match (&resolved, res) {
                    (_, Err(e)) => tracing::warn!("write latestVersion of {name}: {e}"),
                    (Ok(v), Ok(()))
                        if ch.status.as_ref().and_then(|s| s.latest_version.as_deref())
                            != Some(v) =>
                    {
                        agent
                            .event(
                                Some(&ch),
                                false,
                                "LatestResolved",
                                format!("newest release of {} is {v}", ch.spec.url),
                            )
                            .await;
                    }
                    (Err(e), Ok(())) => {
                        agent
                            .event_once(Some(&ch), true, "ResolveFailed", format!("{e:#}"))
                            .await;
                    }
                    _ => {}
                }
            }
        }
        tokio::time::sleep(period.min(POLL_LOOK_PERIOD)).await;
    }
}

/// Run the agent until a fatal error.
pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let node = args.node_name.clone().context(
        "the node name is required: --node-name or NODE_NAME (DaemonSet: fieldRef spec.nodeName)",
    )?;
    // The start-up line (the image test waits for it). /proc/cmdline is read from the
    // container's own /proc: the kernel command line is not namespaced.
    let cmdline = std::fs::read_to_string("/proc/cmdline")
        .map(|c| format!("{} bytes", c.trim_end().len()))
        .unwrap_or_else(|e| format!("unreadable: {e}"));
    tracing::info!(
        "k3os-ops agent {} starting on node {node} (namespace {}, kernel command line {cmdline}, metrics on {})",
        env!("CARGO_PKG_VERSION"),
        args.namespace,
        args.metrics_addr
    );
    libupgrade::http::install_crypto_provider();
    let client = super::client::infer()
        .await
        .context("connect to the Kubernetes API (in-cluster service account or KUBECONFIG)")?;
    let ops: Arc<dyn NodeOps> = Arc::new(super::node::LibupgradeNode::open(args.config.clone())?);
    let self_pod = args
        .pod_name
        .as_ref()
        .map(|p| format!("{}/{p}", args.namespace));
    let agent = Arc::new(Agent::new(
        client.clone(),
        &args.namespace,
        &node,
        self_pod,
        ops,
    ));
    let leases: Api<Lease> = Api::namespaced(client.clone(), &args.namespace);
    let silence = leases
        .get_opt(&node_lease_name(&node))
        .await
        .with_context(|| format!("read Lease {}/{}", args.namespace, node_lease_name(&node)))?
        .and_then(|l| l.spec?.renew_time)
        .map(|t| {
            let age = k8s_openapi::jiff::Timestamp::now().duration_since(t.0);
            Duration::from_secs_f64(age.as_secs_f64().max(0.0))
        });
    agent.set_startup_silence(silence);

    let bound = super::metrics::spawn(args.metrics_addr, agent.metrics.clone())
        .await
        .with_context(|| {
            format!(
                "listen on {} for /metrics, /healthz, /readyz",
                args.metrics_addr
            )
        })?;
    tracing::info!("serving /metrics, /healthz and /readyz on {bound}");
    tokio::spawn(renew_node_lease(
        client.clone(),
        args.namespace.clone(),
        node.clone(),
    ));
    tokio::spawn(reclaim_loop(agent.clone()));
    tokio::spawn(poll_loop(
        agent.clone(),
        Duration::from_secs(args.poll_secs.max(30)),
    ));

    // Wake on any change of the channels or of this Node; resync periodically regardless.
    let (wake_tx, mut wake_rx) = tokio::sync::mpsc::channel::<()>(1);
    // Untyped, so one malformed channel does not stop the wake-ups (it is reported by the
    // reconcile's list).
    let channels = super::channels::dynamic_api(client.clone(), &args.namespace);
    let tx = wake_tx.clone();
    tokio::spawn(async move {
        let mut s = watcher(channels, watcher::Config::default()).boxed();
        while let Some(ev) = s.next().await {
            if ev.is_ok() {
                let _ = tx.try_send(());
            }
        }
    });
    let nodes: Api<Node> = Api::all(client.clone());
    let tx = wake_tx;
    let field = format!("metadata.name={node}");
    tokio::spawn(async move {
        let mut s = watcher(nodes, watcher::Config::default().fields(&field)).boxed();
        while let Some(ev) = s.next().await {
            if ev.is_ok() {
                let _ = tx.try_send(());
            }
        }
    });

    agent
        .event(
            None,
            false,
            "AgentStarted",
            format!("k3os-ops agent {} started", env!("CARGO_PKG_VERSION")),
        )
        .await;
    let resync = Duration::from_secs(args.resync_secs.max(5));
    let mut errors = 0u32;
    loop {
        match agent.reconcile().await {
            Ok(Next::Again) => {
                errors = 0;
                continue;
            }
            Ok(Next::Wait) => errors = 0,
            Err(e) => {
                errors += 1;
                agent.report_error(&e).await;
            }
        }
        let pause = resync * errors.clamp(1, 10);
        let _ = tokio::time::timeout(pause, wake_rx.recv()).await;
    }
}
