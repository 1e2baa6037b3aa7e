//! libupgrade: A/B slot updates for immutable squashfs nodes.
//!
//! A node has two slots, A and B, each a squashfs rootfs plus a kernel and an initrd. The
//! [`Updater`] stages a signed release into the slot that is not running, hands it to the
//! bootloader for a bounded number of tries, and on the next boot confirms its health or lets
//! the bootloader fall back. This crate knows nothing of Kubernetes; `k3os-ops` is a thin
//! binary on top of it.
//!
//! # Architecture
//! One way through, per flow; decisions are pure functions, effects happen at the edges:
//!
//! - **Stage** ([`Updater::stage`] → [`stage`]): [`fetch`] reads the release ([`manifest`],
//!   checked with [`signing`]; [`channel`] resolves which one) → `stage::verify` (signature,
//!   manifest, arch, generation, space, then every file on the server) → `stage::plan` (pure:
//!   per artifact done / chunked / stream) → the executors ([`chunk`] deltas, streamed
//!   downloads with [`checkpoint`]s, all under [`retry`]) writing through [`layout`] → commit
//!   ([`state`], [`slotfiles`]). `stage::plan` also prices the run before its first byte
//!   ([`Updater::preview`]); chunks come from the target, the running slot, extra sources,
//!   then the origin; a release may also come from an offline [`bundle`].
//! - **Activate** ([`Updater::activate_awaiting`]): [`bootscript::decide`] (pure: which boot
//!   script both slots read) → loader writes (`bootconfig`) → [`state`].
//! - **Confirm** (every boot, [`confirm`]): [`health`] checks → [`assess`] (pure: state,
//!   loader view, boot, checks → new state, loader operations, [`Verdict`]) → its effects.
//! - **Publish** ([`release`]): create and sign a release, rebuild a channel's index;
//!   [`trust::publish`] signs the channel's metadata (root, targets, snapshot, timestamp).
//! - **Discover** ([`channel::resolve_with`]): [`trust::client`] walks the channel's signed
//!   metadata (when the node has a root) and pins the manifest the stager must find.
//!
//! Below them: [`config`] (the node configuration), [`error`], [`http`] (the one HTTP client),
//! [`barrier`] (named write barriers for power-cut tests), [`sqcheck`] (the squashfs check).
//! Every format a node stores or reads (state file, manifest, chunk index, channel index, the
//! loader's files) carries a version, reads every earlier one and refuses a newer one by
//! name: see each module's docs and CHANGELOG.md.

pub mod assess;
pub mod barrier;
pub mod bootscript;
pub mod bundle;
pub mod channel;
pub mod checkpoint;
pub mod chunk;
pub mod config;
pub mod confirm;
pub mod error;
pub mod fetch;
pub mod health;
pub mod http;
pub mod layout;
pub mod manifest;
pub mod reach;
pub mod release;
pub mod request;
pub mod retry;
pub mod rollout;
pub mod signing;
pub mod slotfiles;
pub mod sqcheck;
pub mod stage;
pub mod state;
pub mod trust;
pub mod units;
pub mod updater;

/// Largest number of tries a slot can be given (GRUB counts down with an explicit if-chain).
pub const MAX_TRIES: u8 = 9;

pub use assess::{Outcome, Verdict};
pub use bootconfig::Slot;
pub use config::Config;
pub use error::{Error, Result};
pub use fetch::{ExtraSource, Source};
pub use manifest::{Arch, Artifact, Manifest};
pub use request::{Origin, Release, ResolveError, StageRequest, Wanted};
pub use state::SlotState;
pub use updater::{
    ConfirmReport, NoProgress, Progress, StageOptions, StagePreview, StageReport, Status, Updater,
};
