//! The ops after the header, their encoding and their bounded decoding.
//!
//! Every op starts with a tag byte (little-endian fields follow):
//! - `0` End.
//! - `1` Copy: base offset u64, length u64 — raw base bytes (unchanged compressed blocks, also
//!   where they moved).
//! - `2` Literal: length u32, frame length u32, a zstd frame of the bytes.
//! - `3` Delta: base offset u64, base length u32, length u32, frame length u32, a zstd
//!   frame of the bytes with the base range as prefix (patch-from).
//! - `4` Data: ref count u32, refs (base offset u64, squashfs size word u32, uncompressed
//!   length u32), block count u32, blocks (squashfs size word u32, uncompressed length u32),
//!   frame length u32, a zstd frame of the blocks' uncompressed bytes with the refs'
//!   uncompressed bytes as prefix; then, in block order, the stored bytes of every block marked
//!   [`VERBATIM`]. A size word is squashfs' (bit 24: stored raw; 0: a sparse block).
//!
//! Decoding caps every length before allocating: an op emits at most [`MAX_SPAN`] bytes from
//! memory and holds at most [`MAX_REF`] bytes of reference.

use std::io::{Read, Write};

use byteorder::{LittleEndian, ReadBytesExt};

/// Most bytes one Literal, Delta or Data op decodes into memory.
pub const MAX_SPAN: usize = 16 << 20;
/// Most reference bytes one Delta or Data op holds in memory.
pub const MAX_REF: usize = 48 << 20;
/// Most refs or blocks of one Data op.
const MAX_BLOCKS: usize = 1 << 16;
/// Bit of a squashfs size word: the block is stored uncompressed.
pub const STORED: u32 = 1 << 24;
/// Bit of a target block's size word (the patch's own): its stored bytes are carried in the
/// patch because this build's compressor does not reproduce them.
pub const VERBATIM: u32 = 1 << 31;
/// Mask of the stored size in a size word.
pub const SIZE_MASK: u32 = 0x00ff_ffff;

/// A base block a Data op decompresses into its reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRef {
    /// Offset of the stored block in the base.
    pub off: u64,
    /// squashfs size word (stored length, [`STORED`] flag; 0 = sparse).
    pub word: u32,
    /// Its uncompressed length.
    pub ulen: u32,
}

/// A target block a Data op emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetBlock {
    /// squashfs size word, plus [`VERBATIM`] when the stored bytes are carried.
    pub word: u32,
    /// Its uncompressed length.
    pub ulen: u32,
}

impl TargetBlock {
    /// Bytes the block emits: its stored bytes (carried or recompressed), its raw bytes when
    /// stored raw, nothing when sparse.
    pub fn output_len(&self) -> u64 {
        if self.word & VERBATIM != 0 {
            u64::from(self.word & SIZE_MASK)
        } else if self.word == 0 {
            0
        } else if self.word & STORED != 0 {
            u64::from(self.ulen)
        } else {
            u64::from(self.word & SIZE_MASK)
        }
    }
}

/// One decoded op (a Data op's verbatim bytes stay in the stream until emitted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// End of the ops.
    End,
    /// Raw base bytes.
    Copy {
        /// Offset in the base.
        base_off: u64,
        /// Length.
        len: u64,
    },
    /// Bytes carried in the patch.
    Literal {
        /// Decoded length.
        len: u32,
        /// zstd frame.
        frame: Vec<u8>,
    },
    /// Bytes as a patch-from of a base range.
    Delta {
        /// Start of the reference in the base.
        base_off: u64,
        /// Length of the reference.
        base_len: u32,
        /// Decoded length.
        len: u32,
        /// zstd frame.
        frame: Vec<u8>,
    },
    /// squashfs blocks rebuilt from decompressed base blocks.
    Data {
        /// The reference's base blocks.
        refs: Vec<BlockRef>,
        /// The target blocks.
        blocks: Vec<TargetBlock>,
        /// zstd frame of the blocks' uncompressed bytes, the refs' as prefix.
        frame: Vec<u8>,
    },
}

impl Op {
    /// Bytes of the target the op emits (for Data: each block's stored bytes, raw bytes for a
    /// block stored raw, nothing for a sparse one), known without running it.
    pub fn output_len(&self) -> u64 {
        match self {
            Op::End => 0,
            Op::Copy { len, .. } => *len,
            Op::Literal { len, .. } | Op::Delta { len, .. } => u64::from(*len),
            Op::Data { blocks, .. } => blocks.iter().map(TargetBlock::output_len).sum(),
        }
    }

    /// Append the op's encoding (for Data, without the verbatim bytes, which follow it).
    pub fn encode(&self, b: &mut Vec<u8>) {
        match self {
            Op::End => b.push(0),
            Op::Copy { base_off, len } => {
                b.push(1);
                b.extend_from_slice(&base_off.to_le_bytes());
                b.extend_from_slice(&len.to_le_bytes());
            }
            Op::Literal { len, frame } => {
                b.push(2);
                b.extend_from_slice(&len.to_le_bytes());
                put_frame(b, frame);
            }
            Op::Delta {
                base_off,
                base_len,
                len,
                frame,
            } => {
                b.push(3);
                b.extend_from_slice(&base_off.to_le_bytes());
                b.extend_from_slice(&base_len.to_le_bytes());
                b.extend_from_slice(&len.to_le_bytes());
                put_frame(b, frame);
            }
            Op::Data {
                refs,
                blocks,
                frame,
            } => {
                b.push(4);
                b.extend_from_slice(&(refs.len() as u32).to_le_bytes());
                for r in refs {
                    b.extend_from_slice(&r.off.to_le_bytes());
                    b.extend_from_slice(&r.word.to_le_bytes());
                    b.extend_from_slice(&r.ulen.to_le_bytes());
                }
                b.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
                for t in blocks {
                    b.extend_from_slice(&t.word.to_le_bytes());
                    b.extend_from_slice(&t.ulen.to_le_bytes());
                }
                put_frame(b, frame);
            }
        }
    }

    /// Write the op's encoding.
    pub fn write(&self, out: &mut impl Write) -> std::io::Result<u64> {
        let mut b = Vec::new();
        self.encode(&mut b);
        out.write_all(&b)?;
        Ok(b.len() as u64)
    }
}

fn put_frame(b: &mut Vec<u8>, frame: &[u8]) {
    b.extend_from_slice(&(frame.len() as u32).to_le_bytes());
    b.extend_from_slice(frame);
}

/// Decode one op from `r`, `block_size` bounding the blocks' lengths (a Plain patch has
/// none). The error is a plain sentence; the applier adds the op index and offset.
pub fn decode(r: &mut impl Read, block_size: u32) -> Result<Op, String> {
    let tag = u8s::<1>(r)?[0];
    Ok(match tag {
        0 => Op::End,
        1 => Op::Copy {
            base_off: u64v(r)?,
            len: u64v(r)?,
        },
        2 => {
            let len = capped(u32v(r)?, MAX_SPAN, "literal length")?;
            let frame = frame(r, len as usize)?;
            Op::Literal { len, frame }
        }
        3 => {
            let base_off = u64v(r)?;
            let base_len = capped(u32v(r)?, MAX_REF, "reference length")?;
            let len = capped(u32v(r)?, MAX_SPAN, "delta length")?;
            let frame = frame(r, len as usize)?;
            Op::Delta {
                base_off,
                base_len,
                len,
                frame,
            }
        }
        4 => {
            if block_size == 0 {
                return Err("a data op in a patch without squashfs blocks".into());
            }
            let n = capped(u32v(r)?, MAX_BLOCKS, "ref count")? as usize;
            let mut refs = Vec::with_capacity(n);
            let mut total = 0usize;
            for i in 0..n {
                let (off, word, ulen) = (u64v(r)?, u32v(r)?, u32v(r)?);
                check_word(word & !VERBATIM, ulen, block_size, &format!("ref {i}"))?;
                if word & VERBATIM != 0 {
                    return Err(format!("ref {i} is marked verbatim"));
                }
                total += ulen as usize;
                if total > MAX_REF {
                    return Err(format!("refs decompress past {MAX_REF} bytes"));
                }
                refs.push(BlockRef { off, word, ulen });
            }
            let n = capped(u32v(r)?, MAX_BLOCKS, "block count")? as usize;
            let mut blocks = Vec::with_capacity(n);
            let mut total = 0usize;
            for i in 0..n {
                let (word, ulen) = (u32v(r)?, u32v(r)?);
                check_word(word & !VERBATIM, ulen, block_size, &format!("block {i}"))?;
                total += ulen as usize;
                if total > MAX_SPAN {
                    return Err(format!("blocks decompress past {MAX_SPAN} bytes"));
                }
                blocks.push(TargetBlock { word, ulen });
            }
            let frame = frame(r, total)?;
            Op::Data {
                refs,
                blocks,
                frame,
            }
        }
        t => return Err(format!("unknown op tag {t} (expected 0..=4)")),
    })
}

fn check_word(word: u32, ulen: u32, block_size: u32, what: &str) -> Result<(), String> {
    let size = word & SIZE_MASK;
    if word & !(SIZE_MASK | STORED) != 0 || size > block_size || ulen > block_size {
        return Err(format!(
            "{what}: size word {word:#x} / uncompressed {ulen} past the block size {block_size}"
        ));
    }
    if word & STORED != 0 && size != ulen {
        return Err(format!(
            "{what}: stored raw with {size} bytes but {ulen} uncompressed"
        ));
    }
    Ok(())
}

fn capped(v: u32, cap: usize, what: &str) -> Result<u32, String> {
    if v as usize > cap {
        return Err(format!("{what} {v}, at most {cap}"));
    }
    Ok(v)
}

/// A frame of at most `compress_bound(len)` bytes (plus a little for the frame header).
fn frame(r: &mut impl Read, len: usize) -> Result<Vec<u8>, String> {
    let n = u32v(r)? as usize;
    let cap = zstd_safe::compress_bound(len) + 64;
    if n > cap {
        return Err(format!(
            "frame of {n} bytes for {len} decoded bytes, at most {cap}"
        ));
    }
    // Read through `take`: memory grows with the bytes actually there, not the declared length.
    let mut f = Vec::new();
    r.take(n as u64)
        .read_to_end(&mut f)
        .map_err(|e| format!("frame of {n} bytes: {e}"))?;
    if f.len() != n {
        return Err(format!(
            "frame of {n} bytes, the patch ends after {}",
            f.len()
        ));
    }
    Ok(f)
}

fn u8s<const N: usize>(r: &mut impl Read) -> Result<[u8; N], String> {
    let mut b = [0u8; N];
    r.read_exact(&mut b).map_err(|e| format!("read: {e}"))?;
    Ok(b)
}

fn u32v(r: &mut impl Read) -> Result<u32, String> {
    r.read_u32::<LittleEndian>()
        .map_err(|e| format!("read: {e}"))
}

fn u64v(r: &mut impl Read) -> Result<u64, String> {
    r.read_u64::<LittleEndian>()
        .map_err(|e| format!("read: {e}"))
}
