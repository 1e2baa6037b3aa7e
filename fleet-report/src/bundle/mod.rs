//! The failure bundle: what a failed attempt left behind, sent home so that nobody has to
//! reach the site to learn why.
//!
//! The failing slot writes one per failed attempt while it still runs (a failed health check,
//! an awaited check that timed out, a confirm that failed); where it never reached userspace,
//! the good slot writes it after the fallback from what survived. The node redacts it (its
//! rules, before it is sealed), seals it with its node key, keeps a few on the state partition,
//! and sends them through the report path after the fallback. The collector opens it with the
//! same rules as a report: enrolled keys only, bounded before reading.
//!
//! # On the wire (format 1)
//!
//! ```text
//! k3os-bundle 1 <node id: 64 hex digits>\n
//! <base64 of the ed25519 signature>\n
//! <the bundle's JSON, deflate-compressed (raw deflate, RFC 1951)>
//! ```
//!
//! The node key signs `k3os-ops bundle v1\n`, the node id and a newline, then the *compressed*
//! bytes; the first line names the node, so a reader
//! checks the size and the signature before it inflates anything: an unenrolled sender cannot
//! make a collector decompress a byte, and an enrolled one is still held to
//! [`MAX_INFLATED_BYTES`]. The whole is at most [`MAX_BUNDLE_BYTES`]; [`Bundle::seal`] makes it
//! fit by cutting the longest section's head (logs keep their newest lines) and says how much
//! it cut in each section. Deflate rather than zstd: the reader is pure Rust (it is fuzzed and
//! runs in the collector on untrusted input), and on log text the two differ by a few percent.
//!
//! [`open`] refuses, each naming what was wrong: a body over the limit (before reading it), an
//! envelope that is not the one above, a signature that is not the named node's, a body that
//! inflates past its limit or is not deflate, JSON that is not a bundle of a format this reader
//! knows (unknown fields included), and names, counts and lengths outside their limits.

mod wire;

#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::report::NodeId;

pub use wire::{open, verify, BundleError, Opened, Sealed};

/// The envelope of `body` (any bytes, as if compressed) sealed by `key`: what the fuzz target
/// feeds [`open`] to reach the inflate and JSON reader past the signature.
#[cfg(feature = "fuzzing")]
pub fn seal_body_for_fuzzing(key: &ed25519_dalek::SigningKey, body: &[u8]) -> Vec<u8> {
    wire::envelope(key, &NodeId::of(&key.verifying_key()), body)
}

/// The format this crate writes and the newest it reads.
pub const BUNDLE_FORMAT: u32 = 1;
/// Largest sealed bundle on the wire, envelope included, in bytes.
pub const MAX_BUNDLE_BYTES: usize = 64 * 1024;
/// Largest bundle JSON a reader inflates, in bytes.
pub const MAX_INFLATED_BYTES: usize = 1024 * 1024;
/// Most sections in a bundle.
pub const MAX_SECTIONS: usize = 64;
/// Longest section name, in bytes (`[a-z0-9._/-]`).
pub const MAX_NAME_BYTES: usize = 64;
/// Longest `why` and version text, in characters.
pub const MAX_WHY_CHARS: usize = 512;

/// How the attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// A health check (built-in or the node's own) failed in the new slot.
    HealthCheck,
    /// A check the activation awaited (the agent's Node Ready) did not come in time.
    AwaitedTimeout,
    /// The confirm step itself failed (state or loader writes).
    Confirm,
    /// The slot never reached userspace (a panic, the initramfs, dm-verity): written by the
    /// good slot after the fallback from the initramfs's record, the loader's tries and pstore.
    NoUserspace,
}

/// One piece of evidence: a check's output, a log's tail, the decision log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Section {
    /// What it is, e.g. `health/20-kubelet`, `log/kernel`, `log/kubelet`, `slot/decisions`.
    pub name: String,
    /// The text (redacted on the node before sealing).
    pub text: String,
    /// Bytes cut from the head of the text to fit the bundle (0: whole).
    pub cut_bytes: u64,
}

/// The failed attempt's evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bundle {
    /// Always [`BUNDLE_FORMAT`] when written by this crate.
    pub format: u32,
    /// The node (its key signs the bundle).
    pub node: NodeId,
    /// The release attempted.
    pub version: String,
    /// Its generation.
    pub generation: u64,
    /// Which attempt of that release on this node (1 for the first), so a collector keeps
    /// one bundle per attempt and a resend replaces nothing.
    pub attempt: u32,
    /// The slot it was tried in (`A` or `B`).
    pub slot: String,
    /// When the bundle was written (RFC 3339, UTC).
    pub time: String,
    /// How it failed.
    pub failure: Failure,
    /// The one-line why, as the rollback report says it.
    pub why: String,
    /// The versions on the node (`k3os-ops`, kernel, kubelet …), one `name=value` a line.
    pub versions: String,
    /// How many redactions the node's rules made (what was redacted is not said).
    pub redacted: u64,
    /// The evidence, most important first.
    pub sections: Vec<Section>,
}

impl Bundle {
    /// Check the limits every bundle keeps (what [`open`] refuses), naming what breaks one.
    pub fn check(&self) -> Result<(), String> {
        if self.format != BUNDLE_FORMAT {
            return Err(format!(
                "format {} (this reader knows format {BUNDLE_FORMAT})",
                self.format
            ));
        }
        for (what, text) in [
            ("version", &self.version),
            ("slot", &self.slot),
            ("time", &self.time),
            ("why", &self.why),
        ] {
            if text.chars().count() > MAX_WHY_CHARS {
                return Err(format!("{what} is over {MAX_WHY_CHARS} characters"));
            }
        }
        if self.slot != "A" && self.slot != "B" {
            return Err(format!("slot {:?} is neither A nor B", self.slot));
        }
        if self.sections.len() > MAX_SECTIONS {
            return Err(format!(
                "{} sections, more than {MAX_SECTIONS}",
                self.sections.len()
            ));
        }
        for s in &self.sections {
            let ok = !s.name.is_empty()
                && s.name.len() <= MAX_NAME_BYTES
                && s.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._/-".contains(&b));
            if !ok {
                return Err(format!(
                    "section name {:?} is not 1 to {MAX_NAME_BYTES} bytes of [a-z0-9._/-]",
                    s.name.escape_debug().to_string()
                ));
            }
        }
        Ok(())
    }
}
