//! The manifest's `verity` field: the dm-verity parameters of the release's rootfs, signed with
//! the rest of the manifest (issue 34 item 5).
//!
//! Nothing of the tree or its FEC data travels: a node computes both from the rootfs it wrote
//! ([`crate::verity`] says why) and refuses the slot unless they hash to what is recorded here.
//! Offsets are relative to the rootfs artifact's first byte as it sits in a GPT slot: the
//! squashfs (padded to whole 4 KiB blocks), the tree right after it, then the FEC area (the
//! kernel's FEC on one device needs data and tree contiguous). A directory-layout slot keeps
//! tree and FEC in a file beside `rootfs.squashfs` with the same order.
//!
//! Optional and absent from every manifest written before it: format stays 1; an older node
//! ignores the field and stages and boots the release as it always did.

use serde::{Deserialize, Serialize};

use super::{hex64, ManifestError};
use crate::verity::{Geometry, BLOCK_SIZE};

/// The only tree hash this build writes and reads.
pub const VERITY_HASH: &str = "sha256";
/// The dm-verity hash format written and read (1: salt first, the kernel's "normal" format).
pub const VERITY_HASH_TYPE: u32 = 1;
/// Largest rootfs a `verity` field may cover (1 PiB): keeps every offset and size far from
/// overflowing a u64, whatever a damaged or hostile manifest says.
pub const MAX_ROOTFS: u64 = 1 << 50;
/// Longest salt accepted, in bytes (veritysetup's own limit is 256).
pub const MAX_SALT: usize = 64;

/// dm-verity parameters of a release's rootfs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verity {
    /// dm-verity hash format; [`VERITY_HASH_TYPE`].
    pub hash_type: u32,
    /// Hash algorithm of the tree; [`VERITY_HASH`].
    pub hash: String,
    /// Data block size in bytes (4096).
    pub data_block_size: u64,
    /// Hash block size in bytes (4096).
    pub hash_block_size: u64,
    /// Data blocks covered: the rootfs size / 4096.
    pub data_blocks: u64,
    /// Lower-case hex salt (1..=[`MAX_SALT`] bytes).
    pub salt: String,
    /// Lower-case hex root hash of the tree.
    pub root_hash: String,
    /// Byte offset of the tree from the rootfs's start (= the rootfs size).
    pub hash_offset: u64,
    /// Bytes of the tree.
    pub hash_size: u64,
    /// Lower-case hex sha256 of the tree's bytes.
    pub hash_sha256: String,
    /// Reed-Solomon parity bytes per 255-byte codeword (2..=24).
    pub fec_roots: u32,
    /// Byte offset of the FEC area from the rootfs's start (= `hash_offset + hash_size`).
    pub fec_offset: u64,
    /// Bytes of the FEC area.
    pub fec_size: u64,
    /// Lower-case hex sha256 of the FEC area.
    pub fec_sha256: String,
}

fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    let ok = s.len() % 2 == 0
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    ok.then(|| hex::decode(s).ok()).flatten()
}

impl Verity {
    /// The device's geometry (checked when the manifest is parsed: a parsed manifest has one).
    pub fn geometry(&self) -> Geometry {
        Geometry::new(self.data_blocks, self.fec_roots)
            .expect("checked when the manifest was parsed")
    }

    /// The salt's bytes.
    pub fn salt_bytes(&self) -> Vec<u8> {
        hex_bytes(&self.salt).expect("checked when the manifest was parsed")
    }

    /// The root hash's bytes.
    pub fn root(&self) -> [u8; 32] {
        let mut r = [0u8; 32];
        r.copy_from_slice(&hex::decode(&self.root_hash).expect("checked when parsed"));
        r
    }

    /// Bytes the rootfs, tree and FEC take together in a slot.
    pub fn slot_bytes(&self) -> u64 {
        self.fec_offset + self.fec_size
    }

    /// Every value consistent with the others and with a rootfs of `rootfs_size` bytes: a
    /// node checks what it computes against these, so none of them may be left to trust.
    pub(super) fn check(&self, rootfs_size: u64) -> Result<(), ManifestError> {
        let field = |f: &str, what: String| ManifestError::Field {
            field: format!("verity.{f}"),
            what,
        };
        if self.hash_type != VERITY_HASH_TYPE || self.hash != VERITY_HASH {
            return Err(field(
                "hash",
                format!(
                    "format {} with '{}': this build reads format {VERITY_HASH_TYPE} with {VERITY_HASH}",
                    self.hash_type,
                    self.hash.escape_debug()
                ),
            ));
        }
        for (f, v) in [
            ("data_block_size", self.data_block_size),
            ("hash_block_size", self.hash_block_size),
        ] {
            if v != BLOCK_SIZE {
                return Err(field(f, format!("{v}: this build reads {BLOCK_SIZE}")));
            }
        }
        if rootfs_size > MAX_ROOTFS {
            return Err(field(
                "data_blocks",
                format!(
                    "a rootfs of {rootfs_size} bytes is over the {MAX_ROOTFS} this build covers"
                ),
            ));
        }
        if rootfs_size % BLOCK_SIZE != 0 || self.data_blocks != rootfs_size / BLOCK_SIZE {
            return Err(field(
                "data_blocks",
                format!(
                    "{} blocks do not cover the rootfs's {rootfs_size} bytes exactly (4096-byte blocks)",
                    self.data_blocks
                ),
            ));
        }
        let g = Geometry::new(self.data_blocks, self.fec_roots)
            .map_err(|e| field("fec_roots", e.to_string()))?;
        let expect = [
            ("hash_offset", self.hash_offset, rootfs_size),
            ("hash_size", self.hash_size, g.hash_size()),
            ("fec_offset", self.fec_offset, rootfs_size + g.hash_size()),
            ("fec_size", self.fec_size, g.fec_size()),
        ];
        for (f, found, expected) in expect {
            if found != expected {
                return Err(field(
                    f,
                    format!("{found}, but the geometry gives {expected}"),
                ));
            }
        }
        if !hex_bytes(&self.salt).is_some_and(|s| (1..=MAX_SALT).contains(&s.len())) {
            return Err(field(
                "salt",
                format!(
                    "'{}' is not 1-{MAX_SALT} bytes of lower-case hex",
                    self.salt.escape_debug()
                ),
            ));
        }
        for (f, v) in [
            ("root_hash", &self.root_hash),
            ("hash_sha256", &self.hash_sha256),
            ("fec_sha256", &self.fec_sha256),
        ] {
            if !hex64(v) {
                return Err(field(
                    f,
                    format!("'{}' is not 64 lower-case hex digits", v.escape_debug()),
                ));
            }
        }
        Ok(())
    }
}
