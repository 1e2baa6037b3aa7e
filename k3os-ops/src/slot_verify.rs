//! `k3os-ops slot verify [--no-repair] [--json]`: the dm-verity scrub of both slots
//! (`Updater::verify_slots`), one line per slot. Exits non-zero when a slot holds damage FEC
//! could not correct (the slot that is not booted is then marked bad, so no fallback lands on
//! it); a slot without dm-verity is reported as not read, which is no failure.

use libupgrade::{SlotScrub, Updater};

/// The line `slot verify` prints for one slot.
pub fn line(s: &SlotScrub) -> String {
    let who = format!(
        "slot {} ({}{})",
        s.slot,
        s.version.as_deref().unwrap_or("no release").escape_debug(),
        if s.booted { ", booted" } else { "" }
    );
    let Some(o) = &s.outcome else {
        return format!("{who}: not read: {}", s.skipped.as_deref().unwrap_or("-"));
    };
    let mut parts = Vec::new();
    if o.repaired > 0 {
        parts.push(format!("{} blocks repaired from FEC", o.repaired));
    }
    if o.fec_rewritten {
        parts.push("FEC area rewritten".into());
    } else if o.fec_damaged {
        parts.push("FEC area damaged".into());
    }
    if o.damaged > 0 || o.unverified > 0 {
        parts.push(format!(
            "{} blocks damaged beyond FEC (first {:?}), {} unverifiable",
            o.damaged, o.first_damaged, o.unverified
        ));
    }
    if let Some(why) = &s.skipped {
        parts.push(why.clone());
    }
    if s.marked_bad {
        parts.push("marked bad: never booted until staged anew".into());
    } else if s.booted && !s.clean() {
        parts.push(
            "booted: not written (the kernel's dm-verity corrects or fails each read)".into(),
        );
    }
    if parts.is_empty() {
        parts.push("every block verifies".into());
    }
    format!("{who}: {}", parts.join("; "))
}

/// Scrub both slots, print, and fail when damage is left.
pub fn run(u: &Updater, json: bool, repair: bool) -> anyhow::Result<()> {
    let slots = u.verify_slots(repair)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&slots)?);
    } else {
        for s in &slots {
            println!("{}", line(s));
        }
    }
    let left: Vec<String> = slots
        .iter()
        .filter(|s| !s.clean())
        .map(|s| s.slot.to_string())
        .collect();
    if !left.is_empty() {
        anyhow::bail!(
            "slot verify: dm-verity damage beyond FEC in slot {}",
            left.join(" and ")
        );
    }
    Ok(())
}
