//! The node side of the agent: a small trait over the A/B slot machinery, so the controller
//! logic runs against fakes in tests and against `libupgrade` on nodes.
//!
//! The methods are synchronous (libupgrade is blocking, disk-bound code); the controller calls
//! them through `tokio::task::spawn_blocking`.
//!
//! A stage is libupgrade's one [`StageRequest`] (what the CLI's `upgrade` makes too): the agent
//! maps its channel to it in one place (the stage tick), and the real node adds only its own
//! offline-bundle directory ([`BUNDLE_DIR_ENV`]) and books the fetched bytes on the quota
//! ledger ([`super::ledger`]). A bundle is used exactly as `upgrade --bundle FILE` uses it: its
//! signed manifest must name the version its header names, which must be the target; the
//! channel is not read at all (a site whose link is down stages from it).
//!
//! Every resolution of the agent places the node by its cluster's seed
//! ([`crate::agent::channel::fleet_waves::cluster_seed`]), never by the node's own seed file:
//! the channel's fleet waves admit a cluster as a whole and the in-cluster rollout orders its
//! nodes. Resolving
//! `latest` ([`NodeOps::resolve_latest`]: the poller, the claim check) only looks: it records
//! what it trusted and keeps the verified metadata files, as every TUF client does (so the next
//! poll of an unchanged channel costs two small downloads, and the node's rollback protection
//! moves on), but creates no seed file and drops nothing ([`libupgrade::Writes::Trust`]). The
//! one place that acts on a withdrawal is the node's own tick [`NodeOps::drop_withdrawn`],
//! which the decision asks for when this node's staged release is withdrawn (the poller runs
//! on one node of the cluster and could drop only its own slot).

use std::sync::atomic::{AtomicU64, Ordering};

use libupgrade::Stop;
use libupgrade::{Release, ResolveError, Source, StageRequest};

use super::latest::Latest;
use super::pinned::Pinned;
use super::ledger::{self, PreviewRecord, FORMAT};
use super::status::NodeUpdateStatus;
use libupgrade::rollout::Seed;

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
}

/// Which role of a channel's signed metadata expired, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleMetadata {
    pub role: libupgrade::trust::Role,
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
        }
    }

    /// A request that could not be resolved; an expired-metadata refusal keeps its role and
    /// expiry typed in [`Self::stale`].
    pub fn resolve(e: &ResolveError) -> Self {
        NodeError {
            op: "resolve",
            message: e.to_string(),
            stale: e
                .channel_error()
                .and_then(|c| c.metadata_expired())
                .map(|(role, expires)| StaleMetadata { role, expires }),
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

/// What the agent needs from the node.
pub trait NodeOps: Send + Sync + 'static {
    /// Versions and states of both slots.
    fn status(&self) -> Result<NodeUpdateStatus, NodeError>;
    /// What `latest` of `channel` is for a node of this architecture placed at `seed` in the
    /// channel's rollouts: the release offered, the newer one held back and the withdrawn
    /// ones. Only looks: records what it trusted and keeps the verified metadata
    /// ([`libupgrade::Writes::Trust`]), writes no seed file, drops nothing. The cluster's view
    /// ([`StageRequest::for_cluster`]): this node's staged release does not count as started.
    fn resolve_latest(&self, channel: &str, seed: Seed) -> Result<Latest, NodeError>;
    /// The time this node's resolutions judge rollouts at (its clock; the binary's tests set
    /// libupgrade's test clock, a simulated node its channel's): the poller counts the time to
    /// a wave's admission from it.
    fn rollout_clock(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::Utc::now()
    }
    /// Whether `channel`'s rollout offers the pinned `version` to a node placed at `seed` now,
    /// or holds it back and why ([`Pinned`]); `ignore_rollout`: as `upgrade --ignore-rollout`
    /// (a withdrawal still shows in [`Pinned::withdrawn`]). Only looks, as the cluster's view
    /// (as [`NodeOps::resolve_latest`]), and from the channel only (an offline bundle of the
    /// version says nothing about its rollout). `Err`: the channel could not be resolved at all.
    fn resolve_pinned(
        &self,
        channel: &str,
        version: &str,
        seed: Seed,
        ignore_rollout: bool,
    ) -> Result<Pinned, NodeError>;
    /// When the release staged in the inactive slot is withdrawn by `channel`'s signed metadata
    /// (as resolved for `seed`), mark the slot bad so it is never activated, and return the
    /// dropped version; `Ok(None)` when the channel does not withdraw it. The one place the
    /// agent acts on a withdrawal.
    fn drop_withdrawn(&self, channel: &str, seed: Seed) -> Result<Option<String>, NodeError>;
    /// Download, verify and write the release `req` asks for into the inactive slot; resumes
    /// a partial download and never touches the booted slot or the bootloader's choice. A clean
    /// stop at the byte budget or the schedule's end is [`StageEnd::Stopped`], not an error.
    /// `book_on`: the quota day the fetched bytes are booked on (None: no quota, no ledger).
    fn stage(
        &self,
        req: &StageRequest,
        book_on: Option<chrono::NaiveDate>,
        progress: &dyn StageProgress,
    ) -> Result<StageEnd, NodeError>;
    /// What staging `req` would fetch and reuse, before its first byte (recorded on the node
    /// for `k3os-ops slot status`); `None` where the node cannot tell (fakes).
    fn preview(&self, _req: &StageRequest) -> Result<Option<PreviewRecord>, NodeError> {
        Ok(None)
    }
    /// Bytes counted against the quota of day `day` (the node's ledger; 0 where it keeps
    /// none; all of it once a stage stopped at the quota that day, see [`ledger::DayUse`]).
    fn fetched_on(&self, _day: chrono::NaiveDate) -> Result<u64, NodeError> {
        Ok(0)
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
    /// Flush file systems and reboot. Returns only on failure (or in fakes).
    fn reboot(&self) -> Result<(), NodeError>;
}

/// [`NodeOps`] over `libupgrade::Updater` on the real node.
pub struct LibupgradeNode {
    updater: libupgrade::Updater,
    /// How the node reboots ([`crate::node::Reboot::from_env`]: `K3OS_OPS_REBOOT_CMD`, else
    /// `reboot` in the namespaces of the host's PID 1 — the image has no `nsenter`).
    reboot: crate::node::Reboot,
    /// Where offline bundles are looked for ([`BUNDLE_DIR_ENV`]; None: nowhere).
    bundle_dir: Option<std::path::PathBuf>,
}

/// Environment variable overriding the reboot command.
#[cfg(any(test, feature = "testing"))]
pub use crate::node::REBOOT_CMD_ENV;

impl LibupgradeNode {
    /// Open the node's updater from `config` (or `K3OS_OPS_CONFIG` / the default path).
    pub fn open(config: Option<std::path::PathBuf>) -> anyhow::Result<LibupgradeNode> {
        let cfg = match &config {
            Some(p) => libupgrade::Config::load(p)?,
            None => libupgrade::Config::from_env()?,
        };
        let updater = libupgrade::Updater::open(cfg)?;
        Ok(LibupgradeNode {
            updater,
            reboot: crate::node::Reboot::from_env(),
            bundle_dir: std::env::var_os(BUNDLE_DIR_ENV)
                .filter(|v| !v.is_empty())
                .map(Into::into),
        })
    }

    /// Over an already opened updater, with an explicit reboot command.
    #[cfg(any(test, feature = "testing"))]
    pub fn new(updater: libupgrade::Updater, reboot_cmd: Vec<String>) -> LibupgradeNode {
        LibupgradeNode {
            updater,
            reboot: crate::node::Reboot::Command(reboot_cmd),
            bundle_dir: None,
        }
    }

    /// Look for offline bundles of the target version in `dir` before the channel.
    #[cfg(any(test, feature = "testing"))]
    pub fn with_bundle_dir(self, dir: std::path::PathBuf) -> LibupgradeNode {
        LibupgradeNode {
            bundle_dir: Some(dir),
            ..self
        }
    }

    /// The release `req` stages on this node: a bundle of its version from the node's bundle
    /// directory, else the channel's (through its signed metadata when the node has a root).
    fn release(&self, req: &StageRequest) -> Result<Release, NodeError> {
        let req = StageRequest {
            bundle_dir: req.bundle_dir.clone().or_else(|| self.bundle_dir.clone()),
            ..req.clone()
        };
        let rel = self
            .updater
            .resolve(&req)
            .map_err(|e| NodeError::resolve(&e))?;
        if let libupgrade::Origin::Bundle { .. } = rel.origin {
            tracing::info!("staging from {rel}");
        }
        Ok(rel)
    }

    fn state_dir(&self) -> &std::path::Path {
        &self.updater.config().state_dir
    }
}

/// Map libupgrade's two-slot status onto what the decision needs.
pub fn summarize(status: &libupgrade::Status) -> NodeUpdateStatus {
    use super::status::{Inactive, TrialFailure};
    use libupgrade::state::SlotState;
    let booted = status.slots.iter().find(|s| s.booted);
    let other = status
        .slots
        .iter()
        .find(|s| !s.booted && Some(s.slot) != booted.map(|b| b.slot));
    let inactive = match other {
        None => Inactive::Empty,
        Some(o) => match (o.state, o.version.clone()) {
            (_, None) | (SlotState::Empty | SlotState::Invalid, _) => Inactive::Empty,
            (SlotState::Staged | SlotState::Good, Some(v)) => Inactive::Staged(v),
            // This boot's assessment (which `status` requires) settled every spent trial: a
            // fallback made it bad (`verdict.other_slot`). Still on trial means activated in
            // this boot, reboot pending.
            (SlotState::Trying, Some(v)) => Inactive::Activated(v),
            (SlotState::Bad, Some(v)) => Inactive::Failed(v),
        },
    };
    // A failed trial: what the core recorded about it (its last decision on that slot).
    let failed_trial = match (&inactive, other) {
        (Inactive::Failed(_), Some(o)) => o.last_decision.as_ref().map(|d| TrialFailure {
            event: serde_json::to_value(d.event)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            reason: d.why.clone(),
        }),
        _ => None,
    };
    NodeUpdateStatus {
        booted_version: booted.and_then(|b| b.version.clone()),
        booted_on_trial: booted.is_some_and(|b| b.state == SlotState::Trying),
        inactive,
        failed_trial,
    }
}

impl NodeOps for LibupgradeNode {
    fn status(&self) -> Result<NodeUpdateStatus, NodeError> {
        let st = self
            .updater
            .status()
            .map_err(|e| NodeError::new("status", e))?;
        // The slot states mean what the boot-assessment core made of this boot; before it ran
        // (init runs `slot confirm` first thing) a spent trial still reads as on trial.
        if st.verdict.is_none() {
            return Err(NodeError::new(NOT_ASSESSED, NOT_ASSESSED_HELP));
        }
        Ok(summarize(&st))
    }

    fn rollout_clock(&self) -> chrono::DateTime<chrono::Utc> {
        libupgrade::channel::TrustOptions::from_config(self.updater.config())
            .now
            .unwrap_or_else(chrono::Utc::now)
    }

    fn resolve_latest(&self, channel: &str, seed: Seed) -> Result<Latest, NodeError> {
        let req = StageRequest {
            writes: libupgrade::Writes::Trust,
            for_cluster: true,
            seed: Some(seed),
            ..StageRequest::new(libupgrade::Wanted::channel(channel, None))
        };
        Ok(Latest::of(&self.release(&req)?))
    }

    fn resolve_pinned(
        &self,
        channel: &str,
        version: &str,
        seed: Seed,
        ignore_rollout: bool,
    ) -> Result<Pinned, NodeError> {
        // No bundle directory: a bundle of the version would resolve without the channel and
        // say nothing about the rollout the question is about.
        let req = StageRequest {
            writes: libupgrade::Writes::Trust,
            for_cluster: true,
            seed: Some(seed),
            ignore_rollout,
            ..StageRequest::new(libupgrade::Wanted::channel(channel, Some(version)))
        };
        match self.updater.resolve(&req) {
            Ok(rel) => Ok(Pinned::from_release(version, &rel)),
            Err(e) => Pinned::from_refusal(version, &e).ok_or_else(|| NodeError::resolve(&e)),
        }
    }

    fn drop_withdrawn(&self, channel: &str, seed: Seed) -> Result<Option<String>, NodeError> {
        let before = self.status()?.inactive;
        // `Writes::All`: `Updater::resolve` marks a withdrawn staged slot bad (the same code
        // `upgrade --version latest` runs), and only when the signed metadata says so.
        let req = StageRequest {
            seed: Some(seed),
            ..StageRequest::new(libupgrade::Wanted::channel(channel, None))
        };
        let rel = self.release(&req)?;
        let dropped = match &rel.origin {
            libupgrade::Origin::Channel {
                rollout: Some(note),
                ..
            } => note.drop_staged.as_ref().map(|d| d.version.clone()),
            _ => None,
        };
        let was_staged =
            |v: &String| matches!(&before, super::status::Inactive::Staged(s) if s == v);
        Ok(dropped.filter(was_staged))
    }

    fn stage(
        &self,
        req: &StageRequest,
        book_on: Option<chrono::NaiveDate>,
        progress: &dyn StageProgress,
    ) -> Result<StageEnd, NodeError> {
        let rel = self.release(req)?;
        let counting = Counting::new(progress);
        let r = self.updater.stage(&rel, &req.options, &counting);
        let (end, fetched) = ended(r, counting.fetched());
        if let Some(day) = book_on {
            let spent = matches!(
                end,
                Ok(StageEnd::Stopped {
                    why: Stop::Budget { .. },
                    ..
                })
            );
            ledger::add_fetched(self.state_dir(), day, fetched, spent)
                .map_err(|e| NodeError::new("stage", e))?;
        }
        end.map_err(|e| NodeError::new("stage", e))
    }

    fn preview(&self, req: &StageRequest) -> Result<Option<PreviewRecord>, NodeError> {
        let rel = self.release(req)?;
        let p = self
            .updater
            .preview(&rel, &req.options)
            .map_err(|e| NodeError::new("preview", e))?;
        let rec = record(&p, &rel, req.options.clock.now());
        ledger::record_preview(self.state_dir(), &rec).map_err(|e| NodeError::new("preview", e))?;
        Ok(Some(rec))
    }

    fn fetched_on(&self, day: chrono::NaiveDate) -> Result<u64, NodeError> {
        ledger::used_on(self.state_dir(), day)
            .map(|u| u.counted())
            .map_err(|e| NodeError::new("stage", e))
    }

    fn activate(&self, node_ready_within: std::time::Duration) -> Result<(), NodeError> {
        let awaits = libupgrade::state::AwaitedChecks {
            names: vec![NODE_READY.to_string()],
            within_secs: node_ready_within.as_secs().max(1),
        };
        self.updater
            .activate_awaiting(None, Some(awaits))
            .map(|_| ())
            .map_err(|e| NodeError::new("activate", e))
    }

    fn confirm(
        &self,
        node_ready: libupgrade::health::CheckResult,
    ) -> Result<ConfirmResult, NodeError> {
        use crate::report::Unconfirmed;
        let rep = self
            .updater
            .confirm_with(&[&node_ready])
            .map_err(|e| NodeError::new("confirm", e))?;
        match Unconfirmed::of(&rep) {
            None => Ok(ConfirmResult::Healthy),
            Some(Unconfirmed::HealthFailed {
                failures,
                rolled_back,
                ..
            }) => Ok(if rolled_back {
                ConfirmResult::RolledBack(failures)
            } else {
                ConfirmResult::Unhealthy(failures)
            }),
            Some(not_assessed_or_pending) => {
                Err(NodeError::new("confirm", not_assessed_or_pending))
            }
        }
    }

    fn reboot(&self) -> Result<(), NodeError> {
        let how = &self.reboot;
        let out = how
            .command()
            .and_then(|mut c| Ok(c.output()?))
            .map_err(|e| NodeError::new("reboot", format!("cannot run {how}: {e:#}")))?;
        if !out.status.success() {
            return Err(NodeError::new(
                "reboot",
                format!(
                    "{how} failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            ));
        }
        // The reboot command returns once shutdown has begun; give it time to kill us.
        std::thread::sleep(std::time::Duration::from_secs(300));
        Err(NodeError::new(
            "reboot",
            format!("{how} succeeded but the node is still running after 5 minutes"),
        ))
    }
}

/// The preview record of `p` (staged from `rel`).
fn record(
    p: &libupgrade::StagePreview,
    rel: &Release,
    at: chrono::DateTime<chrono::Utc>,
) -> PreviewRecord {
    PreviewRecord {
        format: FORMAT,
        version: p.version.clone(),
        fetch: if p.already_staged { 0 } else { p.fetch() },
        reuse: if p.already_staged { 0 } else { p.reuse() },
        bundle: match &rel.source {
            Source::Bundle(b) => Some(b.path.display().to_string()),
            _ => None,
        },
        at: Some(at),
        by_patch: p
            .artifacts
            .iter()
            .filter_map(|c| {
                let from = c.patch_from.as_deref()?;
                Some(format!("{} from {}", c.artifact, from.escape_debug()))
            })
            .collect(),
    }
}

/// Progress that also counts the network bytes (what advanced and was not reused): the
/// ledger's count when a stage fails before its report.
struct Counting<'a> {
    inner: &'a dyn StageProgress,
    advanced: AtomicU64,
    reused: AtomicU64,
}

impl<'a> Counting<'a> {
    fn new(inner: &'a dyn StageProgress) -> Self {
        Counting {
            inner,
            advanced: AtomicU64::new(0),
            reused: AtomicU64::new(0),
        }
    }

    fn fetched(&self) -> u64 {
        self.advanced
            .load(Ordering::Relaxed)
            .saturating_sub(self.reused.load(Ordering::Relaxed))
    }
}

impl libupgrade::Progress for Counting<'_> {
    fn begin(&self, what: &str, total: u64, already: u64) {
        self.inner.begin(what, total, already)
    }
    fn advance(&self, bytes: u64) {
        self.advanced.fetch_add(bytes, Ordering::Relaxed);
        self.inner.advance(bytes)
    }
    fn end(&self) {
        self.inner.end()
    }
    fn reused(&self, bytes: u64) {
        self.reused.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Map a stage's result to how it ended and the bytes it fetched.
fn ended(
    r: libupgrade::Result<libupgrade::StageReport>,
    counted: u64,
) -> (Result<StageEnd, libupgrade::Error>, u64) {
    match r {
        Ok(rep) => (
            Ok(StageEnd::Staged {
                fetched: rep.bytes_fetched,
            }),
            rep.bytes_fetched,
        ),
        Err(libupgrade::Error::Stopped { why, fetched, left }) => {
            (Ok(StageEnd::Stopped { why, fetched, left }), fetched)
        }
        Err(e) => (Err(e), counted),
    }
}
