//! The initramfs: a slot file, patched as plain bytes, checked by its sha256 alone.

use super::{Kind, OnBoot, Place, Room};
use crate::manifest::Artifact;

/// The initrd kind.
pub(super) const KIND: Kind = Kind {
    name: "initrd",
    place: Place::Slot(Artifact::Initrd),
    patch_kind: "plain",
    check: None,
    room: Room::Shared,
    content_len: None,
    verity: false,
    on_boot: OnBoot::Nothing,
};
