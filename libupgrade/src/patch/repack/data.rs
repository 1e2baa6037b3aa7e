//! The data region re-packed: every data block and fragment block decompressed and
//! compressed again by this build's zstd at the image's level, in the original order, with
//! where each block moved to.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::patch::codec::{BlockCompressor, BlockDecompressor};
use crate::patch::ops::{SIZE_MASK, STORED};

/// A block of the re-packed data region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// Its offset in the new image.
    pub off: u64,
    /// Its new size word (stored length, bit 24 when stored raw).
    pub word: u32,
    /// Its uncompressed length.
    pub ulen: u32,
}

/// The new data region and the blocks' new places.
#[derive(Debug, Default)]
pub struct Data {
    /// The region's bytes (from the same offset as the original region).
    pub bytes: Vec<u8>,
    /// Old offset → the block's new place.
    pub moved: BTreeMap<u64, Moved>,
    /// Blocks whose stored bytes changed (this build's zstd made other bytes).
    pub changed: u64,
}

impl Data {
    /// The new offset of old offset `old`: a block's new start, or for a position with no
    /// block (an empty file's start) the next block's new start or the region's new end.
    pub fn map_pos(&self, old: u64, region_start: u64) -> u64 {
        self.moved
            .range(old..)
            .next()
            .map_or(region_start + self.bytes.len() as u64, |(_, m)| m.off)
    }
}

/// Every block that something references: (offset, size word), from file block lists and
/// fragment entries. The same block may be named twice (duplicate files), a different block
/// at the same offset may not.
pub fn collect(
    runs: impl IntoIterator<Item = (u64, Vec<u32>)>,
) -> Result<BTreeMap<u64, u32>, String> {
    let mut blocks = BTreeMap::new();
    for (start, words) in runs {
        let mut pos = start;
        for w in words {
            let len = u64::from(w & SIZE_MASK);
            if len == 0 {
                continue; // sparse: no bytes
            }
            if let Some(&other) = blocks.get(&pos) {
                if other != w {
                    return Err(format!(
                        "two blocks at {pos}: size words {other:#x} and {w:#x}"
                    ));
                }
            }
            blocks.insert(pos, w);
            pos += len;
        }
    }
    Ok(blocks)
}

/// Re-pack the blocks of `img` listed in `blocks`, all inside `region`, at `level`, on
/// [`crate::patch::workers`] threads. Bytes of the region no block covers are copied as they
/// are.
pub fn repack(
    img: &[u8],
    region: Range<u64>,
    blocks: &BTreeMap<u64, u32>,
    level: i32,
    block_size: u32,
) -> Result<Data, String> {
    let mut cursor = region.start;
    let mut list = Vec::with_capacity(blocks.len());
    for (&off, &word) in blocks {
        let len = u64::from(word & SIZE_MASK);
        if off < cursor || off + len > region.end {
            return Err(format!(
                "block at {off} of {len} bytes overlaps another or leaves the data region {region:?}"
            ));
        }
        list.push((off, word));
        cursor = off + len;
    }
    let per = list.len().div_ceil(crate::patch::workers()).max(1);
    let parts: Vec<Result<Vec<Block>, String>> = std::thread::scope(|s| {
        let jobs: Vec<_> = list
            .chunks(per)
            .map(|part| s.spawn(move || again(img, part, level, block_size)))
            .collect();
        jobs.into_iter()
            .map(|j| j.join().expect("a re-pack thread panicked"))
            .collect()
    });
    let mut d = Data::default();
    let mut cursor = region.start;
    for (&(off, word), b) in list.iter().zip(parts.into_iter().flat_map(flatten)) {
        let b = b?;
        d.bytes
            .extend_from_slice(&img[cursor as usize..off as usize]);
        let stored = &img[off as usize..off as usize + (word & SIZE_MASK) as usize];
        d.changed += u64::from(stored != &b.bytes[..]);
        let m = Moved {
            off: region.start + d.bytes.len() as u64,
            word: b.word,
            ulen: b.ulen,
        };
        d.bytes.extend_from_slice(&b.bytes);
        d.moved.insert(off, m);
        cursor = off + u64::from(word & SIZE_MASK);
    }
    d.bytes
        .extend_from_slice(&img[cursor as usize..region.end as usize]);
    Ok(d)
}

/// A part's blocks, or its error once for each block (the first is reported).
fn flatten(r: Result<Vec<Block>, String>) -> Vec<Result<Block, String>> {
    match r {
        Ok(v) => v.into_iter().map(Ok).collect(),
        Err(e) => vec![Err(e)],
    }
}

/// One block compressed again.
struct Block {
    bytes: Vec<u8>,
    word: u32,
    ulen: u32,
}

/// The blocks `part` (offset, size word) of `img` decompressed and compressed again; a raw
/// block stays raw, a compressed one that does not shrink becomes raw (as mksquashfs does).
fn again(
    img: &[u8],
    part: &[(u64, u32)],
    level: i32,
    block_size: u32,
) -> Result<Vec<Block>, String> {
    let mut comp = BlockCompressor::new(level);
    let mut dec = BlockDecompressor::new();
    let mut plain = Vec::with_capacity(block_size as usize);
    let mut out = Vec::with_capacity(part.len());
    for &(off, word) in part {
        let stored = &img[off as usize..off as usize + (word & SIZE_MASK) as usize];
        plain.clear();
        if word & STORED != 0 {
            plain.extend_from_slice(stored);
        } else {
            dec.decompress_into(stored, block_size as usize, &mut plain)
                .map_err(|e| format!("data block at {off}: {e}"))?;
        }
        let ulen = plain.len() as u32;
        out.push(match comp.compress(&plain) {
            Some(c) if word & STORED == 0 => Block {
                bytes: c.to_vec(),
                word: c.len() as u32,
                ulen,
            },
            _ => Block {
                bytes: plain.clone(),
                word: ulen | STORED,
                ulen,
            },
        });
    }
    Ok(out)
}
