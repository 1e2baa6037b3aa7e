//! What the stage's steps work with: the node's side ([`Env`]), where a release is being
//! placed while it is planned ([`Placing`]), one run's shared state while it writes ([`Run`]),
//! and what a run moved ([`Moved`]) and reports.

use bootconfig::Slot;

use super::{weigh, Progress, StageOptions, StageReport};
use crate::config::Config;
use crate::layout::Layout;
use crate::manifest::Manifest;
use crate::net::fetch::Source;
use crate::net::rate::Throttle;
use crate::net::retry::Backoff;
use crate::stage::api::PatchOutcome;

/// A release whose signature, manifest, architecture, generation and size were checked.
pub(super) struct Verified {
    pub manifest: Manifest,
    /// The signed manifest bytes, and their sha256 (the release's identity).
    pub bytes: Vec<u8>,
    pub sha256: String,
    /// Key id that signed it.
    pub key: String,
    /// Where the manifest was read, for messages.
    pub location: String,
}

/// The node's side of a stage, read by every step: its configuration, its slots' layout,
/// and when this attempt stops retrying.
#[derive(Clone, Copy)]
pub(crate) struct Env<'a> {
    pub cfg: &'a Config,
    pub layout: &'a dyn Layout,
    /// When this stage attempt stops retrying (`StageOptions::retry_for` from its start).
    pub deadline: Option<std::time::Instant>,
}

impl Env<'_> {
    /// The rules every body this attempt reads is under: `--min-rate` and `--retry-for`.
    pub fn watch(&self, opts: &StageOptions) -> crate::net::fetch::Watch {
        crate::net::fetch::Watch {
            min_rate: opts.min_rate_rule(),
            deadline: self.deadline,
        }
    }

    /// The one backoff policy for this stage's transfers.
    pub fn backoff(&self, opts: &StageOptions) -> Backoff {
        Backoff::new(opts.retry_delay, self.cfg.download_retries).until(self.deadline)
    }
}

/// Where a release is being placed, for planning its parts.
pub(crate) struct Placing<'a> {
    pub env: Env<'a>,
    pub source: &'a Source,
    pub opts: &'a StageOptions,
    pub m: &'a Manifest,
    pub slot: Slot,
    /// The running slot and its version (where reusable chunks are looked for).
    pub running: (Slot, Option<String>),
    /// The sha256 of the running release's manifest (which build runs), when known.
    pub running_sha256: Option<String>,
    /// The running slot's kept manifest, when there is one: its payloads are in the store.
    pub kept: Option<Manifest>,
    /// An interrupted attempt is continued: what the target holds is re-verified.
    pub resumed: bool,
    /// The link rate a patch's apply time is weighed against ([`weigh`]), if known.
    pub link: Option<weigh::LinkRate>,
}

/// The link rate the planner weighs with: the one told (`max_rate`, the slowest rate a stage
/// window names), else the one `measured` on the stage's metadata (see [`weigh`]).
pub(super) fn link_rate(opts: &StageOptions, measured: Option<u64>) -> Option<weigh::LinkRate> {
    let windows = opts
        .schedule
        .iter()
        .flat_map(|s| s.windows().iter().filter_map(|w| w.rate));
    match opts.max_rate.into_iter().chain(windows).min() {
        Some(told) => Some(weigh::LinkRate {
            bytes_per_sec: told,
            told: true,
        }),
        None => measured.map(|m| weigh::LinkRate {
            bytes_per_sec: m,
            told: false,
        }),
    }
}

/// What one stage run works with (shared by the per-part executors).
pub(crate) struct Run<'a> {
    pub env: Env<'a>,
    pub source: &'a Source,
    pub m: &'a Manifest,
    pub slot: Slot,
    /// A checkpoint of this release into this slot existed: re-verify what the target holds.
    pub resumed: bool,
    pub opts: &'a StageOptions,
    pub progress: &'a dyn Progress,
    pub throttle: Throttle<'a>,
    /// Bytes moved by this run so far.
    pub moved: std::cell::Cell<Moved>,
    /// The artifacts rebuilt by a patch so far.
    pub patched: std::cell::RefCell<Vec<PatchOutcome>>,
}

/// Bytes a run moved, by where they came from.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Moved {
    pub fetched: u64,
    pub reused: u64,
    pub from_mirrors: u64,
    pub refused: u64,
}

/// The report of a stage run into `slot` of release `v`.
pub(super) fn report(
    slot: Slot,
    v: Verified,
    already_staged: bool,
    resumed: bool,
    bytes_written: u64,
    moved: Moved,
) -> StageReport {
    StageReport {
        slot,
        version: v.manifest.version,
        generation: v.manifest.generation,
        signed_by: v.key,
        already_staged,
        resumed,
        bytes_written,
        bytes_fetched: moved.fetched,
        bytes_reused: moved.reused,
        bytes_from_mirrors: moved.from_mirrors,
        chunks_refused: moved.refused,
        patched: Vec::new(),
    }
}
