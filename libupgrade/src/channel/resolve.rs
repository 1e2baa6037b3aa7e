//! Picking a release from a channel: from its index (`index.json`, or the GitHub releases
//! listing with each release's manifest), or, through [`resolve_with`], from its signed
//! metadata when the node and the channel have it (see [`super::trusted`]).

use std::fs;
use std::path::Path;

use super::doc::{client, get_small};
use super::github::{GhFound, GhRelease, GitHub};
use super::{
    io_err, parse_channel, sort_newest_first, trusted, ChannelError, Index, IndexEntry, Kind,
    NodeRollout, ResolvedRelease, TrustOptions,
};
use crate::manifest::Arch;
use crate::net::fetch::Source;

/// The releases a channel offers, newest first.
pub fn list(channel: &str) -> Result<Index, ChannelError> {
    match parse_channel(channel)? {
        Kind::Local { index, .. } => {
            let bytes = fs::read(&index).map_err(io_err(&index))?;
            Index::parse(&bytes, &index.display().to_string())
        }
        Kind::Http { index, .. } => {
            let client = client(index.as_str())?;
            let bytes = get_small(&client, index.as_str())?;
            Index::parse(&bytes, index.as_str())
        }
        Kind::GitHub { owner, repo } => {
            let gh = GitHub::new(&owner, &repo)?;
            let releases = gh.releases()?;
            let mut entries = Vec::new();
            for r in releases.iter().filter(|r| !r.draft) {
                for arch in [Arch::X86_64, Arch::Aarch64] {
                    match gh.manifest_for(r, arch) {
                        Ok(Some(found)) => entries.push(IndexEntry {
                            version: found.manifest.version,
                            generation: found.manifest.generation,
                            arch,
                            path: r.tag_name.clone(),
                        }),
                        Ok(None) => {}
                        Err(e) if !skippable(&e) => return Err(e),
                        // Unusable releases are not listed; resolving them by name says why.
                        Err(e) => {
                            log::warn!("channel {channel}: skipping release {}: {e}", r.tag_name)
                        }
                    }
                }
            }
            sort_newest_first(&mut entries);
            Ok(Index::new(entries))
        }
    }
}

/// Pick a release from the channel's index, without signed metadata (what v0.1.0 did; see
/// [`resolve_with`] for nodes that check metadata): `version` `None` or `"latest"` = the newest
/// for `arch`, else that exact version (for GitHub channels the tag name also matches).
pub fn resolve(
    channel: &str,
    version: Option<&str>,
    arch: Arch,
) -> Result<ResolvedRelease, ChannelError> {
    match parse_channel(channel)? {
        Kind::Local { dir, index } => resolve_local(channel, &dir, &index, version, arch),
        Kind::Http { base, index } => resolve_http(channel, &base, &index, version, arch),
        Kind::GitHub { owner, repo } => resolve_github(channel, &owner, &repo, version, arch),
    }
}

/// Pick a release the way a node does: through the channel's signed metadata when the node
/// has a trusted root and the channel carries metadata (see [`crate::trust`]); otherwise, as
/// `trust`'s policy allows, from the index like [`resolve`].
pub fn resolve_with(
    channel: &str,
    version: Option<&str>,
    arch: Arch,
    trust: &TrustOptions,
) -> Result<ResolvedRelease, ChannelError> {
    resolve_for(channel, version, arch, trust, None)
}

/// [`resolve_with`] for a node: through signed metadata, the releases' rollouts decide what
/// `node` is offered (see [`crate::rollout`]); a channel resolved from its index has no
/// rollouts.
pub fn resolve_for(
    channel: &str,
    version: Option<&str>,
    arch: Arch,
    trust: &TrustOptions,
    node: Option<&NodeRollout>,
) -> Result<ResolvedRelease, ChannelError> {
    match trusted::resolve_trusted(channel, version, arch, trust, node)? {
        Some(r) => Ok(r),
        None => resolve(channel, version, arch),
    }
}

/// List the releases the way a node sees them: from the verified targets when the node has a
/// trusted root and the channel carries metadata; otherwise, as `trust`'s policy allows, like
/// [`list`].
pub fn list_with(channel: &str, trust: &TrustOptions) -> Result<Index, ChannelError> {
    match trusted::list_trusted(channel, trust)? {
        Some(index) => Ok(index),
        None => list(channel),
    }
}

fn not_found(channel: &str, version: Option<&str>, arch: Arch, index: &Index) -> ChannelError {
    ChannelError::NotFound {
        channel: channel.to_string(),
        wanted: version.unwrap_or("latest").to_string(),
        arch,
        available: index.describe(),
    }
}

fn resolve_local(
    channel: &str,
    dir: &Path,
    index_path: &Path,
    version: Option<&str>,
    arch: Arch,
) -> Result<ResolvedRelease, ChannelError> {
    let bytes = fs::read(index_path).map_err(io_err(index_path))?;
    let index = Index::parse(&bytes, &index_path.display().to_string())?;
    let e = index
        .find(version, arch)
        .ok_or_else(|| not_found(channel, version, arch, &index))?;
    let mut location = dir.join(&e.path).display().to_string();
    if !location.ends_with('/') {
        location.push('/');
    }
    Ok(ResolvedRelease {
        version: e.version.clone(),
        generation: e.generation,
        arch,
        source: Source::Path(dir.join(&e.path)),
        location,
        pin: None,
        rollout: None,
    })
}

fn resolve_http(
    channel: &str,
    base: &reqwest::Url,
    index_url: &reqwest::Url,
    version: Option<&str>,
    arch: Arch,
) -> Result<ResolvedRelease, ChannelError> {
    let client = client(index_url.as_str())?;
    let bytes = get_small(&client, index_url.as_str())?;
    let index = Index::parse(&bytes, index_url.as_str())?;
    let e = index
        .find(version, arch)
        .ok_or_else(|| not_found(channel, version, arch, &index))?;
    let path = if e.path.ends_with('/') {
        e.path.clone()
    } else {
        format!("{}/", e.path)
    };
    let url = base.join(&path).map_err(|err| ChannelError::BadChannel {
        channel: channel.to_string(),
        why: format!("index path '{}': {err}", e.path.escape_debug()),
    })?;
    let location = url.to_string();
    Ok(ResolvedRelease {
        version: e.version.clone(),
        generation: e.generation,
        arch,
        source: Source::Url(location.clone()),
        location,
        pin: None,
        rollout: None,
    })
}

fn resolve_github(
    channel: &str,
    owner: &str,
    repo: &str,
    version: Option<&str>,
    arch: Arch,
) -> Result<ResolvedRelease, ChannelError> {
    let gh = GitHub::new(owner, repo)?;
    let releases = gh.releases()?;
    let mut best: Option<(GhFound, &GhRelease)> = None;
    let mut seen = Vec::new();
    let mut skipped = Vec::new();
    let explicit = matches!(version, Some(v) if v != "latest");
    // Only fetch manifests of other tags when no tag carries the wanted name.
    let tag_named = releases
        .iter()
        .any(|o| !o.draft && Some(o.tag_name.as_str()) == version);
    for r in releases.iter().filter(|r| !r.draft) {
        if (r.prerelease && !explicit)
            || (explicit && tag_named && version != Some(r.tag_name.as_str()))
        {
            continue;
        }
        // An unreadable old release must not block `latest`: skip it (and say so).
        let found = match gh.manifest_for(r, arch) {
            Ok(Some(found)) => found,
            Ok(None) => continue,
            // Asked for by its tag: say what is wrong with it.
            Err(e) if version == Some(r.tag_name.as_str()) || !skippable(&e) => return Err(e),
            Err(e) => {
                log::warn!("channel {channel}: skipping release {}: {e}", r.tag_name);
                skipped.push(format!("{}: {e}", r.tag_name));
                continue;
            }
        };
        seen.push(IndexEntry {
            version: found.manifest.version.clone(),
            generation: found.manifest.generation,
            arch,
            path: r.tag_name.clone(),
        });
        let matches = match version {
            None | Some("latest") => true,
            Some(v) => found.manifest.version == v || r.tag_name == v,
        };
        if matches
            && best
                .as_ref()
                .is_none_or(|(b, _)| found.manifest.generation > b.manifest.generation)
        {
            best = Some((found, r));
        }
    }
    let Some((found, _)) = best else {
        sort_newest_first(&mut seen);
        let mut e = not_found(channel, version, arch, &Index::new(seen));
        if let ChannelError::NotFound { available, .. } = &mut e {
            for s in &skipped {
                available.push_str(&format!("; skipped {s}"));
            }
        }
        return Err(e);
    };
    Ok(ResolvedRelease {
        version: found.manifest.version,
        generation: found.manifest.generation,
        arch,
        location: found.manifest_url,
        source: Source::Assets(found.assets),
        pin: None,
        rollout: None,
    })
}

/// A release whose manifest is broken or gone is skipped by `latest`; a transport failure is
/// not (skipping a newest release because of a network blip would pick an older one).
fn skippable(e: &ChannelError) -> bool {
    match e {
        ChannelError::Manifest { .. }
        | ChannelError::Parse { .. }
        | ChannelError::TooLarge { .. } => true,
        ChannelError::Status { status, .. } => matches!(status, 404 | 410),
        _ => false,
    }
}
