//! The snapshot and targets files of a node's last verified update of each channel, kept under
//! `<state_dir>/channel-meta/v1/<channel>/` so that a poll of an unchanged channel downloads
//! only what TUF requires every time: the `N+1.root.json` probe and `timestamp.json` (as
//! python-tuf's ngclient keeps its local metadata directory).
//!
//! Nothing here is trusted: [`super::client::update`] checks a kept file exactly as a
//! downloaded one (the length and hashes the new timestamp or snapshot pins, a threshold of
//! the role's keys, the pinned version, expiry) and downloads the file when any check fails.
//! A damaged, truncated, missing or foreign file therefore costs one download, never an error
//! or a wrong answer. Files are written only when their bytes change, each through a temporary
//! file, fsync and rename (a power cut leaves the old or the new file; either is re-checked).
//!
//! Layout, versioned by its `v1` directory (a later layout takes a new directory and leaves
//! this one unread): `<channel>` is the first 32 hex digits of the sha256 of the channel's
//! key in the trust store (its directory path, base URL or `github-releases://OWNER/REPO`),
//! so any channel name maps to one safe file name.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::client::Verified;
use super::meta::{sha256_hex, Role};
use super::store::write_atomic;
use super::MetaSource;
use super::TrustError;

/// Directory, inside the state dir, holding every channel's kept files.
pub const KEPT_DIR: &str = "channel-meta/v1";

/// One channel's kept files.
#[derive(Debug, Clone)]
pub struct Kept {
    dir: PathBuf,
}

impl Kept {
    /// The kept files of the channel stored under `key` in the trust store at `store_file`
    /// (they live next to it, in [`KEPT_DIR`]).
    pub fn for_channel(store_file: &Path, key: &str) -> Kept {
        let state_dir = store_file.parent().unwrap_or(Path::new("."));
        let digest = sha256_hex(key.as_bytes());
        Kept {
            dir: state_dir.join(KEPT_DIR).join(&digest[..32]),
        }
    }

    /// Keep the snapshot and targets files `verified` checked (each written only when its
    /// bytes differ from the kept ones).
    pub fn save(&self, verified: &Verified) -> Result<(), TrustError> {
        fs::create_dir_all(&self.dir).map_err(|source| TrustError::Io {
            path: self.dir.clone(),
            source,
        })?;
        for (role, file) in [
            (Role::Snapshot, &verified.snapshot),
            (Role::Targets, &verified.targets_file),
        ] {
            let path = self.dir.join(role.file());
            if file.kept || fs::read(&path).is_ok_and(|b| b == file.bytes) {
                continue;
            }
            write_atomic(&self.dir, role.file(), &file.bytes)?;
        }
        Ok(())
    }
}

impl MetaSource for Kept {
    fn fetch(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>, TrustError> {
        read_bounded(&self.dir.join(name), max)
    }

    fn location(&self, name: &str) -> String {
        format!("{} (kept)", self.dir.join(name).display())
    }
}

/// A channel directory on this machine, read as a node reads it (a local channel) and as the
/// publisher's commands verify it before they sign ([`super::client::served`]).
pub(crate) struct DirMeta(pub(crate) PathBuf);

impl MetaSource for DirMeta {
    fn fetch(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>, TrustError> {
        read_bounded(&self.0.join(name), max)
    }
    fn location(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

/// The file at `path`, at most `max` bytes (more is [`TrustError::TooLarge`]); `Ok(None)` when
/// it does not exist. A local channel directory and the kept files are read this way.
pub(crate) fn read_bounded(path: &Path, max: u64) -> Result<Option<Vec<u8>>, TrustError> {
    let io = |source| TrustError::Io {
        path: path.to_path_buf(),
        source,
    };
    let f = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let mut body = Vec::new();
    f.take(max + 1).read_to_end(&mut body).map_err(io)?;
    if body.len() as u64 > max {
        return Err(TrustError::TooLarge {
            what: path.display().to_string(),
            max,
        });
    }
    Ok(Some(body))
}
