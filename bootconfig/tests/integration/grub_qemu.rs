//! The GRUB backend booting for real: a BIOS disk (GRUB's boot.img in the MBR, a core.img
//! from `grub-mkimage` in the post-MBR gap, one ext4 partition holding our `render_cfg`
//! grub.cfg, the env files from `GrubBootloader::install`, and two slots) booted in QEMU (TCG)
//! with the Debian amd64 kernel and a busybox initramfs that prints /proc/cmdline. Proves on the
//! real firmware path what grub-emu proves for the script: a trial slot gets exactly
//! `max_tries` boots (GRUB's own `save_env` counting down on disk), a panicking slot reboots
//! (`panic=`), GRUB then falls back to the confirmed slot, and `read` sees the exhausted trial.
//!
//! Needs qemu-system-x86, grub-pc-bin, e2fsprogs, fdisk, busybox-static and the kernel package
//! `linux-image-*-amd64*.deb` in `<workspace>/.cache/debs/x86_64/` or `K3OS_TEST_KERNEL`.
//! Fails, saying which, when missing.
// A scenario test or benchmark reads top to bottom as one story: the 80-line function rule
// (clippy.toml) is for the code it exercises.
#![allow(clippy::too_many_lines)]

use crate::common;

use std::path::Path;
use std::time::Instant;

use bootconfig::{render_cfg, GrubBootloader, GrubConfig};
use bootconfig::{BootEntry, BootEnv, Bootloader, Slot, SlotBoot};
use common::qemu::{boot, boot_cmdline, initrd, kernel, PART_OFFSET};
use common::run_ok;

/// A BIOS disk: GRUB's boot.img in the MBR, `core` at LBA 1 (its built-in block list points at
/// LBA 2 onwards), and the ext4 partition made from `root` at 1 MiB.
fn make_disk(disk: &Path, root: &Path, core: &Path) {
    let _ = std::fs::remove_file(disk);
    common::qemu::dos_disk(disk);
    let d = format!("of={}", disk.display());
    run_ok(
        "dd",
        "coreutils",
        &[
            "if=/usr/lib/grub/i386-pc/boot.img",
            &d,
            "bs=440",
            "count=1",
            "conv=notrunc",
            "status=none",
        ],
    );
    run_ok(
        "dd",
        "coreutils",
        &[
            &format!("if={}", core.display()),
            &d,
            "bs=512",
            "seek=1",
            "conv=notrunc",
            "status=none",
        ],
    );
    run_ok(
        "mkfs.ext4",
        "e2fsprogs",
        &[
            "-q",
            "-F",
            "-d",
            root.to_str().unwrap(),
            "-E",
            &format!("offset={PART_OFFSET}"),
            disk.to_str().unwrap(),
            "60M",
        ],
    );
}

/// Copy /grub/k3os/* from the disk's partition back into `grub_dir/k3os` (debugfs on a copy
/// of the partition).
fn read_back(disk: &Path, grub_dir: &Path, work: &Path) {
    let part = work.join("part.img");
    run_ok(
        "dd",
        "coreutils",
        &[
            &format!("if={}", disk.display()),
            &format!("of={}", part.display()),
            "bs=1M",
            "skip=1",
            "status=none",
        ],
    );
    for f in ["env1", "env2", "lock1", "lock2"] {
        let out = run_ok(
            "debugfs",
            "e2fsprogs",
            &["-R", &format!("cat /grub/k3os/{f}"), part.to_str().unwrap()],
        );
        std::fs::write(grub_dir.join("k3os").join(f), out.as_bytes()).unwrap();
    }
}

#[test]
fn bios_grub_counts_a_trial_down_and_falls_back() {
    let started = Instant::now();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let kernel = kernel(w);
    let good = initrd(w, "good", false);
    let panicking = initrd(w, "panic", true);
    let core = w.join("core.img");
    run_ok(
        "grub-mkimage",
        "grub-pc-bin",
        &[
            "-O",
            "i386-pc",
            "-o",
            core.to_str().unwrap(),
            "-p",
            "(hd0,msdos1)/grub",
            "biosdisk",
            "part_msdos",
            "ext2",
            "normal",
            "linux",
            "echo",
            "test",
            "true",
            "loadenv",
            "serial",
            "terminal",
        ],
    );
    let root = w.join("root");
    let grub = root.join("grub");
    std::fs::create_dir_all(&grub).unwrap();
    for s in ["a", "b"] {
        std::fs::create_dir_all(root.join(s)).unwrap();
        std::fs::copy(&kernel, root.join(s).join("vmlinuz")).unwrap();
    }
    std::fs::copy(&good, root.join("a/initrd")).unwrap();
    std::fs::copy(&panicking, root.join("b/initrd")).unwrap();
    let entry = |s: &str| BootEntry {
        kernel: format!("/{s}/vmlinuz"),
        initrd: format!("/{s}/initrd"),
        cmdline: "console=ttyS0".into(),
    };
    let max = 2;
    let cfg = GrubConfig {
        entries: [entry("a"), entry("b")],
        max_tries: max,
        timeout_secs: 0,
        serial: true,
        panic_secs: 1,
    };
    std::fs::write(grub.join("grub.cfg"), render_cfg(&cfg)).unwrap();
    let g = GrubBootloader::new(&grub, max);
    g.install(&BootEnv {
        primary: Slot::A,
        a: SlotBoot::Good,
        b: SlotBoot::Bad,
    })
    .unwrap();
    g.try_slot(Slot::B, max).unwrap();
    let disk = w.join("disk.img");
    make_disk(&disk, &root, &core);
    let mut boots = Vec::new();
    for _ in 0..4 {
        boots.push(boot(&disk));
    }
    assert_eq!(
        boots,
        [
            (Slot::B, true),
            (Slot::B, true),
            (Slot::A, false),
            (Slot::A, false)
        ]
    );
    read_back(&disk, &grub, w);
    assert_eq!(
        g.read().unwrap(),
        BootEnv {
            primary: Slot::B,
            a: SlotBoot::Good,
            b: SlotBoot::Trying { tries_left: 0 }
        }
    );
    // A fixed B, tried and confirmed, then boots every time.
    std::fs::copy(&good, root.join("b/initrd")).unwrap();
    g.mark_bad(Slot::B).unwrap();
    g.try_slot(Slot::B, 1).unwrap();
    make_disk(&disk, &root, &core);
    assert_eq!(boot(&disk), (Slot::B, false));
    read_back(&disk, &grub, w);
    assert_eq!(g.read().unwrap().b, SlotBoot::Trying { tries_left: 0 });
    g.mark_good(Slot::B).unwrap();
    make_disk(&disk, &root, &core);
    assert_eq!(boot(&disk), (Slot::B, false));
    assert_eq!(boot(&disk), (Slot::B, false));
    // Script 3: slot B's dm-verity root hash reaches its kernel command line.
    let hash = "5a".repeat(32);
    assert!(g.set_verity(Slot::B, Some(&hash)).unwrap());
    make_disk(&disk, &root, &core);
    let (slot, _, line) = boot_cmdline(&disk);
    assert_eq!(slot, Slot::B);
    assert!(line.contains(&format!("k3os.verity={hash}")), "{line}");
    eprintln!("BIOS GRUB QEMU: 8 boots in {:?}", started.elapsed());
}
