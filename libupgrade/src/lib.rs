//! libupgrade: A/B slot updates for immutable nodes.
pub use bootconfig::Slot;
