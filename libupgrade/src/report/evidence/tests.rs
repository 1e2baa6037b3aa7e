//! The pure decisions of the module root: which bundle an assessment calls for, what survives
//! a boot that never reached userspace, a failed confirm's attempt, the status lines.

use super::*;
use crate::state::{FailedRelease, SlotRecord, Verdict};

fn state(booted_state: SlotState, failed_attempts: Option<u32>) -> State {
    let mut st = State::default();
    let rec = SlotRecord {
        state: booted_state,
        version: Some("v2".into()),
        generation: Some(6),
        ..st.slot(Slot::B).clone()
    };
    st.slots.insert(Slot::B, rec);
    if let Some(n) = failed_attempts {
        st.failed.push(FailedRelease {
            version: "v2".into(),
            generation: Some(6),
            attempts: n,
            at: 1,
            why: "why".into(),
        });
    }
    st
}

fn assessment(st: State, outcome: Outcome, other: Option<OtherSlot>) -> Assessment {
    Assessment {
        verdict: Verdict {
            boot_id: "b".into(),
            slot: Slot::B,
            version: Some("v2".into()),
            outcome,
            reason: "health check 20-kubelet failed".into(),
            other_slot: other,
            checks: Vec::new(),
            loader_damage: Vec::new(),
        },
        state: st,
        effects: Vec::new(),
    }
}

const NONE_KEPT: &dyn Fn(&str, u64, u32) -> bool = &|_, _, _| false;

#[test]
fn a_rollback_calls_for_the_booted_slots_bundle_of_its_attempt() {
    let a = assessment(
        state(SlotState::Bad, Some(2)),
        Outcome::RolledBack { to: Slot::A },
        None,
    );
    let (at, no_userspace) = wanted(&a, Slot::B, Assessed::Checks, NONE_KEPT).unwrap();
    assert!(!no_userspace);
    assert_eq!(
        (at.version.as_str(), at.generation, at.attempt, at.slot),
        ("v2", 6, 2, Slot::B)
    );
    assert_eq!(at.failure, Failure::HealthCheck);
    let (at, _) = wanted(&a, Slot::B, Assessed::AwaitedTimeout, NONE_KEPT).unwrap();
    assert_eq!(at.failure, Failure::AwaitedTimeout);
    // Blessed, pending, unhealthy without a rollback: none.
    for o in [Outcome::Blessed, Outcome::Good, Outcome::Unhealthy] {
        let a = assessment(state(SlotState::Good, None), o, None);
        assert!(wanted(&a, Slot::B, Assessed::Checks, NONE_KEPT).is_none());
    }
}

#[test]
fn a_fallback_without_a_kept_bundle_calls_for_a_no_userspace_one() {
    let fell = OtherSlot::FallbackTaken {
        slot: Slot::B,
        used: 3,
        tries: 3,
    };
    let a = assessment(
        state(SlotState::Bad, Some(1)),
        Outcome::Good,
        Some(fell.clone()),
    );
    let (at, no_userspace) = wanted(&a, Slot::A, Assessed::Checks, NONE_KEPT).unwrap();
    assert!(no_userspace);
    assert_eq!(
        (at.slot, at.attempt, at.failure),
        (Slot::B, 1, Failure::NoUserspace)
    );
    // The failing slot kept one for this attempt (its confirm failed): none more.
    let kept: &dyn Fn(&str, u64, u32) -> bool = &|v, g, n| (v, g, n) == ("v2", 6, 1);
    assert!(wanted(&a, Slot::A, Assessed::Checks, kept).is_none());

    let verity = VerityFailure {
        slot: Slot::B,
        reason: "veritysetup open: verification failed".into(),
    };
    let pstore = vec![Piece {
        name: "pstore/dmesg-efi-1".into(),
        text: "Kernel panic".into(),
    }];
    let s = survived(Some(&fell), Some(&verity), pstore);
    let names: Vec<&str> = s.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "loader/tries",
            "initramfs/verity-failure",
            "pstore/dmesg-efi-1"
        ]
    );
    assert!(
        s[0].text.contains("after 3 of 3 boot tries"),
        "{}",
        s[0].text
    );
    let other = VerityFailure {
        slot: Slot::A,
        ..verity
    };
    assert_eq!(survived(Some(&fell), Some(&other), Vec::new()).len(), 1);
}

#[test]
fn a_failed_confirm_on_trial_is_the_next_attempt() {
    let err = Error::Usage("loader write failed".into());
    let at = confirm_attempt(&state(SlotState::Trying, Some(1)), Slot::B, &err).unwrap();
    assert_eq!((at.attempt, at.failure), (2, Failure::Confirm));
    assert!(at.why.starts_with("confirm failed: "), "{}", at.why);
    assert_eq!(
        confirm_attempt(&state(SlotState::Trying, None), Slot::B, &err)
            .unwrap()
            .attempt,
        1
    );
    assert!(confirm_attempt(&state(SlotState::Good, None), Slot::B, &err).is_none());
}

#[test]
fn status_lines_say_what_became_of_each_bundle() {
    let e = |delivery| KeptBundle {
        file: "g6-a1-v2.bundle".into(),
        version: "v2".into(),
        generation: 6,
        attempt: 1,
        failure: Failure::HealthCheck,
        at: 0,
        bytes: 4242,
        delivery,
    };
    assert_eq!(
        status_line(&e(BundleDelivery::Waiting)),
        "failure bundle: v2 (generation 6) attempt 1, health check failed, 4242 bytes: waiting to be sent"
    );
    assert!(status_line(&e(BundleDelivery::Sent {
        at: 1_765_126_800,
        status: 201
    }))
    .ends_with("sent 2025-12-07T17:00:00Z (201 Created)"));
    let aside = status_line(&e(BundleDelivery::SetAside {
        status: 403,
        reason: "node not enrolled".into(),
        tries: 1,
        next_at: 0,
    }));
    assert!(
        aside.contains("refused (403 Forbidden: node not enrolled), 1 of 3 tries"),
        "{aside}"
    );
    let gone = status_line(&e(BundleDelivery::Refused {
        status: 413,
        reason: "too large".into(),
    }));
    assert!(
        gone.ends_with("refused for good (413 Payload Too Large: too large)"),
        "{gone}"
    );
}
