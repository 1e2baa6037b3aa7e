//! The walk of an image's inode and directory tables (decoded, see `meta`) from the root
//! inode: every field the re-pack rewrites, as positions in the decoded streams.

use std::collections::HashSet;

use super::meta::Stream;

const NO_FRAGMENT: u32 = 0xffff_ffff;

/// A regular file inode (types 2 and 9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSite {
    /// Position of the inode in the inode stream.
    pub at: usize,
    /// Type 9 (64-bit start, its block list at +56) rather than 2 (32-bit, at +32).
    pub ext: bool,
    /// Offset of its first block in the image.
    pub start: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Its blocks' size words.
    pub words: Vec<u32>,
}

impl FileSite {
    /// Position of its block list in the inode stream.
    pub fn words_at(&self) -> usize {
        self.at + if self.ext { 56 } else { 32 }
    }

    /// Uncompressed length of block `i`.
    pub fn ulen(&self, i: usize, block_size: u32) -> u64 {
        let bs = u64::from(block_size);
        self.size.saturating_sub(i as u64 * bs).min(bs)
    }
}

/// What the re-pack rewrites in the inode and directory tables.
#[derive(Debug, Default)]
pub struct Sites {
    /// Regular files with at least one block.
    pub files: Vec<FileSite>,
    /// u32 fields of the inode stream holding a directory table block offset (a directory
    /// inode's listing start, an extended directory's index entries).
    pub dir_refs: Vec<usize>,
    /// u32 fields of the directory stream holding an inode table block offset (each listing
    /// header's start).
    pub inode_refs: Vec<usize>,
}

fn get(b: &[u8], at: usize, n: usize, what: &str) -> Result<u64, String> {
    let s = b
        .get(at..at.saturating_add(n))
        .ok_or_else(|| format!("{what} at {at} runs past its table ({} bytes)", b.len()))?;
    Ok(s.iter().rev().fold(0u64, |v, &x| (v << 8) | u64::from(x)))
}

/// Walk from `root` (an inode reference) over `inodes` and `dirs`.
pub fn walk(inodes: &Stream, dirs: &Stream, root: u64, block_size: u32) -> Result<Sites, String> {
    let mut sites = Sites::default();
    let mut seen = HashSet::new();
    let mut stack = vec![(root, String::new())];
    while let Some((r, path)) = stack.pop() {
        let at = inodes
            .upos(r >> 16, (r & 0xffff) as usize)
            .map_err(|e| format!("inode of {path:?}: {e}"))?;
        if !seen.insert(at) {
            continue; // a hard link: rewritten once
        }
        let b = &inodes.bytes;
        let kind = get(b, at, 2, "inode type")? as u16;
        match kind {
            1 | 8 => {
                let (block, offset, size) = dir_inode(b, at, kind, &mut sites)?;
                let children = listing(dirs, block, offset, size, &path, &mut sites)?;
                stack.extend(children.into_iter().rev());
            }
            2 | 9 => {
                let f = file_inode(b, at, kind == 9, block_size)
                    .map_err(|e| format!("{path:?}: {e}"))?;
                if !f.words.is_empty() {
                    sites.files.push(f);
                }
            }
            3..=7 | 10..=14 => {}
            k => return Err(format!("{path:?}: unknown inode type {k} at {at}")),
        }
    }
    Ok(sites)
}

/// A directory inode's listing (block, offset, size); records its directory references.
fn dir_inode(
    b: &[u8],
    at: usize,
    kind: u16,
    sites: &mut Sites,
) -> Result<(u64, usize, u64), String> {
    if kind == 1 {
        sites.dir_refs.push(at + 16);
        return Ok((
            get(b, at + 16, 4, "directory start")?,
            get(b, at + 26, 2, "directory offset")? as usize,
            get(b, at + 24, 2, "directory size")?,
        ));
    }
    sites.dir_refs.push(at + 24);
    let count = get(b, at + 32, 2, "directory index count")?;
    let mut p = at + 40;
    for _ in 0..count {
        get(b, p + 4, 4, "directory index start")?;
        sites.dir_refs.push(p + 4);
        let name = get(b, p + 8, 4, "directory index name size")? as usize + 1;
        p += 12 + name;
    }
    Ok((
        get(b, at + 24, 4, "directory start")?,
        get(b, at + 34, 2, "directory offset")? as usize,
        get(b, at + 20, 4, "directory size")?,
    ))
}

fn file_inode(b: &[u8], at: usize, ext: bool, block_size: u32) -> Result<FileSite, String> {
    let (start, fragment, size) = if ext {
        (
            get(b, at + 16, 8, "file start")?,
            get(b, at + 44, 4, "file fragment")? as u32,
            get(b, at + 24, 8, "file size")?,
        )
    } else {
        (
            get(b, at + 16, 4, "file start")?,
            get(b, at + 20, 4, "file fragment")? as u32,
            get(b, at + 28, 4, "file size")?,
        )
    };
    let bs = u64::from(block_size);
    let n = if fragment == NO_FRAGMENT {
        size.div_ceil(bs)
    } else {
        size / bs
    };
    let mut f = FileSite {
        at,
        ext,
        start,
        size,
        words: Vec::new(),
    };
    let w = f.words_at();
    if n > (b.len() / 4) as u64 {
        return Err(format!(
            "{size} bytes in {n} blocks, more than its table holds"
        ));
    }
    f.words = (0..n as usize)
        .map(|i| get(b, w + 4 * i, 4, "block list").map(|v| v as u32))
        .collect::<Result<_, _>>()?;
    Ok(f)
}

/// A directory listing's children as (inode reference, path); records its headers' inode
/// references.
fn listing(
    dirs: &Stream,
    block: u64,
    offset: usize,
    size: u64,
    path: &str,
    sites: &mut Sites,
) -> Result<Vec<(u64, String)>, String> {
    let start = dirs
        .upos(block, offset)
        .map_err(|e| format!("listing of {path:?}: {e}"))?;
    if size <= 3 {
        return Ok(Vec::new());
    }
    let end = start
        .checked_add((size - 3) as usize)
        .filter(|&e| e <= dirs.bytes.len())
        .ok_or_else(|| format!("listing of {path:?} ({size} bytes) runs past the table"))?;
    let b = &dirs.bytes[..end];
    let mut out = Vec::new();
    let mut at = start;
    while at + 12 <= end {
        let count = get(b, at, 4, "listing header")? + 1;
        let iblock = get(b, at + 4, 4, "listing header")?;
        sites.inode_refs.push(at + 4);
        at += 12;
        for _ in 0..count {
            let off = get(b, at, 2, "directory entry")?;
            let name_len = get(b, at + 6, 2, "directory entry")? as usize + 1;
            let name = b
                .get(at + 8..at + 8 + name_len)
                .ok_or_else(|| format!("{path:?}: an entry's name runs past the listing"))?;
            let name = String::from_utf8_lossy(name);
            out.push(((iblock << 16) | off, format!("{path}/{name}")));
            at += 8 + name_len;
        }
    }
    if at != end {
        return Err(format!(
            "listing of {path:?} ends at {at}, its inode says {end}"
        ));
    }
    Ok(out)
}
