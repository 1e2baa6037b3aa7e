//! What the builder reads of a squashfs 4.0 image: the superblock, the zstd level, and every
//! regular file's path and block list (walking the directory table from the root inode).
//!
//! Parsed by hand rather than with `backhand`: its zstd support links a newer libzstd, and
//! `zstd-sys` (`links = "zstd"`) can be in the graph once, pinned to the version that
//! reproduces the images' blocks (see [`crate::patch`]). The builder holds the whole image in
//! memory anyway; metadata blocks are decompressed on demand and cached.

use std::collections::HashMap;

use byteorder::{ByteOrder, LittleEndian as LE};

use super::codec::BlockDecompressor;

/// squashfs' compressor id of zstd.
pub const ZSTD: u16 = 6;
/// mksquashfs' zstd level when the image carries no compressor options.
pub const DEFAULT_LEVEL: i32 = 15;
const METADATA_SIZE: usize = 8192;
const COMPRESSOR_OPTIONS: u16 = 0x0400;
const NO_FRAGMENT: u32 = 0xffff_ffff;

/// A regular file's data as the image stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileData {
    /// Its path from the root, `/`-separated, without a leading `/`.
    pub path: String,
    /// Offset of its first block in the image.
    pub start: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Its blocks' size words (stored length, bit 24 stored raw, 0 sparse); a tail in a
    /// fragment is not among them.
    pub words: Vec<u32>,
}

impl FileData {
    /// Bytes its blocks take in the image.
    pub fn stored_len(&self) -> u64 {
        self.words
            .iter()
            .map(|w| u64::from(w & super::ops::SIZE_MASK))
            .sum()
    }

    /// Uncompressed length of block `i`.
    pub fn ulen(&self, i: usize, block_size: u32) -> u32 {
        let bs = u64::from(block_size);
        (self.size - i as u64 * bs).min(bs) as u32
    }
}

/// The parts of an image the builder uses.
#[derive(Debug)]
pub struct Image {
    /// Compressor id (6 = zstd).
    pub compressor: u16,
    /// zstd level (compressor options, or mksquashfs' default).
    pub level: i32,
    /// Data block size.
    pub block_size: u32,
    /// Every regular file with data blocks, in directory order.
    pub files: Vec<FileData>,
}

/// Parse `img`. Errors are sentences with offsets.
pub fn parse(img: &[u8]) -> Result<Image, String> {
    let sb = crate::sqcheck::superblock_of(img)?;
    if sb.bytes_used > img.len() as u64 {
        return Err(format!(
            "superblock says {} bytes used, the image has {}",
            sb.bytes_used,
            img.len()
        ));
    }
    let flags = sb.flags;
    let mut dec = BlockDecompressor::new();
    let mut level = DEFAULT_LEVEL;
    if sb.compression == ZSTD && flags & COMPRESSOR_OPTIONS != 0 {
        let (opts, _) = metadata_block(img, 96, sb.compression, &mut dec)?;
        let l = opts
            .get(..4)
            .ok_or("compressor options shorter than 4 bytes")?;
        level = LE::read_i32(l);
    }
    let mut files = Vec::new();
    if sb.compression == ZSTD {
        let mut w = Walker {
            img,
            compressor: sb.compression,
            dec,
            block_size: sb.block_size,
            inodes: Table::new(sb.inode_table_start),
            dirs: Table::new(sb.directory_table_start),
        };
        w.walk(sb.root_inode, &mut files)?;
    }
    Ok(Image {
        compressor: sb.compression,
        level,
        block_size: sb.block_size,
        files,
    })
}

/// The metadata block at `pos`: its uncompressed bytes and the position after it.
fn metadata_block(
    img: &[u8],
    pos: u64,
    compressor: u16,
    dec: &mut BlockDecompressor,
) -> Result<(Vec<u8>, u64), String> {
    let at = usize::try_from(pos).map_err(|_| format!("metadata block at {pos}"))?;
    let h = img
        .get(at..at + 2)
        .ok_or_else(|| format!("metadata block header at {pos} is past the image"))?;
    let h = LE::read_u16(h);
    let len = usize::from(h & 0x7fff);
    let body = img
        .get(at + 2..at + 2 + len)
        .ok_or_else(|| format!("metadata block at {pos} of {len} bytes is past the image"))?;
    let out = if h & 0x8000 != 0 {
        body.to_vec()
    } else {
        if compressor != ZSTD {
            return Err(format!(
                "metadata block at {pos} needs compressor {compressor}"
            ));
        }
        let mut out = Vec::new();
        dec.decompress_into(body, METADATA_SIZE, &mut out)
            .map_err(|e| format!("metadata block at {pos}: {e}"))?;
        out
    };
    Ok((out, pos + 2 + len as u64))
}

/// A metadata table read on demand: blocks keyed by their offset from the table's start.
struct Table {
    start: u64,
    blocks: HashMap<u64, (Vec<u8>, u64)>,
}

impl Table {
    fn new(start: u64) -> Self {
        Table {
            start,
            blocks: HashMap::new(),
        }
    }

    /// `n` bytes from block `block` (relative), offset `offset`, following the chain.
    fn read(
        &mut self,
        img: &[u8],
        compressor: u16,
        dec: &mut BlockDecompressor,
        mut block: u64,
        mut offset: usize,
        n: usize,
    ) -> Result<Vec<u8>, String> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            if !self.blocks.contains_key(&block) {
                let (data, next) = metadata_block(img, self.start + block, compressor, dec)?;
                self.blocks.insert(block, (data, next - self.start));
            }
            let (data, next) = &self.blocks[&block];
            if data.is_empty() {
                return Err(format!("empty metadata block at {}", self.start + block));
            }
            if offset >= data.len() {
                // Past this block: the bytes continue in the next one.
                offset -= data.len();
                block = *next;
                continue;
            }
            let take = (n - out.len()).min(data.len() - offset);
            out.extend_from_slice(&data[offset..offset + take]);
            offset = 0;
            block = *next;
        }
        Ok(out)
    }
}

struct Walker<'i> {
    img: &'i [u8],
    compressor: u16,
    dec: BlockDecompressor,
    block_size: u32,
    inodes: Table,
    dirs: Table,
}

/// What the walk needs of an inode.
enum Inode {
    Dir {
        block: u64,
        offset: usize,
        size: u64,
    },
    File(FileData),
    Other,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    LE::read_u16(&b[o..])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    LE::read_u32(&b[o..])
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    LE::read_u64(&b[o..])
}

impl Walker<'_> {
    fn inode_bytes(&mut self, r: u64, at: usize, n: usize) -> Result<Vec<u8>, String> {
        self.inodes.read(
            self.img,
            self.compressor,
            &mut self.dec,
            r >> 16,
            (r & 0xffff) as usize + at,
            n,
        )
    }

    fn inode(&mut self, r: u64, path: &str) -> Result<Inode, String> {
        let h = self.inode_bytes(r, 0, 16)?;
        let kind = u16_at(&h, 0);
        Ok(match kind {
            1 => {
                let b = self.inode_bytes(r, 16, 16)?;
                Inode::Dir {
                    block: u64::from(u32_at(&b, 0)),
                    size: u64::from(u16_at(&b, 8)),
                    offset: usize::from(u16_at(&b, 10)),
                }
            }
            8 => {
                let b = self.inode_bytes(r, 16, 24)?;
                Inode::Dir {
                    size: u64::from(u32_at(&b, 4)),
                    block: u64::from(u32_at(&b, 8)),
                    offset: usize::from(u16_at(&b, 18)),
                }
            }
            2 | 9 => {
                let (start, fragment, size, at) = if kind == 2 {
                    let b = self.inode_bytes(r, 16, 16)?;
                    (
                        u64::from(u32_at(&b, 0)),
                        u32_at(&b, 4),
                        u64::from(u32_at(&b, 12)),
                        32,
                    )
                } else {
                    let b = self.inode_bytes(r, 16, 40)?;
                    (u64_at(&b, 0), u32_at(&b, 28), u64_at(&b, 8), 56)
                };
                let bs = u64::from(self.block_size);
                let n = if fragment == NO_FRAGMENT {
                    size.div_ceil(bs)
                } else {
                    size / bs
                };
                if n > self.img.len() as u64 {
                    return Err(format!(
                        "{path:?}: {size} bytes in {n} blocks, past the image"
                    ));
                }
                let b = self.inode_bytes(r, at, n as usize * 4)?;
                let words = b.chunks_exact(4).map(|c| u32_at(c, 0)).collect();
                Inode::File(FileData {
                    path: path.to_string(),
                    start,
                    size,
                    words,
                })
            }
            3..=7 | 10..=14 => Inode::Other,
            k => return Err(format!("{path:?}: unknown inode type {k}")),
        })
    }

    /// Walk the tree from the root inode, appending every regular file with blocks.
    fn walk(&mut self, root: u64, files: &mut Vec<FileData>) -> Result<(), String> {
        let mut stack = vec![(root, String::new())];
        let mut seen = 0usize;
        while let Some((r, path)) = stack.pop() {
            seen += 1;
            if seen > self.img.len() {
                return Err("directory loop".into());
            }
            match self.inode(r, &path)? {
                Inode::File(f) => {
                    if !f.words.is_empty() {
                        files.push(f);
                    }
                }
                Inode::Other => {}
                Inode::Dir {
                    block,
                    offset,
                    size,
                } => {
                    let mut children = self.listing(block, offset, size, &path)?;
                    children.reverse();
                    stack.extend(children);
                }
            }
        }
        Ok(())
    }

    /// A directory's entries as (inode reference, path).
    fn listing(
        &mut self,
        block: u64,
        offset: usize,
        size: u64,
        path: &str,
    ) -> Result<Vec<(u64, String)>, String> {
        if size <= 3 {
            return Ok(Vec::new());
        }
        let n = usize::try_from(size - 3).map_err(|_| format!("{path:?}: listing of {size}"))?;
        if n > self.img.len() * 8 {
            return Err(format!("{path:?}: listing of {n} bytes"));
        }
        let b = self
            .dirs
            .read(self.img, self.compressor, &mut self.dec, block, offset, n)?;
        let mut out = Vec::new();
        let mut at = 0;
        while at + 12 <= b.len() {
            let count = u32_at(&b, at) as usize + 1;
            let start = u64::from(u32_at(&b, at + 4));
            at += 12;
            for _ in 0..count {
                let e = b
                    .get(at..at + 8)
                    .ok_or_else(|| format!("{path:?}: directory entry past its listing"))?;
                let off = u64::from(u16_at(e, 0));
                let name_len = usize::from(u16_at(e, 6)) + 1;
                let name = b
                    .get(at + 8..at + 8 + name_len)
                    .ok_or_else(|| format!("{path:?}: entry name past its listing"))?;
                let name = String::from_utf8_lossy(name);
                let child = if path.is_empty() {
                    name.into_owned()
                } else {
                    format!("{path}/{name}")
                };
                out.push(((start << 16) | off, child));
                at += 8 + name_len;
            }
        }
        Ok(out)
    }
}
