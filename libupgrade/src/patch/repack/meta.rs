//! Metadata tables as streams: a run of metadata blocks decoded into one byte stream (with
//! where each block starts, compressed and uncompressed), and a stream encoded back into
//! blocks with the same uncompressed partition, so that an offset inside a block stays valid
//! and only the blocks' positions move.

use byteorder::{ByteOrder, LittleEndian as LE};

use crate::patch::codec::{BlockCompressor, BlockDecompressor};

/// Uncompressed bytes of a full metadata block.
pub const METADATA_SIZE: usize = 8192;
/// Header bit of a metadata block stored uncompressed.
const RAW: u16 = 0x8000;

/// A metadata table decoded: its bytes and, per block, its offset from the table's start and
/// where its bytes start in `bytes`.
#[derive(Debug, Clone)]
pub struct Stream {
    /// The blocks' uncompressed bytes, concatenated.
    pub bytes: Vec<u8>,
    /// Per block: (offset of its header from the table's start, start of its bytes in `bytes`).
    pub blocks: Vec<(u64, usize)>,
    /// The table's encoded length (where a block after the last would start).
    pub end: u64,
}

impl Stream {
    /// Position in `bytes` of reference (`block` from the table's start, `offset` inside it).
    /// The table's end with offset 0 (an empty directory's listing) is `bytes.len()`.
    pub fn upos(&self, block: u64, offset: usize) -> Result<usize, String> {
        if block == self.end && offset == 0 {
            return Ok(self.bytes.len());
        }
        let i = self
            .blocks
            .binary_search_by_key(&block, |&(rel, _)| rel)
            .map_err(|_| format!("reference to block {block}, not a block start of the table"))?;
        let start = self.blocks[i].1;
        let pos = start + offset;
        if pos > self.bytes.len() {
            return Err(format!(
                "reference to block {block} offset {offset}, past the table's {} bytes",
                self.bytes.len()
            ));
        }
        Ok(pos)
    }

    /// The block partition (each block's start in `bytes`), for [`encode`].
    pub fn partition(&self) -> Vec<usize> {
        self.blocks.iter().map(|&(_, u)| u).collect()
    }
}

/// The metadata block whose header is at `pos` of `img`: its bytes appended to `out`, and
/// the position after it.
pub fn block(
    img: &[u8],
    pos: u64,
    dec: &mut BlockDecompressor,
    out: &mut Vec<u8>,
) -> Result<u64, String> {
    let at = usize::try_from(pos).map_err(|_| format!("metadata block at {pos}"))?;
    let h = img
        .get(at..at.saturating_add(2))
        .ok_or_else(|| format!("metadata block header at {pos} is past the image"))?;
    let h = LE::read_u16(h);
    let len = usize::from(h & !RAW);
    if len == 0 || len > METADATA_SIZE {
        return Err(format!(
            "metadata block at {pos} claims {len} bytes (1..=8192)"
        ));
    }
    let body = img
        .get(at + 2..at + 2 + len)
        .ok_or_else(|| format!("metadata block at {pos} of {len} bytes is past the image"))?;
    if h & RAW != 0 {
        out.extend_from_slice(body);
    } else {
        dec.decompress_into(body, METADATA_SIZE, out)
            .map_err(|e| format!("metadata block at {pos}: {e}"))?;
    }
    Ok(pos + 2 + len as u64)
}

/// The table of metadata blocks from `start` up to exactly `end`.
pub fn read_run(
    img: &[u8],
    start: u64,
    end: u64,
    dec: &mut BlockDecompressor,
) -> Result<Stream, String> {
    let mut s = Stream {
        bytes: Vec::new(),
        blocks: Vec::new(),
        end: end - start,
    };
    let mut pos = start;
    while pos < end {
        s.blocks.push((pos - start, s.bytes.len()));
        pos = block(img, pos, dec, &mut s.bytes)?;
    }
    if pos != end {
        return Err(format!(
            "the metadata blocks from {start} run to {pos}, past the next table at {end}"
        ));
    }
    Ok(s)
}

/// The `len` bytes of a table whose blocks are listed by `count` u64 pointers at `index`
/// (fragment, export and id tables). The blocks must follow each other.
pub fn read_indexed(
    img: &[u8],
    index: u64,
    len: usize,
    dec: &mut BlockDecompressor,
) -> Result<(Vec<u8>, u64), String> {
    let count = len.div_ceil(METADATA_SIZE);
    let at = usize::try_from(index).map_err(|_| format!("table index at {index}"))?;
    let ptrs = img
        .get(at..at.saturating_add(count * 8))
        .ok_or_else(|| format!("table index at {index} with {count} entries is past the image"))?;
    let mut out = Vec::new(); // not `len`: a damaged count must not allocate it up front
    let mut first = index;
    let mut next = None;
    for (i, p) in ptrs.chunks_exact(8).enumerate() {
        let p = LE::read_u64(p);
        if i == 0 {
            first = p;
        } else if next != Some(p) {
            return Err(format!(
                "table index at {index}: block {i} at {p}, expected right after block {} ({next:?})",
                i - 1
            ));
        }
        next = Some(block(img, p, dec, &mut out)?);
    }
    if out.len() < len {
        return Err(format!(
            "table at {first}: {} bytes decoded, {len} expected",
            out.len()
        ));
    }
    out.truncate(len);
    Ok((out, first))
}

/// Encode `bytes` as metadata blocks split at `partition` (each block's start; the first is
/// 0), appended to `out`: compressed unless `raw` or compression does not shrink a block
/// (then stored, as mksquashfs does). Returns each block's offset from where it started and
/// the end.
pub fn encode(
    bytes: &[u8],
    partition: &[usize],
    comp: &mut BlockCompressor,
    raw: bool,
    out: &mut Vec<u8>,
) -> (Vec<u64>, u64) {
    let base = out.len();
    let mut rels = Vec::with_capacity(partition.len());
    for (i, &start) in partition.iter().enumerate() {
        let end = partition.get(i + 1).copied().unwrap_or(bytes.len());
        let chunk = &bytes[start..end];
        rels.push((out.len() - base) as u64);
        match (raw, comp.compress(chunk)) {
            (false, Some(c)) => {
                out.extend_from_slice(&(c.len() as u16).to_le_bytes());
                out.extend_from_slice(c);
            }
            _ => {
                out.extend_from_slice(&(chunk.len() as u16 | RAW).to_le_bytes());
                out.extend_from_slice(chunk);
            }
        }
    }
    (rels, (out.len() - base) as u64)
}

/// Encode `bytes` in full blocks of 8 KiB at the end of `out` (the image from its first byte)
/// followed by the u64 index of their positions; returns the index's position (also for an
/// empty table, where mksquashfs points the superblock).
pub fn write_indexed(
    bytes: &[u8],
    comp: &mut BlockCompressor,
    raw: bool,
    out: &mut Vec<u8>,
) -> u64 {
    let partition: Vec<usize> = (0..bytes.len()).step_by(METADATA_SIZE).collect();
    let first = out.len() as u64;
    let (rels, _) = encode(bytes, &partition, comp, raw, out);
    let index = out.len() as u64;
    for r in rels {
        out.extend_from_slice(&(first + r).to_le_bytes());
    }
    index
}
