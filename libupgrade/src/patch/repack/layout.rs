//! An image taken apart for the re-pack: the superblock's fields, the compressor options, the
//! decoded inode and directory tables, the fragment, export and id tables' entries, and where
//! the xattr tables lie.

use byteorder::{ByteOrder, LittleEndian as LE};

use super::meta::{self, Stream};
use super::tree::{self, Sites};
use crate::patch::codec::BlockDecompressor;
use crate::patch::squashfs::{DEFAULT_LEVEL, ZSTD};

/// A table position the superblock marks as absent.
pub const INVALID: u64 = u64::MAX;
const COMPRESSOR_OPTIONS: u16 = 0x0400;
const EXPORTABLE: u16 = 0x0080;
/// Flag: inode and directory tables stored uncompressed (`mksquashfs -noI`).
pub const UNCOMPRESSED_INODES: u16 = 0x0001;
/// Flag: fragments and the fragment table stored uncompressed (`mksquashfs -noF`).
pub const UNCOMPRESSED_FRAGMENTS: u16 = 0x0008;
/// Flag: the id table stored uncompressed.
pub const UNCOMPRESSED_IDS: u16 = 0x0800;

/// Superblock field offsets the re-pack rewrites ([`crate::sqcheck`] reads them).
pub use crate::sqcheck::at;

fn u64_at(b: &[u8], o: usize) -> u64 {
    LE::read_u64(&b[o..])
}

/// The xattr tables: key/value blocks and id blocks copied as they are, their header and
/// index moved.
#[derive(Debug)]
pub struct Xattrs {
    /// Start of the key/value blocks (the copied region runs to the header).
    pub kv_start: u64,
    /// The header's position (the superblock's `xattr_id_table_start`).
    pub header: u64,
    /// Number of xattr ids.
    pub ids: u32,
    /// The id blocks' positions (the header's index).
    pub index: Vec<u64>,
}

/// Everything the re-pack reads of an image.
#[derive(Debug)]
pub struct Parsed {
    /// Superblock flags.
    pub flags: u16,
    /// zstd level of its blocks.
    pub level: i32,
    /// Data block size.
    pub block_size: u32,
    /// Root inode reference.
    pub root: u64,
    /// Where data blocks start (after the superblock and compressor options).
    pub data_start: u64,
    /// The inode table's start.
    pub inode_start: u64,
    /// The inode table, decoded.
    pub inodes: Stream,
    /// The directory table, decoded.
    pub dirs: Stream,
    /// What the walk found to rewrite.
    pub sites: Sites,
    /// Fragment entries: (start, size word).
    pub fragments: Vec<(u64, u32)>,
    /// The export table's inode references, when the image has one.
    pub export: Option<Vec<u64>>,
    /// The id table's bytes.
    pub ids: Vec<u8>,
    /// The xattr tables, when the image has them.
    pub xattrs: Option<Xattrs>,
    /// Bytes of the image in use, as its superblock says (what follows is padding).
    pub bytes_used: u64,
}

/// Take `img` apart. Errors are sentences with offsets.
pub fn parse(img: &[u8]) -> Result<Parsed, String> {
    let sb = crate::sqcheck::superblock_of(img)?;
    if sb.compression != ZSTD {
        return Err(format!(
            "compressor id {}, only zstd (6) images are re-packed",
            sb.compression
        ));
    }
    if sb.bytes_used > img.len() as u64 {
        return Err(format!(
            "superblock says {} bytes used, the image has {}",
            sb.bytes_used,
            img.len()
        ));
    }
    let flags = sb.flags;
    let mut dec = BlockDecompressor::new();
    let (level, data_start) = options(img, flags, &mut dec)?;
    let frag_count = sb.fragment_count as usize;
    let (frag_start, export_start) = (sb.fragment_table_start, sb.export_table_start);
    let xattrs = xattrs(img, sb.xattr_table_start)?;
    let dirs_end = dirs_end(img, &sb, frag_start, frag_count, export_start, &xattrs)?;
    let inodes = meta::read_run(
        img,
        sb.inode_table_start,
        sb.directory_table_start,
        &mut dec,
    )
    .map_err(|e| format!("inode table: {e}"))?;
    let dirs = meta::read_run(img, sb.directory_table_start, dirs_end, &mut dec)
        .map_err(|e| format!("directory table: {e}"))?;
    let sites = tree::walk(&inodes, &dirs, sb.root_inode, sb.block_size)?;
    let t = tail_tables(img, &sb, flags, frag_count, &mut dec)?;
    Ok(Parsed {
        flags,
        level,
        block_size: sb.block_size,
        root: sb.root_inode,
        data_start,
        inode_start: sb.inode_table_start,
        inodes,
        dirs,
        sites,
        fragments: t.fragments,
        export: t.export,
        ids: t.ids,
        xattrs,
        bytes_used: sb.bytes_used,
    })
}

/// The fragment, export and id tables' entries.
struct Tail {
    fragments: Vec<(u64, u32)>,
    export: Option<Vec<u64>>,
    ids: Vec<u8>,
}

fn tail_tables(
    img: &[u8],
    sb: &crate::sqcheck::Superblock,
    flags: u16,
    frag_count: usize,
    dec: &mut BlockDecompressor,
) -> Result<Tail, String> {
    let (frag_start, export_start) = (sb.fragment_table_start, sb.export_table_start);
    let fragments = if frag_count == 0 {
        Vec::new()
    } else {
        let (b, _) = meta::read_indexed(img, frag_start, frag_count * 16, dec)
            .map_err(|e| format!("fragment table: {e}"))?;
        b.chunks_exact(16)
            .map(|e| (u64_at(e, 0), LE::read_u32(&e[8..])))
            .collect()
    };
    let export = if flags & EXPORTABLE != 0 && export_start != INVALID {
        let n = sb.inode_count as usize * 8;
        let (b, _) = meta::read_indexed(img, export_start, n, dec)
            .map_err(|e| format!("export table: {e}"))?;
        Some(b.chunks_exact(8).map(|e| u64_at(e, 0)).collect())
    } else {
        None
    };
    let (ids, _) = meta::read_indexed(img, sb.id_table_start, usize::from(sb.id_count) * 4, dec)
        .map_err(|e| format!("id table: {e}"))?;
    Ok(Tail {
        fragments,
        export,
        ids,
    })
}

/// The zstd level (compressor options, or mksquashfs' default) and where data starts.
fn options(img: &[u8], flags: u16, dec: &mut BlockDecompressor) -> Result<(i32, u64), String> {
    if flags & COMPRESSOR_OPTIONS == 0 {
        return Ok((DEFAULT_LEVEL, 96));
    }
    let mut opts = Vec::new();
    let end =
        meta::block(img, 96, dec, &mut opts).map_err(|e| format!("compressor options: {e}"))?;
    let l = opts
        .get(..4)
        .ok_or("compressor options shorter than 4 bytes")?;
    Ok((LE::read_i32(l), end))
}

fn xattrs(img: &[u8], header: u64) -> Result<Option<Xattrs>, String> {
    if header == INVALID {
        return Ok(None);
    }
    let at = usize::try_from(header).map_err(|_| format!("xattr table at {header}"))?;
    let h = img
        .get(at..at.saturating_add(16))
        .ok_or_else(|| format!("xattr table header at {header} is past the image"))?;
    let kv_start = u64_at(h, 0);
    let ids = LE::read_u32(&h[8..]);
    let n = (ids as usize * 16).div_ceil(meta::METADATA_SIZE);
    let index = img
        .get(at + 16..(at + 16).saturating_add(n * 8))
        .ok_or_else(|| format!("xattr index at {} is past the image", header + 16))?;
    let index: Vec<u64> = index.chunks_exact(8).map(|p| u64_at(p, 0)).collect();
    if kv_start > header || index.iter().any(|&p| p < kv_start || p >= header) {
        return Err(format!(
            "xattr blocks ({kv_start}, index {index:?}) not between their start and header at {header}"
        ));
    }
    Ok(Some(Xattrs {
        kv_start,
        header,
        ids,
        index,
    }))
}

/// Where the directory table ends: at the first of the later tables (or their blocks).
fn dirs_end(
    img: &[u8],
    sb: &crate::sqcheck::Superblock,
    frag_start: u64,
    frag_count: usize,
    export_start: u64,
    xattrs: &Option<Xattrs>,
) -> Result<u64, String> {
    let first_ptr = |index: u64| -> Option<u64> {
        let at = usize::try_from(index).ok()?;
        img.get(at..at + 8).map(|p| u64_at(p, 0))
    };
    let mut c = vec![sb.id_table_start, frag_start, export_start];
    c.extend(first_ptr(sb.id_table_start));
    if frag_count > 0 {
        c.extend(first_ptr(frag_start));
    }
    if export_start != INVALID {
        c.extend(first_ptr(export_start));
    }
    if let Some(x) = xattrs {
        c.push(x.kv_start);
    }
    c.into_iter()
        .filter(|&p| p > sb.directory_table_start && p != INVALID)
        .min()
        .ok_or_else(|| "no table after the directory table".to_string())
}
