//! The node side, over libupgrade: what the agent asks of this host ([`ops`]: status, resolve,
//! preview, stage, activate, confirm, reboot; [`node`] on the real node) and what it reports
//! ([`status`]), the looking-only resolutions ([`requests`]: what they found is
//! `channel::latest` and `channel::pinned`), and the stage progress written as
//! an annotation ([`stage_progress`]); the scheduled dm-verity scrub ([`scrub`]). The daily-quota ledger and preview record kept on the
//! node are libupgrade's ([`libupgrade::state::ledger`]).

pub mod node;
pub mod ops;
pub mod requests;
pub mod scrub;
pub mod stage_progress;
pub mod status;
