//! GRUB images made without `grub-install` (which needs the disk's partitions as block devices,
//! and this host cannot scan loop partitions):
//!
//! - BIOS: `grub-mkimage -O i386-pc` builds core.img; it is written to the `bios-boot`
//!   partition, the first 440 bytes of boot.img go into the MBR with core.img's LBA at offset
//!   0x5c, and the block list at the end of core.img's first sector (offset 0x1f4) is pointed at
//!   the sector after it — what grub-install's embedding step does.
//! - EFI: `grub-mkimage -O x86_64-efi|arm64-efi` builds the removable-media `BOOTX64.EFI` /
//!   `BOOTAA64.EFI`.
//!
//! Both use the prefix `(hd0,gpt3)/grub` (the `boot` partition); the platform's modules are
//! copied to `<boot>/grub/<platform>/` so commands grub.cfg uses that are not built in are
//! loaded on demand.

use std::fs;
use std::path::{Path, PathBuf};

use byteorder::{ByteOrder, LittleEndian as LE};

use crate::error::{Error, IoContext, Result};
use crate::run::Cmd;
use crate::target::Target;

/// GRUB's prefix on the test disks: partition 3 (`boot`), directory `/grub`.
pub const PREFIX: &str = "(hd0,gpt3)/grub";

/// Modules built into every image (the rest load from the prefix).
const MODULES: &[&str] = &[
    "part_gpt",
    "ext2",
    "normal",
    "linux",
    "echo",
    "test",
    "loadenv",
    "configfile",
    "serial",
    "terminal",
    "sleep",
    "reboot",
    "halt",
];

/// Offset in boot.img of the LBA of core.img's first sector.
const BOOT_KERNEL_SECTOR: usize = 0x5c;
/// Offset in core.img's first sector of the first block-list entry (start LBA u64, length u16, segment u16).
const CORE_BLOCKLIST: usize = 0x1f4;

pub const I386_PC_DIR: &str = "/usr/lib/grub/i386-pc";

/// The GRUB module directory for an EFI target.
pub fn efi_dir(target: Target, arm64_efi: Option<&Path>) -> Result<PathBuf> {
    match target.arch {
        libupgrade::manifest::Arch::X86_64 => Ok(PathBuf::from("/usr/lib/grub/x86_64-efi")),
        libupgrade::manifest::Arch::Aarch64 => {
            arm64_efi
                .map(Path::to_path_buf)
                .ok_or_else(|| Error::Input {
                    path: PathBuf::from("usr/lib/grub/arm64-efi"),
                    what: "the grub-efi-arm64-bin package is not extracted".into(),
                })
        }
    }
}

fn mkimage(format: &str, dir: &Path, out: &Path, extra: &[&str]) -> Result<()> {
    if !dir.join("kernel.img").is_file() {
        return Err(Error::Input {
            path: dir.to_path_buf(),
            what: format!("no GRUB {format} modules (kernel.img missing)"),
        });
    }
    Cmd::new("grub-mkimage")
        .args(["-O", format, "-p", PREFIX, "-d"])
        .arg(dir)
        .arg("-o")
        .arg(out)
        .args(extra.iter().chain(MODULES))
        .run()?;
    Ok(())
}

/// core.img for the BIOS boot partition starting at `core_lba`, ready to write there.
pub fn bios_core(out: &Path, core_lba: u64) -> Result<()> {
    mkimage("i386-pc", Path::new(I386_PC_DIR), out, &["biosdisk"])?;
    let mut core = fs::read(out).ctx("read", out)?;
    patch_core(&mut core, core_lba).map_err(|what| Error::Input {
        path: out.to_path_buf(),
        what,
    })?;
    fs::write(out, core).ctx("write", out)
}

/// The removable-media EFI binary for `target`.
pub fn efi_image(target: Target, dir: &Path, out: &Path) -> Result<()> {
    mkimage(target.grub_efi_platform(), dir, out, &[])
}

/// Modules of the signed EFI image ([`signed_efi_image`]): everything its script runs is built
/// in, so it never loads a module from the disk. No `linux`: under Secure Boot, GRUB would boot
/// a kernel it read itself without the firmware's signature check. `chain` hands the slot's
/// UKI to the firmware's LoadImage, which checks it; `tpm` registers the verifier that GRUB's
/// lockdown requires before it opens a chainloaded image (without shim there is no other; see
/// docs/design/trust.md); `memdisk` + `tar` hold the script.
const SIGNED_MODULES: &[&str] = &[
    "part_gpt", "ext2", "normal", "chain", "tpm", "memdisk", "tar", "echo", "test", "true",
    "loadenv", "serial", "terminal", "sleep", "reboot", "halt",
];

/// Where the signed image's script is, inside its memdisk (the image's prefix).
pub const SIGNED_PREFIX: &str = "(memdisk)/boot/grub";

/// The signed UEFI path's GRUB (unsigned yet: the caller signs it): `script` as
/// `grub.cfg` in a memdisk inside the image, the prefix pointing there, `SIGNED_MODULES`
/// built in, and `--disable-shim-lock` (no shim in this chain: the firmware checks what GRUB
/// chainloads). `work` is a scratch directory.
pub fn signed_efi_image(target: Target, script: &str, out: &Path, work: &Path) -> Result<()> {
    let dir = efi_dir(target, None)?;
    if !dir.join("kernel.img").is_file() {
        return Err(Error::Input {
            path: dir,
            what: format!("no GRUB {} modules", target.grub_efi_platform()),
        });
    }
    let tree = work.join("memdisk");
    let cfg_dir = tree.join("boot/grub");
    fs::create_dir_all(&cfg_dir).ctx("create directory", &cfg_dir)?;
    fs::write(cfg_dir.join("grub.cfg"), script).ctx("write", cfg_dir.join("grub.cfg"))?;
    let tar = work.join("memdisk.tar");
    Cmd::new("tar")
        .arg("-C")
        .arg(&tree)
        .args(["--owner=0", "--group=0", "--format=ustar", "-cf"])
        .arg(&tar)
        .arg("boot")
        .run()?;
    Cmd::new("grub-mkimage")
        .args([
            "-O",
            target.grub_efi_platform(),
            "--disable-shim-lock",
            "-p",
        ])
        .arg(SIGNED_PREFIX)
        .arg("-d")
        .arg(&dir)
        .arg("-m")
        .arg(&tar)
        .arg("-o")
        .arg(out)
        .args(SIGNED_MODULES)
        .run()?;
    Ok(())
}

/// Point core.img's first block list at the sectors following its first one.
pub fn patch_core(core: &mut [u8], core_lba: u64) -> std::result::Result<(), String> {
    let sectors = core.len().div_ceil(512);
    if sectors < 2 {
        return Err(format!(
            "core.img is {} bytes: too small to be a GRUB i386-pc core image",
            core.len()
        ));
    }
    let len = usize::from(LE::read_u16(&core[CORE_BLOCKLIST + 8..]));
    if len != sectors - 1 {
        return Err(format!(
            "core.img block list length is {len} sectors, expected {} for a {}-byte image (not a diskboot.img-prefixed core?)",
            sectors - 1,
            core.len()
        ));
    }
    core[CORE_BLOCKLIST..CORE_BLOCKLIST + 8].copy_from_slice(&(core_lba + 1).to_le_bytes());
    Ok(())
}

/// The MBR boot code (first 440 bytes of boot.img) that loads core.img from `core_lba`.
pub fn bios_mbr_code(core_lba: u64) -> Result<[u8; 440]> {
    let p = Path::new(I386_PC_DIR).join("boot.img");
    let boot = fs::read(&p).ctx("read", &p)?;
    mbr_code_from(&boot, core_lba).map_err(|what| Error::Input { path: p, what })
}

pub fn mbr_code_from(boot_img: &[u8], core_lba: u64) -> std::result::Result<[u8; 440], String> {
    if boot_img.len() != 512 || boot_img[510..512] != [0x55, 0xaa] {
        return Err(format!(
            "expected a 512-byte boot sector ending in 55 aa, found {} bytes",
            boot_img.len()
        ));
    }
    let mut code = [0u8; 440];
    code.copy_from_slice(&boot_img[..440]);
    code[BOOT_KERNEL_SECTOR..BOOT_KERNEL_SECTOR + 8].copy_from_slice(&core_lba.to_le_bytes());
    Ok(code)
}

/// Copy a platform's `*.mod` and `*.lst` into `<grub_dir>/<platform>/`.
pub fn copy_modules(src: &Path, grub_dir: &Path, platform: &str) -> Result<()> {
    let dst = grub_dir.join(platform);
    fs::create_dir_all(&dst).ctx("create directory", &dst)?;
    for e in fs::read_dir(src).ctx("read directory", src)?.flatten() {
        let p = e.path();
        if matches!(p.extension().and_then(|x| x.to_str()), Some("mod" | "lst")) {
            fs::copy(&p, dst.join(e.file_name())).ctx("copy", &p)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_blocklist_points_after_first_sector() {
        let mut core = vec![0u8; 512 * 5];
        core[CORE_BLOCKLIST + 8] = 4;
        patch_core(&mut core, 2048).unwrap();
        assert_eq!(LE::read_u64(&core[CORE_BLOCKLIST..]), 2049);
        let mut bad = vec![0u8; 512 * 5];
        assert!(patch_core(&mut bad, 2048)
            .unwrap_err()
            .contains("expected 4"));
    }

    /// The signed image carries its script (in the memdisk) and the chainloader.
    #[test]
    fn the_signed_image_carries_its_script() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("BOOTX64.EFI");
        let script = "set k3os_marker=signed-script-42\n";
        let t = Target::new(libupgrade::manifest::Arch::X86_64);
        signed_efi_image(t, script, &out, dir.path()).unwrap();
        let bytes = fs::read(&out).unwrap();
        let has = |n: &[u8]| bytes.windows(n.len()).any(|w| w == n);
        assert!(has(b"signed-script-42"));
        assert!(has(b"chainloader"), "chain is built in");
    }

    #[test]
    fn real_grub_images_patch() {
        let dir = tempfile::tempdir().unwrap();
        let core = dir.path().join("core.img");
        bios_core(&core, 2048).expect("grub-pc-bin must be installed (see environment notes)");
        let bytes = fs::read(&core).unwrap();
        assert_eq!(LE::read_u64(&bytes[CORE_BLOCKLIST..]), 2049);
        assert!(
            bytes.len() < 1024 * 1024,
            "core.img must fit the 1 MiB bios-boot partition"
        );
        let code = bios_mbr_code(2048).unwrap();
        assert_eq!(LE::read_u64(&code[0x5c..]), 2048);
    }
}
