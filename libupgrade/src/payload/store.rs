//! The payload store: `<state_dir>/payloads/objects/<sha256>`, content-addressed read-only
//! files on the state partition, beside the slots (like RAUC's artifact repositories).
//!
//! - **Written once.** A payload is staged into `objects/.<sha256>.partial` (chunk by chunk
//!   or streamed, resumable like a slot file: the partial file is kept and re-verified), its
//!   sha256 checked, fsynced, made read-only, renamed to `objects/<sha256>` and the directory
//!   fsynced (barrier `payload:object-renamed`). An object already there costs 0 bytes.
//! - **Referenced by the slots.** A slot references the payloads its kept manifest
//!   (`slots/<a|b>/manifest.json`, [`crate::slotfiles`]) names; a stage in progress references
//!   the objects its download checkpoint lists. A slot without a kept manifest (staged before
//!   v0.2.0) references none: releases before v0.2.0 carry no payloads, and an image builder
//!   that installs payloads keeps the installed release's manifest as it does for its boot
//!   scripts.
//! - **Pruned** when a stage starts (the target's kept manifest is gone by then) and after a
//!   bless: every object and partial file no reference names is removed, one at a time, the
//!   directory fsynced after each (barrier `payload:object-pruned`). A cut anywhere leaves
//!   every referenced object intact (references are written before objects are needed and
//!   removed only by invalidating their slot), at worst an unreferenced object that the next
//!   prune removes.
//! - **Budgeted** ([`crate::Config::payload_store_max_bytes`]): a release whose new objects
//!   do not fit beside the running slot's is refused before anything is written, naming the
//!   bytes needed, held and the budget ([`crate::Error::PayloadBudget`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use bootconfig::Slot;

use crate::error::{Error, Result};
use crate::manifest::Manifest;

/// The store's folder under the state directory.
const PAYLOADS_DIR: &str = "payloads";
/// The objects' folder inside it.
const OBJECTS_DIR: &str = "objects";

/// The store's own folder, `<state_dir>/payloads` (objects, their proofs, the quarantine).
pub(crate) fn store_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(PAYLOADS_DIR)
}

/// Where the store keeps its objects: `<state_dir>/payloads/objects`.
pub fn objects_dir(state_dir: &Path) -> PathBuf {
    store_dir(state_dir).join(OBJECTS_DIR)
}

/// Where the object of the payload whose sha256 is `sha256` is kept (it may not be there).
/// The boot's activation reads a slot's payloads from here.
pub fn object_path(state_dir: &Path, sha256: &str) -> PathBuf {
    objects_dir(state_dir).join(sha256)
}

/// The store holds object `sha256` of `size` bytes, its bytes proven to be its name
/// ([`super::prove`]: by its proof, or hashed; one that is not is moved aside).
pub(crate) fn holds(state_dir: &Path, sha256: &str, size: u64) -> bool {
    super::prove(state_dir, sha256, size).is_held()
}

/// The sha256 of every object `m` keeps in the store (payload kinds this build knows), once.
pub(crate) fn objects_of(m: &Manifest) -> BTreeSet<String> {
    crate::payload::kinds::stored_payloads(m)
        .map(|p| p.file.sha256.clone())
        .collect()
}

/// The objects the slots' kept manifests and a stage in progress reference.
pub(crate) fn referenced(state_dir: &Path) -> Result<BTreeSet<String>> {
    let mut keep = BTreeSet::new();
    for slot in [Slot::A, Slot::B] {
        if let Some(m) = crate::slotfiles::manifest(state_dir, slot)? {
            keep.extend(objects_of(&m));
        }
    }
    if let Some(p) = crate::net::checkpoint::Partial::load(state_dir) {
        keep.extend(p.objects);
    }
    Ok(keep)
}

/// What the store holds of a set of objects, for the budget and `slot status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreUse {
    /// Bytes of complete objects held.
    pub held: u64,
    /// Bytes of the objects not held (to be staged).
    pub needed: u64,
}

/// What the store holds of `objects` (sha256, size; each counted once).
pub(crate) fn usage<'a>(
    state_dir: &Path,
    objects: impl IntoIterator<Item = (&'a str, u64)>,
) -> StoreUse {
    let mut seen = BTreeSet::new();
    let mut u = StoreUse::default();
    for (sha, size) in objects {
        if !seen.insert(sha) {
            continue;
        }
        if holds(state_dir, sha, size) {
            u.held += size;
        } else {
            u.needed += size;
        }
    }
    u
}

/// Refuse release `m` when its objects and the running release's (`running`) do not fit in
/// `budget` bytes together: what the store must hold once `m` is staged.
pub(crate) fn check_budget(
    state_dir: &Path,
    m: &Manifest,
    running: Option<&Manifest>,
    budget: u64,
) -> Result<StoreUse> {
    let objects = running
        .into_iter()
        .chain(std::iter::once(m))
        .flat_map(crate::payload::kinds::stored_payloads)
        .map(|p| (p.file.sha256.as_str(), p.file.size));
    let u = usage(state_dir, objects);
    if u.held.saturating_add(u.needed) > budget {
        return Err(Error::PayloadBudget {
            version: m.version.clone(),
            needed: u.needed,
            held: u.held,
            budget,
        });
    }
    Ok(u)
}

/// One payload of a slot's kept manifest, for `slot status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PayloadStatus {
    /// Its kind (`image-archive`).
    pub kind: String,
    /// Its name in the release.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its sha256 (the object's name in the store).
    pub sha256: String,
    /// The store holds it, its bytes proven ([`super::prove`]); false: missing, moved to the
    /// quarantine (not its name), or a kind this build does not keep.
    pub in_store: bool,
}

/// The payloads `slot`'s kept manifest names and whether the store holds each; none when
/// no manifest is kept (an unreadable one is logged: `slot status` must not fail on it).
pub fn slot_payloads(state_dir: &Path, slot: Slot) -> Vec<PayloadStatus> {
    let m = match crate::slotfiles::manifest(state_dir, slot) {
        Ok(Some(m)) => m,
        Ok(None) => return Vec::new(),
        Err(e) => {
            log::warn!("slot {slot}: {e}; its payloads are not listed");
            return Vec::new();
        }
    };
    let stored: BTreeSet<String> = objects_of(&m);
    m.payloads
        .iter()
        .map(|p| PayloadStatus {
            kind: p.kind.clone(),
            name: p.name.clone(),
            size: p.file.size,
            sha256: p.file.sha256.clone(),
            in_store: stored.contains(&p.file.sha256)
                && holds(state_dir, &p.file.sha256, p.file.size),
        })
        .collect()
}

/// What a prune removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pruned {
    /// Objects and partial files removed.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// Remove every object and partial file of the store that no reference names ([`referenced`]),
/// one at a time, each removal made durable before the next.
pub(crate) fn prune(state_dir: &Path) -> Result<Pruned> {
    let keep = referenced(state_dir)?;
    prune_except(state_dir, &keep)
}

/// [`prune`] with the references given.
pub(crate) fn prune_except(state_dir: &Path, keep: &BTreeSet<String>) -> Result<Pruned> {
    let dir = objects_dir(state_dir);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Pruned::default()),
        Err(e) => return Err(Error::io("list the payload store", &dir, e)),
    };
    let mut names: Vec<String> = Vec::new();
    for e in entries {
        let e = e.map_err(|e| Error::io("list the payload store", &dir, e))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    let out = prune_names(state_dir, &dir, names, keep)?;
    super::proof::forget_orphans(state_dir);
    Ok(out)
}

/// Remove the objects and partial files `names` (in `dir`) that `keep` does not name.
fn prune_names(
    state_dir: &Path,
    dir: &Path,
    names: Vec<String>,
    keep: &BTreeSet<String>,
) -> Result<Pruned> {
    let mut out = Pruned::default();
    for name in names {
        let sha = name
            .strip_prefix('.')
            .and_then(|n| n.strip_suffix(".partial"))
            .unwrap_or(&name);
        if keep.contains(sha) {
            continue;
        }
        if !is_digest(sha) {
            log::warn!(
                "{}: not an object of the payload store; left alone",
                dir.join(&name).display()
            );
            continue;
        }
        let p = dir.join(&name);
        let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("remove an unreferenced payload", &p, e)),
        }
        bootconfig::fsync_dir(dir)?;
        crate::barrier::hit("payload:object-pruned");
        if name == sha {
            super::proof::forget(state_dir, sha);
        }
        out.files += 1;
        out.bytes += len;
    }
    Ok(out)
}

fn is_digest(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(state: &Path, name: &str, bytes: &[u8]) {
        let d = objects_dir(state);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(name), bytes).unwrap();
    }

    /// An object named by its real sha256.
    fn put_object(state: &Path, bytes: &[u8]) -> String {
        let sha = hex::encode(crate::chunk::digest(bytes));
        put(state, &sha, bytes);
        sha
    }

    #[test]
    fn prune_removes_only_what_no_reference_names() {
        let t = tempfile::tempdir().unwrap();
        let a = put_object(t.path(), b"kept");
        let b = put_object(t.path(), b"gone!");
        let c = "cc".repeat(32);
        put(t.path(), &format!(".{c}.partial"), b"in progress");
        put(t.path(), &format!(".{b}.partial"), b"x");
        put(t.path(), "README", b"not ours");
        // Both proven: the pruned one's proof goes with it.
        assert!(holds(t.path(), &a, 4) && holds(t.path(), &b, 5));
        let keep: BTreeSet<String> = [a.clone(), c.clone()].into();
        let p = prune_except(t.path(), &keep).unwrap();
        assert_eq!(p, Pruned { files: 2, bytes: 6 });
        assert_eq!(
            super::super::prove(t.path(), &a, 4),
            super::super::Held::Proven { hashed: false }
        );
        assert!(!object_path(t.path(), &b).exists());
        assert!(!t.path().join("payloads/proofs").join(&b).exists());
        assert!(objects_dir(t.path()).join(format!(".{c}.partial")).exists());
        assert!(objects_dir(t.path()).join("README").exists());
        // Nothing to do the second time; no store at all is no error.
        assert_eq!(prune_except(t.path(), &keep).unwrap(), Pruned::default());
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            prune_except(empty.path(), &keep).unwrap(),
            Pruned::default()
        );
    }

    #[test]
    fn usage_counts_each_object_once_held_or_needed() {
        let t = tempfile::tempdir().unwrap();
        let a = put_object(t.path(), b"1234");
        let b = "bb".repeat(32);
        let u = usage(
            t.path(),
            [(a.as_str(), 4), (a.as_str(), 4), (b.as_str(), 10)],
        );
        assert_eq!(
            u,
            StoreUse {
                held: 4,
                needed: 10
            }
        );
        // Bytes that are not their name are not held (and are moved aside).
        let c = "cc".repeat(32);
        put(t.path(), &c, b"5678");
        let u = usage(t.path(), [(c.as_str(), 4)]);
        assert_eq!(u, StoreUse { held: 0, needed: 4 });
        assert!(!object_path(t.path(), &c).exists());
    }
}
