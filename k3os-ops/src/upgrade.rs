//! `k3os-ops upgrade`: stage a release into the inactive slot, then (unless `--stage-only`)
//! activate it, and optionally reboot into it. The release comes from `--source` (a release
//! directory or URL) or from `--channel` (+ `--version`, default `latest`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use libupgrade::{Arch, Config, Source, StageOptions, Updater};

use crate::progress::{reporter, ProgressMode};

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

#[derive(Args, Debug)]
pub struct UpgradeArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Release directory or URL (holding manifest.json and manifest.json.sig).
    #[arg(long, conflicts_with = "channel", required_unless_present = "channel")]
    pub source: Option<String>,
    /// Update channel (http(s) base with index.json, a local directory, or github-releases://owner/repo).
    #[arg(long)]
    pub channel: Option<String>,
    /// Version to pick from the channel.
    #[arg(long, default_value = "latest", requires = "channel")]
    pub version: String,
    /// Only download, verify and write the inactive slot; do not activate it.
    #[arg(long, conflicts_with = "activate")]
    pub stage_only: bool,
    /// Activate the staged slot (the default; stated for scripts).
    #[arg(long)]
    pub activate: bool,
    /// Reboot into the new slot after activating.
    #[arg(long, conflicts_with = "stage_only")]
    pub reboot: bool,
    /// Accept a release older than the running one.
    #[arg(long)]
    pub allow_downgrade: bool,
    /// Use this trust directory instead of the configured one.
    #[arg(long)]
    pub trust_dir: Option<PathBuf>,
    /// No progress output (the same as `--progress none`).
    #[arg(long)]
    pub quiet: bool,
    /// How to show the download: a bar on a terminal, lines elsewhere (`auto`), or `bar`,
    /// `lines`, `none`.
    #[arg(long, value_enum, default_value = "auto")]
    pub progress: ProgressMode,
}

pub fn run(args: UpgradeArgs) -> anyhow::Result<()> {
    let u = args.config.updater()?;
    let source = match (&args.source, &args.channel) {
        (Some(s), _) => Source::parse(s),
        (None, Some(ch)) => {
            let r = libupgrade::channel::resolve(ch, Some(&args.version), Arch::host())
                .with_context(|| format!("resolving {} in channel {ch}", args.version))?;
            eprintln!(
                "channel {ch}: {} resolves to {} (generation {}) at {}",
                args.version, r.version, r.generation, r.location
            );
            r.source
        }
        (None, None) => bail!("give --source or --channel"),
    };
    let opts = StageOptions {
        allow_downgrade: args.allow_downgrade,
        trust_dir: args.trust_dir.clone(),
        retry_delay: Duration::from_secs(1),
    };
    let progress = reporter(if args.quiet {
        ProgressMode::None
    } else {
        args.progress
    });
    let r = u.stage(&source, &opts, progress.as_ref())?;
    if r.already_staged {
        println!(
            "slot {} already holds {} (generation {})",
            r.slot, r.version, r.generation
        );
    } else {
        println!(
            "staged {} (generation {}, signed by {}) into slot {}{}",
            r.version,
            r.generation,
            r.signed_by,
            r.slot,
            if r.resumed {
                ", resuming an interrupted download"
            } else {
                ""
            }
        );
    }
    if args.stage_only {
        return Ok(());
    }
    let slot = u.activate()?;
    println!(
        "activated slot {slot}: {} will try it on the next boot",
        u.bootloader().name()
    );
    if args.reboot {
        println!("rebooting");
        crate::slot::reboot()?;
    }
    Ok(())
}
