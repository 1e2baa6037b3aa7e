//! The kernel image: a slot file, patched as plain bytes, checked by its sha256 alone.

use super::{Kind, OnBoot, Place};
use crate::manifest::Artifact;

/// The kernel kind.
pub(super) const KIND: Kind = Kind {
    name: "kernel",
    place: Place::Slot(Artifact::Kernel),
    patch_kind: "plain",
    check: None,
    on_boot: OnBoot::Nothing,
};
