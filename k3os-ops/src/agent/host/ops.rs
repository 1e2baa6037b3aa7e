//! What the agent asks of its node, as libupgrade's verbs: a small trait over the A/B slot
//! machinery, so the controller logic runs against a simulated node in tests and against
//! `libupgrade` on nodes ([`super::node::LibupgradeNode`]).
//!
//! The methods are synchronous (libupgrade is blocking, disk-bound code); the controller calls
//! them through `tokio::task::spawn_blocking`.
//!
//! A stage is the CLI's shape (RAUC's too): **resolve** one [`StageRequest`] to a [`Release`]
//! once ([`NodeOps::resolve`]), then **preview** and **stage** that release. The agent maps its
//! channel to the request in one place (the stage tick, [`crate::agent::reconcile::staging`]);
//! a tick resolves the channel at most once and hands the release to the preview and the
//! stage (a pinned channel's own check, [`super::requests::resolve_pinned`], is that one
//! resolution). An offline bundle of the version ([`NodeOps::offline`], the node's
//! [`BUNDLE_DIR_ENV`]) is used exactly as `upgrade --bundle FILE` uses it: its signed manifest
//! must name the version its header names, which must be the target; the channel is not read
//! at all (a site whose link is down stages from it).
//!
//! Every resolution of the agent places the node by its cluster's seed
//! ([`crate::agent::channel::fleet_waves::cluster_seed`]), never by the node's own seed file:
//! the channel's fleet waves admit a cluster as a whole and the in-cluster rollout orders its
//! nodes. Looking at `latest` or a pin ([`super::requests`]: the poller, the claim check) only
//! looks: it records what it trusted and keeps the verified metadata files, as every TUF
//! client does, but creates no seed file and drops nothing ([`libupgrade::Writes::Trust`]).
//! The one place that acts on a withdrawal is the node's own tick
//! [`NodeOps::drop_withdrawn`], which the decision asks for when this node's staged release is
//! withdrawn (the poller runs on one node of the cluster and could drop only its own slot).

use libupgrade::rollout::{Hold, Seed};
use libupgrade::Stop;
use libupgrade::{Release, ResolveError, StageOptions, StageRequest};

use super::status::NodeUpdateStatus;
use libupgrade::state::ledger::PreviewRecord;

/// Environment variable naming the host directory the agent looks for offline bundles in
/// (the DaemonSet mounts it read-only; unset: no bundles).
pub const BUNDLE_DIR_ENV: &str = "K3OS_OPS_BUNDLE_DIR";

/// How a stage ended that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageEnd {
    /// Verified and staged.
    Staged {
        /// Network bytes this attempt fetched.
        fetched: u64,
    },
    /// Stopped cleanly at the quota or the end of the open windows; a later stage resumes.
    Stopped {
        /// Why it stopped.
        why: Stop,
        /// Network bytes this attempt fetched.
        fetched: u64,
        /// Bytes left to fetch.
        left: u64,
    },
}

/// [`NodeError::op`] of a status read before this boot's assessment ran: not a failure, the
/// agent reports it once and waits.
pub const NOT_ASSESSED: &str = "not-assessed";
/// What to do about [`NOT_ASSESSED`].
pub const NOT_ASSESSED_HELP: &str = "this boot was not assessed yet: `k3os-ops slot confirm` has not run since the node booted (init runs it first thing at every boot); run `k3os-ops slot confirm` on the node. The agent waits until it has run";

/// A node-side failure; the message names the file, URL or check that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct NodeError {
    /// `status`, `stage`, `preview`, `activate`, `confirm`, `reboot`, `resolve`, or [`NOT_ASSESSED`].
    pub op: &'static str,
    pub message: String,
    /// The channel's signed metadata was refused as expired (from the typed
    /// `ChannelError::metadata_expired`): the agent reports the channel `ChannelStale`.
    pub stale: Option<StaleMetadata>,
    /// The channel's rollout withholds the version asked for (libupgrade's typed
    /// `ChannelError::Withheld`): why, and what the channel withdrew.
    pub withheld: Option<Withheld>,
}

/// Why the channel's rollout withholds an explicitly named version from a node now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withheld {
    /// Its wave, a pause, a withdrawal or unusable rollout data.
    pub hold: Hold,
    /// Every release the channel lists as withdrawn, oldest first.
    pub withdrawn: Vec<String>,
}

/// Which role of a channel's signed metadata expired, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleMetadata {
    pub role: libupgrade::trust::meta::Role,
    pub expires: chrono::DateTime<chrono::Utc>,
}

impl NodeError {
    /// This boot was not assessed yet (see [`NOT_ASSESSED`]).
    pub fn is_not_assessed(&self) -> bool {
        self.op == NOT_ASSESSED
    }

    pub fn new(op: &'static str, message: impl std::fmt::Display) -> Self {
        NodeError {
            op,
            message: message.to_string(),
            stale: None,
            withheld: None,
        }
    }

    /// A request that could not be resolved; an expired-metadata refusal keeps its role and
    /// expiry typed in [`Self::stale`], a rollout's refusal its hold in [`Self::withheld`].
    pub fn resolve(e: &ResolveError) -> Self {
        let channel = e.channel_error();
        NodeError {
            op: "resolve",
            message: e.to_string(),
            stale: channel
                .and_then(|c| c.metadata_expired())
                .map(|(role, expires)| StaleMetadata { role, expires }),
            withheld: match channel {
                Some(libupgrade::channel::ChannelError::Withheld {
                    hold, withdrawn, ..
                }) => Some(Withheld {
                    hold: hold.clone(),
                    withdrawn: withdrawn.clone(),
                }),
                _ => None,
            },
        }
    }
}

/// Byte progress of a stage, reported from the blocking thread.
pub trait StageProgress: Send + Sync {
    /// A new file starts: `total` bytes, `already` of them present from an earlier attempt.
    fn begin(&self, what: &str, total: u64, already: u64);
    fn advance(&self, bytes: u64);
    fn end(&self);
}

/// The boot-assessment core's verdict on the trial boot (`libupgrade::assess`), as the agent
/// acts on it. The agent never decides this itself: it reports Node-Ready as one health check
/// and carries out what the verdict says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfirmResult {
    /// The booted slot is confirmed good.
    Healthy,
    /// The checks failed before the bless; the slot was marked bad and the other slot made the
    /// next boot: reboot into it.
    RolledBack(String),
    /// The checks failed on a slot that is already blessed (or with no good slot to return
    /// to): recorded, nothing rolls back.
    Unhealthy(String),
}

/// The name of the agent's health check, awaited by the activations it makes.
pub const NODE_READY: &str = "node-ready";

/// What the agent needs from the node: libupgrade's verbs.
pub trait NodeOps: Send + Sync + 'static {
    /// Versions and states of both slots.
    fn status(&self) -> Result<NodeUpdateStatus, NodeError>;
    /// Resolve `req` through its channel, once: the release a preview and a stage of it find,
    /// or why not ([`NodeError::withheld`]: the rollout holds the version back). What it may
    /// write on the node is [`StageRequest::writes`]; an offline bundle is never looked at
    /// here ([`NodeOps::offline`]).
    fn resolve(&self, req: &StageRequest) -> Result<Release, NodeError>;
    /// The release of `req`'s version in this node's offline-bundle directory
    /// (`BUNDLE_DIR_ENV`), which a stage takes before the channel; `None`: no directory or
    /// no bundle of it. Reads local files only.
    fn offline(&self, _req: &StageRequest) -> Result<Option<Release>, NodeError> {
        Ok(None)
    }
    /// The time this node's resolutions judge rollouts at (its clock; the binary's tests set
    /// libupgrade's test clock, a simulated node its channel's): the poller counts the time to
    /// a wave's admission from it.
    fn rollout_clock(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::Utc::now()
    }
    /// When the release staged in the inactive slot is withdrawn by `channel`'s signed metadata
    /// (as resolved for `seed`), mark the slot bad so it is never activated, and return the
    /// dropped version; `Ok(None)` when the channel does not withdraw it. The one place the
    /// agent acts on a withdrawal.
    fn drop_withdrawn(&self, channel: &str, seed: Seed) -> Result<Option<String>, NodeError>;
    /// Download, verify and write `rel` into the inactive slot as `opts` say; resumes a partial
    /// download and never touches the booted slot or the bootloader's choice. A clean stop at
    /// the byte budget or the schedule's end is [`StageEnd::Stopped`], not an error.
    /// `book_on`: the quota day the fetched bytes are booked on (None: no quota, no ledger).
    fn stage(
        &self,
        rel: &Release,
        opts: &StageOptions,
        book_on: Option<chrono::NaiveDate>,
        progress: &dyn StageProgress,
    ) -> Result<StageEnd, NodeError>;
    /// What staging `rel` would fetch and reuse, before its first byte (recorded on the node
    /// for `k3os-ops slot status`); `None` where the node cannot tell (a simulated node).
    fn preview(
        &self,
        _rel: &Release,
        _opts: &StageOptions,
    ) -> Result<Option<PreviewRecord>, NodeError> {
        Ok(None)
    }
    /// Bytes counted against the quota of day `day` (the node's ledger; 0 where it keeps
    /// none; all of it once a stage stopped at the quota that day, see
    /// [`libupgrade::state::ledger::DayUse`]).
    fn fetched_on(&self, _day: chrono::NaiveDate) -> Result<u64, NodeError> {
        Ok(0)
    }
    /// Send the node's kept failure bundles within `allow` (after its reports), booking the
    /// bytes sent on quota day `book_on` (None: no quota); returns what the send did. Nothing
    /// sent where the node keeps none (a simulated node) or reports nowhere.
    fn send_bundles(
        &self,
        _allow: libupgrade::BundleAllowance,
        _book_on: Option<chrono::NaiveDate>,
    ) -> Result<libupgrade::BundlesSent, NodeError> {
        Ok(libupgrade::BundlesSent::default())
    }
    /// Make the bootloader try the staged slot at the next boot; the trial boot is not blessed
    /// before [`Self::confirm`] reports [`NODE_READY`], and counts as failed when that does not
    /// happen within `node_ready_within` of the boot.
    fn activate(&self, node_ready_within: std::time::Duration) -> Result<(), NodeError>;
    /// Assess the booted slot with `node_ready` among its health checks (all of them before
    /// the single bless point) and return the verdict.
    fn confirm(
        &self,
        node_ready: libupgrade::health::CheckResult,
    ) -> Result<ConfirmResult, NodeError>;
    /// Flush file systems and reboot. Returns only on failure (or in a simulation).
    fn reboot(&self) -> Result<(), NodeError>;
    /// The dm-verity scrub of both slots (`slot verify`), repairing the slot that is not
    /// booted and marking it bad when FEC cannot; never while this process writes a slot.
    /// Op `verify`; its message is libupgrade's.
    fn verify_slots(&self) -> Result<Vec<libupgrade::SlotScrub>, NodeError>;
}
