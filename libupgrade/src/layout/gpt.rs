//! [`GptLayout`]: slots as GPT partitions (see the module docs of [`crate::layout`]).

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use bootconfig::Slot;

use super::{
    file_target, free_bytes, kernel_file_name, open_rw, open_whole, rootfs_part_name, Finish,
    Layout, Target, PART_ROOTFS_A, PART_ROOTFS_B,
};
use crate::error::{Error, Result};
use crate::manifest::Artifact;

/// A partition of the GPT disk: its number and byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartRange {
    /// The partition's number in the GPT (1-based, as in `/dev/vda5`).
    pub number: u32,
    /// Its first byte on the disk.
    pub start: u64,
    /// Its length in bytes.
    pub len: u64,
}

/// Slots as GPT partitions (see the module docs).
#[derive(Debug, Clone)]
pub struct GptLayout {
    disk: PathBuf,
    boot_dir: PathBuf,
    rootfs: [PartRange; 2],
}

/// The byte ranges of the partitions named `names` in the GPT of `disk` (a device or an
/// image file), in that order.
pub fn part_ranges<const N: usize>(disk: &Path, names: [&str; N]) -> Result<[PartRange; N]> {
    let gpt = ::gpt::GptConfig::new()
        .writable(false)
        .open(disk)
        .map_err(|e| Error::Layout(format!("{}: cannot read a GPT: {e}", disk.display())))?;
    let lb: u64 = (*gpt.logical_block_size()).into();
    let find = |name: &str| -> Result<PartRange> {
        let (num, p) = gpt
            .partitions()
            .iter()
            .find(|(_, p)| p.is_used() && p.name == name)
            .ok_or_else(|| {
                Error::Layout(format!(
                    "{}: no GPT partition named '{name}'",
                    disk.display()
                ))
            })?;
        Ok(PartRange {
            number: *num,
            start: p.first_lba * lb,
            len: (p.last_lba + 1 - p.first_lba) * lb,
        })
    };
    let mut out = [PartRange {
        number: 0,
        start: 0,
        len: 0,
    }; N];
    for (o, name) in out.iter_mut().zip(names) {
        *o = find(name)?;
    }
    Ok(out)
}

impl GptLayout {
    /// Read the GPT of `disk` and find `rootfs-a` and `rootfs-b` by name.
    pub fn open(disk: &Path, boot_dir: &Path) -> Result<GptLayout> {
        let [a, b] = part_ranges(disk, [PART_ROOTFS_A, PART_ROOTFS_B])?;
        Ok(GptLayout {
            disk: disk.to_path_buf(),
            boot_dir: boot_dir.to_path_buf(),
            rootfs: [a, b],
        })
    }

    /// The rootfs partition of `slot`.
    pub fn rootfs_range(&self, slot: Slot) -> PartRange {
        self.rootfs[slot as usize]
    }

    /// The partition's own device node, when the kernel created one for this disk.
    fn part_device(&self, number: u32) -> Option<PathBuf> {
        let meta = std::fs::metadata(&self.disk).ok()?;
        if !meta.file_type().is_block_device() {
            return None;
        }
        let name = std::fs::canonicalize(&self.disk)
            .ok()?
            .file_name()?
            .to_string_lossy()
            .into_owned();
        let sys = Path::new("/sys/class/block").join(&name);
        for entry in std::fs::read_dir(&sys).ok()?.flatten() {
            let p = entry.path().join("partition");
            if let Ok(n) = std::fs::read_to_string(&p) {
                if n.trim().parse::<u32>().ok() == Some(number) {
                    let dev = Path::new("/dev").join(entry.file_name());
                    if dev.exists() {
                        return Some(dev);
                    }
                }
            }
        }
        None
    }

    /// (path, byte offset, length) through which the slot's rootfs partition is reached.
    fn rootfs_access(&self, slot: Slot) -> (PathBuf, u64, u64) {
        let r = self.rootfs_range(slot);
        match self.part_device(r.number) {
            Some(dev) => (dev, 0, r.len),
            None => (self.disk.clone(), r.start, r.len),
        }
    }
}

impl Layout for GptLayout {
    fn describe(&self) -> String {
        format!(
            "gpt on {} (rootfs-a: partition {}, rootfs-b: partition {}; kernels in {})",
            self.disk.display(),
            self.rootfs[0].number,
            self.rootfs[1].number,
            self.boot_dir.display()
        )
    }

    fn target(
        &self,
        slot: Slot,
        _version: &str,
        artifact: Artifact,
        size: u64,
        resume: bool,
    ) -> Result<Target> {
        match artifact {
            Artifact::Rootfs => {
                let (path, offset, len) = self.rootfs_access(slot);
                if size > len {
                    return Err(Error::NoSpace {
                        artifact: artifact.into(),
                        target: format!("slot {slot}: {}", self.place(slot, artifact)),
                        needed: size,
                        available: len,
                    });
                }
                let file = open_rw(&path, false, false)?;
                Ok(Target {
                    file,
                    display: format!("{} ({})", rootfs_part_name(slot), path.display()),
                    offset,
                    capacity: size,
                    finish: Finish::Raw,
                })
            }
            a => file_target(
                &self.boot_dir.join(slot.lower()),
                kernel_file_name(a),
                size,
                resume,
            ),
        }
    }

    fn discard(&self, slot: Slot, _version: &str, artifact: Artifact) -> Result<()> {
        match artifact {
            Artifact::Rootfs => Ok(()),
            a => super::discard_file_target(&self.boot_dir.join(slot.lower()), kernel_file_name(a)),
        }
    }

    fn place(&self, slot: Slot, artifact: Artifact) -> String {
        match artifact {
            Artifact::Rootfs => format!(
                "partition {} ({})",
                rootfs_part_name(slot),
                self.rootfs_access(slot).0.display()
            ),
            _ => format!(
                "the filesystem of {}",
                self.boot_dir.join(slot.lower()).display()
            ),
        }
    }

    fn capacity(&self, slot: Slot, artifact: Artifact) -> Result<u64> {
        match artifact {
            Artifact::Rootfs => Ok(self.rootfs_range(slot).len),
            _ => {
                let dir = self.boot_dir.join(slot.lower());
                let old = std::fs::metadata(dir.join(kernel_file_name(artifact)))
                    .map(|m| m.len())
                    .unwrap_or(0);
                Ok(free_bytes(if dir.exists() { &dir } else { &self.boot_dir })? + old)
            }
        }
    }

    /// The kernel and initrd were renamed into `boot_dir` and fsynced, but on a journalling
    /// filesystem that only puts the new directory entries into the journal, and GRUB reads
    /// the filesystem without replaying it: after a power cut it finds no `/b/vmlinuz` (seen in
    /// the vm-tests power-cut run at `activate:bootloader-flipped`). `syncfs` makes ext4 write
    /// its committed metadata to its home location, so the slot is bootable before it is
    /// recorded as staged.
    fn commit(&self, _slot: Slot, _version: &str) -> Result<()> {
        let dir = File::open(&self.boot_dir).map_err(|e| Error::io("open", &self.boot_dir, e))?;
        // SAFETY: syncfs only reads the file descriptor, which `dir` keeps open.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } != 0 {
            return Err(Error::io(
                "syncfs (flush kernels to where the bootloader reads them)",
                &self.boot_dir,
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    fn open_rootfs(&self, slot: Slot, _version: &str) -> Result<(File, u64, u64)> {
        let (path, offset, len) = self.rootfs_access(slot);
        let f = File::open(&path).map_err(|e| Error::io("open", &path, e))?;
        Ok((f, offset, len))
    }

    fn open_artifact(
        &self,
        slot: Slot,
        version: &str,
        artifact: Artifact,
    ) -> Result<(File, u64, u64)> {
        match artifact {
            Artifact::Rootfs => self.open_rootfs(slot, version),
            a => open_whole(&self.boot_dir.join(slot.lower()).join(kernel_file_name(a))),
        }
    }

    fn verity_device(
        &self,
        slot: Slot,
        _version: &str,
        v: &crate::manifest::Verity,
        write: bool,
    ) -> Result<crate::verity::FileDevice> {
        let (path, offset, len) = self.rootfs_access(slot);
        if v.slot_bytes() > len {
            return Err(Error::NoSpace {
                artifact: crate::manifest::Part::Slot(Artifact::Rootfs),
                target: format!(
                    "slot {slot}: {} (squashfs, dm-verity tree and FEC)",
                    self.place(slot, Artifact::Rootfs)
                ),
                needed: v.slot_bytes(),
                available: len,
            });
        }
        let f = std::sync::Arc::new(super::open_for(&path, write)?);
        Ok(crate::verity::FileDevice {
            data: (f.clone(), offset),
            data_blocks: v.data_blocks,
            hash: (f.clone(), offset + v.hash_offset),
            fec: (f, offset + v.fec_offset),
        })
    }

    fn is_rootfs_of(&self, slot: Slot, dev: (u32, u32), _source: &str) -> Result<bool> {
        let r = self.rootfs_range(slot);
        let Some(part) = self.part_device(r.number) else {
            return Err(Error::Layout(format!(
                "{} has no device node for partition {} to compare the mounted root with",
                self.disk.display(),
                r.number
            )));
        };
        let rdev = std::fs::metadata(&part)
            .map_err(|e| Error::io("stat", &part, e))?
            .rdev();
        Ok((
            nix::sys::stat::major(rdev) as u32,
            nix::sys::stat::minor(rdev) as u32,
        ) == dev)
    }
}
