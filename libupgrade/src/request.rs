//! What a front end asks to stage, and how it is resolved to the release the stage must find.
//!
//! The CLI (`k3os-ops upgrade`) and the agent each map their own input — flags, an
//! `UpdateChannel` — to one [`StageRequest`] in one place, the way RAUC's command line and its
//! D-Bus service both fill the same install arguments and call the same install run. This
//! module owns the rest:
//!
//! - [`Wanted`]: a version (or the newest) of a channel, a release directory or URL, or an
//!   offline bundle file; plus a bundle directory searched for the wanted version before the
//!   channel (a site's removable medium, the agent's `K3OS_OPS_BUNDLE_DIR`).
//! - [`StageRequest::resolve`]: a bundle of the version from the bundle directory, else the
//!   channel through its signed metadata when the node has a root ([`crate::channel`]), into a
//!   [`Release`]: where its files are and what its signed manifest must be (the version asked
//!   for, and the manifest's exact length and sha256 when the signed metadata named it).
//! - [`Updater::stage`](crate::Updater::stage) and [`Updater::preview`](crate::Updater::preview)
//!   take that release with the request's [`StageOptions`]; `stage::verify` enforces both
//!   expectations before a byte is written, so no front end checks them again.

use std::path::{Path, PathBuf};

use crate::bundle::Bundle;
use crate::channel::{self, ChannelError, NodeRollout, SeedSource, TrustOptions};
use crate::config::Config;
use crate::manifest::Arch;
use crate::net::fetch::Source;
use crate::rollout::{Installed, Seed};
use crate::stage::{Origin, Release, StageOptions};

/// Where the wanted release is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// A version of a channel (`None` or `latest`: its newest for this node's architecture).
    Channel {
        /// The channel: a directory, an http(s) URL or `github-releases://OWNER/REPO`.
        channel: String,
        /// The version asked for; `None` (or `latest`) for the newest.
        version: Option<String>,
    },
    /// A release directory or URL; its manifest is trusted through the node's trust.d.
    Source(Source),
    /// An offline bundle file ([`crate::bundle`]).
    Bundle(PathBuf),
}

impl Wanted {
    /// A channel's release: the channel and the version asked of it (None: the newest).
    pub fn channel(channel: impl Into<String>, version: Option<&str>) -> Wanted {
        Wanted::Channel {
            channel: channel.into(),
            version: version.map(String::from),
        }
    }

    /// The version asked for by name (a channel's version other than `latest`), if any.
    pub fn version(&self) -> Option<&str> {
        match self {
            Wanted::Channel {
                version: Some(v), ..
            } if v != "latest" => Some(v),
            _ => None,
        }
    }
}

/// What resolving a [`StageRequest`] may write on the node. The channel's metadata is verified
/// the same way in every case.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Writes {
    /// Nothing (`upgrade --plan-only`): what was trusted is not recorded, no metadata file is
    /// kept, no seed file is created, nothing is dropped.
    Nothing,
    /// What a TUF client keeps of every update it verified, and nothing else: the trust record
    /// (root, versions, time floor) and the verified snapshot and targets files
    /// ([`crate::trust::kept::Kept`]), so the next poll of an unchanged channel downloads only the
    /// root probe and the timestamp. No seed file is created and no staged release is dropped
    /// (the agent's poller and claim check, which only look).
    Trust,
    /// Everything a resolution does: [`Writes::Trust`], plus the node's seed file on its first
    /// resolution and marking a staged release the channel withdrew bad.
    #[default]
    All,
}

/// One request to stage a release: what is wanted and how to stage it.
#[derive(Debug, Clone)]
pub struct StageRequest {
    /// The release wanted.
    pub wanted: Wanted,
    /// Offline bundles looked for the wanted channel version in, before the channel (None:
    /// the channel only). Files that are not bundles are skipped.
    pub bundle_dir: Option<PathBuf>,
    /// Accept the channel's signed metadata even when it has expired (`--ignore-expiry`).
    pub ignore_expiry: bool,
    /// What resolving may write on the node.
    pub writes: Writes,
    /// Resolve for the cluster this node belongs to, not for the node: the release staged in
    /// the node's other slot does not count as started, so a paused release is offered to
    /// the cluster only once resumed, whichever node staged it (the agent's poller and its
    /// checks; one node's head start must not carry the whole cluster past a pause).
    pub for_cluster: bool,
    /// How to fetch and write it.
    pub options: StageOptions,
    /// The seed that places the node in the channel's rollout waves (None: the node's own,
    /// from its seed file; the agent may pass one per cluster).
    pub seed: Option<Seed>,
    /// Take an explicitly named version even while its rollout withholds it
    /// (`--ignore-rollout`). `latest` always follows the rollouts.
    pub ignore_rollout: bool,
}

impl StageRequest {
    /// A request for `wanted` with default options and no bundle directory.
    pub fn new(wanted: Wanted) -> StageRequest {
        StageRequest {
            wanted,
            bundle_dir: None,
            ignore_expiry: false,
            writes: Writes::All,
            for_cluster: false,
            options: StageOptions::default(),
            seed: None,
            ignore_rollout: false,
        }
    }

    /// The same request with `options`.
    pub fn with_options(self, options: StageOptions) -> StageRequest {
        StageRequest { options, ..self }
    }

    /// The offline bundle of the wanted channel version in [`StageRequest::bundle_dir`], as
    /// [`StageRequest::resolve`] would take it before the channel; `None` when there is no
    /// bundle directory, no version named, or no bundle of it. Reads local files only: a front
    /// end that resolved the channel already (the agent's tick) asks this instead of resolving
    /// again.
    pub fn offline(&self) -> Result<Option<Release>, ResolveError> {
        let (Some(dir), Some(v)) = (&self.bundle_dir, self.checked_version()?) else {
            return Ok(None);
        };
        Ok(find_bundle(dir, v)?.map(|b| Release::from_bundle(b, true)))
    }

    /// The channel version asked for by name, refused when it is not a plain name
    /// ([`crate::version`]) before anything is looked up with it.
    fn checked_version(&self) -> Result<Option<&str>, ResolveError> {
        let (Wanted::Channel { channel, .. }, Some(v)) = (&self.wanted, self.wanted.version())
        else {
            return Ok(None);
        };
        crate::version::check_version(v).map_err(|source| ResolveError::Version {
            channel: channel.clone(),
            source,
        })?;
        Ok(Some(v))
    }

    /// Resolve what is wanted on a node configured by `cfg` (its channel root, trust record and
    /// seed file) that runs `running` and has `staged` in its other slot: the release to stage
    /// and what its signed manifest must be. Through signed metadata the releases' rollouts
    /// decide ([`crate::rollout`]); [`StageRequest::writes`] says what may be written.
    pub fn resolve(
        &self,
        cfg: &Config,
        running: Installed,
        staged: Option<Installed>,
    ) -> Result<Release, ResolveError> {
        match &self.wanted {
            Wanted::Bundle(path) => Ok(Release::from_bundle(Bundle::open(path)?, false)),
            Wanted::Source(source) => Ok(Release::at(source.clone())),
            Wanted::Channel { channel, .. } => {
                let version = self.wanted.version();
                // Checks the version asked for (a plain name) before anything is looked up.
                if let Some(rel) = self.offline()? {
                    return Ok(rel);
                }
                let mut trust = TrustOptions::from_config(cfg);
                trust.ignore_expiry = self.ignore_expiry;
                trust.read_only = self.writes == Writes::Nothing;
                trust.min_rate = self.options.min_rate_rule();
                let node = NodeRollout {
                    seed: match (self.seed, self.writes) {
                        (Some(s), _) => SeedSource::Given(s),
                        (None, Writes::All) => SeedSource::File(cfg.state_dir.clone()),
                        (None, _) => SeedSource::ReadOnly(cfg.state_dir.clone()),
                    },
                    running,
                    staged,
                    ignore_rollout: self.ignore_rollout,
                };
                let r = channel::resolve_for(channel, version, Arch::host(), &trust, Some(&node))
                    .map_err(|source| ResolveError::Channel {
                    channel: channel.clone(),
                    wanted: version.unwrap_or("latest").to_string(),
                    source: Box::new(source),
                })?;
                Ok(Release {
                    origin: Origin::Channel {
                        channel: channel.clone(),
                        wanted: version.unwrap_or("latest").to_string(),
                        location: r.location,
                        signed: r.pin.is_some(),
                        rollout: r.rollout.map(Box::new),
                    },
                    source: r.source,
                    version: Some(r.version),
                    generation: Some(r.generation),
                    pin: r.pin,
                })
            }
        }
    }
}

/// Why a request could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The channel could not be read or does not list the version.
    #[error("resolving {wanted} in channel {channel}: {source}")]
    Channel {
        /// The channel as given.
        channel: String,
        /// The version asked for.
        wanted: String,
        /// What went wrong (boxed: the channel's errors are large).
        #[source]
        source: Box<ChannelError>,
    },
    /// The version asked for is not a plain name ([`crate::version`]); nothing was read.
    #[error("channel {channel}: {source}")]
    Version {
        /// The channel as given.
        channel: String,
        /// What is wrong with the version.
        #[source]
        source: crate::version::VersionError,
    },
    /// The bundle directory could not be listed.
    #[error("bundle directory {}: {source}", dir.display())]
    BundleDir {
        /// The directory.
        dir: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// The bundle file could not be opened or is not a bundle.
    #[error(transparent)]
    Bundle(#[from] crate::error::Error),
}

impl ResolveError {
    /// The channel's error, when it was the channel that failed (e.g. to tell expired metadata).
    pub fn channel_error(&self) -> Option<&ChannelError> {
        match self {
            ResolveError::Channel { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

/// The bundle in `dir` whose header names `version` (the first in name order when several
/// do). Files that are not bundles are skipped; an unreadable directory is an error naming it.
fn find_bundle(dir: &Path, version: &str) -> Result<Option<Bundle>, ResolveError> {
    let entries = std::fs::read_dir(dir).map_err(|source| ResolveError::BundleDir {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    Ok(files
        .iter()
        .filter_map(|p| Bundle::open(p).ok())
        .find(|b| b.header.version == version))
}

/// A release resolved on this node with the one decision whether it is staged now
/// ([`crate::Updater::resolve_with_retry`]): the report of the resolution says that decision,
/// and the flow that acts on it takes the same value, so nobody derives it again.
#[derive(Debug)]
pub struct Resolved {
    /// The release to stage.
    pub release: Release,
    /// Whether it is staged now or held back because it failed on this node
    /// ([`crate::rollout::decide_retry`]); `Err`: the node's state file could not be read
    /// (the error names it), so no decision was taken.
    pub retry: crate::Result<crate::rollout::Retry>,
}

/// A release's retry decision is the node's, taken once where it resolves what to stage.
impl crate::Updater {
    /// Resolve `req` on this node (its channel root, trust record, seed and slots): the
    /// release to stage. The channel's rollouts see the booted slot's release as the running
    /// one (generation 0 when the booted slot cannot be told) and the other slot's when it is
    /// staged, not yet activated. When the staged release is withdrawn, the slot is marked bad
    /// (never activated) before the release offered instead is returned, unless `req` may not
    /// write it ([`crate::Writes`]). A node running a withdrawn release keeps it (see
    /// [`crate::rollout`]). A request [`StageRequest::for_cluster`] sees no staged release.
    pub fn resolve(&self, req: &StageRequest) -> Result<Release, ResolveError> {
        self.resolve_with_retry(req).map(|r| r.release)
    }

    /// [`Self::resolve`], with the retry decision for the release taken once: the resolution's
    /// report says it (a node that cannot read its state reports no retry wait) and the caller
    /// acts on the same value ([`Resolved::retry`]).
    pub fn resolve_with_retry(&self, req: &StageRequest) -> Result<Resolved, ResolveError> {
        // Only a channel's resolution looks at the slots (a bundle or a location does not).
        let (running, staged) = match req.wanted {
            Wanted::Channel { .. } => self.installed()?,
            _ => (unknown_release(), None),
        };
        let staged = staged.filter(|_| !req.for_cluster);
        let rel = req.resolve(&self.cfg, running, staged.clone())?;
        let dropped = match &rel.origin {
            Origin::Channel {
                rollout: Some(note),
                ..
            } => note.drop_staged.as_ref(),
            _ => None,
        };
        let mut dropped_now = false;
        if let (crate::Writes::All, Some(d), Some(s)) = (req.writes, dropped, &staged) {
            if d == s {
                dropped_now = true;
                let other = self.booted_slot()?.other();
                self.mark_bad(
                    other,
                    &format!(
                        "staged release {} (generation {}) was withdrawn by the channel's rollout: dropped, never to be activated",
                        d.version.escape_debug(),
                        d.generation
                    ),
                )?;
            }
        }
        let retry = self.retry(&rel, channel::node_now());
        if req.writes != crate::Writes::Nothing {
            let said = retry.as_ref().unwrap_or(&crate::rollout::Retry::Proceed);
            self.report_resolve(&rel, dropped_now, said);
        }
        Ok(Resolved {
            release: rel,
            retry,
        })
    }

    /// The release the booted slot runs and the one staged in the other slot, as the
    /// rollouts see them.
    fn installed(&self) -> crate::Result<(Installed, Option<Installed>)> {
        let Ok(booted) = self.booted_slot() else {
            return Ok((unknown_release(), None));
        };
        let st = self.load(Some(booted))?;
        let of = |r: &crate::state::SlotRecord| Installed {
            version: r.version.clone().unwrap_or_default(),
            generation: r.generation.unwrap_or(0),
        };
        let other = st.slot(booted.other());
        let staged = (other.state == crate::state::SlotState::Staged).then(|| of(other));
        Ok((of(st.slot(booted)), staged))
    }

    /// Whether `rel` is staged at `now` or held back because it failed on this node
    /// ([`crate::rollout::decide_retry`] with its record and, for a channel's release, its
    /// rollout's retries). A release whose version is not known before its manifest is read
    /// (`--source`) proceeds.
    fn retry(
        &self,
        rel: &Release,
        now: chrono::DateTime<chrono::Utc>,
    ) -> crate::Result<crate::rollout::Retry> {
        let Some(version) = rel.version.as_deref() else {
            return Ok(crate::rollout::Retry::Proceed);
        };
        let st = self.store.load()?;
        let retries = match &rel.origin {
            Origin::Channel {
                rollout: Some(note),
                ..
            } => note.retries,
            _ => None,
        };
        Ok(crate::rollout::decide_retry(
            st.failed_for(version, rel.generation),
            retries,
            now,
        ))
    }
}

/// The running release when it cannot be told: generation 0, older than every release.
fn unknown_release() -> Installed {
    Installed {
        version: String::new(),
        generation: 0,
    }
}
