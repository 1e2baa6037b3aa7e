//! What every node-side subcommand (`upgrade`, `slot …`, `bootloader install`) shares: the
//! node configuration argument, and rebooting the node.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use libupgrade::{Config, Updater};

/// Where the node configuration comes from (shared by `upgrade` and `slot`).
#[derive(Args, Debug, Clone)]
pub struct ConfigArg {
    /// Node configuration file.
    #[arg(long, env = "K3OS_OPS_CONFIG", default_value = libupgrade::config::DEFAULT_CONFIG, global = true)]
    pub config: PathBuf,
}

impl ConfigArg {
    pub fn updater(&self) -> anyhow::Result<Updater> {
        let cfg = Config::load(&self.config)?;
        Ok(Updater::open(cfg)?)
    }
}

/// Sync and reboot: the `reboot` command if there is one (a clean shutdown), else the syscall.
pub fn reboot() -> anyhow::Result<()> {
    nix::unistd::sync();
    let clean = std::process::Command::new("reboot").status();
    if matches!(clean, Ok(s) if s.success()) {
        return Ok(());
    }
    nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_AUTOBOOT).context("reboot(2)")?;
    Ok(())
}
