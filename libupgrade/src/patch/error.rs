//! Every way building, reading or applying a patch can fail, each naming the op, the offsets
//! and what was expected versus what was found.

use std::path::PathBuf;

/// Errors of [`crate::patch`]. Text that came from a patch (the compressor identity) is
/// escaped with `{:?}`.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// Reading the patch, reading the base or writing to the sink failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done ("read the patch header", "read base at 4096").
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A file the builder reads could not be opened or read.
    #[error("{op} {path}: {source}")]
    File {
        /// What was being done ("open", "read").
        op: &'static str,
        /// The base or target file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The patch's header is not one this build reads.
    #[error("patch header: {0}")]
    Header(String),
    /// An op of the patch is malformed: a length past its cap, a range past the base, a frame
    /// that does not decode to the length it announces.
    #[error("patch op {op} (at patch byte {at}): {what}")]
    Op {
        /// The op's index, counted from 0.
        op: u64,
        /// The op's offset in the patch, header included.
        at: u64,
        /// What is wrong, with expected and found values.
        what: String,
    },
    /// The base given to [`crate::patch::apply`] is not the one the patch was made for.
    #[error("patch is for a base of {expected_size} bytes with sha256 {expected_sha256}, the base has {found_size} bytes with sha256 {found_sha256}")]
    WrongBase {
        /// Size the header names.
        expected_size: u64,
        /// sha256 the header names, hex.
        expected_sha256: String,
        /// Size of the base given.
        found_size: u64,
        /// sha256 of the base given, hex (empty when the size already differed).
        found_sha256: String,
    },
    /// The patch was made with a compressor this build does not reproduce byte for byte.
    #[error("patch needs compressor {needed:?}, this build has {have:?}: stage by chunks instead")]
    Compressor {
        /// The identity the header names (escaped in the message).
        needed: String,
        /// This build's identity for the same level.
        have: String,
    },
    /// A block that the patch says recompresses to the target's bytes did not.
    #[error(
        "patch op {op}, block {block}: recompressed to {found} bytes, the target stores {expected}"
    )]
    NotReproduced {
        /// The op's index.
        op: u64,
        /// The block's index inside the op.
        block: usize,
        /// The stored length the patch names.
        expected: u32,
        /// What this build's compressor produced.
        found: usize,
    },
    /// The bytes emitted are not the target the header names.
    #[error("patch output: expected {expected_size} bytes with sha256 {expected_sha256}, emitted {found_size} bytes with sha256 {found_sha256}")]
    WrongOutput {
        /// Target size from the header.
        expected_size: u64,
        /// Target sha256 from the header, hex.
        expected_sha256: String,
        /// Bytes emitted.
        found_size: u64,
        /// sha256 of the bytes emitted, hex.
        found_sha256: String,
    },
    /// zstd failed on the builder's side (it cannot fail on valid input: a bug or no memory).
    #[error("zstd {what}: {code}")]
    Zstd {
        /// What was being compressed.
        what: String,
        /// zstd's error name.
        code: &'static str,
    },
    /// A squashfs image the builder reads is malformed or uses what the builder does not
    /// parse.
    #[error("squashfs {path}: {what}")]
    Squashfs {
        /// The image.
        path: PathBuf,
        /// What is wrong, with offsets.
        what: String,
    },
}

impl PatchError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        PatchError::Io {
            what: what.into(),
            source,
        }
    }
}
