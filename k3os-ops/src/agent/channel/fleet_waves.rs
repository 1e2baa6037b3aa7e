//! The channel's fleet rollouts as one cluster takes part in them (pure).
//!
//! A channel's signed metadata may roll each release out over many independent clusters in
//! waves, pause it or withdraw it (libupgrade's `rollout`). Inside a cluster the agents must
//! agree: if every node resolved with its own seed, the nodes of one cluster would be offered
//! a release hours apart and the in-cluster rollout (`spec.rollout`, `concurrency`, canaries)
//! would order only the nodes the fleet wave happened to reach. So every agent resolves every
//! channel with one seed per cluster, [`cluster_seed`], and the channel-level wave admits the
//! cluster as a whole; the in-cluster rollout then orders the nodes.
//!
//! **Why the UpdateChannel's UID and not the `kube-system` namespace's.** Both are stable
//! identifiers every agent of the cluster reads alike. The channel's UID is in the object the
//! agent already reads (no extra request, no cluster-wide read right to add to the agent's
//! RBAC and node-scope policies) and is the same for every node the channel selects, which is
//! what has to agree. Its cost: deleting and recreating the `UpdateChannel` (not editing it)
//! gives it a new UID and the cluster a new place in the waves, as re-imaging a single node
//! draws it a new seed; the seed in use is shown in `status.fleetRollout.clusterSeed`. Two
//! channels of one cluster (different node selectors) are placed independently, which is the
//! same as two clusters.
//!
//! What the status says ([`apply`]): `status.fleetRollout` (the seed, the withdrawn releases,
//! the withdrawn release the cluster was updating to), the condition `WaitingForWave` while a
//! newer release than `latestVersion` is held back (its reason names the hold: the wave, a
//! pause, a required stop; its message the time the wave reaches this cluster in RFC 3339),
//! removed when nothing newer waits, and the condition `ReleaseWithdrawn` while the release
//! the cluster was updating to is withdrawn. A channel that pins `spec.version` is published by
//! the same poller with the rules of [`super::fleet_pinned`].

use chrono::{DateTime, Utc};
use libupgrade::rollout::{Hold, Seed};
use libupgrade::trust::meta::time_str;

use super::crd::{
    FleetRolloutStatus, UpdateChannel, UpdateChannelStatus, COND_RELEASE_WITHDRAWN,
    COND_WAITING_FOR_WAVE,
};
use crate::agent::channel::latest::Latest;

/// The seed every agent of this cluster places the cluster by in `ch`'s fleet rollouts: derived
/// from the channel's UID (see the module docs for why), or from `namespace/name` for an
/// object without one (only objects that were never stored, e.g. in tests).
pub fn cluster_seed(ch: &UpdateChannel) -> Seed {
    match ch.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => Seed::derived_from(uid),
        _ => Seed::derived_from(&format!(
            "{}/{}",
            ch.metadata.namespace.as_deref().unwrap_or_default(),
            ch.metadata.name.as_deref().unwrap_or_default()
        )),
    }
}

/// Change `st` (as read, before `latestVersion` is replaced) to say what resolving `latest`
/// with `seed` found. Returns the note of the `ReleaseWithdrawn` Event when that condition
/// turns True by this change (one Event per withdrawal).
pub fn apply(
    st: &mut UpdateChannelStatus,
    latest: &Latest,
    seed: Seed,
    now: DateTime<Utc>,
) -> Option<String> {
    let gone = |v: &String| latest.withdraws(v);
    let hit = st
        .latest_version
        .clone()
        .filter(gone)
        .or_else(|| st.slots.iter().filter_map(|s| s.version.clone()).find(gone))
        .or_else(|| {
            st.fleet_rollout
                .as_ref()
                .and_then(|f| f.withdrawn_target.clone())
                .filter(gone)
        });
    let waiting = latest.waiting.as_ref().map(|w| {
        let message = format!(
            "{} waits: {} (cluster seed {}); the nodes stay on {}",
            w.version.escape_debug(),
            hold_text(&w.hold),
            seed.get(),
            latest.version.escape_debug()
        );
        (reason(&w.hold), message)
    });
    write_verdict(
        st,
        Verdict {
            seed,
            withdrawn: latest.withdrawn.clone(),
            withdrawn_target: hit.map(|v| {
                let note = withdrawn_message(&v, &latest.version);
                (v, note)
            }),
            held_target: None,
            waiting,
        },
        now,
    )
}

/// What one poll found, as the status says it.
pub(super) struct Verdict {
    /// The cluster's seed.
    pub seed: Seed,
    /// Every release the channel withdrew, oldest first.
    pub withdrawn: Vec<String>,
    /// The withdrawn release the cluster was updating to, and the `ReleaseWithdrawn`
    /// condition's message (its Event's note).
    pub withdrawn_target: Option<(String, String)>,
    /// The pinned release held back (`status.fleetRollout.heldTarget`).
    pub held_target: Option<String>,
    /// Why a release waits: the `WaitingForWave` condition's reason and message.
    pub waiting: Option<(&'static str, String)>,
}

/// Write `v` into `st`: `status.fleetRollout` and the conditions `ReleaseWithdrawn` and
/// `WaitingForWave` (each removed when `v` has nothing for it). Returns the note of the
/// `ReleaseWithdrawn` Event when that condition turns True by this change (one Event per
/// withdrawal). The one writer of both [`apply`] and [`super::fleet_pinned::apply`].
pub(super) fn write_verdict(
    st: &mut UpdateChannelStatus,
    v: Verdict,
    now: DateTime<Utc>,
) -> Option<String> {
    let was_withdrawn = has(st, COND_RELEASE_WITHDRAWN);
    let (hit, note) = v.withdrawn_target.unzip();
    st.fleet_rollout = Some(FleetRolloutStatus {
        cluster_seed: v.seed.get(),
        withdrawn: v.withdrawn,
        withdrawn_target: hit,
        held_target: v.held_target,
    });
    match &note {
        Some(n) => st.set_condition(
            COND_RELEASE_WITHDRAWN,
            true,
            "TargetWithdrawn",
            n.clone(),
            now,
        ),
        None => remove(st, COND_RELEASE_WITHDRAWN),
    }
    match v.waiting {
        Some((reason, message)) => {
            st.set_condition(COND_WAITING_FOR_WAVE, true, reason, message, now)
        }
        None => remove(st, COND_WAITING_FOR_WAVE),
    }
    note.filter(|_| !was_withdrawn)
}

/// The `ReleaseWithdrawn` condition's message (and its Event's note).
fn withdrawn_message(version: &str, now_offered: &str) -> String {
    format!(
        "{} was withdrawn by the channel's signed metadata: no node claims it, and a node that staged it drops it (marked bad, never activated); the newest release offered to this cluster is {}. A node already running {} keeps it: publish a newer release to move it",
        version.escape_debug(),
        now_offered.escape_debug(),
        version.escape_debug()
    )
}

/// The condition reason of a hold.
pub(super) fn reason(hold: &Hold) -> &'static str {
    match hold {
        Hold::Wave { .. } => "WaveNotStarted",
        Hold::Paused { .. } => "RolloutPaused",
        Hold::Withdrawn { .. } => "Withdrawn",
        Hold::Unreadable { .. } => "RolloutUnreadable",
        Hold::Stop { .. } | Hold::StopMissing { .. } => "RequiredStopHeld",
    }
}

/// A hold in words, its times in RFC 3339.
pub(super) fn hold_text(hold: &Hold) -> String {
    match hold {
        Hold::Wave { starts: Some(at) } => {
            format!("this cluster's wave starts at {}", time_str(at))
        }
        Hold::Wave { starts: None } => "no wave of its rollout reaches this cluster".into(),
        Hold::Paused { since } => format!("its rollout is paused since {}", time_str(since)),
        Hold::Withdrawn { at } => format!("withdrawn at {}", time_str(at)),
        Hold::Unreadable { what } => format!("its rollout data is not usable: {what}"),
        Hold::Stop { version, hold } => format!(
            "required stop {} is held: {}",
            version.escape_debug(),
            hold_text(hold)
        ),
        Hold::StopMissing {
            version,
            generation,
        } => format!(
            "required stop {} (generation {generation}) is not in the channel",
            version.escape_debug()
        ),
    }
}

pub(super) fn has(st: &UpdateChannelStatus, type_: &str) -> bool {
    st.conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

pub(super) fn remove(st: &mut UpdateChannelStatus, type_: &str) {
    st.conditions.retain(|c| c.type_ != type_);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::channel::crd::{SlotEntry, SlotPhase};
    use libupgrade::rollout::Waiting;

    fn at(h: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + h * 3600, 0).unwrap()
    }

    fn channel(uid: &str) -> UpdateChannel {
        let mut ch = UpdateChannel::test().build();
        ch.metadata.uid = Some(uid.into());
        ch
    }

    /// Two agents of one cluster read the same UpdateChannel (each its own copy, one through
    /// the watch cache, one from a fresh GET with another resourceVersion): the same seed.
    /// Another channel UID (another cluster, or the CR recreated) places it elsewhere.
    #[test]
    fn two_agents_of_one_cluster_derive_the_same_seed() {
        let a = channel("6f1c0d8e-0000-4000-8000-000000000001");
        let mut b = a.clone();
        b.metadata.resource_version = Some("42".into());
        b.status = Some(UpdateChannelStatus {
            latest_version: Some("v2".into()),
            ..Default::default()
        });
        assert_eq!(cluster_seed(&a), cluster_seed(&b));
        assert_eq!(
            cluster_seed(&a),
            Seed::derived_from("6f1c0d8e-0000-4000-8000-000000000001")
        );
        let other = channel("6f1c0d8e-0000-4000-8000-000000000002");
        assert_ne!(cluster_seed(&a), cluster_seed(&other));
    }

    fn waiting(hold: Hold) -> Latest {
        Latest {
            version: "v2".into(),
            generation: None,
            waiting: Some(Waiting {
                version: "v3".into(),
                generation: 3,
                hold,
            }),
            withdrawn: vec![],
            retries: None,
        }
    }

    #[test]
    fn a_waiting_release_sets_the_condition_with_its_start_and_it_goes_when_the_wave_starts() {
        let seed = Seed::new(4242).unwrap();
        let mut st = UpdateChannelStatus::default();
        let l = waiting(Hold::Wave {
            starts: Some(at(30)),
        });
        assert_eq!(apply(&mut st, &l, seed, at(0)), None);
        assert_eq!(st.fleet_rollout.as_ref().unwrap().cluster_seed, 4242);
        let c = &st.conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("WaitingForWave", "True", "WaveNotStarted")
        );
        assert_eq!(
            c.message,
            format!(
                "v3 waits: this cluster's wave starts at {} (cluster seed 4242); the nodes stay on v2",
                time_str(&at(30))
            )
        );
        assert!(c.message.contains("T") && c.message.contains("Z (cluster"));
        // The same again changes nothing (no write).
        let before = st.clone();
        apply(&mut st, &l, seed, at(1));
        assert_eq!(st, before);
        // A pause and a required stop say so.
        apply(
            &mut st,
            &waiting(Hold::Paused { since: at(2) }),
            seed,
            at(2),
        );
        assert_eq!(st.conditions[0].reason, "RolloutPaused");
        let stop = Hold::Stop {
            version: "v2.5".into(),
            hold: Box::new(Hold::Wave {
                starts: Some(at(40)),
            }),
        };
        apply(&mut st, &waiting(stop), seed, at(3));
        assert_eq!(st.conditions[0].reason, "RequiredStopHeld");
        assert!(st.conditions[0].message.contains(&time_str(&at(40))));
        // The wave started: v3 is offered, nothing waits, the condition is gone.
        apply(&mut st, &Latest::plain("v3"), seed, at(30));
        assert!(st.conditions.is_empty(), "{:?}", st.conditions);
    }

    #[test]
    fn a_withdrawn_target_sets_the_condition_and_one_event_until_the_channel_lifts_it() {
        let seed = Seed::new(1).unwrap();
        let mut st = UpdateChannelStatus {
            latest_version: Some("v2".into()),
            ..Default::default()
        };
        let gone = Latest {
            version: "v1".into(),
            generation: None,
            waiting: None,
            withdrawn: vec!["v2".into()],
            retries: None,
        };
        let note = apply(&mut st, &gone, seed, at(0)).expect("one Event");
        assert!(
            note.starts_with("v2 was withdrawn") && note.contains("is v1"),
            "{note}"
        );
        let f = st.fleet_rollout.clone().unwrap();
        assert_eq!(f.withdrawn, ["v2"]);
        assert_eq!(f.withdrawn_target.as_deref(), Some("v2"));
        assert!(has(&st, COND_RELEASE_WITHDRAWN));
        // The poller then writes latestVersion v1; the next polls keep the condition (the
        // target is remembered) and send no second Event.
        st.latest_version = Some("v1".into());
        assert_eq!(apply(&mut st, &gone, seed, at(1)), None);
        assert!(has(&st, COND_RELEASE_WITHDRAWN));
        // A withdrawn release nobody here targeted sets nothing.
        let mut other = UpdateChannelStatus {
            latest_version: Some("v1".into()),
            ..Default::default()
        };
        assert_eq!(apply(&mut other, &gone, seed, at(1)), None);
        assert!(other.conditions.is_empty());
        // A slot's version counts as the target.
        let mut slot = UpdateChannelStatus {
            latest_version: Some("v1".into()),
            slots: vec![SlotEntry {
                node: "n1".into(),
                token: "t".into(),
                claimed_at: at(0),
                phase: SlotPhase::Claimed,
                was_unschedulable: None,
                version: Some("v2".into()),
            }],
            ..Default::default()
        };
        assert!(apply(&mut slot, &gone, seed, at(1)).is_some());
        // The channel no longer withdraws it: the condition goes.
        apply(&mut st, &Latest::plain("v1"), seed, at(2));
        assert!(!has(&st, COND_RELEASE_WITHDRAWN));
        assert!(st.conditions.is_empty());
        assert_eq!(st.fleet_rollout.unwrap().withdrawn_target, None);
    }
}
