//! The report's fields and their limits (what [`crate::parse`] checks after the JSON).

use std::fmt;

use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};

/// The newest report format this crate writes and reads (the `v` field). A report carries the
/// lowest format that holds its outcome ([`Outcome::format`]): 2 only for a wait for a retry,
/// so a collector of the previous release (format 1) still takes every other report.
pub const FORMAT: u32 = 2;

/// Seeds are positions among a million (libupgrade's `rollout::SEED_SPACE`).
pub(crate) const SEED_SPACE: u32 = 1_000_000;
/// Longest site name, in bytes (a DNS label's length).
pub(crate) const MAX_SITE: usize = 63;
/// Longest channel (a URL or a channel name), in bytes.
pub(crate) const MAX_CHANNEL: usize = 256;
/// Longest release version, in bytes (libupgrade's `version::MAX_VERSION_LEN`).
pub(crate) const MAX_VERSION: usize = 128;

/// A node's id: its report key's ed25519 public key, 64 lowercase hex digits on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub [u8; 32]);

impl NodeId {
    /// The id of the node whose public key is `key`.
    pub fn of(key: &VerifyingKey) -> NodeId {
        NodeId(key.to_bytes())
    }

    /// Parse 64 hex digits (either case); None for anything else.
    pub fn parse(text: &str) -> Option<NodeId> {
        if text.len() != 64 {
            return None;
        }
        let mut b = [0u8; 32];
        hex::decode_to_slice(text, &mut b).ok()?;
        Some(NodeId(b))
    }

    /// The public key this id names; None when the bytes are not a point on the curve.
    pub fn key(&self) -> Option<VerifyingKey> {
        VerifyingKey::from_bytes(&self.0).ok()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({self})")
    }
}

impl Serialize for NodeId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for NodeId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        NodeId::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "node id must be 64 hex digits, got {:?}",
                s.escape_debug().to_string()
            ))
        })
    }
}

/// How a staged release's bytes were fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transfer {
    /// A per-pair patch against the running release.
    Patch,
    /// Content-defined chunks, reusing what the node held.
    Chunks,
    /// Whole files.
    Full,
}

/// What a waiting node waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitFor {
    /// The site's wave of the release's rollout has not started.
    Wave,
    /// The publisher paused the rollout.
    Pause,
    /// The release failed on this node, which does not try it again by itself: `until` is
    /// when the rollout's retries allow the next attempt (None: not before a newer release or
    /// more retries are published). Report format 2.
    Retry,
}

/// What the node reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Outcome {
    /// The release is completely written and verified in the inactive slot.
    Staged {
        /// Bytes fetched over the network.
        bytes: u64,
        /// How they were fetched.
        by: Transfer,
    },
    /// Staging failed; the slot stays invalid, the node runs on.
    StageFailed {
        /// Why, as the node recorded it.
        why: String,
    },
    /// A newer release is offered to the fleet but not yet to this site.
    Waiting {
        /// Its wave or a pause.
        #[serde(rename = "for")]
        wait_for: WaitFor,
        /// Unix seconds when the site's wave starts, or when a retry is allowed (None: paused,
        /// held for good, or unknown).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until: Option<u64>,
    },
    /// The release was handed to the bootloader for a trial boot.
    TrialBoot,
    /// The trial boot passed its health checks: the release runs.
    Blessed,
    /// A health check failed on the trial boot: the node went back to its previous release.
    RolledBack {
        /// Why, as the node recorded it.
        why: String,
    },
    /// The trial boot never confirmed and the loader fell back.
    FellBack {
        /// Why, as the node recorded it.
        why: String,
    },
    /// A staged release was withdrawn by the channel and dropped, never activated.
    WithdrawnDropped,
}

impl Outcome {
    /// The report format a report of this outcome carries: 2 for a wait for a retry (which
    /// format 1 has no value for), 1 for everything else.
    pub fn format(&self) -> u32 {
        match self {
            Outcome::Waiting {
                wait_for: WaitFor::Retry,
                ..
            } => 2,
            _ => 1,
        }
    }

    /// The outcome's name on the wire (`staged`, `stage_failed`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Staged { .. } => "staged",
            Outcome::StageFailed { .. } => "stage_failed",
            Outcome::Waiting { .. } => "waiting",
            Outcome::TrialBoot => "trial_boot",
            Outcome::Blessed => "blessed",
            Outcome::RolledBack { .. } => "rolled_back",
            Outcome::FellBack { .. } => "fell_back",
            Outcome::WithdrawnDropped => "withdrawn_dropped",
        }
    }

    /// The recorded reason, for the outcomes that carry one.
    pub fn why(&self) -> Option<&str> {
        match self {
            Outcome::StageFailed { why }
            | Outcome::RolledBack { why }
            | Outcome::FellBack { why } => Some(why),
            _ => None,
        }
    }

    pub(crate) fn why_mut(&mut self) -> Option<&mut String> {
        match self {
            Outcome::StageFailed { why }
            | Outcome::RolledBack { why }
            | Outcome::FellBack { why } => Some(why),
            _ => None,
        }
    }
}

/// One report, as signed (see the crate docs for the wire format).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// The format: [`Outcome::format`] of `outcome` (1, or 2 for a wait for a retry).
    pub v: u32,
    /// The reporting node.
    pub node: NodeId,
    /// The site (cluster) the node belongs to: 1–63 of `a-z 0-9 . _ -`, starting with a letter
    /// or digit.
    pub site: String,
    /// The node's report number, from 1, one more for every report it makes.
    pub seq: u64,
    /// Unix seconds when the node reached the outcome.
    pub at: u64,
    /// The channel the release came from (empty: a release location or a bundle).
    pub channel: String,
    /// The release's version (empty when the node does not know it).
    pub version: String,
    /// The release's generation (0 when unknown).
    pub generation: u64,
    /// What the node reached.
    pub outcome: Outcome,
    /// The node's (or its cluster's) rollout seed, its place in the channel's waves
    /// (`0..1_000_000`), when it resolved through a rollout; None otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u32>,
    /// Reports the node dropped unsent so far, a running total (its spool full, oldest first,
    /// or refused for good by the collector): the collector keeps the largest it sees.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Whether `site` is a valid site name.
pub(crate) fn valid_site(site: &str) -> bool {
    !site.is_empty()
        && site.len() <= MAX_SITE
        && site.as_bytes()[0].is_ascii_alphanumeric()
        && site
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// Whether `text` is at most `max` bytes with no control characters.
pub(crate) fn printable(text: &str, max: usize) -> bool {
    text.len() <= max && !text.chars().any(char::is_control)
}

impl Report {
    /// Which field breaks a limit, with what was found; None when every field is within them.
    pub(crate) fn invalid_field(&self) -> Option<String> {
        if self.v != self.outcome.format() {
            return Some(format!(
                "report format {} does not match its outcome {} (format {})",
                self.v,
                self.outcome.kind(),
                self.outcome.format()
            ));
        }
        if !valid_site(&self.site) {
            return Some(format!(
                "site {:?} is not 1-{MAX_SITE} of a-z 0-9 . _ - starting with a letter or digit",
                self.site.escape_debug().to_string()
            ));
        }
        if self.seq == 0 {
            return Some("seq is 0; reports are numbered from 1".into());
        }
        if !printable(&self.channel, MAX_CHANNEL) {
            return Some(format!(
                "channel is longer than {MAX_CHANNEL} bytes or holds control characters"
            ));
        }
        if !printable(&self.version, MAX_VERSION) {
            return Some(format!(
                "version is longer than {MAX_VERSION} bytes or holds control characters"
            ));
        }
        if self.seed.is_some_and(|s| s >= SEED_SPACE) {
            return Some(format!("seed {:?} is not below {SEED_SPACE}", self.seed));
        }
        if self.node.key().is_none() {
            return Some(format!(
                "node id {} is not an ed25519 public key",
                self.node
            ));
        }
        None
    }
}
