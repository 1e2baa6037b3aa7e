//! Where a slot's bytes live, behind one trait with two implementations:
//!
//! - [`GptLayout`]: GPT partitions found by name with the `gpt` crate — `rootfs-a`/`rootfs-b`
//!   hold the raw squashfs; the kernel and initrd of each slot are files in
//!   `<boot_dir>/{a,b}/` on the `boot` partition. A partition is written through its own device
//!   node when the kernel made one (`/dev/vda4`), else at its byte offset inside the disk (an
//!   image file, or a loop device without partition scanning), never past its last LBA.
//! - [`DirLayout`]: k3OS style, files in one filesystem: `rootfs/<version>/rootfs.squashfs` and
//!   `kernel/<version>/{vmlinuz,initrd}`, with the slot links `rootfs/a`, `kernel/a` (and `b`)
//!   pointing at a version and `current`/`previous` naming the confirmed slot and its fallback.
//!   Every switch is a symlink created under a temporary name and renamed over the old one
//!   (atomic on POSIX filesystems), then the directory is fsynced: an interrupted upgrade can
//!   never leave a dangling or half-written link (k3OS's own `previous` handling was not atomic
//!   and bricked nodes, rancher/k3os#533).
//!
//! The booted slot is never opened for writing: [`Layout::target`] is only called by `stage`,
//! which refuses the booted slot before it gets here, and [`DirLayout`] additionally refuses to
//! write a version directory that the other slot links to.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bootconfig::Slot;

use crate::error::{Error, Result};
use crate::manifest::Artifact;

mod dir;
mod gpt;
pub(crate) mod mapped;

pub use dir::DirLayout;
pub use gpt::{part_ranges, GptLayout, PartRange};

/// GPT partition name of the BIOS boot partition (GRUB's core image on BIOS machines).
pub const PART_BIOS_BOOT: &str = "bios-boot";
/// GPT partition name of the EFI system partition.
pub const PART_ESP: &str = "esp";
/// GPT partition name of the boot partition (loader files, kernels and initrds per slot).
pub const PART_BOOT: &str = "boot";
/// GPT partition name of slot A's rootfs.
pub const PART_ROOTFS_A: &str = "rootfs-a";
/// GPT partition name of slot B's rootfs.
pub const PART_ROOTFS_B: &str = "rootfs-b";
/// GPT partition name of the state partition (state file, partial downloads).
pub const PART_STATE: &str = "state";

/// File name of a slot's kernel (and of the release's kernel).
pub const KERNEL_FILE: &str = "vmlinuz";
/// File name of a slot's initrd (and of the release's initrd).
pub const INITRD_FILE: &str = "initrd";
/// File name of the rootfs in a release and in a [`DirLayout`] slot.
pub const ROOTFS_FILE: &str = "rootfs.squashfs";
/// File beside [`ROOTFS_FILE`] holding a [`DirLayout`] slot's dm-verity tree, then its FEC
/// area (a GPT slot keeps both on its partition after the squashfs).
pub const VERITY_FILE: &str = "rootfs.squashfs.verity";

/// GPT partition name of a slot's rootfs.
pub fn rootfs_part_name(slot: Slot) -> &'static str {
    match slot {
        Slot::A => PART_ROOTFS_A,
        Slot::B => PART_ROOTFS_B,
    }
}

/// Where one artifact is being written: a byte range of a file or device, and what makes it
/// final once complete.
#[derive(Debug)]
pub struct Target {
    file: File,
    /// Path shown in messages.
    display: String,
    offset: u64,
    capacity: u64,
    finish: Finish,
}

#[derive(Debug)]
enum Finish {
    /// Raw range (a partition): complete once synced.
    Raw,
    /// Written under a temporary name; renamed over `dst` when complete (made read-only
    /// first when `read_only`), then the barrier `renamed` is hit.
    Rename {
        tmp: PathBuf,
        dst: PathBuf,
        read_only: bool,
        renamed: &'static str,
    },
}

impl Target {
    /// Bytes available for this artifact.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The file, device or partition being written, as shown in messages.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// Write `buf` at `pos` (relative to the artifact's start), never past the capacity.
    pub fn write_at(&self, pos: u64, buf: &[u8]) -> Result<()> {
        let end = pos + buf.len() as u64;
        if end > self.capacity {
            return Err(Error::Layout(format!(
                "write to {} at {pos}..{end} exceeds its {} bytes",
                self.display, self.capacity
            )));
        }
        self.file
            .write_all_at(buf, self.offset + pos)
            .map_err(|e| Error::io("write", &self.display, e))
    }

    /// Read exactly `buf.len()` bytes at `pos` (relative to the artifact's start).
    pub fn read_at(&self, pos: u64, buf: &mut [u8]) -> Result<()> {
        if pos + buf.len() as u64 > self.capacity {
            return Err(Error::Layout(format!(
                "read of {} at {pos}..{} exceeds its {} bytes",
                self.display,
                pos + buf.len() as u64,
                self.capacity
            )));
        }
        self.file
            .read_exact_at(buf, self.offset + pos)
            .map_err(|e| Error::io("read", &self.display, e))
    }

    /// Make what was written so far durable.
    pub fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io("fsync", &self.display, e))
    }

    /// A reader over the first `len` bytes (resume re-hashing, image checks).
    pub fn reader(&self, len: u64) -> Result<impl Read + '_> {
        let mut f = &self.file;
        f.seek(SeekFrom::Start(self.offset))
            .map_err(|e| Error::io("seek", &self.display, e))?;
        Ok(f.take(len))
    }

    /// Length already present in a file target (0 for raw targets: their progress is
    /// recorded in the download checkpoint instead).
    pub fn existing_len(&self) -> Result<u64> {
        match self.finish {
            Finish::Raw => Ok(0),
            Finish::Rename { .. } => self
                .file
                .metadata()
                .map(|m| m.len())
                .map_err(|e| Error::io("stat", &self.display, e)),
        }
    }

    /// True for a file target (temp file renamed into place), whose [`Target::existing_len`]
    /// is what is really there; false for a raw partition.
    pub fn is_file(&self) -> bool {
        matches!(self.finish, Finish::Rename { .. })
    }

    /// Truncate a file target to `len` (a resumed download drops bytes past its checkpoint).
    pub fn truncate(&self, len: u64) -> Result<()> {
        if let Finish::Rename { .. } = self.finish {
            self.file
                .set_len(len)
                .map_err(|e| Error::io("truncate", &self.display, e))?;
        }
        Ok(())
    }

    /// Sync and make the artifact final (rename into place, fsync the directory).
    pub fn finish(self) -> Result<()> {
        self.sync()?;
        if let Finish::Rename {
            tmp,
            dst,
            read_only,
            renamed,
        } = &self.finish
        {
            if *read_only {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o444))
                    .map_err(|e| Error::io("make read-only", tmp, e))?;
            }
            std::fs::rename(tmp, dst).map_err(|e| Error::io("rename into place", dst, e))?;
            fsync_parent(dst)?;
            crate::barrier::hit(renamed);
        }
        Ok(())
    }
}

pub(crate) fn fsync_parent(p: &Path) -> Result<()> {
    let dir = p.parent().unwrap_or(Path::new("."));
    bootconfig::fsync_dir(dir)?;
    Ok(())
}

/// One way of laying out the two slots.
pub trait Layout: Send + Sync {
    /// One line for `slot status`.
    fn describe(&self) -> String;
    /// Open the place `artifact` of `slot` is written to. `size` is the artifact's size; a
    /// target too small is refused here with [`Error::NoSpace`] before anything is written.
    /// `resume`: keep what a previous attempt wrote (file targets keep their partial file).
    fn target(
        &self,
        slot: Slot,
        version: &str,
        artifact: Artifact,
        size: u64,
        resume: bool,
    ) -> Result<Target>;
    /// Bytes available for `artifact` of `slot` before anything is written (a partition's
    /// size, or the free space of the filesystem that will hold the file).
    fn capacity(&self, slot: Slot, artifact: Artifact) -> Result<u64>;
    /// Where [`Layout::capacity`] is measured, for an operator: "partition rootfs-b
    /// (/dev/vda5)", "the filesystem of /boot/b".
    fn place(&self, slot: Slot, artifact: Artifact) -> String;
    /// After every artifact is verified: make the slot point at what was written.
    fn commit(&self, slot: Slot, version: &str) -> Result<()>;
    /// Open the rootfs of `version` written for `slot`, for reading: (file, byte offset,
    /// length available).
    fn open_rootfs(&self, slot: Slot, version: &str) -> Result<(File, u64, u64)>;
    /// Open `artifact` of `slot` as installed (`version`) for reading: (file, byte offset,
    /// length available). The stage pipeline reads the running slot through it to find the
    /// chunks a node already holds.
    fn open_artifact(
        &self,
        slot: Slot,
        version: &str,
        artifact: Artifact,
    ) -> Result<(File, u64, u64)> {
        match artifact {
            Artifact::Rootfs => self.open_rootfs(slot, version),
            a => Err(Error::Layout(format!(
                "{a} of slot {slot} cannot be read back from this layout"
            ))),
        }
    }
    /// The dm-verity device of `slot`'s rootfs (`version`) with the geometry of `v`: the
    /// partition holding squashfs, tree and FEC (refused with [`Error::NoSpace`] when it is
    /// too small), or the rootfs file and the [`VERITY_FILE`] beside it (created when
    /// `write`). Opened for writing only when `write`: by the stage of that slot and by a
    /// scrub repairing a slot that is not booted.
    fn verity_device(
        &self,
        slot: Slot,
        version: &str,
        v: &crate::manifest::Verity,
        write: bool,
    ) -> Result<crate::verity::FileDevice>;
    /// Is the filesystem mounted from `source` (mountinfo's major:minor and source) the slot's rootfs?
    fn is_rootfs_of(&self, slot: Slot, dev: (u32, u32), source: &str) -> Result<bool>;
    /// Remove what a failed stage wrote of `artifact` (`version`) for `slot` where it would
    /// keep taking room: the partial kernel or initrd on the boot filesystem, which also holds
    /// the loader's env copies. Raw partitions keep their bytes (nothing else lives there).
    fn discard(&self, slot: Slot, version: &str, artifact: Artifact) -> Result<()>;
    /// Called when `slot` is confirmed good (DirLayout updates `current`/`previous`).
    fn confirmed(&self, _slot: Slot) -> Result<()> {
        Ok(())
    }
}

fn open_rw(path: &Path, create: bool, truncate: bool) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(truncate)
        .open(path)
        .map_err(|e| Error::io("open for writing", path, e))
}

/// Free bytes on the filesystem holding `dir`.
pub(crate) fn free_bytes(dir: &Path) -> Result<u64> {
    let st = nix::sys::statvfs::statvfs(dir).map_err(|e| Error::io("statvfs", dir, e.into()))?;
    Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
}

/// A file target under `dir/name`, written as `dir/.name.partial` and renamed into place.
fn file_target(dir: &Path, name: &str, size: u64, resume: bool) -> Result<Target> {
    new_file_target(dir, name, size, resume, artifact_of(name).into())
}

/// A payload store object's target: `dir/.<sha256>.partial`, renamed read-only to
/// `dir/<sha256>` when complete (barrier `payload:object-renamed`).
pub(crate) fn object_target(
    dir: &Path,
    sha256: &str,
    size: u64,
    resume: bool,
    part: crate::manifest::Part,
) -> Result<Target> {
    let mut t = new_file_target(dir, sha256, size, resume, part)?;
    if let Finish::Rename {
        read_only, renamed, ..
    } = &mut t.finish
    {
        *read_only = true;
        *renamed = "payload:object-renamed";
    }
    Ok(t)
}

/// The partial file a [`file_target`] or [`object_target`] of `dir/name` writes.
pub(crate) fn partial_name(name: &str) -> String {
    format!(".{name}.partial")
}

fn new_file_target(
    dir: &Path,
    name: &str,
    size: u64,
    resume: bool,
    part: crate::manifest::Part,
) -> Result<Target> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create directory", dir, e))?;
    let tmp = dir.join(partial_name(name));
    let dst = dir.join(name);
    let keep = if resume {
        std::fs::metadata(&tmp).map(|m| m.len()).unwrap_or(0)
    } else {
        0
    };
    let available = free_bytes(dir)? + keep;
    // Room for the new file while the old one still exists (replaced only by the rename).
    if size > available {
        return Err(Error::NoSpace {
            artifact: part,
            target: format!("the filesystem of {}", dir.display()),
            needed: size,
            available,
        });
    }
    let file = open_rw(&tmp, true, !resume)?;
    Ok(Target {
        file,
        display: tmp.display().to_string(),
        offset: 0,
        capacity: size,
        finish: Finish::Rename {
            tmp,
            dst,
            read_only: false,
            renamed: "artifact-renamed",
        },
    })
}

/// Remove the partial file [`file_target`] writes for `dir/name`, if there is one.
fn discard_file_target(dir: &Path, name: &str) -> Result<()> {
    let tmp = dir.join(format!(".{name}.partial"));
    match std::fs::remove_file(&tmp) {
        Ok(()) => fsync_parent(&tmp),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove", &tmp, e)),
    }
}

/// `path` for reading, or (with `write`) for writing too.
fn open_for(path: &Path, write: bool) -> Result<File> {
    if write {
        open_rw(path, false, false)
    } else {
        File::open(path).map_err(|e| Error::io("open", path, e))
    }
}

/// A whole file for reading: (file, 0, its length).
fn open_whole(p: &Path) -> Result<(File, u64, u64)> {
    let f = File::open(p).map_err(|e| Error::io("open", p, e))?;
    let len = f.metadata().map_err(|e| Error::io("stat", p, e))?.len();
    Ok((f, 0, len))
}

fn artifact_of(name: &str) -> Artifact {
    match name {
        KERNEL_FILE => Artifact::Kernel,
        INITRD_FILE => Artifact::Initrd,
        _ => Artifact::Rootfs,
    }
}

fn kernel_file_name(a: Artifact) -> &'static str {
    match a {
        Artifact::Kernel => KERNEL_FILE,
        Artifact::Initrd => INITRD_FILE,
        Artifact::Rootfs => ROOTFS_FILE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_layout_switches_by_links_and_never_touches_the_active_version() {
        let t = tempfile::tempdir().unwrap();
        let l = DirLayout::new(t.path(), t.path());
        for (slot, ver) in [(Slot::A, "v1"), (Slot::B, "v2")] {
            for a in Artifact::ALL {
                let tg = l.target(slot, ver, a, 3, false).unwrap();
                tg.write_at(0, ver.as_bytes()).unwrap();
                tg.finish().unwrap();
            }
            l.commit(slot, ver).unwrap();
        }
        assert_eq!(
            std::fs::read(t.path().join("rootfs/b/rootfs.squashfs")).unwrap(),
            b"v2"
        );
        assert_eq!(
            std::fs::read(t.path().join("kernel/a/vmlinuz")).unwrap(),
            b"v1"
        );
        // Staging B with the version A runs is refused.
        let e = l
            .target(Slot::B, "v1", Artifact::Rootfs, 3, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("active slot"), "{e}");
        // Replacing B's v2 by v3 removes v2 once nothing links to it, and keeps v1.
        for a in Artifact::ALL {
            let tg = l.target(Slot::B, "v3", a, 3, false).unwrap();
            tg.write_at(0, b"v3!").unwrap();
            tg.finish().unwrap();
        }
        l.commit(Slot::B, "v3").unwrap();
        assert!(!t.path().join("rootfs/v2").exists());
        assert!(t.path().join("rootfs/v1/rootfs.squashfs").exists());
        l.confirmed(Slot::B).unwrap();
        assert_eq!(
            std::fs::read_link(t.path().join("kernel/current")).unwrap(),
            Path::new("b")
        );
        assert_eq!(
            std::fs::read(t.path().join("kernel/current/vmlinuz")).unwrap(),
            b"v3!"
        );
        assert_eq!(
            std::fs::read(t.path().join("kernel/previous/vmlinuz")).unwrap(),
            b"v1"
        );
    }

    #[test]
    fn a_discarded_file_target_leaves_nothing_behind() {
        let t = tempfile::tempdir().unwrap();
        let w = file_target(t.path(), KERNEL_FILE, 4096, false).unwrap();
        w.write_at(0, &[7u8; 4096]).unwrap();
        drop(w);
        assert!(t.path().join(".vmlinuz.partial").exists());
        discard_file_target(t.path(), KERNEL_FILE).unwrap();
        assert!(!t.path().join(".vmlinuz.partial").exists());
        discard_file_target(t.path(), KERNEL_FILE).unwrap();
    }

    #[test]
    fn file_target_refuses_a_too_small_filesystem_before_writing() {
        let t = tempfile::tempdir().unwrap();
        let e = file_target(t.path(), KERNEL_FILE, u64::MAX / 2, false).unwrap_err();
        assert!(matches!(e, Error::NoSpace { .. }), "{e}");
        assert!(!t.path().join(".vmlinuz.partial").exists());
    }
}
