//! `github-releases://OWNER/REPO` channels: the releases API, paged by `Link`, cached by
//! `ETag`, and each release's assets per architecture (see the module docs of
//! [`crate::channel`]).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::doc::{client, get_doc, get_small, Doc};
use super::{ChannelError, GITHUB_API_DEFAULT, GITHUB_API_ENV, MAX_PAGES};
use crate::manifest::{Arch, Manifest, MANIFEST_FILE};

/// The `rel="next"` target of an RFC 8288 `Link` header.
pub(super) fn next_link(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let mut pieces = part.split(';');
        let target = pieces.next()?.trim();
        let is_next = pieces.any(|p| {
            let p = p.trim();
            p == "rel=\"next\"" || p == "rel=next"
        });
        if is_next {
            target
                .strip_prefix('<')?
                .strip_suffix('>')
                .map(str::to_string)
        } else {
            None
        }
    })
}

#[derive(Debug, Deserialize)]
pub(super) struct GhRelease {
    pub(super) tag_name: String,
    #[serde(default)]
    pub(super) draft: bool,
    #[serde(default)]
    pub(super) prerelease: bool,
    #[serde(default)]
    pub(super) assets: Vec<GhAsset>,
}

#[derive(Debug, Deserialize)]
pub(super) struct GhAsset {
    pub(super) name: String,
    pub(super) browser_download_url: String,
    #[serde(default)]
    pub(super) id: u64,
    #[serde(default)]
    pub(super) size: u64,
    #[serde(default)]
    pub(super) updated_at: Option<String>,
}

/// Identity of a manifest asset's content: GitHub gives a re-uploaded asset a new id and
/// `updated_at`, so an unchanged key means unchanged bytes.
type AssetKey = (String, u64, u64, Option<String>);

/// Manifests already fetched by this process (the agent polls a channel repeatedly; without
/// this every poll would download the manifest of every release). Bounded; cleared when full.
static MANIFEST_CACHE: std::sync::Mutex<BTreeMap<AssetKey, Vec<u8>>> =
    std::sync::Mutex::new(BTreeMap::new());
const MANIFEST_CACHE_MAX: usize = 1024;

/// Releases API pages by URL, with their ETag, for conditional re-requests.
static API_CACHE: std::sync::Mutex<BTreeMap<String, Doc>> = std::sync::Mutex::new(BTreeMap::new());
const API_CACHE_MAX: usize = 64;

pub(super) struct GhFound {
    pub(super) manifest: Manifest,
    pub(super) manifest_url: String,
    pub(super) assets: BTreeMap<String, String>,
}

pub(super) struct GitHub {
    client: reqwest::blocking::Client,
    api: String,
    owner: String,
    repo: String,
}

impl GitHub {
    pub(super) fn new(owner: &str, repo: &str) -> Result<GitHub, ChannelError> {
        let api = std::env::var(GITHUB_API_ENV).unwrap_or_else(|_| GITHUB_API_DEFAULT.to_string());
        let api = api.trim_end_matches('/').to_string();
        Ok(GitHub {
            client: client(&api)?,
            api,
            owner: owner.into(),
            repo: repo.into(),
        })
    }

    pub(super) fn releases(&self) -> Result<Vec<GhRelease>, ChannelError> {
        let mut url = format!(
            "{}/repos/{}/{}/releases?per_page=100",
            self.api, self.owner, self.repo
        );
        let mut all = Vec::new();
        for _ in 0..MAX_PAGES {
            // Conditional requests: a 304 does not count against GitHub's rate limit, and an
            // agent polls the same pages over and over.
            let cached = API_CACHE
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&url)
                .cloned();
            let Doc { body, link, .. } = match get_doc(
                &self.client,
                &url,
                Some("application/vnd.github+json"),
                cached.as_ref().and_then(|d| d.etag.as_deref()),
            )? {
                Some(doc) => {
                    let mut cache = API_CACHE.lock().unwrap_or_else(|e| e.into_inner());
                    if doc.etag.is_some() {
                        if cache.len() >= API_CACHE_MAX {
                            cache.clear();
                        }
                        cache.insert(url.clone(), doc.clone());
                    } else {
                        cache.remove(&url);
                    }
                    doc
                }
                None => cached.expect("304 only answers a conditional request"),
            };
            all.extend(parse_page(&body, &url)?);
            match link.as_deref().and_then(next_link) {
                Some(next) if next != url => url = next,
                _ => break,
            }
        }
        Ok(all)
    }

    /// The file-name → URL map of `release` for `arch` (arch-prefixed assets win over plain
    /// ones), and its manifest if it has one for `arch`.
    pub(super) fn manifest_for(
        &self,
        release: &GhRelease,
        arch: Arch,
    ) -> Result<Option<GhFound>, ChannelError> {
        let (assets, manifest_asset) = release_assets(release, arch);
        let Some(asset) = manifest_asset else {
            return Ok(None);
        };
        let manifest_url = asset.browser_download_url.clone();
        let key: AssetKey = (
            manifest_url.clone(),
            asset.id,
            asset.size,
            asset.updated_at.clone(),
        );
        let cached = MANIFEST_CACHE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let bytes = match cached {
            Some(b) => b,
            None => {
                let b = get_small(&self.client, &manifest_url)?;
                let mut cache = MANIFEST_CACHE.lock().unwrap_or_else(|e| e.into_inner());
                if cache.len() >= MANIFEST_CACHE_MAX {
                    cache.clear();
                }
                cache.insert(key, b.clone());
                b
            }
        };
        let manifest = Manifest::parse(&bytes).map_err(|source| ChannelError::Manifest {
            location: manifest_url.clone(),
            source,
        })?;
        if manifest.arch != arch {
            // A plain manifest.json for the other architecture.
            return Ok(None);
        }
        Ok(Some(GhFound {
            manifest,
            manifest_url,
            assets,
        }))
    }
}

/// One page of the GitHub releases API.
pub(super) fn parse_page(body: &[u8], url: &str) -> Result<Vec<GhRelease>, ChannelError> {
    serde_json::from_slice(body).map_err(|source| ChannelError::Parse {
        what: url.to_string(),
        source,
    })
}

/// The file-name → URL map of `release` for `arch` (arch-prefixed assets win over plain
/// ones), and its manifest asset if it has one for `arch`.
pub(super) fn release_assets(
    release: &GhRelease,
    arch: Arch,
) -> (BTreeMap<String, String>, Option<&GhAsset>) {
    let prefixes: &[&str] = match arch {
        Arch::X86_64 => &["x86_64-", "amd64-"],
        Arch::Aarch64 => &["aarch64-", "arm64-"],
    };
    let other_prefixes: &[&str] = match arch {
        Arch::X86_64 => &["aarch64-", "arm64-"],
        Arch::Aarch64 => &["x86_64-", "amd64-"],
    };
    let mut assets = BTreeMap::new();
    let mut manifest_asset: Option<&GhAsset> = None;
    // Plain names first, then arch-specific ones overwrite them.
    for a in &release.assets {
        if !other_prefixes
            .iter()
            .chain(prefixes)
            .any(|p| a.name.starts_with(p))
        {
            assets.insert(a.name.clone(), a.browser_download_url.clone());
            if a.name == MANIFEST_FILE {
                manifest_asset = Some(a);
            }
        }
    }
    for p in prefixes.iter().rev() {
        for a in &release.assets {
            if let Some(name) = a.name.strip_prefix(p) {
                assets.insert(name.to_string(), a.browser_download_url.clone());
                if name == MANIFEST_FILE {
                    manifest_asset = Some(a);
                }
            }
        }
    }
    (assets, manifest_asset)
}

/// For the fuzz targets (`fuzz/`, feature `fuzzing`): what a node takes from one GitHub
/// releases API page and its `Link` header, through the same functions `resolve` and `list`
/// use.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    use super::*;
    use crate::channel::ChannelError;

    /// One release of a page as the node sees it.
    #[derive(Debug)]
    pub struct PageRelease {
        /// The release's git tag, as the API gives it (untrusted).
        pub tag_name: String,
        /// A draft release; nodes never use these.
        pub draft: bool,
        /// A prerelease; nodes use it only when asked for by version.
        pub prerelease: bool,
        /// Every asset's (name, URL).
        pub assets: Vec<(String, String)>,
        /// Per architecture: the file-name → URL map and the manifest asset's URL.
        pub files: Vec<(Arch, BTreeMap<String, String>, Option<String>)>,
    }

    /// Parse a page and its `Link` header.
    pub fn github_page(
        body: &[u8],
        link: &str,
    ) -> Result<(Vec<PageRelease>, Option<String>), ChannelError> {
        let page = parse_page(body, "fuzz")?;
        let releases = page
            .iter()
            .map(|r| PageRelease {
                tag_name: r.tag_name.clone(),
                draft: r.draft,
                prerelease: r.prerelease,
                assets: r
                    .assets
                    .iter()
                    .map(|a| (a.name.clone(), a.browser_download_url.clone()))
                    .collect(),
                files: [Arch::X86_64, Arch::Aarch64]
                    .into_iter()
                    .map(|arch| {
                        let (m, a) = release_assets(r, arch);
                        (arch, m, a.map(|a| a.browser_download_url.clone()))
                    })
                    .collect(),
            })
            .collect();
        Ok((releases, next_link(link)))
    }
}
