//! [`DirLayout`]: slots as k3OS-style files switched by atomic symlink renames (see the module
//! docs of [`crate::layout`]).

use std::fs::File;
use std::path::{Path, PathBuf};

use bootconfig::Slot;

use super::{file_target, free_bytes, kernel_file_name, open_whole, Layout, Target, ROOTFS_FILE};
use crate::error::{Error, Result};
use crate::manifest::Artifact;

/// Slots as files in one filesystem, k3OS style (see the module docs).
#[derive(Debug, Clone)]
pub struct DirLayout {
    root: PathBuf,
    boot_dir: PathBuf,
}

impl DirLayout {
    /// Slots under `root` (see [`crate::config::LayoutConfig::Dir`]); `boot_dir` is the boot
    /// partition the loader reads.
    pub fn new(root: &Path, boot_dir: &Path) -> DirLayout {
        DirLayout {
            root: root.to_path_buf(),
            boot_dir: boot_dir.to_path_buf(),
        }
    }

    fn kind_dir(&self, a: Artifact) -> PathBuf {
        self.root.join(if a == Artifact::Rootfs {
            "rootfs"
        } else {
            "kernel"
        })
    }

    /// The version a slot link points at, if any.
    pub fn linked_version(&self, kind_dir: &Path, slot: Slot) -> Option<String> {
        std::fs::read_link(kind_dir.join(slot.lower()))
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    }

    /// Point `dir/name` at `to`, atomically (temp link + rename + fsync dir).
    fn relink(dir: &Path, name: &str, to: &str) -> Result<()> {
        let tmp = dir.join(format!(".{name}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(to, &tmp).map_err(|e| Error::io("symlink", &tmp, e))?;
        let dst = dir.join(name);
        std::fs::rename(&tmp, &dst).map_err(|e| Error::io("rename link", &dst, e))?;
        bootconfig::fsync_dir(dir)?;
        crate::barrier::hit("link-switched");
        Ok(())
    }

    fn check_version_name(version: &str) -> Result<()> {
        if version.is_empty()
            || version.starts_with('.')
            || version.contains('/')
            || version == "a"
            || version == "b"
            || version == "current"
            || version == "previous"
        {
            return Err(Error::Layout(format!(
                "version '{version}' cannot name a directory in a dir layout"
            )));
        }
        Ok(())
    }

    /// Remove version directories no slot link points at.
    fn collect_garbage(&self, kind_dir: &Path) -> Result<()> {
        let keep: Vec<String> = Slot::ALL
            .iter()
            .filter_map(|s| self.linked_version(kind_dir, *s))
            .collect();
        let Ok(rd) = std::fs::read_dir(kind_dir) else {
            return Ok(());
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if is_dir && !keep.contains(&name) && !name.starts_with('.') {
                std::fs::remove_dir_all(e.path())
                    .map_err(|err| Error::io("remove old version", e.path(), err))?;
            }
        }
        Ok(())
    }
}

impl Layout for DirLayout {
    fn describe(&self) -> String {
        format!(
            "dir in {} (k3OS style; slot links a/b, current/previous)",
            self.root.display()
        )
    }

    fn target(
        &self,
        slot: Slot,
        version: &str,
        artifact: Artifact,
        size: u64,
        resume: bool,
    ) -> Result<Target> {
        Self::check_version_name(version)?;
        let kind = self.kind_dir(artifact);
        if self.linked_version(&kind, slot.other()).as_deref() == Some(version) {
            return Err(Error::Layout(format!(
                "version {version} is what slot {} runs from ({}); staging it again would overwrite the active slot",
                slot.other(),
                kind.join(version).display()
            )));
        }
        file_target(
            &kind.join(version),
            kernel_file_name(artifact),
            size,
            resume,
        )
    }

    fn capacity(&self, _slot: Slot, artifact: Artifact) -> Result<u64> {
        let kind = self.kind_dir(artifact);
        free_bytes(if kind.exists() { &kind } else { &self.root })
    }

    fn discard(&self, _slot: Slot, version: &str, artifact: Artifact) -> Result<()> {
        match artifact {
            Artifact::Rootfs => Ok(()),
            a => super::discard_file_target(&self.kind_dir(a).join(version), kernel_file_name(a)),
        }
    }

    fn place(&self, _slot: Slot, artifact: Artifact) -> String {
        format!("the filesystem of {}", self.kind_dir(artifact).display())
    }

    fn commit(&self, slot: Slot, version: &str) -> Result<()> {
        for a in [Artifact::Rootfs, Artifact::Kernel] {
            let kind = self.kind_dir(a);
            Self::relink(&kind, slot.lower(), version)?;
        }
        for a in [Artifact::Rootfs, Artifact::Kernel] {
            self.collect_garbage(&self.kind_dir(a))?;
        }
        Ok(())
    }

    fn open_rootfs(&self, _slot: Slot, version: &str) -> Result<(File, u64, u64)> {
        let p = self
            .kind_dir(Artifact::Rootfs)
            .join(version)
            .join(ROOTFS_FILE);
        open_whole(&p)
    }

    fn open_artifact(
        &self,
        _slot: Slot,
        version: &str,
        artifact: Artifact,
    ) -> Result<(File, u64, u64)> {
        Self::check_version_name(version)?;
        open_whole(
            &self
                .kind_dir(artifact)
                .join(version)
                .join(kernel_file_name(artifact)),
        )
    }

    fn verity_device(
        &self,
        _slot: Slot,
        version: &str,
        v: &crate::manifest::Verity,
        write: bool,
    ) -> Result<crate::verity::FileDevice> {
        Self::check_version_name(version)?;
        let dir = self.kind_dir(Artifact::Rootfs).join(version);
        let data = std::sync::Arc::new(super::open_for(&dir.join(ROOTFS_FILE), write)?);
        let vp = dir.join(super::VERITY_FILE);
        let tree = if write {
            let f = super::open_rw(&vp, true, false)?;
            f.set_len(v.hash_size + v.fec_size)
                .map_err(|e| Error::io("size", &vp, e))?;
            f
        } else {
            super::open_for(&vp, false)?
        };
        let tree = std::sync::Arc::new(tree);
        Ok(crate::verity::FileDevice {
            data: (data, 0),
            data_blocks: v.data_blocks,
            hash: (tree.clone(), 0),
            fec: (tree, v.hash_size),
        })
    }

    fn is_rootfs_of(&self, slot: Slot, _dev: (u32, u32), source: &str) -> Result<bool> {
        // The initrd loop-mounts the slot's rootfs file: compare the loop device's backing file.
        let loopname = Path::new(source)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let backing = Path::new("/sys/block")
            .join(&loopname)
            .join("loop/backing_file");
        let file = std::fs::read_to_string(&backing).map_err(|e| Error::io("read", &backing, e))?;
        let expected = std::fs::canonicalize(
            self.kind_dir(Artifact::Rootfs)
                .join(slot.lower())
                .join(ROOTFS_FILE),
        )
        .map_err(|e| Error::io("resolve", self.root.join("rootfs"), e))?;
        Ok(Path::new(file.trim()) == expected)
    }

    fn confirmed(&self, slot: Slot) -> Result<()> {
        for a in [Artifact::Rootfs, Artifact::Kernel] {
            let kind = self.kind_dir(a);
            Self::relink(&kind, "previous", slot.other().lower())?;
            Self::relink(&kind, "current", slot.lower())?;
        }
        let _ = &self.boot_dir;
        Ok(())
    }
}
