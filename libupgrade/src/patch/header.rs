//! The patch header: what a patch turns into what, and with which compressor.
//!
//! Layout (little-endian): magic `K3PATCH\0` (8), format version u16, kind u8, block
//! compression level i32, squashfs block size u32, base sha256 (32), base size u64, target
//! sha256 (32), target size u64, compressor identity (u16 length ≤ 128, UTF-8).

use std::io::{Read, Write};

use byteorder::{ByteOrder, LittleEndian as LE};

use super::PatchError;

/// First bytes of every patch.
pub const MAGIC: &[u8; 8] = b"K3PATCH\0";
/// The patch format version this build writes and reads (it refuses any other by number).
pub const FORMAT_VERSION: u16 = 1;
/// Longest compressor identity a header may carry.
const MAX_IDENTITY: usize = 128;

/// What a patch describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// The whole target as zstd patch-from frames of windows of the base (kernel, initrd,
    /// anything).
    Plain,
    /// A squashfs rootfs in terms of the base image's uncompressed file data, recompressed on
    /// the node.
    Squashfs,
}

impl PatchKind {
    fn code(self) -> u8 {
        match self {
            PatchKind::Plain => 1,
            PatchKind::Squashfs => 2,
        }
    }
}

/// The header of a patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchHeader {
    /// What the patch describes.
    pub kind: PatchKind,
    /// sha256 of the base artifact the patch applies to.
    pub base_sha256: [u8; 32],
    /// Size of the base artifact.
    pub base_size: u64,
    /// sha256 of the target artifact the patch produces.
    pub target_sha256: [u8; 32],
    /// Size of the target artifact.
    pub target_size: u64,
    /// The compressor that must recompress the target's blocks
    /// (`zstd <ZSTD_versionNumber> level <L>`), `none` for [`PatchKind::Plain`].
    pub compressor: String,
    /// zstd level of the target's blocks (0 for [`PatchKind::Plain`]).
    pub level: i32,
    /// The target's squashfs block size (0 for [`PatchKind::Plain`]).
    pub block_size: u32,
}

impl PatchHeader {
    /// Write the header.
    pub fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut b = Vec::with_capacity(128);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        b.push(self.kind.code());
        b.extend_from_slice(&self.level.to_le_bytes());
        b.extend_from_slice(&self.block_size.to_le_bytes());
        b.extend_from_slice(&self.base_sha256);
        b.extend_from_slice(&self.base_size.to_le_bytes());
        b.extend_from_slice(&self.target_sha256);
        b.extend_from_slice(&self.target_size.to_le_bytes());
        let id = self.compressor.as_bytes();
        let id = &id[..id.len().min(MAX_IDENTITY)];
        b.extend_from_slice(&(id.len() as u16).to_le_bytes());
        b.extend_from_slice(id);
        out.write_all(&b)
    }

    /// Bytes [`PatchHeader::write`] writes.
    pub fn encoded_len(&self) -> u64 {
        8 + 2 + 1 + 4 + 4 + 32 + 8 + 32 + 8 + 2 + self.compressor.len().min(MAX_IDENTITY) as u64
    }
}

/// Read and check a patch header (magic, version, kind, field ranges).
pub fn read_header(r: &mut impl Read) -> Result<PatchHeader, PatchError> {
    let mut b = [0u8; 99];
    r.read_exact(&mut b)
        .map_err(|e| PatchError::io("read the patch header (99 bytes)", e))?;
    if &b[0..8] != MAGIC {
        return Err(PatchError::Header(format!(
            "no patch magic: expected {:02x?}, found {:02x?}",
            MAGIC,
            &b[0..8]
        )));
    }
    let version = LE::read_u16(&b[8..]);
    if version != FORMAT_VERSION {
        return Err(PatchError::Header(format!(
            "format version {version}, this build reads version {FORMAT_VERSION}"
        )));
    }
    let kind = match b[10] {
        1 => PatchKind::Plain,
        2 => PatchKind::Squashfs,
        k => {
            return Err(PatchError::Header(format!(
                "unknown kind {k} (expected 1 or 2)"
            )))
        }
    };
    let level = LE::read_i32(&b[11..]);
    let block_size = LE::read_u32(&b[15..]);
    let mut base_sha256 = [0u8; 32];
    base_sha256.copy_from_slice(&b[19..51]);
    let base_size = LE::read_u64(&b[51..]);
    let mut target_sha256 = [0u8; 32];
    target_sha256.copy_from_slice(&b[59..91]);
    let target_size = LE::read_u64(&b[91..]);
    let mut l = [0u8; 2];
    r.read_exact(&mut l)
        .map_err(|e| PatchError::io("read the patch header's compressor length", e))?;
    let len = usize::from(LE::read_u16(&l));
    if len > MAX_IDENTITY {
        return Err(PatchError::Header(format!(
            "compressor identity of {len} bytes, at most {MAX_IDENTITY}"
        )));
    }
    let mut id = vec![0u8; len];
    r.read_exact(&mut id)
        .map_err(|e| PatchError::io("read the patch header's compressor identity", e))?;
    let compressor = String::from_utf8_lossy(&id).into_owned();
    if kind == PatchKind::Squashfs
        && (!(4096..=1 << 20).contains(&block_size) || !block_size.is_power_of_two())
    {
        return Err(PatchError::Header(format!(
            "squashfs block size {block_size}, expected a power of two in 4 KiB..1 MiB"
        )));
    }
    Ok(PatchHeader {
        kind,
        base_sha256,
        base_size,
        target_sha256,
        target_size,
        compressor,
        level,
        block_size,
    })
}

/// Whether this build can apply a patch with header `h`: a plain patch always, a squashfs
/// patch when the header's compressor identity is this build's at the header's level.
pub fn can_apply(h: &PatchHeader) -> Result<(), PatchError> {
    if h.kind == PatchKind::Plain {
        return Ok(());
    }
    let have = super::codec::identity(h.level);
    if h.compressor != have {
        return Err(PatchError::Compressor {
            needed: h.compressor.clone(),
            have,
        });
    }
    Ok(())
}
