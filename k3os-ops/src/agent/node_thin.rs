//! The node side of a thin-link stage ([`super::node::NodeOps::stage_request`] and
//! [`super::node::NodeOps::preview`] on the real node): where the release comes from (an
//! offline bundle of the target version in the agent's bundle directory, else the channel),
//! the libupgrade [`StageOptions`] a [`StageRequest`] maps to (the CLI's mapping: extra
//! sources through [`ExtraSource::parse`], the schedule, the byte budget), and the count of
//! network bytes for the quota ledger ([`super::ledger`]).
//!
//! A bundle is used exactly as `upgrade --bundle FILE` uses it: its signed manifest must name
//! the version its header names, which must be the target; the channel is not read at all
//! (a site whose link is down stages from it).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use libupgrade::bundle::Bundle;
use libupgrade::stage::{Clock, Schedule, Stop};
use libupgrade::{ExtraSource, Source, StageOptions};

use super::ledger::{PreviewRecord, FORMAT};
use super::node::{NodeError, StageProgress};

/// Environment variable naming the host directory the agent looks for offline bundles in
/// (the DaemonSet mounts it read-only; unset: no bundles).
pub const BUNDLE_DIR_ENV: &str = "K3OS_OPS_BUNDLE_DIR";

/// A stage as the agent asks for it: the channel's release plus the thin-link settings.
#[derive(Debug, Clone, Default)]
pub struct StageRequest {
    pub channel: String,
    pub version: String,
    /// Accept an older release (the channel pins it).
    pub allow_downgrade: bool,
    /// `spec.maxRate`.
    pub max_rate: Option<u64>,
    /// What today's quota has left (None: no quota).
    pub max_bytes: Option<u64>,
    /// The stage windows open now (None: any time).
    pub schedule: Option<Schedule>,
    /// `spec.sources[]`, in order.
    pub sources: Vec<String>,
    /// The quota day the fetched bytes are booked on (None: no quota, no ledger).
    pub ledger_day: Option<chrono::NaiveDate>,
    /// The clock the schedule follows (None: the system's).
    pub clock: Option<Arc<dyn Clock>>,
}

impl StageRequest {
    /// Nothing beyond what [`super::node::NodeOps::stage`] does.
    pub fn is_plain(&self) -> bool {
        self.max_bytes.is_none()
            && self.schedule.is_none()
            && self.sources.is_empty()
            && self.ledger_day.is_none()
    }
}

/// How a stage ended that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageEnd {
    /// Verified and staged.
    Staged { fetched: u64 },
    /// Stopped cleanly at the quota or the end of the open windows; a later stage resumes.
    Stopped { why: Stop, fetched: u64, left: u64 },
}

/// Where the release comes from, and what its signed manifest must be.
pub(super) struct Release {
    pub source: Source,
    pub version: String,
    pub pin: Option<libupgrade::trust::ManifestPin>,
}

/// The bundle in `dir` whose header names `version` (the first in name order when several
/// do). Files that are not bundles are skipped; an unreadable directory is an error naming it.
pub(super) fn find_bundle(dir: &Path, version: &str) -> Result<Option<Bundle>, NodeError> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        NodeError::new(
            "stage",
            format!("bundle directory {} ({BUNDLE_DIR_ENV}): {e}", dir.display()),
        )
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    Ok(files
        .iter()
        .filter_map(|p| Bundle::open(p).ok())
        .find(|b| b.header.version == version))
}

/// A bundle of `version` from `bundle_dir`, else `resolve` (the channel).
pub(super) fn release(
    bundle_dir: Option<&Path>,
    version: &str,
    resolve: impl FnOnce() -> Result<libupgrade::channel::ResolvedRelease, NodeError>,
) -> Result<Release, NodeError> {
    if let Some(b) = bundle_dir
        .map(|d| find_bundle(d, version))
        .transpose()?
        .flatten()
    {
        tracing::info!(
            "staging {version} from the offline bundle {}",
            b.path.display()
        );
        return Ok(Release {
            version: b.header.version.clone(),
            source: Source::Bundle(b),
            pin: None,
        });
    }
    let r = resolve()?;
    Ok(Release {
        source: r.source,
        version: r.version,
        pin: r.pin,
    })
}

/// The libupgrade options of `req` for `rel`.
pub(super) fn options(req: &StageRequest, rel: &Release) -> StageOptions {
    let mut opts = StageOptions {
        allow_downgrade: req.allow_downgrade,
        max_rate: req.max_rate,
        // The signed manifest must be the release the channel (or the bundle's header) named,
        // and when the channel's signed metadata chose it, exactly that manifest.
        expect_version: Some(rel.version.clone()),
        expect_manifest: rel.pin.clone(),
        max_bytes: req.max_bytes,
        extra_sources: req.sources.iter().map(|s| ExtraSource::parse(s)).collect(),
        schedule: req.schedule.clone(),
        ..StageOptions::default()
    };
    if let Some(c) = &req.clock {
        opts.clock = c.clone();
    }
    opts
}

/// The preview record of `p` (staged from `rel`).
pub(super) fn record(
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
    }
}

/// Progress that also counts the network bytes (what advanced and was not reused): the
/// ledger's count when a stage fails before its report.
pub(super) struct Counting<'a> {
    pub inner: &'a dyn StageProgress,
    advanced: AtomicU64,
    reused: AtomicU64,
}

impl<'a> Counting<'a> {
    pub fn new(inner: &'a dyn StageProgress) -> Self {
        Counting {
            inner,
            advanced: AtomicU64::new(0),
            reused: AtomicU64::new(0),
        }
    }

    pub fn fetched(&self) -> u64 {
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
pub(super) fn ended(
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
