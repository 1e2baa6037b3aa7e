//! A release's payloads beyond the slot's own files (issue 33), where a node keeps them, and
//! what it does with them.
//!
//! - [`kinds`]: the one place that knows the kinds of a release's parts (rootfs, kernel,
//!   initrd, image archive); a new kind is one file there and one registry line.
//! - `store`: the content-addressed payload store on the state partition,
//!   `<state_dir>/payloads/objects/<sha256>` ([`object_path`]), written power-cut safely and
//!   pruned after a bless to what the slots' kept manifests reference.
//! - `proof`: an object counts as held only when its bytes are proven to be its name
//!   ([`prove`]: a proof the stage wrote that any later write breaks, or a hash); one that is
//!   not is moved to the quarantine ([`quarantined`]) and fetched again.
//! - [`archive_images`] (`oci`): what an image archive (an OCI image layout or a `docker save`
//!   tar, what k3s imports from its airgap directory) holds: the image names, each checked
//!   down to its blobs. The publisher records the names in the manifest; a node's built-in
//!   health check reads them again from what it booted with.
//! - [`image_layout`]: the OCI image layout's JSON documents, the one set of types the
//!   archive check reads and the workspace's image writers write.
//! - [`airgap`]: making the booted slot's archives available to k3s before it starts, and the
//!   built-in check that every image the release names is there.

pub mod airgap;
pub mod image_layout;
pub mod kinds;
mod oci;
mod proof;
mod store;

pub use oci::{archive_images, ArchiveError, MAX_ARCHIVE_JSON};
pub(crate) use proof::record as record_proof;
pub use proof::{
    prove, quarantine_dir, quarantined, Held, QuarantineEntry, Quarantined, QUARANTINE_KEEP,
};
pub(crate) use store::{check_budget, holds, objects_of, prune};
pub use store::{object_path, objects_dir, slot_payloads, PayloadStatus, Pruned, StoreUse};
