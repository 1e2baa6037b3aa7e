//! A release's payloads beyond the slot's own files, and what a node does with them.
//!
//! - [`archive_images`] (`oci`): what an image archive (an OCI image layout or a `docker save`
//!   tar, what k3s imports from its airgap directory) holds: the image names, each checked
//!   down to its blobs. The publisher records the names in the manifest; a node's built-in
//!   health check reads them again from what it booted with.
//! - [`airgap`]: making the booted slot's archives available to k3s before it starts, and the
//!   built-in check that every image the release names is there.

mod oci;

pub mod airgap;

pub use oci::{archive_images, ArchiveError, MAX_ARCHIVE_JSON};
