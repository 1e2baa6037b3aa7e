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
#![warn(missing_docs)]

mod apply;
mod build;
mod codec;
mod error;
mod header;
mod ops;
mod squashfs;

pub use apply::{apply, ApplyStats};
pub use build::{build, BuildStats};
pub use codec::identity;
pub use error::PatchError;
pub use header::{can_apply, read_header, PatchHeader, PatchKind, FORMAT_VERSION, MAGIC};
