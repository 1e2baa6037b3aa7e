//! libupgrade: A/B slot updates for immutable nodes.
pub mod http;
pub mod manifest;

pub use bootconfig::Slot;
pub use manifest::{Arch, Artifact, Manifest};
