//! The `boot` partition: both slots' kernel directories and the bootloader's files, rendered
//! and initialised by the `bootconfig` crate (the same code that flips slots on a node), with
//! slot A (the installed release) good and primary and slot B bad (empty) until an upgrade
//! stages it.
//!
//! - GRUB: `grub/grub.cfg` from `bootconfig::grub::render_cfg`, the env files from
//!   `GrubBootloader::install`, the platform's modules in `grub/<platform>/`; the ext4 is
//!   made with `mkfs.ext4 -d` (no mount).
//! - extlinux: `extlinux --install` needs the filesystem mounted, and (per the environment
//!   notes) files placed by `mkfs.ext4 -d` fail to load, so the partition *image file* is
//!   loop-mounted (never the disk), made with `-O ^64bit,^metadata_csum` which syslinux
//!   requires; `syslinux/extlinux.conf` from `bootconfig::syslinux::render_conf`.

use std::fs;
use std::path::{Path, PathBuf};

use bootconfig::grub::{render_cfg, GrubBootloader, GrubConfig};
use bootconfig::syslinux::{render_conf, SyslinuxBootloader, SyslinuxConfig};
use bootconfig::{BootEntry, BootEnv, Slot, SlotBoot};
use libupgrade::layout::{rootfs_part_name, INITRD_FILE, KERNEL_FILE};

use crate::disk::{mkfs_ext4, BootVariant, DiskSpec};
use crate::error::{Error, IoContext, Result};
use crate::grubimg;
use crate::rootfs::GRUB_TRIES;
use crate::run::Cmd;
use crate::stamp::Stamp;
use crate::target::Target;

/// Seconds a panicking kernel waits before rebooting into the loader.
pub const PANIC_SECS: u32 = 5;
/// syslinux's MBR for GPT disks (boots the legacy-BIOS-bootable partition).
pub const GPTMBR: &str = "/usr/lib/syslinux/mbr/gptmbr.bin";

/// Kernel and initrd paths of `slot` as the loader sees them, and its command line (the
/// loader configuration appends `k3os.slot=` and `panic=`). `quiet`: under TCG every console
/// byte is an emulated UART write, and the ~550 lines of a normal boot log cost boot time in
/// every scenario; panics (KERN_EMERG) and the init's K3OS-* markers still reach the console.
pub fn entry(target: Target, slot: Slot) -> BootEntry {
    BootEntry {
        kernel: format!("/{}/{KERNEL_FILE}", slot.lower()),
        initrd: format!("/{}/{INITRD_FILE}", slot.lower()),
        cmdline: format!(
            "root=PARTLABEL={} ro console={} quiet",
            rootfs_part_name(slot),
            target.console()
        ),
    }
}

/// The loader state a fresh disk starts in: A installed and good, B empty and never chosen.
pub fn initial_env() -> BootEnv {
    BootEnv {
        primary: Slot::A,
        a: SlotBoot::Good,
        b: SlotBoot::Bad,
    }
}

pub fn grub_config(target: Target) -> GrubConfig {
    GrubConfig {
        entries: [entry(target, Slot::A), entry(target, Slot::B)],
        max_tries: GRUB_TRIES,
        timeout_secs: 0,
        // x86: GRUB's own 16550 driver (the BIOS console is not on the serial port). On arm64
        // the UEFI console already is the PL011 and GRUB has no `com0` there.
        serial: target.arch == libupgrade::manifest::Arch::X86_64,
        panic_secs: PANIC_SECS,
    }
}

pub fn syslinux_config(target: Target) -> SyslinuxConfig {
    SyslinuxConfig {
        entries: [entry(target, Slot::A), entry(target, Slot::B)],
        primary: Slot::A,
        timeout_tenths: 1,
        serial: true,
        panic_secs: PANIC_SECS,
    }
}

/// Fingerprint of what the boot partition and boot code are made from, besides the release.
pub fn fingerprint(spec: &DiskSpec) -> Result<String> {
    let mut st = Stamp::new();
    st.param("arch", spec.target.arch.as_str())
        .param("variant", spec.variant.name());
    match spec.variant {
        BootVariant::GrubBios => {
            st.param("cfg", render_cfg(&grub_config(spec.target)));
            st.file(
                "kernel.img",
                &Path::new(grubimg::I386_PC_DIR).join("kernel.img"),
            )?;
            st.file(
                "boot.img",
                &Path::new(grubimg::I386_PC_DIR).join("boot.img"),
            )?;
        }
        BootVariant::GrubEfi => {
            st.param("cfg", render_cfg(&grub_config(spec.target)));
            let dir = grubimg::efi_dir(spec.target, spec.debs.grub_arm64_efi.as_deref())?;
            st.file("kernel.img", &dir.join("kernel.img"))?;
        }
        BootVariant::Extlinux => {
            st.param("conf", render_conf(&syslinux_config(spec.target)));
            st.file("gptmbr", Path::new(GPTMBR))?;
            st.file(
                "ldlinux",
                Path::new("/usr/lib/syslinux/modules/bios/ldlinux.c32"),
            )?;
        }
    }
    Ok(st.hex())
}

/// gptmbr.bin as MBR boot code.
pub fn gptmbr_code() -> Result<[u8; 440]> {
    let b = fs::read(GPTMBR).ctx("read", GPTMBR)?;
    if b.len() != 440 {
        return Err(Error::Input {
            path: GPTMBR.into(),
            what: format!("expected 440 bytes of MBR code, found {}", b.len()),
        });
    }
    let mut code = [0u8; 440];
    code.copy_from_slice(&b);
    Ok(code)
}

fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    fs::create_dir_all(dst).ctx("create directory", dst)?;
    for e in fs::read_dir(src).ctx("read directory", src)?.flatten() {
        let (s, d) = (e.path(), dst.join(e.file_name()));
        if e.file_type().ctx("stat", &s)?.is_dir() {
            copy_tree(&s, &d)?;
        } else {
            fs::copy(&s, &d).ctx("copy", &s)?;
        }
    }
    Ok(())
}

/// A loop mount of a filesystem image file, unmounted on drop.
struct LoopMount {
    dir: PathBuf,
    mounted: bool,
}

impl LoopMount {
    fn new(img: &Path, dir: &Path) -> Result<LoopMount> {
        fs::create_dir_all(dir).ctx("create directory", dir)?;
        Cmd::new("mount")
            .args(["-o", "loop", "-t", "ext4"])
            .arg(img)
            .arg(dir)
            .run()?;
        Ok(LoopMount {
            dir: dir.to_path_buf(),
            mounted: true,
        })
    }

    fn unmount(mut self) -> Result<()> {
        self.mounted = false;
        Cmd::new("umount").arg(&self.dir).run()?;
        Ok(())
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Cmd::new("umount").arg(&self.dir).run();
        }
    }
}

/// Build the `boot` partition image `img` of `size` bytes.
pub fn boot_partition(spec: &DiskSpec, img: &Path, size: u64, work: &Path) -> Result<()> {
    let stage = work.join("boot");
    for slot in Slot::ALL {
        fs::create_dir_all(stage.join(slot.lower()))
            .ctx("create directory", stage.join(slot.lower()))?;
    }
    let a = stage.join(Slot::A.lower());
    fs::copy(&spec.slot_a.kernel, a.join(KERNEL_FILE)).ctx("copy", &spec.slot_a.kernel)?;
    fs::copy(&spec.slot_a.initrd, a.join(INITRD_FILE)).ctx("copy", &spec.slot_a.initrd)?;
    match spec.variant {
        BootVariant::GrubBios | BootVariant::GrubEfi => {
            let grub = stage.join("grub");
            fs::create_dir_all(&grub).ctx("create directory", &grub)?;
            if spec.variant == BootVariant::GrubBios {
                grubimg::copy_modules(Path::new(grubimg::I386_PC_DIR), &grub, "i386-pc")?;
            } else {
                let dir = grubimg::efi_dir(spec.target, spec.debs.grub_arm64_efi.as_deref())?;
                grubimg::copy_modules(&dir, &grub, spec.target.grub_efi_platform())?;
            }
            let cfg = grub.join("grub.cfg");
            fs::write(&cfg, render_cfg(&grub_config(spec.target))).ctx("write", &cfg)?;
            GrubBootloader::new(&grub, GRUB_TRIES)
                .install(&initial_env())
                .map_err(|source| Error::Boot {
                    path: grub.clone(),
                    source,
                })?;
            mkfs_ext4(img, size, "boot", Some(&stage), &[])
        }
        BootVariant::Extlinux => {
            mkfs_ext4(img, size, "boot", None, &["^64bit", "^metadata_csum"])?;
            let mnt = LoopMount::new(img, &work.join("mnt"))?;
            copy_tree(&stage, &mnt.dir)?;
            let sys = mnt.dir.join("syslinux");
            fs::create_dir_all(&sys).ctx("create directory", &sys)?;
            Cmd::new("extlinux").arg("--install").arg(&sys).run()?;
            let conf = sys.join("extlinux.conf");
            fs::write(&conf, render_conf(&syslinux_config(spec.target))).ctx("write", &conf)?;
            SyslinuxBootloader::new(&sys)
                .install(&initial_env())
                .map_err(|source| Error::Boot {
                    path: sys.clone(),
                    source,
                })?;
            Cmd::new("sync").arg("-f").arg(&conf).run()?;
            mnt.unmount()
        }
    }
}
