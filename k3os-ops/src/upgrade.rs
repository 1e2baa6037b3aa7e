//! `k3os-ops upgrade`: stage a release into the inactive slot, then (unless `--stage-only`)
//! activate it, and optionally reboot into it. The release comes from `--source` (a release
//! directory or URL), from `--channel` (+ `--version`, default `latest`), or from an offline
//! `--bundle` file. `--converge` makes a re-run after the job's own reboot a no-op and refuses
//! a version that failed here ([`converge`], a pure decision). A release that failed on this
//! node is held back unless its rollout allows retries ([`libupgrade::rollout::decide_retry`]):
//! a plain `upgrade` then prints `nothing to stage: failed here: …` and exits 0, `--converge`
//! refuses it (exit 1).
//!
//! On a thin link: `--plan-only` prints what a stage would fetch and reuse, per artifact and
//! in total, and writes nothing; `--max-bytes` stops an attempt cleanly at a byte budget (a
//! later run resumes); `--extra-source` (repeatable) names local directories and site mirrors
//! to take chunks from before the origin; `--stage-until TIME` and `--stage-window
//! START/END[@RATE]` (repeatable, RFC 3339) say when it may download and how fast
//! ([`libupgrade::Schedule`]): outside them nothing is fetched, after the last one the
//! attempt stops. A stop at a budget or at the end of the schedule is not a failure: what was
//! written is kept, and the command exits 75 (`EX_TEMPFAIL`) so a cron-style caller retries. A
//! schedule that has already ended when the command starts is refused (exit 1): running it again
//! would never fetch anything.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use chrono::{DateTime, Utc};
use clap::Args;
use libupgrade::rollout::Retry;
use libupgrade::state::SlotState;
use libupgrade::units::Size;
use libupgrade::MinRate;
use libupgrade::SlotStatus;
use libupgrade::{
    units, ExtraSource, Origin, Slot, Source, StageOptions, StagePreview, StageReport,
    StageRequest, Wanted,
};
use libupgrade::{Schedule, Window};

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
    /// Make the node run the channel's `--version` (or the bundle's release), doing only what
    /// is left: nothing (exit 0)
    /// when the booted slot already runs it, blessed; a refusal when it failed on this node
    /// (the other slot holds it, marked bad). For jobs that run again after their own
    /// reboot, like the system-upgrade-controller Plan's (deploy/suc/plan.yaml).
    #[arg(long)]
    pub converge: bool,
    /// Accept a release older than the running one.
    #[arg(long)]
    pub allow_downgrade: bool,
    /// Take the `--version` named even while the channel's rollout holds it back from this
    /// node (its wave has not started or the rollout is paused). Without it such a version is
    /// refused, naming why. Never a withdrawn release: withdrawal is final, whatever the flags
    /// (`--allow-downgrade` included). `latest` always follows the rollout.
    #[arg(long, requires = "channel")]
    pub ignore_rollout: bool,
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
    /// When a listed patch fetches fewer bytes than chunks but its recompression may take
    /// longer: `auto` takes the way estimated to finish sooner at the rate `--max-rate` or
    /// `--stage-window` tells (the fewest bytes with no rate told, or with `--max-bytes`);
    /// `bytes` always the fewest bytes; `time` the sooner way, also at a rate measured on the
    /// chunk indexes and under `--max-bytes`. `--plan-only` says which and why.
    #[arg(long, value_enum, default_value = "auto")]
    pub prefer: PreferArg,
    /// How long this attempt keeps retrying a failing server or link before it gives up
    /// (`90s`, `45m`, `6h`, `2d`, or `forever`); the final error says what failed last.
    #[arg(long, default_value = "6h", value_parser = parse_retry_for)]
    pub retry_for: RetryFor,
    /// Cut and retry a response slower than this many bytes per second over a minute (a
    /// server holding the node with a trickle); 0 turns the rule off.
    #[arg(long, default_value_t = libupgrade::MinRate::DEFAULT.bytes_per_sec)]
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
    /// Accept the channel's signed metadata even when it has expired (a node whose clock is
    /// wrong, updated by an operator). Signatures, thresholds and versions are still checked.
    #[arg(long, requires = "channel")]
    pub ignore_expiry: bool,
    /// Download only until this time (RFC 3339, e.g. `2026-12-04T06:00:00Z`), then stop
    /// cleanly (exit 75); what was written is kept and a later run resumes. A time already
    /// past is refused (exit 1): nothing could be fetched.
    #[arg(long, value_parser = parse_time, conflicts_with = "stage_windows")]
    pub stage_until: Option<DateTime<Utc>>,
    /// Download only inside this window (repeatable): `START/END` or `START/END@RATE`, times in
    /// RFC 3339, RATE as for --max-rate. Nothing is fetched between windows (the command
    /// waits); after the last one it stops cleanly (exit 75). Windows that have all ended are
    /// refused (exit 1).
    #[arg(long = "stage-window", value_name = "START/END[@RATE]", value_parser = parse_window)]
    pub stage_windows: Vec<Window>,
}

/// An RFC 3339 time, e.g. `2026-12-04T06:00:00Z` or `2026-12-04T07:00:00+01:00`.
pub fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("'{s}' is not an RFC 3339 time like 2026-12-04T06:00:00Z: {e}"))
}

/// `START/END` or `START/END@RATE` → a schedule window.
pub fn parse_window(s: &str) -> Result<Window, String> {
    let (span, rate) = match s.rsplit_once('@') {
        Some((span, rate)) => (span, Some(parse_rate(rate)?)),
        None => (s, None),
    };
    let Some((a, b)) = span.split_once('/') else {
        return Err(format!(
            "'{s}' is not a window START/END[@RATE] like 2026-12-04T01:00:00Z/2026-12-04T05:00:00Z@2M"
        ));
    };
    let (start, end) = (parse_time(a)?, parse_time(b)?);
    if end <= start {
        return Err(format!("'{s}': the window ends before it starts"));
    }
    Ok(Window { start, end, rate })
}

/// `500M`, `2G`, `1.5GiB`, `100000` → bytes ([`libupgrade::units::parse_bytes`]).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    units::parse_bytes(s).map_err(|e| e.to_string())
}

/// `--retry-for`: a duration, or for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryFor(pub Option<Duration>);

/// `90s`, `45m`, `6h`, `2d`, `1h30m`, a plain number of seconds, or `forever`.
pub fn parse_retry_for(s: &str) -> Result<RetryFor, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("forever") {
        return Ok(RetryFor(None));
    }
    let d = match t.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => units::parse_duration(t).map_err(|e| format!("{e} (or `forever`)"))?,
    };
    if d.is_zero() {
        return Err(format!(
            "'{}' is not a duration like 90s, 45m, 6h or 2d (or `forever`): zero",
            s.escape_debug()
        ));
    }
    Ok(RetryFor(Some(d)))
}

/// `2M`, `512K`, `1.5MiB/s`, `100000` → bytes per second ([`libupgrade::units::parse_rate`]).
pub fn parse_rate(s: &str) -> Result<u64, String> {
    units::parse_rate(s).map_err(|e| e.to_string())
}

pub fn run(args: UpgradeArgs) -> anyhow::Result<()> {
    let u = args.config.updater()?;
    // Reports of what this run reached go out at its end, before a reboot, whatever the
    // outcome; they never change it.
    let ran = stage_and_activate(&u, &args);
    crate::node::send_reports(&u);
    match &ran {
        // Never ahead of a reboot into the new release: the good slot sends them later.
        Ok(Ran { reboot: true, .. }) => {}
        r => {
            let fetched = r.as_ref().map_or(0, |r| r.fetched);
            let schedule = schedule(&args, Utc::now()).ok().flatten();
            let allow = crate::node::bundle_allowance(
                schedule.as_ref(),
                args.max_bytes,
                fetched,
                Utc::now(),
            );
            crate::node::send_bundles(&u, allow);
        }
    }
    if ran?.reboot {
        println!("rebooting");
        crate::node::reboot()?;
    }
    Ok(())
}

/// What `upgrade` did up to the reboot.
struct Ran {
    /// Reboot now.
    reboot: bool,
    /// Bytes the stage fetched of `--max-bytes`.
    fetched: u64,
}

impl Ran {
    const NOTHING: Ran = Ran {
        reboot: false,
        fetched: 0,
    };
}

/// `upgrade` up to the reboot.
fn stage_and_activate(u: &libupgrade::Updater, args: &UpgradeArgs) -> anyhow::Result<Ran> {
    let req = request(args, Utc::now())?;
    let libupgrade::Resolved {
        release: rel,
        retry,
    } = match u.resolve_with_retry(&req) {
        Err(e) => match e.channel_error() {
            Some(c @ libupgrade::channel::ChannelError::NothingOffered { .. }) => {
                println!("nothing to stage: {c}");
                return Ok(Ran::NOTHING);
            }
            _ => return Err(e.into()),
        },
        Ok(r) => r,
    };
    if !matches!(rel.origin, Origin::Source) {
        eprintln!("{rel}");
    }
    if args.converge && converged(u, &rel)? {
        return Ok(Ran::NOTHING);
    }
    if let Some(note) = nothing_newer(&rel) {
        println!("nothing to stage: {note}");
        return Ok(Ran::NOTHING);
    }
    // The one retry decision the resolution took (and reported); an unreadable state file
    // fails here, naming it.
    if let Retry::Wait { why, .. } = retry? {
        if args.converge {
            bail!("{why}");
        }
        println!("nothing to stage: {why}");
        return Ok(Ran::NOTHING);
    }
    if args.plan_only {
        print_preview(&u.preview(&rel, &req.options)?);
        return Ok(Ran::NOTHING);
    }
    let progress = reporter(if args.quiet {
        ProgressMode::None
    } else {
        args.progress
    });
    let staged = u.stage(&rel, &req.options, progress.as_ref())?;
    print_report(&staged);
    let fetched = staged.bytes_fetched;
    if args.stage_only {
        return Ok(Ran {
            reboot: false,
            fetched,
        });
    }
    let slot = u.activate()?;
    println!(
        "activated slot {slot}: {} will try it on the next boot",
        u.bootloader().name()
    );
    Ok(Ran {
        reboot: args.reboot,
        fetched,
    })
}

/// When the channel's rollouts offer this node nothing newer than what it runs, what they say
/// (which release waits and when this node's wave starts): `upgrade` then stages nothing.
fn nothing_newer(rel: &libupgrade::Release) -> Option<&libupgrade::channel::RolloutNote> {
    match &rel.origin {
        Origin::Channel {
            rollout: Some(note),
            ..
        } if note.nothing_newer => Some(note),
        _ => None,
    }
}

/// The one staging request `upgrade`'s flags describe: the release wanted (a bundle, a
/// location, or a channel's version) and how to stage it.
fn request(args: &UpgradeArgs, now: DateTime<Utc>) -> anyhow::Result<StageRequest> {
    let wanted = match (&args.bundle, &args.source, &args.channel) {
        (Some(b), _, _) => Wanted::Bundle(b.clone()),
        (None, Some(s), _) => Wanted::Source(Source::parse(s)),
        (None, None, Some(ch)) => Wanted::Channel {
            channel: ch.clone(),
            version: Some(args.version.clone()),
        },
        (None, None, None) => bail!("give --source or --channel"),
    };
    if args.ignore_expiry {
        eprintln!(
            "WARNING: --ignore-expiry: expired channel metadata is accepted; a frozen or replayed channel cannot be told from a fresh one"
        );
    }
    let min_rate = (args.min_rate > 0).then_some(MinRate {
        bytes_per_sec: args.min_rate,
        ..MinRate::DEFAULT
    });
    Ok(StageRequest {
        wanted,
        bundle_dir: None,
        ignore_expiry: args.ignore_expiry,
        writes: match args.plan_only {
            true => libupgrade::Writes::Nothing,
            false => libupgrade::Writes::All,
        },
        for_cluster: false,
        seed: None,
        ignore_rollout: args.ignore_rollout,
        options: StageOptions {
            allow_downgrade: args.allow_downgrade,
            trust_dir: args.trust_dir.clone(),
            retry_delay: Duration::from_secs(1),
            max_rate: args.max_rate,
            retry_for: args.retry_for.0,
            min_rate,
            max_bytes: args.max_bytes,
            extra_sources: args
                .extra_sources
                .iter()
                .map(|s| ExtraSource::parse(s))
                .collect(),
            schedule: schedule(args, now)?,
            prefer: args.prefer.into(),
            ..StageOptions::default()
        },
    })
}

/// The download schedule `--stage-until` / `--stage-window` give (None: any time). A schedule
/// wholly in the past is refused: it could only stop at once.
fn schedule(args: &UpgradeArgs, now: DateTime<Utc>) -> anyhow::Result<Option<Schedule>> {
    let s = match (args.stage_until, args.stage_windows.is_empty()) {
        (Some(t), _) => Schedule::until(now, t, None),
        (None, false) => Schedule::new(args.stage_windows.clone())?,
        (None, true) => return Ok(None),
    };
    let end = s.windows().last().expect("a schedule has a window").end;
    if end <= now {
        bail!(
            "--stage-until/--stage-window: the download schedule ended at {}, before now ({})",
            end.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
    }
    Ok(Some(s))
}

/// `--prefer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PreferArg {
    /// The sooner way at a told rate, unless `--max-bytes` is set.
    Auto,
    /// The fewest bytes.
    Bytes,
    /// The sooner way, at a told or measured rate.
    Time,
}

impl From<PreferArg> for libupgrade::Prefer {
    fn from(p: PreferArg) -> Self {
        match p {
            PreferArg::Auto => libupgrade::Prefer::Auto,
            PreferArg::Bytes => libupgrade::Prefer::Bytes,
            PreferArg::Time => libupgrade::Prefer::Time,
        }
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
            "  {:7} fetch {:>10} ({} bytes), reuse {:>10} of {}{}",
            a.artifact.to_string(),
            Size(a.fetch).to_string(),
            a.fetch,
            Size(a.reuse).to_string(),
            Size(a.size),
            match &a.patch_from {
                Some(v) => format!(", by patch from {}", v.escape_debug()),
                None => String::new(),
            }
        );
        if let Some(why) = &a.choice {
            println!("          ({})", why.escape_debug());
        }
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
    for p in &r.patched {
        println!("  {p}");
    }
}

/// `--converge`: true when the node already runs the version (said so; nothing to do), an
/// error when it must not be tried again, false when the upgrade proceeds.
fn converged(u: &libupgrade::Updater, rel: &libupgrade::Release) -> anyhow::Result<bool> {
    let Some(version) = rel.version.as_deref() else {
        bail!("--converge needs --channel or --bundle: the version to converge to");
    };
    let status = u.status()?;
    let recorded = libupgrade::state::failure_of(&status.failed, version, rel.generation).is_some();
    match converge(&status.slots, version, recorded) {
        Converge::Proceed => Ok(false),
        Converge::AlreadyRunning(slot) => {
            println!("slot {slot} already runs {version} (good): nothing to do");
            Ok(true)
        }
        Converge::Refuse(why) => bail!("{why}"),
    }
}

/// What `upgrade --converge` does, decided before anything is fetched or written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Converge {
    /// Stage (and, unless `--stage-only`, activate) as usual; staging the release the
    /// other slot already holds is a no-op.
    Proceed,
    /// The booted slot runs the version and is good: the job is done.
    AlreadyRunning(Slot),
    /// Doing it again would not help (the reason, for the error line).
    Refuse(String),
}

/// Decide [`Converge`] from the node's slots and the version asked for: the booted slot
/// running it (good: done; not blessed yet: refuse until `slot confirm` decides), or the
/// other slot holding it marked bad (refuse, naming why), else proceed. A version the node
/// `recorded` as failed here is left to [`libupgrade::rollout::decide_retry`] (which the
/// caller asks next), so the rollout's retries apply to `--converge` too; the bad-slot
/// refusal then only covers a slot marked bad by hand.
pub fn converge(slots: &[SlotStatus], version: &str, recorded: bool) -> Converge {
    let runs = |s: &&SlotStatus| s.version.as_deref() == Some(version);
    if let Some(b) = slots.iter().filter(|s| s.booted).find(runs) {
        return if b.state == SlotState::Good {
            Converge::AlreadyRunning(b.slot)
        } else {
            Converge::Refuse(format!(
                "slot {} runs {version} but is {}, not blessed yet: `k3os-ops slot confirm` decides it first",
                b.slot, b.state
            ))
        };
    }
    if let Some(o) = slots
        .iter()
        .filter(|s| !s.booted && s.state == SlotState::Bad && !recorded)
        .find(runs)
    {
        let why = o
            .last_decision
            .as_ref()
            .map_or("no reason recorded".to_string(), |d| d.why.clone());
        return Converge::Refuse(format!(
            "{version} failed on this node (slot {} is bad: {why}); not trying it again: release a fixed version",
            o.slot
        ));
    }
    Converge::Proceed
}

#[cfg(test)]
mod tests {
    use super::parse_rate;
    use libupgrade::state::SlotState;
    use libupgrade::Slot;
    use libupgrade::SlotStatus;

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

    fn slot(slot: Slot, state: SlotState, version: &str, booted: bool) -> SlotStatus {
        SlotStatus {
            slot,
            state,
            version: Some(version.into()),
            generation: None,
            boot: bootconfig::SlotBoot::Good,
            tries_left: None,
            booted,
            next_boot: booted,
            primary: booted,
            last_decision: None,
            transfer: None,
            payloads: Vec::new(),
        }
    }

    /// A re-run after the job's own reboot is a no-op, a version that failed here is not
    /// tried again, anything else proceeds (staging what the other slot holds is a no-op).
    #[test]
    fn converge_decides_from_the_slots() {
        use super::{converge, Converge};
        let a1 = slot(Slot::A, SlotState::Good, "v1", true);
        let b2 = |state| slot(Slot::B, state, "v2", false);
        assert_eq!(
            converge(&[a1.clone(), b2(SlotState::Empty)], "v2", false),
            Converge::Proceed
        );
        assert_eq!(
            converge(&[a1.clone(), b2(SlotState::Staged)], "v2", false),
            Converge::Proceed
        );
        assert_eq!(
            converge(&[a1.clone(), b2(SlotState::Trying)], "v2", false),
            Converge::Proceed
        );
        let mut bad = b2(SlotState::Bad);
        bad.last_decision = Some(libupgrade::state::Decision {
            at: 0,
            slot: Slot::B,
            event: libupgrade::state::Event::HealthFailed,
            version: Some("v2".into()),
            generation: Some(2),
            why: "50-app: app is down".into(),
        });
        assert_eq!(
            converge(&[a1.clone(), bad.clone()], "v2", true),
            Converge::Proceed,
            "a recorded failure is the retry decision's"
        );
        match converge(&[a1.clone(), bad], "v2", false) {
            Converge::Refuse(why) => assert!(
                why.contains("v2 failed on this node") && why.contains("50-app: app is down"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
        // A bad slot holding another version does not stop this one.
        let bad3 = slot(Slot::B, SlotState::Bad, "v3", false);
        assert_eq!(
            converge(&[a1.clone(), bad3], "v2", false),
            Converge::Proceed
        );
        // Booted on v2: done once blessed, held back while it is still on trial.
        let a1_fallback = slot(Slot::A, SlotState::Good, "v1", false);
        let b2_booted = |state| slot(Slot::B, state, "v2", true);
        assert_eq!(
            converge(
                &[a1_fallback.clone(), b2_booted(SlotState::Good)],
                "v2",
                false
            ),
            Converge::AlreadyRunning(Slot::B)
        );
        match converge(&[a1_fallback, b2_booted(SlotState::Trying)], "v2", false) {
            Converge::Refuse(why) => assert!(why.contains("not blessed yet"), "{why}"),
            other => panic!("{other:?}"),
        }
        // Running v1 and asked for v1: nothing to do.
        assert_eq!(
            converge(&[a1, b2(SlotState::Empty)], "v1", false),
            Converge::AlreadyRunning(Slot::A)
        );
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
