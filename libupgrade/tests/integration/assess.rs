//! Property tests of the pure boot-assessment core (`libupgrade::assess`) over all its
//! inputs: slot states, pending activation, boot ids, the loader's view and the integrity of
//! its records, and the health results.

use bootconfig::{BootEnv, Damage, Integrity, Slot, SlotBoot};
use libupgrade::health::CheckResult;
use libupgrade::state::SlotState;
use libupgrade::state::{Activation, AwaitedChecks};
use libupgrade::state::{Event, State};
use libupgrade::state::{OtherSlot, Outcome};
use libupgrade::{assess, Effect, LoaderOp, LoaderView, ObservedBoot};
use proptest::prelude::*;

fn slot() -> impl Strategy<Value = Slot> {
    prop_oneof![Just(Slot::A), Just(Slot::B)]
}

fn slot_state() -> impl Strategy<Value = SlotState> {
    prop_oneof![
        Just(SlotState::Empty),
        Just(SlotState::Invalid),
        Just(SlotState::Staged),
        Just(SlotState::Trying),
        Just(SlotState::Good),
        Just(SlotState::Bad),
    ]
}

fn slot_boot() -> impl Strategy<Value = SlotBoot> {
    prop_oneof![
        Just(SlotBoot::Good),
        Just(SlotBoot::Bad),
        (0u8..=3).prop_map(|t| SlotBoot::Trying { tries_left: t }),
    ]
}

fn boot_id() -> impl Strategy<Value = String> {
    prop_oneof![Just("earlier".to_string()), Just("now".to_string())]
}

#[derive(Debug, Clone)]
struct Input {
    state: State,
    loader: LoaderView,
    boot: ObservedBoot,
    checks: Vec<CheckResult>,
}

fn input() -> impl Strategy<Value = Input> {
    (
        (slot_state(), slot_state()),
        proptest::option::of((
            slot(),
            boot_id(),
            1u8..=3,
            proptest::option::of(proptest::sample::subsequence(
                vec!["c0", "c1", "node-ready"],
                1..=2,
            )),
        )),
        proptest::option::of(boot_id()),
        (slot(), slot_boot(), slot_boot(), any::<bool>()),
        slot(),
        proptest::collection::vec(any::<bool>(), 0..4),
    )
        .prop_map(
            |((sa, sb), act, last, (primary, ba, bb, damaged), booted, oks)| {
                let mut state = State::default();
                for (s, st) in [(Slot::A, sa), (Slot::B, sb)] {
                    let r = state.slot_mut(s);
                    r.state = st;
                    r.version = Some(format!("v-{s}"));
                    r.since = 1;
                }
                state.activation = act.map(|(slot, boot_id, tries, awaits)| Activation {
                    slot,
                    boot_id,
                    tries,
                    at: 1,
                    awaits: awaits.map(|names| AwaitedChecks {
                        names: names.into_iter().map(String::from).collect(),
                        within_secs: 600,
                    }),
                });
                state.last_boot_id = last;
                let integrity = Integrity {
                    in_use: "copy 1".into(),
                    damaged: if damaged {
                        vec![Damage {
                            record: "copy 2".into(),
                            path: "/boot/grub/k3os/env2".into(),
                            what: "damaged".into(),
                        }]
                    } else {
                        vec![]
                    },
                };
                Input {
                    state,
                    loader: LoaderView {
                        name: "grub".into(),
                        env: BootEnv {
                            primary,
                            a: ba,
                            b: bb,
                        },
                        integrity,
                    },
                    boot: ObservedBoot {
                        slot: booted,
                        boot_id: "now".into(),
                        verity_failure: None,
                    },
                    checks: oks
                        .into_iter()
                        .enumerate()
                        .map(|(i, ok)| CheckResult {
                            name: format!("c{i}"),
                            ok,
                            detail: if ok { "fine".into() } else { "down".into() },
                        })
                        .collect(),
                }
            },
        )
}

fn loader_ops(effects: &[Effect]) -> Vec<LoaderOp> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Loader { op, .. } => Some(*op),
            _ => None,
        })
        .collect()
}

/// What the loader looks like after the ops (the rules every backend follows).
fn apply(view: &LoaderView, ops: &[LoaderOp]) -> LoaderView {
    let mut v = view.clone();
    for op in ops {
        match *op {
            LoaderOp::MarkGood(s) => {
                v.env.primary = s;
                v.env.set(s, SlotBoot::Good);
            }
            LoaderOp::MarkBad(s) => v.env.set(s, SlotBoot::Bad),
        }
        v.integrity.damaged.clear();
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn assess_follows_its_rules(i in input()) {
        let a = assess(&i.state, &i.loader, &i.boot, &i.checks).unwrap();
        let booted = i.boot.slot;
        let other = booted.other();
        let before = i.state.slot(booted).state;
        let all_ok = i.checks.iter().all(|c| c.ok);
        let ops = loader_ops(&a.effects);
        let after = a.state.slot(booted).state;

        // Not assessable: empty/invalid content is never blessed nor rolled back.
        if matches!(before, SlotState::Empty | SlotState::Invalid) {
            prop_assert_eq!(&a.verdict.outcome, &Outcome::NotAssessable { state: before });
            prop_assert!(!ops.contains(&LoaderOp::MarkGood(booted)));
        }
        // Checks the booted slot's activation awaits from its caller and that were not
        // reported (only while it is not blessed).
        let missing: Vec<String> = match &i.state.activation {
            Some(act) if act.slot == booted && before != SlotState::Good => act
                .awaits
                .iter()
                .flat_map(|w| w.names.iter())
                .filter(|n| !i.checks.iter().any(|c| &c.name == *n))
                .cloned()
                .collect(),
            _ => vec![],
        };
        // The single bless point: blessed iff every check passed on an unblessed, complete slot
        // and every awaited check was among them.
        let complete = matches!(before, SlotState::Staged | SlotState::Trying | SlotState::Bad);
        prop_assert_eq!(
            a.verdict.outcome == Outcome::Blessed,
            all_ok && complete && missing.is_empty()
        );
        // Awaited checks not reported: on trial still, the loader untouched for this slot; a
        // failure of a reported check is decisive at once.
        let pending = matches!(a.verdict.outcome, Outcome::Pending { .. });
        prop_assert_eq!(pending, all_ok && complete && !missing.is_empty());
        if let Outcome::Pending { waiting_for, .. } = &a.verdict.outcome {
            prop_assert_eq!(waiting_for, &missing);
            prop_assert_eq!(after, before);
            prop_assert!(!ops.contains(&LoaderOp::MarkGood(booted)));
            prop_assert!(!ops.contains(&LoaderOp::MarkBad(booted)));
        }
        if a.verdict.outcome == Outcome::Blessed {
            prop_assert_eq!(after, SlotState::Good);
            let g = a.effects.iter().position(|e| matches!(e, Effect::Loader { op: LoaderOp::MarkGood(s), .. } if *s == booted));
            let s = a.effects.iter().rposition(|e| matches!(e, Effect::SaveState { .. }));
            prop_assert!(g.is_some() && s.is_some() && g < s, "loader good before state good: {:?}", a.effects);
        }
        // A failed check never blesses; after a bless nothing rolls back.
        if !all_ok {
            prop_assert!(!ops.contains(&LoaderOp::MarkGood(booted)));
            prop_assert!(after != SlotState::Good || before == SlotState::Good);
        }
        if before == SlotState::Good {
            prop_assert!(!ops.contains(&LoaderOp::MarkBad(booted)));
            prop_assert_eq!(after, SlotState::Good);
        }
        // Rollback only before the bless, only to a good slot, good first.
        if let Outcome::RolledBack { to } = a.verdict.outcome {
            prop_assert_eq!(to, other);
            prop_assert!(!all_ok && before != SlotState::Good);
            prop_assert_eq!(i.state.slot(other).state, SlotState::Good);
            let already = before == SlotState::Bad
                && i.loader.env.get(booted) == SlotBoot::Bad
                && i.loader.env.next_boot() == other;
            let mut want: Vec<_> = ops.iter().copied().filter(|o| *o == LoaderOp::MarkBad(other)).collect();
            if !already {
                want.extend([LoaderOp::MarkGood(other), LoaderOp::MarkBad(booted)]);
            }
            prop_assert_eq!(ops.clone(), want);
            prop_assert_eq!(after, SlotState::Bad);
        } else {
            prop_assert!(!ops.contains(&LoaderOp::MarkBad(booted)));
        }
        // Every health result is considered: with all of them passing nothing is marked bad but
        // a spent trial of the other slot.
        if all_ok {
            prop_assert!(ops.iter().all(|o| *o != LoaderOp::MarkBad(booted)));
        }
        // A fallback is recognised exactly when the loader spent the other slot's trial in an
        // earlier boot; it is the only way the other slot is marked bad here.
        let fell_back = i.state.activation.as_ref().is_some_and(|act| {
            act.slot == other
                && act.boot_id != "now"
                && i.state.slot(other).state == SlotState::Trying
                && matches!(i.loader.env.get(other), SlotBoot::Trying { .. })
        });
        prop_assert_eq!(
            matches!(a.verdict.other_slot, Some(OtherSlot::FallbackTaken { .. })),
            fell_back
        );
        prop_assert_eq!(ops.contains(&LoaderOp::MarkBad(other)), fell_back);
        if fell_back {
            prop_assert_eq!(a.state.slot(other).state, SlotState::Bad);
        }
        // One `booted` record per boot.
        let booted_records = |s: &State| s.history.iter().filter(|d| d.event == Event::Booted).count();
        prop_assert_eq!(
            booted_records(&a.state) - booted_records(&i.state),
            usize::from(i.state.last_boot_id.as_deref() != Some("now"))
        );
        // The final state is what was saved last; nothing saved means nothing changed.
        match a.effects.iter().rev().find_map(|e| match e {
            Effect::SaveState { state, .. } => Some(state),
            _ => None,
        }) {
            Some(s) => prop_assert_eq!(s.as_ref(), &a.state),
            None => prop_assert_eq!(&a.state, &i.state),
        }
        prop_assert_eq!(a.state.verdict.as_ref(), Some(&a.verdict));
        // A rollback stands for the rest of the boot: checks that pass later change nothing.
        if matches!(a.verdict.outcome, Outcome::RolledBack { .. }) {
            let passing: Vec<CheckResult> = i
                .checks
                .iter()
                .map(|c| CheckResult { ok: true, ..c.clone() })
                .chain([CheckResult { name: "node-ready".into(), ok: true, detail: "late".into() }])
                .collect();
            let late = assess(&a.state, &apply(&i.loader, &ops), &i.boot, &passing).unwrap();
            prop_assert_eq!(&late.verdict.outcome, &a.verdict.outcome);
            prop_assert!(late.effects.is_empty(), "late checks: {:?}", late.effects);
        }
        // Idempotent: once its effects happened, assessing the same boot again does nothing.
        let again = assess(&a.state, &apply(&i.loader, &ops), &i.boot, &i.checks).unwrap();
        prop_assert!(again.effects.is_empty(), "second run: {:?}", again.effects);
    }
}
