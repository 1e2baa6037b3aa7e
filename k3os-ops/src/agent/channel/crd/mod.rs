//! The `UpdateChannel` custom resource (group `k3os.io`, version `v1`, short name `upchan`).
//!
//! The types are the single source of truth: the CRD in `deploy/crd.yaml` is generated from
//! them by `k3os-ops agent crd` (a snapshot test keeps the committed file equal).
//!
//! The status is versioned (`status.formatVersion`); its formats and their migrations are
//! documented in `channel::format`; its types are in `status.rs`. The schemas the API server
//! validates the spec with (where the derived one is wrong or weak) are in `schemas.rs`.
//!
//! Ownership of fields: humans write `spec`; the agents write only `status`, and only through
//! compare-and-swap `replace_status` calls (see `cluster::slots`). The poller writes the newest
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
mod status;
#[cfg(any(test, feature = "testing"))]
pub use fixture::ChannelFixture;
use schemas::*;

pub use fleet::{FleetRolloutStatus, COND_RELEASE_WITHDRAWN, COND_WAITING_FOR_WAVE};
// `status::Condition` is named only through `UpdateChannelStatus::conditions`.
pub use status::{
    FailureRecord, NodeCounts, RolloutStatus, SlotEntry, SlotPhase, UpdateChannelStatus,
    COND_CHANNEL_STALE, COND_COMPLETE, COND_DEGRADED, COND_INVALID, COND_LATEST_RESOLVED,
    COND_PAUSED, COND_STAGE_WILL_MISS_WINDOW,
};

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
    /// How long a node may take to come back from its reboot into the new version: a node
    /// silent this long (its Lease not renewed) while holding a slot has the slot reclaimed by
    /// another agent, and a trial boot whose Node-Ready the agent has not reported within this
    /// long of the boot rolls back by itself. Set it above the time the nodes take to boot and
    /// start k3s and the agent, e.g. `15m`. Default `15m`.
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
    /// retry the version they failed with, unless its rollout's `retries` allow (`release
    /// rollout --retries`).
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
    /// Bytes or time ([`StagePrefer`]; absent: `auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer: Option<StagePrefer>,
}

/// What a node weighs first when a release's per-pair patch fetches fewer bytes than its
/// chunks but takes longer to rebuild (`upgrade --prefer`): `auto` (absent) the sooner way at
/// a rate the channel tells (a stage window's rate, `maxRate`) and the fewest bytes under
/// `maxBytesPerDay`; `bytes` always the fewest bytes; `time` the sooner way, at the link rate
/// measured when none is told.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StagePrefer {
    /// The sooner way at a told rate; the fewest bytes without one or under a quota.
    #[default]
    Auto,
    /// Always the fewest bytes.
    Bytes,
    /// The sooner way, at a told or measured rate.
    Time,
}

impl From<StagePrefer> for libupgrade::Prefer {
    fn from(p: StagePrefer) -> libupgrade::Prefer {
        match p {
            StagePrefer::Auto => libupgrade::Prefer::Auto,
            StagePrefer::Bytes => libupgrade::Prefer::Bytes,
            StagePrefer::Time => libupgrade::Prefer::Time,
        }
    }
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

#[cfg(test)]
mod tests;
