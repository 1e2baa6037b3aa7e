//! `k3os-images`: real x86_64 and arm64 A/B test disks built from Debian packages.
//!
//! Pipeline (driven by the `images*` recipes of the justfile):
//! 1. `images/scripts/fetch-debs.sh <arch>` downloads and extracts the Debian kernel,
//!    busybox-static and (arm64) GRUB EFI packages into `.cache/debs/<arch>/root` ([`debs`]).
//! 2. [`release`]: per version, an initrd ([`initrd`], via our own [`cpio`] writer and [`kmod`]
//!    dependency resolution) and a squashfs rootfs ([`rootfs`]) with the static musl
//!    `k3os-ops`, signed into a release directory by `k3os-ops release create`.
//! 3. [`disk`]: a GPT disk per boot variant (GRUB BIOS, GRUB EFI, extlinux) with slot A holding
//!    v1; GRUB images come from [`grubimg`], loader configuration and initial boot state from
//!    the `bootconfig` crate ([`loader`]), so images and nodes agree on one format.
//!
//! Every output records a fingerprint of its inputs ([`stamp`]) and is rebuilt only when they
//! change. External tools run through [`run`]; errors ([`error`]) name the file or command.
//! Crates: `gpt` (the workspace's GPT crate, the same libupgrade reads the table with),
//! `sha2`/`hex` for fingerprints, `tempfile` for scratch directories next to the outputs.

pub mod cpio;
pub mod debs;
pub mod disk;
pub mod error;
pub mod grubimg;
pub mod initrd;
pub mod kmod;
pub mod loader;
pub mod release;
pub mod rootfs;
pub mod run;
pub mod stamp;
pub mod target;

pub use error::{Error, Result};
