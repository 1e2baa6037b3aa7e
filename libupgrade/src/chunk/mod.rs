//! Chunked releases: content-defined chunk indexes, reuse planning and chunk-verified transfer.
//!
//! This module owns everything about chunks; the stage pipeline only wires it to a slot.
//! - `index`: the per-artifact chunk index (`<artifact>.chunks`) that `release create` writes
//!   and the signed manifest covers by sha256: content-defined chunks (FastCDC 2020 from the
//!   `fastcdc` crate: pure Rust, maintained, streaming with a bounded buffer; no reason to
//!   hand-write a gear hash), each with its length and sha256 (SHA-NI makes sha256 as fast as
//!   blake3 on the nodes that matter, and one digest keeps the format and code single).
//! - [`local`]: chunking the running slot's files with the same parameters, to find the chunks a
//!   node already has.
//! - [`plan`]: pure decisions: which chunks are already in the target, which are copied from a
//!   local file, which are fetched, how fetched neighbours coalesce into HTTP `Range` requests,
//!   and when reuse is too low so one stream of the whole file is cheaper.
//! - [`apply`]: executes a plan in file order into a [`apply::ChunkTarget`], verifying every
//!   chunk's digest before it is written and the whole file's sha256 at the end.
//!
//! How fast and when bytes may cross the link (the rate limit, the budget, the download
//! schedule) is the link's business (`crate::net`); chunks use it, it knows nothing of chunks.

pub mod apply;
pub(crate) mod index;
pub mod local;
pub mod plan;

pub use index::{ChunkEntry, ChunkIndex, ChunkParams, IndexError};

/// A chunk digest (sha256).
pub type Digest = [u8; 32];

/// sha256 of `data`.
pub fn digest(data: &[u8]) -> Digest {
    use sha2::Digest as _;
    sha2::Sha256::digest(data).into()
}
