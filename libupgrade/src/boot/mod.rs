//! What happens at and around a boot: the health checks ([`health`], [`reach`]), the pure
//! boot assessment (`assess`: state, loader view, observed boot, check results → new state,
//! loader operations, verdict), its effects in order (`confirm`), what a verdict that is not a
//! good slot means to a front end (`outcome`), which boot script both
//! slots read before an activation (`bootscript`), and the booted dm-verity root hash against
//! the staged manifest's (`verity_check`), and the initramfs's record of a dm-verity failure
//! (`verity_failure`). Private: the crate root re-exports the API.

pub(crate) mod assess;
pub(crate) mod bootscript;
pub(crate) mod confirm;
pub mod health;
pub(crate) mod outcome;
pub(crate) mod payloads;
pub mod reach;
pub(crate) mod verity_check;
pub(crate) mod verity_failure;
