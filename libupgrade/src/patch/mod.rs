//! Per-pair patches: a release's artifact described in terms of one earlier release's
//! artifact (the node's running slot), built by the publisher, applied by the node.
//!
//! A patch is a header ([`PatchHeader`]: kind, base sha256 + size, target sha256 + size,
//! compressor identity) and a sequence of ops that emit the target's bytes in order
//! (`ops` documents the encoding). [`build`] writes one, [`apply`] streams the target's bytes
//! from one to a sink while reading the base at random offsets, in bounded memory.
//!
//! - [`PatchKind::Plain`] (kernel, initrd): the target in windows of 16 MiB, each a zstd
//!   patch-from frame (`zstd --patch-from`: long-distance matching, level 19) with a base
//!   window of up to 48 MiB around the same offsets as prefix — the whole base when it fits.
//! - [`PatchKind::Squashfs`] (the rootfs): described in terms of the base image's
//!   *uncompressed* file data, so that a changed byte does not cost its whole compressed block.
//!   Ops in target order: Copy (stored bytes the base has: unchanged files, also moved or
//!   renamed), Literal (bytes carried, zstd), Data (a file's blocks: the old file's blocks
//!   decompressed as reference, the new uncompressed bytes as a patch-from of it, split into
//!   the target's blocks and recompressed on the node at the recorded level, raw where the
//!   target stores them raw, carried verbatim where this build's compressor did not reproduce
//!   them). The old file is the base file of the same path, else of the same path with digits
//!   ignored (`lib/modules/6.1.0-57/…` → `6.1.0-58`). Metadata tables, superblock and padding
//!   are Literals: under 1 MB of the monthly pair's image, not worth a table-aware op yet.
//!   The builder parses squashfs by hand (`squashfs`; superblock, inode and directory tables,
//!   file inodes of types 2 and 9): `backhand`'s zstd feature would link a second libzstd.
//!
//! # Why zstd patch-from for the diff
//! Measured by `just bench-diff-tools` (one run, 2026-12-04, every regular file a pair changes
//! at the same path, each tool against the old file's bytes; zstd 1.5.4 CLI `-19
//! --patch-from`, bsdiff 4.3):
//!
//! | pair | files | new bytes | zstd patch-from | bsdiff |
//! |---|---|---|---|---|
//! | monthly | 353 | 36.4 MB | 2.63 MB, 21.2 s | 2.28 MB (0.87×), 11.4 s |
//! | monthly2 | 218 | 15.1 MB | 1.92 MB, 19.7 s | 1.76 MB (0.92×), 8.6 s |
//!
//! bsdiff's patches are 8–13 % smaller here (on a kernel tree zstd was ahead,
//! facebook/zstd#2341: 0.42 % vs 0.51 %). We keep zstd: the node links it anyway to recompress
//! blocks, so a patch adds no second decoder (bspatch's format wraps its streams in bzip2) and
//! one fuzzed, bounded frame decoder reads every byte of a patch; a patch-from frame decodes in
//! one pass with the reference and output in memory and nothing else; and both meet the goal
//! with room (the monthly patch is 2.1 % of the image; bsdiff's saving would be ~0.3 % of the
//! image). A Data op names its codec only through the patch format version, so a bsdiff op
//! would be a format bump (a node refuses a newer patch and stages by chunks). Level 19 with
//! long-distance matching: on the monthly pair's libcrypto.so.3 (`zstd --patch-from`, 1.5.4)
//! level 19 gave 421 kB in 3.7 s, level 12 494 kB in 0.3 s, level 9 501 kB: the builder pays
//! in time (see below) for 15 % fewer bytes.
//!
//! # Memory and time
//! The applier holds one op: a reference of at most 48 MiB (`ops::MAX_REF`) and at most
//! 16 MiB of output (`ops::MAX_SPAN`) plus its frame; a file larger than that is several Data
//! ops, each against the old file's window around the same offsets. It recompresses an op's
//! blocks on up to 4 threads. The builder holds both images and one op (see the figures).
//!
//! # The compressor agreement
//! A squashfs patch is applied by recompressing the target's blocks on the node, which
//! reproduces the image only with the very zstd that made it. The header names the builder's
//! block compressor as `zstd <ZSTD_versionNumber> level <L>` (this build: zstd 1.5.4, 10504,
//! the version of Debian 12's libzstd1 that the images' mksquashfs links; libupgrade pins
//! `zstd-sys`/`zstd-safe` exactly for it). [`can_apply`] (and [`apply`], before the first
//! byte) refuses a patch whose identity is not its own with [`PatchError::Compressor`]; the
//! node then stages that artifact by chunks. Bumping the pinned zstd therefore makes every
//! older release's squashfs patches unusable for the new build (plain patches stay usable: they
//! only decode zstd frames).
//!
//! A publisher whose mksquashfs links another libzstd would lose most of the gain (issue 35
//! item 1), so `release create` re-packs such an image with this build's zstd ([`repack`], where
//! the choice is argued; figures in the README's delta section). Measured 2026-12-05: 15 shared libraries of this machine (43 MB; in v2 7 of them
//! with 20 KB rewritten and 4 KB appended), imaged by mksquashfs 4.5.1 (zstd level 15,
//! `-no-fragments`) once with Debian 12's libzstd 1.5.4 and once with Debian 13's 1.5.7
//! (`LD_LIBRARY_PATH`): same image sizes, other bytes. Of the changed files' 174 blocks, this
//! build (1.5.4) recompressed 123 of the 1.5.7 image identically and not 51 (29 %), which are
//! carried verbatim: the squashfs patch is 2.07 MB against 177 KB for the 1.5.4-built pair
//! (11.7×) and larger than the chunk plan (1.61 MB), so `release create` drops it
//! (`release create` now says how many blocks were carried whole). One `ZSTD_compressCCtx`
//! call per 128 KiB block at level 15 (what mksquashfs does), linked once against each
//! libzstd, splits the same 123/51; the two outputs of a differing block part after the
//! 9-byte frame header and are within a few bytes of the same size. The level-15 row of
//! zstd's parameter table for sources ≤ 128 KB reads the same in the copies of `clevels.h`
//! seen, so the difference is inside the parser, which no parameter in a header selects.
//! Carrying each such block as a zstd patch-from of the node's own recompression (`-19`)
//! shrinks them only from 1.89 MB to 1.20 MB (36 %): still ~7× the 1.5.4 pair's patch. A second
//! pinned zstd on the node would cover one other version only, and grow every node's binary.
#![warn(missing_docs)]

mod apply;
mod build;
mod codec;
mod error;
mod header;
mod ops;
mod repack;
mod squashfs;

pub use apply::{apply, apply_needed, workers, ApplyStats, Base, Sink};
pub use build::{build, BuildStats};
pub use codec::{identity, zstd_version};
pub use error::PatchError;
pub use header::{can_apply, read_header, PatchHeader, PatchKind, FORMAT_VERSION, MAGIC};
pub use repack::{for_release, repack, RepackStats, Rootfs};
