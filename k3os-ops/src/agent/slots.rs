//! Update slots: the only place that writes an `UpdateChannel`'s status.
//!
//! Every write is a compare-and-swap of the whole status, stamped with this agent's status
//! format; a status of a newer format is never written ([`SlotError::Format`]), one of an
//! older format (v0.1.0's has no marker) is read as such and migrated by the write (see
//! [`super::format`]). A slot claimed by an agent of an older release is the same claim: it
//! counts against `concurrency` and only its token moves or releases it.
//!
//! Every write is a compare-and-swap: read the channel, change a copy, `replace_status` with
//! the `resourceVersion` that was read; on a conflict, re-read after a random pause and decide
//! again. Merge patches and server-side apply are never used for the slot list: two agents
//! could each add themselves to a list that had room for one, and the count would exceed
//! `spec.concurrency`.
//!
//! **Dead holders** ([`reclaim_dead`]): a slot whose Node is deleted, or whose holder's Lease
//! went unrenewed for `rebootTimeout` on the observer's own clock, is taken back. What the
//! reclaimer does with the holder's node depends on how far it got:
//! - before its bootloader flip (`Claimed`, `Draining`): nothing irreversible happened, so its
//!   update is abandoned as if its drain had timed out: the reclaimer undoes the holder's own
//!   cordon (only when the node carries the holder's `k3os.io/update-cordoned` mark, never an
//!   admin's cordon), then frees the slot. Leaving it cordoned would disrupt one node more
//!   than `concurrency` allows once the next node cordons; that is what kured and
//!   system-upgrade-controller users expect too: a node their tool cordoned comes back once
//!   the tool gives up on it. A node that is really down is still not scheduled to (the node
//!   controller taints NotReady nodes), and its failure is not the version's: none is recorded.
//! - after the flip (`Rebooting`, `RollingBack`): the node is down or hung in the new version;
//!   it stays cordoned, and the silence is recorded as a failure of that version, so a release
//!   that hangs at boot pauses the rollout instead of taking down one node after another.
//!
//! The functions here are generic over [`ChannelStore`], which the kube client implements
//! ([`super::kube_store`]) and the race-model test implements in memory, so the model drives
//! exactly this code.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;
use tokio::time::Instant;

use super::crd::{
    FailureRecord, SlotEntry, SlotPhase, UpdateChannel, UpdateChannelStatus, COND_DEGRADED,
    COND_LATEST_RESOLVED, COND_PAUSED,
};
use super::format::{self, FormatError, STATUS_FORMAT};

/// Failure of one store call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The object changed since it was read (HTTP 409).
    #[error("conflict: the object changed since it was read")]
    Conflict,
    /// The object does not exist (HTTP 404).
    #[error("not found: {0}")]
    NotFound(String),
    /// Anything else (network, permissions, server errors).
    #[error("{0}")]
    Other(String),
}

/// Failure of a slot operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    #[error("UpdateChannel {channel}: {source}")]
    Store {
        channel: String,
        #[source]
        source: StoreError,
    },
    #[error(
        "UpdateChannel {channel}: still conflicting after {attempts} compare-and-swap attempts"
    )]
    Contention { channel: String, attempts: u32 },
    /// The stored status is in a format newer than this agent knows: nothing was written.
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// The storage the slot protocol needs: one channel with linearizable resourceVersion CAS on
/// its status, plus liveness facts about nodes.
pub trait ChannelStore: Send + Sync {
    /// `namespace/name` of the channel, for messages.
    fn channel_name(&self) -> String;
    /// Read the channel, including `metadata.resourceVersion`.
    fn read(&self) -> impl Future<Output = Result<UpdateChannel, StoreError>> + Send;
    /// Replace the status of `obj` if `obj.metadata.resourceVersion` is still current
    /// ([`StoreError::Conflict`] otherwise); returns the stored object.
    fn replace_status(
        &self,
        obj: &UpdateChannel,
    ) -> impl Future<Output = Result<UpdateChannel, StoreError>> + Send;
    /// Whether a Node of this name exists.
    fn node_exists(&self, node: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// A value that changes whenever the node's liveness Lease is renewed (`None` when the
    /// Lease does not exist).
    fn lease_marker(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send;
    /// Undo the cordon the agent of `node` made, if its mark (`k3os.io/update-cordoned`) is
    /// set: uncordon, then drop the mark. Returns whether it did (used on dead holders).
    fn undo_cordon(&self, node: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// How many times a CAS is retried on conflict before giving up (the caller retries later).
pub const MAX_ATTEMPTS: u32 = 60;

/// What a CAS body decided.
enum Step<T> {
    /// Write the changed status, then return the value.
    Write(T),
    /// Nothing to write; return the value.
    Done(T),
}

/// Random pause before re-reading after a conflict: 20–200 ms, growing with the attempt.
fn jitter(attempt: u32) -> Duration {
    let cap = 20 + 10 * u64::from(attempt.min(18));
    Duration::from_millis(rand::thread_rng().gen_range(20..=cap))
}

/// Keep the derived fields in line with the status: `Paused` and `Degraded` for the
/// channel's current target, and `updating` (all slot holders) for the printer column.
pub fn refresh_conditions(ch: &mut UpdateChannel, now: DateTime<Utc>) {
    let target = ch.target_version();
    let paused = target.as_deref().is_some_and(|v| ch.paused_for(v));
    let max = ch.spec.max_failures;
    let generation = ch.metadata.generation;
    let status = ch.status.get_or_insert_with(UpdateChannelStatus::default);
    let holders: Vec<&str> = status.slots.iter().map(|s| s.node.as_str()).collect();
    status.updating = (!holders.is_empty()).then(|| holders.join(","));
    let failed = target
        .as_deref()
        .map(|v| status.failures_for(v))
        .unwrap_or(0);
    let tv = target.unwrap_or_default();
    status.set_condition(
        COND_PAUSED,
        paused,
        if paused { "TooManyFailures" } else { "Running" },
        if paused {
            format!("{failed} node(s) failed to update to {tv} (maxFailures {max}); new claims are paused. Remove status.failures entries to resume.")
        } else {
            String::new()
        },
        now,
    );
    status.set_condition(
        COND_DEGRADED,
        failed > 0,
        if failed > 0 {
            "UpdateFailed"
        } else {
            "Healthy"
        },
        if failed > 0 {
            let nodes: Vec<&str> = status
                .failures
                .iter()
                .filter(|f| f.version == tv)
                .map(|f| f.node.as_str())
                .collect();
            format!("{tv} failed on {}", nodes.join(", "))
        } else {
            String::new()
        },
        now,
    );
    status.observed_generation = generation;
    // Whatever format was read (v0.1.0 wrote none), the write is in this agent's.
    status.format_version = Some(u64::from(STATUS_FORMAT));
}

/// Refuse a status this agent does not know (newer format): it is never rewritten.
fn known_format(channel: &str, ch: &UpdateChannel) -> Result<(), SlotError> {
    let found = ch.status.as_ref().and_then(|s| s.format_version);
    format::check_status(&format!("the status of UpdateChannel {channel}"), found)?;
    Ok(())
}

async fn cas<S, T>(
    store: &S,
    now: DateTime<Utc>,
    mut body: impl FnMut(&UpdateChannel, &mut UpdateChannelStatus) -> Step<T>,
) -> Result<T, SlotError>
where
    S: ChannelStore,
{
    let channel = store.channel_name();
    let err = |source| SlotError::Store {
        channel: channel.clone(),
        source,
    };
    for attempt in 0..MAX_ATTEMPTS {
        let current = store.read().await.map_err(err)?;
        known_format(&channel, &current)?;
        let mut status = current.status.clone().unwrap_or_default();
        let value = match body(&current, &mut status) {
            Step::Done(v) => return Ok(v),
            Step::Write(v) => v,
        };
        let mut next = current.clone();
        next.status = Some(status);
        refresh_conditions(&mut next, now);
        match store.replace_status(&next).await {
            Ok(_) => return Ok(value),
            Err(StoreError::Conflict) => tokio::time::sleep(jitter(attempt)).await,
            Err(e) => return Err(err(e)),
        }
    }
    Err(SlotError::Contention {
        channel,
        attempts: MAX_ATTEMPTS,
    })
}

/// Result of [`claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The slot is ours now.
    Claimed,
    /// We already held it (e.g. after a restart).
    AlreadyHeld,
    /// All `concurrency` slots are taken by these nodes.
    Full(Vec<String>),
    /// Too many failures of this version: claims are paused.
    Paused,
    /// The channel's target is no longer `version`.
    TargetChanged(Option<String>),
}

/// Claim an update slot for `node` to install `version`, with `token` (random, persisted on
/// the node before this call). A slot this node holds under another token (an earlier agent
/// instance on the same node) is taken over in place, which fences that instance out.
pub async fn claim<S: ChannelStore>(
    store: &S,
    node: &str,
    token: &str,
    version: &str,
    now: DateTime<Utc>,
) -> Result<ClaimOutcome, SlotError> {
    cas(store, now, |ch, st| {
        if let Some(i) = st.slots.iter().position(|s| s.node == node) {
            if st.slots[i].token == token {
                return Step::Done(ClaimOutcome::AlreadyHeld);
            }
            st.slots[i] = new_entry(node, token, version, now);
            return Step::Write(ClaimOutcome::Claimed);
        }
        let target = ch.target_version();
        if target.as_deref() != Some(version) {
            return Step::Done(ClaimOutcome::TargetChanged(target));
        }
        if ch.paused_for(version) {
            return Step::Done(ClaimOutcome::Paused);
        }
        if st.slots.len() >= ch.spec.concurrency.max(1) as usize {
            return Step::Done(ClaimOutcome::Full(
                st.slots.iter().map(|s| s.node.clone()).collect(),
            ));
        }
        st.slots.push(new_entry(node, token, version, now));
        Step::Write(ClaimOutcome::Claimed)
    })
    .await
}

fn new_entry(node: &str, token: &str, version: &str, now: DateTime<Utc>) -> SlotEntry {
    SlotEntry {
        node: node.to_string(),
        token: token.to_string(),
        claimed_at: now,
        phase: SlotPhase::Claimed,
        was_unschedulable: None,
        version: Some(version.to_string()),
    }
}

/// Result of [`fence`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceOutcome {
    /// Still ours; the entry as written (its `was_unschedulable` is the first one recorded).
    Held(SlotEntry),
    /// The slot is gone or carries another token: stop and undo.
    Lost,
}

/// Fencing: move our slot to `phase`, proving we still hold it with `token`. Call before
/// every disruptive step (cordon, bootloader flip, reboot). `was_unschedulable` is recorded
/// only the first time (a restarted agent sees its own cordon and must not record that).
pub async fn fence<S: ChannelStore>(
    store: &S,
    node: &str,
    token: &str,
    phase: SlotPhase,
    was_unschedulable: Option<bool>,
    now: DateTime<Utc>,
) -> Result<FenceOutcome, SlotError> {
    cas(store, now, |_, st| {
        let Some(entry) = st
            .slots
            .iter_mut()
            .find(|s| s.node == node && s.token == token)
        else {
            return Step::Done(FenceOutcome::Lost);
        };
        let mut changed = false;
        if entry.phase != phase {
            entry.phase = phase;
            changed = true;
        }
        if entry.was_unschedulable.is_none() && was_unschedulable.is_some() {
            entry.was_unschedulable = was_unschedulable;
            changed = true;
        }
        let out = FenceOutcome::Held(entry.clone());
        if changed {
            Step::Write(out)
        } else {
            Step::Done(out)
        }
    })
    .await
}

/// Give our slot back. Returns whether it was still ours.
pub async fn release<S: ChannelStore>(
    store: &S,
    node: &str,
    token: &str,
    now: DateTime<Utc>,
) -> Result<bool, SlotError> {
    cas(store, now, |_, st| {
        let before = st.slots.len();
        st.slots.retain(|s| !(s.node == node && s.token == token));
        if st.slots.len() == before {
            Step::Done(false)
        } else {
            Step::Write(true)
        }
    })
    .await
}

/// What [`record_failure`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FailureOutcome {
    /// Our slot was released by the same write.
    pub released: bool,
    /// This write paused new claims (the failures of the channel's target reached
    /// `maxFailures`).
    pub paused: bool,
}

/// Whether the failures of `version` in `st` pause the channel's claims now (they did not in
/// the status `ch` was read with).
fn pauses(ch: &UpdateChannel, st: &UpdateChannelStatus, version: &str) -> bool {
    let max = ch.spec.max_failures as usize;
    let before = ch.paused_for(version);
    max > 0
        && !before
        && ch.target_version().as_deref() == Some(version)
        && st.failures_for(version) >= max
}

/// Record that `node` failed to update to `version`. With `token`, our slot is also moved to
/// `RollingBack` (when `keep_slot`) or released. Recording the same node+version twice keeps
/// one record.
pub async fn record_failure<S: ChannelStore>(
    store: &S,
    node: &str,
    token: Option<&str>,
    version: &str,
    reason: &str,
    keep_slot: bool,
    now: DateTime<Utc>,
) -> Result<FailureOutcome, SlotError> {
    cas(store, now, |ch, st| {
        let mut out = FailureOutcome::default();
        let mut changed = false;
        if !st
            .failures
            .iter()
            .any(|f| f.node == node && f.version == version)
        {
            st.failures.push(FailureRecord {
                node: node.to_string(),
                version: version.to_string(),
                at: now,
                reason: reason.to_string(),
            });
            changed = true;
        }
        if let Some(token) = token {
            if keep_slot {
                if let Some(e) = st
                    .slots
                    .iter_mut()
                    .find(|s| s.node == node && s.token == token)
                {
                    if e.phase != SlotPhase::RollingBack {
                        e.phase = SlotPhase::RollingBack;
                        changed = true;
                    }
                }
            } else {
                let before = st.slots.len();
                st.slots.retain(|s| !(s.node == node && s.token == token));
                out.released = st.slots.len() != before;
                changed |= out.released;
            }
        }
        out.paused = pauses(ch, st, version);
        if changed {
            Step::Write(out)
        } else {
            Step::Done(FailureOutcome::default())
        }
    })
    .await
}

/// Tracks, on this observer's own monotonic clock, how long each node's Lease has gone
/// without a renewal. Wall-clock timestamps written by other nodes are never compared with
/// ours: a node with a wrong clock can neither keep a dead slot alive nor get a live one
/// reclaimed.
#[derive(Debug, Default)]
pub struct LivenessObserver {
    seen: HashMap<String, (Option<String>, Instant)>,
}

impl LivenessObserver {
    /// Note the node's current Lease marker; returns how long it has been unchanged.
    pub fn observe(&mut self, node: &str, marker: Option<String>, now: Instant) -> Duration {
        match self.seen.get_mut(node) {
            Some((m, since)) if *m == marker => now.saturating_duration_since(*since),
            _ => {
                self.seen.insert(node.to_string(), (marker, now));
                Duration::ZERO
            }
        }
    }

    /// Forget nodes that hold no slot any more.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.seen.retain(|n, _| keep(n));
    }
}

/// Why a slot was reclaimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadReason {
    NodeDeleted,
    LeaseStale(Duration),
}

/// A slot taken back from a dead holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reclaimed {
    pub slot: SlotEntry,
    pub reason: DeadReason,
    /// A failure was recorded (the holder went silent while rebooting into a new version).
    pub failure_recorded: bool,
    /// The holder's own cordon was undone (it died before its bootloader flip).
    pub uncordoned: bool,
    /// The failure recorded paused new claims.
    pub paused: bool,
}

/// Take back slots whose Node is deleted or whose Lease has not been renewed for
/// `reboot_timeout` on our own clock (`mono_now`). `me` is never reclaimed. A holder that died
/// before its bootloader flip gets its cordon undone first (see the body). A holder that
/// went silent after its bootloader flip counts as a failure of its version: a release that
/// hangs at boot must pause the rollout instead of taking down one node after another.
pub async fn reclaim_dead<S: ChannelStore>(
    store: &S,
    me: &str,
    observer: &mut LivenessObserver,
    reboot_timeout: Duration,
    mono_now: Instant,
    now: DateTime<Utc>,
) -> Result<Vec<Reclaimed>, SlotError> {
    let channel = store.channel_name();
    let err = |source| SlotError::Store {
        channel: channel.clone(),
        source,
    };
    let current = store.read().await.map_err(err)?;
    known_format(&channel, &current)?;
    let slots = current.status.map(|s| s.slots).unwrap_or_default();
    observer.retain(|n| slots.iter().any(|s| s.node == n));
    let mut dead: Vec<(SlotEntry, DeadReason)> = Vec::new();
    for slot in slots.iter().filter(|s| s.node != me) {
        if !store.node_exists(&slot.node).await.map_err(err)? {
            dead.push((slot.clone(), DeadReason::NodeDeleted));
            continue;
        }
        let marker = store.lease_marker(&slot.node).await.map_err(err)?;
        let silent = observer.observe(&slot.node, marker, mono_now);
        if silent >= reboot_timeout {
            dead.push((slot.clone(), DeadReason::LeaseStale(silent)));
        }
    }
    // Look again right before the write: a holder that renewed since the observation above is
    // alive, and removing its slot would let another node start while it still reboots
    // (fencing would stop it only at its next write).
    let mut confirmed = Vec::with_capacity(dead.len());
    for (slot, reason) in dead {
        if let DeadReason::LeaseStale(_) = reason {
            let again = store.lease_marker(&slot.node).await.map_err(err)?;
            if observer.observe(&slot.node, again, mono_now) < reboot_timeout {
                continue;
            }
        }
        confirmed.push((slot, reason));
    }
    let dead = confirmed;
    if dead.is_empty() {
        return Ok(Vec::new());
    }
    // A holder that died before its bootloader flip (Claimed, Draining) abandoned its update
    // with nothing irreversible done, like a drain that timed out: undo its cordon (only one
    // it marked as its own, and never an admin's) before its slot is freed, so the node that
    // claims next is the only one we keep cordoned. A holder silent after its flip
    // (Rebooting, RollingBack) is down or hung: it stays cordoned and counts as a failure.
    let mut uncordoned = Vec::new();
    for (slot, reason) in &dead {
        let before_flip = matches!(slot.phase, SlotPhase::Claimed | SlotPhase::Draining);
        if matches!(reason, DeadReason::LeaseStale(_))
            && before_flip
            && slot.was_unschedulable != Some(true)
            && store.undo_cordon(&slot.node).await.map_err(err)?
        {
            uncordoned.push(slot.node.clone());
        }
    }
    cas(store, now, |ch, st| {
        let mut out = Vec::new();
        for (slot, reason) in &dead {
            // Only the exact claim we judged dead: a fresh claim by the same node survives.
            let Some(i) = st
                .slots
                .iter()
                .position(|s| s.node == slot.node && s.token == slot.token)
            else {
                continue;
            };
            let entry = st.slots.remove(i);
            let hung = matches!(reason, DeadReason::LeaseStale(_))
                && matches!(entry.phase, SlotPhase::Rebooting | SlotPhase::RollingBack);
            let mut failure_recorded = false;
            if let (true, Some(v)) = (hung, entry.version.as_ref()) {
                if !st
                    .failures
                    .iter()
                    .any(|f| f.node == entry.node && f.version == *v)
                {
                    st.failures.push(FailureRecord {
                        node: entry.node.clone(),
                        version: v.clone(),
                        at: now,
                        reason: "did not come back within rebootTimeout after rebooting into it"
                            .into(),
                    });
                    failure_recorded = true;
                }
            }
            let undone = uncordoned.contains(&entry.node);
            let paused = failure_recorded
                && entry.version.as_deref().is_some_and(|v| {
                    pauses(ch, st, v) && !out.iter().any(|r: &Reclaimed| r.paused)
                });
            out.push(Reclaimed {
                slot: entry,
                reason: reason.clone(),
                failure_recorded,
                uncordoned: undone,
                paused,
            });
        }
        if out.is_empty() {
            Step::Done(out)
        } else {
            Step::Write(out)
        }
    })
    .await
}

/// Write the poller's result: `status.latestVersion` and the `LatestResolved` condition.
pub async fn set_latest<S: ChannelStore>(
    store: &S,
    result: Result<&str, &str>,
    now: DateTime<Utc>,
) -> Result<(), SlotError> {
    cas(store, now, |_, st| {
        let before = st.clone();
        match result {
            Ok(v) => {
                st.latest_version = Some(v.to_string());
                st.set_condition(
                    COND_LATEST_RESOLVED,
                    true,
                    "Resolved",
                    format!("newest release is {v}"),
                    now,
                );
            }
            Err(e) => st.set_condition(
                COND_LATEST_RESOLVED,
                false,
                "ResolveFailed",
                e.to_string(),
                now,
            ),
        }
        if *st == before {
            Step::Done(())
        } else {
            Step::Write(())
        }
    })
    .await
}
