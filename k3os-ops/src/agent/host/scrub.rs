//! The agent's scheduled dm-verity scrub (issue 34 item 5): every `--scrub-hours` (24 by
//! default; 0 never) the agent runs `slot verify`'s scrub on its node
//! ([`libupgrade::Updater::verify_slots`], repairing the slot that is not booted and marking it
//! bad when FEC cannot), logs one line per slot and publishes one Event when something was
//! found: `SlotRepaired` (normal) or `SlotDamaged` (warning). A fixed interval rather than a
//! field of the UpdateChannel: the scrub is a property of the node's disks, not of a channel,
//! and needs no CRD change. The first scrub runs one interval after the agent starts (a boot
//! already read what it runs). The scrub and the agent's own slot writes (stage, activation,
//! dropping a withdrawn release) take one lock (the real node's, [`super::node::LibupgradeNode`]),
//! so they never overlap in this process. Here: what a scrub's result says; the loop that asks
//! the node for it through [`super::ops::NodeOps`] is the agent's (`run::scrub_loop`).

use libupgrade::SlotScrub;

/// The Event a scrub's result calls for: (warning, reason, note), or none when every slot
/// read was clean and nothing was repaired.
pub fn note(slots: &[SlotScrub]) -> Option<(bool, &'static str, String)> {
    let lines: Vec<String> = slots
        .iter()
        .filter(|s| s.outcome.is_some())
        .map(crate::slot_verify::line)
        .collect();
    let damaged = slots.iter().any(|s| !s.clean());
    let repaired = slots.iter().any(|s| {
        s.outcome
            .as_ref()
            .is_some_and(|o| o.repaired > 0 || o.fec_rewritten)
    });
    match (damaged, repaired) {
        (true, _) => Some((true, "SlotDamaged", lines.join("; "))),
        (false, true) => Some((false, "SlotRepaired", lines.join("; "))),
        (false, false) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libupgrade::{ScrubSummary, Slot};

    fn slot(slot: Slot, outcome: Option<ScrubSummary>, marked_bad: bool) -> SlotScrub {
        SlotScrub {
            slot,
            version: Some("v2".into()),
            booted: slot == Slot::A,
            skipped: outcome
                .is_none()
                .then(|| "its release was made without dm-verity".into()),
            outcome,
            marked_bad,
        }
    }

    #[test]
    fn an_event_only_when_something_was_repaired_or_is_damaged() {
        let clean = ScrubSummary::default();
        assert_eq!(
            note(&[
                slot(Slot::A, None, false),
                slot(Slot::B, Some(clean.clone()), false)
            ]),
            None
        );
        let repaired = ScrubSummary {
            repaired: 2,
            ..clean.clone()
        };
        let (warning, reason, text) = note(&[slot(Slot::B, Some(repaired), false)]).unwrap();
        assert_eq!((warning, reason), (false, "SlotRepaired"));
        assert_eq!(text, "slot B (v2): 2 blocks repaired from FEC");
        let rotten = ScrubSummary {
            damaged: 3,
            first_damaged: vec![1, 5, 9],
            ..clean
        };
        let (warning, reason, text) = note(&[slot(Slot::B, Some(rotten), true)]).unwrap();
        assert_eq!((warning, reason), (true, "SlotDamaged"));
        assert!(
            text.contains("3 blocks damaged beyond FEC (first [1, 5, 9])")
                && text.ends_with("marked bad: never booted until staged anew"),
            "{text}"
        );
    }
}
