//! Where `create` builds a release: a hidden directory beside the output directory (same
//! filesystem), moved into place only once the release is complete and signed. A refusal at
//! any step (a missing image layer, a patch that cannot be built, a full disk) removes the
//! staging directory and leaves the output directory as it was: absent stays absent, an
//! existing one keeps every byte.
//!
//! Moving into place: an output directory that does not exist is the staging directory
//! renamed (one step); an existing one (empty, or holding files but no release) receives the
//! staged files one rename each, the signature and then `manifest.json` last, so a directory
//! with a manifest is a complete release at every moment. Before the first rename every entry
//! is checked to be replaceable (no directory where the release puts a file or the reverse,
//! which a rename cannot replace), so a refusal there too leaves the directory as it was.
//! Channel listings skip hidden
//! directories, so a release being built is never indexed.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{io_err, ReleaseError};
use crate::manifest::{MANIFEST_FILE, SIGNATURE_FILE};

/// A release being built beside its output directory; removed on drop unless moved.
#[derive(Debug)]
pub(super) struct Staging {
    dir: PathBuf,
    out: PathBuf,
    moved: bool,
}

/// The nearest existing directory at or above `out`'s parent (where the staging goes).
fn base_of(out: &Path) -> PathBuf {
    out.ancestors()
        .skip(1)
        .find(|d| !d.as_os_str().is_empty() && d.is_dir())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

impl Staging {
    /// A new, empty staging directory for `out` (mode 0755, as a served release needs).
    pub(super) fn new(out: &Path) -> Result<Staging, ReleaseError> {
        let name = out
            .file_name()
            .map_or_else(|| "release".into(), |n| n.to_string_lossy().into_owned());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = base_of(out).join(format!(".{name}.creating-{}-{nanos}", std::process::id()));
        fs::create_dir(&dir).map_err(io_err(&dir))?;
        let staging = Staging {
            dir,
            out: out.to_path_buf(),
            moved: false,
        };
        fs::set_permissions(&staging.dir, fs::Permissions::from_mode(0o755))
            .map_err(io_err(&staging.dir))?;
        Ok(staging)
    }

    /// The directory to build in.
    pub(super) fn path(&self) -> &Path {
        &self.dir
    }

    /// Move the complete release into the output directory (module docs).
    pub(super) fn finish(mut self) -> Result<(), ReleaseError> {
        if !self.out.exists() {
            if let Some(parent) = self.out.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs::create_dir_all(parent).map_err(io_err(parent))?;
            }
            fs::rename(&self.dir, &self.out).map_err(io_err(&self.out))?;
            self.moved = true;
            let parent = self.out.parent().filter(|p| !p.as_os_str().is_empty());
            return super::copy::fsync_dir(parent.unwrap_or(Path::new(".")));
        }
        let mut names: Vec<_> = fs::read_dir(&self.dir)
            .map_err(io_err(&self.dir))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io_err(&self.dir))?;
        self.check_replaceable(&names)?;
        // The signature, then the manifest, last.
        names.sort_by_key(|n| match n.to_str() {
            Some(MANIFEST_FILE) => 2,
            Some(SIGNATURE_FILE) => 1,
            _ => 0,
        });
        for n in names {
            let dst = self.out.join(&n);
            fs::rename(self.dir.join(&n), &dst).map_err(io_err(&dst))?;
        }
        super::copy::fsync_dir(&self.out)
    }
}

impl Staging {
    /// Each staged entry of `names` can replace what the output directory holds under its
    /// name by a rename: nothing there, or a file (or link) where a file goes.
    fn check_replaceable(&self, names: &[std::ffi::OsString]) -> Result<(), ReleaseError> {
        for n in names {
            let dst = self.out.join(n);
            let Ok(there) = fs::symlink_metadata(&dst) else {
                continue;
            };
            let ours = fs::symlink_metadata(self.dir.join(n)).map_err(io_err(&self.dir))?;
            let what = match (there.is_dir(), ours.is_dir()) {
                (false, false) => continue,
                (true, false) => "a directory where the release puts a file",
                (false, true) => "a file where the release puts a directory",
                (true, true) => "a directory where the release puts its own directory",
            };
            return Err(ReleaseError::InTheWay {
                out_dir: self.out.clone(),
                path: dst,
                what,
            });
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.moved {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}
