//! `k3os-ops slot …`: look at and steer the two slots by hand.
//!
//! `status` prints both slots like `rauc status` (version, generation, state, tries left,
//! booted, next boot, last decision and why) or JSON; `activate`, `confirm`, `rollback` and
//! `mark-bad` run the same library calls the upgrade and the boot path use.

use anyhow::Context;
use clap::{Args, Subcommand};
use libupgrade::error::Size;
use libupgrade::updater::Status;
use libupgrade::Slot;

use crate::upgrade::ConfigArg;

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
    Activate { slot: Option<Slot> },
    /// Run the health checks on the booted slot and mark it good (rolls back on failure).
    Confirm {
        #[arg(long)]
        json: bool,
    },
    /// Leave the booted slot for the other (good) one on the next boot.
    Rollback {
        #[arg(long, default_value = "operator request")]
        reason: String,
        /// Reboot right away.
        #[arg(long)]
        reboot: bool,
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
    match args.cmd {
        SlotCmd::Status { json } => {
            let st = u.status()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                print!("{}", render_status(&st));
            }
        }
        SlotCmd::Activate { slot } => {
            let s = match slot {
                Some(s) => {
                    u.activate_slot(s)?;
                    s
                }
                None => u.activate()?,
            };
            println!("slot {s} will be tried on the next boot");
        }
        SlotCmd::Confirm { json } => {
            let r = u.confirm();
            match &r {
                Ok(rep) if json => println!("{}", serde_json::to_string_pretty(rep)?),
                Ok(rep) => {
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
                }
                Err(_) => {}
            }
            r.context("slot confirm")?;
        }
        SlotCmd::Rollback {
            reason,
            reboot: now,
        } => {
            let to = u.rollback(&reason)?;
            println!("slot {to} boots next");
            if now {
                reboot()?;
            }
        }
        SlotCmd::MarkBad { slot, reason } => {
            u.mark_bad(slot, &reason)?;
            println!("slot {slot} marked bad");
        }
    }
    Ok(())
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
fn outcome_name(o: &libupgrade::assess::Outcome) -> String {
    match serde_json::to_value(o) {
        Ok(v) => v["kind"].as_str().unwrap_or("unknown").to_string(),
        Err(_) => format!("{o:?}"),
    }
}

/// The human status view.
pub fn render_status(st: &Status) -> String {
    let mut out = String::new();
    let booted = st
        .booted
        .map(|s| s.to_string())
        .unwrap_or_else(|| "unknown".into());
    out.push_str(&format!(
        "=== System Info ===\nBootloader: {}\nLayout:     {}\nBooted:     slot {booted}\nNext boot:  slot {}\nLoader reads: {}\n",
        st.bootloader, st.layout, st.next_boot, st.loader_integrity.in_use
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
    out.push_str("\n=== Slot States ===\n");
    for s in &st.slots {
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
        if let Some(d) = &s.last_decision {
            out.push_str(&format!(
                "      last:       {} {}: {}\n",
                event_name(d.event),
                ago(d.at),
                d.why
            ));
        }
    }
    out
}

/// Sync and reboot: the `reboot` command if there is one (a clean shutdown), else the syscall.
pub fn reboot() -> anyhow::Result<()> {
    nix::unistd::sync();
    let clean = std::process::Command::new("reboot").status();
    if matches!(clean, Ok(s) if s.success()) {
        return Ok(());
    }
    nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_AUTOBOOT).context("reboot(2)")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use libupgrade::state::Event;

    #[test]
    fn events_read_the_same_in_both_views() {
        assert_eq!(event_name(Event::MarkedBad), "marked-bad");
        assert_eq!(event_name(Event::HealthFailed), "health-failed");
        assert_eq!(event_name(Event::FallbackTaken), "fallback-taken");
    }
}
