//! The node's record of channel metadata it has trusted: `<state_dir>/channel-trust.json`.
//!
//! A file of its own (not `state.json`, which a v0.1.0 binary on the fallback slot must keep
//! reading): `{"format":1,"channels":{CHANNEL:{"root":ENVELOPE,"timestamp":N,"snapshot":N,
//! "targets":N,"time_floor":TIME}}}`. Written through a temporary file, fsync and rename, then
//! an fsync of the directory, so a power cut leaves the old or the new record. A newer
//! `format` is refused before its body is read; format 1 grows only by optional fields.
//! Read-check-write runs under [`Store::lock`] (`channel-trust.lock`).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Record, TrustError};

/// File name inside the state dir.
pub const STORE_FILE: &str = "channel-trust.json";
/// The lock file next to it ([`Store::lock`]).
pub const LOCK_FILE: &str = "channel-trust.lock";
/// The format this build writes and the newest it reads.
pub const STORE_FORMAT: u32 = 1;

/// Every channel's record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Store {
    /// The file's format ([`STORE_FORMAT`] when this build writes it; a newer one is refused).
    pub format: u32,
    /// Each channel's record, by its directory path, base URL or `github-releases://OWNER/REPO`.
    #[serde(default)]
    pub channels: BTreeMap<String, Record>,
}

fn io(path: &Path) -> impl FnOnce(io::Error) -> TrustError + '_ {
    move |source| TrustError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Store {
    /// An exclusive advisory lock (`flock`) on `channel-trust.lock` next to the store at
    /// `path`, held until the guard is dropped: a node's processes (the agent, an operator's
    /// `upgrade`) read, check and write the store one at a time, so neither writes back
    /// versions older than the other just recorded.
    pub fn lock(path: &Path) -> Result<nix::fcntl::Flock<fs::File>, TrustError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir).map_err(io(dir))?;
        let lock = dir.join(LOCK_FILE);
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock)
            .map_err(io(&lock))?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| io(&lock)(io::Error::from(e)))
    }

    /// Read the store; a missing file is an empty store.
    pub fn load(path: &Path) -> Result<Store, TrustError> {
        let bytes = match fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Store {
                    format: STORE_FORMAT,
                    channels: BTreeMap::new(),
                })
            }
            Err(e) => return Err(io(path)(e)),
        };
        let malformed = |e: serde_json::Error| TrustError::Malformed {
            what: path.display().to_string(),
            why: e.to_string(),
        };
        #[derive(Deserialize)]
        struct Head {
            format: u32,
        }
        let head: Head = serde_json::from_slice(&bytes).map_err(malformed)?;
        if head.format > STORE_FORMAT {
            return Err(TrustError::NewerStore {
                path: path.to_path_buf(),
                found: head.format,
            });
        }
        serde_json::from_slice(&bytes).map_err(malformed)
    }

    /// Write the store atomically (power-cut safe).
    pub fn save(&self, path: &Path) -> Result<(), TrustError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir).map_err(io(dir))?;
        let mut bytes = serde_json::to_vec_pretty(&Store {
            format: STORE_FORMAT,
            channels: self.channels.clone(),
        })
        .expect("store serialises");
        bytes.push(b'\n');
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(STORE_FILE);
        write_atomic(dir, name, &bytes)
    }
}

/// Replace `dir/name` with `bytes` so that a power cut leaves the old or the new file: a
/// temporary file, fsync, rename, then an fsync of the directory.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), TrustError> {
    let tmp: PathBuf = dir.join(format!(".{name}.part"));
    let dst = dir.join(name);
    let written = fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    // A failed write (a full disk) leaves no temporary file behind.
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(io(&tmp)(e));
    }
    if let Err(e) = fs::rename(&tmp, &dst) {
        let _ = fs::remove_file(&tmp);
        return Err(io(&dst)(e));
    }
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_is_empty_and_newer_format_is_refused_by_name() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join(STORE_FILE);
        assert!(Store::load(&p).unwrap().channels.is_empty());
        fs::write(&p, br#"{"format":2,"channels":{"x":1}}"#).unwrap();
        let e = Store::load(&p).unwrap_err().to_string();
        assert!(e.contains("format 2") && e.contains(STORE_FILE), "{e}");
    }
}
