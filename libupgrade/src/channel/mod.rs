//! Update channels: where releases are published and how a node finds the one it wants.
//!
//! This module owns the channel formats and their resolution: `resolve` (from the index),
//! `resolve_with` (through the channel's signed metadata when the node has a root, see
//! [`crate::trust`] and `trusted.rs`; the picked manifest is then pinned by length and
//! sha256). Release signatures are not checked here: staging does, against the node's trust
//! dir, before writing anything. Files: `doc` (bounded small downloads), `local` (channel
//! directories and their index), `github`, `resolve`, `trusted`.
//!
//! A channel is one of:
//! - a directory (a local path or `file://` URL) or a static http(s) site holding
//!   `index.json` plus one subdirectory per release (`manifest.json`, `manifest.json.sig`, the
//!   artifacts). `index.json` is `{"releases":[{"version","generation","arch","path"}, …]}`
//!   listing releases newest first; `path` is relative to the channel (`v1.2.0/`).
//!   [`write_index`] rebuilds it from the release subdirectories.
//! - `github-releases://OWNER/REPO`: resolved through the GitHub releases API
//!   (`GET {api}/repos/OWNER/REPO/releases`, following `Link: rel="next"` pages; `{api}` is
//!   `$K3OS_OPS_GITHUB_API` or `https://api.github.com`). A GitHub release carries the files of
//!   one or more architectures as assets. For architecture `A`, file `X` of a release is the asset
//!   named `A-X` if there is one (`x86_64-manifest.json`, `aarch64-rootfs.squashfs`; the aliases
//!   `amd64-`/`arm64-` also work), else the asset named `X`. Drafts are never used; prereleases
//!   only when asked for by version. Its "generation" comes from the release's manifest, which
//!   is fetched (and later verified by staging) for that purpose; fetched manifests are cached
//!   in-process per asset (URL, id, size, `updated_at`) so a polling agent downloads each one
//!   once, and API pages are re-requested with `If-None-Match` (a 304 costs no rate limit). A release whose manifest is missing (404) or malformed is skipped by `latest` and
//!   `list` (logged, and named if nothing else matches) but is an error when asked for by name;
//!   transport errors always fail the resolution.
//!
//! Every HTTP access goes through [`crate::net::http::client`]. Indexes and manifests are small, so
//! they are read whole, with a size cap.

use std::io;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::net::fetch::Source;

mod doc;
mod github;
mod local;
mod resolve;
mod targets;
mod trusted;
mod waves;

use crate::manifest::{Arch, ManifestError, MANIFEST_FILE, SIGNATURE_FILE};
pub use local::{build_index, read_local_index, write_index};
pub use resolve::{list, list_with, resolve, resolve_for, resolve_with};
pub use trusted::{node_now, MetadataPolicy, TrustOptions, GITHUB_METADATA_TAG, TEST_NOW_ENV};
pub use waves::{NodeRollout, RolloutNote, SeedSource, LAST_SEED};

/// File name of a channel's index.
pub const INDEX_FILE: &str = "index.json";
/// URL scheme of GitHub-releases channels.
pub const GITHUB_SCHEME: &str = "github-releases://";
/// Environment variable overriding the GitHub API base URL.
pub const GITHUB_API_ENV: &str = "K3OS_OPS_GITHUB_API";
/// Default GitHub API base URL.
pub const GITHUB_API_DEFAULT: &str = "https://api.github.com";
/// Largest index, manifest or API page read into memory.
const MAX_DOC: u64 = 16 << 20;
/// At most this many API pages are followed (100 releases each).
const MAX_PAGES: usize = 20;

/// The `index.json` format this build writes and the newest it reads. v0.1.0 wrote no
/// `format` field (read as 1) and ignores it; format 1 grows only by optional fields.
pub const INDEX_FORMAT: u32 = 1;

fn index_format_v1() -> u32 {
    1
}

/// A channel's list of releases, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    /// [`INDEX_FORMAT`]; absent in indexes written by v0.1.0.
    #[serde(default = "index_format_v1")]
    pub format: u32,
    /// The channel's releases of every architecture, newest first.
    pub releases: Vec<IndexEntry>,
}

impl Default for Index {
    fn default() -> Self {
        Index::new(Vec::new())
    }
}

/// One release of a channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    /// The release's version string, as its manifest names it (`v1.2.0`).
    pub version: String,
    /// The release's generation from its manifest; higher is newer.
    pub generation: u64,
    /// The architecture the release is built for.
    pub arch: Arch,
    /// Release directory relative to the channel (`v1.2.0/`); for GitHub channels the tag.
    pub path: String,
}

/// A release picked from a channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedRelease {
    /// The release's version string (`v1.2.0`).
    pub version: String,
    /// The release's generation; higher is newer.
    pub generation: u64,
    /// The architecture the release is built for.
    pub arch: Arch,
    /// Human-readable location: the release directory (local path or URL ending in `/`), or for
    /// GitHub the URL of the manifest asset.
    pub location: String,
    /// How to reach each file of the release: hand this to [`crate::Updater::stage`].
    /// A local directory, an http(s) base URL, or (GitHub) one URL per file name.
    pub source: Source,
    /// When the channel's signed metadata chose this release: the exact length and sha256 its
    /// `manifest.json` must have (carried on as [`crate::Release::pin`]).
    pub pin: Option<crate::trust::ManifestPin>,
    /// When the releases' rollouts took part in the choice: the seed, what waits and why.
    pub rollout: Option<RolloutNote>,
}

/// Why a channel could not be read or a release not found.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// A local channel file or directory could not be read or written, or an HTTP response
    /// body could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory, or the URL whose body failed.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// The index is of a newer format than this build reads.
    #[error("{what} is index format {found}, newer than this build of k3os-ops reads (format {INDEX_FORMAT}); upgrade k3os-ops first")]
    NewerIndex {
        /// The index read (its path or URL).
        what: String,
        /// The `format` it declares.
        found: u32,
    },
    /// A document (index, manifest, API page) is not the JSON expected.
    #[error("{what} is not valid JSON of the expected shape: {source}")]
    Parse {
        /// The document read (its path or URL).
        what: String,
        /// The JSON decoder's error.
        source: serde_json::Error,
    },
    /// An HTTP request failed without a status to report (client setup, connection, TLS,
    /// timeout).
    #[error("{url}: {source}")]
    Http {
        /// The URL requested.
        url: String,
        /// The HTTP client's error.
        source: reqwest::Error,
    },
    /// The server answered with an HTTP status other than success.
    #[error("{url}: server answered HTTP {status}")]
    Status {
        /// The URL requested.
        url: String,
        /// The HTTP status code.
        status: u16,
    },
    /// A document is larger than the cap on what is read into memory (16 MiB).
    #[error("{what} is larger than {MAX_DOC} bytes; refusing to read it")]
    TooLarge {
        /// The document (its path or URL).
        what: String,
    },
    /// The channel string or a URL built from it is not valid.
    #[error("channel '{channel}': {why}")]
    BadChannel {
        /// The channel as given.
        channel: String,
        /// What is wrong with it.
        why: String,
    },
    /// The channel has no release of the wanted version for the architecture.
    #[error("channel '{channel}' has no release {wanted} for {arch} (it has: {available})")]
    NotFound {
        /// The channel as given.
        channel: String,
        /// The version asked for, or `latest`.
        wanted: String,
        /// The node's architecture.
        arch: Arch,
        /// The releases the channel does have, as text for the operator.
        available: String,
    },
    /// The version asked for is withheld from this node by its rollout.
    #[error("channel {channel}: release {} is not offered to this node (seed {seed}): {hold}; {}", .version.escape_debug(), withheld_hint(.hold))]
    Withheld {
        /// The channel as given.
        channel: String,
        /// The version asked for.
        version: String,
        /// The node's seed.
        seed: u32,
        /// Why it is withheld.
        hold: crate::rollout::Hold,
        /// Every release of this architecture the channel lists as withdrawn (oldest first),
        /// as [`RolloutNote::withdrawn`] lists them for a release that is offered.
        withdrawn: Vec<String>,
    },
    /// No listed release at or below the running one, and none newer offered to this node.
    #[error("channel {channel}: nothing is offered to this node (seed {seed}, running {running:?}){}", waiting.as_ref().map(|w| format!("; {w}")).unwrap_or_default())]
    NothingOffered {
        /// The channel as given.
        channel: String,
        /// The release the node runs.
        running: String,
        /// The node's seed.
        seed: u32,
        /// The newer release it waits for, and why, as text.
        waiting: Option<String>,
    },
    /// The node's seed file could not be used.
    #[error("channel {channel}: {source}")]
    Seed {
        /// The channel as given.
        channel: String,
        /// What is wrong with the seed file (boxed: it is large).
        #[source]
        source: Box<crate::rollout::SeedError>,
    },
    /// A release's manifest, read to learn its generation, is invalid.
    #[error("manifest {location}: {source}")]
    Manifest {
        /// The URL or path of the manifest.
        location: String,
        /// What is wrong with it.
        source: ManifestError,
    },
    /// A release directory being indexed has a manifest but no signature beside it.
    #[error("release directory {dir} has {MANIFEST_FILE} but no {SIGNATURE_FILE}; sign it before indexing")]
    Unsigned {
        /// The release directory.
        dir: PathBuf,
    },
    /// Two releases of one architecture claim the same generation.
    #[error("channel {channel}: releases {first} and {second} both claim generation {generation} for {arch}")]
    DuplicateGeneration {
        /// The channel (its path or URL).
        channel: String,
        /// The first release's path or tag.
        first: String,
        /// The second release's path or tag.
        second: String,
        /// The generation both claim.
        generation: u64,
        /// Their architecture.
        arch: Arch,
    },
    /// An index entry's `path` leaves the channel (absolute, `..`, a URL).
    #[error("index entry path '{}' must be a relative directory inside the channel", path.escape_debug())]
    BadPath {
        /// The entry's path as written in the index (untrusted: escaped when printed).
        path: String,
    },
    /// The channel's signed metadata was refused.
    #[error("channel {channel}: {source}")]
    Trust {
        /// The channel as given.
        channel: String,
        /// Why the metadata was refused.
        source: crate::trust::TrustError,
    },
    /// The node requires signed metadata but the channel carries none usable.
    #[error("channel {channel} must carry signed metadata: {why}")]
    MetadataRequired {
        /// The channel as given.
        channel: String,
        /// Why no metadata could be used.
        why: String,
    },
}

/// What an operator can do about a withheld release: wait or skip the wave, but never take a
/// withdrawn one (the publisher's way back is a new release).
fn withheld_hint(hold: &crate::rollout::Hold) -> &'static str {
    match hold {
        crate::rollout::Hold::Withdrawn { .. } => {
            "a withdrawn release is never taken, whatever the flags; the publisher moves nodes on with a new release"
        }
        _ => "`--ignore-rollout` takes it anyway",
    }
}

impl ChannelError {
    /// The role and expiry when the channel's metadata was refused as expired (what the agent
    /// reports as `ChannelStale`).
    pub fn metadata_expired(
        &self,
    ) -> Option<(crate::trust::meta::Role, chrono::DateTime<chrono::Utc>)> {
        match self {
            ChannelError::Trust { source, .. } => source.expired(),
            _ => None,
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ChannelError + '_ {
    move |source| ChannelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Newest first: generation descending, then architecture and path for a stable order.
fn sort_newest_first(entries: &mut [IndexEntry]) {
    entries.sort_by(|a, b| {
        b.generation
            .cmp(&a.generation)
            .then_with(|| a.arch.as_str().cmp(b.arch.as_str()))
            .then_with(|| a.path.cmp(&b.path))
    });
}

pub(super) fn check_entry_path(path: &str) -> Result<(), ChannelError> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path.contains("://")
        || path.contains('\\')
        || Path::new(path)
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if bad {
        return Err(ChannelError::BadPath {
            path: path.to_string(),
        });
    }
    Ok(())
}

impl Index {
    /// An index of this build's format.
    pub fn new(releases: Vec<IndexEntry>) -> Index {
        Index {
            format: INDEX_FORMAT,
            releases,
        }
    }

    /// Parse an index document; entries are re-sorted newest first and their paths checked; an
    /// entry whose version is not a plain name ([`crate::version`]) is dropped.
    /// A newer format is refused before its entries are read.
    pub fn parse(bytes: &[u8], what: &str) -> Result<Index, ChannelError> {
        #[derive(Deserialize)]
        struct Head {
            #[serde(default = "index_format_v1")]
            format: u32,
        }
        let head: Head = serde_json::from_slice(bytes).map_err(|source| ChannelError::Parse {
            what: what.to_string(),
            source,
        })?;
        if head.format > INDEX_FORMAT {
            return Err(ChannelError::NewerIndex {
                what: what.to_string(),
                found: head.format,
            });
        }
        let mut index: Index =
            serde_json::from_slice(bytes).map_err(|source| ChannelError::Parse {
                what: what.to_string(),
                source,
            })?;
        for e in &index.releases {
            check_entry_path(&e.path)?;
        }
        // A release whose version is not a plain name is never resolved to (logged, escaped).
        index
            .releases
            .retain(|e| match crate::version::check_version(&e.version) {
                Ok(()) => true,
                Err(err) => {
                    log::warn!("{what}: entry {} skipped: {err}", e.path.escape_debug());
                    false
                }
            });
        sort_newest_first(&mut index.releases);
        Ok(index)
    }

    /// The index as pretty-printed JSON with a trailing newline, as written to `index.json`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("index serializes");
        v.push(b'\n');
        v
    }

    /// The newest entry for `arch`, or the entry with exactly `version` for `arch`
    /// (`None` or `"latest"` = newest).
    pub fn find(&self, version: Option<&str>, arch: Arch) -> Option<&IndexEntry> {
        match version {
            None | Some("latest") => self.releases.iter().find(|e| e.arch == arch),
            Some(v) => self
                .releases
                .iter()
                .find(|e| e.arch == arch && e.version == v),
        }
    }

    fn describe(&self) -> String {
        if self.releases.is_empty() {
            return "no releases".into();
        }
        self.releases
            .iter()
            // Versions come from the channel, not from the operator: escaped.
            .map(|e| {
                format!(
                    "{} ({}, generation {})",
                    e.version.escape_debug(),
                    e.arch,
                    e.generation
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What a channel string designates.
enum Kind {
    Local {
        dir: PathBuf,
        index: PathBuf,
    },
    Http {
        base: reqwest::Url,
        index: reqwest::Url,
    },
    GitHub {
        owner: String,
        repo: String,
    },
}

fn parse_channel(channel: &str) -> Result<Kind, ChannelError> {
    let bad = |why: &str| ChannelError::BadChannel {
        channel: channel.to_string(),
        why: why.to_string(),
    };
    if let Some(rest) = channel.strip_prefix(GITHUB_SCHEME) {
        let parts: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
        let ok = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        };
        if parts.len() != 2 || !parts.iter().all(|p| ok(p)) || parts.contains(&"..") {
            return Err(bad("expected github-releases://OWNER/REPO"));
        }
        return Ok(Kind::GitHub {
            owner: parts[0].into(),
            repo: parts[1].into(),
        });
    }
    if channel.starts_with("http://") || channel.starts_with("https://") {
        let url =
            reqwest::Url::parse(channel).map_err(|e| bad(&format!("not a valid URL: {e}")))?;
        if url.path().ends_with(&format!("/{INDEX_FILE}")) {
            let base = url.join("./").map_err(|e| bad(&e.to_string()))?;
            return Ok(Kind::Http { base, index: url });
        }
        let base = if url.path().ends_with('/') {
            url
        } else {
            reqwest::Url::parse(&format!("{channel}/")).map_err(|e| bad(&e.to_string()))?
        };
        let index = base.join(INDEX_FILE).map_err(|e| bad(&e.to_string()))?;
        return Ok(Kind::Http { base, index });
    }
    let path = match channel.strip_prefix("file://") {
        Some(p) => PathBuf::from(p),
        None if channel.contains("://") => {
            return Err(bad(
                "unknown scheme (expected a path, http(s)://, file:// or github-releases://)",
            ))
        }
        None => PathBuf::from(channel),
    };
    if path.as_os_str().is_empty() {
        return Err(bad("empty path"));
    }
    if path.file_name().is_some_and(|n| n == INDEX_FILE) && !path.is_dir() {
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        return Ok(Kind::Local { dir, index: path });
    }
    Ok(Kind::Local {
        index: path.join(INDEX_FILE),
        dir: path,
    })
}

/// For the fuzz targets (`fuzz/`, feature `fuzzing`).
#[cfg(feature = "fuzzing")]
pub use github::fuzzing;

#[cfg(test)]
mod tests;
