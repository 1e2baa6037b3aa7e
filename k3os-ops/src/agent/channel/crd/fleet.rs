//! The channel's fleet rollout as this cluster sees it (`status.fleetRollout`) and the two
//! conditions that say why a newer release is not taken: the channel's signed metadata rolls
//! each release out over many clusters in waves (libupgrade's `rollout`), and the cluster is
//! placed in them by one seed. Written by the agent holding the poller Lease (see
//! `agent/cluster/rollout_status.rs`); the rules are in `agent/channel/fleet_waves.rs` (a pinned
//! channel: `agent/channel/fleet_pinned.rs`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::schemas::seed_schema;

/// This cluster's place in the channel's fleet rollouts.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetRolloutStatus {
    /// The seed every agent of this cluster resolves the channel with (0 to 999999, derived
    /// from this UpdateChannel's UID): a release's wave admits the whole cluster at once.
    #[schemars(schema_with = "seed_schema")]
    pub cluster_seed: u32,
    /// Releases the channel's signed metadata withdrew, oldest first: never claimed, and a
    /// node that staged one drops it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub withdrawn: Vec<String>,
    /// The withdrawn release this cluster was updating to (`latestVersion` or a slot's version
    /// when it was withdrawn); kept while the channel withdraws it (condition
    /// `ReleaseWithdrawn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withdrawn_target: Option<String>,
    /// The pinned `spec.version` while the channel's rollout holds it back from this cluster
    /// (its wave has not started, its rollout is paused, or its rollout data is not usable;
    /// the condition `WaitingForWave` says why and when the wave starts): no node starts
    /// staging it or claims a slot for it. Absent on a channel that follows `latest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_target: Option<String>,
}

/// A newer release than `latestVersion` (on a pinned channel: the pinned `spec.version`) waits
/// for this cluster's wave (or a pause, or a required stop); the message names it and when the
/// wave starts (RFC 3339). Removed once nothing newer waits (the pinned release is offered).
pub const COND_WAITING_FOR_WAVE: &str = "WaitingForWave";
/// The release this cluster was updating to (on a pinned channel: the pinned `spec.version`)
/// was withdrawn by the channel; removed once the channel no longer lists it as withdrawn.
pub const COND_RELEASE_WITHDRAWN: &str = "ReleaseWithdrawn";
