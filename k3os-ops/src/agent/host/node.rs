//! [`NodeOps`] on the real node: libupgrade's [`Updater`](libupgrade::Updater) with the
//! node's offline-bundle directory, reboot command and quota ledger ([`libupgrade::state::ledger`]).
//! After a stage, an activation and a confirm it sends the reports libupgrade spooled (a node
//! with a `report_url`; never failing or delaying the step by more than the send's bound), as
//! the CLI's commands do at their end.

use std::sync::atomic::{AtomicU64, Ordering};

use libupgrade::Stop;
use libupgrade::{Release, Source, StageOptions, StageRequest};

use super::ops::{
    ConfirmResult, NodeError, NodeOps, StageEnd, StageProgress, BUNDLE_DIR_ENV, NODE_READY,
    NOT_ASSESSED, NOT_ASSESSED_HELP,
};
use super::status::NodeUpdateStatus;
use libupgrade::rollout::Seed;
use libupgrade::state::ledger::{self, PreviewRecord, FORMAT};

/// [`NodeOps`] over `libupgrade::Updater` on the real node.
pub struct LibupgradeNode {
    updater: libupgrade::Updater,
    /// How the node reboots ([`crate::node::Reboot::from_env`]: `K3OS_OPS_REBOOT_CMD`, else
    /// `reboot` in the namespaces of the host's PID 1 — the image has no `nsenter`).
    reboot: crate::node::Reboot,
    /// Where offline bundles are looked for ([`BUNDLE_DIR_ENV`]; None: nowhere).
    bundle_dir: Option<std::path::PathBuf>,
    /// Held by every call that writes a slot (stage, activate, drop a withdrawn release) and
    /// by the scheduled scrub ([`super::scrub`]), so they never overlap.
    slot_writes: std::sync::Mutex<()>,
}

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
            slot_writes: Default::default(),
        })
    }

    /// Over an already opened updater, with an explicit reboot command.
    #[cfg(any(test, feature = "testing"))]
    pub fn new(updater: libupgrade::Updater, reboot_cmd: Vec<String>) -> LibupgradeNode {
        LibupgradeNode {
            updater,
            reboot: crate::node::Reboot::Command(reboot_cmd),
            bundle_dir: None,
            slot_writes: Default::default(),
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

    /// The dm-verity scrub of both slots (`slot verify`), repairing the slot that is not
    /// booted; never while this process writes a slot.
    pub fn verify_slots(&self) -> libupgrade::Result<Vec<libupgrade::SlotScrub>> {
        let _writing = self.writing();
        self.updater.verify_slots(true)
    }

    fn writing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.slot_writes.lock().unwrap_or_else(|e| e.into_inner())
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
        failed: status.failed.clone(),
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

    fn resolve(&self, req: &StageRequest) -> Result<Release, NodeError> {
        // A resolution spools a new wait report (a wave, a pause, a release held back because
        // it failed here) once per wait: send it now, since an idle node makes no step that
        // sends. Nothing new spooled, nothing sent, so a collector that is away costs an
        // idle node's ticks no send time.
        let spooled = self.updater.spooled_reports();
        let rel = self.updater.resolve(req);
        if self.updater.spooled_reports() > spooled {
            crate::node::send_reports(&self.updater);
        }
        rel.map_err(|e| NodeError::resolve(&e))
    }

    fn offline(&self, req: &StageRequest) -> Result<Option<Release>, NodeError> {
        let req = StageRequest {
            bundle_dir: self.bundle_dir.clone(),
            ..req.clone()
        };
        let rel = req.offline().map_err(|e| NodeError::resolve(&e))?;
        if let Some(rel) = &rel {
            tracing::info!("staging from {rel}");
        }
        Ok(rel)
    }

    fn drop_withdrawn(&self, channel: &str, seed: Seed) -> Result<Option<String>, NodeError> {
        let _writing = self.writing();
        let before = self.status()?.inactive;
        // `Writes::All`: `Updater::resolve` marks a withdrawn staged slot bad (the same code
        // `upgrade --version latest` runs), and only when the signed metadata says so.
        let req = StageRequest {
            seed: Some(seed),
            ..StageRequest::new(libupgrade::Wanted::channel(channel, None))
        };
        let rel = self.resolve(&req)?;
        let dropped = match &rel.origin {
            libupgrade::Origin::Channel {
                rollout: Some(note),
                ..
            } => note.drop_staged.as_ref().map(|d| d.version.clone()),
            _ => None,
        };
        let was_staged =
            |v: &String| matches!(&before, super::status::Inactive::Staged(s) if s == v);
        crate::node::send_reports(&self.updater);
        Ok(dropped.filter(was_staged))
    }

    fn stage(
        &self,
        rel: &Release,
        opts: &StageOptions,
        book_on: Option<chrono::NaiveDate>,
        progress: &dyn StageProgress,
    ) -> Result<StageEnd, NodeError> {
        let counting = Counting::new(progress);
        let _writing = self.writing();
        let r = self.updater.stage(rel, opts, &counting);
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
        crate::node::send_reports(&self.updater);
        end.map_err(|e| NodeError::new("stage", e))
    }

    fn preview(
        &self,
        rel: &Release,
        opts: &StageOptions,
    ) -> Result<Option<PreviewRecord>, NodeError> {
        let p = self
            .updater
            .preview(rel, opts)
            .map_err(|e| NodeError::new("preview", e))?;
        let rec = record(&p, rel, opts.clock.now());
        ledger::record_preview(self.state_dir(), &rec).map_err(|e| NodeError::new("preview", e))?;
        Ok(Some(rec))
    }

    fn verify_slots(&self) -> Result<Vec<libupgrade::SlotScrub>, NodeError> {
        LibupgradeNode::verify_slots(self).map_err(|e| NodeError::new("verify", e))
    }

    fn fetched_on(&self, day: chrono::NaiveDate) -> Result<u64, NodeError> {
        ledger::used_on(self.state_dir(), day)
            .map(|u| u.counted())
            .map_err(|e| NodeError::new("stage", e))
    }

    fn send_bundles(
        &self,
        allow: libupgrade::BundleAllowance,
        book_on: Option<chrono::NaiveDate>,
    ) -> Result<libupgrade::BundlesSent, NodeError> {
        let sent = self.updater.send_bundles(allow).unwrap_or_default();
        if let (Some(day), true) = (book_on, sent.bytes > 0) {
            ledger::add_fetched(self.state_dir(), day, sent.bytes, false)
                .map_err(|e| NodeError::new("send failure bundles", e))?;
        }
        if sent.sent > 0 {
            tracing::info!(
                "failure bundles: {} sent ({} bytes), {} waiting",
                sent.sent,
                sent.bytes,
                sent.waiting
            );
        }
        Ok(sent)
    }

    fn activate(&self, node_ready_within: std::time::Duration) -> Result<(), NodeError> {
        let _writing = self.writing();
        let awaits = libupgrade::state::AwaitedChecks {
            names: vec![NODE_READY.to_string()],
            within_secs: node_ready_within.as_secs().max(1),
        };
        let r = self
            .updater
            .activate_awaiting(None, Some(awaits))
            .map(|_| ())
            .map_err(|e| NodeError::new("activate", e));
        crate::node::send_reports(&self.updater);
        r
    }

    fn confirm(
        &self,
        node_ready: libupgrade::health::CheckResult,
    ) -> Result<ConfirmResult, NodeError> {
        use libupgrade::Unconfirmed;
        let rep = self.updater.confirm_with(&[&node_ready]);
        crate::node::send_reports(&self.updater);
        let rep = rep.map_err(|e| NodeError::new("confirm", e))?;
        match rep.unconfirmed() {
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
