//! libupgrade: A/B slot updates for immutable nodes.
pub mod http;
pub mod manifest;
pub mod channel;
pub mod release;
pub mod signing;

pub use bootconfig::Slot;
pub use manifest::{Arch, Artifact, Manifest};
