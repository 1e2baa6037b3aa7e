//! The syslinux backend against the real `extlinux` (Debian package extlinux) on a loop-mounted
//! ext4 (made with `-O ^64bit,^metadata_csum`, which extlinux needs): what Rust writes, extlinux
//! reads back, and vice versa, down to identical ADV bytes. Needs root and loop devices; fails
//! (never skips) saying why when they are not available.

use crate::common;

use std::path::{Path, PathBuf};

use bootconfig::{render_conf, Adv, SyslinuxBootloader, SyslinuxConfig, ADV_SIZE};
use bootconfig::{BootEntry, BootEnv, Bootloader, Slot, SlotBoot};
use common::{run, run_ok};

struct Mounted {
    _work: tempfile::TempDir,
    mnt: PathBuf,
    dir: PathBuf,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.mnt).status();
    }
}

fn mount_with_extlinux(primary: Slot) -> Mounted {
    let work = tempfile::tempdir().unwrap();
    let img = work.path().join("boot.img");
    let mnt = work.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run_ok(
        "mkfs.ext4",
        "e2fsprogs",
        &[
            "-q",
            "-F",
            "-O",
            "^64bit,^metadata_csum",
            img.to_str().unwrap(),
            "32M",
        ],
    );
    let out = run(
        "mount",
        "mount",
        &["-o", "loop", img.to_str().unwrap(), mnt.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "this test needs root and loop devices to mount an ext4 image for extlinux: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = Mounted {
        _work: work,
        dir: mnt.join("syslinux"),
        mnt,
    };
    std::fs::create_dir(&m.dir).unwrap();
    run_ok(
        "extlinux",
        "extlinux",
        &["--install", m.dir.to_str().unwrap()],
    );
    let e = |s: &str| BootEntry {
        kernel: format!("/{s}/vmlinuz"),
        initrd: format!("/{s}/initrd"),
        cmdline: "console=ttyS0".into(),
    };
    let cfg = SyslinuxConfig {
        entries: [e("a"), e("b")],
        primary,
        timeout_tenths: 0,
        serial: true,
        panic_secs: 5,
    };
    std::fs::write(m.dir.join("extlinux.conf"), render_conf(&cfg)).unwrap();
    m
}

fn extlinux(dir: &Path, arg: &str) {
    run_ok("extlinux", "extlinux", &[arg, dir.to_str().unwrap()]);
}

fn adv_bytes(dir: &Path) -> Vec<u8> {
    let b = std::fs::read(dir.join("ldlinux.sys")).unwrap();
    b[b.len() - 2 * ADV_SIZE..].to_vec()
}

fn set_adv(dir: &Path, bytes: &[u8]) {
    let p = dir.join("ldlinux.sys");
    let len = std::fs::metadata(&p).unwrap().len();
    bootconfig::write_at(&p, len - bytes.len() as u64, bytes).unwrap();
}

/// Physical extents of a file (FIEMAP via filefrag), to prove in-place writes.
fn extents(p: &Path) -> String {
    let out = run_ok("filefrag", "e2fsprogs", &["-v", p.to_str().unwrap()]);
    out.lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn extlinux_once_is_read_by_rust_and_clear_once_reverts() {
    let m = mount_with_extlinux(Slot::A);
    let s = SyslinuxBootloader::new(&m.dir);
    assert_eq!(
        s.read().unwrap(),
        BootEnv {
            primary: Slot::A,
            a: SlotBoot::Good,
            b: SlotBoot::Bad
        }
    );
    extlinux(&m.dir, "--once=b");
    let v = s.view().unwrap();
    assert!(v.adv_valid);
    assert_eq!((v.choice, v.once), (Slot::B, Some(Slot::B)));
    assert_eq!(v.env.b, SlotBoot::Trying { tries_left: 1 });
    extlinux(&m.dir, "--clear-once");
    let v = s.view().unwrap();
    assert_eq!((v.choice, v.once), (Slot::A, None));
}

#[test]
fn rust_try_slot_writes_the_adv_bytes_extlinux_once_writes() {
    let m = mount_with_extlinux(Slot::A);
    let s = SyslinuxBootloader::new(&m.dir);
    let ld = m.dir.join("ldlinux.sys");
    let before_extents = extents(&ld);
    // A second tag proves both sides keep what they do not own (and validate each other's ADV).
    extlinux(&m.dir, "--menu-save=a");
    let start = adv_bytes(&m.dir);

    s.try_slot(Slot::B, 1).unwrap();
    let ours = adv_bytes(&m.dir);
    set_adv(&m.dir, &start);
    extlinux(&m.dir, "--once=b");
    let theirs = adv_bytes(&m.dir);
    assert_eq!(
        ours, theirs,
        "ADV after Rust try_slot(B) vs extlinux --once=b"
    );
    assert_eq!(
        Adv::load(&ours.clone().try_into().unwrap()).0.get(2),
        Some(&b"a"[..]),
        "menu-save kept"
    );

    // mark_good clears the record exactly like --clear-once.
    s.mark_good(Slot::B).unwrap();
    let ours = adv_bytes(&m.dir);
    set_adv(&m.dir, &theirs);
    extlinux(&m.dir, "--clear-once");
    assert_eq!(
        ours,
        adv_bytes(&m.dir),
        "ADV after Rust mark_good vs extlinux --clear-once"
    );
    assert!(std::fs::read_to_string(m.dir.join("extlinux.conf"))
        .unwrap()
        .contains("\nDEFAULT b\n"));

    // Our writes went in place and kept extlinux's immutable flag.
    assert_eq!(extents(&ld), before_extents, "ldlinux.sys blocks moved");
    let attrs = run_ok("lsattr", "e2fsprogs", &[ld.to_str().unwrap()]);
    assert!(
        attrs.split_whitespace().next().unwrap().contains('i'),
        "immutable flag lost: {attrs}"
    );

    // extlinux reads what Rust wrote: after Rust try_slot(A), extlinux --menu-save keeps our record.
    s.try_slot(Slot::A, 1).unwrap();
    extlinux(&m.dir, "--menu-save=b");
    let v = s.view().unwrap();
    assert_eq!(
        (v.once, v.choice),
        (Some(Slot::A), Slot::A),
        "extlinux kept (so validated) Rust's ADV"
    );
}

#[test]
fn consumed_once_reads_as_exhausted_trial() {
    let m = mount_with_extlinux(Slot::A);
    let s = SyslinuxBootloader::new(&m.dir);
    s.try_slot(Slot::B, 1).unwrap();
    // What the loader does when it boots the record: clear it (same bytes as --clear-once).
    extlinux(&m.dir, "--clear-once");
    let v = s.view().unwrap();
    assert_eq!(
        v.env,
        BootEnv {
            primary: Slot::B,
            a: SlotBoot::Good,
            b: SlotBoot::Trying { tries_left: 0 }
        }
    );
    assert_eq!(v.choice, Slot::A);
    // A torn ADV copy 0 (cut mid-write) is ignored by extlinux too: it rewrites from copy 1.
    s.try_slot(Slot::B, 1).unwrap();
    let mut adv = adv_bytes(&m.dir);
    adv[300] ^= 0xff;
    set_adv(&m.dir, &adv);
    assert_eq!(
        s.view().unwrap().once,
        Some(Slot::B),
        "Rust falls back to copy 1"
    );
    extlinux(&m.dir, "--menu-save=a");
    let after = adv_bytes(&m.dir);
    assert!(Adv::copy_valid(&after[..ADV_SIZE]));
    assert_eq!(
        s.view().unwrap().once,
        Some(Slot::B),
        "extlinux also used copy 1"
    );
}
