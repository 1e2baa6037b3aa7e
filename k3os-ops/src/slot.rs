//! `k3os-ops slot …`: look at and steer the two slots by hand.
//!
//! `status` prints both slots like `rauc status` (version, generation, state, tries left,
//! booted, next boot, last decision and why) or JSON; `activate`, `confirm`, `rollback` and
//! `mark-bad` run the same library calls the upgrade and the boot path use; `verify` is the
//! dm-verity scrub (`slot_verify`).

use anyhow::Context;
use clap::{Args, Subcommand};
use libupgrade::health::{CheckResult, HealthCheck};
use libupgrade::rollout::Retry;
use libupgrade::state::AwaitedChecks;
use libupgrade::units::Size;
use libupgrade::{Slot, Updater};
use libupgrade::{SlotStatus, Status};

use crate::node::{reboot, ConfigArg};
use libupgrade::Unconfirmed;

#[derive(Args, Debug)]
pub struct SlotArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    #[command(subcommand)]
    pub cmd: SlotCmd,
}

#[derive(Subcommand, Debug)]
pub enum SlotCmd {
    /// Show both slots and why the booted one booted.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Try a slot on the next boot (default: the inactive one, which must be staged or good).
    Activate {
        slot: Option<Slot>,
        /// A check the trial boot must have reported (`slot confirm --passed NAME`) before it
        /// is marked good, like a unit ordered before systemd's boot-complete.target; the
        /// agent awaits `node-ready`. Repeatable.
        #[arg(long = "await", value_name = "NAME")]
        awaits: Vec<String>,
        /// How long after the trial boot the awaited checks may take before `slot
        /// await-bless` counts them failed and rolls back.
        #[arg(
            long,
            value_name = "SECONDS",
            default_value_t = 600,
            requires = "awaits"
        )]
        within_secs: u64,
    },
    /// Run the health checks on the booted slot and mark it good (rolls back on failure).
    /// Exits 75 when the slot passed but checks its activation awaits are not reported yet.
    Confirm {
        #[arg(long)]
        json: bool,
        /// Report a check that passed, observed by the caller (e.g. `node-ready`). Repeatable.
        #[arg(long, value_name = "NAME")]
        passed: Vec<String>,
        /// Report a check that failed: `NAME=why`. Repeatable.
        #[arg(long, value_name = "NAME=WHY")]
        failed: Vec<String>,
    },
    /// On a trial boot waiting for awaited checks (`slot confirm` exited 75): wait until they
    /// are reported; when they are not within the activation's limit, count them failed,
    /// which rolls back to the good slot. init starts it in the background.
    AwaitBless {
        /// Reboot right away when it rolls back.
        #[arg(long)]
        reboot: bool,
    },
    /// Leave the booted slot for the other (good) one on the next boot.
    Rollback {
        #[arg(long, default_value = "operator request")]
        reason: String,
        /// Reboot right away.
        #[arg(long)]
        reboot: bool,
    },
    /// Re-read both slots against their dm-verity trees (releases made with `release create
    /// --verity`): repair what FEC can on the slot that is not booted, and mark it bad when
    /// FEC cannot, so no fallback lands on it. The booted slot is only read. Fails when
    /// damage is left.
    Verify {
        /// Only report: write nothing, mark nothing.
        #[arg(long)]
        no_repair: bool,
        #[arg(long)]
        json: bool,
    },
    /// Never boot this slot again until it is staged anew.
    MarkBad {
        slot: Slot,
        #[arg(long, default_value = "marked bad by operator")]
        reason: String,
    },
}

pub fn run(args: SlotArgs) -> anyhow::Result<()> {
    let u = args.config.updater()?;
    let out = dispatch(&u, args.cmd);
    crate::node::send_reports(&u);
    // No download schedule here: a failing site's bundles go after the reports.
    crate::node::send_bundles(&u, libupgrade::BundleAllowance::ANY);
    out
}

fn dispatch(u: &Updater, cmd: SlotCmd) -> anyhow::Result<()> {
    match cmd {
        SlotCmd::Status { json } => status(u, json),
        SlotCmd::Activate {
            slot,
            awaits,
            within_secs,
        } => activate(u, slot, awaits, within_secs),
        SlotCmd::AwaitBless { reboot: now } => await_bless(u, now),
        SlotCmd::Confirm {
            json,
            passed,
            failed,
        } => confirm(u, json, &passed, &failed),
        SlotCmd::Rollback {
            reason,
            reboot: now,
        } => {
            let to = u.rollback(&reason)?;
            println!("slot {to} boots next");
            if now {
                crate::node::send_reports(u);
                reboot()?;
            }
            Ok(())
        }
        SlotCmd::Verify { no_repair, json } => crate::slot_verify::run(u, json, !no_repair),
        SlotCmd::MarkBad { slot, reason } => {
            u.mark_bad(slot, &reason)?;
            println!("slot {slot} marked bad");
            Ok(())
        }
    }
}

/// `slot status [--json]`.
fn status(u: &Updater, json: bool) -> anyhow::Result<()> {
    let st = u.status()?;
    // The agent's last stage preview (`stage-preview.json` in the state directory, see
    // `libupgrade::state::ledger`); absent on nodes that never staged through the agent.
    // `slot status` is what one runs when something is wrong: an unreadable preview is a
    // warning, never a failure of the status.
    let preview =
        libupgrade::state::ledger::last_preview(&u.config().state_dir).unwrap_or_else(|e| {
            eprintln!("warning: {e} (the agent's stage preview is not shown)");
            None
        });
    // The node's place in the channel's rollout waves; read only (status never draws one).
    let seed = libupgrade::rollout::read_seed(&u.config().state_dir).unwrap_or_else(|e| {
        eprintln!("warning: {e} (the node's rollout seed is not shown)");
        None
    });
    // The node's id for the collector's allow-list, its report key made at first use.
    let node_id = u.node_id().map(|n| n.to_string()).unwrap_or_else(|e| {
        eprintln!(
            "warning: {} (the node id is not shown)",
            libupgrade::chain_line(&e)
        );
        String::new()
    });
    if json {
        let mut v = serde_json::to_value(&st)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("seed".into(), serde_json::to_value(seed.map(|s| s.get()))?);
            o.insert("node_id".into(), serde_json::to_value(&node_id)?);
            o.insert(
                "reports_spooled".into(),
                serde_json::to_value(u.spooled_reports())?,
            );
            o.insert(
                "reports_refused".into(),
                serde_json::to_value(u.report_refusals())?,
            );
            o.insert(
                "failure_bundles".into(),
                serde_json::to_value(u.failure_bundles())?,
            );
            if let Some(p) = &preview {
                o.insert("stage_preview".into(), serde_json::to_value(p)?);
            }
            o.insert("held_back".into(), held_back_json(&st));
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render_status(&st));
        println!("{}", render_seed(seed));
        println!("{}", render_node_id(&node_id, u));
        for line in u.report_refusals().iter().chain(&u.failure_bundle_lines()) {
            println!("{line}");
        }
        if let Some(p) = &preview {
            print!("{}", render_preview(p));
        }
        for line in render_held_back(&st) {
            println!("{line}");
        }
    }
    Ok(())
}

/// Each release that failed here, as [`libupgrade::rollout::decide_retry`] holds it back
/// now without a rollout's retries (status reads no channel): whether and why, and until
/// when when its backoff is known.
fn held_back(st: &Status) -> Vec<(&libupgrade::state::FailedRelease, Retry)> {
    let now = libupgrade::channel::node_now();
    st.failed
        .iter()
        .map(|f| (f, libupgrade::rollout::decide_retry(Some(f), None, now)))
        .collect()
}

/// `slot status`'s held-back lines.
fn render_held_back(st: &Status) -> Vec<String> {
    held_back(st)
        .into_iter()
        .filter_map(|(_, r)| match r {
            Retry::Proceed => None,
            Retry::Wait { why, .. } => Some(format!("held back: {why}")),
        })
        .collect()
}

/// `slot status --json`'s `held_back`: version, generation, why and until (RFC 3339 or null).
fn held_back_json(st: &Status) -> serde_json::Value {
    held_back(st)
        .into_iter()
        .filter_map(|(f, r)| match r {
            Retry::Proceed => None,
            Retry::Wait { why, until } => Some(serde_json::json!({
                "version": f.version,
                "generation": f.generation,
                "why": why,
                "until": until.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            })),
        })
        .collect()
}

/// The node id line: the id to enrol at the collector, where reports go and how many wait.
fn render_node_id(id: &str, u: &Updater) -> String {
    let id = if id.is_empty() { "unknown" } else { id };
    match (&u.config().report_url, &u.config().report_site) {
        (Some(url), Some(site)) => format!(
            "node id: {id} (site {site}, reports to {url}; {} spooled)",
            u.spooled_reports()
        ),
        _ => format!("node id: {id} (reports nowhere: no report_url)"),
    }
}

/// The node's rollout seed line: its position among the fleet's million, or that it has none yet.
pub fn render_seed(seed: Option<libupgrade::rollout::Seed>) -> String {
    match seed {
        Some(s) => format!(
            "rollout seed: {} of {} (a wave admitting more than {:.4} % of the fleet reaches this node)",
            s.get(),
            libupgrade::rollout::SEED_SPACE,
            f64::from(s.get()) * 100.0 / f64::from(libupgrade::rollout::SEED_SPACE)
        ),
        None => "rollout seed: none yet (drawn at the first resolution through a channel with rollouts)".into(),
    }
}

/// The agent's last stage preview: what staging its target fetches and reuses.
pub fn render_preview(p: &libupgrade::state::ledger::PreviewRecord) -> String {
    let at = p.at.map_or(String::new(), |t| {
        format!(
            ", previewed {}",
            t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )
    });
    let from = p
        .bundle
        .as_ref()
        .map_or(String::new(), |b| format!(" from bundle {b}"));
    let patched: String = p
        .by_patch
        .iter()
        .map(|b| format!("; {} by patch", b.escape_debug()))
        .collect();
    format!(
        "\n=== Stage Preview (agent) ===\n{}{from}: fetch {} ({} bytes), reuse {} ({} bytes){patched}{at}\n",
        p.version,
        Size(p.fetch),
        p.fetch,
        Size(p.reuse),
        p.reuse
    )
}

/// `slot activate [SLOT] [--await NAME … --within-secs N]`.
fn activate(
    u: &Updater,
    slot: Option<Slot>,
    awaits: Vec<String>,
    within_secs: u64,
) -> anyhow::Result<()> {
    let awaited = (!awaits.is_empty()).then(|| AwaitedChecks {
        names: awaits.clone(),
        within_secs,
    });
    let s = u.activate_awaiting(slot, awaited)?;
    if awaits.is_empty() {
        println!("slot {s} will be tried on the next boot");
    } else {
        println!(
            "slot {s} will be tried on the next boot and marked good only after {} is reported (within {within_secs} s)",
            awaits.join(", ")
        );
    }
    Ok(())
}

/// `slot confirm [--json] [--passed NAME] [--failed NAME=WHY]`: assess this boot; an outcome
/// other than a good slot is the command's error ([`Unconfirmed`]: exit 75 while awaited
/// checks are pending, 1 otherwise), printed once by `main`.
fn confirm(u: &Updater, json: bool, passed: &[String], failed: &[String]) -> anyhow::Result<()> {
    let reported = reported_checks(passed, failed)?;
    let refs: Vec<&dyn HealthCheck> = reported.iter().map(|c| c as &dyn HealthCheck).collect();
    let rep = u.confirm_with(&refs).context("slot confirm")?;
    if let Some(not_good) = rep.unconfirmed() {
        return Err(anyhow::Error::new(not_good).context("slot confirm"));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
        return Ok(());
    }
    if let Some(d) = &rep.other_slot {
        println!("slot {}: {}", d.slot, d.why);
    }
    for c in &rep.checks {
        println!(
            "check {}: {} {}",
            c.name,
            if c.ok { "ok" } else { "FAILED" },
            c.detail
        );
    }
    println!(
        "slot {} ({}) is good{}",
        rep.slot,
        rep.version.as_deref().unwrap_or("unknown version"),
        if rep.newly_good {
            " (confirmed now)"
        } else {
            ""
        }
    );
    Ok(())
}

/// `--passed NAME` and `--failed NAME=WHY` as check results.
fn reported_checks(passed: &[String], failed: &[String]) -> anyhow::Result<Vec<CheckResult>> {
    let mut out: Vec<CheckResult> = passed
        .iter()
        .map(|n| CheckResult {
            name: n.clone(),
            ok: true,
            detail: "reported passed by the caller".into(),
        })
        .collect();
    for f in failed {
        let Some((name, why)) = f
            .split_once('=')
            .filter(|(n, w)| !n.is_empty() && !w.is_empty())
        else {
            anyhow::bail!(
                "--failed {f:?}: expected NAME=WHY, e.g. --failed node-ready='not Ready after 5m'"
            );
        };
        out.push(CheckResult {
            name: name.to_string(),
            ok: false,
            detail: why.to_string(),
        });
    }
    Ok(out)
}

/// `slot await-bless`: poll this boot's verdict until it is no longer pending; at the
/// activation's limit, count the awaited checks failed (the library decides, under its lock).
/// When the boot awaits the reachability check ([`libupgrade::reach`]), probe its endpoints
/// each round and report it passed through the one bless point once one answers.
fn await_bless(u: &Updater, reboot_now: bool) -> anyhow::Result<()> {
    use libupgrade::state::Outcome;
    let start = std::time::Instant::now();
    let mut unreachable = String::new();
    loop {
        let st = u.status()?;
        let Some(v) = st.verdict else {
            anyhow::bail!("this boot was not assessed yet: run `k3os-ops slot confirm` first");
        };
        let Outcome::Pending {
            waiting_for,
            within_secs,
        } = &v.outcome
        else {
            println!("slot {}: {}", v.slot, v.reason);
            return Ok(());
        };
        match u.probe_reachability(waiting_for)? {
            Some(c) if c.ok => {
                println!("check {}: ok {}", c.name, c.detail);
                // The verdict (pending on other checks, good, rolled back) is read next round.
                u.confirm_with(&[&c]).context("slot await-bless")?;
                continue;
            }
            Some(c) => unreachable = format!("; {}", c.detail),
            None => {}
        }
        let limit = std::time::Duration::from_secs(*within_secs);
        if start.elapsed() < limit {
            let left = limit - start.elapsed();
            std::thread::sleep(left.min(std::time::Duration::from_secs(2)));
            continue;
        }
        let why = format!("not reported within {within_secs} s of the boot{unreachable}");
        let Some(rep) = u.fail_awaited(&why).context("slot await-bless")? else {
            continue;
        };
        let Some(not_good) = rep.unconfirmed() else {
            println!("slot {}: {}", rep.slot, rep.verdict.reason);
            return Ok(());
        };
        if let Unconfirmed::HealthFailed { rolled_back, .. } = &not_good {
            println!("{not_good}; waited for {}", waiting_for.join(", "));
            if *rolled_back && reboot_now {
                reboot()?;
            }
        }
        return Err(anyhow::Error::new(not_good).context("slot await-bless"));
    }
}

fn ago(at: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let d = now.saturating_sub(at);
    match d {
        0..=119 => format!("{d}s ago"),
        120..=7199 => format!("{}m ago", d / 60),
        _ => format!("{}h ago", d / 3600),
    }
}

/// An event's name as `--json` spells it (`marked-bad`, `health-failed`): one vocabulary for
/// people and scripts, taken from the state file's own serde names.
pub fn event_name(e: libupgrade::state::Event) -> String {
    match serde_json::to_value(e) {
        Ok(serde_json::Value::String(s)) => s,
        _ => format!("{e:?}"),
    }
}

/// A boot outcome as `--json` spells it (`blessed`, `rolled-back`).
fn outcome_name(o: &libupgrade::state::Outcome) -> String {
    match serde_json::to_value(o) {
        Ok(v) => v["kind"].as_str().unwrap_or("unknown").to_string(),
        Err(_) => format!("{o:?}"),
    }
}

/// The human status view.
pub fn render_status(st: &Status) -> String {
    let mut out = render_system(st);
    out.push_str("\n=== Slot States ===\n");
    for s in &st.slots {
        out.push_str(&render_slot(s));
    }
    out
}

/// The system part: loader, layout, booted and next slot, boot script, damage, this boot.
fn render_system(st: &Status) -> String {
    let mut out = String::new();
    let booted = st
        .booted
        .map(|s| s.to_string())
        .unwrap_or_else(|| "unknown".into());
    out.push_str(&format!(
        "=== System Info ===\nBootloader: {}\nLayout:     {}\nBooted:     slot {booted}\nNext boot:  slot {}\nLoader reads: {}\n",
        st.bootloader, st.layout, st.next_boot, st.loader_integrity.in_use
    ));
    let sc = &st.boot_script;
    out.push_str(&format!(
        "Boot script: {} {} ({}; this build reads up to version {})\n",
        sc.kind,
        sc.installed
            .map_or("not installed".to_string(), |v| format!("version {v}")),
        sc.path.display(),
        sc.newest_known
    ));
    for d in &st.loader_integrity.damaged {
        out.push_str(&format!(
            "WARNING: {} ({}) is damaged: {}; the loader uses {} and the next write by k3os-ops rewrites every copy\n",
            d.record,
            d.path.display(),
            d.what,
            st.loader_integrity.in_use
        ));
    }
    if let Some(v) = &st.verdict {
        out.push_str(&format!(
            "This boot:  slot {} {}: {}\n",
            v.slot,
            outcome_name(&v.outcome),
            v.reason
        ));
    }
    for q in &st.quarantined {
        out.push_str(&format!(
            "WARNING: payload store object {} ({}) was not what its name says: moved to quarantine {}, fetched again\n",
            q.file.escape_debug(),
            Size(q.size),
            ago(q.at),
        ));
    }
    out
}

/// One slot: state, version, generation, last transfer, boot entry, last decision.
fn render_slot(s: &SlotStatus) -> String {
    let mut out = String::new();
    let mark = if s.booted { "x" } else { " " };
    out.push_str(&format!(
        "[{mark}] slot {} ({}{}{})\n",
        s.slot,
        s.state,
        if s.booted { ", booted" } else { "" },
        if s.next_boot { ", next boot" } else { "" }
    ));
    out.push_str(&format!(
        "      version:    {}\n",
        s.version.as_deref().unwrap_or("-")
    ));
    out.push_str(&format!(
        "      generation: {}\n",
        s.generation
            .map(|g| g.to_string())
            .unwrap_or_else(|| "-".into())
    ));
    if let Some(t) = &s.transfer {
        out.push_str(&format!(
            "      update:     {} fetched, {} reused of {}\n",
            Size(t.fetched),
            Size(t.reused),
            Size(t.total)
        ));
    }
    let boot = match s.boot {
        bootconfig::SlotBoot::Good => "good".to_string(),
        bootconfig::SlotBoot::Bad => "bad".to_string(),
        bootconfig::SlotBoot::Trying { tries_left } => {
            format!("trying, {tries_left} tries left")
        }
    };
    out.push_str(&format!(
        "      boot:       {boot}{}\n",
        if s.primary { " (primary)" } else { "" }
    ));
    for p in &s.payloads {
        out.push_str(&format!(
            "      payload:    {} {} {} sha256 {} {}\n",
            p.kind.escape_debug(),
            p.name.escape_debug(),
            Size(p.size),
            &p.sha256[..p.sha256.len().min(12)],
            if p.in_store { "in store" } else { "MISSING" }
        ));
    }
    if let Some(d) = &s.last_decision {
        out.push_str(&format!(
            "      last:       {} {}: {}\n",
            event_name(d.event),
            ago(d.at),
            d.why
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use libupgrade::state::Event;

    #[test]
    fn the_stage_preview_reads_with_exact_bytes() {
        let p = libupgrade::state::ledger::PreviewRecord {
            format: 1,
            version: "v2".into(),
            fetch: 3_145_728,
            reuse: 1024,
            by_patch: Vec::new(),
            bundle: None,
            at: Some(
                chrono::DateTime::parse_from_rfc3339("2026-12-04T01:00:00Z")
                    .unwrap()
                    .with_timezone(&chrono::Utc),
            ),
        };
        assert_eq!(
            render_preview(&p),
            "\n=== Stage Preview (agent) ===\nv2: fetch 3.0 MiB (3145728 bytes), reuse 1.0 KiB (1024 bytes), previewed 2026-12-04T01:00:00Z\n"
        );
    }

    #[test]
    fn events_read_the_same_in_both_views() {
        assert_eq!(event_name(Event::MarkedBad), "marked-bad");
        assert_eq!(event_name(Event::HealthFailed), "health-failed");
        assert_eq!(event_name(Event::FallbackTaken), "fallback-taken");
    }
}
