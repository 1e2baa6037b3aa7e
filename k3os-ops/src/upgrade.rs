//! `k3os-ops upgrade`: stage a release into the inactive slot, then (unless `--stage-only`)
//! activate it, and optionally reboot into it. The release comes from `--source` (a release
//! directory or URL) or from `--channel` (+ `--version`, default `latest`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use libupgrade::error::Size;
use libupgrade::{Arch, Source, StageOptions};

use crate::node::ConfigArg;

use crate::progress::{reporter, ProgressMode};

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
    /// Cap the download bandwidth, bytes per second with an optional binary suffix:
    /// `500K`, `2M`, `1.5MiB` (a site's thin link is shared with production traffic).
    #[arg(long, value_parser = parse_rate)]
    pub max_rate: Option<u64>,
    /// How long this attempt keeps retrying a failing server or link before it gives up
    /// (`90s`, `45m`, `6h`, `2d`, or `forever`); the final error says what failed last.
    #[arg(long, default_value = "6h", value_parser = parse_retry_for)]
    pub retry_for: RetryFor,
    /// Cut and retry a response slower than this many bytes per second over a minute (a
    /// server holding the node with a trickle); 0 turns the rule off.
    #[arg(long, default_value_t = libupgrade::stage::MinRate::DEFAULT.bytes_per_sec)]
    pub min_rate: u64,
    /// Accept the channel's signed metadata even when it has expired (a node whose clock is
    /// wrong, updated by an operator). Signatures, thresholds and versions are still checked.
    #[arg(long, requires = "channel")]
    pub ignore_expiry: bool,
}

/// `--retry-for`: a duration, or for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryFor(pub Option<Duration>);

/// `90s`, `45m`, `6h`, `2d`, a plain number of seconds, or `forever`.
pub fn parse_retry_for(s: &str) -> Result<RetryFor, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("forever") {
        return Ok(RetryFor(None));
    }
    let (num, unit) = match t.char_indices().last() {
        Some((i, 's')) => (&t[..i], 1),
        Some((i, 'm')) => (&t[..i], 60),
        Some((i, 'h')) => (&t[..i], 3600),
        Some((i, 'd')) => (&t[..i], 86400),
        _ => (t, 1),
    };
    match num.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(RetryFor(Some(Duration::from_secs(n * unit)))),
        _ => Err(format!(
            "'{s}' is not a duration like 90s, 45m, 6h or 2d (or `forever`)"
        )),
    }
}

/// `2M`, `512K`, `1.5MiB/s`, `100000` → bytes per second (K/M/G are powers of 1024).
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.eq_ignore_ascii_case(&'k') => (&t[..i], 1u64 << 10),
        Some((i, c)) if c.eq_ignore_ascii_case(&'m') => (&t[..i], 1 << 20),
        Some((i, c)) if c.eq_ignore_ascii_case(&'g') => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a rate like 500K, 2M or 1.5MiB (bytes per second)"))?;
    let rate = (v * mul as f64) as u64;
    if !(v.is_finite() && rate >= 1024) {
        return Err(format!(
            "'{s}': a rate below 1 KiB/s would never finish an image"
        ));
    }
    Ok(rate)
}

fn min_rate(args: &UpgradeArgs) -> Option<libupgrade::stage::MinRate> {
    (args.min_rate > 0).then_some(libupgrade::stage::MinRate {
        bytes_per_sec: args.min_rate,
        ..libupgrade::stage::MinRate::DEFAULT
    })
}

pub fn run(args: UpgradeArgs) -> anyhow::Result<()> {
    let u = args.config.updater()?;
    let mut expect_version = None;
    let mut expect_manifest = None;
    let source = match (&args.source, &args.channel) {
        (Some(s), _) => Source::parse(s),
        (None, Some(ch)) => {
            let mut trust = libupgrade::channel::TrustOptions::from_config(u.config());
            trust.min_rate = min_rate(&args);
            if args.ignore_expiry {
                trust.ignore_expiry = true;
                eprintln!(
                    "WARNING: --ignore-expiry: expired channel metadata is accepted; a frozen or replayed channel cannot be told from a fresh one"
                );
            }
            let r =
                libupgrade::channel::resolve_with(ch, Some(&args.version), Arch::host(), &trust)
                    .with_context(|| format!("resolving {} in channel {ch}", args.version))?;
            eprintln!(
                "channel {ch}: {} resolves to {} (generation {}) at {}{}",
                args.version,
                r.version,
                r.generation,
                r.location,
                if r.pin.is_some() {
                    " (signed channel metadata)"
                } else {
                    ""
                }
            );
            // The signed manifest must be the release the channel named.
            expect_version = Some(r.version.clone());
            expect_manifest = r.pin;
            r.source
        }
        (None, None) => bail!("give --source or --channel"),
    };
    let opts = StageOptions {
        allow_downgrade: args.allow_downgrade,
        trust_dir: args.trust_dir.clone(),
        retry_delay: Duration::from_secs(1),
        max_rate: args.max_rate,
        expect_version,
        expect_manifest,
        retry_for: args.retry_for.0,
        min_rate: min_rate(&args),
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
        println!(
            "  {} fetched, {} reused (running slot or an earlier attempt)",
            Size(r.bytes_fetched),
            Size(r.bytes_reused)
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
        crate::node::reboot()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_rate;

    #[test]
    fn retry_for_durations() {
        use super::{parse_retry_for, RetryFor};
        use std::time::Duration;
        assert_eq!(
            parse_retry_for("6h"),
            Ok(RetryFor(Some(Duration::from_secs(21600))))
        );
        assert_eq!(
            parse_retry_for("90s"),
            Ok(RetryFor(Some(Duration::from_secs(90))))
        );
        assert_eq!(parse_retry_for("forever"), Ok(RetryFor(None)));
        assert!(parse_retry_for("0").is_err() && parse_retry_for("soon").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("2M"), Ok(2 << 20));
        assert_eq!(parse_rate("512K"), Ok(512 << 10));
        assert_eq!(parse_rate("1.5MiB/s"), Ok(3 << 19));
        assert_eq!(parse_rate("100000"), Ok(100_000));
        assert_eq!(parse_rate("1g"), Ok(1 << 30));
        assert!(parse_rate("fast").unwrap_err().contains("'fast'"));
        assert!(parse_rate("10").is_err());
    }
}
