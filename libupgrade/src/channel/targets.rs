//! Reading the signed targets (pure): which target names a release, for the node's resolution
//! (`trusted`) and for the rollout decision over the listed releases (`waves`), which both read
//! it without reading each other.

use crate::manifest::{Arch, MANIFEST_FILE};
use crate::trust::meta::{FileMeta, TargetCustom, Targets};

/// A target of the signed targets: its path, length and hashes, and what it says of its release.
pub(super) type Target<'a> = (&'a str, &'a FileMeta, &'a TargetCustom);

/// Whether a listed release's version is a plain name ([`crate::version`]): one that is not is
/// never resolved to (logged, escaped), whoever signed it.
pub(super) fn plain(path: &str, version: &str) -> bool {
    match crate::version::check_version(version) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("target {} skipped: {e}", path.escape_debug());
            false
        }
    }
}

/// The release the targets name for `version` (None/"latest": the highest generation).
pub(super) fn pick<'a>(
    targets: &'a Targets,
    version: Option<&str>,
    arch: Arch,
) -> Option<Target<'a>> {
    let mut found: Option<Target<'a>> = None;
    for (path, meta) in &targets.targets {
        let Some(c) = meta.custom.as_ref().filter(|c| plain(path, &c.version)) else {
            continue;
        };
        let dir = path.strip_suffix(MANIFEST_FILE).unwrap_or_default();
        let matches = match version {
            None | Some("latest") => true,
            Some(v) => c.version == v || dir.trim_end_matches('/') == v,
        };
        if c.arch != arch || !matches || !path.ends_with(&format!("/{MANIFEST_FILE}")) {
            continue;
        }
        if found.is_none_or(|(_, _, b)| c.generation > b.generation) {
            found = Some((path, meta, c));
        }
    }
    found
}
