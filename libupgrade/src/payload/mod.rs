//! A release's payloads beyond the slot's own files (issue 33), and where a node keeps them.
//!
//! - [`kinds`]: the one place that knows the kinds of a release's parts (rootfs, kernel,
//!   initrd, image archive); a new kind is one file there and one registry line.
//! - `store`: the content-addressed payload store on the state partition,
//!   `<state_dir>/payloads/objects/<sha256>` ([`object_path`]), written power-cut safely and
//!   pruned after a bless to what the slots' kept manifests reference.

pub mod kinds;
mod store;

pub(crate) use store::{check_budget, holds, objects_of, prune};
pub use store::{object_path, objects_dir, slot_payloads, PayloadStatus, Pruned, StoreUse};

/// The image references an image archive holds.
// TODO(issue 33): placeholder until the lead's `archive_images` (oci reader) lands in main;
// remove after `git merge main`.
pub fn archive_images(_path: &std::path::Path) -> Result<Vec<String>, std::io::Error> {
    Ok(Vec::new())
}
