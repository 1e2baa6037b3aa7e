//! Every way an update can fail, each naming what was wrong and where.

use crate::units::Size;
use std::path::{Path, PathBuf};

use bootconfig::Slot;

use crate::manifest::{ManifestError, Part};
use crate::state::SlotState;

/// Errors of libupgrade. Messages are complete sentences for an operator reading a log on a
/// remote node: they name the file, the slot, and what was expected versus what was found.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done, as a verb phrase ("read", "rename into place").
        op: &'static str,
        /// The file, directory or device it was done to.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The node's configuration file is unreadable or says something invalid.
    #[error("config {path}: {what}")]
    Config {
        /// The configuration file.
        path: PathBuf,
        /// What is wrong in it.
        what: String,
    },
    /// A file of the node's state is damaged: the state file (not state JSON, a newer format,
    /// a slot's record missing) or a boot script kept for a slot (other bytes than staged).
    #[error("state file {path}: {what}")]
    State {
        /// The state file, or the kept file.
        path: PathBuf,
        /// What is wrong in it.
        what: String,
    },
    /// The bootloader configuration could not be read or written.
    #[error("bootloader: {0}")]
    Boot(#[from] bootconfig::Error),
    /// The state file's slot lifecycle has no edge for a requested change.
    #[error("state file: {0}")]
    Transition(#[from] crate::state::TransitionError),
    /// A slot's rootfs does not match the dm-verity root hash, tree or FEC its signed manifest
    /// records (at staging: the slot stays invalid; at a scrub: blocks FEC cannot correct).
    #[error("dm-verity of slot {slot} ({version}): {what}")]
    Verity {
        /// The slot.
        slot: Slot,
        /// The release it holds.
        version: String,
        /// What was expected and what was found.
        what: String,
    },
    /// A release manifest could not be parsed or is invalid.
    #[error("manifest {location}: {source}")]
    Manifest {
        /// The URL or path of the manifest that failed.
        location: String,
        /// What is wrong with it.
        #[source]
        source: ManifestError,
    },
    /// A manifest's signature is missing, malformed or made by no trusted key.
    #[error("signature of {location}: {what}")]
    Signature {
        /// The URL or path of the signed manifest.
        location: String,
        /// Why the signature was refused.
        what: String,
    },
    #[error("release {version} has generation {found}, older than the installed generation {installed}; pass --allow-downgrade (k3os-ops upgrade) to install it anyway")]
    /// The release is older than the installed one and downgrades were not allowed.
    Downgrade {
        /// The release's version string, as its manifest names it.
        version: String,
        /// The release's generation (from its manifest).
        found: u64,
        /// The generation of the running (installed) release.
        installed: u64,
    },
    #[error("release {version} has generation {found}, older than generation {staged} already staged into slot {slot}; pass --allow-downgrade (k3os-ops upgrade) to replace it anyway")]
    /// The release is older than the one already staged in the other slot, and downgrades
    /// were not allowed.
    OlderThanStaged {
        /// The release's version string, as its manifest names it.
        version: String,
        /// The release's generation (from its manifest).
        found: u64,
        /// The generation already staged.
        staged: u64,
        /// The slot that holds the staged release.
        slot: Slot,
    },
    #[error("release {version} has the running generation {generation} but is a different build (manifest sha256 {found}, running {running}); a generation names one build: publish it as a new generation, or pass --allow-downgrade")]
    /// The release claims the running generation but its manifest is a different build.
    SameGenerationOtherBuild {
        /// The release's version string, as its manifest names it.
        version: String,
        /// The generation both the release and the running system carry.
        generation: u64,
        /// Hex sha256 of the release's manifest.
        found: String,
        /// Hex sha256 of the running release's manifest.
        running: String,
    },
    #[error("release {version} has the running generation {generation}, and this node cannot tell which build of it runs (its slot was written without a record of its manifest); a generation names one build: publish it as a new generation, record the running build with `k3os-ops bootloader install --running-manifest FILE`, or pass --allow-downgrade")]
    /// The release claims the running generation, and the running slot keeps no record of its
    /// manifest, so whether it is the same build cannot be told.
    SameGenerationUnknownBuild {
        /// The release's version string, as its manifest names it.
        version: String,
        /// The generation both the release and the running system carry.
        generation: u64,
    },
    #[error("{location}: the signed manifest is release {found}, but {asked} was asked for; nothing was written (the channel or a mirror serves the wrong release)")]
    /// The signed manifest names another version than the one that was asked for.
    VersionMismatch {
        /// The URL or path of the manifest.
        location: String,
        /// The version the caller asked for.
        asked: String,
        /// The version the signed manifest names.
        found: String,
    },
    #[error("{location} is not the manifest {from} names: expected {expected}, found {found}; nothing was written (a mirror or attacker serves other bytes)")]
    /// The manifest's bytes differ from the length and sha256 it was pinned to.
    ManifestPin {
        /// The URL or path of the manifest.
        location: String,
        /// Who gave the pin (e.g. a target of the channel's signed metadata).
        from: String,
        /// The pinned length and sha256, as text.
        expected: String,
        /// The length and sha256 of the bytes fetched, as text.
        found: String,
    },
    #[error("fetch {location}: {what}")]
    /// Fetching a file (over HTTP or from a local path) failed.
    Fetch {
        /// The URL or path being fetched.
        location: String,
        /// What went wrong.
        what: String,
        /// Worth retrying (dropped connection, 5xx), as opposed to 404 or a missing file.
        retryable: bool,
    },
    #[error("{artifact} ({location}): sha256 mismatch: expected {expected}, found {found}")]
    /// An artifact's bytes do not hash to the sha256 its manifest gives.
    Checksum {
        /// Which artifact of the release.
        artifact: Part,
        /// The URL or path it was read from.
        location: String,
        /// Hex sha256 from the manifest.
        expected: String,
        /// Hex sha256 of the bytes read.
        found: String,
    },
    #[error("{artifact} ({location}): size mismatch: expected {expected} bytes, got {found}")]
    /// An artifact's length differs from the size its manifest gives.
    Size {
        /// Which artifact of the release.
        artifact: Part,
        /// The URL or path it was read from.
        location: String,
        /// Size in bytes from the manifest.
        expected: u64,
        /// Bytes actually read.
        found: u64,
    },
    #[error("{artifact} ({location}): chunk {chunk} at byte {offset}: sha256 mismatch: expected {expected} (signed chunk index), found {found}; refused before writing it")]
    /// One chunk of an artifact does not hash to the digest its signed chunk index gives.
    ChunkDigest {
        /// Which artifact of the release.
        artifact: Part,
        /// The URL or path the chunk was read from.
        location: String,
        /// Index of the chunk in the chunk index (0-based).
        chunk: usize,
        /// Byte offset of the chunk in the artifact.
        offset: u64,
        /// Hex sha256 from the chunk index.
        expected: String,
        /// Hex sha256 of the bytes read.
        found: String,
    },
    #[error("{artifact}: chunk index {location}: {what}")]
    /// An artifact's chunk index is missing, malformed or disagrees with the manifest.
    ChunkIndex {
        /// The artifact the index describes.
        artifact: Part,
        /// The URL or path of the chunk index.
        location: String,
        /// What is wrong with it.
        what: String,
    },
    #[error("not enough space for the {artifact}: it needs {} but {target} has room for only {}", Size(*.needed), Size(*.available))]
    /// The target slot's partition or file is too small for an artifact.
    NoSpace {
        /// The artifact that does not fit.
        artifact: Part,
        /// The slot and partition or file it was to be written to, for the operator.
        target: String,
        /// The artifact's size in bytes.
        needed: u64,
        /// The room in the target, in bytes.
        available: u64,
    },
    /// The payload store cannot hold a release's payloads beside the running release's.
    #[error("release {version}: its payloads need {} ({needed} bytes) more in the payload store, which holds {} ({held} bytes) of what the running and the new release keep; together over the store's budget of {} ({budget} bytes, payload_store_max_bytes in the node's config)", Size(*.needed), Size(*.held), Size(*.budget))]
    PayloadBudget {
        /// The release refused.
        version: String,
        /// Bytes of its payloads the store does not hold yet.
        needed: u64,
        /// Bytes of the running and the new release's payloads the store holds.
        held: u64,
        /// The store's budget in bytes.
        budget: u64,
    },
    /// Not a failure: the attempt stopped where it was told to (a byte budget, the end of a
    /// download schedule), keeping everything it wrote; a later run resumes there.
    #[error("{why}: {} fetched, {} left to fetch; what was written is kept and a later run resumes there", Size(*.fetched), Size(*.left))]
    Stopped {
        /// The limit that stopped it.
        why: Stop,
        /// Network bytes this attempt read.
        fetched: u64,
        /// Bytes of the release still to fetch (the plan's, less what this attempt fetched).
        left: u64,
    },
    /// The slots' partitions or files could not be found or read (text names the disk and
    /// what is missing).
    #[error("slot layout: {0}")]
    Layout(String),
    /// The rootfs written to a slot does not read back as a valid squashfs.
    #[error("rootfs of slot {slot} is not a valid squashfs: {what}")]
    BadImage {
        /// The slot that was written.
        slot: Slot,
        /// What the squashfs check found wrong.
        what: String,
    },
    /// The kernel command line has no valid `k3os.slot=` parameter (text names the file).
    #[error("cannot tell which slot is booted: {0}")]
    UnknownBootedSlot(String),
    /// A write or invalidation was aimed at the slot that is running.
    #[error("slot {slot} is the booted slot; it is never written or invalidated while running")]
    SlotBusy {
        /// The booted slot.
        slot: Slot,
    },
    /// A slot is in a state the requested operation does not start from.
    #[error("slot {slot} is {state}, expected {expected}")]
    SlotState {
        /// The slot the operation was aimed at.
        slot: Slot,
        /// The state it is in.
        state: SlotState,
        /// The states the operation accepts, as text ("staged or good").
        expected: &'static str,
    },
    /// The slot holds a release the node's last verified channel metadata withdraws: it is
    /// never activated ([`crate::trust::withdrawn`]).
    #[error("slot {slot} holds {} (generation {generation}), and {by}: a withdrawn release is never activated, whatever the flags; the publisher's way back is a newer release", .version.escape_debug())]
    Withdrawn {
        /// The slot that was to be activated.
        slot: Slot,
        /// The version its record names.
        version: String,
        /// Its generation.
        generation: u64,
        /// Which channel withdrew it, and when.
        by: crate::trust::withdrawn::WithdrawnBy,
    },
    /// The slot's boot script refuses to boot it, so it is not activated.
    #[error("slot {slot} cannot be activated: {source}")]
    BootScript {
        /// The slot that was to be activated.
        slot: Slot,
        /// Why its boot script was refused.
        #[source]
        source: crate::boot::bootscript::ScriptRefusal,
    },
    /// The caller asked for something contradictory or impossible (text says what).
    #[error("invalid request: {0}")]
    Usage(String),
    /// The node's report key file cannot be used (see `crate::report`).
    #[error("node key {}: {what}", path.display())]
    NodeKey {
        /// The key file.
        path: std::path::PathBuf,
        /// What is wrong, with what was found.
        what: String,
    },
}

/// A result whose error defaults to libupgrade's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<crate::state::store::StoreError> for Error {
    /// The state file's errors with the messages they always had: an I/O error as
    /// [`Error::Io`], a damaged file as [`Error::State`], a failed replacement as
    /// [`Error::Boot`].
    fn from(e: crate::state::store::StoreError) -> Error {
        use crate::state::store::StoreError;
        match e {
            StoreError::Io { op, path, source } => Error::Io { op, path, source },
            StoreError::Damaged { path, what } => Error::State { path, what },
            StoreError::Write(e) => Error::Boot(e),
        }
    }
}

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
            artifact: crate::manifest::Artifact::Rootfs.into(),
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
    Budget {
        /// The budget, in network bytes.
        budget: u64,
    },
    /// The download schedule's last window closed then (`--stage-until`, `--stage-window`).
    Schedule {
        /// When the last window closed (UTC).
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
