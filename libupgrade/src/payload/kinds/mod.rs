//! The one place that knows the kinds of a release's parts.
//!
//! A release is its three slot files (rootfs, kernel, initrd: `manifest.files`) and any
//! number of payloads (`manifest.payloads`), each of a kind named in the manifest. A kind
//! says, in one file of this folder:
//! - its name in the manifest (`rootfs`, `image-archive`, …);
//! - where a node keeps it ([`Place`]): a slot file written through [`crate::layout::Layout`],
//!   or the content-addressed payload store on the state partition ([`super::object_path`]);
//! - the patch kind the publisher builds for it (`squashfs` or `plain`, see [`crate::patch`]);
//! - the check its bytes must pass once written and their sha256 verified ([`Kind::check`]);
//! - what every boot of a slot holding it does with it ([`OnBoot`]).
//!
//! **Adding a kind is one new file here and one line in [`KINDS`]**: the stage engine, the
//! preview, budgets, bundles, the store and `slot status` work over the list of parts a
//! manifest yields ([`parts`]) and ask the kind only through
//! [`Kind`]. A payload of a kind this build does not know is skipped (never refused), so a
//! newer publisher's payload never makes a release unreadable to an older node.

use crate::manifest::{Artifact, FileEntry, Manifest, Part};

mod image_archive;
mod initrd;
mod kernel;
mod rootfs;

/// Reads `buf.len()` bytes at a position of a written part (its start is 0).
pub type ReadAt<'a> = &'a dyn Fn(u64, &mut [u8]) -> std::io::Result<()>;

/// A kind's check of its written bytes (`read`, `size` bytes): `Err(what is wrong)`.
pub type Check = fn(read: ReadAt, size: u64) -> Result<(), String>;

/// Where a node keeps a part of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// One of the slot's own files, written through the layout into the target slot.
    Slot(Artifact),
    /// An object in the payload store, shared by the slots whose kept manifest names it.
    Store,
}

/// Whose room a part of a kind takes where it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Its own (the rootfs: its partition or directory holds nothing else).
    Own,
    /// The room of a filesystem the slot's other files of this kind share (the kernel and
    /// initrd on the boot filesystem): their sizes add up against one capacity, and a
    /// failed write is removed so that it does not take room the others need.
    Shared,
    /// The payload store's (its budget and free space, checked by the payload store before a stage).
    Store,
}

/// Why a kind found no content in a copy ([`ContentLen`]).
#[derive(Debug)]
pub enum NotContent {
    /// Reading it failed while doing `op`.
    Read(&'static str, std::io::Error),
    /// It is not of the kind: what it holds instead (`holds no squashfs`).
    Not(&'static str),
}

/// How many bytes of a copy (`read`, `len` bytes long) are its content.
pub type ContentLen = fn(read: ReadAt, len: u64) -> Result<u64, NotContent>;

/// What every boot does with a slot's parts of a kind, before the health checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnBoot {
    /// Nothing (the loader and the initramfs use the slot files).
    Nothing,
    /// Link it into k3s's airgap image directory and check its images are there
    /// ([`super::airgap`]).
    AirgapImages,
}

/// What a node knows of one kind of part.
#[derive(Debug)]
pub struct Kind {
    /// The kind's name in the manifest (`Payload::kind`; the slot files' kinds are their
    /// `files.*` keys).
    pub name: &'static str,
    /// Where a node keeps it.
    pub place: Place,
    /// The patch kind `release create --patch-from` builds for it ([`crate::manifest::PATCH_KINDS`]).
    pub patch_kind: &'static str,
    /// What its written bytes must be beyond their signed sha256 (`read`, its `size` bytes):
    /// `Err(what is wrong)`, said in the stage's error naming the part. None: the sha256 is
    /// all (kernel, initrd).
    pub check: Option<Check>,
    /// Whose room it takes where it is written.
    pub room: Room,
    /// How much of a copy of it (the running slot's, whose partition may be larger) is its
    /// content, worth reusing chunks from. None: all of it.
    pub content_len: Option<ContentLen>,
    /// The release's dm-verity tree and FEC (`Manifest::verity`) are computed over it and
    /// written after it, and must match the signed root hash (the rootfs).
    pub verity: bool,
    /// What every boot of a slot holding it does with it.
    pub on_boot: OnBoot,
}

/// Every kind this build knows: the three slot files first, then the payload kinds.
pub const KINDS: &[&Kind] = &[
    &rootfs::KIND,
    &kernel::KIND,
    &initrd::KIND,
    &image_archive::KIND,
];

/// The kind named `name` in a manifest, if this build knows it.
pub fn kind(name: &str) -> Option<&'static Kind> {
    KINDS.iter().copied().find(|k| k.name == name)
}

/// The kind of slot file `a`.
pub fn of_artifact(a: Artifact) -> &'static Kind {
    KINDS
        .iter()
        .copied()
        .find(|k| k.place == Place::Slot(a))
        .expect("every artifact has a kind")
}

/// One part of a manifest with what the node knows of it.
#[derive(Debug, Clone)]
pub struct PartRef<'a> {
    /// Which part.
    pub part: Part,
    /// Its signed file entry.
    pub entry: &'a FileEntry,
    /// Its kind.
    pub kind: &'static Kind,
}

/// The parts of `m` a node of this build stages, in order: the three slot files, then each
/// payload of a kind it knows (a payload of another kind is skipped, never refused).
pub fn parts(m: &Manifest) -> Vec<PartRef<'_>> {
    let slot = Artifact::ALL.into_iter().map(|a| PartRef {
        part: Part::Slot(a),
        entry: m.files.get(a),
        kind: of_artifact(a),
    });
    let payloads = m.payloads.iter().filter_map(|p| {
        let kind = kind(&p.kind).filter(|k| k.place == Place::Store)?;
        Some(PartRef {
            part: Part::Payload(p.name.clone()),
            entry: &p.file,
            kind,
        })
    });
    slot.chain(payloads).collect()
}

/// The payloads of `m` a node of this build keeps in its store (kinds it knows).
pub fn stored_payloads(m: &Manifest) -> impl Iterator<Item = &crate::manifest::Payload> {
    m.payloads
        .iter()
        .filter(|p| kind(&p.kind).is_some_and(|k| k.place == Place::Store))
}

/// The payload kinds this build stages into the store (what `release create` may add).
pub fn payload_kinds() -> impl Iterator<Item = &'static Kind> {
    KINDS.iter().copied().filter(|k| k.place == Place::Store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_artifact_has_one_kind_and_names_are_unique() {
        for a in Artifact::ALL {
            assert_eq!(of_artifact(a).name, a.as_str());
        }
        for (i, k) in KINDS.iter().enumerate() {
            assert!(
                KINDS[..i].iter().all(|o| o.name != k.name),
                "{} twice",
                k.name
            );
            assert!(crate::manifest::PATCH_KINDS.contains(&k.patch_kind));
        }
        assert_eq!(kind("image-archive").unwrap().place, Place::Store);
        assert!(kind("helm-chart").is_none());
    }
}
