//! `k3os-ops upgrade`: stage a release into the inactive slot, then (unless `--stage-only`)
//! activate it, and optionally reboot into it. The release comes from `--source` (a release
//! directory or URL), from `--channel` (+ `--version`, default `latest`), or from an offline
//! `--bundle` file.
//!
//! On a thin link: `--plan-only` prints what a stage would fetch and reuse, per artifact and
//! in total, and writes nothing; `--max-bytes` stops an attempt cleanly at a byte budget (a
//! later run resumes); `--extra-source` (repeatable) names local directories and site mirrors
//! to take chunks from before the origin.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use libupgrade::error::Size;
use libupgrade::{Arch, ExtraSource, Source, StageOptions, StagePreview, StageReport};

use crate::node::ConfigArg;

use crate::progress::{reporter, ProgressMode};

#[derive(Args, Debug)]
pub struct UpgradeArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Release directory or URL (holding manifest.json and manifest.json.sig).
    #[arg(
        long,
        conflicts_with_all = ["channel", "bundle"],
        required_unless_present_any = ["channel", "bundle"]
    )]
    pub source: Option<String>,
    /// An offline bundle file (`k3os-ops release bundle`): no network, the same checks.
    #[arg(long, conflicts_with = "channel")]
    pub bundle: Option<PathBuf>,
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
    /// Print what the stage would fetch and reuse, per artifact and in total, and stop
    /// before writing anything.
    #[arg(long, conflicts_with_all = ["activate", "reboot"])]
    pub plan_only: bool,
    /// Fetch at most this many bytes in this run (`500M`, `2G`, or bytes), then stop cleanly;
    /// what was written is kept and a later run resumes (a daily quota on a metered link).
    #[arg(long, value_parser = parse_bytes)]
    pub max_bytes: Option<u64>,
    /// Take chunks from here before the origin (repeatable, tried in order after the running
    /// slot): a directory or mounted medium holding artifact files of any release, or a site
    /// mirror URL of this release. Every chunk is checked against the signed chunk index.
    #[arg(long = "extra-source", value_name = "DIR|URL")]
    pub extra_sources: Vec<String>,
}

/// `500M`, `2G`, `1.5GiB`, `100000` → bytes (K/M/G are powers of 1024).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
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
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok((v * mul as f64) as u64),
        _ => Err(format!("'{s}' is not a byte count like 500M, 2G or 1.5GiB")),
    }
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

pub fn run(args: UpgradeArgs) -> anyhow::Result<()> {
    let u = args.config.updater()?;
    let (source, expect_version) = resolve(&args)?;
    let opts = stage_options(&args, expect_version);
    if args.plan_only {
        print_preview(&u.preview(&source, &opts)?);
        return Ok(());
    }
    let progress = reporter(if args.quiet {
        ProgressMode::None
    } else {
        args.progress
    });
    print_report(&u.stage(&source, &opts, progress.as_ref())?);
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

/// The release to stage, and the version its signed manifest must name (a channel's entry).
fn resolve(args: &UpgradeArgs) -> anyhow::Result<(Source, Option<String>)> {
    if let Some(b) = &args.bundle {
        let b = libupgrade::bundle::Bundle::open(b)?;
        eprintln!(
            "bundle {}: release {} (generation {}), format {}",
            b.path.display(),
            b.header.version,
            b.header.generation,
            b.header.format
        );
        // The signed manifest must be the release the bundle's header names.
        let version = b.header.version.clone();
        return Ok((Source::Bundle(b), Some(version)));
    }
    match (&args.source, &args.channel) {
        (Some(s), _) => Ok((Source::parse(s), None)),
        (None, Some(ch)) => {
            let r = libupgrade::channel::resolve(ch, Some(&args.version), Arch::host())
                .with_context(|| format!("resolving {} in channel {ch}", args.version))?;
            eprintln!(
                "channel {ch}: {} resolves to {} (generation {}) at {}",
                args.version, r.version, r.generation, r.location
            );
            // The signed manifest must be the release the channel named.
            Ok((r.source, Some(r.version)))
        }
        (None, None) => bail!("give --source or --channel"),
    }
}

fn stage_options(args: &UpgradeArgs, expect_version: Option<String>) -> StageOptions {
    StageOptions {
        allow_downgrade: args.allow_downgrade,
        trust_dir: args.trust_dir.clone(),
        retry_delay: Duration::from_secs(1),
        max_rate: args.max_rate,
        expect_version,
        retry_for: args.retry_for.0,
        min_rate: (args.min_rate > 0).then_some(libupgrade::stage::MinRate {
            bytes_per_sec: args.min_rate,
            ..libupgrade::stage::MinRate::DEFAULT
        }),
        max_bytes: args.max_bytes,
        extra_sources: args
            .extra_sources
            .iter()
            .map(|s| ExtraSource::parse(s))
            .collect(),
    }
}

/// `--plan-only`: one line per artifact and a total, sizes for people with exact bytes.
fn print_preview(p: &StagePreview) {
    if p.already_staged {
        println!(
            "slot {} already holds {} (generation {}): nothing to fetch",
            p.slot, p.version, p.generation
        );
        return;
    }
    println!(
        "plan for {} (generation {}) into slot {}{}:",
        p.version,
        p.generation,
        p.slot,
        if p.resume {
            ", continuing an interrupted download"
        } else {
            ""
        }
    );
    for a in &p.artifacts {
        println!(
            "  {:7} fetch {:>10} ({} bytes), reuse {:>10} of {}",
            a.artifact.to_string(),
            Size(a.fetch).to_string(),
            a.fetch,
            Size(a.reuse).to_string(),
            Size(a.size)
        );
    }
    let total: u64 = p.artifacts.iter().map(|a| a.size).sum();
    println!(
        "  total   fetch {:>10} ({} bytes), reuse {:>10} of {}",
        Size(p.fetch()).to_string(),
        p.fetch(),
        Size(p.reuse()).to_string(),
        Size(total)
    );
}

fn print_report(r: &StageReport) {
    if r.already_staged {
        println!(
            "slot {} already holds {} (generation {})",
            r.slot, r.version, r.generation
        );
        return;
    }
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
        "  {} fetched ({} bytes), {} reused (running slot, extra sources or an earlier attempt)",
        Size(r.bytes_fetched),
        r.bytes_fetched,
        Size(r.bytes_reused)
    );
    if r.bytes_from_mirrors > 0 || r.chunks_refused > 0 {
        println!(
            "  {} of it from extra mirrors; {} chunk(s) refused for not matching the signed index",
            Size(r.bytes_from_mirrors),
            r.chunks_refused
        );
    }
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
    fn byte_counts() {
        use super::parse_bytes;
        assert_eq!(parse_bytes("500M"), Ok(500 << 20));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("100000"), Ok(100_000));
        assert!(parse_bytes("lots").unwrap_err().contains("'lots'"));
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
