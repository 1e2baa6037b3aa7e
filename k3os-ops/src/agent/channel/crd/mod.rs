//! The `UpdateChannel` custom resource (group `k3os.io`, version `v1`, short name `upchan`).
//!
//! The types are the single source of truth: the CRD in `deploy/crd.yaml` is generated from
//! them by `k3os-ops agent crd` (a snapshot test keeps the committed file equal).
//!
//! The status is versioned (`status.formatVersion`); its formats and their migrations are
//! documented in [`super::format`]. The schemas the API server validates the spec with (where
//! the derived one is wrong or weak) are in `schemas.rs`.
//!
//! Ownership of fields: humans write `spec`; the agents write only `status`, and only through
//! compare-and-swap `replace_status` calls (see [`crate::agent::cluster::slots`]). The poller writes the newest
//! release into `status.latestVersion`, never into `spec.version`, so `version: latest` keeps
//! following new releases instead of being pinned by the first one it resolved.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[cfg(any(test, feature = "testing"))]
mod fixture;
mod fleet;
mod schemas;
#[cfg(any(test, feature = "testing"))]
pub use fixture::ChannelFixture;
use schemas::*;

pub use fleet::{FleetRolloutStatus, COND_RELEASE_WITHDRAWN, COND_WAITING_FOR_WAVE};

/// Pattern of the spec's short durations (`90s`, `15m`, `1h30m`, `2d`; see `duration.rs`).
pub const DURATION_PATTERN: &str = "^ *([0-9]+[smhd])+ *$";

/// The desired release for the nodes this channel selects, and how to roll it out.
// The printer columns repeat `type_ = "string"`, which clippy mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, Default, PartialEq, JsonSchema)]
#[kube(
    group = "k3os.io",
    version = "v1",
    kind = "UpdateChannel",
    namespaced,
    status = "UpdateChannelStatus",
    shortname = "upchan",
    doc = "A release channel and its rollout policy for the nodes it selects",
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".spec.version",
        description = "requested version (empty or 'latest' follows the channel)"
    ),
    printcolumn(
        name = "Latest",
        type_ = "string",
        json_path = ".status.latestVersion",
        description = "newest release the poller resolved"
    ),
    printcolumn(
        name = "Updating",
        type_ = "string",
        json_path = ".status.updating",
        description = "nodes holding an update slot (all of them, comma-separated)"
    ),
    printcolumn(
        name = "Updated",
        type_ = "string",
        json_path = ".status.nodes.progress",
        description = "selected nodes running the target version, of all selected (updated/total)"
    ),
    printcolumn(
        name = "Concurrency",
        type_ = "integer",
        json_path = ".spec.concurrency",
        description = "nodes allowed to update at once"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct UpdateChannelSpec {
    /// Where releases come from: an http(s) base URL holding a release index, or
    /// `github-releases://owner/repo`.
    #[schemars(schema_with = "channel_url_schema")]
    pub url: String,
    /// The version to run; empty or `latest` follows `status.latestVersion`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `true` with a pinned `version`: take it even while the channel's signed rollout holds
    /// it back from this cluster (its wave has not started, or it is paused), as `k3os-ops
    /// upgrade --ignore-rollout` does; a withdrawn release is still never staged or claimed.
    /// No effect while `version` follows `latest` (which always follows the rollouts).
    /// Default `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_rollout: bool,
    /// How many nodes may be disrupted (cordoned, drained, rebooting) at once. Default 1.
    #[serde(default = "default_concurrency")]
    #[schemars(schema_with = "concurrency_schema")]
    pub concurrency: u32,
    /// Label selector (matchLabels semantics) for the nodes this channel updates; empty
    /// selects every node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// When disruptive steps may start; absent means any time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowSpec>,
    /// More maintenance windows (e.g. Saturday night and Wednesday night), at most 8; a claim
    /// may start in any of them (`window` and `windows` together). None at all: always.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub windows: Vec<WindowSpec>,
    /// How workloads are moved off a node before it reboots.
    #[serde(default)]
    pub drain: DrainSpec,
    /// How long a node may be silent (its Lease not renewed) while holding a slot before
    /// another agent reclaims the slot, e.g. `15m`. Default `15m`.
    #[serde(default = "default_reboot_timeout")]
    #[schemars(schema_with = "reboot_timeout_schema")]
    pub reboot_timeout: String,
    /// After this many failed updates of one version new claims pause (condition `Paused`).
    /// `0` never pauses. Default 1.
    #[serde(default = "default_max_failures")]
    #[schemars(schema_with = "max_failures_schema")]
    pub max_failures: u32,
    /// Cap on each node's download bandwidth while staging, bytes per second with an optional
    /// binary suffix (`500K`, `2M`, `1.5MiB`): a remote site's thin link is shared with
    /// production traffic. Absent: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "max_rate_schema")]
    pub max_rate: Option<String>,
    /// `true` stops new claims at once (a node holding a slot finishes its update or rolls
    /// back); staging goes on. Default `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Failures recorded at or before this time no longer count towards `maxFailures`: the way
    /// to resume a channel paused by failures (`kubectl patch upchan NAME --type merge -p
    /// "{\"spec\":{\"resumedAt\":\"$(date -u +%FT%TZ)\"}}"`). The failed nodes still do not
    /// retry the version they failed with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_at: Option<DateTime<Utc>>,
    /// Waves: canary nodes first, then batches by percentage of the selected nodes; the next
    /// wave starts only when every node of the last one is blessed and `settleTime` passed.
    /// Absent: every selected node may claim (up to `concurrency` at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSpec>,
    /// No claim while pods matching this label selector (`kubectl` syntax) run on the node
    /// (kured's `--blocking-pod-selector`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "blocking_selector_schema")]
    pub blocking_pod_selector: Option<String>,
    /// No claim while this Prometheus reports alerts (kured's `--prometheus-url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusSpec>,
    /// When and how much each node may download while staging (thin links). Absent: any
    /// time, capped only by `maxRate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<StageSpec>,
    /// Where chunks are looked for before the channel's own URL, in order, after the running
    /// slot: a host directory (a mounted medium, a site share) or an http(s) site mirror of the
    /// release. Every chunk is checked against the signed chunk index, whatever its source.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "sources_schema")]
    pub sources: Vec<String>,
}

/// `spec.stage`: the download schedule and daily quota of the stage (see `agent/thin.rs`).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageSpec {
    /// When a node may download, each window with its own rate; outside every window
    /// nothing is fetched. Empty: any time. Where windows overlap the lower rate applies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub windows: Vec<StageWindowSpec>,
    /// Most bytes a node fetches per day (`500M`, `2G`, `1.5GiB`, or bytes); at the quota
    /// the stage stops cleanly and resumes the next day. The day is the UTC day, or the
    /// local day of the first stage window's `timeZone`. Absent: no quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "max_bytes_per_day_schema")]
    pub max_bytes_per_day: Option<String>,
}

/// A stage window: as a maintenance window ([`WindowSpec`]), plus the download rate in it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageWindowSpec {
    /// When the window is open: the fields of a maintenance window ([`WindowSpec`]).
    #[serde(flatten)]
    pub window: WindowSpec,
    /// Download rate in this window, as `spec.maxRate` (`500K`, `2M`); `0` downloads
    /// nothing in it. Absent: as fast as `spec.maxRate` allows. `spec.maxRate` caps every
    /// window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "stage_rate_schema")]
    pub max_rate: Option<String>,
}

/// `spec.prometheus`: an alert gate before each claim (`GET <url>/api/v1/alerts`).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusSpec {
    /// Base URL of the Prometheus (or Alertmanager-compatible) API, e.g.
    /// `http://prometheus.monitoring:9090`.
    #[schemars(length(max = 512))]
    pub url: String,
    /// Regular expression of alert names to ignore (kured's `--alert-filter-regexp`), e.g.
    /// `^(Watchdog|InfoInhibitor)$`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub alert_filter: Option<String>,
    /// Count only the alerts `alertFilter` matches instead (`--alert-filter-match-only`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub alert_filter_match_only: bool,
    /// Only firing alerts block, not pending ones (`--alert-firing-only`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub firing_only: bool,
}

/// `spec.rollout`: the order in which the selected nodes update (see `agent/rollout.rs`).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// The first wave: nodes matching this selector or named here. None: no canary wave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanarySpec>,
    /// The batches after the canaries, each a percentage of the selected non-canary nodes
    /// (e.g. `[10, 40]`); what they leave is one more batch. Empty: one batch of all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "batches_schema")]
    pub batches: Vec<u32>,
    /// How long a finished wave must stay healthy before the next starts, e.g. `30m`.
    /// Default `0s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "settle_time_schema")]
    pub settle_time: Option<String>,
}

/// The canary wave: nodes matching `nodeSelector` (when not empty) or named in `nodes`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanarySpec {
    /// Label selector (matchLabels semantics); empty selects no node by label.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Node names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub nodes: Vec<String>,
}

/// A maintenance window: starts at `start` local time on each of `days` and lasts `length`.
/// A window belongs to the day it starts on and may run past midnight and past the end of
/// the week (a `Sun 23:00` window of `3h` is open on Monday at 01:00).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WindowSpec {
    /// Days the window starts on: `mon`…`sun` (or full English names, any case); empty means
    /// every day.
    #[serde(default)]
    #[schemars(schema_with = "days_schema")]
    pub days: Vec<String>,
    /// Local start time `HH:MM` (24 h).
    #[schemars(schema_with = "start_schema")]
    pub start: String,
    /// Length of the window, e.g. `2h`, `90m`, `1h30m` (at most 7 days).
    #[schemars(schema_with = "window_length_schema")]
    pub length: String,
    /// IANA time zone of `start`, e.g. `Europe/Berlin`; default `UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_zone_schema")]
    pub time_zone: Option<String>,
}

/// Drain policy, close to `kubectl drain`'s flags.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Also delete pods that no controller manages (they are lost).
    #[serde(default)]
    pub force: bool,
    /// Give up draining after this long, e.g. `10m` (the update is then abandoned and the
    /// node uncordoned). Default `10m`.
    #[serde(default = "default_drain_timeout")]
    #[schemars(schema_with = "drain_timeout_schema")]
    pub timeout: String,
    /// Grace period in seconds handed to evicted pods; absent uses each pod's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "grace_period_schema")]
    pub grace_period: Option<i64>,
    /// Leave DaemonSet pods in place (they would be recreated at once). Default true.
    #[serde(default = "default_true")]
    pub ignore_daemon_sets: bool,
    /// Evict pods with emptyDir volumes (their data is lost). Default false.
    #[serde(default)]
    pub delete_empty_dir_data: bool,
    /// Only evict pods matching this label selector (`kubectl` syntax); empty means all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "drain_selector_schema")]
    pub pod_selector: Option<String>,
    /// Do not drain at all (only cordon).
    #[serde(default)]
    pub skip: bool,
}

impl Default for DrainSpec {
    fn default() -> Self {
        DrainSpec {
            force: false,
            timeout: default_drain_timeout(),
            grace_period: None,
            ignore_daemon_sets: true,
            delete_empty_dir_data: false,
            pod_selector: None,
            skip: false,
        }
    }
}

fn default_concurrency() -> u32 {
    1
}
fn default_reboot_timeout() -> String {
    "15m".into()
}
fn default_drain_timeout() -> String {
    "10m".into()
}
fn default_max_failures() -> u32 {
    1
}
fn default_true() -> bool {
    true
}

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

impl UpdateChannelSpec {
    /// The requested version: `None` when the channel follows its newest release.
    pub fn pinned_version(&self) -> Option<&str> {
        match self.version.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(v) if v.eq_ignore_ascii_case("latest") => None,
            Some(v) => Some(v),
        }
    }

    /// Whether the pinned version is taken even while the channel's rollout holds it back
    /// (`ignoreRollout` on a pinned channel; never for `latest`).
    pub fn ignores_rollout(&self) -> bool {
        self.ignore_rollout && self.pinned_version().is_some()
    }
}

impl UpdateChannel {
    /// The version nodes should run: the pinned one, else the poller's latest.
    pub fn target_version(&self) -> Option<String> {
        match self.spec.pinned_version() {
            Some(v) => Some(v.to_string()),
            None => self.status.as_ref().and_then(|s| s.latest_version.clone()),
        }
    }

    /// Whether new claims are paused by failures: `maxFailures` failures of the target
    /// version recorded after `spec.resumedAt`.
    pub fn paused_for(&self, version: &str) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| self.failures_pause(s, version))
    }

    /// The failures of `version` in `status` that count towards `maxFailures` (those after
    /// `spec.resumedAt`).
    pub fn counted_failures(&self, status: &UpdateChannelStatus, version: &str) -> usize {
        status
            .failures
            .iter()
            .filter(|f| f.version == version)
            .filter(|f| self.spec.resumed_at.is_none_or(|r| f.at > r))
            .count()
    }

    /// Whether the failures of `version` in `status` pause new claims.
    pub fn failures_pause(&self, status: &UpdateChannelStatus, version: &str) -> bool {
        let max = self.spec.max_failures;
        max > 0 && self.counted_failures(status, version) >= max as usize
    }

    /// Whether the channel selects a node with these labels.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.spec
            .node_selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// The CRD as YAML, exactly as committed in `deploy/crd.yaml`.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let crd = UpdateChannel::crd();
    let body = serde_yaml::to_string(&crd).expect("a CRD always serializes");
    format!("# Generated by `k3os-ops agent crd` from k3os-ops/src/agent/crd/. Do not edit.\n---\n{body}")
}
