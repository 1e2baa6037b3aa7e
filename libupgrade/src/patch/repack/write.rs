//! The re-packed image assembled: the superblock and compressor options as they were, the
//! re-packed data region, the inode and directory tables with every moved offset rewritten,
//! then the fragment, export, id and xattr tables.

use byteorder::{ByteOrder, LittleEndian as LE};

use super::data::Data;
use super::layout::{at, Parsed, UNCOMPRESSED_FRAGMENTS, UNCOMPRESSED_IDS, UNCOMPRESSED_INODES};
use super::meta::{self, Stream};
use crate::patch::codec::BlockCompressor;
use crate::patch::ops::SIZE_MASK;

/// Rounds of the inode/directory fixed point before the directory table is stored
/// uncompressed (sizes that no longer depend on their contents end it).
const ROUNDS: usize = 8;

fn put(b: &mut [u8], at: usize, v: u64, n: usize) {
    b[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
}

/// New block offsets of a re-encoded table: old offset (a block start or the end) → new.
struct Remap<'s> {
    old: &'s Stream,
    rels: Vec<u64>,
    end: u64,
}

impl Remap<'_> {
    fn get(&self, old: u64) -> Result<u64, String> {
        if old == self.old.end {
            return Ok(self.end);
        }
        self.old
            .blocks
            .binary_search_by_key(&old, |&(r, _)| r)
            .map(|i| self.rels[i])
            .map_err(|_| format!("reference to {old}, not a block start of its table"))
    }

    fn inode_ref(&self, r: u64) -> Result<u64, String> {
        Ok((self.get(r >> 16)? << 16) | (r & 0xffff))
    }
}

/// The inode stream with every file's start and block list set to the re-packed region's.
fn files_moved(p: &Parsed, d: &Data) -> Result<Vec<u8>, String> {
    let mut b = p.inodes.bytes.clone();
    for f in &p.sites.files {
        let mut pos = f.start;
        let mut start = None;
        for (i, &w) in f.words.iter().enumerate() {
            if w & SIZE_MASK == 0 {
                continue;
            }
            let m = d
                .moved
                .get(&pos)
                .ok_or("a block the walk listed was not re-packed")?;
            if u64::from(m.ulen) != f.ulen(i, p.block_size) {
                return Err(format!(
                    "file block at {pos} holds {} bytes, its file's size says {}",
                    m.ulen,
                    f.ulen(i, p.block_size)
                ));
            }
            start.get_or_insert(m.off);
            put(&mut b, f.words_at() + 4 * i, u64::from(m.word), 4);
            pos += u64::from(w & SIZE_MASK);
        }
        let start = start.unwrap_or_else(|| d.map_pos(f.start, p.data_start));
        if f.ext {
            put(&mut b, f.at + 16, start, 8);
        } else {
            let s = u32::try_from(start)
                .map_err(|_| format!("a basic file inode's data moved to {start}, past 4 GiB"))?;
            put(&mut b, f.at + 16, u64::from(s), 4);
        }
    }
    Ok(b)
}

/// The inode and directory tables encoded, and the inode table's remap.
struct Tables<'s> {
    inodes: Vec<u8>,
    dirs: Vec<u8>,
    inode_map: Remap<'s>,
}

/// Encode both tables until the directory offsets the inodes name are the ones the
/// directory table got (each table names the other's block offsets).
fn tables<'s>(p: &'s Parsed, inode_bytes: &[u8]) -> Result<Tables<'s>, String> {
    let mut comp = BlockCompressor::new(p.level);
    let raw = p.flags & UNCOMPRESSED_INODES != 0;
    let mut dir_raw = raw;
    let mut dir_map = Remap {
        old: &p.dirs,
        rels: p.dirs.blocks.iter().map(|&(r, _)| r).collect(),
        end: p.dirs.end,
    };
    for round in 0..ROUNDS + 3 {
        let mut ib = inode_bytes.to_vec();
        for &s in &p.sites.dir_refs {
            let old = u64::from(LE::read_u32(&ib[s..]));
            put(&mut ib, s, dir_map.get(old)?, 4);
        }
        let mut inodes = Vec::new();
        let (rels, end) = meta::encode(&ib, &p.inodes.partition(), &mut comp, raw, &mut inodes);
        let inode_map = Remap {
            old: &p.inodes,
            rels,
            end,
        };
        let mut db = p.dirs.bytes.clone();
        for &s in &p.sites.inode_refs {
            let old = u64::from(LE::read_u32(&db[s..]));
            put(&mut db, s, inode_map.get(old)?, 4);
        }
        let mut dirs = Vec::new();
        let (rels, end) = meta::encode(&db, &p.dirs.partition(), &mut comp, dir_raw, &mut dirs);
        if rels == dir_map.rels && end == dir_map.end {
            return Ok(Tables {
                inodes,
                dirs,
                inode_map,
            });
        }
        dir_map.rels = rels;
        dir_map.end = end;
        dir_raw |= round + 1 >= ROUNDS;
    }
    Err("the inode and directory tables did not settle".into())
}

/// The re-packed image of `img` (parsed as `p`) with data region `d`.
pub fn image(img: &[u8], p: &Parsed, d: &Data) -> Result<Vec<u8>, String> {
    let inode_bytes = files_moved(p, d)?;
    let t = tables(p, &inode_bytes)?;
    let mut out = img[..p.data_start as usize].to_vec();
    out.extend_from_slice(&d.bytes);
    let mut comp = BlockCompressor::new(p.level);
    let raw = p.flags & UNCOMPRESSED_INODES != 0;
    let inode_start = out.len() as u64;
    out.extend_from_slice(&t.inodes);
    let dir_start = out.len() as u64;
    out.extend_from_slice(&t.dirs);
    let mut frags = Vec::with_capacity(p.fragments.len() * 16);
    for &(start, word) in &p.fragments {
        let m = d.moved.get(&start).filter(|_| word & SIZE_MASK != 0);
        let (s, w) = m.map_or((d.map_pos(start, p.data_start), word), |m| (m.off, m.word));
        frags.extend_from_slice(&s.to_le_bytes());
        frags.extend_from_slice(&w.to_le_bytes());
        frags.extend_from_slice(&0u32.to_le_bytes());
    }
    let frag_raw = p.flags & UNCOMPRESSED_FRAGMENTS != 0; // as mksquashfs: -noF, not -noI
    let frag_index = meta::write_indexed(&frags, &mut comp, frag_raw, &mut out);
    let export_index = match &p.export {
        Some(refs) => {
            let mut b = Vec::with_capacity(refs.len() * 8);
            for &r in refs {
                b.extend_from_slice(&t.inode_map.inode_ref(r)?.to_le_bytes());
            }
            meta::write_indexed(&b, &mut comp, raw, &mut out)
        }
        None => super::layout::INVALID,
    };
    let id_raw = p.flags & UNCOMPRESSED_IDS != 0;
    let id_index = meta::write_indexed(&p.ids, &mut comp, id_raw, &mut out);
    let xattr = xattrs(img, p, &mut out);
    let root = t.inode_map.inode_ref(p.root)?;
    let used = out.len() as u64;
    for (field, v) in [
        (at::ROOT, root),
        (at::BYTES_USED, used),
        (at::ID, id_index),
        (at::XATTR, xattr),
        (at::INODES, inode_start),
        (at::DIRS, dir_start),
        (at::FRAGMENTS, frag_index),
        (at::EXPORT, export_index),
    ] {
        put(&mut out, field, v, 8);
    }
    Ok(out)
}

/// Append the xattr tables (copied; header and index moved); returns the header's position.
fn xattrs(img: &[u8], p: &Parsed, out: &mut Vec<u8>) -> u64 {
    let Some(x) = &p.xattrs else {
        return super::layout::INVALID;
    };
    let new_kv = out.len() as u64;
    out.extend_from_slice(&img[x.kv_start as usize..x.header as usize]);
    let header = out.len() as u64;
    out.extend_from_slice(&new_kv.to_le_bytes());
    out.extend_from_slice(&x.ids.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for &i in &x.index {
        out.extend_from_slice(&(i - x.kv_start + new_kv).to_le_bytes());
    }
    header
}
