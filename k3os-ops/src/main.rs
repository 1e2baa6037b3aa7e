//! `k3os-ops`: the thin binary around `libupgrade`.
//!
//! Subcommands: `upgrade` (one-shot), `slot …` (manual status/activate/confirm/rollback),
//! `release …` (create, sign and serve releases), `bootloader …` (install loader files),
//! `agent` (the Kubernetes controller), `collector serve` (the fleet's reports).
//! Each subcommand lives in its own module of the `k3os_ops` library; this file only parses
//! arguments and dispatches.

#[cfg(feature = "fleet")]
use k3os_ops::collector;
use k3os_ops::{agent, bootloader, logging, release, report, slot, upgrade};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "k3os-ops",
    version,
    about = "A/B image updates for k3OS-style nodes"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create, sign, index, verify and serve releases and channels.
    Release(release::ReleaseArgs),
    /// Run the Kubernetes UpdateChannel agent on this node (DaemonSet).
    Agent(agent::AgentArgs),
    /// Stage a release into the inactive slot, activate it, optionally reboot.
    Upgrade(upgrade::UpgradeArgs),
    /// Show and steer the A/B slots (status, activate, confirm, rollback, mark-bad).
    Slot(slot::SlotArgs),
    /// Write a node's loader files (image builders, adopting a machine) and render boot scripts.
    Bootloader(bootloader::BootloaderArgs),
    /// Receive, verify and store the fleet's reports (`collector serve`).
    #[cfg(feature = "fleet")]
    Collector(collector::CollectorArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.cmd, Cmd::Agent(_)) {
        logging::init();
    }
    let result = match cli.cmd {
        Cmd::Release(args) => release::run(args),
        Cmd::Agent(args) => agent::run(args),
        Cmd::Upgrade(args) => upgrade::run(args),
        Cmd::Slot(args) => slot::run(args),
        Cmd::Bootloader(args) => bootloader::run(args),
        #[cfg(feature = "fleet")]
        Cmd::Collector(args) => collector::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", report::render(&e));
            std::process::ExitCode::from(report::exit_code(&e))
        }
    }
}
