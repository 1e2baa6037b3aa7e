//! The node side, over libupgrade: what the agent asks of this host ([`ops`]: status, stage,
//! activate, confirm, reboot) and what it reports ([`status`]), the daily-quota ledger and
//! preview record kept on the node ([`ledger`]), and the stage progress written as an
//! annotation ([`stage_progress`]).

pub mod ledger;
pub mod ops;
pub mod stage_progress;
pub mod status;
