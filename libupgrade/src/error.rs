//! Every way an update can fail, each naming what was wrong and where.

use std::path::{Path, PathBuf};

use bootconfig::Slot;

use crate::manifest::{Artifact, ManifestError};
use crate::state::SlotState;

/// Errors of libupgrade. Messages are complete sentences for an operator reading a log on a
/// remote node: they name the file, the slot, and what was expected versus what was found.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path}: {what}")]
    Config { path: PathBuf, what: String },
    #[error("state file {path}: {what}")]
    State { path: PathBuf, what: String },
    #[error("bootloader: {0}")]
    Boot(#[from] bootconfig::Error),
    #[error("manifest {location}: {source}")]
    Manifest {
        location: String,
        #[source]
        source: ManifestError,
    },
    #[error("signature of {location}: {what}")]
    Signature { location: String, what: String },
    #[error("release {version} has generation {found}, older than the installed generation {installed}; pass allow-downgrade to install it anyway")]
    Downgrade {
        version: String,
        found: u64,
        installed: u64,
    },
    #[error("fetch {location}: {what}")]
    Fetch {
        location: String,
        what: String,
        /// Worth retrying (dropped connection, 5xx), as opposed to 404 or a missing file.
        retryable: bool,
    },
    #[error("{artifact} ({location}): sha256 mismatch: expected {expected}, found {found}")]
    Checksum {
        artifact: Artifact,
        location: String,
        expected: String,
        found: String,
    },
    #[error("{artifact} ({location}): size mismatch: expected {expected} bytes, got {found}")]
    Size {
        artifact: Artifact,
        location: String,
        expected: u64,
        found: u64,
    },
    #[error("{artifact} ({location}): chunk {chunk} at byte {offset} has sha256 {found}, the signed chunk index says {expected}; refused before writing it")]
    ChunkDigest {
        artifact: Artifact,
        location: String,
        chunk: usize,
        offset: u64,
        expected: String,
        found: String,
    },
    #[error("{artifact}: chunk index {location}: {what}")]
    ChunkIndex {
        artifact: Artifact,
        location: String,
        what: String,
    },
    #[error("{artifact} needs {needed} bytes but {target} has room for {available}")]
    NoSpace {
        artifact: Artifact,
        target: String,
        needed: u64,
        available: u64,
    },
    #[error("slot layout: {0}")]
    Layout(String),
    #[error("rootfs of slot {slot} is not a valid squashfs: {what}")]
    BadImage { slot: Slot, what: String },
    #[error("cannot tell which slot is booted: {0}")]
    UnknownBootedSlot(String),
    #[error("slot {slot} is the booted slot; it is never written or invalidated while running")]
    SlotBusy { slot: Slot },
    #[error("slot {slot} is {state}, expected {expected}")]
    SlotState {
        slot: Slot,
        state: SlotState,
        expected: &'static str,
    },
    #[error("health check failed on slot {slot}: {failures}")]
    HealthCheck {
        slot: Slot,
        failures: String,
        rolled_back: bool,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(op: &'static str, path: impl AsRef<Path>, source: std::io::Error) -> Error {
        Error::Io {
            op,
            path: path.as_ref().to_path_buf(),
            source,
        }
    }
}
