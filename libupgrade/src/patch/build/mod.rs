//! The builder (the publisher's side): reads base and target whole, writes the header and the
//! ops. Memory: both artifacts plus one op's buffers and zstd's level-19 state.

mod plain;
mod squashfs;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::codec::identity;
use super::header::{PatchHeader, PatchKind};
use super::ops::Op;
use super::PatchError;

/// What [`build`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildStats {
    /// Bytes of the patch, header included.
    pub bytes: u64,
    /// Wall time of the build.
    pub time: Duration,
    /// Copy ops and the bytes they emit.
    pub copy_ops: u64,
    /// Bytes the Copy ops emit.
    pub copy_bytes: u64,
    /// Literal ops.
    pub literal_ops: u64,
    /// Bytes the Literal ops emit.
    pub literal_bytes: u64,
    /// Delta ops (patch-from of a base range).
    pub delta_ops: u64,
    /// Data ops (squashfs blocks rebuilt from decompressed base blocks).
    pub data_ops: u64,
    /// Target blocks the Data ops recompress on the node.
    pub blocks_recompressed: u64,
    /// Target blocks this build's compressor did not reproduce, carried verbatim.
    pub blocks_not_reproducible: u64,
    /// The compressor identity written in the header.
    pub compressor: String,
}

/// Writes ops and counts them.
pub struct Writer<'o> {
    out: &'o mut dyn Write,
    stats: BuildStats,
    pending_copy: Option<(u64, u64)>,
}

impl Writer<'_> {
    fn put(&mut self, op: &Op) -> Result<(), PatchError> {
        let n = op
            .write(&mut self.out)
            .map_err(|e| PatchError::io("write the patch", e))?;
        self.stats.bytes += n;
        Ok(())
    }

    fn flush_copy(&mut self) -> Result<(), PatchError> {
        if let Some((base_off, len)) = self.pending_copy.take() {
            self.put(&Op::Copy { base_off, len })?;
            self.stats.copy_ops += 1;
        }
        Ok(())
    }

    /// Write `op` (Copy ops of adjacent base ranges are merged into one).
    pub fn op(&mut self, op: &Op) -> Result<(), PatchError> {
        if let Op::Copy { base_off, len } = *op {
            if len == 0 {
                return Ok(());
            }
            self.stats.copy_bytes += len;
            match &mut self.pending_copy {
                Some((o, l)) if *o + *l == base_off => *l += len,
                _ => {
                    self.flush_copy()?;
                    self.pending_copy = Some((base_off, len));
                }
            }
            return Ok(());
        }
        self.flush_copy()?;
        match op {
            Op::Literal { len, .. } => {
                self.stats.literal_ops += 1;
                self.stats.literal_bytes += u64::from(*len);
            }
            Op::Delta { .. } => self.stats.delta_ops += 1,
            Op::Data { .. } => self.stats.data_ops += 1,
            Op::Copy { .. } | Op::End => {}
        }
        self.put(op)
    }

    /// Write raw bytes after the last op (a Data op's verbatim blocks).
    pub fn raw(&mut self, b: &[u8]) -> Result<(), PatchError> {
        self.out
            .write_all(b)
            .map_err(|e| PatchError::io("write the patch", e))?;
        self.stats.bytes += b.len() as u64;
        Ok(())
    }
}

fn read(path: &Path) -> Result<Vec<u8>, PatchError> {
    std::fs::read(path).map_err(|source| PatchError::File {
        op: "read",
        path: path.to_path_buf(),
        source,
    })
}

/// Build a patch of `kind` that turns `base` into `target`, written to `out`.
///
/// A squashfs patch is checked block by block while it is built: every target block that
/// the node will recompress was recompressed here and came out identical, the others are
/// carried verbatim, so the patch reproduces the target wherever the compressor identity in
/// its header is the node's.
pub fn build(
    kind: PatchKind,
    base: &Path,
    target: &Path,
    out: &mut impl Write,
) -> Result<BuildStats, PatchError> {
    let started = Instant::now();
    let b = read(base)?;
    let t = read(target)?;
    let sha = |d: &[u8]| -> [u8; 32] { Sha256::digest(d).into() };
    let plan = match kind {
        PatchKind::Plain => None,
        PatchKind::Squashfs => Some(squashfs::Plan::new(&b, base, &t, target)?),
    };
    let (level, block_size, compressor) = match &plan {
        None => (0, 0, "none".to_string()),
        Some(p) => (p.level, p.block_size, identity(p.level)),
    };
    let header = PatchHeader {
        kind,
        base_sha256: sha(&b),
        base_size: b.len() as u64,
        target_sha256: sha(&t),
        target_size: t.len() as u64,
        compressor: compressor.clone(),
        level,
        block_size,
    };
    header
        .write(out)
        .map_err(|e| PatchError::io("write the patch header", e))?;
    let mut w = Writer {
        out,
        stats: BuildStats {
            bytes: header.encoded_len(),
            compressor,
            ..BuildStats::default()
        },
        pending_copy: None,
    };
    match plan {
        None => plain::delta_ops(&b, &t, 0, &mut w)?,
        Some(p) => p.write(&b, &t, &mut w)?,
    }
    w.op(&Op::End)?;
    w.out
        .flush()
        .map_err(|e| PatchError::io("flush the patch", e))?;
    let mut stats = w.stats;
    stats.time = started.elapsed();
    Ok(stats)
}
