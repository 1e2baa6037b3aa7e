//! The applier: streams a patch's target bytes, in order, reading the base at random offsets.
//!
//! It checks the base (size, then sha256) and the compressor identity before the first byte
//! is emitted, caps every length it reads (see `ops`), never emits past the target's size, and
//! checks the emitted bytes' size and sha256 at the end. The node verifies every chunk it
//! writes against the signed chunk index as well, so the applier need not be trusted, only
//! deterministic and bounded: it holds at most one op's reference (≤ 48 MiB) and output
//! (≤ 16 MiB) in memory.
//!
//! A resumed stage ([`apply_needed`]) skips every op whose output the target already holds:
//! the op is still decoded (and a Data op's verbatim bytes read past), so a malformed patch
//! fails as before, but nothing is decompressed or recompressed for it. After `kill -9` in the
//! apply, the next run therefore redoes at most the ops whose output reaches a chunk not yet
//! written (the op in flight).

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
    /// Ops skipped because the caller already holds their output ([`apply_needed`]).
    pub skipped_ops: u64,
    /// Bytes of output those ops would have emitted.
    pub skipped_bytes: u64,
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

/// Where the target's bytes go: each piece with its offset in the target.
pub type Sink<'s> = &'s mut dyn FnMut(u64, &[u8]) -> io::Result<()>;

/// The emitting end: counts, hashes and refuses bytes past the target's size.
struct Out<'s> {
    sink: Sink<'s>,
    hash: Sha256,
    /// The target's offset of the next byte (emitted or skipped).
    emitted: u64,
    limit: u64,
}

impl Out<'_> {
    fn fits(&self, n: u64) -> Result<(), String> {
        match self.emitted.checked_add(n) {
            Some(end) if end <= self.limit => Ok(()),
            _ => Err(format!(
                "emits past the target's {} bytes (at {}, {n} more)",
                self.limit, self.emitted
            )),
        }
    }

    fn emit(&mut self, b: &[u8]) -> Result<(), String> {
        self.fits(b.len() as u64)?;
        self.hash.update(b);
        let at = self.emitted;
        self.emitted += b.len() as u64;
        (self.sink)(at, b).map_err(|e| format!("write to the sink: {e}"))
    }

    /// Pass over `n` bytes the caller holds (nothing is emitted or hashed).
    fn skip(&mut self, n: u64) -> Result<(), String> {
        self.fits(n)?;
        self.emitted += n;
        Ok(())
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
    apply_needed(patch, base, &|_| true, &mut |_, b| sink(b))
}

/// [`apply`] for a caller that already holds part of the target (a resumed stage): an op
/// whose output range `needed` does not want is decoded but not run, its bytes neither
/// emitted nor hashed; `sink` gets every emitted piece with its offset in the target. The
/// target's sha256 is checked at the end only when nothing was skipped (its size always).
pub fn apply_needed(
    patch: &mut impl Read,
    base: Base<'_>,
    needed: &dyn Fn(std::ops::Range<u64>) -> bool,
    sink: Sink<'_>,
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
        let len = op.output_len();
        let res = if len > 0 && !needed(out.emitted..out.emitted.saturating_add(len)) {
            st.skipped_ops += 1;
            st.skipped_bytes += len;
            skip(&op, &mut r, &mut out).map_err(Fail::Msg)
        } else {
            ctx.run(index, op, &mut r, &mut out, &mut st)
        };
        res.map_err(|e| match e {
            Fail::Msg(what) => err(what),
            Fail::Patch(p) => p,
        })?;
    }
    st.bytes = out.emitted;
    st.patch_bytes = r.at;
    let found: [u8; 32] = out.hash.finalize().into();
    let hashed = st.skipped_bytes == 0;
    if out.emitted != h.target_size || (hashed && found != h.target_sha256) {
        return Err(PatchError::WrongOutput {
            expected_size: h.target_size,
            expected_sha256: hex::encode(h.target_sha256),
            found_size: out.emitted,
            found_sha256: if hashed {
                hex::encode(found)
            } else {
                "(not hashed: ops skipped)".into()
            },
        });
    }
    Ok(st)
}

/// Pass over `op` without running it: its output is skipped, a Data op's verbatim bytes read
/// past.
fn skip(op: &Op, r: &mut impl Read, out: &mut Out<'_>) -> Result<(), String> {
    if let Op::Data { blocks, .. } = op {
        for (i, b) in blocks.iter().enumerate() {
            if b.word & VERBATIM != 0 {
                let size = u64::from(b.word & SIZE_MASK);
                let n = io::copy(&mut r.take(size), &mut io::sink())
                    .map_err(|e| format!("block {i}'s {size} verbatim bytes: {e}"))?;
                if n != size {
                    return Err(format!(
                        "block {i}'s {size} verbatim bytes: the patch ends after {n}"
                    ));
                }
            }
        }
    }
    out.skip(op.output_len())
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
            } => {
                self.decode_data(&refs, &blocks, &frame)?;
                let done = self.recompress(&blocks);
                self.emit_blocks(index, &blocks, done, r, out, st)?;
            }
        }
        Ok(())
    }

    /// A Data op's first half: decompress the refs into the reference, then decode the frame
    /// against it into `self.data` (the target blocks' uncompressed bytes).
    fn decode_data(
        &mut self,
        refs: &[BlockRef],
        blocks: &[TargetBlock],
        frame: &[u8],
    ) -> Result<(), Fail> {
        let mut reference = std::mem::take(&mut self.reference);
        reference.clear();
        let mut stored = std::mem::take(&mut self.stored);
        let res = self.fill_reference(refs, &mut reference, &mut stored);
        self.stored = stored;
        let total: usize = blocks.iter().map(|b| b.ulen as usize).sum();
        let res = res.and_then(|()| {
            decompress_from(&reference, frame, total, &mut self.data).map_err(Fail::Msg)
        });
        self.reference = reference;
        res
    }

    /// The refs' uncompressed bytes, in order, into `reference` (`stored`: scratch).
    fn fill_reference(
        &mut self,
        refs: &[BlockRef],
        reference: &mut Vec<u8>,
        stored: &mut Vec<u8>,
    ) -> Result<(), Fail> {
        for (i, b) in refs.iter().enumerate() {
            let size = (b.word & SIZE_MASK) as usize;
            if b.word == 0 {
                reference.resize(reference.len() + b.ulen as usize, 0);
                continue;
            }
            self.read_base(b.off, size, stored)?;
            if b.word & STORED != 0 {
                reference.extend_from_slice(stored);
                continue;
            }
            let n = self
                .decomp
                .decompress_into(stored, b.ulen as usize, reference)
                .map_err(|e| format!("ref {i} at base {}: {e}", b.off))?;
            if n != b.ulen as usize {
                return Err(format!(
                    "ref {i} at base {} decompressed to {n} bytes, the op says {}",
                    b.off, b.ulen
                )
                .into());
            }
        }
        Ok(())
    }

    /// Recompress every block of `self.data` that needs it, in parallel; by block index.
    fn recompress(&mut self, blocks: &[TargetBlock]) -> Vec<(usize, Option<Vec<u8>>)> {
        if self.comps.is_empty() {
            self.comps = (0..workers())
                .map(|_| BlockCompressor::new(self.level))
                .collect();
        }
        let mut jobs = Vec::new();
        let mut pos = 0usize;
        for (i, b) in blocks.iter().enumerate() {
            let end = pos + b.ulen as usize;
            if b.word != 0 && b.word & (STORED | VERBATIM) == 0 {
                jobs.push((i, pos..end));
            }
            pos = end;
        }
        compress_all(&mut self.comps, &self.data, &jobs)
    }

    /// A Data op's second half: emit each target block in order — recompressed (`done`), raw,
    /// verbatim from the patch, or nothing (sparse).
    fn emit_blocks(
        &mut self,
        index: u64,
        blocks: &[TargetBlock],
        done: Vec<(usize, Option<Vec<u8>>)>,
        r: &mut impl Read,
        out: &mut Out<'_>,
        st: &mut ApplyStats,
    ) -> Result<(), Fail> {
        let mut done = done.into_iter();
        let mut pos = 0usize;
        for (i, b) in blocks.iter().enumerate() {
            let content = &self.data[pos..pos + b.ulen as usize];
            pos += b.ulen as usize;
            let size = b.word & SIZE_MASK;
            if b.word & VERBATIM != 0 {
                self.stored.clear();
                self.stored.resize(size as usize, 0);
                r.read_exact(&mut self.stored)
                    .map_err(|e| format!("block {i}'s {size} verbatim bytes: {e}"))?;
                out.emit(&self.stored)?;
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
        Ok(())
    }
}
