//! Squashfs patches: the target image described by the base image's blocks.
//!
//! The target is walked in image order. A file's data whose stored bytes are somewhere in the
//! base (unchanged, also moved or renamed) becomes a Copy; a changed or new file becomes Data
//! ops: its uncompressed bytes as a zstd patch-from of the old file's uncompressed bytes (the
//! base file of the same path, else of the same path with digits ignored, so that
//! `lib/modules/6.1.0-57/…` finds `6.1.0-58`), recompressed on the node block by block. Every
//! such block was recompressed here and compared; one that does not come out identical is
//! carried verbatim. Everything between file data (superblock, metadata tables, fragments,
//! padding) is a Copy where the base has the same bytes at the same offset, else a Literal.
//! An image this builder does not parse, or not zstd, becomes Delta ops of the whole image.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::Writer;
use crate::patch::codec::{compress_from, BlockCompressor, BlockDecompressor};
use crate::patch::ops::{BlockRef, Op, TargetBlock, MAX_SPAN, SIZE_MASK, STORED, VERBATIM};
use crate::patch::squashfs::{self, FileData, Image, DEFAULT_LEVEL, ZSTD};
use crate::patch::PatchError;

/// What the builder learnt of the two images before writing.
pub struct Plan {
    /// zstd level of the target's blocks.
    pub level: i32,
    /// The target's block size.
    pub block_size: u32,
    images: Option<(Image, Image)>,
}

impl Plan {
    /// Parse both images; when either does not parse (or is not zstd) the patch is Delta ops.
    pub fn new(b: &[u8], base: &Path, t: &[u8], target: &Path) -> Result<Self, PatchError> {
        let ti = squashfs::parse(t).map_err(|what| PatchError::Squashfs {
            path: target.to_path_buf(),
            what,
        })?;
        let bi = squashfs::parse(b).map_err(|what| PatchError::Squashfs {
            path: base.to_path_buf(),
            what,
        });
        let usable = ti.compressor == ZSTD;
        let (level, block_size) = (ti.level, ti.block_size);
        let images = match bi {
            Ok(bi) if usable && bi.compressor == ZSTD => Some((bi, ti)),
            _ => None,
        };
        Ok(Plan {
            level: if usable { level } else { DEFAULT_LEVEL },
            block_size,
            images,
        })
    }

    /// Write the ops.
    pub fn write(self, b: &[u8], t: &[u8], w: &mut Writer<'_>) -> Result<(), PatchError> {
        let Some((bi, ti)) = self.images else {
            return super::plain::delta_ops(b, t, 0, w);
        };
        let mut g = Gen {
            b,
            t,
            bi: &bi,
            block_size: self.block_size,
            comp: BlockCompressor::new(self.level),
            dec: BlockDecompressor::new(),
            by_stored: HashMap::new(),
            by_path: HashMap::new(),
            by_shape: HashMap::new(),
        };
        g.index();
        let mut regions: Vec<&FileData> = ti.files.iter().collect();
        regions.sort_by_key(|f| f.start);
        let mut cursor = 0u64;
        for f in regions {
            let end = f.start + f.stored_len();
            if f.start < cursor || end > t.len() as u64 {
                continue; // a duplicate (same blocks) or a malformed entry: the gaps cover it
            }
            g.gap(cursor..f.start, w)?;
            g.file(f, w)?;
            cursor = end;
        }
        g.gap(cursor..t.len() as u64, w)
    }
}

/// A path with every run of digits replaced by `#`.
fn shape(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut in_digits = false;
    for c in path.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            out.push(c);
            in_digits = false;
        }
    }
    out
}

struct Gen<'a> {
    b: &'a [u8],
    t: &'a [u8],
    bi: &'a Image,
    block_size: u32,
    comp: BlockCompressor,
    dec: BlockDecompressor,
    by_stored: HashMap<[u8; 32], u64>,
    by_path: HashMap<&'a str, usize>,
    by_shape: HashMap<String, usize>,
}

fn range(r: Range<u64>) -> Range<usize> {
    r.start as usize..r.end as usize
}

impl<'a> Gen<'a> {
    fn index(&mut self) {
        for (i, f) in self.bi.files.iter().enumerate() {
            let end = f.start + f.stored_len();
            if end <= self.b.len() as u64 {
                let h: [u8; 32] = Sha256::digest(&self.b[range(f.start..end)]).into();
                self.by_stored.entry(h).or_insert(f.start);
            }
            self.by_path.insert(&f.path, i);
            self.by_shape.entry(shape(&f.path)).or_insert(i);
        }
    }

    /// Bytes between file data: Copy where the base has them at the same offset, else Literal.
    fn gap(&mut self, r: Range<u64>, w: &mut Writer<'_>) -> Result<(), PatchError> {
        let bytes = &self.t[range(r.clone())];
        if bytes.is_empty() {
            return Ok(());
        }
        if self.b.get(range(r.clone())) == Some(bytes) {
            return w.op(&Op::Copy {
                base_off: r.start,
                len: r.end - r.start,
            });
        }
        for (i, seg) in bytes.chunks(MAX_SPAN).enumerate() {
            let frame = compress_from(&[], seg).map_err(|code| PatchError::Zstd {
                what: format!(
                    "target bytes {}+{}",
                    r.start + (i * MAX_SPAN) as u64,
                    seg.len()
                ),
                code,
            })?;
            w.op(&Op::Literal {
                len: seg.len() as u32,
                frame,
            })?;
        }
        Ok(())
    }

    fn file(&mut self, f: &FileData, w: &mut Writer<'_>) -> Result<(), PatchError> {
        let stored = f.start..f.start + f.stored_len();
        let h: [u8; 32] = Sha256::digest(&self.t[range(stored.clone())]).into();
        if let Some(&base_off) = self.by_stored.get(&h) {
            return w.op(&Op::Copy {
                base_off,
                len: stored.end - stored.start,
            });
        }
        let old = self
            .by_path
            .get(f.path.as_str())
            .or_else(|| self.by_shape.get(&shape(&f.path)))
            .map(|&i| &self.bi.files[i]);
        let per_op = (MAX_SPAN / self.block_size as usize).max(1);
        let mut pos = f.start;
        for first in (0..f.words.len()).step_by(per_op) {
            let last = (first + per_op).min(f.words.len());
            let len: u64 = f.words[first..last]
                .iter()
                .map(|w| u64::from(w & SIZE_MASK))
                .sum();
            self.segment(f, first..last, pos, old, w)?;
            pos += len;
        }
        Ok(())
    }

    /// Blocks `blocks` of target file `f` (stored from `pos`), as a Data op against the
    /// matching window of `old`, or as a Literal of their stored bytes when that is smaller.
    fn segment(
        &mut self,
        f: &FileData,
        blocks: Range<usize>,
        pos: u64,
        old: Option<&FileData>,
        w: &mut Writer<'_>,
    ) -> Result<(), PatchError> {
        let t = self.target_blocks(f, blocks.clone(), pos)?;
        let (refs, reference) = match old {
            Some(o) => self.reference(o, blocks.start, t.data.len() as u64),
            None => (Vec::new(), Vec::new()),
        };
        let frame = compress_from(&reference, &t.data).map_err(|code| PatchError::Zstd {
            what: format!("{:?} blocks {blocks:?}", f.path),
            code,
        })?;
        let op = Op::Data {
            refs,
            blocks: t.blocks,
            frame,
        };
        let mut enc = Vec::new();
        op.encode(&mut enc);
        let stored_len = (t.end - pos) as usize;
        if enc.len() + t.verbatim.len() >= stored_len {
            return self.gap(pos..t.end, w);
        }
        if let Op::Data { blocks, .. } = &op {
            let n = blocks.iter().filter(|b| b.word & VERBATIM != 0).count() as u64;
            w.stats.blocks_not_reproducible += n;
            w.stats.blocks_recompressed += blocks
                .iter()
                .filter(|b| b.word != 0 && b.word & (STORED | VERBATIM) == 0)
                .count() as u64;
        }
        w.op(&op)?;
        w.raw(&t.verbatim)
    }

    /// Blocks `blocks` of target file `f` (stored from `pos`): their uncompressed bytes, and
    /// which recompress identically with this build (the others are carried verbatim).
    fn target_blocks(
        &mut self,
        f: &FileData,
        blocks: Range<usize>,
        pos: u64,
    ) -> Result<TargetRun, PatchError> {
        let bs = self.block_size;
        let mut t = TargetRun {
            data: Vec::new(),
            blocks: Vec::with_capacity(blocks.len()),
            verbatim: Vec::new(),
            end: pos,
        };
        for i in blocks {
            let word = f.words[i];
            let ulen = f.ulen(i, bs);
            let stored = &self.t[range(t.end..t.end + u64::from(word & SIZE_MASK))];
            t.end += stored.len() as u64;
            let start = t.data.len();
            block_bytes(&mut self.dec, word, ulen, stored, &mut t.data).map_err(|e| {
                PatchError::Squashfs {
                    path: f.path.clone().into(),
                    what: format!("target block {i} at {}: {e}", t.end),
                }
            })?;
            let mut word_out = word;
            if word != 0
                && word & STORED == 0
                && self.comp.compress(&t.data[start..]) != Some(stored)
            {
                word_out |= VERBATIM;
                t.verbatim.extend_from_slice(stored);
            }
            t.blocks.push(TargetBlock {
                word: word_out,
                ulen,
            });
        }
        Ok(t)
    }

    /// The reference for target blocks from `first` on (`len` uncompressed bytes): the old
    /// file `o`'s blocks around the same offsets, decompressed, with where each comes from.
    fn reference(&mut self, o: &FileData, first: usize, len: u64) -> (Vec<BlockRef>, Vec<u8>) {
        let bs = u64::from(self.block_size);
        let ua = first as u64 * bs;
        let (lo, hi) = super::plain::window(ua, ua + len, o.size);
        let (mut refs, mut reference) = (Vec::new(), Vec::new());
        let mut opos = o.start;
        for (j, &word) in o.words.iter().enumerate() {
            let ustart = j as u64 * bs;
            let slen = u64::from(word & SIZE_MASK);
            let ulen = o.ulen(j, self.block_size);
            if ustart >= lo && ustart + u64::from(ulen) <= hi && opos + slen <= self.b.len() as u64
            {
                let stored = &self.b[range(opos..opos + slen)];
                if block_bytes(&mut self.dec, word, ulen, stored, &mut reference).is_ok() {
                    refs.push(BlockRef {
                        off: opos,
                        word,
                        ulen,
                    });
                } else {
                    reference.truncate(refs.iter().map(|r| r.ulen as usize).sum());
                }
            }
            opos += slen;
        }
        (refs, reference)
    }
}

/// Target blocks of one Data op: their uncompressed bytes, their descriptions, the stored
/// bytes of those carried verbatim, and where their stored bytes end in the target.
struct TargetRun {
    data: Vec<u8>,
    blocks: Vec<TargetBlock>,
    verbatim: Vec<u8>,
    end: u64,
}

/// Append block `word`'s uncompressed bytes (`ulen` of them) from its `stored` bytes.
fn block_bytes(
    dec: &mut BlockDecompressor,
    word: u32,
    ulen: u32,
    stored: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), String> {
    if word == 0 {
        out.resize(out.len() + ulen as usize, 0);
        return Ok(());
    }
    if word & STORED != 0 {
        if stored.len() != ulen as usize {
            return Err(format!(
                "stored raw with {} bytes, {ulen} expected",
                stored.len()
            ));
        }
        out.extend_from_slice(stored);
        return Ok(());
    }
    let n = dec.decompress_into(stored, ulen as usize, out)?;
    if n != ulen as usize {
        return Err(format!("decompressed to {n} bytes, {ulen} expected"));
    }
    Ok(())
}
