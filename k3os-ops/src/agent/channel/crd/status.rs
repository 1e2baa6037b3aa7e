//! The `UpdateChannel`'s status: what the agents know about the rollout (the newest release,
//! the update slots, failures, counts, conditions), written only by compare-and-swap.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::schemas::*;
use super::FleetRolloutStatus;

/// What the agents know about the rollout. Written only by compare-and-swap.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateChannelStatus {
    /// The newest release of the channel, resolved by the node holding the poller Lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_version: Option<String>,
    /// Update slots currently held; never more than `spec.concurrency`.
    #[serde(default)]
    pub slots: Vec<SlotEntry>,
    /// Failed updates (rollbacks, nodes that never came back). Delete entries (status
    /// subresource) to lift a pause.
    #[serde(default)]
    pub failures: Vec<FailureRecord>,
    /// `LatestResolved`, `Degraded`, `Paused`, `Invalid`, `Complete`, `ChannelStale`,
    /// `StageWillMissWindow`, `WaitingForWave`, `ReleaseWithdrawn`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The nodes holding a slot, comma-separated (the `Updating` printer column; kept equal
    /// to `slots` by every status write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updating: Option<String>,
    /// The `metadata.generation` of the spec this status was last written against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The format of this status (see `agent/format.rs`); absent: format 1, written by
    /// k3os-ops v0.1.0. Every status write stamps the writer's format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "format_version_schema")]
    pub format_version: Option<u64>,
    /// How many selected nodes run what, counted by the agent holding the channel's fleet
    /// Lease (see `agent/counter.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeCounts>,
    /// How far the waves of `spec.rollout` are (absent without `spec.rollout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// This cluster's place in the channel's fleet rollouts (the waves in its signed
    /// metadata) and, on a pinned channel, whether they hold the pinned release back; written
    /// by the poller, absent before its first poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_rollout: Option<FleetRolloutStatus>,
}

/// The selected nodes counted by version and phase: counts, never a list of nodes.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCounts {
    /// Nodes the channel selects.
    #[schemars(schema_with = "count_schema")]
    pub total: u32,
    /// Of them, running the target version with the update finished (phase `UpToDate`).
    #[schemars(schema_with = "count_schema")]
    pub updated: u32,
    /// `updated/total` (the `Updated` printer column).
    pub progress: String,
    /// The version counted as the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Nodes per running version (`unknown`: not reported yet).
    #[serde(default)]
    #[schemars(schema_with = "count_map_schema")]
    pub by_version: BTreeMap<String, u32>,
    /// Nodes per update phase (the `k3os.io/update-phase` annotation; `Unknown`: none yet).
    #[serde(default)]
    #[schemars(schema_with = "count_map_schema")]
    pub by_phase: BTreeMap<String, u32>,
}

/// Progress of the waves (see `agent/rollout.rs`).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The version this rollout installs; a new target starts over at wave 1.
    pub target: String,
    /// Waves of the rollout (canaries, then the batches; empty ones left out).
    #[schemars(schema_with = "count_schema")]
    pub waves: u32,
    /// Nodes of waves 1 to `wave` may update.
    #[schemars(schema_with = "count_schema")]
    pub wave: u32,
    /// Non-canary nodes whose rank key (first 8 bytes of the SHA-256 of the node name, hex)
    /// is at most this are in the admitted waves; absent: only canaries are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admit_key: Option<String>,
    /// When every node of the admitted waves was first seen done; the next wave starts
    /// `settleTime` later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settling_since: Option<DateTime<Utc>>,
}

/// One node's right to disrupt itself.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlotEntry {
    /// The node holding the slot.
    pub node: String,
    /// Random token of the claim; every later step of the holder compares it (fencing).
    pub token: String,
    /// When the slot was claimed (holder's clock; informational only).
    pub claimed_at: DateTime<Utc>,
    /// How far the holder got.
    pub phase: SlotPhase,
    /// Whether the node was already unschedulable before the holder cordoned it (then the
    /// holder must not uncordon it). Set when entering `Draining`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub was_unschedulable: Option<bool>,
    /// The version the holder is installing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// Steps of a slot holder, in order.
#[derive(
    Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum SlotPhase {
    /// Slot held; nothing disrupted yet.
    Claimed,
    /// Cordoning and draining.
    Draining,
    /// Bootloader flipped; rebooting into the new slot.
    Rebooting,
    /// The new slot failed; rebooting back into the old one.
    RollingBack,
}

/// One failed update.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureRecord {
    pub node: String,
    pub version: String,
    pub at: DateTime<Utc>,
    pub reason: String,
}

/// A status condition (same shape as `metav1.Condition`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    pub last_transition_time: DateTime<Utc>,
}

/// Condition types.
pub const COND_LATEST_RESOLVED: &str = "LatestResolved";
pub const COND_DEGRADED: &str = "Degraded";
pub const COND_PAUSED: &str = "Paused";
/// Every selected node runs the target version; set by the agent that counts the nodes.
pub const COND_COMPLETE: &str = "Complete";
/// The channel's spec cannot be used (does not decode or does not validate); set by the agents.
pub const COND_INVALID: &str = "Invalid";
/// The channel's signed metadata expired (role and expiry in the message); set by the agent
/// that resolves the channel, cleared by its next fresh resolve.
pub const COND_CHANNEL_STALE: &str = "ChannelStale";
/// The bytes a node still has to fetch cannot arrive before the next maintenance window at
/// the stage windows' rates and the daily quota (node and figures in the message); set and
/// cleared by the staging agents (see `agent/thin_report.rs`).
pub const COND_STAGE_WILL_MISS_WINDOW: &str = "StageWillMissWindow";

impl UpdateChannelStatus {
    /// Set a condition, keeping its transition time when the status does not change.
    pub fn set_condition(
        &mut self,
        type_: &str,
        status: bool,
        reason: &str,
        message: String,
        now: DateTime<Utc>,
    ) {
        let status = if status { "True" } else { "False" }.to_string();
        match self.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = now;
                }
                c.status = status;
                c.reason = reason.to_string();
                c.message = message;
            }
            None => self.conditions.push(Condition {
                type_: type_.to_string(),
                status,
                reason: reason.to_string(),
                message,
                last_transition_time: now,
            }),
        }
    }

    /// The slot held by `node`, if any.
    pub fn slot_of(&self, node: &str) -> Option<&SlotEntry> {
        self.slots.iter().find(|s| s.node == node)
    }

    /// Failures recorded for `version`.
    #[cfg(any(test, feature = "testing"))]
    pub fn failures_for(&self, version: &str) -> usize {
        self.failures
            .iter()
            .filter(|f| f.version == version)
            .count()
    }
}
