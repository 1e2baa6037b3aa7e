//! Where a channel's metadata files come from: one trait that the client, the halt role and
//! the kept copy read through (its own file, so that they depend on it and not on each other).

use super::TrustError;

/// Where metadata files come from (a channel directory, an http(s) channel, GitHub assets).
pub trait MetaSource {
    /// The file `name`, at most `max` bytes (more is [`TrustError::TooLarge`]); `Ok(None)`
    /// when the source does not have it (404, no such file).
    fn fetch(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>, TrustError>;
    /// Where `name` is, for messages.
    fn location(&self, name: &str) -> String;
}
