//! GPT disk assembly. Partitions are built as files (`mkfs.vfat -C` + mtools, `mkfs.ext4 -d`,
//! the release's squashfs) and written into the disk file at their offsets; the host never
//! mounts a partition of the disk (it cannot scan loop partitions). The table is written with
//! the `gpt` crate, the protective MBR (and the BIOS boot code) by us.
//!
//! Every disk has the same six partitions, numbered identically on every architecture and boot
//! variant, so GRUB's `(hd0,gpt3)` and libupgrade's partition lookup never differ:
//!
//! | # | name | type | size | content |
//! |---|------|------|------|---------|
//! | 1 | `bios-boot` | EF02 | 1 MiB | GRUB core.img (grub-bios), else zero |
//! | 2 | `esp` | EF00 | 32 MiB | vfat; `EFI/BOOT/BOOT{X64,AA64}.EFI` (grub-efi) |
//! | 3 | `boot` | Linux | 128 MiB | ext4: `grub/` or `syslinux/`, `a/{vmlinuz,initrd}`, `b/` |
//! | 4 | `rootfs-a` | Linux | ≥ 64 MiB | raw squashfs of the installed release |
//! | 5 | `rootfs-b` | Linux | same | empty |
//! | 6 | `state` | Linux | 64 MiB | empty ext4 (libupgrade's state) |
//!
//! (`bios-boot` exists on the arm64 and EFI disks too, unused: the `gpt` crate writes used
//! entries contiguously, so a gap cannot be kept and the numbers would shift.)

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use gpt::partition_types::{Type, BIOS, EFI, LINUX_FS};
use libupgrade::layout::{
    PART_BIOS_BOOT, PART_BOOT, PART_ESP, PART_ROOTFS_A, PART_ROOTFS_B, PART_STATE,
};

use crate::debs::Debs;
use crate::error::{Error, IoContext, Result};
use crate::grubimg;
use crate::loader;
use crate::release::Release;
use crate::run::Cmd;
use crate::target::Target;

pub const MIB: u64 = 1024 * 1024;
const SECTOR: u64 = 512;

/// How the disk boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootVariant {
    /// Legacy BIOS, GRUB core.img in `bios-boot`.
    GrubBios,
    /// UEFI (OVMF / AAVMF), GRUB as the removable-media loader on the ESP.
    GrubEfi,
    /// Legacy BIOS, gptmbr.bin + extlinux on the legacy-bootable `boot` partition.
    Extlinux,
}

impl BootVariant {
    pub const ALL: [BootVariant; 3] = [
        BootVariant::GrubBios,
        BootVariant::GrubEfi,
        BootVariant::Extlinux,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BootVariant::GrubBios => "grub-bios",
            BootVariant::GrubEfi => "grub-efi",
            BootVariant::Extlinux => "extlinux",
        }
    }

    pub fn parse(s: &str) -> std::result::Result<BootVariant, String> {
        Self::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                format!("unknown boot variant '{s}': expected grub-bios, grub-efi or extlinux")
            })
    }

    /// Variants that exist for `target` (arm64 has no legacy BIOS).
    pub fn for_target(target: Target) -> Vec<BootVariant> {
        match target.arch {
            libupgrade::manifest::Arch::X86_64 => Self::ALL.to_vec(),
            libupgrade::manifest::Arch::Aarch64 => vec![BootVariant::GrubEfi],
        }
    }

    pub fn is_grub(self) -> bool {
        self != BootVariant::Extlinux
    }
}

/// One partition of the layout.
#[derive(Debug, Clone)]
pub struct Part {
    pub number: u32,
    pub name: &'static str,
    pub kind: Type,
    pub first_lba: u64,
    pub sectors: u64,
    pub flags: u64,
}

impl Part {
    pub fn offset(&self) -> u64 {
        self.first_lba * SECTOR
    }
    pub fn len(&self) -> u64 {
        self.sectors * SECTOR
    }
    pub fn is_empty(&self) -> bool {
        self.sectors == 0
    }
}

/// Partition sizes; `rootfs` is the size of each slot partition.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub bios_boot: u64,
    pub esp: u64,
    pub boot: u64,
    pub rootfs: u64,
    pub state: u64,
}

impl Default for Sizes {
    fn default() -> Self {
        Sizes {
            bios_boot: MIB,
            esp: 32 * MIB,
            boot: 128 * MIB,
            rootfs: 64 * MIB,
            state: 64 * MIB,
        }
    }
}

impl Sizes {
    /// Default sizes, with the slot partitions grown (in whole MiB, with a quarter spare) when
    /// the largest rootfs would not fit comfortably.
    pub fn for_largest_rootfs(largest: u64) -> Sizes {
        let mut s = Sizes::default();
        let want = (largest + largest / 4).div_ceil(MIB) * MIB;
        s.rootfs = s.rootfs.max(want);
        s
    }
}

/// The partition table for `sizes` (1 MiB aligned) and the disk size including the backup GPT.
pub fn layout(sizes: Sizes, variant: BootVariant) -> (Vec<Part>, u64) {
    let table: [(&'static str, Type, u64); 6] = [
        (PART_BIOS_BOOT, BIOS, sizes.bios_boot),
        (PART_ESP, EFI, sizes.esp),
        (PART_BOOT, LINUX_FS, sizes.boot),
        (PART_ROOTFS_A, LINUX_FS, sizes.rootfs),
        (PART_ROOTFS_B, LINUX_FS, sizes.rootfs),
        (PART_STATE, LINUX_FS, sizes.state),
    ];
    let mut parts = Vec::new();
    let mut at = MIB;
    for (i, (name, kind, size)) in table.into_iter().enumerate() {
        let size = size.div_ceil(MIB) * MIB;
        // Legacy-BIOS-bootable attribute (bit 2): gptmbr.bin boots the partition carrying it.
        let flags = if name == PART_BOOT && variant == BootVariant::Extlinux {
            1 << 2
        } else {
            0
        };
        parts.push(Part {
            number: i as u32 + 1,
            name,
            kind,
            first_lba: at / SECTOR,
            sectors: size / SECTOR,
            flags,
        });
        at += size;
    }
    (parts, at + MIB)
}

/// Copy `src` into `disk` at `part`'s offset; zero blocks are skipped (the disk file is sparse
/// and new). Refuses an image larger than the partition.
fn write_part(disk: &mut File, disk_path: &Path, part: &Part, src: &Path) -> Result<()> {
    let len = fs::metadata(src).ctx("stat", src)?.len();
    if len > part.len() {
        return Err(Error::Layout(format!(
            "{} is {len} bytes, partition {} ({}) holds only {}",
            src.display(),
            part.number,
            part.name,
            part.len()
        )));
    }
    let mut f = File::open(src).ctx("open", src)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    loop {
        let n = f.read(&mut buf).ctx("read", src)?;
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|b| *b != 0) {
            disk.seek(SeekFrom::Start(part.offset() + pos))
                .ctx("seek", disk_path)?;
            disk.write_all(&buf[..n]).ctx("write", disk_path)?;
        }
        pos += n as u64;
    }
    Ok(())
}

/// What goes on one disk.
pub struct DiskSpec<'a> {
    pub target: Target,
    pub variant: BootVariant,
    pub sizes: Sizes,
    /// Installed in slot A; slot B is empty.
    pub slot_a: &'a Release,
    pub debs: &'a Debs,
    /// Host `k3os-ops`: writes the loader files (`bootloader install`).
    pub tool: &'a Path,
}

/// Build the disk image at `out` (replaced atomically once complete).
pub fn assemble(spec: &DiskSpec, out: &Path) -> Result<()> {
    let dir = out.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).ctx("create directory", dir)?;
    let tmp = tempfile::Builder::new()
        .prefix(".disk.")
        .tempdir_in(dir)
        .ctx("create temp dir in", dir)?;
    let work = tmp.path();
    let (parts, total) = layout(spec.sizes, spec.variant);
    let part = |name: &str| {
        parts
            .iter()
            .find(|p| p.name == name)
            .expect("layout has every partition")
    };

    // Partition images.
    let mut images: Vec<(&Part, PathBuf)> = Vec::new();
    if spec.variant == BootVariant::GrubBios {
        let core = work.join("core.img");
        grubimg::bios_core(&core, part(PART_BIOS_BOOT).first_lba)?;
        images.push((part(PART_BIOS_BOOT), core));
    }
    let esp = work.join("esp.img");
    make_esp(spec, &esp, part(PART_ESP).len(), work)?;
    images.push((part(PART_ESP), esp));
    let boot = work.join("boot.img");
    loader::boot_partition(spec, &boot, part(PART_BOOT).len(), work)?;
    images.push((part(PART_BOOT), boot));
    images.push((part(PART_ROOTFS_A), spec.slot_a.rootfs.clone()));
    let state = work.join("state.img");
    mkfs_ext4(&state, part(PART_STATE).len(), "state", None, &[])?;
    images.push((part(PART_STATE), state));

    // The disk: sparse file, GPT, protective MBR with boot code, partition contents.
    let disk_path = work.join("disk.img");
    let disk = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&disk_path)
        .ctx("create", &disk_path)?;
    disk.set_len(total).ctx("size", &disk_path)?;
    let mut gdisk = gpt::GptConfig::new()
        .writable(true)
        .logical_block_size(gpt::disk::LogicalBlockSize::Lb512)
        .create_from_device(disk, None)
        .map_err(|source| Error::Gpt {
            path: disk_path.clone(),
            source,
        })?;
    for p in &parts {
        gdisk
            .add_partition_at(
                p.name,
                p.number,
                p.first_lba,
                p.sectors,
                p.kind.clone(),
                p.flags,
            )
            .map_err(|source| Error::Gpt {
                path: disk_path.clone(),
                source,
            })?;
    }
    let mut disk = gdisk.write().map_err(|source| Error::Gpt {
        path: disk_path.clone(),
        source,
    })?;
    let lbas = u32::try_from(total / SECTOR - 1).unwrap_or(u32::MAX);
    let mut mbr = gpt::mbr::ProtectiveMBR::with_lb_size(lbas);
    match spec.variant {
        BootVariant::GrubBios => {
            mbr.set_bootcode(grubimg::bios_mbr_code(part(PART_BIOS_BOOT).first_lba)?);
        }
        BootVariant::Extlinux => {
            mbr.set_bootcode(loader::gptmbr_code()?);
        }
        BootVariant::GrubEfi => {}
    }
    mbr.overwrite_lba0(&mut disk).map_err(|e| {
        Error::Layout(format!(
            "{}: writing the protective MBR: {e}",
            disk_path.display()
        ))
    })?;
    for (p, img) in &images {
        write_part(&mut disk, &disk_path, p, img)?;
    }
    disk.sync_all().ctx("fsync", &disk_path)?;
    drop(disk);
    verify(&disk_path, &parts)?;
    fs::rename(&disk_path, out).ctx("rename into place", out)?;
    Ok(())
}

/// Read the table back (as libupgrade does) and check every partition's name and range.
pub fn verify(disk: &Path, parts: &[Part]) -> Result<()> {
    let g = gpt::GptConfig::new()
        .writable(false)
        .open(disk)
        .map_err(|source| Error::Gpt {
            path: disk.to_path_buf(),
            source,
        })?;
    for p in parts {
        let found = g.partitions().get(&p.number).ok_or_else(|| {
            Error::Layout(format!(
                "{}: partition {} ({}) missing after writing",
                disk.display(),
                p.number,
                p.name
            ))
        })?;
        if found.name != p.name
            || found.first_lba != p.first_lba
            || found.last_lba != p.first_lba + p.sectors - 1
        {
            return Err(Error::Layout(format!(
                "{}: partition {} reads back as '{}' {}..{}, expected '{}' {}..{}",
                disk.display(),
                p.number,
                found.name,
                found.first_lba,
                found.last_lba,
                p.name,
                p.first_lba,
                p.first_lba + p.sectors - 1
            )));
        }
    }
    Ok(())
}

/// `mkfs.ext4` an image file of `size` bytes, optionally filled from `dir`.
pub fn mkfs_ext4(
    img: &Path,
    size: u64,
    label: &str,
    dir: Option<&Path>,
    features: &[&str],
) -> Result<()> {
    let _ = fs::remove_file(img);
    let mut c = Cmd::new("mkfs.ext4").args(["-q", "-F", "-L", label, "-E", "root_owner=0:0"]);
    if !features.is_empty() {
        c = c.arg("-O").arg(features.join(","));
    }
    if let Some(d) = dir {
        c = c.arg("-d").arg(d);
    }
    c.arg(img).arg(format!("{}k", size / 1024)).run()?;
    Ok(())
}

/// The ESP: vfat; with the GRUB EFI binary for the grub-efi variant.
fn make_esp(spec: &DiskSpec, img: &Path, size: u64, work: &Path) -> Result<()> {
    let _ = fs::remove_file(img);
    Cmd::new("mkfs.vfat")
        .args(["-C", "-n", "ESP"])
        .arg(img)
        .arg((size / 1024).to_string())
        .run()?;
    if spec.variant == BootVariant::GrubEfi {
        let efi = work.join(spec.target.efi_boot_file());
        grubimg::efi_image(
            spec.target,
            &grubimg::efi_dir(spec.target, spec.debs.grub_arm64_efi.as_deref())?,
            &efi,
        )?;
        Cmd::new("mmd")
            .arg("-i")
            .arg(img)
            .args(["::/EFI", "::/EFI/BOOT"])
            .run()?;
        Cmd::new("mcopy")
            .arg("-i")
            .arg(img)
            .arg(&efi)
            .arg(format!("::/EFI/BOOT/{}", spec.target.efi_boot_file()))
            .run()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_aligned_contiguous_and_numbered() {
        let (parts, total) = layout(Sizes::for_largest_rootfs(100 * MIB), BootVariant::Extlinux);
        let names: Vec<&str> = parts.iter().map(|p| p.name).collect();
        assert_eq!(
            names,
            ["bios-boot", "esp", "boot", "rootfs-a", "rootfs-b", "state"]
        );
        for (i, p) in parts.iter().enumerate() {
            assert_eq!(p.number, i as u32 + 1);
            assert_eq!(p.offset() % MIB, 0);
            if i > 0 {
                assert_eq!(parts[i - 1].offset() + parts[i - 1].len(), p.offset());
            }
        }
        assert_eq!(
            parts[3].len(),
            125 * MIB,
            "100 MiB rootfs gets a quarter spare"
        );
        assert_eq!(
            parts[2].flags,
            1 << 2,
            "extlinux boot partition is legacy-BIOS bootable"
        );
        assert_eq!(total, parts[5].offset() + parts[5].len() + MIB);
        let (small, _) = layout(Sizes::for_largest_rootfs(10 * MIB), BootVariant::GrubBios);
        assert_eq!(small[3].len(), 64 * MIB);
        assert_eq!(small[2].flags, 0);
    }
}
