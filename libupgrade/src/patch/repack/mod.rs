//! Re-packing a publisher's squashfs so that every block is this build's zstd's (issue 35
//! item 1): `release create` publishes and signs the re-packed image, so a squashfs patch to
//! it reproduces every block on the node whatever libzstd made the publisher's image.
//!
//! # Why re-pack rather than carry corrections in the patch
//! A squashfs patch rebuilds a changed file's blocks on the node by compressing them again; a
//! block that the node's zstd (the pinned 1.5.4, see [`crate::patch`]) does not reproduce has
//! to travel whole. Measured (2026-12-05, see the module docs of [`crate::patch`]): of an image
//! made by mksquashfs with Debian 13's libzstd 1.5.7, 29 % of the changed files' blocks do not
//! come out identical from 1.5.4 at the same level; the outputs part right after the frame
//! header inside zstd's parser, which no parameter selects. Carrying per block what the node
//! needs was tried in its cheapest form, each such block as a patch-from of the node's own
//! recompression: 1.89 MB became 1.20 MB, still ~7× the same pair built with 1.5.4 (zstd's
//! entropy-coded output differs everywhere after the first different choice, so there is no
//! small correction). Re-packing instead makes every block of the published image one the node
//! reproduces, so the patch is the one a publisher on the pinned zstd would get. Its costs: the
//! publisher's `release create` decompresses and compresses every block once, and the published
//! image's bytes are not the publisher's file (its files, sizes, modes and layout are;
//! `release create` says so, `--keep-rootfs` opts out). The re-packed image is what gets signed
//! and staged; the publisher's original is only an input.
//!
//! Measured (`just bench-delta`, section `zstd`, one run 2026-12-05; the monthly pair, 123.5 MB,
//! `-no-fragments`, made by mksquashfs 4.5.1 loading Debian 13's libzstd 1.5.7): the squashfs
//! patch as made is 4.76 MB, 1.82× the 2.62 MB of the same pair made with 1.5.4 (77 blocks
//! carried whole); both images re-packed, 2.62 MB, 1.00×: the re-packed images are byte for
//! byte what mksquashfs makes with 1.5.4. The first release after a publisher moves to the
//! re-pack (v1 as made, v2 re-packed) gets 2.80 MB (1.07×), with every unchanged file rebuilt
//! on the node. 2,319 of the v2 image's 9,456 blocks changed. Re-pack time: 124–138 s per image
//! on one thread of 2 busy shared cores, about what mksquashfs took there on two; now on the
//! patch workers' threads, `release create` of the v2 image took 68 s (debug build) and 506 MiB
//! peak RSS: input, output and the self-check hold whole images in memory, as the builder does.
//!
//! # What is rewritten
//! The data region (every file's blocks and every fragment block, in their order; a block
//! stored raw stays raw, a compressed one is compressed again at the level the compressor
//! options name and stored raw when it does not shrink, as mksquashfs does), every file
//! inode's start and block list, the fragment table's entries, and then every metadata offset
//! that moved: the inode and directory tables are re-encoded with the same uncompressed block
//! boundaries, so an offset inside a block stays valid and only block positions move (the
//! root inode, listing headers, directory inodes and their index, the export table). Each of
//! the two tables names the other's block positions, so they are encoded until those agree
//! (in practice twice; after 8 rounds the directory table is stored uncompressed, whose block
//! sizes cannot move). The id table is re-encoded, the xattr tables copied with their header
//! and index moved. Superblock and compressor options keep their bytes, except the table
//! positions. On an image this zstd made, the output is the input byte for byte (tested).
//! The result is checked before it is written: `sqcheck`, and every file and fragment block
//! decoded from both images must be equal. Parsed by hand like the builder's reader
//! (`backhand` would link a second libzstd).

mod data;
mod layout;
mod meta;
mod tree;
mod write;

use std::path::Path;
use std::time::{Duration, Instant};

use super::codec::BlockDecompressor;
use super::ops::{SIZE_MASK, STORED};
use super::PatchError;

/// What [`repack`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepackStats {
    /// Data and fragment blocks re-packed.
    pub blocks: u64,
    /// Of those, blocks whose stored bytes changed: this build's zstd did not reproduce them.
    /// 0 means the image's blocks already are this build's (publishing the input is as good).
    pub changed: u64,
    /// The zstd level of the image (its compressor options), used again.
    pub level: i32,
    /// Bytes of the input image.
    pub size_in: u64,
    /// Bytes of the re-packed image.
    pub size_out: u64,
    /// Wall time, the self-check included.
    pub time: Duration,
}

/// Re-pack the zstd squashfs `input` into `output` (written whole, even when no block
/// changed; see [`RepackStats::changed`]). The output is checked before this returns: every
/// regular file and fragment block decodes to the input's bytes. An image that is not a zstd
/// squashfs 4.0, or that this parser refuses, is an error naming the image and the offset;
/// `output` is then not written.
pub fn repack(input: &Path, output: &Path) -> Result<RepackStats, PatchError> {
    let started = Instant::now();
    let img = std::fs::read(input).map_err(|source| PatchError::File {
        op: "read",
        path: input.to_path_buf(),
        source,
    })?;
    let fail = |what: String| PatchError::Squashfs {
        path: input.to_path_buf(),
        what,
    };
    let (out, mut stats) = repack_bytes(&img).map_err(fail)?;
    verify(&img, &out).map_err(|e| fail(format!("the re-packed image fails its check: {e}")))?;
    std::fs::write(output, &out).map_err(|source| PatchError::File {
        op: "write",
        path: output.to_path_buf(),
        source,
    })?;
    stats.time = started.elapsed();
    Ok(stats)
}

/// What [`for_release`] made of a publisher's rootfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rootfs {
    /// Re-packed into the output file: publish that.
    Repacked(RepackStats),
    /// Every block already is this build's zstd's: publish the input as it is.
    Unchanged(RepackStats),
    /// Not a zstd squashfs this parser takes (the reason): publish the input as it is; its
    /// squashfs patches carry whole the blocks the node does not reproduce.
    NotRepacked(String),
}

/// [`repack`] for `release create`: an image the re-pack refuses is published as given
/// (`NotRepacked`, with the reason), not an error; failing to read or write a file is.
pub fn for_release(input: &Path, output: &Path) -> Result<Rootfs, PatchError> {
    decide(repack(input, output))
}

/// The decision of [`for_release`] from the re-pack's result.
fn decide(r: Result<RepackStats, PatchError>) -> Result<Rootfs, PatchError> {
    match r {
        Ok(st) if st.changed == 0 => Ok(Rootfs::Unchanged(st)),
        Ok(st) => Ok(Rootfs::Repacked(st)),
        Err(e @ PatchError::Squashfs { .. }) => Ok(Rootfs::NotRepacked(e.to_string())),
        Err(e) => Err(e),
    }
}

/// The re-packed image of `img`.
pub(crate) fn repack_bytes(img: &[u8]) -> Result<(Vec<u8>, RepackStats), String> {
    let p = layout::parse(img)?;
    let runs = p
        .sites
        .files
        .iter()
        .map(|f| (f.start, f.words.clone()))
        .chain(p.fragments.iter().map(|&(s, w)| (s, vec![w])));
    let blocks = data::collect(runs)?;
    let d = data::repack(
        img,
        p.data_start..p.inode_start,
        &blocks,
        p.level,
        p.block_size,
    )?;
    let mut out = write::image(img, &p, &d)?;
    let used = out.len() as u64;
    if img.len() as u64 > p.bytes_used {
        out.resize(used.next_multiple_of(4096) as usize, 0); // mksquashfs' padding
    }
    let stats = RepackStats {
        blocks: d.moved.len() as u64,
        changed: d.changed,
        level: p.level,
        size_in: img.len() as u64,
        size_out: out.len() as u64,
        time: Duration::ZERO,
    };
    Ok((out, stats))
}

/// `new` lists the same files (in walk order, same sizes) and fragments as `old`, and every
/// block decodes to the same bytes; `sqcheck` accepts it.
fn verify(old: &[u8], new: &[u8]) -> Result<(), String> {
    crate::sqcheck::check(
        |pos, buf| {
            let s = new
                .get(pos as usize..pos as usize + buf.len())
                .ok_or_else(|| std::io::Error::other("past the image"))?;
            buf.copy_from_slice(s);
            Ok(())
        },
        new.len() as u64,
    )?;
    let (a, b) = (layout::parse(old)?, layout::parse(new)?);
    if a.sites.files.len() != b.sites.files.len() || a.fragments.len() != b.fragments.len() {
        return Err(format!(
            "{} files and {} fragments, the input has {} and {}",
            b.sites.files.len(),
            b.fragments.len(),
            a.sites.files.len(),
            a.fragments.len()
        ));
    }
    let mut dec = BlockDecompressor::new();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for (f, g) in a.sites.files.iter().zip(&b.sites.files) {
        if (f.size, f.words.len()) != (g.size, g.words.len()) {
            return Err(format!(
                "file inode at {}: size or block count differs",
                g.at
            ));
        }
        let (mut pa, mut pb) = (f.start, g.start);
        for (&wa, &wb) in f.words.iter().zip(&g.words) {
            plain(old, pa, wa, a.block_size, &mut dec, &mut x)?;
            plain(new, pb, wb, b.block_size, &mut dec, &mut y)?;
            if x != y {
                return Err(format!(
                    "the block at {pb} differs from the input's at {pa}"
                ));
            }
            pa += u64::from(wa & SIZE_MASK);
            pb += u64::from(wb & SIZE_MASK);
        }
    }
    for (&(sa, wa), &(sb, wb)) in a.fragments.iter().zip(&b.fragments) {
        plain(old, sa, wa, a.block_size, &mut dec, &mut x)?;
        plain(new, sb, wb, b.block_size, &mut dec, &mut y)?;
        if x != y {
            return Err(format!(
                "the fragment block at {sb} differs from the input's at {sa}"
            ));
        }
    }
    Ok(())
}

/// The uncompressed bytes of the block `word` at `off` of `img` into `out` (cleared).
fn plain(
    img: &[u8],
    off: u64,
    word: u32,
    block_size: u32,
    dec: &mut BlockDecompressor,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    out.clear();
    let len = u64::from(word & SIZE_MASK);
    let stored = img
        .get(off as usize..(off + len) as usize)
        .ok_or_else(|| format!("block at {off} of {len} bytes is past the image"))?;
    if word & STORED != 0 || len == 0 {
        out.extend_from_slice(stored);
        return Ok(());
    }
    dec.decompress_into(stored, block_size as usize, out)
        .map(|_| ())
        .map_err(|e| format!("block at {off}: {e}"))
}

#[cfg(test)]
mod tests;
