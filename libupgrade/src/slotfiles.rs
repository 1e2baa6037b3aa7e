//! What the node keeps of the release staged into each slot, beside the state file:
//! `<state_dir>/slots/<a|b>/manifest.json` (the signed bytes staging verified) and the boot
//! scripts the release carries (`grub.cfg`, `extlinux.conf`), each checked against the
//! manifest again when read. An activation reads them to decide and install the boot script
//! (`bootscript`); a slot staged before v0.2.0 has none, and reads as a release that
//! carries no script and reads version 1 of every loader file.
//!
//! Written by staging after every artifact is verified and before the slot is recorded as
//! staged; removed when a stage of the slot starts. Every file is replaced atomically.
//!
//! `verity-written` (v0.2.0, issue 34) holds the dm-verity root hash whose tree and FEC this
//! node's stage wrote into the slot: a slot staged by a k3os-ops that ignored the manifest's
//! `verity` field (or written by an image builder) has none, and the scrub does not judge
//! a tree that was never written. Older versions neither read nor need it.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::manifest::{Manifest, ScriptFile, MANIFEST_FILE};
use crate::Slot;

fn dir(state_dir: &Path, slot: Slot) -> PathBuf {
    state_dir.join("slots").join(slot.lower())
}

/// Forget what was kept for `slot` (a stage of it starts).
pub fn clear(state_dir: &Path, slot: Slot) -> Result<()> {
    let d = dir(state_dir, slot);
    match std::fs::remove_dir_all(&d) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove", &d, e)),
    }
}

/// File (in a slot's kept files) naming the root hash whose dm-verity tree and FEC the stage
/// wrote.
pub const VERITY_WRITTEN_FILE: &str = "verity-written";

/// Record that the tree and FEC of root hash `root` were written into `slot`.
pub fn mark_verity_written(state_dir: &Path, slot: Slot, root: &str) -> Result<()> {
    let d = dir(state_dir, slot);
    std::fs::create_dir_all(&d).map_err(|e| Error::io("create directory", &d, e))?;
    bootconfig::write_atomic(d.join(VERITY_WRITTEN_FILE), format!("{root}\n").as_bytes())?;
    Ok(())
}

/// The root hash whose tree and FEC the stage wrote into `slot` (`None`: none recorded).
pub fn verity_written(state_dir: &Path, slot: Slot) -> Result<Option<String>> {
    let p = dir(state_dir, slot).join(VERITY_WRITTEN_FILE);
    match std::fs::read_to_string(&p) {
        Ok(t) => Ok(Some(t.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("read", &p, e)),
    }
}

/// Keep the manifest and the scripts (already verified against it) of the release staged
/// into `slot`.
pub fn save(
    state_dir: &Path,
    slot: Slot,
    manifest: &[u8],
    scripts: &[(ScriptFile, Vec<u8>)],
) -> Result<()> {
    let d = dir(state_dir, slot);
    std::fs::create_dir_all(&d).map_err(|e| Error::io("create directory", &d, e))?;
    for (sc, bytes) in scripts {
        bootconfig::write_atomic(d.join(&sc.path), bytes)?;
    }
    bootconfig::write_atomic(d.join(MANIFEST_FILE), manifest)?;
    Ok(())
}

/// The manifest of the release staged into `slot`, `None` when none was kept (staged before
/// v0.2.0, or never staged).
pub fn manifest(state_dir: &Path, slot: Slot) -> Result<Option<Manifest>> {
    Ok(manifest_with_sha256(state_dir, slot)?.map(|(m, _)| m))
}

/// [`manifest`] with the sha256 of its bytes (what "one generation names one build" compares).
/// Also how an image builder or `bootloader install --running-manifest` tells a node which
/// build its installed slot runs: they keep that release's manifest here before the first boot.
pub fn manifest_with_sha256(state_dir: &Path, slot: Slot) -> Result<Option<(Manifest, String)>> {
    let p = dir(state_dir, slot).join(MANIFEST_FILE);
    let bytes = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("read", &p, e)),
    };
    let m = Manifest::parse(&bytes).map_err(|source| Error::Manifest {
        location: p.display().to_string(),
        source,
    })?;
    Ok(Some((m, hex::encode(Sha256::digest(&bytes)))))
}

/// Where the manifest of `slot`'s release is kept under `state_dir` (an image builder writes
/// the installed release's there).
pub fn manifest_path(state_dir: &Path, slot: Slot) -> PathBuf {
    dir(state_dir, slot).join(MANIFEST_FILE)
}

/// The text of script `sc` kept for `slot`, checked against the manifest's size and sha256.
pub fn script(state_dir: &Path, slot: Slot, sc: &ScriptFile) -> Result<String> {
    let p = dir(state_dir, slot).join(&sc.path);
    let bytes = std::fs::read(&p).map_err(|e| Error::io("read", &p, e))?;
    let sha = hex::encode(Sha256::digest(&bytes));
    if bytes.len() as u64 != sc.size || sha != sc.sha256 {
        return Err(Error::State {
            path: p,
            what: format!(
                "{} bytes with sha256 {sha}, the staged manifest says {} bytes with sha256 {}: stage the release again",
                bytes.len(),
                sc.size,
                sc.sha256
            ),
        });
    }
    String::from_utf8(bytes).map_err(|_| Error::State {
        path: p,
        what: "not UTF-8 text".into(),
    })
}
