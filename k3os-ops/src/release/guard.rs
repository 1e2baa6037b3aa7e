//! `k3os-ops collector guard`: one run of the automatic halt (from cron). It reads the
//! collector's database, judges every release of the channel by the abort criteria
//! (`collector::guard`, pure), signs a halt of each release that meets them with the guard's
//! stop-only key into the channel directory that `release serve` serves
//! (`libupgrade::trust::halt`), notes a halt the publisher lifted, and records each action in
//! the database (`guard_actions`). Every run re-signs `halt.json`, so it stays fresh: nodes
//! refuse an expired one, and a guard that stopped running shows.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use clap::Args;
use collector::guard::{self, Step, Verdict};
use collector::GuardAction;
use libupgrade::trust::halt::{self, Mark};
use libupgrade::trust::meta::Targets;
use libupgrade::trust::publish;

/// `collector guard`.
#[derive(Args, Debug)]
pub struct GuardArgs {
    /// The channel directory the guard writes halt.json into (served by `release serve`).
    #[arg(long)]
    channel: PathBuf,
    /// The collector's database (`sqlite:PATH` or a `postgres://` URL).
    #[arg(long)]
    db: String,
    /// The guard's secret key(s): the keys `release delegate-halt` named (repeat).
    #[arg(long = "key", required = true)]
    keys: Vec<PathBuf>,
    /// Lifetime of the new halt.json (run the guard well within it).
    #[arg(long, default_value = "7d", value_parser = super::metadata::parse_lifetime)]
    expires: chrono::Duration,
    /// The time of this run (RFC 3339; default now).
    #[arg(long, value_parser = crate::upgrade::parse_time)]
    at: Option<DateTime<Utc>>,
    #[command(flatten)]
    abort: super::rollout::AbortArgs,
}

/// Each release version of `t`, once.
fn versions(t: &Targets) -> Vec<String> {
    let mut v: Vec<String> = t
        .targets
        .values()
        .filter_map(|m| m.custom.as_ref().map(|c| c.version.clone()))
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The verdict on `version` over the nodes whose outcome (`collector::history`: a failure
/// stands through later waits) was decided by a report received after `from` (Unix seconds;
/// 0: every node).
fn verdict(
    rows: &[collector::Row],
    t: &Targets,
    version: &str,
    from: u64,
    c: &guard::Criteria,
) -> Verdict {
    let rows: Vec<collector::Row> = rows
        .iter()
        .filter(|r| r.version == version)
        .cloned()
        .collect();
    let f = collector::fleet::summarize_decided_after(
        &rows,
        &|v, s| super::fleet_status::wave_of(t, v, s),
        0,
        Some(from),
    );
    f.releases
        .iter()
        .find(|r| r.version == version)
        .map_or(Verdict::TooFew { ran: 0 }, |r| guard::judge(r, c))
}

/// The guard's judgement of `version` as one line, printed at every run.
fn judged_line(version: &str, v: &Verdict, from: u64) -> String {
    let since = match from {
        0 => "every report".to_string(),
        t => format!("reports since the lift at {}", super::fleet_status::unix(t)),
    };
    let counts = match v {
        Verdict::Halt {
            failed,
            ran,
            percent,
        }
        | Verdict::GoOn {
            failed,
            ran,
            percent,
        } => format!("{failed} of {ran} node(s) failed ({percent:.2} %)"),
        Verdict::TooFew { ran } => format!("{ran} node(s) ran it, too few to judge"),
    };
    format!("{version}: judged on {since}: {counts}")
}

/// The line most of the failed nodes of `version` share (judged from `from` on, as the
/// verdict), from their whys and their bundles' check outputs (`collector::cause`).
fn common(
    rows: &[collector::Row],
    bundles: &[fleet_report::Bundle],
    version: &str,
    from: u64,
) -> Option<collector::cause::Common> {
    collector::cause::failures(rows, bundles, Some(from))
        .into_iter()
        .find(|r| r.version == version)
        .and_then(|r| r.common)
}

fn detail(v: &Verdict, c: &guard::Criteria, common: Option<&collector::cause::Common>) -> String {
    let common = common.map_or(String::new(), |c| format!("; {c}"));
    match v {
        Verdict::Halt {
            failed,
            ran,
            percent,
        } => {
            format!(
                "{failed} of {ran} node(s) failed ({percent:.2} % >= {} %; counted: {}; wave {})",
                c.threshold_percent,
                c.failures
                    .iter()
                    .map(|s| serde_json::to_value(s)
                        .map(|v| v.as_str().unwrap_or_default().to_string())
                        .unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(","),
                c.wave.map_or("any".to_string(), |w| w.to_string())
            ) + &common
        }
        other => format!("{other:?}"),
    }
}

/// One run of the guard.
pub fn run(a: GuardArgs) -> anyhow::Result<()> {
    let c = super::fleet_status::criteria(&a.abort)?
        .ok_or_else(|| anyhow::anyhow!("--abort-if PERCENT is required: the guard halts by it"))?;
    let at = a.at.unwrap_or_else(Utc::now);
    let now = u64::try_from(at.timestamp()).unwrap_or(0);
    let keys = super::metadata::secrets(&a.keys)?;
    let expires = publish::expires_in(a.expires).max(at + a.expires);
    let channel = a.channel.display().to_string();
    let mut store = collector::open(&a.db)?;
    let rows = store.rows()?;
    let bundles = store.failed_bundles(&rows)?;
    let actions = store.actions()?;
    let t = super::resign::published(&a.channel)?;
    let served = halt::served(&a.channel, &t)?;
    let mut wrote = false;
    for version in versions(&t) {
        let held = served
            .as_ref()
            .and_then(|d| halt::active_for(&t, d, &version))
            .is_some();
        let from = guard::judged_from(&actions, &channel, &version);
        let v = verdict(&rows, &t, &version, from, &c);
        let step = guard::step(&actions, &channel, &version, held, &v);
        // From a lift seen now on, only what is received after it is judged.
        let judged = match step {
            Step::Lifted => (verdict(&rows, &t, &version, now, &c), now),
            _ => (v.clone(), from),
        };
        println!("{}", judged_line(&version, &judged.0, judged.1));
        let record = |action: &str, detail: String, halt_version: u64| GuardAction {
            at: now,
            channel: channel.clone(),
            version: version.clone(),
            action: action.into(),
            detail,
            halt_version,
        };
        match step {
            Step::Nothing => {}
            Step::Lifted => {
                println!(
                    "{version}: the publisher lifted the guard's halt; judging reports from now on"
                );
                store.record(&record("lifted", "no halt holds it any more".into(), 0))?;
            }
            Step::Halt => {
                let d = detail(&v, &c, common(&rows, &bundles, &version, from).as_ref());
                let mark = Mark {
                    since: at,
                    reason: d.clone(),
                };
                let w = halt::write_served(&a.channel, Some((&version, &mark)), &keys, expires)?;
                wrote = true;
                println!(
                    "{version}: halted ({d}): wrote {} version {}",
                    halt::HALT_FILE,
                    w.doc.version
                );
                store.record(&record("halt", d, w.doc.version))?;
            }
        }
    }
    if !wrote {
        refresh(&a.channel, &keys, expires, &channel, now, store.as_mut())?;
    }
    Ok(())
}

/// Re-sign `halt.json` one version up with nothing added (it must not expire while the guard
/// runs), and record it.
fn refresh(
    dir: &Path,
    keys: &[publish::SigningKey],
    expires: DateTime<Utc>,
    channel: &str,
    now: u64,
    store: &mut dyn collector::Store,
) -> anyhow::Result<()> {
    let w = halt::write_served(dir, None, keys, expires)?;
    println!(
        "no release to halt: re-signed {} version {} (expires {})",
        halt::HALT_FILE,
        w.doc.version,
        libupgrade::trust::meta::time_str(&expires)
    );
    store.record(&GuardAction {
        at: now,
        channel: channel.to_string(),
        version: String::new(),
        action: "refresh".into(),
        detail: format!("{} halt(s) listed", w.doc.targets.len()),
        halt_version: w.doc.version,
    })?;
    Ok(())
}
