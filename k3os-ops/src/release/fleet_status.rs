//! `release rollout-status --reports DB`: beside each release's planned share, what the sites
//! reported (read from the collector's database; `collector::fleet` counts, this renders),
//! and with `--abort-if` whether a release meets the abort criteria (`collector::guard`
//! judges; `collector guard` signs the halt, `release pause` is the publisher's own stop).

use std::path::Path;

use super::rollout::AbortArgs;
use chrono::{DateTime, Utc};
use collector::cause::ReleaseFailures;
use collector::fleet::{FleetStatus, ReleaseStatus, WaveStatus};
use collector::guard::{Criteria, Verdict};
use collector::history::NodeState;
use libupgrade::rollout::Rollout;
use libupgrade::trust::meta::{time_str, Targets};
use serde::Serialize;

/// Each release's rollout in `t`, by version.
fn rollouts(t: &Targets) -> Vec<(String, u64, Option<Rollout>)> {
    let mut rels: Vec<_> = t
        .targets
        .values()
        .filter_map(|m| m.custom.as_ref())
        .map(|c| (c.version.clone(), c.generation, c.rollout.clone()))
        .collect();
    rels.sort_by(|a, b| (b.1, &b.0).cmp(&(a.1, &a.0)));
    rels.dedup_by(|a, b| a.0 == b.0);
    rels
}

/// The wave (from 1) of `version`'s rollout that admits `seed`; None without waves or seed.
pub fn wave_of(t: &Targets, version: &str, seed: Option<u32>) -> Option<usize> {
    let seed = u64::from(seed?);
    let rels = rollouts(t);
    let r = rels.iter().find(|r| r.0 == version)?.2.as_ref()?;
    let per_bp = u64::from(libupgrade::rollout::SEED_SPACE) / 10_000;
    r.waves
        .iter()
        .position(|w| seed < u64::from(w.share_bp) * per_bp)
        .map(|i| i + 1)
}

/// What `rollout-status --reports` reads from the collector's database.
pub struct Reported {
    /// The fleet's reports per release and wave.
    pub fleet: FleetStatus,
    /// Each release's failed nodes with their bundles, and their common line.
    pub failures: Vec<ReleaseFailures>,
    /// The database's name for messages (a password left out).
    pub db: String,
}

/// The fleet's reports from `db`, placed in `t`'s waves, silent when nothing came since
/// `silent_since`, and the failed nodes' bundles.
pub fn read(db: &str, t: &Targets, silent_since: DateTime<Utc>) -> anyhow::Result<Reported> {
    let mut store = collector::open(db)?;
    let rows = store.rows()?;
    let bundles = store.failed_bundles(&rows)?;
    let since = u64::try_from(silent_since.timestamp()).unwrap_or(0);
    Ok(Reported {
        fleet: collector::fleet::summarize(&rows, &|v, s| wave_of(t, v, s), since),
        failures: collector::cause::failures(&rows, &bundles, None),
        db: store.name().to_string(),
    })
}

/// Per release with failed nodes: the line they share, and each failed node's bundle
/// (node, attempt, how it failed, why) or that none arrived; untrusted text escaped.
pub fn failure_lines(failures: &[ReleaseFailures]) -> Vec<String> {
    let mut out = Vec::new();
    for r in failures {
        let with = r.failed.iter().filter(|f| f.bundle.is_some()).count();
        out.push(format!(
            "    {} failed on {} node(s), {with} failure bundle(s) received{}",
            r.version,
            r.failed.len(),
            r.common
                .as_ref()
                .map_or(String::new(), |c| format!("; common cause: {c}"))
        ));
        for f in &r.failed {
            out.push(match &f.bundle {
                Some(b) => format!(
                    "      bundle: node {} ({}) attempt {} {}: {}",
                    f.node,
                    f.site,
                    b.attempt,
                    serde_json::to_value(b.failure)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    b.why.escape_debug()
                ),
                None => format!(
                    "      no bundle: node {} ({}) {}: {}",
                    f.node,
                    f.site,
                    f.label,
                    f.why.lines().next().unwrap_or_default().escape_debug()
                ),
            });
            // A failed node that holds the release back since says so (waiting for a retry,
            // not retried, paused): the bundle line names only the failed attempt.
            let then = f
                .label
                .strip_prefix(f.state.label())
                .and_then(|rest| rest.strip_prefix(", "));
            if let (Some(_), Some(wait)) = (&f.bundle, then) {
                out.push(format!("        then {wait}"));
            }
        }
    }
    out
}

/// One release's planned share at a time, for `--json`.
#[derive(Debug, Serialize)]
pub struct Planned {
    version: String,
    generation: u64,
    /// Percent of the fleet offered it (100 without a rollout, 0 when withdrawn).
    share_percent: f64,
    paused: bool,
    withdrawn: bool,
}

/// The planned shares of `t` at `at`.
pub fn planned(t: &Targets, at: DateTime<Utc>) -> Vec<Planned> {
    rollouts(t)
        .into_iter()
        .map(|(version, generation, r)| {
            let (share, paused, withdrawn) = match r {
                None => (100.0, false, false),
                Some(r) => (
                    f64::from(r.share_ppm_at(at)) * 100.0
                        / f64::from(libupgrade::rollout::SEED_SPACE),
                    r.paused.is_some_and(|p| p.since <= at),
                    r.withdrawn.is_some(),
                ),
            };
            Planned {
                version,
                generation,
                share_percent: if withdrawn { 0.0 } else { share },
                paused,
                withdrawn,
            }
        })
        .collect()
}

/// Unix seconds as an RFC 3339 UTC time.
pub(super) fn unix(secs: u64) -> String {
    DateTime::<Utc>::from_timestamp(i64::try_from(secs).unwrap_or(0), 0)
        .map_or_else(|| secs.to_string(), |t| time_str(&t))
}

fn wave_lines(w: &WaveStatus) -> Vec<String> {
    let name = w.wave.map_or("wave ?".to_string(), |n| format!("wave {n}"));
    let states: Vec<String> = w
        .states
        .iter()
        .map(|(s, n)| format!("{} {n}", s.label()))
        .collect();
    // Failed nodes that wait since (a halted canary): still failed, shown beside it.
    let waiting: String = w
        .failed_waiting
        .iter()
        .map(|(wait, n)| format!("; failed, {} {n}", collector::history::waiting_label(*wait)))
        .collect();
    let mut out = vec![format!(
        "      {name}: {} node(s), {} offered: {}{waiting}",
        w.nodes,
        w.offered,
        states.join(", ")
    )];
    for (why, n) in &w.failures {
        out.push(format!("        {n} × {why}"));
    }
    out
}

fn release_lines(r: &ReleaseStatus) -> Vec<String> {
    let mut out = vec![format!(
        "    {} (generation {}): last report {}, {} silent",
        r.version,
        r.generation,
        unix(r.last_report),
        r.silent
    )];
    for w in &r.waves {
        out.extend(wave_lines(w));
    }
    out
}

/// The reports as lines under the planned shares.
pub fn lines(f: &FleetStatus, db: &str) -> Vec<String> {
    let mut out = vec![format!(
        "  reported ({db}): {} node(s) at {} site(s), {} report(s), {} dropped unsent; silent: no report since {}",
        f.nodes,
        f.sites,
        f.reports,
        f.dropped,
        unix(f.silent_since)
    )];
    for r in &f.releases {
        out.extend(release_lines(r));
    }
    out
}

/// The criteria `a` asks for (None without `--abort-if`).
pub fn criteria(a: &AbortArgs) -> anyhow::Result<Option<Criteria>> {
    let Some(pct) = a.abort_if else {
        return Ok(None);
    };
    if !(0.0..=100.0).contains(&pct) {
        anyhow::bail!("--abort-if {pct} is not a percentage (0 to 100)");
    }
    let state = |s: &str| {
        serde_json::from_value::<NodeState>(serde_json::Value::String(s.trim().into())).map_err(
            |_| {
                anyhow::anyhow!(
                    "--abort-on {:?}: expected states among stage_failed, rolled_back, fell_back, staged, trial_boot, blessed, waiting, withdrawn_dropped",
                    s.escape_debug().to_string()
                )
            },
        )
    };
    let failures = a
        .abort_on
        .split(',')
        .map(state)
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Some(Criteria {
        failures,
        min_nodes: a.abort_min,
        threshold_percent: pct,
        wave: a.abort_wave,
    }))
}

/// One release's verdict.
#[derive(Debug, Serialize)]
pub struct ReleaseVerdict {
    version: String,
    #[serde(flatten)]
    verdict: Verdict,
}

/// Every reported release judged by `c`.
pub fn judge(f: &FleetStatus, c: &Criteria) -> Vec<ReleaseVerdict> {
    f.releases
        .iter()
        .map(|r| ReleaseVerdict {
            version: r.version.clone(),
            verdict: collector::guard::judge(r, c),
        })
        .collect()
}

/// The verdicts as lines, with the command that halts a release that should be halted.
pub fn verdict_lines(v: &[ReleaseVerdict], dir: &Path) -> Vec<String> {
    v.iter()
        .map(|r| match r.verdict {
            Verdict::Halt { failed, ran, percent } => format!(
                "  abort criteria met for {}: {failed} of {ran} node(s) failed ({percent:.2} %): `k3os-ops collector guard` halts it with the same criteria, or pause it with `k3os-ops release pause {} {} …keys…`",
                r.version,
                dir.display(),
                r.version
            ),
            Verdict::TooFew { ran } => format!(
                "  abort criteria: {} not judged yet: {ran} node(s) ran it",
                r.version
            ),
            Verdict::GoOn { failed, ran, percent } => format!(
                "  abort criteria not met for {}: {failed} of {ran} node(s) failed ({percent:.2} %)",
                r.version
            ),
        })
        .collect()
}

/// `rollout-status` with the fleet's side: the planned shares of `t` at `at`, and with
/// `--reports` what the sites reported, with `--abort-if` the verdicts, with `--json` all as
/// JSON.
pub fn status(
    dir: &Path,
    t: &Targets,
    held: &[libupgrade::trust::halt::Applied],
    at: DateTime<Utc>,
    a: &super::rollout::StatusArgs,
) -> anyhow::Result<()> {
    let silent_since = at - chrono::Duration::hours(i64::from(a.silent_hours));
    let reports = match &a.reports {
        Some(db) => Some(read(db, t, silent_since)?),
        None => None,
    };
    let actions = match &a.reports {
        Some(db) => collector::open(db)?.actions()?,
        None => Vec::new(),
    };
    let criteria = criteria(&a.abort)?;
    let verdicts = match (&reports, &criteria) {
        (Some(r), Some(c)) => judge(&r.fleet, c),
        (None, Some(_)) => anyhow::bail!("--abort-if needs --reports (the collector's database)"),
        _ => Vec::new(),
    };
    if a.json {
        let v = serde_json::json!({
            "at": time_str(&at),
            "planned": planned(t, at),
            "reports": reports.as_ref().map(|r| &r.fleet),
            "failures": reports.as_ref().map(|r| &r.failures),
            "abort_criteria": criteria,
            "verdicts": verdicts,
            "halts": held.iter().map(|h| serde_json::json!({
                "version": h.version, "target": h.target,
                "since": time_str(&h.since), "reason": h.reason,
            })).collect::<Vec<_>>(),
            "guard_actions": actions,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    super::rollout::print_status(t, at);
    for line in super::halt::lines(held, dir) {
        println!("{line}");
    }
    if let Some(r) = &reports {
        for line in lines(&r.fleet, &r.db)
            .into_iter()
            .chain(failure_lines(&r.failures))
        {
            println!("{line}");
        }
    }
    for line in verdict_lines(&verdicts, dir) {
        println!("{line}");
    }
    for line in guard_lines(&actions) {
        println!("{line}");
    }
    Ok(())
}

/// The guard's halts and lifts (newest last; at most the last 20 of them), and its last run.
pub fn guard_lines(actions: &[collector::GuardAction]) -> Vec<String> {
    let line = |a: &collector::GuardAction| {
        let at = DateTime::<Utc>::from_timestamp(i64::try_from(a.at).unwrap_or(0), 0)
            .map(|t| time_str(&t))
            .unwrap_or_default();
        let what = match a.action.as_str() {
            "halt" => format!("halted {}", a.version),
            "lifted" => format!("saw the publisher lift its halt of {}", a.version),
            other => other.to_string(),
        };
        let signed = match a.halt_version {
            0 => String::new(),
            v => format!("; halt.json version {v}"),
        };
        format!("  guard: {at} {what} ({}{signed})", a.detail.escape_debug())
    };
    let shown: Vec<&collector::GuardAction> =
        actions.iter().filter(|a| a.action != "refresh").collect();
    let mut out: Vec<String> = shown[shown.len().saturating_sub(20)..]
        .iter()
        .map(|a| line(a))
        .collect();
    if let Some(last) = actions.last().filter(|a| a.action == "refresh") {
        out.push(line(last));
    }
    out
}

/// The dashboard's view of a channel's rollouts: its published targets, read once per page.
struct ChannelSchedule {
    dir: std::path::PathBuf,
    /// The targets as nodes see them (the guard's halts applied) and what the halts hold.
    targets: Option<(Targets, Vec<libupgrade::trust::halt::Applied>)>,
}

impl ChannelSchedule {
    fn rollout(&self, version: &str) -> Option<Option<Rollout>> {
        let rels = rollouts(&self.targets.as_ref()?.0);
        rels.into_iter().find(|r| r.0 == version).map(|r| r.2)
    }
}

impl collector::dashboard::Schedule for ChannelSchedule {
    fn wave_of(&self, version: &str, seed: Option<u32>) -> Option<usize> {
        wave_of(&self.targets.as_ref()?.0, version, seed)
    }

    fn planned_share(&self, version: &str, at: u64) -> Option<f64> {
        let at = DateTime::<Utc>::from_timestamp(i64::try_from(at).ok()?, 0)?;
        Some(match self.rollout(version)? {
            None => 1.0,
            Some(r) if r.withdrawn.is_some() => 0.0,
            Some(r) => f64::from(r.share_ppm_at(at)) / f64::from(libupgrade::rollout::SEED_SPACE),
        })
    }

    fn hold(&self, version: &str) -> Option<String> {
        let r = self.rollout(version)??;
        if let Some(w) = r.withdrawn {
            return Some(format!("withdrawn at {} (final)", time_str(&w.at)));
        }
        let held = self
            .targets
            .as_ref()
            .map(|t| t.1.as_slice())
            .unwrap_or_default();
        if let Some(h) = held.iter().find(|h| h.version == version) {
            return Some(format!(
                "halted by the guard since {} ({}): lift with `k3os-ops release resume {} {version} …keys…`",
                time_str(&h.since),
                h.reason.escape_debug(),
                self.dir.display()
            ));
        }
        r.paused.map(|p| {
            format!(
                "paused since {}: lift with `k3os-ops release resume {} {version} …keys…`",
                time_str(&p.since),
                self.dir.display()
            )
        })
    }

    /// The publisher's pause (not the guard's halt, which the pause of the effective targets
    /// also shows: its halts come from the database) and withdrawal.
    fn marks(&self, version: &str) -> Vec<collector::dashboard::Mark> {
        let Some(Some(r)) = self.rollout(version) else {
            return Vec::new();
        };
        let halted = self
            .targets
            .as_ref()
            .is_some_and(|t| t.1.iter().any(|h| h.version == version));
        let secs = |t: DateTime<Utc>| u64::try_from(t.timestamp()).unwrap_or(0);
        let mark = |at, kind, label: &str| collector::dashboard::Mark {
            at: secs(at),
            kind,
            label: label.to_string(),
        };
        let mut out = Vec::new();
        if let Some(p) = r.paused.filter(|_| !halted) {
            out.push(mark(p.since, "pause", "paused"));
        }
        if let Some(w) = r.withdrawn {
            out.push(mark(w.at, "withdrawn", "withdrawn"));
        }
        out
    }
}

/// The dashboard's schedule source for the channel directory `dir` (None: no channel; the
/// dashboard then shows no waves or planned line). A channel whose targets cannot be read
/// shows as none, with a warning, rather than failing the page.
pub fn schedule_source(dir: Option<std::path::PathBuf>) -> collector::server::ScheduleSource {
    std::sync::Arc::new(move || -> Box<dyn collector::dashboard::Schedule> {
        let Some(dir) = dir.clone() else {
            return Box::new(collector::dashboard::NoSchedule);
        };
        let targets = super::halt::effective(&dir, Utc::now())
            .map_err(|e| eprintln!("warning: dashboard without the channel's schedule: {e:#}"))
            .ok();
        Box::new(ChannelSchedule { dir, targets })
    })
}
