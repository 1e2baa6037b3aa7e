//! Env copy integrity (a damaged copy must never cost the fallback): a copy damaged in any
//! byte counts as damaged as a whole, GRUB and Rust use the other copy, a Rust write never
//! takes values from a damaged copy and rewrites both, and with both copies damaged the slot
//! last confirmed good boots. The model
//! used here is held to the real GRUB in grub_real.rs (`grub_emu_*damage*`).

use crate::common;

use std::path::Path;

use bootconfig::{BootEnv, Bootloader, Slot, SlotBoot};
use bootconfig::{EnvSource, GrubBootloader};
use common::damage;
use proptest::prelude::*;

/// A good and running, B on trial (activated, not yet booted).
fn a_good_b_on_trial(dir: &Path) -> GrubBootloader {
    let g = GrubBootloader::new(dir, 3);
    g.install(&BootEnv {
        primary: Slot::A,
        a: SlotBoot::Good,
        b: SlotBoot::Bad,
    })
    .unwrap();
    g.try_slot(Slot::B, 3).unwrap();
    g
}

/// The bug as found through the CLI: `K3OS_A=good` → `K3OS_A=gXod` in env1 (still a loadable
/// environment block). Before the fix: A read as bad, and `mark-bad b` rewrote the intact copy
/// 2 with A bad too, so the next boot was B, the slot just marked bad.
#[test]
fn one_damaged_value_never_demotes_the_good_slot_nor_costs_the_fallback() {
    let d = tempfile::tempdir().unwrap();
    let g = a_good_b_on_trial(d.path());
    damage(&d.path().join("k3os/env1"), b"K3OS_A=good", b"K3OS_A=gXod");
    assert_eq!(
        g.read().unwrap(),
        BootEnv {
            primary: Slot::B,
            a: SlotBoot::Good,
            b: SlotBoot::Trying { tries_left: 3 }
        },
        "the damaged copy 1 is not used; copy 2 is"
    );
    g.mark_bad(Slot::B).unwrap();
    let after = g.read().unwrap();
    assert_eq!(after.a, SlotBoot::Good, "{after:?}");
    assert_eq!(after.b, SlotBoot::Bad, "{after:?}");
    assert_eq!(after.next_boot(), Slot::A, "{after:?}");
    assert_eq!(
        std::fs::read(d.path().join("k3os/env1")).unwrap(),
        std::fs::read(d.path().join("k3os/env2")).unwrap(),
        "the write restored both copies"
    );
}

/// Both copies damaged: GRUB (and `read`) use the last-good record, never a slot marked bad;
/// the next Rust write rewrites both copies from that state.
#[test]
fn both_copies_damaged_boot_the_slot_last_confirmed_good() {
    let d = tempfile::tempdir().unwrap();
    let g = a_good_b_on_trial(d.path());
    damage(&d.path().join("k3os/env1"), b"K3OS_A=good", b"K3OS_A=gXod");
    damage(&d.path().join("k3os/env2"), b"K3OS_B=try", b"K3OS_B=tXy");
    let sim = g.simulate_boot().unwrap();
    assert_eq!(sim.source, EnvSource::LastGood(Slot::A));
    assert_eq!(sim.choice, Slot::A);
    let integ = g.integrity().unwrap();
    assert!(integ.in_use.contains("last-good"), "{integ:?}");
    let names: Vec<_> = integ.damaged.iter().map(|d| d.record.as_str()).collect();
    assert_eq!(names, ["copy 1", "copy 2"], "{integ:?}");
    g.mark_bad(Slot::B).unwrap();
    assert_eq!(
        g.read().unwrap(),
        BootEnv {
            primary: Slot::A,
            a: SlotBoot::Good,
            b: SlotBoot::Bad
        }
    );
    assert!(g.integrity().unwrap().damaged.is_empty());

    // The record follows confirms, and never names a slot once it is marked bad.
    g.try_slot(Slot::B, 3).unwrap();
    g.mark_good(Slot::B).unwrap();
    assert_eq!(g.simulate_boot().unwrap().last_good, Some(Some(Slot::B)));
    g.mark_bad(Slot::B).unwrap();
    assert_eq!(g.simulate_boot().unwrap().last_good, Some(Some(Slot::A)));
    g.mark_bad(Slot::A).unwrap();
    assert_eq!(g.simulate_boot().unwrap().last_good, Some(None));
    for f in ["env1", "env2"] {
        damage(
            &d.path().join("k3os").join(f),
            b"K3OS_PRIMARY=",
            b"K3OS_PRIMARX",
        );
    }
    assert_eq!(g.simulate_boot().unwrap().source, EnvSource::Nothing);
    assert_eq!(
        g.read().unwrap(),
        BootEnv {
            primary: Slot::A,
            a: SlotBoot::Bad,
            b: SlotBoot::Bad
        },
        "no intact copy, no good slot: GRUB's defaults"
    );
    std::fs::remove_file(d.path().join("k3os/good")).unwrap();
    let e = g.read().unwrap_err().to_string();
    assert!(e.contains("env1") && e.contains("env2"), "{e}");
}

const FILES: [&str; 5] = ["env1", "env2", "lock1", "lock2", "good"];

fn arb_state() -> impl Strategy<Value = BootEnv> {
    let st = prop_oneof![
        Just(SlotBoot::Good),
        Just(SlotBoot::Bad),
        (0u8..=3).prop_map(|t| SlotBoot::Trying { tries_left: t }),
    ];
    (any::<bool>(), st.clone(), st).prop_map(|(b, a, bb)| BootEnv {
        primary: if b { Slot::B } else { Slot::A },
        a,
        b: bb,
    })
}

/// Damage: overwrite `n` bytes at random offsets of one file, or truncate it.
#[derive(Debug, Clone)]
enum Hit {
    Bytes(Vec<(usize, u8)>),
    Truncate(usize),
}

fn arb_hit() -> impl Strategy<Value = Hit> {
    prop_oneof![
        4 => prop::collection::vec((0usize..1024, any::<u8>()), 1..6).prop_map(Hit::Bytes),
        // Damage aimed at the first 200 bytes, where the names and values are.
        4 => prop::collection::vec((0usize..200, any::<u8>()), 1..3).prop_map(Hit::Bytes),
        1 => (0usize..1024).prop_map(Hit::Truncate),
    ]
}

fn apply(path: &Path, hit: &Hit) {
    let mut b = std::fs::read(path).unwrap();
    match hit {
        Hit::Bytes(v) => {
            for &(i, x) in v {
                b[i] = x;
            }
        }
        Hit::Truncate(n) => b.truncate(*n),
    }
    std::fs::write(path, b).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Any damage of one file (either env copy, either lock, the last-good record), from any
    /// state: GRUB boots exactly what it booted before (the other copy holds the same state),
    /// `read` says the same, the integrity report names the damaged file, and the next write
    /// (any transaction) restores every file.
    #[test]
    fn damage_to_one_file_changes_nothing_and_is_named_and_repaired(
        state in arb_state(),
        file in 0usize..FILES.len(),
        hit in arb_hit(),
        tx in 0usize..3,
        tx_slot in any::<bool>(),
    ) {
        let d = common::scratch();
        let g = GrubBootloader::new(d.path(), 3);
        g.install(&state).unwrap();
        let before = g.simulate_boot().unwrap();
        let path = d.path().join("k3os").join(FILES[file]);
        let old = std::fs::read(&path).unwrap();
        apply(&path, &hit);
        let changed = std::fs::read(&path).unwrap() != old;
        let sim = g.simulate_boot().unwrap();
        prop_assert_eq!(&sim.seen, &before.seen);
        prop_assert_eq!(sim.choice, before.choice);
        prop_assert_eq!(g.read().unwrap(), state.clone());
        let integ = g.integrity().unwrap();
        prop_assert_eq!(
            changed,
            integ.damaged.iter().any(|x| x.path == path),
            "damaged file named iff changed: {:?}", integ
        );
        if FILES[file].ends_with('1') && changed && sim.source != EnvSource::Copy(1) {
            prop_assert!(integ.in_use.contains("env2"), "{:?}", integ);
        }
        let slot = if tx_slot { Slot::B } else { Slot::A };
        match tx {
            0 => g.mark_bad(slot),
            1 => g.try_slot(slot, 2),
            _ => g.mark_good(slot),
        }
        .unwrap();
        let integ = g.integrity().unwrap();
        prop_assert!(integ.damaged.is_empty(), "after a write: {:?}", integ);
        prop_assert_eq!(
            std::fs::read(d.path().join("k3os/env1")).unwrap(),
            std::fs::read(d.path().join("k3os/env2")).unwrap()
        );
    }
}

/// GRUB's own countdown torn at every byte while the other copy is damaged (two faults): the
/// next boot sees the state before or after the countdown, or boots the slot last confirmed
/// good — never a slot marked bad — and the next Rust write restores every file.
#[test]
fn countdown_cut_with_the_other_copy_damaged_boots_the_trial_or_the_last_good_slot() {
    let mut cases = 0;
    for damaged in ["env1", "env2"] {
        for before in common::all_envs(3) {
            let base = common::scratch();
            let g = GrubBootloader::new(base.path(), 3);
            g.install(&before).unwrap();
            let last_good = g.simulate_boot().unwrap().last_good.flatten();
            damage(
                &base.path().join("k3os").join(damaged),
                b"K3OS_PRIMARY=",
                b"K3OS_PRIMARX",
            );
            let sim = g.simulate_boot().unwrap();
            assert_eq!(sim.seen, before, "the other copy holds the state");
            let mut after = before.clone();
            if let SlotBoot::Trying { tries_left } = before.get(sim.choice) {
                after.set(
                    sim.choice,
                    SlotBoot::Trying {
                        tries_left: tries_left.saturating_sub(1),
                    },
                );
            }
            for i in 0..sim.countdown.len() {
                for cut in common::cuts_for(base.path(), &sim.countdown, i) {
                    let st = common::after_cut(base.path(), &sim.countdown, i, cut);
                    let gs = GrubBootloader::new(st.path(), 3);
                    let next = gs.simulate_boot().unwrap();
                    let ok = match next.source {
                        EnvSource::LastGood(s) => Some(s) == last_good,
                        EnvSource::Copy(_) => next.seen == before || next.seen == after,
                        // No slot was ever confirmed (e.g. A bad, B on trial): nothing to prefer.
                        EnvSource::Nothing => last_good.is_none(),
                    };
                    assert!(
                        ok,
                        "{before:?} {damaged} damaged, countdown op {i} cut {cut}: {:?} boots {} ({:?})",
                        next.source, next.choice, next.seen
                    );
                    gs.mark_bad(Slot::B).unwrap();
                    assert!(gs.integrity().unwrap().damaged.is_empty());
                    cases += 1;
                }
            }
        }
    }
    assert!(cases > 100, "{cases}");
}
