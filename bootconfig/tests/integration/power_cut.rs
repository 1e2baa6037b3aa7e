//! Power cuts at every byte-boundary class (0, 1, 511, 512, 513, 1023, 1024 bytes, and complete
//! but not renamed) of every write each backend does, for every transaction from every state:
//! the loader (modelled faithfully; the GRUB model is checked against the real GRUB in
//! grub_real.rs, the ADV format against the real extlinux in extlinux_real.rs) always boots
//! the old choice or the new one, `read` always returns the old or the new state, and
//! repeating the interrupted call completes it.

use crate::common;

use std::path::Path;

use bootconfig::{render_conf, Adv, SyslinuxBootloader, SyslinuxConfig};
use bootconfig::{simulate_boot, GrubBootloader};
use bootconfig::{BootEntry, BootEnv, Bootloader, Slot, SlotBoot};
use common::{after_cut, all_envs, copy_tree, cuts_for};

#[derive(Debug, Clone, Copy)]
enum Call {
    MarkBad(Slot),
    Try(Slot, u8),
    MarkGood(Slot),
}

fn calls(max: u8) -> Vec<Call> {
    let mut v = Vec::new();
    for s in Slot::ALL {
        v.push(Call::MarkBad(s));
        v.push(Call::MarkGood(s));
        for t in 1..=max {
            v.push(Call::Try(s, t));
        }
    }
    v
}

fn perform(b: &dyn Bootloader, c: Call) {
    match c {
        Call::MarkBad(s) => b.mark_bad(s),
        Call::Try(s, t) => b.try_slot(s, t),
        Call::MarkGood(s) => b.mark_good(s),
    }
    .unwrap()
}

#[test]
fn grub_rust_writes_cut_anywhere_boot_old_or_new() {
    grub_rust_writes_cut_anywhere(None);
}

/// The same on a node still running v0.1.0's grub.cfg (script 1, read by its own rules): a
/// v0.2.0 binary on a slot of a node that has not installed today's script yet.
#[test]
fn grub_rust_writes_under_the_v010_script_cut_anywhere_boot_old_or_new() {
    let cfg = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1.0/grub.cfg"),
    )
    .unwrap();
    grub_rust_writes_cut_anywhere(Some(&cfg));
}

fn grub_rust_writes_cut_anywhere(script: Option<&str>) {
    let max = 2;
    let mut cases = 0;
    for before in all_envs(max) {
        let base = common::scratch();
        if let Some(text) = script {
            std::fs::write(base.path().join("grub.cfg"), text).unwrap();
        }
        let g = GrubBootloader::new(base.path(), max);
        g.install(&before).unwrap();
        let old_choice = g.simulate_boot().unwrap().choice;
        assert_eq!(old_choice, before.next_boot());
        for call in calls(max) {
            // The finished call, on a copy.
            let done = common::scratch();
            copy_tree(base.path(), done.path());
            let gd = GrubBootloader::new(done.path(), max);
            perform(&gd, call);
            let new = gd.read().unwrap();
            let new_choice = new.next_boot();
            let ops = g.plan(&new).unwrap();
            assert!(
                ops.len() == 6 || ops.len() == 7,
                "lock1, env1, lock1, lock2, env2, lock2, and the last-good record when it changes"
            );
            for i in 0..ops.len() {
                for cut in cuts_for(base.path(), &ops, i) {
                    let st = after_cut(base.path(), &ops, i, cut);
                    let sim = simulate_boot(st.path(), max).unwrap();
                    assert!(
                        sim.choice == old_choice || sim.choice == new_choice,
                        "{before:?} {call:?} op {i} cut {cut}: boots {}, old {old_choice}, new {new_choice}",
                        sim.choice
                    );
                    let gs = GrubBootloader::new(st.path(), max);
                    let read = gs.read().unwrap();
                    assert!(
                        read == before || read == new,
                        "{before:?} {call:?} op {i} cut {cut}: read {read:?}"
                    );
                    perform(&gs, call);
                    assert_eq!(
                        gs.read().unwrap(),
                        new,
                        "repeating {call:?} after the cut completes it"
                    );
                    let integ = gs.integrity().unwrap();
                    assert!(
                        integ.damaged.is_empty(),
                        "{before:?} {call:?} op {i} cut {cut}: the repeated call restores every file: {integ:?}"
                    );
                    cases += 1;
                }
            }
        }
    }
    eprintln!("grub: {cases} cut states checked");
}

#[test]
fn grub_own_countdown_cut_anywhere_never_gains_tries() {
    let max = 3;
    let mut cases = 0;
    for before in all_envs(max) {
        let base = common::scratch();
        let g = GrubBootloader::new(base.path(), max);
        g.install(&before).unwrap();
        let sim = g.simulate_boot().unwrap();
        let SlotBoot::Trying { tries_left } = before.get(sim.choice) else {
            assert!(
                sim.countdown.is_empty(),
                "{before:?}: only a trial is counted"
            );
            continue;
        };
        if tries_left == 0 {
            assert!(sim.countdown.is_empty());
            continue;
        }
        let mut after = before.clone();
        after.set(
            sim.choice,
            SlotBoot::Trying {
                tries_left: tries_left - 1,
            },
        );
        assert_eq!(sim.countdown.len(), 6, "{before:?}");
        for i in 0..sim.countdown.len() {
            for cut in cuts_for(base.path(), &sim.countdown, i) {
                let st = after_cut(base.path(), &sim.countdown, i, cut);
                let next = simulate_boot(st.path(), max).unwrap();
                assert!(
                    next.seen == before || next.seen == after,
                    "{before:?} op {i} cut {cut}: saw {:?}",
                    next.seen
                );
                assert!(next.choice == before.next_boot() || next.choice == after.next_boot());
                cases += 1;
            }
        }
    }
    eprintln!("grub countdown: {cases} cut states checked");
}

fn syslinux_dir(dir: &Path) {
    let e = |s: &str| BootEntry {
        kernel: format!("/{s}/vmlinuz"),
        initrd: format!("/{s}/initrd"),
        cmdline: "quiet".into(),
    };
    let cfg = SyslinuxConfig {
        entries: [e("a"), e("b")],
        primary: Slot::A,
        timeout_tenths: 0,
        serial: false,
        panic_secs: 5,
    };
    std::fs::write(dir.join("extlinux.conf"), render_conf(&cfg)).unwrap();
    let mut ld = vec![0xeb; 8192];
    ld.extend_from_slice(&Adv::empty().0);
    std::fs::write(dir.join("ldlinux.sys"), ld).unwrap();
}

#[test]
fn syslinux_writes_cut_anywhere_boot_old_or_new() {
    let states = [
        SlotBoot::Good,
        SlotBoot::Bad,
        SlotBoot::Trying { tries_left: 0 },
        SlotBoot::Trying { tries_left: 1 },
    ];
    let mut cases = 0;
    for primary in Slot::ALL {
        for a in states {
            for b in states {
                let base = common::scratch();
                syslinux_dir(base.path());
                let s = SyslinuxBootloader::new(base.path());
                s.install(&BootEnv { primary, a, b }).unwrap();
                let old = s.view().unwrap();
                for call in calls(1) {
                    let done = common::scratch();
                    copy_tree(base.path(), done.path());
                    let sd = SyslinuxBootloader::new(done.path());
                    perform(&sd, call);
                    let new = sd.view().unwrap();
                    assert_eq!(new.choice, new.env.next_boot(), "{call:?}");
                    let ops = s.plan(&new.env).unwrap();
                    for i in 0..ops.len() {
                        for cut in cuts_for(base.path(), &ops, i) {
                            let st = after_cut(base.path(), &ops, i, cut);
                            let ss = SyslinuxBootloader::new(st.path());
                            let v = ss.view().unwrap();
                            assert!(
                                v.choice == old.choice || v.choice == new.choice,
                                "{old:?} {call:?} op {i} ({}) cut {cut}: boots {}, new {new:?}",
                                ops[i].path().display(),
                                v.choice
                            );
                            if let Call::Try(slot, _) = call {
                                // A trial is never lost to a cut: it reads as pending (or not
                                // yet armed), never as spent.
                                assert!(
                                    v.env == old.env || v.env == new.env,
                                    "{old:?} {call:?} op {i} ({}) cut {cut}: reads {:?}",
                                    ops[i].path().display(),
                                    v.env
                                );
                                assert!(
                                    v.env.get(slot) != SlotBoot::Trying { tries_left: 0 }
                                        || old.env.get(slot) == SlotBoot::Trying { tries_left: 0 }
                                );
                            }
                            perform(&ss, call);
                            assert_eq!(
                                ss.view().unwrap(),
                                new,
                                "repeating {call:?} after the cut completes it"
                            );
                            assert!(ss.integrity().unwrap().damaged.is_empty());
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    eprintln!("syslinux: {cases} cut states checked");
}

/// A damaged node (one env copy or lock missing or of the wrong size) is repaired by the next
/// write with an atomic replacement of that file; a cut anywhere in that write, including
/// "complete but not renamed", still boots the old or the new choice.
#[test]
fn grub_repair_of_a_damaged_copy_cut_anywhere_boots_old_or_new() {
    let max = 3;
    let mut replaced = 0;
    for damaged in ["env1", "env2", "lock1", "lock2"] {
        for truncate in [false, true] {
            let base = common::scratch();
            let g = GrubBootloader::new(base.path(), max);
            let before = BootEnv {
                primary: Slot::A,
                a: SlotBoot::Good,
                b: SlotBoot::Bad,
            };
            g.install(&before).unwrap();
            let f = base.path().join("k3os").join(damaged);
            if truncate {
                std::fs::write(&f, &std::fs::read(&f).unwrap()[..700]).unwrap();
            } else {
                std::fs::remove_file(&f).unwrap();
            }
            let old = g.simulate_boot().unwrap();
            assert_eq!(
                old.choice,
                Slot::A,
                "one damaged file never changes the choice"
            );
            let new = BootEnv {
                primary: Slot::B,
                a: SlotBoot::Good,
                b: SlotBoot::Trying { tries_left: 3 },
            };
            let ops = g.plan(&new).unwrap();
            replaced += ops
                .iter()
                .filter(|o| matches!(o, bootconfig::WriteOp::Replace { .. }))
                .count();
            for i in 0..ops.len() {
                for cut in cuts_for(base.path(), &ops, i) {
                    let st = after_cut(base.path(), &ops, i, cut);
                    let sim = simulate_boot(st.path(), max).unwrap();
                    assert!(
                        sim.choice == Slot::A || sim.choice == Slot::B,
                        "{damaged} op {i} cut {cut}"
                    );
                    let read = GrubBootloader::new(st.path(), max).read().unwrap();
                    assert!(
                        read == old.seen || read == new,
                        "{damaged} op {i} cut {cut}: read {read:?}"
                    );
                }
            }
            for op in &ops {
                op.apply().unwrap();
            }
            assert_eq!(g.read().unwrap(), new);
            assert_eq!(
                std::fs::metadata(&f).unwrap().len(),
                1024,
                "{damaged} repaired"
            );
        }
    }
    assert_eq!(replaced, 8, "each damaged file is replaced atomically");
}

/// With ADV copy 1 damaged (checksum broken), every transaction cut anywhere still boots the
/// old or the new choice and always leaves one valid ADV copy (so other ADV items survive):
/// the damaged copy is rewritten before the valid one.
#[test]
fn syslinux_with_a_damaged_adv_copy_cut_anywhere_boots_old_or_new() {
    let states = [
        SlotBoot::Good,
        SlotBoot::Bad,
        SlotBoot::Trying { tries_left: 1 },
    ];
    let mut cases = 0;
    for primary in Slot::ALL {
        for a in states {
            for b in states {
                let base = common::scratch();
                syslinux_dir(base.path());
                let s = SyslinuxBootloader::new(base.path());
                s.install(&BootEnv { primary, a, b }).unwrap();
                let ld = base.path().join("ldlinux.sys");
                let mut bytes = std::fs::read(&ld).unwrap();
                let n = bytes.len();
                bytes[n - 100] ^= 0x5a;
                std::fs::write(&ld, bytes).unwrap();
                let old = s.view().unwrap();
                assert!(old.adv_valid, "copy 0 still valid");
                for call in calls(1) {
                    let done = common::scratch();
                    copy_tree(base.path(), done.path());
                    perform(&SyslinuxBootloader::new(done.path()), call);
                    let new = SyslinuxBootloader::new(done.path()).view().unwrap();
                    let ops = s.plan(&new.env).unwrap();
                    for i in 0..ops.len() {
                        for cut in cuts_for(base.path(), &ops, i) {
                            let st = after_cut(base.path(), &ops, i, cut);
                            let v = SyslinuxBootloader::new(st.path()).view().unwrap();
                            assert!(
                                v.choice == old.choice || v.choice == new.choice,
                                "{old:?} {call:?} op {i} cut {cut}: boots {}, new {new:?}",
                                v.choice
                            );
                            assert!(
                                v.adv_valid,
                                "{call:?} op {i} cut {cut}: no valid ADV copy left"
                            );
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    eprintln!("syslinux damaged ADV: {cases} cut states checked");
}
