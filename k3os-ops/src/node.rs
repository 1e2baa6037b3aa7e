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

/// Environment variable naming the reboot command (whitespace-separated argv), e.g.
/// `nsenter -t 1 -m -u -i -n -p -- reboot` in a container; the agent reads the same one.
pub const REBOOT_CMD_ENV: &str = "K3OS_OPS_REBOOT_CMD";

/// Sync and reboot: the command `K3OS_OPS_REBOOT_CMD` names (it must succeed), else the
/// `reboot` command if there is one (a clean shutdown), else the syscall.
pub fn reboot() -> anyhow::Result<()> {
    nix::unistd::sync();
    if let Some(cmd) = std::env::var(REBOOT_CMD_ENV)
        .ok()
        .filter(|c| !c.trim().is_empty())
    {
        let argv: Vec<&str> = cmd.split_whitespace().collect();
        let st = std::process::Command::new(argv[0])
            .args(&argv[1..])
            .status()
            .with_context(|| format!("run {REBOOT_CMD_ENV}={cmd}"))?;
        anyhow::ensure!(st.success(), "{REBOOT_CMD_ENV}={cmd} failed ({st})");
        return Ok(());
    }
    let clean = std::process::Command::new("reboot").status();
    if matches!(clean, Ok(s) if s.success()) {
        return Ok(());
    }
    nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_AUTOBOOT).context("reboot(2)")?;
    Ok(())
}
