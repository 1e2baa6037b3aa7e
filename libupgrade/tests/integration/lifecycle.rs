//! The boot-assessment state machine across simulated reboots: activate → trial boot →
//! confirm; tries running out → fallback recorded with its reason; failed health check →
//! rollback; an activation cut short before the bootloader flip → slot stays staged; a damaged
//! GRUB env copy (it must never cost the fallback); a node whose loader files v0.1.0 wrote upgrades, installing today's
//! boot script on the activation of a release that carries it, and refuses to activate a
//! release older than its script. Uses the k3OS-style dir layout (real squashfs files, symlink
//! switching) and each real bootloader backend (GRUB, syslinux) on temp dirs, powered on the
//! way the loader boots (testkit::loaders); every scenario runs on both. A trial boot links its
//! release's image archives for k3s and checks their images (issue 33); without them it rolls
//! back.
// A scenario test or benchmark reads top to bottom as one story: the 80-line function rule
// (clippy.toml) is for the code it exercises.
#![allow(clippy::too_many_lines)]

use libupgrade::Release;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use bootconfig::{Slot, SlotBoot};
use libupgrade::layout::DirLayout;
use libupgrade::manifest::Arch;
use libupgrade::state::Event;
use libupgrade::state::SlotState;
use libupgrade::state::{OtherSlot, Outcome};
use libupgrade::{BootloaderKind, Config, LayoutConfig};
use libupgrade::{Error, NoProgress, Source, StageOptions, Updater};
use testkit::loaders::{Kind, RealLoader, KINDS};
use testkit::*;

struct Node {
    dir: tempfile::TempDir,
    cfg: Config,
    loader: RealLoader,
    boots: u32,
}

impl Node {
    fn new(trust: &Path, kind: Kind) -> Node {
        Node::with_loader(trust, kind, |dir| RealLoader::install(kind, dir, 3))
    }

    /// A node whose loader files were written by v0.1.0 (its script, its env copies).
    fn v010(trust: &Path, kind: Kind) -> Node {
        Node::with_loader(trust, kind, |dir| RealLoader::install_v010(kind, dir))
    }

    fn with_loader(trust: &Path, kind: Kind, install: impl FnOnce(&Path) -> RealLoader) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let cfg = dir_config(
            p,
            trust,
            match kind {
                Kind::Grub => BootloaderKind::Grub,
                Kind::Syslinux => BootloaderKind::Syslinux,
            },
        );
        std::fs::write(&cfg.release_file, "VERSION=v1\nGENERATION=1\n").unwrap();
        boot_as(&cfg, Slot::A, "boot-0");
        std::fs::create_dir_all(p.join("system")).unwrap();
        let loader = install(&p.join("loader"));
        Node {
            dir,
            cfg,
            loader,
            boots: 0,
        }
    }

    fn updater(&self) -> Updater {
        let LayoutConfig::Dir { root, boot_dir } = &self.cfg.layout else {
            unreachable!()
        };
        Updater::with_parts(
            self.cfg.clone(),
            Box::new(DirLayout::new(root, boot_dir)),
            self.loader.backend(),
        )
    }

    /// Power-cycle: the loader picks a slot (counting tries), the "kernel" boots it.
    fn reboot(&mut self) -> Slot {
        self.boots += 1;
        let s = self.loader.power_on();
        boot_as(&self.cfg, s, &format!("boot-{}", self.boots));
        s
    }

    fn set_health(&self, ok: bool) {
        let d = &self.cfg.health_dir;
        std::fs::create_dir_all(d).unwrap();
        let p = d.join("50-app");
        std::fs::write(
            &p,
            if ok {
                "#!/bin/sh\nexit 0\n"
            } else {
                "#!/bin/sh\necho app is down >&2\nexit 1\n"
            },
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

fn staged_node(version: &str, kind: Kind) -> (Node, Keys, tempfile::TempDir) {
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = make_release(&k, rels.path(), version, 2, 4096, Arch::host());
    let node = Node::new(&k.trust, kind);
    let u = node.updater();
    u.confirm().expect_good("first boot confirms");
    u.stage(
        &Release::at(Source::Path(rel)),
        &StageOptions::default(),
        &NoProgress,
    )
    .unwrap();
    (node, k, rels)
}

#[test]
fn activate_reboot_confirm_makes_the_new_slot_good_and_keeps_the_old_as_fallback() {
    for kind in KINDS {
        activate_reboot_confirm_makes_the_new_slot_good_and_keeps_the_old_as_fallback_on(kind);
    }
}

fn activate_reboot_confirm_makes_the_new_slot_good_and_keeps_the_old_as_fallback_on(kind: Kind) {
    let (mut node, _k, _r) = staged_node("v2", kind);
    let u = node.updater();
    assert_eq!(u.activate().unwrap(), Slot::B);
    // confirm in the same boot must not treat the pending trial as failed.
    u.confirm().expect_good("confirm");
    assert_eq!(u.status().unwrap().slots[1].state, SlotState::Trying);

    assert_eq!(node.reboot(), Slot::B);
    std::fs::write(&node.cfg.release_file, "VERSION=v2\nGENERATION=2\n").unwrap();
    let r = node.updater().confirm().expect_good("confirm");
    assert!(r.newly_good);
    assert_eq!(r.verdict.outcome, Outcome::Blessed);
    assert_eq!(
        node.updater().status().unwrap().verdict.unwrap().outcome,
        Outcome::Blessed
    );
    let st = node.updater().status().unwrap();
    assert_eq!((st.booted, st.next_boot), (Some(Slot::B), Slot::B));
    assert_eq!(st.slots[1].state, SlotState::Good);
    assert_eq!(
        st.slots[0].state,
        SlotState::Good,
        "the old slot stays as the fallback"
    );
    assert_eq!(
        st.slots[1].last_decision.as_ref().unwrap().event,
        Event::Confirmed
    );
    assert_eq!(node.reboot(), Slot::B, "a confirmed slot keeps booting");
    // The k3OS-style links follow the confirmed slot.
    let root = node.dir.path().join("system");
    assert_eq!(
        std::fs::read_link(root.join("kernel/current")).unwrap(),
        Path::new("b")
    );
    assert_eq!(
        std::fs::read_link(root.join("rootfs/previous")).unwrap(),
        Path::new("a")
    );
}

#[test]
fn a_slot_that_never_confirms_runs_out_of_tries_and_the_fallback_is_recorded() {
    for kind in KINDS {
        a_slot_that_never_confirms_runs_out_of_tries_and_the_fallback_is_recorded_on(kind);
    }
}

fn a_slot_that_never_confirms_runs_out_of_tries_and_the_fallback_is_recorded_on(kind: Kind) {
    let (mut node, _k, _r) = staged_node("v2", kind);
    node.updater().activate().unwrap();
    let t = node.loader.tries;
    for _ in 0..t {
        assert_eq!(node.reboot(), Slot::B, "{kind:?}: tries left: B boots");
        // v2 hangs before confirm: nothing runs; the watchdog resets.
    }
    assert_eq!(
        node.reboot(),
        Slot::A,
        "{kind:?}: after {t} tries the loader falls back"
    );
    let r = node.updater().confirm().expect_good("confirm");
    let d = r.other_slot.expect("the failed trial is settled");
    assert_eq!(d.event, Event::FallbackTaken);
    assert!(d.why.contains(&format!("{t} of {t} tries")), "{}", d.why);
    assert_eq!(
        r.verdict.other_slot,
        Some(OtherSlot::FallbackTaken {
            slot: Slot::B,
            used: t,
            tries: t
        })
    );
    let v = node
        .updater()
        .status()
        .unwrap()
        .verdict
        .expect("verdict of this boot");
    assert_eq!(v.outcome, Outcome::Good);
    assert!(v.other_slot.is_some(), "the agent reads the fallback here");
    let st = node.updater().status().unwrap();
    assert_eq!(st.slots[1].state, SlotState::Bad);
    assert_eq!(st.slots[1].boot, SlotBoot::Bad);
    assert_eq!(
        st.slots[1].last_decision.as_ref().unwrap().generation,
        Some(2)
    );
    assert_eq!(st.next_boot, Slot::A);
    assert_eq!(node.reboot(), Slot::A);
}

#[test]
fn a_failed_health_check_rolls_back_without_waiting_for_tries() {
    for kind in KINDS {
        a_failed_health_check_rolls_back_without_waiting_for_tries_on(kind);
    }
}

fn a_failed_health_check_rolls_back_without_waiting_for_tries_on(kind: Kind) {
    let (mut node, _k, _r) = staged_node("v2", kind);
    node.updater().activate().unwrap();
    assert_eq!(node.reboot(), Slot::B);
    node.set_health(false);
    let r = node.updater().confirm().unwrap();
    assert!(
        r.slot == Slot::B && matches!(r.outcome(), Outcome::RolledBack { .. }),
        "{r:?}"
    );
    assert!(r.failures().contains("app is down"), "{r:?}");
    assert_eq!(node.reboot(), Slot::A, "rolled back on the very next boot");
    node.set_health(true);
    node.updater().confirm().expect_good("confirm");
    let st = node.updater().status().unwrap();
    assert_eq!(st.slots[1].state, SlotState::Bad);
    assert_eq!(
        st.slots[1].last_decision.as_ref().unwrap().event,
        Event::HealthFailed
    );
    assert_eq!(st.slots[0].state, SlotState::Good);
}

#[test]
fn an_activation_cut_before_the_bootloader_flip_leaves_the_slot_staged() {
    for kind in KINDS {
        an_activation_cut_before_the_bootloader_flip_leaves_the_slot_staged_on(kind);
    }
}

fn an_activation_cut_before_the_bootloader_flip_leaves_the_slot_staged_on(kind: Kind) {
    let (mut node, _k, _r) = staged_node("v2", kind);
    let u = node.updater();
    let before = node.loader.snapshot();
    u.activate().unwrap();
    // Simulate the power cut between the state write and the bootloader write: undo the flip.
    node.loader.restore(&before);
    assert_eq!(node.reboot(), Slot::A);
    node.updater().confirm().expect_good("confirm");
    let st = node.updater().status().unwrap();
    assert_eq!(st.slots[1].state, SlotState::Staged);
    assert_eq!(
        st.slots[1].last_decision.as_ref().unwrap().event,
        Event::ActivationLost
    );
    // And it can be activated again.
    node.updater().activate().unwrap();
    assert_eq!(node.reboot(), Slot::B);
}

#[test]
fn manual_rollback_and_guards() {
    for kind in KINDS {
        manual_rollback_and_guards_on(kind);
    }
}

fn manual_rollback_and_guards_on(kind: Kind) {
    let (mut node, _k, _r) = staged_node("v2", kind);
    let u = node.updater();
    assert!(matches!(
        u.activate_slot(Slot::A),
        Err(Error::SlotBusy { slot: Slot::A })
    ));
    assert!(
        matches!(
            u.rollback("no"),
            Err(Error::SlotState { slot: Slot::B, .. })
        ),
        "B is only staged"
    );
    u.activate().unwrap();
    node.reboot();
    std::fs::write(&node.cfg.release_file, "VERSION=v2\nGENERATION=2\n").unwrap();
    node.updater().confirm().expect_good("confirm");
    assert_eq!(node.updater().rollback("operator asked").unwrap(), Slot::A);
    assert_eq!(node.reboot(), Slot::A);
    let st = node.updater().status().unwrap();
    assert_eq!(st.slots[1].state, SlotState::Bad);
    assert!(st.slots[1]
        .last_decision
        .as_ref()
        .unwrap()
        .why
        .contains("operator asked"));
}

/// A damaged env copy must never cost the fallback, through the library: A good and running, B on trial, `K3OS_A=good` damaged to
/// `K3OS_A=gXod` in GRUB's env1. Status reports A good and names the damaged copy and the copy
/// in use; `mark_bad(B)` keeps A as the next boot and restores both copies.
#[test]
fn a_damaged_grub_env_copy_is_reported_and_never_costs_the_fallback() {
    let (node, _k, _r) = staged_node("v2", Kind::Grub);
    node.updater().activate().unwrap();
    let env1 = node.loader.dir.join("k3os/env1");
    let mut b = std::fs::read(&env1).unwrap();
    let i = b.windows(11).position(|w| w == b"K3OS_A=good").unwrap();
    b[i + 8] = b'X';
    std::fs::write(&env1, b).unwrap();
    let st = node.updater().status().unwrap();
    assert_eq!(st.slots[0].boot, SlotBoot::Good, "A reads good");
    assert_eq!(st.next_boot, Slot::B, "B's trial is intact");
    assert_eq!(
        st.loader_integrity.damaged.len(),
        1,
        "{:?}",
        st.loader_integrity
    );
    assert_eq!(st.loader_integrity.damaged[0].path, env1);
    assert!(
        st.loader_integrity.in_use.contains("env2"),
        "{:?}",
        st.loader_integrity
    );
    node.updater().mark_bad(Slot::B, "operator").unwrap();
    let st = node.updater().status().unwrap();
    assert_eq!(st.next_boot, Slot::A, "the good slot stays the next boot");
    assert_eq!(st.slots[0].boot, SlotBoot::Good);
    assert_eq!(st.slots[1].boot, SlotBoot::Bad);
    assert!(
        st.loader_integrity.damaged.is_empty(),
        "both copies restored"
    );
}

/// A good slot whose loader records are damaged is re-asserted by the next confirm, which
/// rewrites them (no pending trial).
#[test]
fn confirm_repairs_damaged_loader_records_of_a_good_slot() {
    for kind in KINDS {
        let (node, _k, _r) = staged_node("v2", kind);
        let (file, at) = match kind {
            Kind::Grub => ("k3os/env2", 30),
            Kind::Syslinux => ("ldlinux.sys", 4096 + 512 + 8),
        };
        let p = node.loader.dir.join(file);
        let mut b = std::fs::read(&p).unwrap();
        b[at] ^= 0x55;
        std::fs::write(&p, b).unwrap();
        assert_eq!(
            node.updater()
                .status()
                .unwrap()
                .loader_integrity
                .damaged
                .len(),
            1,
            "{kind:?}"
        );
        let r = node.updater().confirm().expect_good("confirm");
        assert_eq!(r.verdict.loader_damage.len(), 1, "{kind:?}");
        assert!(
            node.updater()
                .status()
                .unwrap()
                .loader_integrity
                .damaged
                .is_empty(),
            "{kind:?}"
        );
    }
}

/// A node made by v0.1.0 (its grub.cfg / extlinux.conf, its env copies) running today's
/// binary: it reads its loader files, stages a release carrying today's script, installs the
/// script when it activates it (both slots read it), boots and blesses the new slot; a release
/// made before v0.2.0 (reading only script 1) is then refused at activation, nothing written.
#[test]
fn a_v010_node_installs_the_new_script_on_activation_and_refuses_an_older_release() {
    for kind in KINDS {
        let k = keys();
        let rels = tempfile::tempdir().unwrap();
        let mut node = Node::v010(&k.trust, kind);
        let u = node.updater();
        assert_eq!(u.bootloader().script().unwrap().installed, Some(1));
        u.confirm()
            .expect_good("today's binary reads v0.1.0's loader files");
        let (script_kind, text) = RealLoader::script_text(kind, 3);
        let rel = signed_release_with(
            &k,
            rels.path(),
            &ReleaseInputs {
                version: "v2",
                generation: 2,
                payload: b"two",
                kernel: pseudo_random(1000, 2),
                initrd: pseudo_random(1000, 3),
                arch: Arch::host(),
                images: Vec::new(),
            },
            vec![libupgrade::release::BootScript {
                kind: script_kind,
                text: text.clone(),
            }],
        );
        u.stage(
            &Release::at(Source::Path(rel)),
            &StageOptions::default(),
            &NoProgress,
        )
        .unwrap();
        assert_eq!(u.activate().unwrap(), Slot::B);
        let info = u.bootloader().script().unwrap();
        assert_eq!(
            info.installed,
            Some(info.newest_known),
            "{kind:?}: installed on activation"
        );
        let history = u.status().unwrap().slots[1].last_decision.clone().unwrap();
        assert!(
            history.why.contains("installs its"),
            "{kind:?}: {history:?}"
        );
        assert_eq!(
            node.reboot(),
            Slot::B,
            "{kind:?}: the trial boots under the new script"
        );
        std::fs::write(&node.cfg.release_file, "VERSION=v2\nGENERATION=2\n").unwrap();
        assert!(
            node.updater().confirm().expect_good("confirm").newly_good,
            "{kind:?}"
        );
        let st = node.updater().status().unwrap();
        assert_eq!(
            (st.slots[0].state, st.slots[1].state),
            (SlotState::Good, SlotState::Good)
        );
        assert!(
            st.loader_integrity.damaged.is_empty(),
            "{kind:?}: {:?}",
            st.loader_integrity
        );

        // A release made before v0.2.0 reads only version 1 of the loader's files.
        let old = make_release(&k, rels.path(), "v3-old", 3, 4096, Arch::host());
        strip_boot_section(&k, &old);
        let u = node.updater();
        u.stage(
            &Release::at(Source::Path(old)),
            &StageOptions::default(),
            &NoProgress,
        )
        .unwrap();
        if kind == Kind::Syslinux {
            // extlinux.conf is still version 1: both read it, the activation goes ahead.
            assert_eq!(u.activate().unwrap(), Slot::A);
            continue;
        }
        let before = node.loader.snapshot();
        let e = u.activate().unwrap_err();
        assert!(matches!(e, Error::BootScript { slot: Slot::A, .. }), "{e}");
        let t = e.to_string();
        assert!(
            t.contains("GRUB script is version 3") && t.contains("up to 1"),
            "{t}"
        );
        let mut after = node.loader.snapshot();
        let mut before = before;
        before.sort();
        after.sort();
        assert_eq!(after, before, "nothing written");
        assert_eq!(u.status().unwrap().slots[0].state, SlotState::Staged);
    }
}

/// Rewrite a release's manifest as a release made before v0.2.0 (no `boot` section), signed.
fn strip_boot_section(k: &Keys, dir: &Path) {
    let p = dir.join("manifest.json");
    let mut m = libupgrade::manifest::Manifest::parse(&std::fs::read(&p).unwrap()).unwrap();
    m.boot = None;
    let bytes = m.to_bytes();
    let key = libupgrade::signing::load_secret_key(&k.secret).unwrap();
    std::fs::write(
        dir.join("manifest.json.sig"),
        libupgrade::signing::sign_with(&bytes, &key),
    )
    .unwrap();
    std::fs::write(&p, bytes).unwrap();
}

/// A node of `kind` running v1 (confirmed) with v2 staged into B and activated, v2 carrying
/// the image archive `site` (issue 33).
fn staged_with_images(
    kind: Kind,
) -> (Node, Keys, tempfile::TempDir, libupgrade::manifest::Payload) {
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rootfs_payload = pseudo_random(4096, 2);
    let inputs = ReleaseInputs {
        version: "v2",
        generation: 2,
        payload: &rootfs_payload,
        kernel: pseudo_random(300_002, 102),
        initrd: pseudo_random(200_000, 202),
        arch: Arch::host(),
        images: Vec::new(),
    }
    .image(
        "site",
        image_archive("registry.local/site/app:2", &[pseudo_random(50_000, 7)]),
    );
    let rel = signed_release(&k, rels.path(), &inputs);
    let node = Node::new(&k.trust, kind);
    let u = node.updater();
    u.confirm().expect_good("first boot confirms");
    u.stage(
        &Release::at(Source::Path(rel.clone())),
        &StageOptions::default(),
        &NoProgress,
    )
    .unwrap();
    u.activate().unwrap();
    let m =
        libupgrade::manifest::Manifest::parse(&std::fs::read(rel.join("manifest.json")).unwrap())
            .unwrap();
    (node, k, rels, m.payloads[0].clone())
}

#[test]
fn a_trial_boot_links_its_image_archives_for_k3s_and_checks_their_images() {
    let (mut node, _k, _r, p) = staged_with_images(Kind::Grub);
    assert_eq!(node.reboot(), Slot::B);
    std::fs::write(&node.cfg.release_file, "VERSION=v2\nGENERATION=2\n").unwrap();
    let r = node.updater().confirm().expect_good("confirm");
    assert_eq!(r.verdict.outcome, Outcome::Blessed);
    let images = r
        .checks
        .iter()
        .find(|c| c.name == "images")
        .expect("the images check ran");
    assert!(
        images.ok && images.detail.starts_with("1 image(s) of 1 archive(s)"),
        "{images:?}"
    );
    let link = node.cfg.airgap_dir.join("k3os-site.tar");
    let object = libupgrade::payload::object_path(&node.cfg.state_dir, &p.file.sha256);
    assert_eq!(std::fs::read_link(&link).unwrap(), object);
    assert_eq!(
        libupgrade::payload::archive_images(&link).unwrap(),
        ["registry.local/site/app:2"]
    );
}

#[test]
fn a_trial_boot_links_no_object_that_is_not_its_name_even_one_with_the_right_images() {
    let (mut node, _k, _r, p) = staged_with_images(Kind::Grub);
    // Between the stage and the boot, the object is replaced by another archive of the same
    // size naming the same image: the images check alone would pass it.
    let forged = image_archive("registry.local/site/app:2", &[pseudo_random(50_000, 8)]);
    assert_eq!(forged.len() as u64, p.file.size);
    let object = libupgrade::payload::object_path(&node.cfg.state_dir, &p.file.sha256);
    std::fs::write(&object, &forged).unwrap();
    assert_eq!(node.reboot(), Slot::B);
    std::fs::write(&node.cfg.release_file, "VERSION=v2\nGENERATION=2\n").unwrap();
    let r = node.updater().confirm().unwrap();
    assert!(matches!(r.outcome(), Outcome::RolledBack { .. }), "{r:?}");
    assert!(r.failures().contains("k3os-site.tar"), "{}", r.failures());
    assert!(!node.cfg.airgap_dir.join("k3os-site.tar").exists());
    assert!(!object.exists(), "the forged object stayed in the store");
    let q = libupgrade::payload::quarantined(&node.cfg.state_dir);
    assert_eq!(q.len(), 1, "{q:?}");
    let moved = libupgrade::payload::quarantine_dir(&node.cfg.state_dir).join(&q[0].file);
    assert!(std::fs::read(moved).unwrap() == forged);
}

#[test]
fn a_trial_boot_whose_images_are_missing_rolls_back_naming_them() {
    for kind in KINDS {
        let (mut node, _k, _r, p) = staged_with_images(kind);
        // The object is lost between the stage and the boot (a damaged state partition).
        std::fs::remove_file(libupgrade::payload::object_path(
            &node.cfg.state_dir,
            &p.file.sha256,
        ))
        .unwrap();
        assert_eq!(node.reboot(), Slot::B);
        std::fs::write(&node.cfg.release_file, "VERSION=v2\nGENERATION=2\n").unwrap();
        let r = node.updater().confirm().unwrap();
        assert!(
            matches!(r.outcome(), Outcome::RolledBack { .. }),
            "{kind:?}: {r:?}"
        );
        assert!(
            r.failures().contains("images: ") && r.failures().contains("k3os-site.tar"),
            "{}",
            r.failures()
        );
        assert_eq!(
            node.reboot(),
            Slot::A,
            "{kind:?}: rolled back on the very next boot"
        );
        // v1 holds no archive: its boot removes v2's link and needs no images check.
        let r = node.updater().confirm().expect_good("confirm on A");
        assert!(r.checks.iter().all(|c| c.name != "images"), "{r:?}");
        assert!(std::fs::symlink_metadata(node.cfg.airgap_dir.join("k3os-site.tar")).is_err());
    }
}
