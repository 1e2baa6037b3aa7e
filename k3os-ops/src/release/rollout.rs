//! `k3os-ops release rollout|pause|resume|withdraw`: a release's rollout in the
//! channel's signed targets (see `libupgrade::rollout`). Each change re-signs targets, then
//! snapshot and timestamp, in one step, so nodes see it at their next poll; each reads the
//! channel only after its served metadata verified (a tampered file is refused, nothing
//! written). Parsing the
//! `--waves` grammar and the preview are pure functions; the rest maps arguments.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use clap::Args;
use libupgrade::rollout::{Floor, Retries, Rollout, Wave, WHOLE_FLEET_BP};
use libupgrade::trust::meta::{time_str, Targets};
use libupgrade::trust::{meta::Role, publish};
use libupgrade::units;

use crate::upgrade::parse_time;

use super::resign::published;
pub use super::resign::SignArgs;

/// `release rollout`.
#[derive(Args, Debug)]
pub struct RolloutArgs {
    /// The channel directory (with targets.json from `release targets`).
    dir: PathBuf,
    /// The release whose rollout is set.
    version: String,
    /// The schedule: `SHARE@WHEN,…`, SHARE a percentage of the fleet (`1%`, `0.5%`, `100%`),
    /// WHEN an RFC 3339 time or `+DURATION` after --start (`+0`, `+24h`, `+3d`). Shares and
    /// times must grow, the last share must be 100%. Between two points the share grows
    /// linearly. E.g. `1%@+0,10%@+1d,50%@+2d,100%@+3d`.
    #[arg(long, value_name = "SHARE@WHEN,...")]
    waves: String,
    /// The time `+DURATION` counts from (RFC 3339; default now).
    #[arg(long, value_parser = parse_time)]
    start: Option<DateTime<Utc>>,
    /// A required stop: nodes running an older generation than this release are offered it
    /// first (give its version; its generation is read from the targets).
    #[arg(long, value_name = "VERSION")]
    from_at_least: Option<String>,
    /// Attempts a node on which the release failed (rolled back, fell back) makes after that
    /// failure; without it (0) such a node waits for a newer release.
    #[arg(long, value_name = "N")]
    retries: Option<u32>,
    /// With --retries: the wait after the first failure (`90s`, `45m`, `1h`, `2d`); it doubles
    /// after each further one.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_backoff)]
    retry_backoff: u64,
    #[command(flatten)]
    sign: SignArgs,
}

/// `--retry-backoff`: a duration of at least a second, in seconds.
fn parse_backoff(s: &str) -> Result<u64, String> {
    let d = units::parse_duration(s.trim()).map_err(|e| e.to_string())?;
    if d.as_secs() == 0 {
        return Err(format!(
            "'{}': the backoff must be at least 1s",
            s.escape_debug()
        ));
    }
    Ok(d.as_secs())
}

/// `release pause|resume|withdraw`.
#[derive(Args, Debug)]
pub struct ChangeArgs {
    /// The channel directory.
    dir: PathBuf,
    /// The release whose rollout changes.
    version: String,
    /// When the change takes effect (RFC 3339; default now).
    #[arg(long, value_parser = parse_time)]
    at: Option<DateTime<Utc>>,
    #[command(flatten)]
    sign: SignArgs,
}

/// `release rollout-status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The channel directory (its targets.json as published).
    pub(super) dir: PathBuf,
    /// The time to show (RFC 3339; default now).
    #[arg(long, value_parser = parse_time)]
    pub(super) at: Option<DateTime<Utc>>,
    /// The collector's database (`sqlite:PATH` or a `postgres://` URL): show beside each
    /// release what the sites reported, per wave.
    #[arg(long)]
    pub(super) reports: Option<String>,
    /// With --reports: a node not done with a release and silent this many hours counts as
    /// silent.
    #[arg(long, default_value_t = 24)]
    pub(super) silent_hours: u32,
    /// Print JSON: the planned shares and, with --reports, the reported states.
    #[arg(long)]
    pub(super) json: bool,
    #[command(flatten)]
    pub(super) abort: AbortArgs,
}

/// The abort criteria of `rollout-status --abort-if`.
#[derive(Args, Debug)]
pub struct AbortArgs {
    /// With --reports: judge each release; it should be halted when at least this percent of
    /// the nodes that ran it failed (`--abort-on`).
    #[arg(long, value_name = "PERCENT")]
    pub abort_if: Option<f64>,
    /// Nodes that must have run a release (any state but waiting) before it is judged.
    #[arg(long, default_value_t = 10)]
    pub abort_min: u64,
    /// The states that count as failures (comma-separated).
    #[arg(long, default_value = "stage_failed,rolled_back,fell_back")]
    pub abort_on: String,
    /// Judge only this wave's nodes (from 1).
    #[arg(long)]
    pub abort_wave: Option<usize>,
}

/// What a change does to a rollout.
#[derive(Debug, Clone, Copy)]
pub enum Change {
    /// `release pause`.
    Pause,
    /// `release resume`.
    Resume,
    /// `release withdraw`.
    Withdraw,
}

/// `1%`, `0.25%`, `100%` → basis points (at most two decimals).
pub fn parse_share(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let num = t
        .strip_suffix('%')
        .ok_or_else(|| format!("share '{}' must end in % (e.g. 10%)", t.escape_debug()))?;
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    if frac.len() > 2
        || whole.is_empty()
        || !(whole.chars().chain(frac.chars())).all(|c| c.is_ascii_digit())
    {
        return Err(format!(
            "share '{}' is not a percentage with at most two decimals (e.g. 0.5%)",
            t.escape_debug()
        ));
    }
    let bp = whole
        .parse::<u32>()
        .ok()
        .and_then(|w| w.checked_mul(100))
        .and_then(|w| w.checked_add(format!("{frac:0<2}").parse::<u32>().ok()?));
    match bp {
        Some(bp) if bp <= WHOLE_FLEET_BP => Ok(bp),
        _ => Err(format!("share '{}' is more than 100%", t.escape_debug())),
    }
}

/// The `--waves` list: `SHARE@WHEN,…` with WHEN absolute or `+DURATION` after `start`.
pub fn parse_waves(s: &str, start: DateTime<Utc>) -> Result<Vec<Wave>, String> {
    s.split(',')
        .map(|item| {
            let (share, when) = item.trim().split_once('@').ok_or_else(|| {
                format!(
                    "wave '{}' is not SHARE@WHEN (e.g. 10%@+24h)",
                    item.escape_debug()
                )
            })?;
            let start = match when.trim().strip_prefix('+') {
                Some("0") => start,
                Some(d) => {
                    let d = units::parse_duration(d).map_err(|e| e.to_string())?;
                    let d = chrono::Duration::from_std(d).map_err(|e| e.to_string())?;
                    start + d
                }
                None => parse_time(when)?,
            };
            Ok(Wave {
                share_bp: parse_share(share)?,
                start,
            })
        })
        .collect()
}

/// Re-sign targets with `edit` applied to `version`'s rollout, then snapshot and timestamp.
fn sign(
    dir: &Path,
    version: &str,
    a: &SignArgs,
    edit: &dyn Fn(Option<&Rollout>) -> Result<Rollout, libupgrade::rollout::RolloutError>,
) -> anyhow::Result<()> {
    a.sign_with(dir, &|p, signers, expires| {
        publish::stage_rollout(p, version, edit, signers, expires)
    })
}

/// `release rollout`: set a release's waves (its required stop, its retries), keeping nothing else of
/// an earlier rollout of it but a withdrawal, which is final.
pub fn rollout(a: RolloutArgs) -> anyhow::Result<()> {
    let waves = parse_waves(&a.waves, a.start.unwrap_or_else(Utc::now))
        .map_err(|e| anyhow::anyhow!("--waves: {e}"))?;
    let from_at_least = match &a.from_at_least {
        None => None,
        Some(v) => {
            let t = published(&a.dir)?;
            let generation = t
                .targets
                .values()
                .filter_map(|m| m.custom.as_ref())
                .find(|c| &c.version == v)
                .map(|c| c.generation)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--from-at-least {}: {} lists no such release",
                        v.escape_debug(),
                        a.dir.join(Role::Targets.file()).display()
                    )
                })?;
            Some(Floor {
                version: v.clone(),
                generation,
            })
        }
    };
    let edit = |old: Option<&Rollout>| {
        if let Some(w) = old.and_then(|r| r.withdrawn) {
            return Err(libupgrade::rollout::RolloutError::Transition {
                what: format!("cannot set waves: the release was withdrawn at {}", w.at),
            });
        }
        Ok(Rollout {
            waves: waves.clone(),
            from_at_least: from_at_least.clone(),
            retries: a.retries.filter(|n| *n > 0).map(|count| Retries {
                count,
                backoff_secs: a.retry_backoff,
            }),
            ..Rollout::default()
        })
    };
    sign(&a.dir, &a.version, &a.sign, &edit)?;
    println!("rollout of {} set:", a.version);
    print_status(&published(&a.dir)?, Utc::now());
    Ok(())
}

/// `release pause|resume|withdraw`. `resume` lifts the guard's halt of the release as well
/// as the publisher's own pause (either may hold it; at least one must).
pub fn change(change: Change, a: ChangeArgs) -> anyhow::Result<()> {
    let at = a.at.unwrap_or_else(Utc::now);
    let halted = match change {
        Change::Resume => halted_since(&a.dir, &a.version)?,
        _ => None,
    };
    let edit = |old: Option<&Rollout>| {
        let old = old.cloned().unwrap_or_default();
        match change {
            Change::Pause => old.pause(at),
            Change::Resume => resume(&old, halted, at),
            Change::Withdraw => Ok(old.withdraw(at)),
        }
    };
    sign(&a.dir, &a.version, &a.sign, &edit)?;
    if let Some(since) = halted {
        println!(
            "lifted the guard's halt of {} (since {})",
            a.version,
            time_str(&since)
        );
    }
    let (t, held) = super::halt::effective(&a.dir, at)?;
    print_status(&t, at);
    for line in super::halt::lines(&held, &a.dir) {
        println!("{line}");
    }
    Ok(())
}

/// The `since` of the served halt that holds `version` of the channel `dir`, if one does.
fn halted_since(dir: &Path, version: &str) -> anyhow::Result<Option<DateTime<Utc>>> {
    let t = published(dir)?;
    let Some(doc) = libupgrade::trust::halt::served(dir, &t)? else {
        return Ok(None);
    };
    Ok(libupgrade::trust::halt::active_for(&t, &doc, version).map(|m| m.since))
}

/// `resume`: lift the guard's halt (since `halted`) and the publisher's pause, whichever hold.
fn resume(
    old: &Rollout,
    halted: Option<DateTime<Utc>>,
    at: DateTime<Utc>,
) -> Result<Rollout, libupgrade::rollout::RolloutError> {
    let Some(since) = halted else {
        return old.resume(at);
    };
    let lifted = old.lift_halt(since, at)?;
    match lifted.paused {
        Some(_) => lifted.resume(at),
        None => Ok(lifted),
    }
}

pub(super) fn print_status(t: &Targets, at: DateTime<Utc>) {
    for line in preview(t, at) {
        println!("{line}");
    }
}

/// One line per release (newest first): which share of the fleet is offered it at `at`.
pub fn preview(t: &Targets, at: DateTime<Utc>) -> Vec<String> {
    let mut rels: Vec<_> = t
        .targets
        .values()
        .filter_map(|m| m.custom.as_ref())
        .map(|c| (c.generation, c.version.clone(), c.rollout.clone()))
        .collect();
    rels.sort_by(|a, b| (b.0, &b.1).cmp(&(a.0, &a.1)));
    rels.dedup_by(|a, b| a.1 == b.1);
    let mut out = vec![format!("at {}:", time_str(&at))];
    for (generation, version, rollout) in rels {
        let what = match rollout {
            None => "the whole fleet (no rollout)".to_string(),
            Some(r) => describe(&r, at),
        };
        out.push(format!("  {version:<20} generation {generation:<6} {what}"));
    }
    out
}

fn describe(r: &Rollout, at: DateTime<Utc>) -> String {
    if let Some(w) = r.withdrawn {
        return format!("withdrawn at {} (offered to nobody)", time_str(&w.at));
    }
    let ppm = r.share_ppm_at(at);
    let mut s = format!(
        "{:.2} % of the fleet",
        f64::from(ppm) * 100.0 / f64::from(libupgrade::rollout::SEED_SPACE)
    );
    if let Some(p) = r.paused.filter(|p| p.since <= at) {
        s.push_str(&format!(
            ", paused since {} (only nodes that staged it go on)",
            time_str(&p.since)
        ));
    }
    if let Some(f) = &r.from_at_least {
        s.push_str(&format!(
            "; nodes below generation {} take {} first",
            f.generation, f.version
        ));
    }
    if let Some(r) = r.retries {
        s.push_str(&format!(
            "; a node where it failed retries it {} time(s), {} s after the failure, doubling",
            r.count, r.backoff_secs
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(h: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + h * 3600, 0).unwrap()
    }

    #[test]
    fn shares_are_percentages_with_two_decimals_at_most() {
        assert_eq!(parse_share("1%"), Ok(100));
        assert_eq!(parse_share("0.5%"), Ok(50));
        assert_eq!(parse_share("12.34%"), Ok(1234));
        assert_eq!(parse_share("100%"), Ok(10_000));
        assert!(parse_share("100.01%")
            .unwrap_err()
            .contains("more than 100%"));
        assert!(parse_share("10").unwrap_err().contains("must end in %"));
        assert!(parse_share("0.125%").unwrap_err().contains("two decimals"));
        assert!(parse_share("-1%").is_err());
    }

    #[test]
    fn waves_read_relative_and_absolute_times() {
        let w = parse_waves("1%@+0, 10%@+24h,50%@+2d,100%@2027-01-01T00:00:00Z", t(0)).unwrap();
        assert_eq!(
            w,
            vec![
                Wave {
                    share_bp: 100,
                    start: t(0)
                },
                Wave {
                    share_bp: 1_000,
                    start: t(24)
                },
                Wave {
                    share_bp: 5_000,
                    start: t(48)
                },
                Wave {
                    share_bp: 10_000,
                    start: parse_time("2027-01-01T00:00:00Z").unwrap()
                },
            ]
        );
        assert!(parse_waves("10%", t(0)).unwrap_err().contains("SHARE@WHEN"));
        assert!(parse_waves("10%@+soon", t(0)).is_err());
        assert!(parse_waves("10%@yesterday", t(0))
            .unwrap_err()
            .contains("RFC 3339"));
    }

    fn targets(rollout: Option<Rollout>) -> Targets {
        let custom = |v: &str, g, rollout| libupgrade::trust::meta::TargetCustom {
            version: v.into(),
            generation: g,
            arch: libupgrade::manifest::Arch::host(),
            rollout,
        };
        let mut m = libupgrade::trust::meta::file_meta(b"x", None);
        let mut targets = std::collections::BTreeMap::new();
        m.custom = Some(custom("v1", 1, None));
        targets.insert("v1/manifest.json".to_string(), m.clone());
        m.custom = Some(custom("v2", 2, rollout));
        targets.insert("v2/manifest.json".to_string(), m);
        Targets {
            type_: "targets".into(),
            spec_version: "1.0.0".into(),
            version: 3,
            expires: t(1000),
            targets,
            delegations: None,
        }
    }

    #[test]
    fn the_preview_shows_each_release_share_pause_and_withdrawal() {
        let r = Rollout {
            waves: parse_waves("10%@+0,100%@+10h", t(0)).unwrap(),
            ..Rollout::default()
        };
        let lines = preview(&targets(Some(r.clone())), t(5));
        assert!(
            lines[1].contains("v2") && lines[1].contains("55.00 % of the fleet"),
            "{lines:?}"
        );
        assert!(lines[2].contains("v1") && lines[2].contains("whole fleet (no rollout)"));
        assert!(preview(&targets(Some(r.clone())), t(-1))[1].contains(" 0.00 %"));
        let paused = r.pause(t(2)).unwrap();
        let l = &preview(&targets(Some(paused)), t(5))[1];
        assert!(l.contains("28.00 %") && l.contains("paused since"), "{l}");
        let l = &preview(&targets(Some(r.withdraw(t(3)))), t(5))[1];
        assert!(l.contains("withdrawn at") && l.contains("nobody"), "{l}");
    }
}
