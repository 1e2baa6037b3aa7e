//! The kernel image: a slot file, patched as plain bytes, checked by its sha256 alone.

use super::{Kind, OnBoot, Place, Room};
use crate::manifest::Artifact;

/// The kernel kind.
pub(super) const KIND: Kind = Kind {
    name: "kernel",
    place: Place::Slot(Artifact::Kernel),
    patch_kind: "plain",
    check: None,
    room: Room::Shared,
    content_len: None,
    verity: false,
    on_boot: OnBoot::Nothing,
};
