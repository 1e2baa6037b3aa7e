//! libupgrade: A/B slot updates for immutable squashfs nodes.
//!
//! A node has two slots, A and B, each a squashfs rootfs plus a kernel and an initrd. The
//! [`Updater`] stages a signed release into the slot that is not running, hands it to the
//! bootloader for a bounded number of tries, and on the next boot confirms its health or lets
//! the bootloader fall back. This crate knows nothing of Kubernetes; `k3os-ops` is a thin
//! binary on top of it.
//!
//! Modules: [`config`] (node configuration), [`manifest`] (what a release contains),
//! [`signing`] (ed25519 release signatures), [`channel`] (release indexes, `latest`),
//! [`release`] (creating releases), [`chunk`] (chunk indexes, delta and resumable transfer), [`fetch`] (reading releases from paths and URLs, resumable),
//! [`layout`] (where slot bytes live: GPT partitions or k3OS-style files), [`state`] (the
//! slot records and decision log), [`health`] (checks), [`updater`] (the state machine, a
//! thin executor), [`stage`] (the fetch/verify/write pipeline), [`checkpoint`] (resumable
//! downloads), [`assess`] (the pure boot-assessment core and its [`Verdict`]), [`confirm`]
//! (its executor, on every boot), [`barrier`] (write barriers for power-cut tests), [`http`] (the HTTP client),
//! [`retry`] (the one backoff policy of every transfer loop), [`slotfiles`] (the manifest and boot scripts kept per staged slot), [`bootscript`] (the
//! pure decision which boot script an activation leaves installed).

pub mod assess;
pub mod barrier;
pub mod bootscript;
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
pub mod release;
pub mod retry;
pub mod signing;
pub mod slotfiles;
pub mod sqcheck;
pub mod stage;
pub mod state;
pub mod updater;

/// Largest number of tries a slot can be given (GRUB counts down with an explicit if-chain).
pub const MAX_TRIES: u8 = 9;

pub use assess::{Outcome, Verdict};
pub use bootconfig::Slot;
pub use config::Config;
pub use error::{Error, Result};
pub use fetch::Source;
pub use manifest::{Arch, Artifact, Manifest};
pub use state::SlotState;
pub use updater::{
    ConfirmReport, NoProgress, Progress, StageOptions, StageReport, Status, Updater,
};
