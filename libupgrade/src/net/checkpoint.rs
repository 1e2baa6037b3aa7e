//! The download checkpoint: which release is being written into which slot, and how far its
//! bytes got *durably* (target synced before the checkpoint is written). A later `stage` of the
//! same signed manifest into the same still-invalid slot resumes from here instead of starting
//! over. The checkpoint lives in the state directory next to the state file and is replaced
//! atomically; a missing or unreadable checkpoint just means "start over".
//!
//! This module owns the file and the policy of *when* progress is made durable; the stage
//! pipeline ([`crate::stage`]) decides what goes into it.

use std::path::Path;
use std::time::Duration;

use bootconfig::Slot;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::manifest::Part;

/// Download checkpoint file in the state directory.
pub(crate) const PARTIAL_FILE: &str = "download.json";
/// Progress is made durable (target fsynced, checkpoint written) once this many bytes arrived
/// and [`CHECKPOINT_MIN_INTERVAL`] passed, or after [`CHECKPOINT_MAX_INTERVAL`] with any
/// progress: a slow link checkpoints every few MiB, a fast local copy is not slowed by a
/// forced writeback every few milliseconds.
const CHECKPOINT_BYTES: u64 = 16 << 20;
const CHECKPOINT_MIN_INTERVAL: Duration = Duration::from_secs(5);
const CHECKPOINT_MAX_INTERVAL: Duration = Duration::from_secs(60);

/// Whether progress should be made durable now: `bytes` arrived and `since` passed since the
/// last checkpoint.
pub(crate) fn due(bytes: u64, since: Duration) -> bool {
    (bytes >= CHECKPOINT_BYTES && since >= CHECKPOINT_MIN_INTERVAL)
        || since >= CHECKPOINT_MAX_INTERVAL
}

/// Download checkpoint: which release is being written where, and how far it got durably.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Partial {
    pub slot: Slot,
    pub manifest_sha256: String,
    /// The parts complete (`rootfs`, `payload:<name>`: what earlier releases wrote reads
    /// unchanged; a binary that predates payloads reads one naming a payload as no
    /// checkpoint and starts over).
    pub done: Vec<Part>,
    pub current: Option<(Part, u64)>,
    /// Bytes fetched and reused by the attempts so far (artifacts completed).
    #[serde(default)]
    pub fetched: u64,
    #[serde(default)]
    pub reused: u64,
    /// The payload store objects (sha256) of the release being staged: referenced while
    /// the stage is in progress, so a prune keeps them and their partial files (issue 33).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<String>,
}

impl Partial {
    /// The checkpoint in `state_dir`, if there is a readable one.
    pub fn load(state_dir: &Path) -> Option<Partial> {
        let bytes = std::fs::read(state_dir.join(PARTIAL_FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Replace the checkpoint in `state_dir` atomically.
    pub fn save(&self, state_dir: &Path) -> Result<()> {
        let bytes = serde_json::to_vec(self).expect("checkpoint serializes");
        bootconfig::write_atomic(state_dir.join(PARTIAL_FILE), &bytes)?;
        crate::barrier::hit("stage:checkpoint");
        Ok(())
    }

    /// Remove the checkpoint from `state_dir` (durably), if there is one.
    pub fn clear(state_dir: &Path) -> Result<()> {
        let p = state_dir.join(PARTIAL_FILE);
        match std::fs::remove_file(&p) {
            Ok(()) => {
                bootconfig::fsync_dir(state_dir)?;
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove download checkpoint", &p, e)),
        }
    }
}

/// For the fuzz targets (`fuzz/`, feature `fuzzing`): the download checkpoint's
/// `Partial::load` of `state_dir`, and whether the checkpoint it accepted reads back unchanged
/// after `Partial::save` into `copy_dir`. `None` when `load` refused the file.
#[cfg(feature = "fuzzing")]
pub fn fuzz_load_and_resave(state_dir: &Path, copy_dir: &Path) -> Option<bool> {
    let p = Partial::load(state_dir)?;
    p.save(copy_dir).expect("save a loaded checkpoint");
    Some(Partial::load(copy_dir).as_ref() == Some(&p))
}
