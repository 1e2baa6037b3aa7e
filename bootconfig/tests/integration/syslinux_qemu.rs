//! The syslinux backend booting for real: a BIOS disk (syslinux mbr.bin, one ext4 partition
//! with `extlinux --install`, our `render_conf`) booted in QEMU (TCG) with the Debian amd64
//! kernel and a busybox initramfs that prints /proc/cmdline. Proves the one-try contract:
//! after `try_slot(B)` syslinux boots B exactly once (consuming the ADV record itself), a
//! panicking B falls back to `DEFAULT` A, `read` then shows B as an exhausted trial, and after
//! `mark_good(B)` B boots every time.
//!
//! Needs root, loop devices, qemu-system-x86, extlinux, busybox-static and the kernel package
//! `linux-image-*-amd64*.deb` in `<workspace>/.cache/debs/x86_64/` (where the image build
//! downloads it) or a kernel path in `K3OS_TEST_KERNEL`. Fails, saying which, when missing.
// A scenario test or benchmark reads top to bottom as one story: the 80-line function rule
// (clippy.toml) is for the code it exercises.
#![allow(clippy::too_many_lines)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use bootconfig::{render_conf, SyslinuxBootloader, SyslinuxConfig};
use bootconfig::{BootEntry, BootEnv, Bootloader, Slot, SlotBoot};
use common::qemu::{boot, boot_cmdline, initrd, kernel, PART_OFFSET};
use common::{run, run_ok};

struct Mount {
    mnt: PathBuf,
}

impl Mount {
    fn new(disk: &Path, mnt: &Path) -> Mount {
        let out = run(
            "mount",
            "mount",
            &[
                "-o",
                &format!("loop,offset={PART_OFFSET}"),
                disk.to_str().unwrap(),
                mnt.to_str().unwrap(),
            ],
        );
        assert!(
            out.status.success(),
            "this test needs root and loop devices: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Mount {
            mnt: mnt.to_path_buf(),
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.mnt).status();
    }
}

#[test]
fn syslinux_boots_a_trial_once_falls_back_and_keeps_a_confirmed_slot() {
    let started = Instant::now();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let kernel = kernel(w);
    let good = initrd(w, "good", false);
    let panicking = initrd(w, "panic", true);
    let disk = w.join("disk.img");
    let mnt = w.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    common::qemu::dos_disk(&disk);
    run_ok(
        "dd",
        "coreutils",
        &[
            "if=/usr/lib/syslinux/mbr/mbr.bin",
            &format!("of={}", disk.display()),
            "bs=440",
            "count=1",
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
            "-O",
            "^64bit,^metadata_csum",
            "-E",
            &format!("offset={PART_OFFSET}"),
            disk.to_str().unwrap(),
            "60M",
        ],
    );
    let entry = |s: &str| BootEntry {
        kernel: format!("/{s}/vmlinuz"),
        initrd: format!("/{s}/initrd"),
        cmdline: "console=ttyS0".into(),
    };
    let cfg = SyslinuxConfig {
        entries: [entry("a"), entry("b")],
        primary: Slot::A,
        timeout_tenths: 0,
        serial: true,
        panic_secs: 1,
    };
    {
        let m = Mount::new(&disk, &mnt);
        for s in ["a", "b", "syslinux"] {
            std::fs::create_dir(m.mnt.join(s)).unwrap();
        }
        for s in ["a", "b"] {
            std::fs::copy(&kernel, m.mnt.join(s).join("vmlinuz")).unwrap();
        }
        std::fs::copy(&good, m.mnt.join("a/initrd")).unwrap();
        std::fs::copy(&panicking, m.mnt.join("b/initrd")).unwrap();
        let dir = m.mnt.join("syslinux");
        run_ok(
            "extlinux",
            "extlinux",
            &["--install", dir.to_str().unwrap()],
        );
        std::fs::write(dir.join("extlinux.conf"), render_conf(&cfg)).unwrap();
        let s = SyslinuxBootloader::new(&dir);
        s.install(&BootEnv {
            primary: Slot::A,
            a: SlotBoot::Good,
            b: SlotBoot::Bad,
        })
        .unwrap();
        s.try_slot(Slot::B, 1).unwrap();
    }
    // Trial boot of a broken B: booted once, panics, reboots.
    assert_eq!(boot(&disk), (Slot::B, true));
    {
        let m = Mount::new(&disk, &mnt);
        let v = SyslinuxBootloader::new(m.mnt.join("syslinux"))
            .view()
            .unwrap();
        assert_eq!(v.once, None, "syslinux consumed the boot-once record");
        assert_eq!(
            v.env,
            BootEnv {
                primary: Slot::B,
                a: SlotBoot::Good,
                b: SlotBoot::Trying { tries_left: 0 }
            }
        );
        assert_eq!(v.choice, Slot::A);
    }
    assert_eq!(
        boot(&disk),
        (Slot::A, false),
        "fell back to the confirmed slot"
    );
    // A fixed B is staged, tried, confirmed: then it is the default.
    {
        let m = Mount::new(&disk, &mnt);
        let s = SyslinuxBootloader::new(m.mnt.join("syslinux"));
        s.mark_bad(Slot::B).unwrap();
        std::fs::copy(&good, m.mnt.join("b/initrd")).unwrap();
        s.try_slot(Slot::B, 1).unwrap();
    }
    assert_eq!(boot(&disk), (Slot::B, false));
    {
        let m = Mount::new(&disk, &mnt);
        let s = SyslinuxBootloader::new(m.mnt.join("syslinux"));
        assert_eq!(s.read().unwrap().b, SlotBoot::Trying { tries_left: 0 });
        s.mark_good(Slot::B).unwrap();
    }
    assert_eq!(boot(&disk), (Slot::B, false));
    assert_eq!(boot(&disk), (Slot::B, false));
    // Slot B's dm-verity root hash on its APPEND line reaches the kernel.
    let hash = "a5".repeat(32);
    {
        let m = Mount::new(&disk, &mnt);
        let s = SyslinuxBootloader::new(m.mnt.join("syslinux"));
        assert!(s.set_verity(Slot::B, Some(&hash)).unwrap());
    }
    let (slot, _, line) = boot_cmdline(&disk);
    assert_eq!(slot, Slot::B);
    assert!(line.contains(&format!("k3os.verity={hash}")), "{line}");
    eprintln!("syslinux QEMU: 6 boots in {:?}", started.elapsed());
}
