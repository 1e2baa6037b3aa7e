//! What a waiting decision says: the phase, the message and the Event of every
//! [`Action`] that holds the update back (paused, a withdrawn target, a wave, the window, the
//! slots, a gate, a back-off, the thin-link settings). Pure; the controller publishes the `Report` once.

use chrono::{DateTime, Utc};

use super::decide::Action;
use crate::agent::cluster::publish::{Report, Say};
use crate::agent::phase::Phase;

/// Paused (by failures or by the spec): `message`, and `event` once per text.
fn paused(message: String, event: Say) -> Report {
    Report {
        phase: Phase::Paused,
        message,
        event: Some(event.once()),
    }
}

/// The report of a waiting `action` decided at `now`, or `None` when `action` does not wait
/// (or waits quietly, like a stage back-off).
pub(in crate::agent) fn report(action: &Action, now: DateTime<Utc>) -> Option<Report> {
    let r = match action {
        Action::Paused { version } => paused(
            format!("claims paused: too many failures of {version}"),
            Say::warn(
                "Paused",
                format!("not updating to {version}: the channel is paused after failures"),
            ),
        ),
        Action::PausedBySpec { version } => paused(
            format!("{version} staged; claims paused by spec.paused"),
            Say::info(
                "Paused",
                format!("not updating to {version}: spec.paused is true"),
            ),
        ),
        Action::WaitForWave {
            version,
            admitted,
            waves,
        } => Report::waiting(
            Phase::WaitingForWave,
            "WaitingForWave",
            wave_message(version, *admitted, *waves),
        ),
        // The poller's condition `WaitingForWave` says it on the channel; the node says it on
        // its Node (once per text).
        Action::WaitForChannelWave { why, .. } => {
            Report::waiting(Phase::WaitingForWave, "WaitingForWave", why.clone())
        }
        Action::WaitForWindow { next } => {
            let msg = match next {
                Some(t) => format!("staged; waiting for the window starting {t}"),
                None => "staged; the window is too short for drain timeout + reboot timeout".into(),
            };
            Report::waiting(Phase::WaitingForWindow, "WaitingForWindow", msg)
        }
        Action::WaitForSlot { holders } => Report::waiting(
            Phase::WaitingForSlot,
            "WaitingForSlot",
            format!("all slots taken by {}", holders.join(", ")),
        ),
        Action::WaitForGate { version, why } => Report::waiting(
            Phase::WaitingForGate,
            "ClaimBlocked",
            format!("{version} staged; not claiming: {why}"),
        ),
        // The channel's one `ReleaseWithdrawn` Event is the poller's (when its condition
        // turns True, `agent/cluster/rollout_status.rs`); each node only says it on its Node.
        Action::Withdrawn { version } => Report {
            phase: Phase::Paused,
            message: format!("{version} was withdrawn by the channel: not staging or claiming it"),
            event: None,
        },
        Action::ClaimBackingOff { until } => Report {
            phase: Phase::BackingOff,
            message: format!(
                "the last update attempt was aborted; next claim in {}s",
                (until.timestamp() - now.timestamp()).max(0)
            ),
            event: None,
        },
        Action::StageWaiting {
            version,
            why,
            until,
        } => Report::waiting(
            Phase::StageWaiting,
            "StageWaiting",
            format!("staging {version} waits: {}", why.message(*until)),
        ),
        _ => return None,
    };
    Some(r)
}

fn wave_message(version: &str, admitted: u32, waves: u32) -> String {
    if waves == 0 {
        format!("{version} staged; waiting for its wave (only the canaries may update so far)")
    } else {
        format!(
            "{version} staged; waiting for its wave (waves 1 to {admitted} of {waves} may update)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::channel::thin::Waiting;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    #[test]
    fn full_slots_name_their_holders_once_per_text() {
        let r = report(
            &Action::WaitForSlot {
                holders: vec!["a".into(), "b".into()],
            },
            at(0),
        )
        .unwrap();
        assert_eq!(r.phase, Phase::WaitingForSlot);
        assert_eq!(r.message, "all slots taken by a, b");
        let e = r.event.unwrap();
        assert_eq!(
            (e.reason, e.once, e.warning),
            ("WaitingForSlot", true, false)
        );
    }

    #[test]
    fn a_closed_gate_is_named() {
        let r = report(
            &Action::WaitForGate {
                version: "v2".into(),
                why: "pod x blocks".into(),
            },
            at(0),
        )
        .unwrap();
        assert_eq!(r.phase, Phase::WaitingForGate);
        assert_eq!(r.message, "v2 staged; not claiming: pod x blocks");
        assert_eq!(r.event.unwrap().reason, "ClaimBlocked");
    }

    #[test]
    fn a_claim_back_off_counts_the_seconds_left_without_an_event() {
        let r = report(&Action::ClaimBackingOff { until: at(300) }, at(100)).unwrap();
        assert_eq!(r.phase, Phase::BackingOff);
        assert_eq!(
            r.message,
            "the last update attempt was aborted; next claim in 200s"
        );
        assert_eq!(r.event, None);
    }

    #[test]
    fn a_stage_held_back_by_the_thin_link_says_until_when() {
        let r = report(
            &Action::StageWaiting {
                version: "v2".into(),
                why: Waiting::OutsideWindows,
                until: at(60),
            },
            at(0),
        )
        .unwrap();
        assert_eq!(r.phase, Phase::StageWaiting);
        assert!(r
            .message
            .starts_with("staging v2 waits: outside the stage windows"));
        assert_eq!(r.event.unwrap().reason, "StageWaiting");
        assert_eq!(
            report(&Action::StageBackingOff { until: at(9) }, at(0)),
            None
        );
    }
}
