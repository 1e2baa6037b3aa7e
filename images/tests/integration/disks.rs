//! End-to-end: build the v1 release and all three x86_64 disks from the cached Debian packages
//! and the static k3os-ops, read every disk back the way a node does (GPT by name, the boot
//! partition's loader state through bootconfig, slot A's bytes), and boot the BIOS GRUB disk
//! under QEMU (TCG) to `K3OS-BOOTED slot=A version=v1`.
//!
//! Needs root (extlinux loop-mounts its partition image), the packages scripts/setup.sh
//! installs, `images/scripts/fetch-debs.sh x86_64` (run here; it is
//! cached) and `target/x86_64-unknown-linux-musl/release/k3os-ops` (`just images-x86_64`
//! builds it). Anything missing fails the test with what to do.
// A scenario test or benchmark reads top to bottom as one story: the 80-line function rule
// (clippy.toml) is for the code it exercises.
#![allow(clippy::too_many_lines)]

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bootconfig::GrubBootloader;
use bootconfig::SyslinuxBootloader;
use bootconfig::{Bootloader, Slot};
use byteorder::{ByteOrder, LittleEndian as LE};
use k3os_images::debs::Debs;
use k3os_images::disk;
use k3os_images::release::{ensure_keys, ReleaseBuilder};
use k3os_images::spec::{BootVariant, DiskSpec, ReleaseSpec, Sizes};
use k3os_images::target::Target;
use libupgrade::layout::GptLayout;
use libupgrade::manifest::Arch;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn debs_root() -> PathBuf {
    let st = Command::new(repo().join("images/scripts/fetch-debs.sh"))
        .arg("x86_64")
        .stdout(Stdio::null())
        .status()
        .expect("run images/scripts/fetch-debs.sh");
    assert!(
        st.success(),
        "images/scripts/fetch-debs.sh x86_64 failed (apt-get download needs the Debian mirror)"
    );
    repo().join(".cache/debs/x86_64/root")
}

fn k3os_ops() -> PathBuf {
    let p = repo().join("target/x86_64-unknown-linux-musl/release/k3os-ops");
    assert!(
        p.is_file(),
        "{} is missing: build it first with `cargo build --release -p k3os-ops --target x86_64-unknown-linux-musl` (or `just images-x86_64`)",
        p.display()
    );
    p
}

/// Copy partition `name` of `disk` out to `to`.
fn extract_part(disk: &Path, name: &str, to: &Path) {
    let g = gpt::GptConfig::new().writable(false).open(disk).unwrap();
    let (_, p) = g
        .partitions()
        .iter()
        .find(|(_, p)| p.name == name)
        .unwrap_or_else(|| panic!("no partition {name}"));
    let mut f = fs::File::open(disk).unwrap();
    f.seek(SeekFrom::Start(p.first_lba * 512)).unwrap();
    let mut buf = vec![0u8; ((p.last_lba + 1 - p.first_lba) * 512) as usize];
    f.read_exact(&mut buf).unwrap();
    fs::write(to, buf).unwrap();
}

/// `debugfs rdump` a directory of an ext4 image (no mount).
fn rdump(img: &Path, dir: &str, to: &Path) -> PathBuf {
    fs::create_dir_all(to).unwrap();
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(format!("rdump {dir} {}", to.display()))
        .arg(img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "debugfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    to.join(dir.trim_start_matches('/'))
}

fn debugfs_cat(img: &Path, file: &str) -> Vec<u8> {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(format!("cat {file}"))
        .arg(img)
        .output()
        .unwrap();
    assert!(out.status.success());
    out.stdout
}

#[test]
fn x86_64_disks_are_what_nodes_expect_and_bios_grub_boots() {
    let target = Target::new(Arch::X86_64);
    let debs = Debs::locate(&debs_root(), target).unwrap();
    let ops = k3os_ops();
    let out = tempfile::Builder::new()
        .prefix("images-test.")
        .tempdir_in(repo().join("target"))
        .unwrap();
    let (secret, public) = ensure_keys(&ops, &out.path().join("keys")).unwrap();
    let builder = ReleaseBuilder {
        target,
        debs: debs.clone(),
        k3os_ops: ops.clone(),
        // Built with it (`cargo build -p k3os-ops` builds every binary of the package).
        verity_open: ops.with_file_name("k3os-verity-open"),
        tool: ops.clone(),
        out: out.path().join("x86_64"),
        keys: out.path().join("keys"),
        channel_root: k3os_images::release::ensure_channel_root(
            &out.path().join("x86_64/keys"),
            &out.path().join("x86_64/channel-root"),
        )
        .unwrap(),
        kube: None,
    };
    let v1 = builder
        .build(&ReleaseSpec::parse("v1").unwrap(), &secret, &public)
        .unwrap();
    let verify = Command::new(&ops)
        .args(["release", "verify"])
        .arg(&v1.dir)
        .arg("--trust-dir")
        .arg(public.parent().unwrap())
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "release verify: {}",
        String::from_utf8_lossy(&verify.stderr)
    );

    let rootfs = fs::read(&v1.rootfs).unwrap();
    for variant in BootVariant::for_target(target) {
        let img = out.path().join(format!("disk-{}.img", variant.name()));
        let spec = DiskSpec {
            target,
            variant,
            sizes: Sizes::default(),
            slot_a: &v1,
            debs: &debs,
            tool: &ops,
            signed: None,
        };
        disk::assemble(&spec, &img).unwrap();

        // libupgrade finds both slots by name.
        let layout = GptLayout::open(&img, Path::new("/boot")).unwrap();
        let a = layout.rootfs_range(Slot::A);
        assert!(a.len >= rootfs.len() as u64);
        let mut f = fs::File::open(&img).unwrap();
        f.seek(SeekFrom::Start(a.start)).unwrap();
        let mut got = vec![0u8; rootfs.len()];
        f.read_exact(&mut got).unwrap();
        assert!(
            got == rootfs,
            "{}: slot A does not hold v1's rootfs",
            variant.name()
        );

        // The boot partition: kernels of A, the loader state A good / B bad.
        let part = out.path().join(format!("boot-{}.img", variant.name()));
        extract_part(&img, "boot", &part);
        assert_eq!(
            debugfs_cat(&part, "/a/vmlinuz"),
            fs::read(&v1.kernel).unwrap()
        );
        assert_eq!(
            debugfs_cat(&part, "/a/initrd"),
            fs::read(&v1.initrd).unwrap()
        );
        let dump = out.path().join(format!("dump-{}", variant.name()));
        let env = if variant.is_grub() {
            GrubBootloader::new(rdump(&part, "/grub", &dump), 3)
                .read()
                .unwrap()
        } else {
            SyslinuxBootloader::new(rdump(&part, "/syslinux", &dump))
                .read()
                .unwrap()
        };
        assert_eq!(
            env,
            k3os_images::loader::initial_env(),
            "{}",
            variant.name()
        );

        // Boot code where each firmware path looks for it.
        let mut mbr = [0u8; 512];
        fs::File::open(&img).unwrap().read_exact(&mut mbr).unwrap();
        assert_eq!(&mbr[510..], &[0x55, 0xaa]);
        match variant {
            BootVariant::GrubBios => {
                assert_eq!(LE::read_u64(&mbr[0x5c..]), 2048, "core.img LBA in the MBR")
            }
            BootVariant::Extlinux => assert_eq!(
                &mbr[..440],
                &k3os_images::loader::gptmbr_code().unwrap()[..]
            ),
            BootVariant::GrubEfi => {
                let esp = out.path().join("esp.img");
                extract_part(&img, "esp", &esp);
                let dir = Command::new("mdir")
                    .arg("-i")
                    .arg(&esp)
                    .arg("::/EFI/BOOT")
                    .output()
                    .unwrap();
                assert!(
                    String::from_utf8_lossy(&dir.stdout).contains("BOOTX64"),
                    "ESP lacks EFI/BOOT/BOOTX64.EFI"
                );
            }
            BootVariant::GrubEfiSb => unreachable!("not a default variant"),
        }
    }

    // Boot the BIOS GRUB disk under QEMU up to the rootfs's first marker.
    let img = out.path().join("disk-grub-bios.img");
    let log = out.path().join("serial.log");
    let mut qemu = Command::new("qemu-system-x86_64")
        .args([
            "-m", "512", "-accel", "tcg", "-display", "none", "-monitor", "none", "-serial",
        ])
        .arg(format!("file:{}", log.display()))
        .arg("-drive")
        .arg(format!("file={},format=raw,if=virtio", img.display()))
        .args(["-nic", "none", "-no-reboot"])
        .spawn()
        .expect("qemu-system-x86_64 must be installed (package qemu-system-x86)");
    let start = Instant::now();
    let want = "K3OS-BOOTED slot=A version=v1";
    let seen = loop {
        let text = fs::read_to_string(&log).unwrap_or_default();
        if text.contains(want) {
            break Ok(start.elapsed());
        }
        if let Some(bad) = ["K3OS-INITRD-FAILED", "Kernel panic"]
            .iter()
            .find(|b| text.contains(**b))
        {
            break Err(format!(
                "saw {bad}:\n{}",
                text.lines().rev().take(15).collect::<Vec<_>>().join("\n")
            ));
        }
        if start.elapsed() > Duration::from_secs(180) {
            break Err(format!(
                "no '{want}' within 180 s; last lines:\n{}",
                text.lines().rev().take(15).collect::<Vec<_>>().join("\n")
            ));
        }
        if let Ok(Some(st)) = qemu.try_wait() {
            break Err(format!("QEMU exited with {st} before '{want}'"));
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let _ = qemu.kill();
    let _ = qemu.wait();
    let t = seen.unwrap_or_else(|e| panic!("grub-bios disk did not boot: {e}"));
    eprintln!("grub-bios disk reached '{want}' in {:.1}s", t.as_secs_f64());
}
