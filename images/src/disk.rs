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
//! | 6 | `state` | Linux | 64 MiB | ext4 (libupgrade's state): slot A's manifest only |
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

use crate::error::{Error, IoContext, Result};
use crate::fsimg::mkfs_ext4;
use crate::grubimg;
use crate::loader;
use crate::run::Cmd;
use crate::spec::{BootVariant, DiskSpec, Sizes, MIB};

const SECTOR: u64 = 512;

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
    let images = partition_images(spec, &parts, work)?;

    // The disk: sparse file, GPT, protective MBR with boot code, partition contents.
    let disk_path = work.join("disk.img");
    let mut disk = write_table(&disk_path, &parts, total)?;
    write_mbr(spec, &mut disk, &disk_path, &parts, total)?;
    for (p, img) in &images {
        write_part(&mut disk, &disk_path, p, img)?;
    }
    disk.sync_all().ctx("fsync", &disk_path)?;
    drop(disk);
    verify(&disk_path, &parts)?;
    fs::rename(&disk_path, out).ctx("rename into place", out)?;
    Ok(())
}

/// The partition of `parts` named `name`.
fn part<'p>(parts: &'p [Part], name: &str) -> &'p Part {
    parts
        .iter()
        .find(|p| p.name == name)
        .expect("layout has every partition")
}

/// The image file of every partition that is not left empty, made in `work`.
fn partition_images<'p>(
    spec: &DiskSpec,
    parts: &'p [Part],
    work: &Path,
) -> Result<Vec<(&'p Part, PathBuf)>> {
    let mut images: Vec<(&Part, PathBuf)> = Vec::new();
    if spec.variant == BootVariant::GrubBios {
        let core = work.join("core.img");
        grubimg::bios_core(&core, part(parts, PART_BIOS_BOOT).first_lba)?;
        images.push((part(parts, PART_BIOS_BOOT), core));
    }
    let esp = work.join("esp.img");
    make_esp(spec, &esp, part(parts, PART_ESP).len(), work)?;
    images.push((part(parts, PART_ESP), esp));
    let boot = work.join("boot.img");
    loader::boot_partition(spec, &boot, part(parts, PART_BOOT).len(), work)?;
    images.push((part(parts, PART_BOOT), boot));
    images.push((part(parts, PART_ROOTFS_A), spec.slot_a.rootfs.clone()));
    let state = work.join("state.img");
    let state_tree = state_tree(spec, work)?;
    mkfs_ext4(
        &state,
        part(parts, PART_STATE).len(),
        "state",
        Some(&state_tree),
        &[],
    )?;
    images.push((part(parts, PART_STATE), state));
    Ok(images)
}

/// What the state partition starts with: the installed release's manifest, kept where
/// libupgrade keeps a slot's (`slots/a/manifest.json`), so the node knows from its first boot
/// which build slot A runs and refuses another build of that generation; and its payloads in
/// the payload store (`payloads/objects/<sha256>`), as a stage would have left them.
fn state_tree(spec: &DiskSpec, work: &Path) -> Result<PathBuf> {
    let tree = work.join("state-tree");
    let _ = std::fs::remove_dir_all(&tree);
    let dst = libupgrade::slotfiles::manifest_path(&tree, libupgrade::Slot::A);
    let dir = dst.parent().expect("a slot's manifest has a directory");
    std::fs::create_dir_all(dir).ctx("create directory", dir)?;
    let src = spec.slot_a.dir.join(libupgrade::manifest::MANIFEST_FILE);
    std::fs::copy(&src, &dst).ctx("copy", &src)?;
    let bytes = std::fs::read(&src).ctx("read", &src)?;
    let m = libupgrade::manifest::Manifest::parse(&bytes).map_err(|e| Error::Input {
        path: src.clone(),
        what: e.to_string(),
    })?;
    for p in &m.payloads {
        let obj = libupgrade::payload::object_path(&tree, &p.file.sha256);
        let dir = obj.parent().expect("an object has a directory");
        std::fs::create_dir_all(dir).ctx("create directory", dir)?;
        let from = spec.slot_a.dir.join(&p.file.path);
        std::fs::copy(&from, &obj).ctx("copy", &from)?;
    }
    Ok(tree)
}

/// A new sparse disk file of `total` bytes at `disk_path` with the GPT of `parts`.
fn write_table(disk_path: &Path, parts: &[Part], total: u64) -> Result<File> {
    let gpt_err = |source| Error::Gpt {
        path: disk_path.to_path_buf(),
        source,
    };
    let disk = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(disk_path)
        .ctx("create", disk_path)?;
    disk.set_len(total).ctx("size", disk_path)?;
    let mut gdisk = gpt::GptConfig::new()
        .writable(true)
        .logical_block_size(gpt::disk::LogicalBlockSize::Lb512)
        .create_from_device(disk, None)
        .map_err(gpt_err)?;
    for p in parts {
        gdisk
            .add_partition_at(
                p.name,
                p.number,
                p.first_lba,
                p.sectors,
                p.kind.clone(),
                p.flags,
            )
            .map_err(gpt_err)?;
    }
    gdisk.write().map_err(gpt_err)
}

/// The protective MBR, with the variant's BIOS boot code (GRUB's boot.img pointing at
/// core.img, or syslinux's gptmbr.bin).
fn write_mbr(
    spec: &DiskSpec,
    disk: &mut File,
    disk_path: &Path,
    parts: &[Part],
    total: u64,
) -> Result<()> {
    let lbas = u32::try_from(total / SECTOR - 1).unwrap_or(u32::MAX);
    let mut mbr = gpt::mbr::ProtectiveMBR::with_lb_size(lbas);
    match spec.variant {
        BootVariant::GrubBios => {
            mbr.set_bootcode(grubimg::bios_mbr_code(
                part(parts, PART_BIOS_BOOT).first_lba,
            )?);
        }
        BootVariant::Extlinux => {
            mbr.set_bootcode(loader::gptmbr_code()?);
        }
        BootVariant::GrubEfi | BootVariant::GrubEfiSb => {}
    }
    mbr.overwrite_lba0(disk).map_err(|e| {
        Error::Layout(format!(
            "{}: writing the protective MBR: {e}",
            disk_path.display()
        ))
    })?;
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

/// The ESP: vfat; with the GRUB EFI binary for the grub-efi variant.
fn make_esp(spec: &DiskSpec, img: &Path, size: u64, work: &Path) -> Result<()> {
    let _ = fs::remove_file(img);
    Cmd::new("mkfs.vfat")
        .args(["-C", "-n", "ESP"])
        .arg(img)
        .arg((size / 1024).to_string())
        .run()?;
    let efi = work.join(spec.target.efi_boot_file());
    if spec.variant == BootVariant::GrubEfiSb {
        let signed = loader::signed_inputs(spec)?;
        let unsigned = work.join("grub-unsigned.efi");
        grubimg::signed_efi_image(
            spec.target,
            &loader::signed_script(spec.target),
            &unsigned,
            work,
        )?;
        let key = crate::secboot::SbKey {
            key: signed.key.to_path_buf(),
            cert: signed.cert.to_path_buf(),
        };
        crate::secboot::sign(&key, &unsigned, &efi)?;
    }
    if spec.variant == BootVariant::GrubEfi {
        grubimg::efi_image(
            spec.target,
            &grubimg::efi_dir(spec.target, spec.debs.grub_arm64_efi.as_deref())?,
            &efi,
        )?;
    }
    if matches!(spec.variant, BootVariant::GrubEfi | BootVariant::GrubEfiSb) {
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
