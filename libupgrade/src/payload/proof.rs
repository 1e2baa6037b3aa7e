//! Proof that an object of the payload store is what its name says, and what happens to one
//! that is not. The store never trusts an object by its name: [`prove`] is the one question
//! the plan (what a release costs, the budget), the stage (what it skips), `slot status` and
//! the boot's linking into the airgap directory ask.
//!
//! **The proof.** After the stage wrote an object and checked its sha256 (or after [`prove`]
//! hashed one it found without a proof), it writes a sidecar record,
//! `<state_dir>/payloads/proofs/<sha256>`: `{"format":1,"sha256","size","ino","mtime_ns",
//! "ctime_ns"}` of the object as it was then. An object counts as held only when its file
//! still has exactly that size, inode, mtime and ctime. Any later write to it (or a file put
//! in its place, or a restore from a copy) changes the ctime, which no user can set back
//! (`utimensat` sets only atime and mtime, and itself moves the ctime): the proof no longer
//! matches, the object is hashed again. A proof that matches costs one `stat` and one small
//! read, so a plan over a large store reads no object. The alternative, hashing every object
//! whenever a plan counts it, reads the whole store (4 GiB by default) on every preview, every
//! stage and every boot.
//!
//! **What it does not protect against.** Someone with root who writes the disk's raw blocks
//! (or the filesystem's metadata) behind the kernel's back changes the bytes without the
//! ctime. The boot's `images` check still reads every archive again, and the verified boot
//! chain is what stands against that attacker.
//!
//! **Migration.** An object without a proof (a store written before proofs, or by an image
//! builder, whose copy has a new inode anyway) is hashed once; a match writes its proof.
//!
//! **Quarantine.** An object whose bytes are not its name (another archive under the name,
//! random bytes, a short or long file) is moved aside to
//! `<state_dir>/payloads/quarantine/<sha256>.<unix seconds>` (at most [`QUARANTINE_KEEP`]
//! kept, the oldest removed first) and its proof removed, so the plan counts it as missing
//! and the stage fetches it again; `slot status` lists what is in quarantine. A power cut
//! leaves the object either in place (proven again next time, and moved again) or moved;
//! neither is ever trusted. Neither step has a barrier: losing a proof costs one hash,
//! never a wrong answer.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::store::{object_path, objects_dir, store_dir};
use crate::error::{Error, Result};

/// The proofs' folder inside the store's folder.
const PROOFS_DIR: &str = "proofs";
/// The quarantine's folder inside the store's folder.
const QUARANTINE_DIR: &str = "quarantine";
/// The proof record's format.
const PROOF_FORMAT: u32 = 1;
/// Objects kept in quarantine at most (each as large as a payload): the oldest go first.
pub const QUARANTINE_KEEP: usize = 4;

/// What the store holds of one object, as [`prove`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// Its bytes are its name.
    Proven {
        /// Proven by reading it now (no proof matched: the first time, or it changed and
        /// still hashes right); false: by its proof alone.
        hashed: bool,
    },
    /// Not in the store.
    Absent,
    /// It was there but its bytes are not its name: moved aside (not held).
    Quarantined(Quarantined),
}

impl Held {
    /// The store holds the object, proven.
    pub fn is_held(&self) -> bool {
        matches!(self, Held::Proven { .. })
    }
}

/// An object moved aside because its bytes were not its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// Its name in the store (the sha256 it claimed).
    pub sha256: String,
    /// Where it is now (None: it could not be moved, and was removed or left unlinked).
    pub moved_to: Option<PathBuf>,
    /// What was wrong with it.
    pub why: String,
}

/// The stat fields a later write to an object changes (the ctime always).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Proof {
    format: u32,
    sha256: String,
    size: u64,
    ino: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

impl Proof {
    fn of(sha256: &str, m: &std::fs::Metadata) -> Proof {
        Proof {
            format: PROOF_FORMAT,
            sha256: sha256.to_string(),
            size: m.len(),
            ino: m.ino(),
            mtime_ns: m.mtime().saturating_mul(1_000_000_000) + m.mtime_nsec(),
            ctime_ns: m.ctime().saturating_mul(1_000_000_000) + m.ctime_nsec(),
        }
    }
}

fn proof_path(state_dir: &Path, sha256: &str) -> PathBuf {
    store_dir(state_dir).join(PROOFS_DIR).join(sha256)
}

/// The quarantine folder: `<state_dir>/payloads/quarantine`.
pub fn quarantine_dir(state_dir: &Path) -> PathBuf {
    store_dir(state_dir).join(QUARANTINE_DIR)
}

/// Whether the store holds object `sha256` of `size` bytes, proven (see the module docs):
/// by its proof when one matches, else by hashing it (then writing its proof). An object that
/// is not its name is moved to the quarantine and logged; it is never held.
pub fn prove(state_dir: &Path, sha256: &str, size: u64) -> Held {
    let path = object_path(state_dir, sha256);
    let Ok(meta) = std::fs::symlink_metadata(&path) else {
        return Held::Absent;
    };
    if !meta.is_file() {
        return quarantine(state_dir, sha256, "not a regular file".into());
    }
    if meta.len() != size {
        let why = format!("{} bytes, the manifest says {size}", meta.len());
        return quarantine(state_dir, sha256, why);
    }
    if read_proof(state_dir, sha256).is_some_and(|p| p == Proof::of(sha256, &meta)) {
        return Held::Proven { hashed: false };
    }
    match crate::release::sha256_file(&path) {
        Ok((n, found)) if n == size && found == sha256 => {
            if let Err(e) = record(state_dir, sha256) {
                log::warn!("payload store: {e}; it is hashed again next time");
            }
            Held::Proven { hashed: true }
        }
        Ok((n, found)) => quarantine(
            state_dir,
            sha256,
            format!("its {n} bytes hash to sha256 {found}"),
        ),
        Err(e) => quarantine(state_dir, sha256, format!("cannot be read: {e}")),
    }
}

fn read_proof(state_dir: &Path, sha256: &str) -> Option<Proof> {
    let bytes = std::fs::read(proof_path(state_dir, sha256)).ok()?;
    serde_json::from_slice::<Proof>(&bytes)
        .ok()
        .filter(|p| p.format == PROOF_FORMAT)
}

/// Write the proof of object `sha256` as its file is now: called only after its bytes were
/// checked against its name (a verified write, or [`prove`]'s hash). Written atomically.
pub(crate) fn record(state_dir: &Path, sha256: &str) -> Result<()> {
    let path = object_path(state_dir, sha256);
    let meta = std::fs::metadata(&path).map_err(|e| Error::io("stat", &path, e))?;
    let bytes = serde_json::to_vec(&Proof::of(sha256, &meta)).expect("a proof serializes");
    let dst = proof_path(state_dir, sha256);
    let dir = dst.parent().expect("a proof has a folder");
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create directory", dir, e))?;
    bootconfig::write_atomic(&dst, &bytes)?;
    Ok(())
}

/// Remove the proof of object `sha256` (its object is gone or moved).
pub(crate) fn forget(state_dir: &Path, sha256: &str) {
    let p = proof_path(state_dir, sha256);
    match std::fs::remove_file(&p) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => log::warn!("{}: cannot remove a stale proof: {e}", p.display()),
    }
}

/// The proofs whose object no longer exists, removed (after a prune).
pub(crate) fn forget_orphans(state_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(store_dir(state_dir).join(PROOFS_DIR)) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !object_path(state_dir, &name).exists() {
            forget(state_dir, &name);
        }
    }
}

/// Move object `sha256` aside because of `why` (see the module docs), logged once.
fn quarantine(state_dir: &Path, sha256: &str, why: String) -> Held {
    let from = object_path(state_dir, sha256);
    forget(state_dir, sha256);
    let moved_to = move_aside(state_dir, &from, sha256)
        .map_err(|e| {
            log::warn!("payload store: {e}; removing it instead");
            if let Err(e) = std::fs::remove_file(&from) {
                log::warn!("payload store: cannot remove {}: {e}", from.display());
            }
        })
        .ok();
    let q = Quarantined {
        sha256: sha256.to_string(),
        moved_to,
        why,
    };
    log::warn!("{q}");
    Held::Quarantined(q)
}

impl std::fmt::Display for Quarantined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "payload store: object {} is not what its name says ({}); ",
            self.sha256,
            self.why.escape_debug()
        )?;
        match &self.moved_to {
            Some(p) => write!(f, "moved to {}, fetched again", p.display()),
            None => write!(f, "not used, fetched again"),
        }
    }
}

fn move_aside(state_dir: &Path, from: &Path, sha256: &str) -> Result<PathBuf> {
    let dir = quarantine_dir(state_dir);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let to = dir.join(format!("{sha256}.{now}"));
    std::fs::rename(from, &to).map_err(|e| Error::io("move aside", from, e))?;
    bootconfig::fsync_dir(&dir)?;
    bootconfig::fsync_dir(objects_dir(state_dir))?;
    let mut held = quarantined(state_dir);
    while held.len() > QUARANTINE_KEEP {
        let old = held.remove(0);
        let p = dir.join(&old.file);
        if let Err(e) = std::fs::remove_file(&p) {
            log::warn!("{}: cannot remove: {e}", p.display());
            break;
        }
    }
    bootconfig::fsync_dir(&dir)?;
    Ok(to)
}

/// One file in the quarantine, for `slot status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuarantineEntry {
    /// Its file name: `<sha256 it claimed>.<unix seconds it was moved>`.
    pub file: String,
    /// When it was moved (unix seconds).
    pub at: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// What the quarantine holds, oldest first.
pub fn quarantined(state_dir: &Path) -> Vec<QuarantineEntry> {
    let Ok(entries) = std::fs::read_dir(quarantine_dir(state_dir)) else {
        return Vec::new();
    };
    let mut out: Vec<QuarantineEntry> = entries
        .flatten()
        .filter_map(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            let at = file.rsplit_once('.')?.1.parse().ok()?;
            let size = e.metadata().ok()?.len();
            Some(QuarantineEntry { file, at, size })
        })
        .collect();
    out.sort_by(|a, b| (a.at, &a.file).cmp(&(b.at, &b.file)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(state: &Path, bytes: &[u8]) -> String {
        let sha = hex::encode(crate::chunk::digest(bytes));
        let d = objects_dir(state);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(&sha), bytes).unwrap();
        sha
    }

    #[test]
    fn an_object_is_hashed_once_then_held_by_its_proof_until_it_changes() {
        let t = tempfile::tempdir().unwrap();
        let sha = put(t.path(), b"payload bytes");
        assert_eq!(prove(t.path(), &sha, 13), Held::Proven { hashed: true });
        assert_eq!(prove(t.path(), &sha, 13), Held::Proven { hashed: false });
        // Rewritten in place with the same bytes: the ctime moved, hashed again, still held.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(object_path(t.path(), &sha), b"payload bytes").unwrap();
        assert_eq!(prove(t.path(), &sha, 13), Held::Proven { hashed: true });
        // Rewritten with other bytes of the same size: quarantined, then absent.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(object_path(t.path(), &sha), b"PAYLOAD BYTES").unwrap();
        let Held::Quarantined(q) = prove(t.path(), &sha, 13) else {
            panic!("a changed object was held");
        };
        assert!(q.moved_to.as_ref().unwrap().exists(), "{q}");
        assert!(q.why.contains("hash to sha256"), "{q}");
        assert_eq!(prove(t.path(), &sha, 13), Held::Absent);
        assert!(!proof_path(t.path(), &sha).exists());
        assert_eq!(quarantined(t.path()).len(), 1);
    }

    #[test]
    fn a_short_object_is_quarantined_without_reading_it_and_the_quarantine_is_bounded() {
        let t = tempfile::tempdir().unwrap();
        for i in 0..QUARANTINE_KEEP + 3 {
            let sha = put(t.path(), format!("object {i}").as_bytes());
            let held = prove(t.path(), &sha, 100);
            assert!(
                matches!(&held, Held::Quarantined(q) if q.why.contains("the manifest says 100")),
                "{held:?}"
            );
            assert!(!object_path(t.path(), &sha).exists());
        }
        assert_eq!(quarantined(t.path()).len(), QUARANTINE_KEEP);
    }
}
