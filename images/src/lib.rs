//! `k3os-images`: real x86_64 and arm64 A/B test disks built from Debian packages.
//!
//! Pipeline (driven by the `images*` recipes of the justfile; `main.rs` is `k3os-images build`):
//! 1. `images/scripts/fetch-debs.sh <arch>` downloads and extracts the Debian kernel,
//!    busybox-static and (arm64) GRUB EFI packages into `.cache/debs/<arch>/root` ([`debs`]).
//! 2. [`release`]: the test signing keys and the test channel's root version 1, then per
//!    version of [`spec::STANDARD_RELEASES`] an initrd ([`initramfs`], via our own `initramfs::cpio` writer
//!    and `initramfs::kmod` dependency resolution) and a squashfs rootfs ([`rootfs`]) with the static
//!    musl `k3os-ops` and the channel root, signed into a release directory by
//!    `k3os-ops release create` with [`loader`]'s boot config.
//! 3. [`disk`]: a GPT disk per boot variant (GRUB BIOS, GRUB EFI, extlinux) with slot A holding
//!    v1; GRUB images come from [`grubimg`], the boot partition from [`loader`]: its files are
//!    written by `k3os-ops bootloader install` from a boot config of the `bootconfig` crate,
//!    so images and nodes agree on one format.
//!
//! # Architecture
//! Data flows one way, from plain data to builders to assemblers to the binary:
//! - bottom: [`spec`] (what is built: release names and variants, boot variants, sizes, what
//!   goes on a disk; shared constants), [`target`] (per-architecture facts), [`debs`] (the
//!   extracted packages), and the tools [`run`], [`stamp`], [`error`], `initramfs::cpio`, `initramfs::kmod`,
//!   [`fsimg`] (filesystem image files);
//! - builders of one part each: [`initramfs`], [`rootfs`], [`grubimg`], [`loader`] (the boot
//!   config and the boot partition), [`secboot`] (the Secure Boot key, signed unified kernel
//!   images, the enrolled firmware variable store);
//! - assemblers: [`release`] (keys, channel root, initrd + rootfs + kernel, signed) and
//!   [`disk`] (GPT, MBR and the partition images), called by `main.rs`.
//!
//! Builders read only the bottom layer ([`loader`] also [`grubimg`]'s GRUB images); the two
//! assemblers read builders, never each other. Outside this crate, `vm-tests` reads only
//! [`spec::STANDARD_RELEASES`] (the releases a scenario requires).
//!
//! Every output records a fingerprint of its inputs ([`stamp`]) and is rebuilt only when they
//! change. External tools run through [`run`]; errors ([`error`]) name the file or command.
//! Crates: `gpt` (the workspace's GPT crate, the same libupgrade reads the table with),
//! `sha2`/`hex` for fingerprints, `tempfile` for scratch directories next to the outputs.

pub mod debs;
pub mod disk;
pub mod error;
pub mod fsimg;
pub mod grubimg;
pub mod initramfs;
pub mod kube;
pub mod loader;
pub mod oci;
pub mod release;
pub mod rootfs;
pub mod run;
pub mod secboot;
pub mod spec;
pub mod stamp;
pub mod target;

pub use error::{Error, Result};
