//! Squashfs patches: the target image described by the base image's blocks.

use std::path::Path;

use super::Writer;
use crate::patch::PatchError;

/// mksquashfs' zstd level when the image carries no compressor options.
const DEFAULT_LEVEL: i32 = 15;

/// What the builder learnt of the target before writing.
pub struct Plan {
    /// zstd level of the target's blocks.
    pub level: i32,
    /// The target's block size.
    pub block_size: u32,
}

impl Plan {
    /// Read the target's superblock.
    pub fn new(_b: &[u8], _base: &Path, t: &[u8], target: &Path) -> Result<Self, PatchError> {
        let sb: &[u8; 96] =
            t.get(..96)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| PatchError::Squashfs {
                    path: target.to_path_buf(),
                    what: format!("{} bytes, shorter than a superblock", t.len()),
                })?;
        let sb = crate::sqcheck::superblock(sb).map_err(|what| PatchError::Squashfs {
            path: target.to_path_buf(),
            what,
        })?;
        Ok(Plan {
            level: DEFAULT_LEVEL,
            block_size: sb.block_size,
        })
    }

    /// Write the ops.
    pub fn write(self, b: &[u8], t: &[u8], w: &mut Writer<'_>) -> Result<(), PatchError> {
        super::plain::delta_ops(b, t, 0, w)
    }
}
