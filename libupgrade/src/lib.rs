//! libupgrade: A/B slot updates for immutable squashfs nodes.
//!
//! A node has two slots, A and B, each a squashfs rootfs plus a kernel and an initrd. The
//! [`Updater`] stages a signed release into the slot that is not running, hands it to the
//! bootloader for a bounded number of tries, and on the next boot confirms its health or lets
//! the bootloader fall back. This crate knows nothing of Kubernetes; `k3os-ops` is a thin
//! binary on top of it.
//!
//! # Architecture
//! One way through, per flow; decisions are pure functions, effects happen at the edges.
//! Modules in `code` are private (their API is re-exported at the crate root, one path per
//! type); linked ones are public namespaces for formats and publisher tools.
//!
//! - **Ask** (`request`): a front end (the CLI, the agent) fills one [`StageRequest`] — a
//!   [`channel`]'s version, a release location or an offline [`bundle`] — and
//!   [`StageRequest::resolve`] turns it into a [`Release`]: where its files are and what its
//!   signed manifest must be (through the channel's signed metadata, [`trust`], when the node
//!   has a root; [`channel::resolve_with`]).
//! - **Stage** ([`Updater::stage`], `stage`): `stage::verify` (signature or pin, [`manifest`],
//!   arch, generation, space, then every file on the server; bodies read by `fetch` under the
//!   minimum rate and the attempt's deadline) → `stage::plan` (pure: per artifact done /
//!   chunked / stream, priced before the first byte: [`Updater::preview`]) → the executors
//!   ([`chunk`] deltas, streamed downloads with `checkpoint`s, retried by `retry`) writing
//!   through [`layout`] → commit ([`state`], [`slotfiles`]).
//! - **Activate** ([`Updater::activate_awaiting`]): `bootscript` (pure: which boot script both
//!   slots read) → loader writes (`bootconfig`) → [`state`].
//! - **Confirm** (every boot, `confirm`): [`health`] checks (and [`reach`]) → [`assess`] (pure:
//!   state, loader view, boot, checks → new state, loader operations, verdict) → its effects.
//! - **Publish** ([`release`], [`signing`]): create and sign a release, rebuild a channel's
//!   index; [`trust::publish`] signs the channel's metadata (root, targets, snapshot,
//!   timestamp).
//! - **Patches** ([`patch`]): per-pair patches of an artifact against an earlier release's
//!   (a squashfs rootfs in terms of its uncompressed file data), built by the publisher and
//!   applied by the node in bounded memory.
//!
//! By folder: `boot/` holds what runs at a boot (`health`, `reach`, `assess`, `confirm`,
//! `bootscript`), `net/` what moves bytes over a link (`http`, `fetch`, `retry`,
//! `checkpoint`), `stage/` the pipeline, [`chunk`], [`channel`], [`trust`], [`rollout`],
//! [`state`], [`layout`] and [`release`] their own formats and tools.
//!
//! - **Report** (`report`): each outcome above spools one signed report ([`fleet_report`])
//!   on the state partition; [`Updater::send_reports`] sends them to the node's `report_url`.
//!
//! Below them: `config` ([`Config`], the node configuration), `error` ([`Error`], and
//! [`chain_line`], the one renderer of error chains), [`units`] (sizes, rates, durations), [`version`] (what a release version may be),
//! [`http`] (the one HTTP client), `barrier` (named write barriers for power-cut tests),
//! `sqcheck` (the squashfs check). Every format a node stores or reads (state file, manifest,
//! chunk index, channel index, the loader's files) carries a version, reads every earlier one
//! and refuses a newer one by name: see each module's docs and CHANGELOG.md.
#![warn(missing_docs)]

// The pipeline and its decisions: private, their API re-exported below (one path per type).
mod barrier;
mod boot;
mod config;
mod error;
mod net;
mod report;
mod request;
mod scrub;
mod sqcheck;
mod stage;
mod updater;

// Formats and publisher tools: public namespaces, each the one path of what it holds.
pub mod bundle;
pub mod channel;
pub mod chunk;
pub mod layout;
pub mod manifest;
pub mod patch;
pub mod payload;
pub mod release;
pub mod rollout;
pub mod signing;
pub mod slotfiles;
pub mod state;
pub mod trust;
pub mod units;
pub mod verity;
pub mod version;

/// Largest number of tries a slot can be given (GRUB counts down with an explicit if-chain).
pub const MAX_TRIES: u8 = 9;

pub use boot::assess::{
    assess, assessable, Assessment, Effect, LoaderOp, LoaderView, ObservedBoot, VerityFailure,
};
pub use boot::bootscript::{ScriptRefusal, ScriptStep};
pub use boot::confirm::ConfirmReport;
pub use boot::outcome::Unconfirmed;
pub use boot::{health, reach};
pub use bootconfig::Slot;
pub use config::{
    BootloaderKind, Config, LayoutConfig, CONFIG_ENV, DEFAULT_CONFIG,
    DEFAULT_PAYLOAD_STORE_MAX_BYTES,
};
pub use error::{chain_line, join_messages, Error, Result, Stop};
#[cfg(feature = "fuzzing")]
pub use net::checkpoint::fuzz_load_and_resave;
pub use net::fetch::{ExtraSource, Probe, Source, Watch};
pub use net::http;
pub use net::rate::{Clock, MinRate, SystemClock};
pub use net::retry::{Backoff, MAX_DELAY};
pub use net::schedule::{Allowance, Schedule, ScheduleError, Window};
pub use report::{
    spool_dir, BundleAllowance, BundleDelivery, BundleSettings, BundlesSent, KeptBundle,
    Limits as SpoolLimits, RedactError, RedactRule, Redactor, ReportsSent, BUNDLE_CONTENT_TYPE,
    BUNDLE_DIR, CONTENT_TYPE as REPORT_CONTENT_TYPE, DEFAULT_BUNDLES_KEPT, DEFAULT_BUNDLE_LOGS,
    DEFAULT_REDACT_RULES, KEY_FILE as NODE_KEY_FILE, SPOOL_DIR,
};
pub use request::{ResolveError, Resolved, StageRequest, Wanted, Writes};
pub use scrub::{ScrubSummary, SlotScrub};
#[cfg(feature = "fuzzing")]
pub use sqcheck::check as fuzz_squashfs_check;
pub use sqcheck::Superblock;
pub use stage::{
    ArtifactCost, NoProgress, Origin, PatchOutcome, Prefer, Progress, Release, StageOptions,
    StagePreview, StageReport, DEFAULT_RETRY_FOR,
};
pub use updater::{loader_for, SlotStatus, Status, Updater};
