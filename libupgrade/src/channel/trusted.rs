//! Resolving a release through a channel's signed metadata ([`crate::trust`]): where the
//! metadata files of each kind of channel are, the node's policy when a channel has none, and
//! picking the release from the verified targets. The index (`index.json`, the GitHub listing)
//! is not read at all when the metadata decides.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::doc::{client, get_bounded};
use super::github::{release_assets, GitHub};
use super::targets::{pick, Target};
use super::waves::{self, NodeRollout};
use super::{check_entry_path, parse_channel, ChannelError, IndexEntry, Kind, ResolvedRelease};
use crate::manifest::{Arch, MANIFEST_FILE};
use crate::net::fetch::Source;
use crate::net::rate::MinRate;
use crate::trust::client::ExpiryRule;
use crate::trust::kept::Kept;
use crate::trust::meta::Targets;
use crate::trust::store::Store;
use crate::trust::{self, ManifestPin, MetaSource, Record, TrustError};

/// Tag of the GitHub release whose assets are a `github-releases://` channel's metadata files.
pub const GITHUB_METADATA_TAG: &str = "channel-metadata";

/// What a node does with a channel that has no metadata.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetadataPolicy {
    /// Use metadata when the node has a root and the channel has metadata; a channel without
    /// metadata resolves from its index (v0.1.0 channels keep working) until the node has once
    /// trusted that channel's metadata, after which it is required for that channel.
    #[default]
    Auto,
    /// Every channel must carry metadata and the node must have a root.
    Required,
}

/// How a node checks channel metadata (from its config, plus per-command overrides).
#[derive(Debug, Clone)]
pub struct TrustOptions {
    /// The node's starting root (`channel_root`, default `/etc/k3os-ops/root.json`).
    pub root_file: PathBuf,
    /// The record of what it trusted (`<state_dir>/channel-trust.json`).
    pub store_file: PathBuf,
    /// Whether channels without metadata are still accepted (`channel_metadata` in the config).
    pub policy: MetadataPolicy,
    /// The clock (None: the system clock); tests set it.
    pub now: Option<DateTime<Utc>>,
    /// `upgrade --ignore-expiry`.
    pub ignore_expiry: bool,
    /// The `--min-rate` rule for metadata downloads.
    pub min_rate: Option<MinRate>,
    /// Verify without recording what was trusted or keeping the verified files, and without
    /// creating the record's lock (`upgrade --plan-only` writes nothing). The record is
    /// replaced by atomic renames, so reading it unlocked sees a whole one; kept files are
    /// still read (and checked).
    pub read_only: bool,
}

impl TrustOptions {
    /// The node's settings from its config, the system clock, expiry enforced and the default
    /// minimum download rate.
    pub fn from_config(cfg: &crate::Config) -> TrustOptions {
        TrustOptions {
            root_file: cfg.channel_root.clone(),
            store_file: cfg.state_dir.join(trust::STORE_FILE),
            policy: cfg.channel_metadata,
            now: test_now(),
            ignore_expiry: false,
            min_rate: Some(MinRate::DEFAULT),
            read_only: false,
        }
    }
}

/// For tests only: an RFC 3339 time the node's channel resolution takes as "now" (metadata
/// expiry and rollout waves), so the binary's tests can move a node through a rollout. Never
/// set it on a node: a wrong clock makes it accept expired metadata or join waves early.
pub const TEST_NOW_ENV: &str = "K3OS_OPS_TEST_NOW";

/// "Now" as the node's channel resolution takes it: the system clock, or the test clock
/// [`TEST_NOW_ENV`] sets (front ends take their other time-based decisions, e.g. a release's
/// retries, on the same clock).
pub fn node_now() -> DateTime<Utc> {
    test_now().unwrap_or_else(Utc::now)
}

/// The clock [`TEST_NOW_ENV`] sets, if it is set (an unreadable value is logged and ignored).
fn test_now() -> Option<DateTime<Utc>> {
    let v = std::env::var(TEST_NOW_ENV).ok()?;
    match DateTime::parse_from_rfc3339(v.trim()) {
        Ok(t) => Some(t.with_timezone(&Utc)),
        Err(e) => {
            log::warn!(
                "{TEST_NOW_ENV}={:?} is not an RFC 3339 time ({e}); using the system clock",
                v.escape_debug()
            );
            None
        }
    }
}

/// A metadata file's name → its URL (None: the channel has no such file).
type UrlOf = Box<dyn Fn(&str) -> Option<String>>;

/// Files by URL: an http(s) channel (`base` + name) or GitHub assets (name → URL).
struct UrlMeta {
    client: reqwest::blocking::Client,
    urls: UrlOf,
    min_rate: Option<MinRate>,
    describe: String,
}

impl MetaSource for UrlMeta {
    fn fetch(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>, TrustError> {
        match (self.urls)(name) {
            Some(url) => get_bounded(&self.client, &url, max, self.min_rate),
            None => Ok(None),
        }
    }
    fn location(&self, name: &str) -> String {
        (self.urls)(name).unwrap_or_else(|| format!("{} ({name})", self.describe))
    }
}

/// The key a channel's record is stored under.
fn channel_key(kind: &Kind) -> String {
    match kind {
        Kind::Local { dir, .. } => dir.display().to_string(),
        Kind::Http { base, .. } => base.to_string(),
        Kind::GitHub { owner, repo } => format!("{}{owner}/{repo}", super::GITHUB_SCHEME),
    }
}

fn trust_err(channel: &str) -> impl FnOnce(TrustError) -> ChannelError + '_ {
    move |source| ChannelError::Trust {
        channel: channel.to_string(),
        source,
    }
}

/// The record to start from: the stored one, or the node's root file; a root file newer than
/// the stored root (an image built with a rotated root) replaces it.
fn starting_record(
    stored: Option<&Record>,
    root_file: &Path,
) -> Result<Option<Record>, TrustError> {
    let baked = match fs::read(root_file) {
        Ok(b) => Some(Record::from_root(&b, &root_file.display().to_string())?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(TrustError::Io {
                path: root_file.to_path_buf(),
                source,
            })
        }
    };
    Ok(match (stored, baked) {
        (Some(s), Some(b)) if b.root_version() > s.root_version() => Some(Record {
            root: b.root,
            ..s.clone()
        }),
        (Some(s), _) => Some(s.clone()),
        (None, b) => b,
    })
}

/// A channel whose metadata the node verified (and recorded).
struct Checked {
    kind: Kind,
    /// A GitHub channel's listing (its releases carry the files).
    gh_releases: Option<Vec<super::github::GhRelease>>,
    verified: trust::client::Verified,
}

/// Verify the channel's metadata when the node and the channel have it and record what was
/// trusted; `Ok(None)` means "use the index as v0.1.0 did" (allowed by the policy).
fn check(channel: &str, opts: &TrustOptions) -> Result<Option<Checked>, ChannelError> {
    let kind = parse_channel(channel)?;
    let key = channel_key(&kind);
    // Held across the metadata fetches until the store is written: a second process waits
    // and then starts from this one's record.
    let _lock = match opts.read_only {
        true => None,
        false => Some(Store::lock(&opts.store_file).map_err(trust_err(channel))?),
    };
    let mut store = Store::load(&opts.store_file).map_err(trust_err(channel))?;
    let required = |why: String| ChannelError::MetadataRequired {
        channel: channel.to_string(),
        why,
    };
    let Some(start) =
        starting_record(store.channels.get(&key), &opts.root_file).map_err(trust_err(channel))?
    else {
        return match opts.policy {
            MetadataPolicy::Required => Err(required(format!(
                "this node has no trusted root at {} and its config says channel_metadata = \"required\"",
                opts.root_file.display()
            ))),
            MetadataPolicy::Auto => Ok(None),
        };
    };
    let gh_releases = match &kind {
        Kind::GitHub { owner, repo } => Some(GitHub::new(owner, repo)?.releases()?),
        _ => None,
    };
    let src = source(&kind, gh_releases.as_deref(), opts)?;
    let clock = ExpiryRule {
        now: opts.now.unwrap_or_else(Utc::now),
        ignore_expiry: opts.ignore_expiry,
    };
    let kept = Kept::for_channel(&opts.store_file, &key);
    let mut verified = match trust::update(src.as_ref(), Some(&kept), &start, &clock) {
        Err(TrustError::Missing { file, location })
            if file == trust::meta::Role::Timestamp.file() =>
        {
            if store.channels.contains_key(&key) {
                return Err(required(format!(
                    "{location} is missing, but this node has trusted the channel's signed metadata before: it is required from now on"
                )));
            }
            if opts.policy == MetadataPolicy::Required {
                return Err(required(format!(
                    "{location} is missing and the node's config says channel_metadata = \"required\""
                )));
            }
            log::info!("channel {channel} has no signed metadata; resolving from its index");
            return Ok(None);
        }
        r => r.map_err(trust_err(channel))?,
    };
    if !opts.read_only {
        store.channels.insert(key, verified.record.clone());
        store.save(&opts.store_file).map_err(trust_err(channel))?;
        // A cache of files re-checked at every read: failing to keep them costs downloads
        // at the next poll, not this resolution.
        if let Err(e) = kept.save(&verified) {
            log::warn!("channel {channel}: keeping its verified metadata: {e}");
        }
    }
    // The guard's halt holds releases as a pause does, in what this node decides from (the
    // kept targets file stays the publisher's bytes).
    if let Some(h) = &verified.halts {
        for a in trust::halt::apply(&mut verified.targets, &h.doc, clock.now) {
            log::info!(
                "channel {channel}: {} is halted by the guard since {} ({}): held as a pause until the publisher resumes it",
                a.target,
                a.since,
                a.reason.escape_debug()
            );
        }
    }
    Ok(Some(Checked {
        kind,
        gh_releases,
        verified,
    }))
}

/// Resolve through metadata when the node and the channel have it; `Ok(None)` means "resolve
/// from the index as v0.1.0 did" (allowed by the policy). With `node`, the releases' rollouts
/// decide what it is offered ([`super::waves`]); without, the newest listed release.
pub(super) fn resolve_trusted(
    channel: &str,
    version: Option<&str>,
    arch: Arch,
    opts: &TrustOptions,
    node: Option<&NodeRollout>,
) -> Result<Option<ResolvedRelease>, ChannelError> {
    let Some(c) = check(channel, opts)? else {
        return Ok(None);
    };
    let targets = &c.verified.targets;
    let picked = match node {
        Some(n) => {
            let now = opts.now.unwrap_or_else(Utc::now);
            waves::pick_for(channel, targets, version, arch, n, now)?
        }
        None => pick(targets, version, arch).map(|t| (t, None)),
    };
    let (target, note) = picked.ok_or_else(|| ChannelError::NotFound {
        channel: channel.to_string(),
        wanted: version.unwrap_or("latest").to_string(),
        arch,
        available: describe(targets),
    })?;
    let vouched_by = format!(
        "the channel's targets role (targets version {}, root version {})",
        targets.version,
        c.verified.record.root_version()
    );
    let mut r = located(
        channel,
        &c.kind,
        c.gh_releases.as_deref(),
        target,
        vouched_by,
        arch,
    )?;
    r.rollout = note;
    Ok(Some(r))
}

/// The releases the verified targets list, newest first; `Ok(None)` as for
/// [`resolve_trusted`].
pub(super) fn list_trusted(
    channel: &str,
    opts: &TrustOptions,
) -> Result<Option<super::Index>, ChannelError> {
    Ok(check(channel, opts)?.map(|c| index_of(&c.verified.targets)))
}

fn source(
    kind: &Kind,
    gh_releases: Option<&[super::github::GhRelease]>,
    opts: &TrustOptions,
) -> Result<Box<dyn MetaSource>, ChannelError> {
    Ok(match kind {
        Kind::Local { dir, .. } => Box::new(trust::kept::DirMeta(dir.clone())),
        Kind::Http { base, .. } => {
            let base = base.clone();
            Box::new(UrlMeta {
                client: client(base.as_str())?,
                describe: base.to_string(),
                urls: Box::new(move |name| base.join(name).ok().map(|u| u.to_string())),
                min_rate: opts.min_rate,
            })
        }
        Kind::GitHub { owner, repo } => {
            let assets: BTreeMap<String, String> = gh_releases
                .unwrap_or_default()
                .iter()
                .find(|r| r.tag_name == GITHUB_METADATA_TAG)
                .map(|r| {
                    r.assets
                        .iter()
                        .map(|a| (a.name.clone(), a.browser_download_url.clone()))
                        .collect()
                })
                .unwrap_or_default();
            Box::new(UrlMeta {
                client: client("https://github.com")?,
                describe: format!("github-releases://{owner}/{repo} release {GITHUB_METADATA_TAG}"),
                urls: Box::new(move |name| assets.get(name).cloned()),
                min_rate: opts.min_rate,
            })
        }
    })
}

/// The targets' releases as an index, newest first.
fn index_of(targets: &Targets) -> super::Index {
    let mut entries: Vec<IndexEntry> = targets
        .targets
        .iter()
        .filter_map(|(p, m)| {
            m.custom.as_ref().map(|c| IndexEntry {
                version: c.version.clone(),
                generation: c.generation,
                arch: c.arch,
                path: p.strip_suffix(MANIFEST_FILE).unwrap_or(p).to_string(),
            })
        })
        .collect();
    super::sort_newest_first(&mut entries);
    super::Index::new(entries)
}

fn describe(targets: &Targets) -> String {
    format!(
        "{} (from signed targets version {})",
        index_of(targets).describe(),
        targets.version
    )
}

/// Where the picked release's files are, pinned to the manifest the targets name.
fn located(
    channel: &str,
    kind: &Kind,
    gh_releases: Option<&[super::github::GhRelease]>,
    (path, meta, custom): Target<'_>,
    vouched_by: String,
    arch: Arch,
) -> Result<ResolvedRelease, ChannelError> {
    let dir = path
        .strip_suffix(MANIFEST_FILE)
        .expect("picked targets end in manifest.json");
    check_entry_path(dir)?;
    let sha256 = meta.sha256().ok_or_else(|| ChannelError::Trust {
        channel: channel.to_string(),
        source: TrustError::Malformed {
            what: format!("target {path}"),
            why: "it has no sha256".into(),
        },
    })?;
    let pin = ManifestPin {
        length: meta.length,
        sha256: sha256.to_string(),
        hashes: meta.hashes.clone(),
        from: format!("target {path} of the channel's signed metadata"),
        vouched_by,
    };
    let (location, source) = match kind {
        Kind::Local { dir: d, .. } => {
            let p = d.join(dir);
            (
                format!("{}/", p.display().to_string().trim_end_matches('/')),
                Source::Path(p),
            )
        }
        Kind::Http { base, .. } => {
            let url = base.join(dir).map_err(|e| ChannelError::BadChannel {
                channel: channel.to_string(),
                why: format!("target path '{}': {e}", path.escape_debug()),
            })?;
            (url.to_string(), Source::Url(url.to_string()))
        }
        Kind::GitHub { .. } => {
            let tag = dir.trim_end_matches('/');
            let rel = gh_releases
                .unwrap_or_default()
                .iter()
                .find(|r| !r.draft && r.tag_name == tag)
                .ok_or_else(|| ChannelError::BadChannel {
                    channel: channel.to_string(),
                    why: format!(
                        "the signed targets name release {tag}, which GitHub does not list"
                    ),
                })?;
            let (assets, manifest) = release_assets(rel, arch);
            let Some(m) = manifest else {
                return Err(ChannelError::BadChannel {
                    channel: channel.to_string(),
                    why: format!("release {tag} has no {MANIFEST_FILE} asset for {arch}"),
                });
            };
            (m.browser_download_url.clone(), Source::Assets(assets))
        }
    };
    Ok(ResolvedRelease {
        version: custom.version.clone(),
        generation: custom.generation,
        arch,
        location,
        source,
        pin: Some(pin),
        rollout: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config v0.1.0 documents (and its nodes carry) has neither new key: such a node gets
    /// the default root path and the "auto" policy, i.e. it resolves channels from their index
    /// until a root file is put into its image.
    #[test]
    fn a_v010_config_gets_the_default_root_and_auto_policy() {
        let v010 = r#"bootloader = "grub"
tries = 3
state_dir = "/var/lib/k3os-ops"
trust_dir = "/etc/k3os-ops/trust.d"
health_dir = "/etc/k3os-ops/health.d"
health_timeout_secs = 30
[layout]
kind = "gpt"
disk = "/dev/vda"
boot_dir = "/boot"
"#;
        let cfg = crate::Config::parse(v010).unwrap();
        let t = TrustOptions::from_config(&cfg);
        assert_eq!(t.root_file, Path::new("/etc/k3os-ops/root.json"));
        assert_eq!(t.policy, MetadataPolicy::Auto);
        assert_eq!(
            t.store_file,
            Path::new("/var/lib/k3os-ops/channel-trust.json")
        );
        let required = crate::Config::parse(&format!(
            "channel_metadata = \"required\"\nchannel_root = \"/r.json\"\n{v010}"
        ))
        .unwrap();
        assert_eq!(required.channel_metadata, MetadataPolicy::Required);
    }
}
