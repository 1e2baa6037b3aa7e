//! The node side, over libupgrade: what the agent asks of this host ([`ops`]: status, resolve,
//! preview, stage, activate, confirm, reboot; [`node`] on the real node) and what it reports
//! ([`status`]), the looking-only resolutions ([`requests`]) and what a resolution of `latest`
//! found ([`latest`]) and of a pinned version ([`pinned`]), and the stage progress written as
//! an annotation ([`stage_progress`]); the scheduled dm-verity scrub ([`scrub`]). The daily-quota ledger and preview record kept on the
//! node are libupgrade's ([`libupgrade::state::ledger`]).

pub mod latest;
pub mod node;
pub mod ops;
pub mod pinned;
pub mod requests;
pub mod scrub;
pub mod stage_progress;
pub mod status;
