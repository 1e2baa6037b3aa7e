//! Filesystem image files, made without mounting the disk they go into: `mkfs.ext4` (empty or
//! filled from a directory with `-d`), and for the one tool that needs a mounted filesystem
//! (`extlinux --install`) a loop mount of the partition's image file, never of the disk.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result};
use crate::run::Cmd;

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

/// Copy the tree `src` into `dst` (files and directories).
pub fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
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
pub struct LoopMount {
    /// Where it is mounted.
    pub dir: PathBuf,
    mounted: bool,
}

impl LoopMount {
    /// Mount the ext4 image `img` on `dir` (created when missing).
    pub fn new(img: &Path, dir: &Path) -> Result<LoopMount> {
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

    /// Unmount, reporting a failure (drop unmounts silently).
    pub fn unmount(mut self) -> Result<()> {
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
