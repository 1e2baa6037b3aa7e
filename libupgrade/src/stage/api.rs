//! What a stage is asked and what it answers: the [`StageOptions`] a caller sets, the
//! [`Progress`] it is told, the [`StageReport`] of a run and the [`StagePreview`] of one before
//! its first byte. The pipeline that honours them is the parent module.

use std::path::PathBuf;
use std::time::Duration;

use bootconfig::Slot;

use crate::bundle::Bundle;
use crate::net::fetch::Source;
use crate::trust::ManifestPin;
use serde::{Deserialize, Serialize};

use super::{ArtifactCost, Clock, ExtraSource, MinRate, Schedule, SystemClock};

/// Reports download/write progress (a progress bar in the CLI, Node annotations in the agent).
pub trait Progress {
    /// Starting `what` of `total` bytes, `already` of which are held from an earlier attempt.
    fn begin(&self, what: &str, total: u64, already: u64);
    /// `bytes` more of the current file are in place (fetched, copied or kept).
    fn advance(&self, bytes: u64);
    /// The current file is done.
    fn end(&self);
    /// Of the bytes advanced, `bytes` came over the network (default: ignored).
    fn fetched(&self, _bytes: u64) {}
    /// Of the bytes advanced, `bytes` were already on the node (running slot, earlier attempt).
    fn reused(&self, _bytes: u64) {}
}

/// Progress that goes nowhere.
pub struct NoProgress;

impl Progress for NoProgress {
    fn begin(&self, _: &str, _: u64, _: u64) {}
    fn advance(&self, _: u64) {}
    fn end(&self) {}
}

/// Options of [`Updater::stage`](crate::Updater::stage).
#[derive(Debug, Clone)]
pub struct StageOptions {
    /// Install a release older (by generation) than the running one.
    pub allow_downgrade: bool,
    /// Trust directory instead of the configured one.
    pub trust_dir: Option<PathBuf>,
    /// First delay between download attempts (doubles per failed attempt, up to 30 s).
    pub retry_delay: Duration,
    /// Cap on download bandwidth, bytes per second (None: as fast as the link allows).
    pub max_rate: Option<u64>,
    /// How long one stage attempt keeps retrying transient failures (None: for ever, only
    /// when asked); the final error names the URL, the last error, the attempts and the time.
    pub retry_for: Option<Duration>,
    /// Responses slower than this over a whole window are cut and retried (None: no floor;
    /// lowered to half of `max_rate` when a cap is set).
    pub min_rate: Option<MinRate>,
    /// Network bytes of artifacts this attempt may read (`--max-bytes`; the agent passes what
    /// today's quota has left): the stage stops with [`Error::Stopped`](crate::Error::Stopped) before a byte
    /// more, keeping what it wrote. None: no budget. Manifest, signature, probes and chunk
    /// indexes are not counted (a few KiB, and under 0.1 % of an image for the indexes).
    pub max_bytes: Option<u64>,
    /// Where chunks are looked for before the origin, in order, after the running slot.
    pub extra_sources: Vec<ExtraSource>,
    /// When the stage may fetch and how fast (None: any time, at `max_rate`). `max_rate`
    /// still caps every window. After the last window the stage stops with
    /// [`Error::Stopped`](crate::Error::Stopped), keeping what it wrote.
    pub schedule: Option<Schedule>,
    /// The clock the schedule and the rate limit follow (tests inject a virtual one).
    pub clock: std::sync::Arc<dyn Clock>,
    /// Bytes or time, when a listed patch fetches fewer bytes than chunks but may take longer
    /// to apply ([`Prefer`](crate::Prefer); `upgrade --prefer`).
    pub prefer: crate::Prefer,
}

/// `StageOptions::retry_for`'s default: a few hours, what a thin link may need to come back.
pub const DEFAULT_RETRY_FOR: Duration = Duration::from_secs(6 * 3600);

impl StageOptions {
    /// The minimum-rate rule in force: never above half the bandwidth cap.
    pub fn min_rate_rule(&self) -> Option<MinRate> {
        self.min_rate.map(|r| match self.max_rate {
            Some(cap) => MinRate {
                bytes_per_sec: r.bytes_per_sec.min(cap / 2),
                ..r
            },
            None => r,
        })
    }
}

impl Default for StageOptions {
    fn default() -> Self {
        StageOptions {
            allow_downgrade: false,
            trust_dir: None,
            retry_delay: Duration::from_secs(1),
            max_rate: None,
            retry_for: Some(DEFAULT_RETRY_FOR),
            min_rate: Some(MinRate::DEFAULT),
            max_bytes: None,
            extra_sources: Vec::new(),
            schedule: None,
            clock: std::sync::Arc::new(SystemClock),
            prefer: crate::Prefer::Auto,
        }
    }
}

/// What [`Updater::stage`](crate::Updater::stage) did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageReport {
    /// The slot the release was staged into.
    pub slot: Slot,
    /// The release's version string.
    pub version: String,
    /// The release's generation.
    pub generation: u64,
    /// Key id that signed the manifest.
    pub signed_by: String,
    /// True when the slot already held exactly this release.
    pub already_staged: bool,
    /// True when an earlier interrupted download was continued.
    pub resumed: bool,
    /// Bytes this run wrote into the slot (fetched or copied; 0 when already staged).
    pub bytes_written: u64,
    /// Bytes fetched over the network by this run.
    pub bytes_fetched: u64,
    /// Bytes this run did not fetch: copied from the running slot or kept from an earlier
    /// attempt.
    pub bytes_reused: u64,
    /// Of `bytes_fetched`, bytes that came from extra mirrors ([`ExtraSource::Mirror`](crate::net::fetch::ExtraSource::Mirror)).
    #[serde(default)]
    pub bytes_from_mirrors: u64,
    /// Chunks an extra source served that did not match the signed index (refused, taken from
    /// the next source).
    #[serde(default)]
    pub chunks_refused: u64,
    /// The artifacts this run rebuilt from the running slot by a patch (absent: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patched: Vec<PatchOutcome>,
}

/// How a patched artifact went: rebuilt from the running slot's copy by a patch of the signed
/// manifest, with what its output did not deliver taken by chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchOutcome {
    /// Which artifact.
    pub artifact: crate::manifest::Part,
    /// The version the patch's base belongs to.
    pub from: String,
    /// Bytes of the patch this run fetched.
    pub patch_fetched: u64,
    /// Bytes of the artifact written from the patch's output (each chunk verified).
    pub rebuilt: u64,
    /// Chunks of its output that did not match the signed index (taken by the chunk plan).
    pub mismatched_chunks: u64,
    /// Why the patch was given up for the rest of the artifact (taken by chunks), if it was.
    pub fell_back: Option<String>,
    /// The patch's base was proven by hashing the running slot's copy (no kept manifest
    /// named the running build). Absent (false) in reports of earlier builds.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub base_hashed: bool,
    /// Bytes of its output not rebuilt because the target already held them (a resumed
    /// attempt: the ops that only reach chunks written before are skipped). Absent when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl std::fmt::Display for PatchOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} by patch from {} ({} of patch fetched, {} rebuilt",
            self.artifact,
            self.from.escape_debug(),
            crate::units::Size(self.patch_fetched),
            crate::units::Size(self.rebuilt)
        )?;
        if self.base_hashed {
            f.write_str(", base proven by hashing the running slot")?;
        }
        if self.skipped > 0 {
            write!(
                f,
                ", {} ({} bytes) already written skipped",
                crate::units::Size(self.skipped),
                self.skipped
            )?;
        }
        if self.mismatched_chunks > 0 {
            write!(
                f,
                ", {} chunk(s) not matching taken by range",
                self.mismatched_chunks
            )?;
        }
        if let Some(why) = &self.fell_back {
            write!(f, "; fell back to chunks: {why}")?;
        }
        f.write_str(")")
    }
}

/// What a stage would do and cost, known before its first byte ([`Updater::preview`](crate::Updater::preview)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagePreview {
    /// The slot the release would be staged into.
    pub slot: Slot,
    /// The release's version string.
    pub version: String,
    /// The release's generation.
    pub generation: u64,
    /// The slot already holds exactly this release: nothing would be fetched.
    pub already_staged: bool,
    /// An interrupted attempt of this release would be continued.
    pub resume: bool,
    /// Per part: the three slot files, then the payloads this build stages
    /// ([`crate::payload::kinds::parts`] order; empty when already staged).
    pub artifacts: Vec<ArtifactCost>,
}

impl StagePreview {
    /// Bytes the stage would fetch over the network.
    pub fn fetch(&self) -> u64 {
        self.artifacts.iter().map(|a| a.fetch).sum()
    }
    /// Bytes it would not fetch (kept from an earlier attempt, copied from local files).
    pub fn reuse(&self) -> u64 {
        self.artifacts.iter().map(|a| a.reuse).sum()
    }
}

/// A resolved release: where its files are and what its signed manifest must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// Where its files are.
    pub source: Source,
    /// The version its signed manifest must name (None: any, for a release given by location).
    pub version: Option<String>,
    /// The generation the channel or bundle header lists (the manifest's is authoritative).
    pub generation: Option<u64>,
    /// When a channel's signed metadata named the release: the exact length and sha256 its
    /// `manifest.json` must have; it is then accepted on the targets role's word without a
    /// trust.d signature (see [`crate::trust`]).
    pub pin: Option<ManifestPin>,
    /// How it was found, for messages.
    pub origin: Origin,
}

/// How a [`Release`] was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Given by location.
    Source,
    /// An offline bundle; `instead_of_channel`: found in the bundle directory for a channel
    /// version.
    Bundle {
        /// The bundle file.
        path: PathBuf,
        /// Its header's format.
        format: u32,
        /// Found in the bundle directory in place of the channel.
        instead_of_channel: bool,
    },
    /// Picked from a channel.
    Channel {
        /// The channel as given.
        channel: String,
        /// The version asked for (`latest` for the newest).
        wanted: String,
        /// The release directory, or the manifest asset's URL.
        location: String,
        /// Chosen through the channel's signed metadata.
        signed: bool,
        /// What the releases' rollouts meant for the choice (None: no rollout took part);
        /// boxed, as it is large and most releases have none.
        rollout: Option<Box<crate::channel::RolloutNote>>,
    },
}

impl Release {
    /// A release given by location (tests, `upgrade --source`): trusted through trust.d, any
    /// version.
    pub fn at(source: Source) -> Release {
        Release {
            source,
            version: None,
            generation: None,
            pin: None,
            origin: Origin::Source,
        }
    }

    /// The release an offline bundle holds; `instead_of_channel`: found in a bundle
    /// directory for a channel's version.
    pub(crate) fn from_bundle(b: Bundle, instead_of_channel: bool) -> Release {
        Release {
            version: Some(b.header.version.clone()),
            generation: Some(b.header.generation),
            pin: None,
            origin: Origin::Bundle {
                path: b.path.clone(),
                format: b.header.format,
                instead_of_channel,
            },
            source: Source::Bundle(b),
        }
    }
}

/// One line for people: where the release comes from and what it is.
impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let version = self.version.as_deref().unwrap_or("?").escape_debug();
        let generation = self.generation.map(|g| g.to_string());
        let generation = generation.as_deref().unwrap_or("?");
        match &self.origin {
            Origin::Source => write!(f, "release at {}", self.source.location("")),
            Origin::Bundle {
                path,
                format,
                instead_of_channel,
            } => {
                write!(
                    f,
                    "bundle {}: release {version} (generation {generation}), format {format}",
                    path.display()
                )?;
                if *instead_of_channel {
                    write!(f, " (offline bundle, in place of the channel)")?;
                }
                Ok(())
            }
            Origin::Channel {
                channel,
                wanted,
                location,
                signed,
                rollout,
            } => {
                write!(
                    f,
                    "channel {channel}: {} resolves to {version} (generation {generation}) at {location}",
                    wanted.escape_debug()
                )?;
                if *signed {
                    write!(f, " (signed channel metadata)")?;
                }
                if let Some(note) = rollout {
                    write!(f, "; rollout: {note}")?;
                }
                Ok(())
            }
        }
    }
}
