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

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use super::{
    jitter, known_format, pauses, write_status, ChannelStore, SlotError, StoreError, MAX_ATTEMPTS,
};
use crate::agent::channel::crd::{
    FailureRecord, SlotEntry, SlotPhase, UpdateChannel, UpdateChannelStatus,
};

/// Tracks, on this observer's own monotonic clock, how long each node's Lease has gone
/// without a renewal. Wall-clock timestamps written by other nodes are never compared with
/// ours: a node with a wrong clock can neither keep a dead slot alive nor get a live one
/// reclaimed.
///
/// The silence is a lower bound: it runs from when the answer that first showed a marker
/// *arrived* (the renewal happened before that) to when the latest request that still saw it
/// was *sent* (the server read it after that). Counting from the start of a pass instead
/// would add the pass's own duration to a holder that renewed while the pass was under way.
#[derive(Debug, Default)]
pub struct LivenessObserver {
    seen: HashMap<String, (Option<String>, Instant)>,
}

impl LivenessObserver {
    /// Note the node's Lease marker, read by a request sent at `asked` and answered at
    /// `answered`; returns for how long it has certainly been unchanged.
    pub fn observe(
        &mut self,
        node: &str,
        marker: Option<String>,
        asked: Instant,
        answered: Instant,
    ) -> Duration {
        match self.seen.get_mut(node) {
            Some((m, since)) if *m == marker => asked.saturating_duration_since(*since),
            _ => {
                self.seen.insert(node.to_string(), (marker, answered));
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
/// `reboot_timeout` on our own monotonic clock (see [`LivenessObserver`]). `me` is never reclaimed. A holder that died
/// before its bootloader flip gets its cordon undone first (see the body). A holder that
/// went silent after its bootloader flip counts as a failure of its version: a release that
/// hangs at boot must pause the rollout instead of taking down one node after another.
pub async fn reclaim_dead<S: ChannelStore>(
    store: &S,
    me: &str,
    observer: &mut LivenessObserver,
    reboot_timeout: Duration,
    now: DateTime<Utc>,
) -> Result<Vec<Reclaimed>, SlotError> {
    let channel = store.channel_name();
    let err = |source| SlotError::Store {
        channel: channel.clone(),
        source,
    };
    // Every attempt looks at the Leases again before its write: a conflict retry can take a
    // while under contention, and a holder that renewed meanwhile is alive. Removing its
    // slot then would let another node start while it still reboots (fencing stops it only
    // at its next write), so the judgement is never older than one attempt.
    let mut uncordoned = Vec::new();
    for attempt in 0..MAX_ATTEMPTS {
        let current = store.read().await.map_err(err)?;
        known_format(&channel, &current)?;
        let mut status = current.status.clone().unwrap_or_default();
        let dead = find_dead(store, me, &status.slots, observer, reboot_timeout)
            .await
            .map_err(err)?;
        if dead.is_empty() {
            return Ok(Vec::new());
        }
        // A holder that died before its bootloader flip (Claimed, Draining) abandoned its
        // update with nothing irreversible done, like a drain that timed out: undo its cordon
        // (only one it marked as its own, and never an admin's) before its slot is freed, so
        // the node that claims next is the only one we keep cordoned. A holder silent after
        // its flip (Rebooting, RollingBack) is down or hung: it stays cordoned and counts as
        // a failure. The mark is gone after the first attempt undid it, so the nodes undone
        // are remembered across attempts.
        uncordoned.extend(undo_cordons_before_flip(store, &dead).await.map_err(err)?);
        let out = remove_dead(&current, &mut status, &dead, &uncordoned, now);
        if out.is_empty() {
            return Ok(out);
        }
        match write_status(store, &current, status, now).await {
            Ok(()) => return Ok(out),
            Err(StoreError::Conflict) => tokio::time::sleep(jitter(attempt)).await,
            Err(e) => return Err(err(e)),
        }
    }
    Err(SlotError::Contention {
        channel,
        attempts: MAX_ATTEMPTS,
    })
}

/// The holders of `slots` (but `me`) whose Node is deleted or whose Lease went unrenewed
/// for `reboot_timeout`, looked at twice.
async fn find_dead<S: ChannelStore>(
    store: &S,
    me: &str,
    slots: &[SlotEntry],
    observer: &mut LivenessObserver,
    reboot_timeout: Duration,
) -> Result<Vec<(SlotEntry, DeadReason)>, StoreError> {
    observer.retain(|n| slots.iter().any(|s| s.node == n));
    let mut dead: Vec<(SlotEntry, DeadReason)> = Vec::new();
    for slot in slots.iter().filter(|s| s.node != me) {
        if !store.node_exists(&slot.node).await? {
            dead.push((slot.clone(), DeadReason::NodeDeleted));
            continue;
        }
        let silent = look(store, observer, &slot.node).await?;
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
            if look(store, observer, &slot.node).await? < reboot_timeout {
                continue;
            }
        }
        confirmed.push((slot, reason));
    }
    Ok(confirmed)
}

/// Read `node`'s Lease marker once; how long it has certainly been unchanged.
async fn look<S: ChannelStore>(
    store: &S,
    observer: &mut LivenessObserver,
    node: &str,
) -> Result<Duration, StoreError> {
    let asked = Instant::now();
    let marker = store.lease_marker(node).await?;
    Ok(observer.observe(node, marker, asked, Instant::now()))
}

/// Undo the cordon of holders that died before their bootloader flip; the nodes uncordoned.
async fn undo_cordons_before_flip<S: ChannelStore>(
    store: &S,
    dead: &[(SlotEntry, DeadReason)],
) -> Result<Vec<String>, StoreError> {
    let mut uncordoned = Vec::new();
    for (slot, reason) in dead {
        let before_flip = matches!(slot.phase, SlotPhase::Claimed | SlotPhase::Draining);
        if matches!(reason, DeadReason::LeaseStale(_))
            && before_flip
            && slot.was_unschedulable != Some(true)
            && store.undo_cordon(&slot.node).await?
        {
            uncordoned.push(slot.node.clone());
        }
    }
    Ok(uncordoned)
}

/// Remove the `dead` claims from `st` (a failure recorded for a holder hung after its flip).
fn remove_dead(
    ch: &UpdateChannel,
    st: &mut UpdateChannelStatus,
    dead: &[(SlotEntry, DeadReason)],
    uncordoned: &[String],
    now: DateTime<Utc>,
) -> Vec<Reclaimed> {
    let mut out = Vec::new();
    for (slot, reason) in dead {
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
                    reason: "did not come back within rebootTimeout after rebooting into it".into(),
                });
                failure_recorded = true;
            }
        }
        let undone = uncordoned.contains(&entry.node);
        let paused = failure_recorded
            && entry
                .version
                .as_deref()
                .is_some_and(|v| pauses(ch, st, v) && !out.iter().any(|r: &Reclaimed| r.paused));
        out.push(Reclaimed {
            slot: entry,
            reason: reason.clone(),
            failure_recorded,
            uncordoned: undone,
            paused,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_counts_from_the_answer_that_first_showed_the_marker() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut o = LivenessObserver::default();
        // A pass that began at t0 saw a renewal (marker 7) answered at t0+3s: the renewal
        // may have happened just before that answer, so the silence starts there.
        assert_eq!(
            o.observe("n", Some("7".into()), t0, t0 + s(3)),
            Duration::ZERO
        );
        assert_eq!(
            o.observe("n", Some("7".into()), t0 + s(12), t0 + s(13)),
            s(9)
        );
        // A new marker starts over; a missing Lease is a marker too.
        assert_eq!(
            o.observe("n", Some("8".into()), t0 + s(14), t0 + s(15)),
            Duration::ZERO
        );
        assert_eq!(o.observe("n", None, t0 + s(16), t0 + s(16)), Duration::ZERO);
        assert_eq!(o.observe("n", None, t0 + s(30), t0 + s(31)), s(14));
        // A request sent before the first answer arrived never counts backwards.
        let mut o = LivenessObserver::default();
        o.observe("m", None, t0, t0 + s(5));
        assert_eq!(o.observe("m", None, t0 + s(1), t0 + s(6)), Duration::ZERO);
        o.retain(|n| n != "m");
        assert_eq!(o.observe("m", None, t0 + s(9), t0 + s(9)), Duration::ZERO);
    }
}
