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

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use bootconfig::syslinux::{render_conf, SyslinuxBootloader, SyslinuxConfig};
use bootconfig::{BootEntry, BootEnv, Bootloader, Slot, SlotBoot};
use common::{run, run_ok};

const PART_OFFSET: u64 = 1 << 20;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The kernel: `K3OS_TEST_KERNEL`, else extracted from the cached Debian package.
fn kernel(work: &Path) -> PathBuf {
    if let Ok(k) = std::env::var("K3OS_TEST_KERNEL") {
        return PathBuf::from(k);
    }
    let debs = workspace().join(".cache/debs/x86_64");
    let deb = std::fs::read_dir(&debs)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("linux-image-") && n.contains("amd64") && n.ends_with(".deb")
        })
        .unwrap_or_else(|| {
            panic!(
                "no kernel: set K3OS_TEST_KERNEL or put linux-image-*-amd64*.deb into {} \
                 (apt-get download linux-image-6.1.0-57-amd64)",
                debs.display()
            )
        });
    let x = work.join("kernel");
    std::fs::create_dir_all(&x).unwrap();
    let tar = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' --wildcards './boot/vmlinuz-*'",
            deb.display(),
            x.display()
        ))
        .status()
        .unwrap();
    assert!(
        tar.success(),
        "extracting the kernel from {} failed",
        deb.display()
    );
    let boot = x.join("boot");
    std::fs::read_dir(&boot)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
}

/// A gzip'd newc initramfs: busybox and an /init that prints the command line, then reboots
/// (`panic`: exits instead, so the kernel panics and `panic=1` reboots).
fn initrd(work: &Path, name: &str, panic: bool) -> PathBuf {
    let root = work.join(format!("ird-{name}"));
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("proc")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox"))
        .unwrap_or_else(|e| panic!("/bin/busybox (Debian package busybox-static) is needed: {e}"));
    let end = if panic {
        "echo K3OS-PANICKING; exit 1"
    } else {
        "/bin/busybox reboot -f"
    };
    let init = format!(
        "#!/bin/busybox sh\n/bin/busybox mount -t proc proc /proc\n\
         echo \"K3OS-CMDLINE $(/bin/busybox cat /proc/cmdline)\"\n{end}\n"
    );
    std::fs::write(root.join("init"), init).unwrap();
    run_ok(
        "chmod",
        "coreutils",
        &["+x", root.join("init").to_str().unwrap()],
    );
    let out = work.join(format!("{name}.img"));
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd '{}' && find . | cpio -o -H newc 2>/dev/null | gzip > '{}'",
            root.display(),
            out.display()
        ))
        .status()
        .unwrap();
    assert!(
        st.success(),
        "building initramfs {name} (cpio, gzip) failed"
    );
    out
}

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

/// Boot the disk once; returns the k3os.slot of the command line the kernel got.
fn boot(disk: &Path) -> (Slot, bool) {
    let out = run(
        "timeout",
        "coreutils",
        &[
            "180",
            "qemu-system-x86_64",
            "-accel",
            "tcg",
            "-m",
            "256",
            "-drive",
            &format!("file={},format=raw", disk.display()),
            "-nographic",
            "-no-reboot",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_ne!(
        out.status.code(),
        Some(127),
        "qemu-system-x86_64 (package qemu-system-x86) is needed"
    );
    let line = text
        .lines()
        .find_map(|l| l.find("K3OS-CMDLINE ").map(|i| l[i..].to_string()))
        .unwrap_or_else(|| {
            panic!(
                "the guest printed no command line ({}):\n{text}",
                out.status
            )
        });
    let slot = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("k3os.slot="))
        .unwrap_or_else(|| panic!("no k3os.slot= on the command line: {line}"))
        .parse()
        .unwrap();
    (slot, text.contains("K3OS-PANICKING"))
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
    run_ok(
        "truncate",
        "coreutils",
        &["-s", "64M", disk.to_str().unwrap()],
    );
    let mut sfdisk = std::process::Command::new("sfdisk")
        .args(["-q", disk.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("sfdisk (package fdisk) is needed");
    use std::io::Write;
    sfdisk
        .stdin
        .take()
        .unwrap()
        .write_all(b"label: dos\nstart=2048, type=83, bootable\n")
        .unwrap();
    assert!(sfdisk.wait().unwrap().success(), "sfdisk failed");
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
    eprintln!("syslinux QEMU: 5 boots in {:?}", started.elapsed());
}
