//! Update slots: the only place that writes an `UpdateChannel`'s status.
//!
//! Every write is a compare-and-swap of the whole status, stamped with this agent's status
//! format; a status of a newer format is never written ([`SlotError::Format`]), one of an
//! older format (v0.1.0's has no marker) is read as such and migrated by the write (see
//! [`crate::agent::channel::format`]). A slot claimed by an agent of an older release is the same claim: it
//! counts against `concurrency` and only its token moves or releases it.
//!
//! Every write is a compare-and-swap: read the channel, change a copy, `replace_status` with
//! the `resourceVersion` that was read; on a conflict, re-read after a random pause and decide
//! again. Merge patches and server-side apply are never used for the slot list: two agents
//! could each add themselves to a list that had room for one, and the count would exceed
//! `spec.concurrency`.
//!
//! **Dead holders** ([`reclaim`]): a slot whose Node is deleted, or whose holder's Lease went
//! unrenewed for `rebootTimeout`, is taken back; what happens to the holder's node is
//! documented there.
//!
//! Module map: this file holds the store trait, the CAS loop and the holder's own operations
//! (claim, fence, release, record a failure, the poller's `latestVersion`, the counter's
//! fleet counts and waves); [`reclaim`] the
//! dead holders; [`derived`] the fields every write recomputes (conditions, `updating`).
//!
//! The functions here are generic over [`ChannelStore`], which the kube client implements
//! ([`super::kube_store`]) and the race-model test implements in memory, so the model drives
//! exactly this code.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;

use crate::agent::channel::counts::{self, FleetChange, NodeFacts};
use crate::agent::channel::crd::{
    FailureRecord, SlotEntry, SlotPhase, UpdateChannel, UpdateChannelStatus, COND_LATEST_RESOLVED,
};
use crate::agent::channel::format::{self, FormatError};
use crate::agent::channel::rollout::Rollout;

pub mod derived;
pub mod reclaim;

pub use derived::{refresh_conditions, resume_hint};
pub use reclaim::{reclaim_dead, DeadReason, LivenessObserver};

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
pub(in crate::agent) enum Step<T> {
    /// Write the changed status, then return the value.
    Write(T),
    /// Nothing to write; return the value.
    Done(T),
}

/// Random pause before re-reading after a conflict: 20–200 ms, growing with the attempt.
pub(in crate::agent) fn jitter(attempt: u32) -> Duration {
    let cap = 20 + 10 * u64::from(attempt.min(18));
    Duration::from_millis(rand::thread_rng().gen_range(20..=cap))
}

/// Refuse a status this agent does not know (newer format): it is never rewritten.
pub(in crate::agent) fn known_format(channel: &str, ch: &UpdateChannel) -> Result<(), SlotError> {
    let found = ch.status.as_ref().and_then(|s| s.format_version);
    format::check_status(&format!("the status of UpdateChannel {channel}"), found)?;
    Ok(())
}

/// [`cas`] for a change of the status as read that is written only when it changed
/// something: `change` edits the status and returns what it did; an unchanged status writes
/// nothing and returns `T::default()`.
pub(in crate::agent) async fn cas_changed<S, T>(
    store: &S,
    now: DateTime<Utc>,
    mut change: impl FnMut(&UpdateChannel, &mut UpdateChannelStatus) -> T,
) -> Result<T, SlotError>
where
    S: ChannelStore,
    T: Default,
{
    cas(store, now, |ch, st| {
        let before = st.clone();
        let done = change(ch, st);
        if *st == before {
            Step::Done(T::default())
        } else {
            Step::Write(done)
        }
    })
    .await
}

pub(in crate::agent) async fn cas<S, T>(
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
        match write_status(store, &current, status, now).await {
            Ok(()) => return Ok(value),
            Err(StoreError::Conflict) => tokio::time::sleep(jitter(attempt)).await,
            Err(e) => return Err(err(e)),
        }
    }
    Err(SlotError::Contention {
        channel,
        attempts: MAX_ATTEMPTS,
    })
}

/// One compare-and-swap: `status` replaces the status of `read` (the object as read, whose
/// `resourceVersion` the write is conditional on), with the derived fields recomputed.
pub(in crate::agent) async fn write_status<S: ChannelStore>(
    store: &S,
    read: &UpdateChannel,
    status: UpdateChannelStatus,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let mut next = read.clone();
    next.status = Some(status);
    refresh_conditions(&mut next, now);
    store.replace_status(&next).await.map(|_| ())
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
        if ch.spec.paused || ch.paused_for(version) {
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
pub(in crate::agent) fn pauses(
    ch: &UpdateChannel,
    st: &UpdateChannelStatus,
    version: &str,
) -> bool {
    !ch.paused_for(version)
        && ch.target_version().as_deref() == Some(version)
        && ch.failures_pause(st, version)
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

/// Write the fleet part of the status (counts, `Complete`, waves) derived from `nodes` (the
/// Nodes the channel selects, as the counter listed them); nothing is written when nothing
/// changed. `rollout`: the channel's parsed `spec.rollout`.
pub async fn write_fleet<S: ChannelStore>(
    store: &S,
    nodes: &[NodeFacts],
    rollout: Option<&Rollout>,
    now: DateTime<Utc>,
) -> Result<FleetChange, SlotError> {
    cas_changed(store, now, |ch, st| {
        counts::refresh(ch, st, nodes, rollout, now)
    })
    .await
}

/// Write a resolved `latestVersion` and the `LatestResolved` condition (the poller writes
/// them with the fleet rollout, `rollout_status::write`, or a failure with
/// `resolve_failed`; tests set them directly).
#[cfg(any(test, feature = "testing"))]
pub async fn set_latest<S: ChannelStore>(
    store: &S,
    result: Result<&str, &str>,
    now: DateTime<Utc>,
) -> Result<(), SlotError> {
    cas_changed(store, now, |_, st| with_latest(st, result, now)).await
}

/// [`set_latest`]'s change of `st` (pure): `latestVersion` and the `LatestResolved` condition.
pub fn with_latest(st: &mut UpdateChannelStatus, result: Result<&str, &str>, now: DateTime<Utc>) {
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
}

/// A failed resolve of the channel (`latest` or the pinned release): the `LatestResolved`
/// condition False, reason `ResolveFailed`, with `why`. `Ok(true)` when this write starts the
/// outage (the condition did not say so already), the one time its `ResolveFailed` Event is
/// published: an agent restarted during the outage, or polling again, says nothing new.
pub async fn resolve_failed<S: ChannelStore>(
    store: &S,
    why: &str,
    now: DateTime<Utc>,
) -> Result<bool, SlotError> {
    cas_changed(store, now, |_, st| with_resolve_failed(st, why, now)).await
}

/// `resolve_failed`'s change of `st` (pure): whether the outage starts with it.
pub fn with_resolve_failed(st: &mut UpdateChannelStatus, why: &str, now: DateTime<Utc>) -> bool {
    let ongoing = st.conditions.iter().any(|c| {
        c.type_ == COND_LATEST_RESOLVED && c.status == "False" && c.reason == "ResolveFailed"
    });
    st.set_condition(
        COND_LATEST_RESOLVED,
        false,
        "ResolveFailed",
        why.to_string(),
        now,
    );
    !ongoing
}

/// A pinned channel resolved again: a `LatestResolved` condition an outage turned False turns
/// True (a pinned channel that never failed gets none; `latestVersion` is not written).
pub fn with_pinned_resolved(st: &mut UpdateChannelStatus, version: &str, now: DateTime<Utc>) {
    let failed = st
        .conditions
        .iter()
        .any(|c| c.type_ == COND_LATEST_RESOLVED && c.status == "False");
    if failed {
        st.set_condition(
            COND_LATEST_RESOLVED,
            true,
            "Resolved",
            format!("the pinned release {version} resolves"),
            now,
        );
    }
}
