//! The `boot` partition: both slots' kernel directories and the bootloader's files, rendered
//! and initialised by the `bootconfig` crate (the same code that flips slots on a node), with
//! slot A (the installed release) good and primary and slot B bad (empty) until an upgrade
//! stages it.
//!
//! The loader files are written by `k3os-ops bootloader install` (the host `--tool` binary)
//! from [`boot_config`], the same boot config every release built here carries its scripts
//! from (`release create --boot-config`): the image builder uses the command an operator
//! adopting a machine would.
//!
//! - GRUB: `grub/grub.cfg`, the env copies, locks and last-good record, the platform's
//!   modules in `grub/<platform>/`; the ext4 is made with `mkfs.ext4 -d` (no mount).
//! - extlinux: `extlinux --install` needs the filesystem mounted, and (per the environment
//!   notes) files placed by `mkfs.ext4 -d` fail to load, so the partition *image file* is
//!   loop-mounted (never the disk), made with `-O ^64bit,^metadata_csum` which syslinux
//!   requires; then `syslinux/extlinux.conf` and the ADV record.

use std::fs;
use std::path::Path;

use bootconfig::{render_cfg, render_signed_cfg, GrubConfig};
use bootconfig::{render_conf, SyslinuxConfig};
use bootconfig::{BootEntry, BootEnv, Slot, SlotBoot};
use libupgrade::layout::{rootfs_part_name, INITRD_FILE, KERNEL_FILE};

use crate::error::{Error, IoContext, Result};
use crate::fsimg::{copy_tree, mkfs_ext4, LoopMount};
use crate::grubimg;
use crate::run::Cmd;
use crate::spec::{BootVariant, DiskSpec, GRUB_TRIES, UKI_FILE};
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

/// The `boot` partition as GRUB names it on the test disks.
pub const BOOT_PART_GRUB: &str = "(hd0,gpt3)";

/// The chooser script built into the signed GRUB of a `grub-efi-sb` disk: the env copies are
/// where `bootloader install` puts them (`<boot>/grub/k3os`), and each slot boots its signed
/// UKI `<boot>/<slot>/k3os.efi`.
pub fn signed_script(target: Target) -> String {
    let images = Slot::ALL.map(|s| format!("{BOOT_PART_GRUB}/{}/{UKI_FILE}", s.lower()));
    render_signed_cfg(
        &grub_config(target),
        &format!("{BOOT_PART_GRUB}/grub/k3os"),
        [&images[0], &images[1]],
    )
}

/// Fingerprint of what the boot partition and boot code are made from, besides the release.
pub fn fingerprint(spec: &DiskSpec) -> Result<String> {
    let mut st = Stamp::new();
    st.param("arch", spec.target.arch.as_str())
        .param("variant", spec.variant.name())
        .param("boot-config", boot_config(spec.target))
        .file("bootloader-install", spec.tool)?;
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
        BootVariant::GrubEfiSb => {
            st.param("cfg", signed_script(spec.target));
            let dir = grubimg::efi_dir(spec.target, None)?;
            st.file("kernel.img", &dir.join("kernel.img"))?;
            let signed = signed_inputs(spec)?;
            st.file("cert", signed.cert)?;
            st.file("slot-a-uki", signed.slot_a_uki)?;
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

/// The signed path's inputs of a `grub-efi-sb` disk (an error naming what is missing).
pub fn signed_inputs<'a>(spec: &DiskSpec<'a>) -> Result<crate::spec::SignedBoot<'a>> {
    spec.signed.ok_or_else(|| Error::Input {
        path: spec.slot_a.dir.clone(),
        what: "a grub-efi-sb disk needs the Secure Boot key and slot A's signed UKI \
               (k3os-images build --secure-boot)"
            .into(),
    })
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

/// The boot config (`k3os-ops bootloader`'s TOML, format 1) holding [`grub_config`] and
/// [`syslinux_config`]: what disks are installed from and releases carry their scripts from.
pub fn boot_config(target: Target) -> String {
    let g = grub_config(target);
    let s = syslinux_config(target);
    let q = |v: &str| format!("{v:?}");
    let mut t = format!("format = 1\npanic_secs = {}\n", g.panic_secs);
    for (slot, e) in Slot::ALL.into_iter().zip(g.entries.iter()) {
        t.push_str(&format!(
            "[slots.{}]\nkernel = {}\ninitrd = {}\ncmdline = {}\n",
            slot.lower(),
            q(&e.kernel),
            q(&e.initrd),
            q(&e.cmdline)
        ));
    }
    t.push_str(&format!(
        "[grub]\nmax_tries = {}\ntimeout_secs = {}\nserial = {}\n[syslinux]\ntimeout_tenths = {}\nserial = {}\n",
        g.max_tries, g.timeout_secs, g.serial, s.timeout_tenths, s.serial
    ));
    t
}

/// `k3os-ops bootloader install` of `loader` into `dir`, from [`boot_config`].
fn bootloader_install(spec: &DiskSpec, loader: &str, dir: &Path, work: &Path) -> Result<()> {
    let cfg = work.join("boot.toml");
    fs::write(&cfg, boot_config(spec.target)).ctx("write", &cfg)?;
    Cmd::new(spec.tool)
        .args(["bootloader", "install", "--loader", loader, "--dir"])
        .arg(dir)
        .arg("--boot-config")
        .arg(&cfg)
        .run()?;
    Ok(())
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
        BootVariant::GrubBios | BootVariant::GrubEfi | BootVariant::GrubEfiSb => {
            let grub = stage.join("grub");
            fs::create_dir_all(&grub).ctx("create directory", &grub)?;
            if spec.variant == BootVariant::GrubBios {
                grubimg::copy_modules(Path::new(grubimg::I386_PC_DIR), &grub, "i386-pc")?;
            } else if spec.variant == BootVariant::GrubEfiSb {
                // The signed GRUB loads no module from here; slot A boots its signed UKI.
                let uki = signed_inputs(spec)?.slot_a_uki;
                fs::copy(uki, a.join(UKI_FILE)).ctx("copy", uki)?;
            } else {
                let dir = grubimg::efi_dir(spec.target, spec.debs.grub_arm64_efi.as_deref())?;
                grubimg::copy_modules(&dir, &grub, spec.target.grub_efi_platform())?;
            }
            bootloader_install(spec, "grub", &grub, work)?;
            mkfs_ext4(img, size, "boot", Some(&stage), &[])
        }
        BootVariant::Extlinux => {
            mkfs_ext4(img, size, "boot", None, &["^64bit", "^metadata_csum"])?;
            let mnt = LoopMount::new(img, &work.join("mnt"))?;
            copy_tree(&stage, &mnt.dir)?;
            let sys = mnt.dir.join("syslinux");
            fs::create_dir_all(&sys).ctx("create directory", &sys)?;
            Cmd::new("extlinux").arg("--install").arg(&sys).run()?;
            bootloader_install(spec, "syslinux", &sys, work)?;
            Cmd::new("sync")
                .arg("-f")
                .arg(sys.join("extlinux.conf"))
                .run()?;
            mnt.unmount()
        }
    }
}
