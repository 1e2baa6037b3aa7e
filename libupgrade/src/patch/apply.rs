//! The applier: streams a patch's target bytes, in order, reading the base at random offsets.
//!
//! It checks the base (size, then sha256) and the compressor identity before the first byte
//! is emitted, caps every length it reads (see `ops`), never emits past the target's size, and
//! checks the emitted bytes' size and sha256 at the end. The node verifies every chunk it
//! writes against the signed chunk index as well, so the applier need not be trusted, only
//! deterministic and bounded: it holds at most one op's reference (≤ 48 MiB) and output
//! (≤ 16 MiB) in memory.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

use sha2::{Digest, Sha256};

use super::codec::{decompress_from, BlockCompressor, BlockDecompressor};
use super::header::{can_apply, read_header, PatchHeader};
use super::ops::{decode, BlockRef, Op, TargetBlock, SIZE_MASK, STORED, VERBATIM};
use super::PatchError;

/// What [`apply`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyStats {
    /// Bytes emitted (the target's size).
    pub bytes: u64,
    /// Bytes of the patch read, header included.
    pub patch_bytes: u64,
    /// Bytes emitted straight from the base (Copy ops).
    pub copied: u64,
    /// Ops applied, End excluded.
    pub ops: u64,
    /// squashfs blocks recompressed (Data ops).
    pub recompressed: u64,
    /// squashfs blocks carried verbatim (Data ops).
    pub verbatim: u64,
}

/// Counts what is read from the patch.
struct Counted<'r, R> {
    inner: &'r mut R,
    at: u64,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// The emitting end: counts, hashes and refuses bytes past the target's size.
struct Out<'s> {
    sink: &'s mut dyn FnMut(&[u8]) -> io::Result<()>,
    hash: Sha256,
    emitted: u64,
    limit: u64,
}

impl Out<'_> {
    fn emit(&mut self, b: &[u8]) -> Result<(), String> {
        if self.emitted + b.len() as u64 > self.limit {
            return Err(format!(
                "emits past the target's {} bytes (at {}, {} more)",
                self.limit,
                self.emitted,
                b.len()
            ));
        }
        self.hash.update(b);
        self.emitted += b.len() as u64;
        (self.sink)(b).map_err(|e| format!("write to the sink: {e}"))
    }
}

/// Where the applier reads its base: `len` bytes of `file` from `offset` (a slot partition
/// holds its squashfs from byte 0 and is larger than it; a block device reports no length).
/// Read only.
#[derive(Debug, Clone, Copy)]
pub struct Base<'a> {
    /// The file or block device.
    pub file: &'a File,
    /// Where the base starts in it.
    pub offset: u64,
    /// The base's length.
    pub len: u64,
}

impl<'a> Base<'a> {
    /// All of `file` (its length from its metadata).
    pub fn whole(file: &'a File) -> Result<Base<'a>, PatchError> {
        let len = file
            .metadata()
            .map_err(|e| PatchError::io("stat the base", e))?
            .len();
        Ok(Base {
            file,
            offset: 0,
            len,
        })
    }

    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, self.offset + pos)
    }
}

/// Check that `base` is the base `h` names: size first, then sha256.
pub fn check_base(h: &PatchHeader, base: Base<'_>) -> Result<(), PatchError> {
    let size = base.len;
    let wrong = |found_sha256: String| PatchError::WrongBase {
        expected_size: h.base_size,
        expected_sha256: hex::encode(h.base_sha256),
        found_size: size,
        found_sha256,
    };
    if size != h.base_size {
        return Err(wrong(String::new()));
    }
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos < size {
        let n = (size - pos).min(buf.len() as u64) as usize;
        base.read_at(&mut buf[..n], pos)
            .map_err(|e| PatchError::io(format!("read the base at {pos}"), e))?;
        hash.update(&buf[..n]);
        pos += n as u64;
    }
    let found: [u8; 32] = hash.finalize().into();
    if found != h.base_sha256 {
        return Err(wrong(hex::encode(found)));
    }
    Ok(())
}

/// Streams the target's bytes, in order, to `sink`, reading `base` at random offsets (read
/// only).
///
/// Refuses, before the first byte, a patch of another format version, a compressor this build
/// does not reproduce ([`PatchError::Compressor`]) and a base of another size or sha256
/// ([`PatchError::WrongBase`]). A malformed op stops it with [`PatchError::Op`]; bytes already
/// emitted stay emitted (the caller verifies what it writes).
pub fn apply(
    patch: &mut impl Read,
    base: Base<'_>,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<ApplyStats, PatchError> {
    let mut r = Counted {
        inner: patch,
        at: 0,
    };
    let h = read_header(&mut r)?;
    can_apply(&h)?;
    check_base(&h, base)?;
    let mut out = Out {
        sink,
        hash: Sha256::new(),
        emitted: 0,
        limit: h.target_size,
    };
    let mut st = ApplyStats::default();
    let mut ctx = Ctx::new(&h, base);
    for index in 0u64.. {
        let at = r.at;
        let err = |what: String| PatchError::Op {
            op: index,
            at,
            what,
        };
        let op = decode(&mut r, h.block_size).map_err(err)?;
        if op == Op::End {
            break;
        }
        st.ops += 1;
        ctx.run(index, op, &mut r, &mut out, &mut st)
            .map_err(|e| match e {
                Fail::Msg(what) => err(what),
                Fail::Patch(p) => p,
            })?;
    }
    st.bytes = out.emitted;
    st.patch_bytes = r.at;
    let found: [u8; 32] = out.hash.finalize().into();
    if out.emitted != h.target_size || found != h.target_sha256 {
        return Err(PatchError::WrongOutput {
            expected_size: h.target_size,
            expected_sha256: hex::encode(h.target_sha256),
            found_size: out.emitted,
            found_sha256: hex::encode(found),
        });
    }
    Ok(st)
}

enum Fail {
    Msg(String),
    Patch(PatchError),
}

impl From<String> for Fail {
    fn from(s: String) -> Self {
        Fail::Msg(s)
    }
}

/// Buffers reused across ops.
struct Ctx<'b> {
    base: Base<'b>,
    base_size: u64,
    level: i32,
    reference: Vec<u8>,
    data: Vec<u8>,
    stored: Vec<u8>,
    /// One block compressor per worker thread (created on the first Data op).
    comps: Vec<BlockCompressor>,
    decomp: BlockDecompressor,
}

/// Most threads that recompress a Data op's blocks.
const MAX_WORKERS: usize = 4;

/// Threads that recompress a Data op's blocks on this machine: its available parallelism,
/// at most 4.
pub fn workers() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_WORKERS)
}

/// Compress `jobs` (block index, its bytes in `data`) with the `comps`, one thread each;
/// returns the compressed bytes by block index (`None`: did not shrink).
fn compress_all(
    comps: &mut [BlockCompressor],
    data: &[u8],
    jobs: &[(usize, std::ops::Range<usize>)],
) -> Vec<(usize, Option<Vec<u8>>)> {
    let run = |comp: &mut BlockCompressor, part: &[(usize, std::ops::Range<usize>)]| {
        part.iter()
            .map(|(i, r)| (*i, comp.compress(&data[r.clone()]).map(<[u8]>::to_vec)))
            .collect::<Vec<_>>()
    };
    if comps.len() == 1 || jobs.len() < 2 {
        return run(&mut comps[0], jobs);
    }
    let per = jobs.len().div_ceil(comps.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = comps
            .iter_mut()
            .zip(jobs.chunks(per))
            .map(|(comp, part)| s.spawn(move || run(comp, part)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a compressor thread panicked"))
            .collect()
    })
}

impl<'b> Ctx<'b> {
    fn new(h: &PatchHeader, base: Base<'b>) -> Self {
        Ctx {
            base,
            base_size: h.base_size,
            level: h.level,
            reference: Vec::new(),
            data: Vec::new(),
            stored: Vec::new(),
            comps: Vec::new(),
            decomp: BlockDecompressor::new(),
        }
    }

    fn read_base(&self, off: u64, len: usize, buf: &mut Vec<u8>) -> Result<(), String> {
        if off
            .checked_add(len as u64)
            .is_none_or(|end| end > self.base_size)
        {
            return Err(format!(
                "base range {off}+{len} is past the base's {} bytes",
                self.base_size
            ));
        }
        buf.clear();
        buf.resize(len, 0);
        self.base
            .read_at(buf, off)
            .map_err(|e| format!("read {len} base bytes at {off}: {e}"))
    }

    fn run(
        &mut self,
        index: u64,
        op: Op,
        r: &mut impl Read,
        out: &mut Out<'_>,
        st: &mut ApplyStats,
    ) -> Result<(), Fail> {
        match op {
            Op::End => {}
            Op::Copy { base_off, len } => {
                let mut pos = 0u64;
                let mut buf = std::mem::take(&mut self.stored);
                while pos < len {
                    let n = (len - pos).min(1 << 20) as usize;
                    self.read_base(base_off.saturating_add(pos), n, &mut buf)?;
                    out.emit(&buf)?;
                    pos += n as u64;
                }
                self.stored = buf;
                st.copied += len;
            }
            Op::Literal { len, frame } => {
                decompress_from(&[], &frame, len as usize, &mut self.data)?;
                out.emit(&self.data)?;
            }
            Op::Delta {
                base_off,
                base_len,
                len,
                frame,
            } => {
                let mut reference = std::mem::take(&mut self.reference);
                self.read_base(base_off, base_len as usize, &mut reference)?;
                let res = decompress_from(&reference, &frame, len as usize, &mut self.data);
                self.reference = reference;
                res?;
                out.emit(&self.data)?;
            }
            Op::Data {
                refs,
                blocks,
                frame,
            } => self.data_op(index, &refs, &blocks, &frame, r, out, st)?,
        }
        Ok(())
    }

    /// Decompress the refs into the reference, decode the frame against it, then emit each
    /// target block: recompressed, raw, verbatim from the patch, or nothing (sparse).
    #[allow(clippy::too_many_arguments)]
    fn data_op(
        &mut self,
        index: u64,
        refs: &[BlockRef],
        blocks: &[TargetBlock],
        frame: &[u8],
        r: &mut impl Read,
        out: &mut Out<'_>,
        st: &mut ApplyStats,
    ) -> Result<(), Fail> {
        let mut reference = std::mem::take(&mut self.reference);
        reference.clear();
        let mut stored = std::mem::take(&mut self.stored);
        for (i, b) in refs.iter().enumerate() {
            let size = (b.word & SIZE_MASK) as usize;
            if b.word == 0 {
                reference.resize(reference.len() + b.ulen as usize, 0);
                continue;
            }
            self.read_base(b.off, size, &mut stored)?;
            if b.word & STORED != 0 {
                reference.extend_from_slice(&stored);
            } else {
                let n = self
                    .decomp
                    .decompress_into(&stored, b.ulen as usize, &mut reference)
                    .map_err(|e| format!("ref {i} at base {}: {e}", b.off))?;
                if n != b.ulen as usize {
                    return Err(format!(
                        "ref {i} at base {} decompressed to {n} bytes, the op says {}",
                        b.off, b.ulen
                    )
                    .into());
                }
            }
        }
        let total: usize = blocks.iter().map(|b| b.ulen as usize).sum();
        let res = decompress_from(&reference, frame, total, &mut self.data);
        self.reference = reference;
        res?;
        if self.comps.is_empty() {
            self.comps = (0..workers())
                .map(|_| BlockCompressor::new(self.level))
                .collect();
        }
        // Recompress every block that needs it (in parallel), then emit in order.
        let mut jobs = Vec::new();
        let mut pos = 0usize;
        for (i, b) in blocks.iter().enumerate() {
            let end = pos + b.ulen as usize;
            if b.word != 0 && b.word & (STORED | VERBATIM) == 0 {
                jobs.push((i, pos..end));
            }
            pos = end;
        }
        let mut done = compress_all(&mut self.comps, &self.data, &jobs).into_iter();
        let mut pos = 0usize;
        for (i, b) in blocks.iter().enumerate() {
            let content = &self.data[pos..pos + b.ulen as usize];
            pos += b.ulen as usize;
            let size = b.word & SIZE_MASK;
            if b.word & VERBATIM != 0 {
                stored.clear();
                stored.resize(size as usize, 0);
                r.read_exact(&mut stored)
                    .map_err(|e| format!("block {i}'s {size} verbatim bytes: {e}"))?;
                out.emit(&stored)?;
                st.verbatim += 1;
            } else if b.word == 0 {
                // A sparse block: squashfs stores nothing.
            } else if b.word & STORED != 0 {
                out.emit(content)?;
            } else {
                let c = match done.next() {
                    Some((j, c)) if j == i => c.unwrap_or_default(),
                    _ => unreachable!("compress_all returns the jobs in order"),
                };
                if c.len() != size as usize {
                    return Err(Fail::Patch(PatchError::NotReproduced {
                        op: index,
                        block: i,
                        expected: size,
                        found: c.len(),
                    }));
                }
                out.emit(&c)?;
                st.recompressed += 1;
            }
        }
        self.stored = stored;
        Ok(())
    }
}
