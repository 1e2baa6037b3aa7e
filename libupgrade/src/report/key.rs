//! The node's report key: an ed25519 key made at first use and kept on the state partition.
//!
//! File `<state_dir>/node-key`, mode 0600, written atomically (a temporary file created with
//! mode 0600 and `O_EXCL`, fsync, rename, fsync of the directory), two lines:
//!
//! ```text
//! k3os-ops node key 1
//! <64 hex digits: the ed25519 secret seed>
//! ```
//!
//! The first line carries the format; another number is refused naming both, and the file is
//! never rewritten once it exists (a damaged key is an error, not a new identity: the collector
//! knows the node by it).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;

use crate::error::{Error, Result};

/// File name of the node key inside the state directory.
pub const KEY_FILE: &str = "node-key";
const HEADER: &str = "k3os-ops node key ";
const FORMAT: u32 = 1;

fn bad(path: &Path, what: String) -> Error {
    Error::NodeKey {
        path: path.to_path_buf(),
        what,
    }
}

/// Read the key file's text.
fn parse(path: &Path, text: &str) -> Result<SigningKey> {
    let mut lines = text.lines();
    let head = lines.next().unwrap_or_default();
    let format = head
        .strip_prefix(HEADER)
        .and_then(|n| n.trim().parse::<u32>().ok())
        .ok_or_else(|| {
            bad(
                path,
                format!(
                    "first line is {:?}, expected \"{HEADER}{FORMAT}\"",
                    head.escape_debug().to_string()
                ),
            )
        })?;
    if format != FORMAT {
        return Err(bad(
            path,
            format!("node key format {format}, this build reads format {FORMAT}"),
        ));
    }
    let mut seed = [0u8; 32];
    let line = lines.next().unwrap_or_default().trim();
    hex::decode_to_slice(line, &mut seed)
        .map_err(|_| bad(path, "second line is not 64 hex digits".into()))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// The node's key in `state_dir`, made (from the OS's random source) when there is none.
pub fn load_or_create(state_dir: &Path) -> Result<SigningKey> {
    let path = state_dir.join(KEY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => return parse(&path, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("read node key", &path, e)),
    }
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let text = format!("{HEADER}{FORMAT}\n{}\n", hex::encode(key.to_bytes()));
    write_new(state_dir, &path, text.as_bytes())?;
    log::info!(
        "made this node's report key {} (id {})",
        path.display(),
        fleet_report::NodeId::of(&key.verifying_key())
    );
    Ok(key)
}

/// Write `path` with mode 0600 through a temporary file; a key another process wrote first
/// wins (rename would replace it, so the temporary is linked only where nothing is).
fn write_new(dir: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create state dir", dir, e))?;
    let tmp: PathBuf = dir.join(format!(".{KEY_FILE}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| Error::io("create node key", &tmp, e))?;
        f.write_all(bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| Error::io("write node key", &tmp, e))?;
    }
    // link(2) fails when the name exists: two first uses at once keep one key.
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io("link node key", path, e)),
    }
    bootconfig::fsync_dir(dir)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn made_once_with_mode_0600_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path()).unwrap();
        let b = load_or_create(dir.path()).unwrap();
        assert_eq!(a.to_bytes(), b.to_bytes());
        let meta = std::fs::metadata(dir.path().join(KEY_FILE)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file left");
    }

    #[test]
    fn a_damaged_or_newer_key_is_an_error_never_a_new_identity() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(KEY_FILE);
        for (text, want) in [
            (
                "k3os-ops node key 2\n00\n",
                "format 2, this build reads format 1",
            ),
            ("garbage", "first line"),
            ("k3os-ops node key 1\nxyz\n", "not 64 hex"),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = load_or_create(dir.path()).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("node-key"), "{e}");
            assert_eq!(std::fs::read_to_string(&p).unwrap(), text, "not rewritten");
        }
    }
}
