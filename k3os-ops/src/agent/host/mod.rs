//! The node side, over libupgrade: what the agent asks of this host ([`ops`]: status, stage,
//! activate, confirm, reboot) and what it reports ([`status`]), what a resolution of
//! `latest` found ([`latest`]) and of a pinned version ([`pinned`]), the daily-quota ledger and
//! preview record kept on the node ([`ledger`]), and the stage progress written as an
//! annotation ([`stage_progress`]).

pub mod latest;
pub mod ledger;
pub mod ops;
pub mod pinned;
pub mod stage_progress;
pub mod status;
