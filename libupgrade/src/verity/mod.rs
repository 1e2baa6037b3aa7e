//! dm-verity for a slot's rootfs, computed by the node itself: the hash tree, its forward error
//! correction (FEC) data, the scrub that re-reads a slot against them and the repair of what
//! FEC can correct.
//!
//! # Why the node computes the tree and FEC instead of fetching them
//! Both are a pure function of the rootfs bytes, the salt and the parameters the signed
//! manifest records (`manifest::Verity`). Computing them after the rootfs is written costs
//! the node one extra read of the slot and some CPU (measured on this project's 2-core build
//! host: see the README's dm-verity section) and **0 bytes** on the link, where fetching them
//! would add about 1.6 % of the rootfs (tree 1/128 of the data, FEC `roots`/(255-`roots`) of
//! data + tree) to every release, chunked delta or not, and a new kind of file to the stage
//! engine. The node checks what it computed against the signed root hash and the signed
//! sha256 of the tree and of the FEC area before the slot is recorded staged, so a wrong
//! computation can never pass as the publisher's.
//!
//! # Byte compatibility
//! Everything here is written to be byte-identical with `veritysetup format --no-superblock`
//! (cryptsetup 2.6, hash format 1, sha256, 4 KiB blocks) with `--fec-device` on the same
//! device right after the tree: the tests compare both with `veritysetup` itself. The tree is
//! laid out top level first, each level's blocks holding 128 digests `sha256(salt ‖ block)`
//! zero padded; FEC is Reed-Solomon RS(255, 255-roots) over GF(2^8) (polynomial 0x11d, first
//! root 0, primitive element 1) interleaved as the kernel's `dm-verity-fec` reads it: codeword
//! `c` of round `r` takes byte `i` of blocks `r`, `r + rounds`, `r + 2·rounds`, …. No crate
//! offers that layout (the `reed-solomon*` crates implement other codes or no erasure
//! decoding with this generator); the code is short and pinned by those tests.
//!
//! The module is pure over a [`BlockDevice`]: the stage check and `slot verify` give it a
//! slot's partition or files.

mod device;
mod fec;
mod geometry;
mod rs;
mod scrub;
mod tree;

pub use device::FileDevice;
pub use fec::encode as fec_encode;
pub use geometry::{Geometry, GeometryError, BLOCK_SIZE, DIGEST_SIZE};
pub use scrub::{scrub, Scrub, ScrubOutcome};
pub use tree::{build_tree, Tree};

/// Fixed-size block access to the FEC input (data blocks, then hash blocks) and the FEC area.
pub trait BlockDevice {
    /// Read data (`i < data_blocks`) or hash block `i - data_blocks` into `buf`.
    fn read_block(&self, i: u64, buf: &mut [u8]) -> std::io::Result<()>;
    /// Write data or hash block `i` (same numbering as [`BlockDevice::read_block`]).
    fn write_block(&self, i: u64, buf: &[u8]) -> std::io::Result<()>;
    /// Read `buf.len()` bytes of the FEC area at `pos`.
    fn read_fec(&self, pos: u64, buf: &mut [u8]) -> std::io::Result<()>;
    /// Write `buf` into the FEC area at `pos`.
    fn write_fec(&self, pos: u64, buf: &[u8]) -> std::io::Result<()>;
}

#[cfg(test)]
mod tests;
