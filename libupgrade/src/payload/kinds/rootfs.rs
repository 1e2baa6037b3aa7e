//! The squashfs root filesystem: a slot file, patched squashfs-aware, checked structurally.

use super::{Kind, OnBoot, Place, ReadAt};
use crate::manifest::Artifact;

/// The rootfs kind.
pub(super) const KIND: Kind = Kind {
    name: "rootfs",
    place: Place::Slot(Artifact::Rootfs),
    patch_kind: "squashfs",
    check: Some(check),
    on_boot: OnBoot::Nothing,
};

/// A squashfs whose used bytes fit the signed size ([`crate::sqcheck`]: constant memory).
fn check(read: ReadAt, size: u64) -> Result<(), String> {
    crate::sqcheck::check(|pos, buf| read(pos, buf), size).map(|_| ())
}
