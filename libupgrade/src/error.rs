//! Every way an update can fail, each naming what was wrong and where.

use crate::units::Size;
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
    #[error("release {version} has generation {found}, older than the installed generation {installed}; pass --allow-downgrade (k3os-ops upgrade) to install it anyway")]
    Downgrade {
        version: String,
        found: u64,
        installed: u64,
    },
    #[error("release {version} has generation {found}, older than generation {staged} already staged into slot {slot}; pass --allow-downgrade (k3os-ops upgrade) to replace it anyway")]
    OlderThanStaged {
        version: String,
        found: u64,
        staged: u64,
        slot: Slot,
    },
    #[error("release {version} has the running generation {generation} but is a different build (manifest sha256 {found}, running {running}); a generation names one build: publish it as a new generation, or pass --allow-downgrade")]
    SameGenerationOtherBuild {
        version: String,
        generation: u64,
        found: String,
        running: String,
    },
    #[error("release {version} has the running generation {generation}, and this node cannot tell which build of it runs (its slot was written without a record of its manifest); a generation names one build: publish it as a new generation, record the running build with `k3os-ops bootloader install --running-manifest FILE`, or pass --allow-downgrade")]
    SameGenerationUnknownBuild { version: String, generation: u64 },
    #[error("{location}: the signed manifest is release {found}, but {asked} was asked for; nothing was written (the channel or a mirror serves the wrong release)")]
    VersionMismatch {
        location: String,
        asked: String,
        found: String,
    },
    #[error("{location} is not the manifest {from} names: expected {expected}, found {found}; nothing was written (a mirror or attacker serves other bytes)")]
    ManifestPin {
        location: String,
        from: String,
        expected: String,
        found: String,
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
    #[error("{artifact} ({location}): chunk {chunk} at byte {offset}: sha256 mismatch: expected {expected} (signed chunk index), found {found}; refused before writing it")]
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
    #[error("not enough space for the {artifact}: it needs {} but {target} has room for only {}", Size(*.needed), Size(*.available))]
    NoSpace {
        artifact: Artifact,
        target: String,
        needed: u64,
        available: u64,
    },
    /// Not a failure: the attempt stopped where it was told to (a byte budget, the end of a
    /// download schedule), keeping everything it wrote; a later run resumes there.
    #[error("{why}: {} fetched, {} left to fetch; what was written is kept and a later run resumes there", Size(*.fetched), Size(*.left))]
    Stopped {
        why: Stop,
        /// Network bytes this attempt read.
        fetched: u64,
        /// Bytes of the release still to fetch (the plan's, less what this attempt fetched).
        left: u64,
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
    #[error("slot {slot} cannot be activated: {source}")]
    BootScript {
        slot: Slot,
        #[source]
        source: crate::bootscript::ScriptRefusal,
    },
    #[error("invalid request: {0}")]
    Usage(String),
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

/// An error and its causes as one line, outermost first: `a: b: c` (see [`join_messages`]).
/// The one renderer of error chains for every message the workspace prints.
pub fn chain_line(e: &(dyn std::error::Error + 'static)) -> String {
    join_messages(std::iter::successors(Some(e), |e| e.source()).map(|e| e.to_string()))
}

/// Messages of an error chain joined as `a: b: c`, each once: an empty message, or one whose
/// text the line already holds (thiserror messages often repeat their source's), is skipped.
pub fn join_messages(messages: impl IntoIterator<Item = String>) -> String {
    let mut line = String::new();
    for m in messages {
        let m = m.trim();
        if m.is_empty() || line.contains(m) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(m);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_reads_as_one_line_each_message_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer: {0}")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::other("disk on fire"));
        assert_eq!(chain_line(&e), "outer: disk on fire");
        assert_eq!(
            join_messages(["a".into(), " ".into(), "b".into(), "a".into()]),
            "a: b"
        );
    }

    #[test]
    fn messages_a_user_acts_on() {
        let e = Error::NoSpace {
            artifact: Artifact::Rootfs,
            target: "slot B: partition rootfs-b (/dev/vda5)".into(),
            needed: 300 << 20,
            available: 256 << 20,
        };
        assert_eq!(
            e.to_string(),
            "not enough space for the rootfs: it needs 300.0 MiB but slot B: partition rootfs-b (/dev/vda5) has room for only 256.0 MiB"
        );
        let e = Error::Downgrade {
            version: "v1".into(),
            found: 1,
            installed: 2,
        };
        assert!(e.to_string().contains("pass --allow-downgrade"), "{e}");
    }
}

/// Why a stage attempt stopped before it was done, resumable (not a failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The attempt's byte budget (`--max-bytes`) is spent.
    Budget { budget: u64 },
    /// The download schedule's last window closed then (`--stage-until`, `--stage-window`).
    Schedule {
        closed: chrono::DateTime<chrono::Utc>,
    },
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Budget { budget } => write!(
                f,
                "stopped at this attempt's byte budget of {} (--max-bytes)",
                Size(*budget)
            ),
            Stop::Schedule { closed } => write!(
                f,
                "stopped at the end of the download schedule, whose last window closed at {} (--stage-until, --stage-window, or the channel's stage windows)",
                closed.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
        }
    }
}
