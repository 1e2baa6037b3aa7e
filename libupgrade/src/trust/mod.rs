//! Signed, expiring channel metadata (The Update Framework 1.0): which releases a channel
//! offers and which is current, vouched for by roles whose keys can be rotated and revoked in
//! band, without a visit to the node.
//!
//! This module owns the metadata formats ([`meta`]), the node's client workflow ([`client`]),
//! the node's record of what it trusted ([`store`]), the metadata files it keeps between
//! updates ([`kept`]), what they say about a release a slot holds ([`withdrawn`]) and the
//! publisher's side ([`publish`]).
//! The metadata says which manifests exist (path, length, sha256, and version/generation/arch
//! as custom data) and which one a node may take; the stager then requires the manifest it
//! fetches to have exactly that length and sha256.
//!
//! # Who vouches for a manifest
//! - **Resolved through verified metadata**: the targets role is the authority, as in TUF and
//!   Bottlerocket's updog. A manifest the targets role pins (length + sha256, signed by a
//!   threshold of the targets keys of a root the node walked to) is accepted without a
//!   trust.d signature; `manifest.json.sig` is not read. This is what lets a publisher rotate
//!   the release-signing key without visiting a node: a new release key needs to be in no
//!   trust.d, what counts is the targets role's threshold, and the targets keys themselves
//!   rotate with root N+1. A manifest that is NOT the pinned one is refused before anything
//!   else, even when a trust.d key signed it.
//! - **Without metadata** (a v0.1.0 channel, `--source`, a bundle, `auto` on a node with no
//!   root or a channel never seen with metadata): the trust.d ed25519 signature over
//!   `manifest.json` is required, exactly as in v0.1.0.
//!
//! In both cases every file is then checked against the manifest's sizes and sha256.
//!
//! # Files in a channel (a directory, an http(s) site, or assets of a GitHub release)
//! - `root.json` and every `N.root.json` (N = 1, 2, …): the root role, offline keys with a
//!   threshold, naming the keys and thresholds of all four roles. Root N+1 is signed by a
//!   threshold of root N's root keys and of its own.
//! - `targets.json`: target `DIR/manifest.json` → `length`, `hashes.sha256`,
//!   `custom {version, generation, arch}`.
//! - `snapshot.json`: the version, length and sha256 of `targets.json`.
//! - `timestamp.json`: the version, length and sha256 of `snapshot.json`; short expiry,
//!   re-signed by a cron job (`k3os-ops release timestamp`).
//!
//! Every hash a `meta` entry lists must match the file (sha256 and sha512 are computed; any
//! other algorithm refuses, it never passes unchecked). A root that rotates a role's keys
//! forgets what that role vouched for (TUF 5.3.11): the timestamp key its timestamp and
//! snapshot versions, the snapshot key its bound on the targets version; nothing else
//! lowers a bound. `k3os-ops/tests/cli/tuf_interop.rs` holds these rules against python-tuf.
//!
//! `consistent_snapshot` is false: a node that reads a channel while it is being republished
//! sees a hash mismatch and tries again at its next poll.
//!
//! # What a node needs
//! Its starting root at `channel_root` in the config (default `/etc/k3os-ops/root.json`, put
//! there at image build); with none, channels are resolved from `index.json` as in v0.1.0.
//! The node keeps the newest root it walked to and the highest versions it saw per channel
//! in `<state_dir>/channel-trust.json` ([`store`]), and the snapshot and targets files it last
//! verified in `<state_dir>/channel-meta/v1/` ([`kept`]): a poll of an unchanged channel then
//! downloads two small files, the `N+1.root.json` probe (a 404) and `timestamp.json`. `channel_metadata = "required"` refuses a
//! channel without metadata; the default (`"auto"`) uses metadata when the channel has it, and
//! once a node has trusted a channel's metadata it requires it for that channel from then on
//! (an attacker cannot strip the metadata to fall back to the unsigned index).
//!
//! # Clocks
//! Expiry is checked against the node's clock, but never against a time earlier than the
//! clock reading at the node's last successful check of that channel ([`client::ExpiryRule`]): a
//! clock that runs behind, by any amount, still installs fresh metadata; a clock that runs
//! ahead still installs it while it is within the timestamp's remaining lifetime (7 days by
//! default, re-signed daily: at least 6 days). A node with no usable clock is updated by an
//! operator with `upgrade --ignore-expiry`, which says so loudly and does not move the
//! recorded time. Expiry never touches a rollback or the boot-time confirm: neither reads
//! channel metadata.
//!
//! # Why not the `tough` crate
//! Measured 2026-12-03 in a scratch crate (this workspace's reqwest/rustls/ed25519/tokio set and
//! release profile, musl, `nice`, 2 cores shared with 4 other builds, load ~7):
//! - `tough` 0.24 (+ its `http` transport) builds for both `x86_64-unknown-linux-musl` and
//!   `aarch64-unknown-linux-musl` with `.cargo/config.toml`'s cross setup.
//! - x86_64: it adds **317 s** to a clean release build on top of the 177 s the base set takes
//!   (aws-lc-sys compiles AWS-LC's C, plus jiff, snafu, globset, tokio-util, …) and grows the
//!   stripped static binary from **2.77 MB to 7.78 MB** (+5.0 MB, ×2.8); aarch64: **2.43 MB to
//!   5.97 MB** (+3.5 MB, ×2.5; its clean build took 2144 s at load 14, not comparable). Our node
//!   binary is copied into both slots of every image and built twice per CI run.
//! - Its API is async (`RepositoryLoader::load().await`, async `Transport`): the stager and
//!   `upgrade` are blocking (blocking reqwest), so every call would need a runtime, and our
//!   byte bounds and `--min-rate` rule would have to be re-implemented as a `Transport`.
//! - It brings a second crypto stack (aws-lc-rs) next to ring (rustls) and ed25519-dalek.
//!
//! So this module implements the same checks over the same JSON formats (TUF 1.0, OLPC
//! canonical JSON through `olpc-cjson`, the crate `tough` itself uses, ed25519 keys as TUF
//! writes them): `tuftool`-made metadata with ed25519 keys verifies here. Not implemented, as
//! a channel does not need them: delegated roles other than the stop-only `halt` role
//! ([`halt`]; every other is ignored: releases come from the top-level targets only),
//! consistent-snapshot file names (the plain names are read), key types other than ed25519
//! (their signatures count for nothing).

pub mod client;
pub mod halt;
pub mod kept;
pub mod meta;
pub mod publish;
mod source;
pub mod store;
pub mod withdrawn;

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use meta::{Envelope, Role};

pub use client::update;
pub use kept::KEPT_DIR;
pub use source::MetaSource;
pub use store::{STORE_FILE, STORE_FORMAT};

/// What a node keeps per channel: the newest root it trusts and the highest versions seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The newest root this node walked to (the published envelope, signatures included).
    pub root: Envelope,
    /// The highest timestamp version trusted (forgotten when root rotates the timestamp key).
    #[serde(default)]
    pub timestamp: u64,
    /// The highest snapshot version trusted, as the trusted timestamp named it (forgotten when
    /// root rotates the timestamp or the snapshot key: TUF 5.3.11).
    #[serde(default)]
    pub snapshot: u64,
    /// The targets version the trusted snapshot names: a lower one is refused (TUF 5.5.5), also
    /// after a rotation of the targets key; forgotten only when root rotates the snapshot key.
    #[serde(default)]
    pub targets: u64,
    /// The clock reading at the last successful check: expiry is never judged against an
    /// earlier time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_floor: Option<DateTime<Utc>>,
    /// The highest `halt.json` version verified, with the halt delegation's keys ([`halt`]);
    /// absent: the channel delegates no halt role (records written before it are read so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halt: Option<halt::Seen>,
}

impl Record {
    /// A fresh record starting from a trusted root file's bytes.
    pub fn from_root(bytes: &[u8], what: &str) -> Result<Record, TrustError> {
        let root = Envelope::parse(bytes, what)?;
        let body: meta::Root = root.body(Role::Root, what)?;
        // A node's starting root must be self-consistent: signed by its own threshold.
        root.check_role(&body, Role::Root, what)?;
        Ok(Record {
            root,
            timestamp: 0,
            snapshot: 0,
            targets: 0,
            time_floor: None,
            halt: None,
        })
    }

    /// The version of the root this record trusts.
    pub fn root_version(&self) -> u64 {
        self.root
            .body::<meta::Root>(Role::Root, "trusted root")
            .map(|r| r.version)
            .unwrap_or(0)
    }
}

/// A manifest as the targets role names it: the stager requires exactly these bytes, and
/// accepts them on the targets role's word alone (no trust.d signature needed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestPin {
    /// The manifest's length in bytes.
    pub length: u64,
    /// Its sha256 (every target lists one).
    pub sha256: String,
    /// Every hash the targets list for it, by algorithm (sha256 included): all must match.
    pub hashes: std::collections::BTreeMap<String, String>,
    /// Where the pin comes from (the targets file), for messages.
    pub from: String,
    /// Who vouches for the manifest, reported as its signer (`signed by …`): the targets
    /// role, its version and the root version whose keys it was checked against.
    pub vouched_by: String,
}

/// Why channel metadata was refused. Every variant names the file or role involved.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("{path}: {source}")]
    /// A local file (the trust store or its lock, a starting root, a channel directory's file,
    /// a file the publisher writes) could not be read or written.
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    #[error("{what} is not valid TUF metadata: {why}")]
    /// A metadata file or the trust store does not parse, has the wrong `_type` or spec
    /// version, or lacks an entry the workflow needs.
    Malformed {
        /// The file, URL or document that failed (`root version 3`, `target DIR/manifest.json`).
        what: String,
        /// What is wrong with it (the parser's message or the missing entry).
        why: String,
    },
    #[error("{path} is channel-trust format {found}, newer than this build of k3os-ops reads (format {STORE_FORMAT}); upgrade k3os-ops first")]
    /// The trust store was written by a newer build, in a format this build does not read.
    NewerStore {
        /// The trust store's path (`<state_dir>/channel-trust.json`).
        path: PathBuf,
        /// The `format` the file declares.
        found: u32,
    },
    #[error("{location} is missing")]
    /// A metadata file the workflow requires is not in the channel (404, no such file).
    Missing {
        /// The file's name in the channel (`timestamp.json`: the channel has no metadata).
        file: String,
        /// The URL or path where it was looked for.
        location: String,
    },
    #[error("{what} is larger than {max} bytes; refusing to read more (endless data)")]
    /// A metadata file is longer than its limit; reading stopped there.
    TooLarge {
        /// The URL or path of the file.
        what: String,
        /// The limit in bytes (the length its referrer pins, or the role's maximum).
        max: u64,
    },
    #[error("{what}: {found} valid signature(s) by {role} keys of root version {root_version}, {need} required")]
    /// A document carries fewer valid signatures by distinct keys of its role than the
    /// role's threshold.
    Threshold {
        /// The URL or path of the document (or the name a caller gave a local root).
        what: String,
        /// The role whose keys must sign it.
        role: Role,
        /// The version of the root whose keys and threshold were applied.
        root_version: u64,
        /// How many distinct keys of the role signed it validly.
        found: usize,
        /// The role's threshold.
        need: usize,
    },
    #[error("{role} metadata (version {version}) expired at {}, the node's time is {}: the channel is stale or frozen (re-sign it: `k3os-ops release timestamp`; an operator can override with `upgrade --ignore-expiry`)", meta::time_str(expires), meta::time_str(now))]
    /// A role's document expired before the time it is judged against ([`client::ExpiryRule::reference`]).
    Expired {
        /// The role whose document expired.
        role: Role,
        /// The expired document's version.
        version: u64,
        /// When it expired, as it says (UTC).
        expires: DateTime<Utc>,
        /// The time it was judged against: the node's clock, or the record's later time floor.
        now: DateTime<Utc>,
    },
    #[error("{location}: {role} version {found} is older than version {seen} this node already trusted (rollback)")]
    /// A role's document is older than the version this node already trusted (a rollback).
    Rollback {
        /// The role whose version went backwards.
        role: Role,
        /// The URL or path of the document.
        location: String,
        /// The version this node's [`Record`] holds for the role: the lowest it accepts.
        seen: u64,
        /// The version the document carries.
        found: u64,
    },
    #[error("{location}: expected version {expected}, found {found}")]
    /// A document's version is not the one it must have: the next root of the chain, or the
    /// version its referrer (timestamp, snapshot) pins.
    WrongVersion {
        /// The URL or path of the document.
        location: String,
        /// The version it must carry.
        expected: u64,
        /// The version it carries.
        found: u64,
    },
    #[error("{location}: expected {expected}, found {found} (mix-and-match or a damaged file)")]
    /// A file's length or a hash differs from what its referrer lists.
    Mismatch {
        /// The URL or path of the file.
        location: String,
        /// The length or `ALGORITHM HEX` the referrer lists, naming the referrer.
        expected: String,
        /// The length or `ALGORITHM HEX` of the bytes received.
        found: String,
    },
    #[error("{location}: {referrer} lists a hash of this {role} file by algorithm '{}', which this build cannot compute; refused (TUF 5.5.2: every listed hash must match)", algorithm.escape_debug())]
    /// A `meta` entry lists a hash by an algorithm this build cannot compute (never a pass).
    UnknownHash {
        /// The role whose file is referenced (snapshot, targets).
        role: Role,
        /// The referencing file (`timestamp.json`, `snapshot.json`), for messages.
        referrer: String,
        /// The algorithm as the referencing file names it (untrusted text, escaped in messages).
        algorithm: String,
        /// The URL or path of the referenced file.
        location: String,
    },
    #[error("{location}: {why}")]
    /// A metadata file could not be downloaded (connection, HTTP status, body read).
    Fetch {
        /// The URL of the file.
        location: String,
        /// What failed (the request's error or the server's HTTP status).
        why: String,
    },
    #[error("{refused}; refusing to sign over the channel's metadata as served: nothing was written (restore what the publisher last wrote)")]
    /// A publisher's command found the channel's current metadata not verifying as a node
    /// verifies it, and wrote nothing ([`client::served`]).
    Unverified {
        /// The check that failed (it names the file; part of this message, not a source, so
        /// it is printed once).
        refused: Box<TrustError>,
    },
    #[error("{location}: {why}")]
    /// The halt role's file (`halt.json`, [`halt`]) was refused: signatures below the
    /// delegated threshold, a version below the one recorded, missing after one was seen,
    /// expired, or a target outside `halt/*`. The channel is not used (a halt can only stop).
    Halt {
        /// The URL or path of `halt.json`.
        location: String,
        /// What was expected and what was found.
        why: String,
    },
    #[error("{what}: {why}")]
    /// The publisher's side refused to write metadata (keys missing for a role, a threshold
    /// out of range, no root or already one, no targets, a channel directory it cannot list).
    Publish {
        /// The role, document or directory involved.
        what: String,
        /// Why it was refused.
        why: String,
    },
}

impl TrustError {
    /// The role and expiry when this is an expiry refusal (the agent's `ChannelStale`).
    pub fn expired(&self) -> Option<(Role, DateTime<Utc>)> {
        match self {
            TrustError::Expired { role, expires, .. } => Some((*role, *expires)),
            _ => None,
        }
    }
}
