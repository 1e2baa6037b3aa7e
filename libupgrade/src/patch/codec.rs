//! The zstd calls patches use: patch-from frames (a reference as raw-content prefix), plain
//! frames, and the recompression of squashfs blocks exactly as mksquashfs makes them.
//!
//! # The fuzzer's stack-use-after-scope in zstd 1.5.4 (issue 35): not a zstd bug
//! `just fuzz`'s `patch` target reported an AddressSanitizer "stack-use-after-scope" read in
//! `ZSTD_selectBtGetAllMatches` (`zstd_opt.c:886`) under [`BlockCompressor::compress`] at level
//! 15. The address was inside a *global* (ASan: "global variable 'getAllMatchesFns' defined in
//! zstd_opt.c:878"), the function-local `const` table of match finders. Under `cargo fuzz
//! --sanitizer address`, cc-rs compiles zstd-sys's C with GCC 12 and `-fsanitize=address`, and
//! zstd-sys adds `-fmerge-all-constants`, which puts that local `const` array in static storage;
//! GCC's use-after-scope instrumentation still poisons it when its scope ends, so the *second*
//! block compressed with the optimal parser in a process reads a poisoned global. Reproduced
//! without Rust (zstd 1.5.4's sources built with those flags, one `ZSTD_compressCCtx` at level
//! 15 on 128 KiB, twice: the second call is reported) and gone with
//! `-fno-merge-all-constants` or `-fno-sanitize-address-use-after-scope`. The read is in
//! bounds (`dictMode < 3`, `mls - 3 < 4`) of a constant table, so a node's build (no ASan)
//! has no undefined behaviour here; a newer `zstd_opt.c` read for this (the
//! `ZSTD_MatchState_t` spelling of 1.5.7) keeps the same local table, so a version move would
//! not remove the report either. The fix is
//! the fuzz build's flags (`fuzz/run.sh`: `-fno-merge-all-constants`, after the crate's own),
//! not this call or the pinned version (which would change the compressor identity).

use zstd_safe::{CCtx, CParameter, DCtx};

/// Level of the builder's patch-from and literal frames (the node only decodes them).
pub const DIFF_LEVEL: i32 = 19;

/// This build's zstd version for people (`1.5.4`).
pub fn zstd_version() -> String {
    let v = zstd_safe::version_number();
    format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
}

/// The identity of this build's block compressor at `level`: what a squashfs patch's header
/// must name for this build to apply it (see the module docs of [`crate::patch`]).
pub fn identity(level: i32) -> String {
    format!("zstd {} level {level}", zstd_safe::version_number())
}

fn code_name(code: usize) -> &'static str {
    zstd_safe::get_error_name(code)
}

/// A zstd frame of `data`, with `reference` as prefix when non-empty (what
/// `zstd --patch-from` does): long-distance matching and a window covering both.
pub fn compress_from(reference: &[u8], data: &[u8]) -> Result<Vec<u8>, &'static str> {
    let mut cctx = CCtx::create();
    let span = (reference.len() + data.len()).max(1 << 10) as u64;
    let window_log = (64 - (span - 1).leading_zeros()).clamp(10, 30);
    cctx.set_parameter(CParameter::CompressionLevel(DIFF_LEVEL))
        .map_err(code_name)?;
    cctx.set_parameter(CParameter::WindowLog(window_log))
        .map_err(code_name)?;
    cctx.set_parameter(CParameter::EnableLongDistanceMatching(true))
        .map_err(code_name)?;
    cctx.set_parameter(CParameter::ContentSizeFlag(false))
        .map_err(code_name)?;
    cctx.set_parameter(CParameter::ChecksumFlag(false))
        .map_err(code_name)?;
    if !reference.is_empty() {
        cctx.ref_prefix(reference).map_err(code_name)?;
    }
    let mut out = Vec::with_capacity(zstd_safe::compress_bound(data.len()));
    cctx.compress2(&mut out, data).map_err(code_name)?;
    Ok(out)
}

/// Decode a frame made by [`compress_from`] with the same `reference` into `out` (cleared),
/// which must end up exactly `len` bytes long.
pub fn decompress_from(
    reference: &[u8],
    frame: &[u8],
    len: usize,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let mut dctx = DCtx::create();
    dctx.set_parameter(zstd_safe::DParameter::WindowLogMax(31))
        .map_err(|c| code_name(c).to_string())?;
    if !reference.is_empty() {
        dctx.ref_prefix(reference)
            .map_err(|c| code_name(c).to_string())?;
    }
    out.clear();
    out.reserve_exact(len);
    let n = dctx
        .decompress(out, frame)
        .map_err(|c| format!("zstd: {}", code_name(c)))?;
    if n != len {
        return Err(format!("decoded {n} bytes, the op announces {len}"));
    }
    Ok(())
}

/// Compresses squashfs blocks the way mksquashfs' zstd wrapper does
/// (`ZSTD_compressCCtx(.., level)`, output capped at the input's size; a block that does not
/// shrink is stored raw).
pub struct BlockCompressor {
    cctx: CCtx<'static>,
    level: i32,
    buf: Vec<u8>,
}

impl BlockCompressor {
    /// A compressor at `level`.
    pub fn new(level: i32) -> Self {
        BlockCompressor {
            cctx: CCtx::create(),
            level,
            buf: Vec::new(),
        }
    }

    /// The compressed form of `block`, or `None` when it does not shrink (mksquashfs then
    /// stores it raw).
    pub fn compress(&mut self, block: &[u8]) -> Option<&[u8]> {
        self.buf.clear();
        self.buf.reserve(block.len());
        match self.cctx.compress(&mut self.buf, block, self.level) {
            Ok(n) if n < block.len() => Some(&self.buf[..n]),
            _ => None,
        }
    }
}

/// Decompresses squashfs blocks and metadata blocks (zstd frames).
pub struct BlockDecompressor {
    dctx: DCtx<'static>,
    buf: Vec<u8>,
}

impl BlockDecompressor {
    /// A decompressor.
    pub fn new() -> Self {
        BlockDecompressor {
            dctx: DCtx::create(),
            buf: Vec::new(),
        }
    }

    /// Decode `block` (at most `cap` bytes of output) and append it to `out`.
    pub fn decompress_into(
        &mut self,
        block: &[u8],
        cap: usize,
        out: &mut Vec<u8>,
    ) -> Result<usize, String> {
        self.buf.clear();
        self.buf.reserve_exact(cap);
        let n = self
            .dctx
            .decompress(&mut self.buf, block)
            .map_err(|c| format!("zstd: {}", code_name(c)))?;
        if n > cap {
            return Err(format!(
                "decoded {n} bytes, more than the {cap} a block holds"
            ));
        }
        out.extend_from_slice(&self.buf[..n]);
        Ok(n)
    }
}

impl Default for BlockDecompressor {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_pinned_zstd_names_itself_as_people_and_headers_do() {
        assert_eq!(super::zstd_version(), "1.5.4");
        assert_eq!(super::identity(15), "zstd 10504 level 15");
    }
}
