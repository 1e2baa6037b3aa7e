//! Nodes made by an earlier release: v0.1.0's files (tests/fixtures/v0.1.0, written by v0.1.0's
//! own code, see make.sh there) are read as that release's script reads them, written under
//! that script's rules, and moved to today's script by `install_script` — power-cut safely at
//! every byte class of every write. A script newer than this build is refused and nothing is
//! rewritten.

use crate::common;

use std::path::{Path, PathBuf};

use bootconfig::{render_cfg, simulate_boot, BootEntry, GrubBootloader, GrubConfig, GrubScript};
use bootconfig::{render_conf, SyslinuxBootloader, SyslinuxConfig, CONF_VERSION};
use bootconfig::{BootEnv, Bootloader, Error, Slot, SlotBoot};
use common::{after_cut, all_envs, copy_tree, cuts_for};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1.0")
}

fn v1_cfg() -> String {
    std::fs::read_to_string(fixtures().join("grub.cfg")).unwrap()
}

fn cfg() -> GrubConfig {
    let e = |s: &str| BootEntry {
        kernel: format!("/{s}/vmlinuz"),
        initrd: format!("/{s}/initrd"),
        cmdline: format!("root=PARTLABEL=rootfs-{s} ro console=ttyS0 quiet"),
    };
    GrubConfig {
        entries: [e("a"), e("b")],
        max_tries: 3,
        timeout_secs: 0,
        serial: true,
        panic_secs: 5,
    }
}

/// A GRUB dir holding v0.1.0's grub.cfg and the env files of fixture `state`.
fn v010_node(state: &str) -> tempfile::TempDir {
    let d = common::scratch();
    copy_tree(&fixtures().join(state), d.path());
    std::fs::write(d.path().join("grub.cfg"), v1_cfg()).unwrap();
    d
}

fn states() -> [(&'static str, BootEnv); 4] {
    let (good, bad) = (SlotBoot::Good, SlotBoot::Bad);
    let t = |n| SlotBoot::Trying { tries_left: n };
    [
        (
            "installed",
            BootEnv {
                primary: Slot::A,
                a: good,
                b: bad,
            },
        ),
        (
            "trying-b",
            BootEnv {
                primary: Slot::B,
                a: good,
                b: t(3),
            },
        ),
        (
            "trying-b-counted",
            BootEnv {
                primary: Slot::B,
                a: good,
                b: t(2),
            },
        ),
        (
            "good-b",
            BootEnv {
                primary: Slot::B,
                a: good,
                b: good,
            },
        ),
    ]
}

#[test]
fn v010_env_copies_read_as_v010_wrote_them() {
    for (state, want) in states() {
        let d = v010_node(state);
        let g = GrubBootloader::new(d.path(), 3);
        assert_eq!(g.script().unwrap(), Some(GrubScript::V1), "{state}");
        assert_eq!(g.read().unwrap(), want, "{state}");
        let integ = g.integrity().unwrap();
        assert!(
            integ.damaged.is_empty(),
            "{state}: nothing is damaged: {integ:?}"
        );
        assert!(integ.in_use.starts_with("copy 1"), "{state}: {integ:?}");
        // The same files under today's script read as damaged: that is what GRUB would do
        // with them, and why the script is never replaced before the copies are rewritten.
        let now = simulate_boot_now(d.path());
        assert!(now.intact == [false, false], "{state}: {now:?}");
    }
}

fn simulate_boot_now(dir: &Path) -> bootconfig::BootSim {
    bootconfig::simulate_boot_with(dir, 3, GrubScript::CURRENT).unwrap()
}

#[test]
fn rust_writes_under_the_v010_script_read_back_by_its_rules() {
    let d = v010_node("installed");
    let g = GrubBootloader::new(d.path(), 3);
    for env in all_envs(3) {
        g.install(&env).unwrap();
        assert_eq!(g.read().unwrap(), env);
        let sim = g.simulate_boot().unwrap();
        assert_eq!(sim.script, GrubScript::V1);
        assert_eq!(sim.choice, env.next_boot(), "{env:?}");
        // Written in today's layout: today's script would read the same state.
        assert_eq!(simulate_boot_now(d.path()).seen, env, "{env:?}");
    }
    assert_eq!(
        std::fs::read_to_string(d.path().join("grub.cfg")).unwrap(),
        v1_cfg(),
        "writes never touch the script"
    );
}

#[test]
fn installing_todays_script_keeps_the_state_and_a_cut_anywhere_boots_the_same() {
    let new_cfg = render_cfg(&cfg());
    let mut cases = 0;
    for (state, want) in states() {
        let base = v010_node(state);
        let g = GrubBootloader::new(base.path(), 3);
        let before = simulate_boot(base.path(), 3).unwrap();
        let ops = g.plan_install_script(&new_cfg).unwrap();
        assert_eq!(
            ops.last().unwrap().path(),
            base.path().join("grub.cfg"),
            "{state}: the script is replaced last, after every copy is rewritten"
        );
        for i in 0..ops.len() {
            for cut in cuts_for(base.path(), &ops, i) {
                let st = after_cut(base.path(), &ops, i, cut);
                let sim = simulate_boot(st.path(), 3).unwrap();
                assert_eq!(sim.choice, before.choice, "{state} op {i} cut {cut}");
                assert_eq!(
                    sim.seen, want,
                    "{state} op {i} cut {cut}: {:?}",
                    sim.integrity
                );
                // Repeating the install completes it.
                let gs = GrubBootloader::new(st.path(), 3);
                gs.install_script(&new_cfg).unwrap();
                assert_eq!(gs.script().unwrap(), Some(GrubScript::CURRENT));
                assert_eq!(gs.read().unwrap(), want, "{state} op {i} cut {cut}");
                let integ = gs.integrity().unwrap();
                assert!(
                    integ.damaged.is_empty(),
                    "{state} op {i} cut {cut}: {integ:?}"
                );
                cases += 1;
            }
        }
        assert!(g.install_script(&new_cfg).unwrap());
        assert!(
            !g.install_script(&new_cfg).unwrap(),
            "installed already: nothing written"
        );
        assert_eq!(g.read().unwrap(), want);
    }
    assert!(cases > 100, "{cases}");
}

#[test]
fn a_newer_script_is_refused_and_nothing_is_rewritten() {
    let newer = render_cfg(&cfg()).replace("# k3os-grub-script: 3", "# k3os-grub-script: 4");
    // Installing a newer script.
    let d = v010_node("trying-b");
    let g = GrubBootloader::new(d.path(), 3);
    let before = common::snapshot(d.path());
    let e = g.install_script(&newer).unwrap_err();
    assert!(
        matches!(
            e,
            Error::NewerFormat {
                found: 4,
                known: 3,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(common::snapshot(d.path()), before);
    // A node whose installed script is newer: reads and writes are refused.
    std::fs::write(d.path().join("grub.cfg"), &newer).unwrap();
    let before = common::snapshot(d.path());
    for e in [
        g.read().unwrap_err(),
        g.mark_good(Slot::B).unwrap_err(),
        g.try_slot(Slot::A, 1).unwrap_err(),
    ] {
        let t = e.to_string();
        assert!(
            t.contains("grub.cfg")
                && t.contains("version 4")
                && t.contains("up to version 3")
                && t.contains("nothing was rewritten"),
            "{t}"
        );
    }
    assert_eq!(common::snapshot(d.path()), before);
    // Not a script of ours at all.
    let e = GrubBootloader::new(d.path(), 3)
        .install_script("set default=0\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a grub.cfg rendered by k3os-ops"), "{e}");
}

#[test]
fn v010_extlinux_conf_is_version_1_and_a_newer_one_is_refused() {
    let d = common::scratch();
    let conf = std::fs::read_to_string(fixtures().join("extlinux.conf")).unwrap();
    std::fs::write(d.path().join("extlinux.conf"), &conf).unwrap();
    let mut ld = vec![0u8; 4096];
    ld.extend_from_slice(&bootconfig::Adv::empty().0);
    std::fs::write(d.path().join("ldlinux.sys"), &ld).unwrap();
    let s = SyslinuxBootloader::new(d.path());
    assert_eq!(s.script().unwrap().installed, Some(1));
    assert_eq!(
        s.read().unwrap(),
        BootEnv {
            primary: Slot::A,
            a: SlotBoot::Good,
            b: SlotBoot::Bad
        }
    );
    s.try_slot(Slot::B, 1).unwrap();
    // Today's conf installed over it keeps the state (trial armed in the ADV, DEFAULT a).
    let e = |x: &str| BootEntry {
        kernel: format!("/{x}/vmlinuz"),
        initrd: format!("/{x}/initrd"),
        cmdline: "console=ttyS0".into(),
    };
    let new = render_conf(&SyslinuxConfig {
        entries: [e("a"), e("b")],
        primary: Slot::A,
        timeout_tenths: 1,
        serial: true,
        panic_secs: 5,
    });
    let before = s.read().unwrap();
    assert!(s.install_script(&new).unwrap());
    assert_eq!(s.read().unwrap(), before);
    assert_eq!(s.script().unwrap().installed, Some(CONF_VERSION));
    let text = std::fs::read_to_string(d.path().join("extlinux.conf")).unwrap();
    assert!(text.contains("APPEND console=ttyS0 k3os.slot=A"), "{text}");
    // Newer: refused, nothing rewritten.
    let newer = text.replace("# k3os-extlinux-conf: 1", "# k3os-extlinux-conf: 2");
    std::fs::write(d.path().join("extlinux.conf"), &newer).unwrap();
    let snap = common::snapshot(d.path());
    let err = s.mark_good(Slot::B).unwrap_err().to_string();
    assert!(
        err.contains("extlinux.conf version 2") && err.contains("up to version 1"),
        "{err}"
    );
    assert_eq!(common::snapshot(d.path()), snap);
}
