//! The channel's fleet rollouts on a channel that pins `spec.version`: the poller resolves the
//! pinned release (looking only, with the cluster's seed, [`super::fleet_waves::cluster_seed`]) as
//! it resolves `latest` on other channels, and [`apply`] writes the verdict the decision reads
//! (pure, like [`super::fleet_waves`]):
//!
//! - held back (its wave has not reached this cluster, its rollout is paused, or its rollout
//!   data is not usable): `status.fleetRollout.heldTarget` names it and the condition
//!   `WaitingForWave` says why, with the wave's start in RFC 3339; no node starts staging it
//!   or claims a slot for it (a wait, not a failure). Both go once it is offered.
//! - withdrawn: the condition `ReleaseWithdrawn` and its one Event; no node stages or claims
//!   it, and a node that staged it drops it (`status.fleetRollout.withdrawn` lists it).
//!
//! `status.latestVersion` is left as it is: on a pinned channel the poller never wrote it, and
//! it still does not (the `Latest` printer column is the newest release the poller resolved for
//! `latest`, which a pinned channel does not follow).

use chrono::{DateTime, Utc};
use libupgrade::rollout::{Hold, Seed};

use super::crd::UpdateChannelStatus;
use super::fleet_waves::{hold_text, reason, write_verdict, Verdict};
use crate::agent::channel::pinned::Pinned;

/// Change `st` to say what resolving the pinned release with `seed` found. Returns the note of
/// the `ReleaseWithdrawn` Event when that condition turns True by this change.
pub fn apply(
    st: &mut UpdateChannelStatus,
    pinned: &Pinned,
    seed: Seed,
    now: DateTime<Utc>,
) -> Option<String> {
    let v = &pinned.version;
    let gone = |x: &String| pinned.withdrawn.contains(x);
    let hit = Some(v.clone())
        .filter(gone)
        .or_else(|| st.slots.iter().filter_map(|s| s.version.clone()).find(gone));
    let held = pinned
        .hold
        .as_ref()
        .filter(|h| !matches!(h, Hold::Withdrawn { .. }));
    write_verdict(
        st,
        Verdict {
            seed,
            withdrawn: pinned.withdrawn.clone(),
            withdrawn_target: hit.map(|t| {
                let note = withdrawn_message(&t, v);
                (t, note)
            }),
            held_target: held.map(|_| v.clone()),
            waiting: held.map(|h| (reason(h), waiting_message(v, h, seed))),
        },
        now,
    )
}

/// The `WaitingForWave` condition's message for the pinned `version` held back by `hold` from
/// the cluster placed at `seed`; also what a node that found the hold itself says.
pub fn waiting_message(version: &str, hold: &Hold, seed: Seed) -> String {
    format!(
        "{} (spec.version) waits: {} (cluster seed {}); no node of this cluster starts staging it or claims a slot for it before",
        version.escape_debug(),
        hold_text(hold),
        seed.get()
    )
}

/// The `ReleaseWithdrawn` condition's message (and its Event's note) for the withdrawn
/// `version` on a channel pinned to `pinned`.
fn withdrawn_message(version: &str, pinned: &str) -> String {
    let what = if version == pinned {
        format!("{} (spec.version)", version.escape_debug())
    } else {
        format!(
            "{} (held in a slot; spec.version pins {})",
            version.escape_debug(),
            pinned.escape_debug()
        )
    };
    format!(
        "{what} was withdrawn by the channel's signed metadata: no node stages or claims it, and a node that staged it drops it (marked bad, never activated). A node already running {} keeps it: pin another release (or follow latest) to move it",
        version.escape_debug()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::channel::crd::{
        SlotEntry, SlotPhase, COND_RELEASE_WITHDRAWN, COND_WAITING_FOR_WAVE,
    };
    use crate::agent::channel::fleet_waves::has;
    use libupgrade::trust::meta::time_str;

    fn at(h: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + h * 3600, 0).unwrap()
    }

    fn held(hold: Hold) -> Pinned {
        let withdrawn = match hold {
            Hold::Withdrawn { .. } => vec!["v3".into()],
            _ => Vec::new(),
        };
        Pinned {
            version: "v3".into(),
            hold: Some(hold),
            withdrawn,
        }
    }

    #[test]
    fn a_held_pin_names_itself_and_its_wave_start_until_it_is_offered() {
        let seed = Seed::new(4242).unwrap();
        let mut st = UpdateChannelStatus::default();
        let wave = held(Hold::Wave {
            starts: Some(at(30)),
        });
        assert_eq!(apply(&mut st, &wave, seed, at(0)), None);
        let f = st.fleet_rollout.clone().unwrap();
        assert_eq!(
            (f.cluster_seed, f.held_target.as_deref()),
            (4242, Some("v3"))
        );
        let c = &st.conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("WaitingForWave", "True", "WaveNotStarted")
        );
        assert_eq!(
            c.message,
            format!(
                "v3 (spec.version) waits: this cluster's wave starts at {} (cluster seed 4242); no node of this cluster starts staging it or claims a slot for it before",
                time_str(&at(30))
            )
        );
        // The same again changes nothing (no write).
        let before = st.clone();
        apply(&mut st, &wave, seed, at(1));
        assert_eq!(st, before);
        // A pause says so; unusable rollout data holds it too.
        apply(&mut st, &held(Hold::Paused { since: at(2) }), seed, at(2));
        assert_eq!(st.conditions[0].reason, "RolloutPaused");
        let bad = Hold::Unreadable {
            what: "wave 2 starts before wave 1".into(),
        };
        apply(&mut st, &held(bad), seed, at(3));
        assert_eq!(st.conditions[0].reason, "RolloutUnreadable");
        assert_eq!(
            st.fleet_rollout.as_ref().unwrap().held_target.as_deref(),
            Some("v3")
        );
        // The wave started: offered, nothing held, the condition gone.
        apply(&mut st, &Pinned::offered("v3"), seed, at(30));
        assert!(st.conditions.is_empty(), "{:?}", st.conditions);
        assert_eq!(st.fleet_rollout.unwrap().held_target, None);
    }

    #[test]
    fn a_withdrawn_pin_sets_the_condition_and_one_event_until_the_channel_lifts_it() {
        let seed = Seed::new(7).unwrap();
        let mut st = UpdateChannelStatus::default();
        let gone = held(Hold::Withdrawn { at: at(0) });
        let note = apply(&mut st, &gone, seed, at(1)).expect("one Event");
        assert!(
            note.starts_with("v3 (spec.version) was withdrawn by the channel's signed metadata"),
            "{note}"
        );
        let f = st.fleet_rollout.clone().unwrap();
        assert_eq!(f.withdrawn, ["v3"]);
        assert_eq!(f.withdrawn_target.as_deref(), Some("v3"));
        assert_eq!(f.held_target, None, "withdrawn is not waiting");
        assert!(has(&st, COND_RELEASE_WITHDRAWN));
        assert!(!has(&st, COND_WAITING_FOR_WAVE));
        // The next polls keep it and send no second Event.
        assert_eq!(apply(&mut st, &gone, seed, at(2)), None);
        assert!(has(&st, COND_RELEASE_WITHDRAWN));
        // The channel lifts the withdrawal (re-publishes it without one): offered, it goes.
        apply(&mut st, &Pinned::offered("v3"), seed, at(3));
        assert!(st.conditions.is_empty(), "{:?}", st.conditions);
        let f = st.fleet_rollout.unwrap();
        assert!(f.withdrawn.is_empty() && f.withdrawn_target.is_none());
    }

    #[test]
    fn a_refusal_publishes_the_withdrawn_list_it_carries() {
        let seed = Seed::new(7).unwrap();
        let mut st = UpdateChannelStatus::default();
        let offered = Pinned {
            withdrawn: vec!["v1".into(), "v4".into()],
            ..Pinned::offered("v2")
        };
        apply(&mut st, &offered, seed, at(0));
        // Pinned to v3 now, which waits: libupgrade's refusal lists what the channel withdraws
        // now (v4 was put back, v1 still withdrawn), published as it is.
        let wave = Pinned {
            withdrawn: vec!["v1".into()],
            ..held(Hold::Wave {
                starts: Some(at(5)),
            })
        };
        apply(&mut st, &wave, seed, at(1));
        assert_eq!(st.fleet_rollout.as_ref().unwrap().withdrawn, ["v1"]);
        // A slot held for a withdrawn release counts as the target.
        st.slots.push(SlotEntry {
            node: "n1".into(),
            token: "t".into(),
            claimed_at: at(0),
            phase: SlotPhase::Claimed,
            was_unschedulable: None,
            version: Some("v1".into()),
        });
        let note = apply(&mut st, &wave, seed, at(2)).expect("one Event");
        assert!(
            note.starts_with("v1 (held in a slot; spec.version pins v3)"),
            "{note}"
        );
    }
}
