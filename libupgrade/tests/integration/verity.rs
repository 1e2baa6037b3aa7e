//! dm-verity on a real GPT disk image (loop devices): the stage computes the tree and FEC
//! after the squashfs and checks them against the signed manifest; `slot verify` repairs what
//! FEC can and marks a slot that rotted beyond it bad. veritysetup (userspace, no
//! device-mapper needed) checks what the node wrote.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use bootconfig::{Bootloader, Slot};
use libupgrade::manifest::{Arch, Manifest, Verity};
use libupgrade::release::{CreateOptions, VerityOptions};
use libupgrade::state::SlotState;
use libupgrade::{Error, NoProgress, Release, Source, Updater};
use testkit::sim::SimNode;
use testkit::*;

/// A signed release whose rootfs (a real squashfs of `payload_len` noise bytes) carries
/// dm-verity; `tamper` edits the manifest before it is signed again with the same key.
fn verity_release(k: &Keys, out: &Path, version: &str, tamper: Option<fn(&mut Verity)>) -> PathBuf {
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    std::fs::create_dir_all(tree.join("usr/share")).unwrap();
    std::fs::write(tree.join("usr/share/payload"), pseudo_random(3 << 20, 5)).unwrap();
    let sq = work.path().join("rootfs.squashfs");
    testkit::squashfs(&tree, &sq, &["-comp", "gzip"]);
    for (n, seed) in [("vmlinuz", 1), ("initrd", 2)] {
        std::fs::write(work.path().join(n), pseudo_random(100_000, seed)).unwrap();
    }
    let dir = out.join(version);
    let opts = CreateOptions {
        rootfs: sq,
        kernel: work.path().join("vmlinuz"),
        initrd: work.path().join("initrd"),
        version: version.into(),
        arch: Arch::host(),
        secret_key: k.secret.clone(),
        out_dir: dir.clone(),
        generation: Some(2),
        scripts: Vec::new(),
        payloads: Vec::new(),
    };
    let vo = Some(VerityOptions { fec_roots: 2 });
    libupgrade::release::create_with_verity(&opts, None, &[], vo, &NoProgress).unwrap();
    if let Some(edit) = tamper {
        let mut m = Manifest::parse(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
        edit(m.verity.as_mut().unwrap());
        std::fs::write(dir.join("manifest.json"), m.to_bytes()).unwrap();
        let sig = libupgrade::signing::sign(&m.to_bytes(), &k.secret).unwrap();
        std::fs::write(dir.join("manifest.json.sig"), sig).unwrap();
    }
    dir
}

/// Stage the verity release `rel` into B with the fast options.
fn stage(u: &Updater, rel: &Path) {
    u.stage(
        &Release::at(Source::Path(rel.to_path_buf())),
        &fast_stage(),
        &NoProgress,
    )
    .unwrap();
}

fn verity_of(rel: &Path) -> Verity {
    let m = Manifest::parse(&std::fs::read(rel.join("manifest.json")).unwrap()).unwrap();
    m.verity.unwrap()
}

/// Write `bytes` over slot B's partition at `pos`, through the disk's loop device (what the
/// layout reads), as a bad sector or an offline edit would.
fn damage_b(disk: &TestDisk, pos: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&disk.disk.path)
        .unwrap();
    f.write_all_at(bytes, disk.parts["rootfs-b"].0 + pos)
        .unwrap();
    f.sync_all().unwrap();
}

fn read_b(disk: &TestDisk, len: u64) -> Vec<u8> {
    let f = std::fs::File::open(&disk.disk.path).unwrap();
    let mut v = vec![0u8; len as usize];
    f.read_exact_at(&mut v, disk.parts["rootfs-b"].0).unwrap();
    v
}

/// veritysetup verify over slot B's bytes (data and tree where the manifest says; with
/// `fec`, veritysetup also corrects with the FEC area the node wrote, in memory).
fn veritysetup_verifies(disk: &TestDisk, v: &Verity, fec: bool) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("b.img");
    std::fs::write(&img, read_b(disk, v.slot_bytes())).unwrap();
    let mut c = Command::new("veritysetup");
    c.args(["verify", "--no-superblock", &format!("--salt={}", v.salt)])
        .arg(format!("--hash-offset={}", v.hash_offset))
        .arg(format!("--data-blocks={}", v.data_blocks));
    if fec {
        c.arg(format!("--fec-offset={}", v.fec_offset))
            .arg(format!("--fec-roots={}", v.fec_roots))
            .arg("--fec-device")
            .arg(&img);
    }
    c.arg(&img).arg(&img).arg(&v.root_hash);
    c.status().unwrap().success()
}

#[test]
fn stage_writes_a_tree_and_fec_veritysetup_verifies_and_scrub_repairs_or_marks_bad() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = verity_release(&k, rels.path(), "v2", None);
    let v = verity_of(&rel);
    let u = disk.updater(disk.config(&k.trust));
    let a_before = disk.part_bytes("rootfs-a", 24 * MIB);
    u.stage(
        &Release::at(Source::Path(rel.clone())),
        &fast_stage(),
        &NoProgress,
    )
    .unwrap();
    assert_eq!(u.status().unwrap().slots[1].state, SlotState::Staged);
    assert!(
        veritysetup_verifies(&disk, &v, false),
        "veritysetup verify of slot B"
    );
    let pristine = read_b(&disk, v.slot_bytes());

    // A few bytes flipped in two data blocks and in the tree: corrected and counted.
    damage_b(&disk, 10 * 4096 + 7, b"\xff\x00\xff");
    damage_b(&disk, 500 * 4096, b"rot");
    damage_b(&disk, v.hash_offset + 4096 + 100, b"\x01");
    assert!(!veritysetup_verifies(&disk, &v, false));
    // veritysetup corrects the same damage with the FEC area the node computed.
    assert!(veritysetup_verifies(&disk, &v, true));
    let report = u.verify_slots(false).unwrap();
    // The damaged tree block (level 0, data blocks 0-127) hides block 10's state until it
    // is repaired.
    let found = report[1].outcome.clone().unwrap();
    let tree_block = v.data_blocks + 1;
    assert_eq!(
        (found.first_damaged, found.unverified),
        (vec![tree_block, 500], 128),
        "{report:?}"
    );
    assert!(
        read_b(&disk, v.slot_bytes()) != pristine,
        "report only: nothing written"
    );
    let r = u.verify_slots(true).unwrap();
    assert_eq!(
        r[0].skipped.as_deref(),
        Some("no signed manifest is kept for it")
    );
    let b = &r[1];
    assert!(b.clean() && !b.marked_bad, "{b:?}");
    assert_eq!(b.outcome.as_ref().unwrap().repaired, 3);
    assert!(
        read_b(&disk, v.slot_bytes()) == pristine,
        "repaired to the staged bytes"
    );
    assert_eq!(u.status().unwrap().slots[1].state, SlotState::Staged);

    // Three whole blocks of one FEC round (2 roots correct two): marked bad, never booted.
    let g = v.data_blocks + v.hash_size / 4096;
    let rounds = g.div_ceil(253);
    for j in 0..3 {
        damage_b(&disk, (3 + j * rounds) * 4096, &[0x5a; 4096]);
    }
    let r = u.verify_slots(true).unwrap();
    let b = &r[1];
    assert!(!b.clean() && b.marked_bad, "{b:?}");
    assert_eq!(
        b.outcome.as_ref().unwrap().first_damaged,
        vec![3, 3 + rounds, 3 + 2 * rounds]
    );
    let st = u.status().unwrap();
    assert_eq!(st.slots[1].state, SlotState::Bad);
    let why = st.slots[1].last_decision.as_ref().unwrap().why.clone();
    assert!(why.starts_with("dm-verity scrub: 3 of"), "{why}");
    assert!(
        disk.part_bytes("rootfs-a", 24 * MIB) == a_before,
        "slot A untouched"
    );
}

/// A release signed with a root hash its rootfs does not have (a publisher's or a forger's
/// edit) is refused after the write: slot B stays invalid, slot A is byte-identical, the
/// refusal names both hashes once.
#[test]
fn a_signed_root_hash_the_rootfs_does_not_have_leaves_the_slot_invalid() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = verity_release(
        &k,
        rels.path(),
        "v2",
        Some(|v| v.root_hash = "ab".repeat(32)),
    );
    let u = disk.updater(disk.config(&k.trust));
    let a_before = disk.part_bytes("rootfs-a", 24 * MIB);
    let e = u
        .stage(&Release::at(Source::Path(rel)), &fast_stage(), &NoProgress)
        .unwrap_err();
    assert!(matches!(e, Error::Verity { slot: Slot::B, .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.starts_with("dm-verity of slot B (v2): the rootfs written hashes to root ")
            && msg.ends_with(&format!("the signed manifest says {}", "ab".repeat(32)))
            && msg.matches(&"ab".repeat(32)).count() == 1,
        "{msg}"
    );
    let st = u.status().unwrap();
    assert_eq!(st.slots[1].state, SlotState::Invalid);
    assert_eq!(st.next_boot, Slot::A);
    assert!(
        disk.part_bytes("rootfs-a", 24 * MIB) == a_before,
        "slot A untouched"
    );
}

/// The booted slot is only read: its damage is reported, nothing is written to it and it is
/// not marked bad (its reads go through the kernel's dm-verity).
#[test]
fn the_booted_slot_is_read_never_written_nor_marked_bad() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = verity_release(&k, rels.path(), "v2", None);
    let v = verity_of(&rel);
    let cfg = disk.config(&k.trust);
    let u = disk.updater(cfg.clone());
    u.stage(&Release::at(Source::Path(rel)), &fast_stage(), &NoProgress)
        .unwrap();
    boot_as(&cfg, Slot::B, "boot-2");
    damage_b(&disk, 7 * 4096, b"rot");
    let damaged = read_b(&disk, v.slot_bytes());
    let r = u.verify_slots(true).unwrap();
    let b = &r[1];
    assert!(b.booted && !b.marked_bad && !b.clean(), "{b:?}");
    assert_eq!(b.outcome.as_ref().unwrap().first_damaged, vec![7]);
    assert_eq!(b.outcome.as_ref().unwrap().repaired, 0);
    assert!(
        read_b(&disk, v.slot_bytes()) == damaged,
        "the booted slot was written"
    );
    assert_eq!(u.status().unwrap().slots[1].state, SlotState::Staged);
}

/// A partition with room for the squashfs but not for its tree and FEC is refused naming
/// both sizes; the slot stays invalid and slot A is untouched.
#[test]
fn a_partition_without_room_for_tree_and_fec_is_refused() {
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = verity_release(&k, rels.path(), "v2", None);
    let v = verity_of(&rel);
    // Room for the squashfs and one more block, not for the tree and FEC (512-byte sectors).
    let disk = TestDisk::new((v.hash_offset + 4096).div_ceil(512) * 512);
    let u = disk.updater(disk.config(&k.trust));
    let a_before = disk.part_bytes("rootfs-a", v.hash_offset);
    let e = u
        .stage(&Release::at(Source::Path(rel)), &fast_stage(), &NoProgress)
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::NoSpace { .. }), "{e:?}");
    assert!(
        msg.contains("squashfs, dm-verity tree and FEC")
            && msg.contains(&format!(
                "needs {}",
                libupgrade::units::Size(v.slot_bytes())
            )),
        "{msg}"
    );
    assert_eq!(u.status().unwrap().slots[1].state, SlotState::Invalid);
    assert!(disk.part_bytes("rootfs-a", v.hash_offset) == a_before);
}

/// A slot staged by a k3os-ops that ignored `verity` holds no tree: the scrub does not judge
/// it (it would find every block "damaged" and mark a good fallback bad).
#[test]
fn a_slot_whose_tree_this_node_never_wrote_is_not_judged() {
    let disk = TestDisk::new(24 * MIB);
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = verity_release(&k, rels.path(), "v2", None);
    let v = verity_of(&rel);
    let u = disk.updater(disk.config(&k.trust));
    u.stage(&Release::at(Source::Path(rel)), &fast_stage(), &NoProgress)
        .unwrap();
    let mark = disk.state_dir.join("slots/b/verity-written");
    assert_eq!(std::fs::read_to_string(&mark).unwrap().trim(), v.root_hash);
    // As an earlier k3os-ops leaves it: no mark, and whatever follows the squashfs.
    std::fs::remove_file(&mark).unwrap();
    damage_b(
        &disk,
        v.hash_offset,
        &vec![0u8; (v.hash_size + v.fec_size) as usize],
    );
    let r = u.verify_slots(true).unwrap();
    let b = &r[1];
    assert!(b.clean() && !b.marked_bad && b.outcome.is_none(), "{b:?}");
    assert!(
        b.skipped
            .as_deref()
            .unwrap()
            .starts_with("its dm-verity tree was never written"),
        "{b:?}"
    );
    assert_eq!(u.status().unwrap().slots[1].state, SlotState::Staged);
}

/// Activation tells the loader the slot's signed root hash with the geometry the initramfs
/// opens the device with (what GRUB script 3 passes as `k3os.verity=`) only when this node
/// wrote that root's tree into the slot; a slot whose tree was never written boots without
/// dm-verity, as before.
#[test]
fn activation_passes_the_root_hash_only_for_a_tree_this_node_wrote() {
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = verity_release(&k, rels.path(), "v2", None);
    let v = verity_of(&rel);
    for written in [true, false] {
        let node = SimNode::new(&k.trust, 1, 1);
        let u = node.updater();
        stage(&u, &rel);
        let record = node.cfg.state_dir.join("slots/b/verity-written");
        assert!(record.exists(), "the stage records the tree it wrote");
        if !written {
            std::fs::remove_file(&record).unwrap();
        }
        assert_eq!(node.loader.verity(Slot::B).unwrap(), None);
        u.activate().unwrap();
        let passed = node.loader.verity(Slot::B).unwrap();
        // Root hash, salt, data blocks, then the tree's and the FEC area's starts in 4 KiB
        // blocks of the partition (contiguous after the squashfs) and the FEC roots.
        let want = written.then(|| {
            format!(
                "{},{},{},{},{},{}",
                v.root_hash,
                v.salt,
                v.data_blocks,
                v.data_blocks,
                v.fec_offset / 4096,
                v.fec_roots
            )
        });
        assert_eq!(passed, want, "tree written: {written}");
        assert_eq!(
            node.loader.verity(Slot::A).unwrap(),
            None,
            "slot A untouched"
        );
    }
}

/// The confirm step: a trial boot whose command line names another dm-verity root hash than
/// the staged release signs is unhealthy and falls back, with the check as the why; the
/// signed one is blessed. (The simulated node has no GRUB: the command line is written here
/// as GRUB script 3 passes it, from what activation told the loader.)
#[test]
fn a_trial_booted_with_another_root_hash_falls_back_and_the_signed_one_is_blessed() {
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = verity_release(&k, rels.path(), "v2", None);
    let v = verity_of(&rel);
    for (root, blessed) in [("ab".repeat(32), false), (v.root_hash.clone(), true)] {
        let passed = |node: &SimNode| node.loader.verity(Slot::B).unwrap().unwrap();
        let mut node = SimNode::new(&k.trust, 1, 1);
        let u = node.updater();
        stage(&u, &rel);
        u.activate().unwrap();
        // What the loader passes, its root hash replaced by `root`.
        let value = passed(&node).replacen(&v.root_hash, &root, 1);
        assert_eq!(node.power_cycle(), Slot::B);
        let line = std::fs::read_to_string(&node.cfg.proc_cmdline).unwrap();
        std::fs::write(
            &node.cfg.proc_cmdline,
            format!("{} k3os.verity={value}\n", line.trim()),
        )
        .unwrap();
        std::fs::write(&node.cfg.release_file, "VERSION=v2\nGENERATION=2\n").unwrap();
        let r = node.init_confirm().unwrap();
        let check = r
            .checks
            .iter()
            .find(|c| c.name == "verity")
            .expect("the verity check ran");
        assert_eq!((check.ok, r.is_good()), (blessed, blessed), "{r:?}");
        if !blessed {
            assert_eq!(
                node.updater().status().unwrap().next_boot,
                Slot::A,
                "falls back to A"
            );
            assert!(
                r.failures()
                    .contains(&format!("but its release v2 signs {}", v.root_hash)),
                "{}",
                r.failures()
            );
        }
    }
}

/// A trial whose initramfs recorded a dm-verity failure (`<state_dir>/verity-failure`, as
/// images/files/initrd-init.sh writes it before it reboots) falls back, and the fallback's why
/// (what `slot status` shows) names it; the record is used once. Without a record the why is
/// the loader's alone, as before.
#[test]
fn a_fallback_after_a_recorded_verity_failure_names_it_once() {
    let k = keys();
    let rels = tempfile::tempdir().unwrap();
    let rel = verity_release(&k, rels.path(), "v2", None);
    for recorded in [true, false] {
        let mut node = SimNode::new(&k.trust, 1, 1);
        let u = node.updater();
        stage(&u, &rel);
        u.activate().unwrap();
        assert_eq!(node.power_cycle(), Slot::B, "the trial");
        let record = node.cfg.state_dir.join("verity-failure");
        if recorded {
            std::fs::write(
                &record,
                "format=1\nslot=B\nreason=mount squashfs /dev/dm-0 \n",
            )
            .unwrap();
        }
        assert_eq!(node.power_cycle(), Slot::A, "one try, used: fallback");
        let r = node.init_confirm().unwrap();
        let why = r.other_slot.expect("the fallback was settled").why;
        assert!(why.starts_with("slot B did not confirm"), "{why}");
        assert_eq!(
            why.ends_with("; its initramfs recorded a dm-verity failure: mount squashfs /dev/dm-0"),
            recorded,
            "{why}"
        );
        assert!(!record.exists(), "used once");
        let st = node.updater().status().unwrap();
        assert_eq!(st.slots[1].state, SlotState::Bad);
    }
}
