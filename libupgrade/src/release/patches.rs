//! Per-pair patches for a release being created (`release create --patch-from`): for each
//! earlier release named and each part of the new release that release has too (a payload by
//! its name), a patch from that release's copy to the new one ([`crate::patch::build`] of the
//! part kind's patch kind: [`PatchKind::Squashfs`] for the rootfs, [`PatchKind::Plain`] for
//! the kernel, initrd and image archives, and plain for a rootfs the squashfs kind cannot
//! describe), kept
//! only when it is smaller than what a node running that release would fetch by chunks: the
//! chunk plan of the new artifact's index against the base artifact, as the node computes it
//! (every chunk of the base found by content, the stream rule applied). Without a chunk index
//! (`--no-chunks`) the comparison is against the whole artifact, which a node then downloads.
//!
//! Each kept patch is written as `<artifact file>.from-<first 16 hex of the base's sha256>.patch`
//! and listed in the artifact's manifest entry; what was built, kept or dropped, with its size
//! and time, is returned for the caller to print.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::chunk::local::{find_local, LocalFile};
use crate::chunk::ChunkIndex;
use crate::manifest::{Arch, Manifest, Part, PatchBase, PatchRef, MANIFEST_FILE};
use crate::patch::PatchKind;

use super::copy::write_atomic_from;
use super::{io_err, ReleaseError};

/// One patch `release create` built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchBuilt {
    /// Which part.
    pub artifact: Part,
    /// The base release's version.
    pub from: String,
    /// `plain` or `squashfs`.
    pub kind: String,
    /// The patch's size in bytes.
    pub size: u64,
    /// What a node running the base would fetch by chunks instead (the whole artifact without
    /// a chunk index).
    pub chunk_fetch: u64,
    /// Listed in the manifest (smaller than `chunk_fetch`); otherwise deleted.
    pub kept: bool,
    /// The file name it was published under (when kept).
    pub path: Option<String>,
    /// How long building it took.
    pub took: Duration,
    /// Why the squashfs kind was not used for a rootfs (then `kind` is `plain`).
    pub note: Option<String>,
    /// Blocks the node recompresses, and blocks this build's compressor did not reproduce
    /// (carried verbatim: an image made with another libzstd than the node's).
    pub blocks: (u64, u64),
}

/// An earlier release to patch from: its directory and manifest.
pub(super) struct Base {
    dir: PathBuf,
    manifest: Manifest,
}

/// `--patch-from` names a release directory or its `manifest.json`.
fn load_base(p: &Path) -> Result<Base, ReleaseError> {
    let dir = if p.file_name().is_some_and(|n| n == MANIFEST_FILE) {
        p.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        p.to_path_buf()
    };
    let mp = dir.join(MANIFEST_FILE);
    let bytes = std::fs::read(&mp).map_err(io_err(&mp))?;
    let manifest = Manifest::parse(&bytes).map_err(|e| ReleaseError::PatchBase {
        path: mp.clone(),
        what: e.to_string(),
    })?;
    Ok(Base { dir, manifest })
}

/// The releases named by `--patch-from`, each for `arch` (checked before anything is copied).
pub(super) fn load(from: &[PathBuf], arch: Arch) -> Result<Vec<Base>, ReleaseError> {
    let mut out = Vec::new();
    for p in from {
        let base = load_base(p)?;
        let bm = &base.manifest;
        if bm.arch != arch {
            return Err(ReleaseError::PatchBase {
                path: p.clone(),
                what: format!(
                    "release {} is for {}, this one for {arch}",
                    bm.version.escape_debug(),
                    bm.arch
                ),
            });
        }
        out.push(base);
    }
    Ok(out)
}

/// Build, measure and keep or drop a patch per artifact of `m` (written in `out_dir`) from
/// each of `bases`; list the kept ones in `m`.
pub(super) fn add(
    out_dir: &Path,
    m: &mut Manifest,
    bases: &[Base],
) -> Result<Vec<PatchBuilt>, ReleaseError> {
    let mut built = Vec::new();
    for base in bases {
        let bm = &base.manifest;
        let parts: Vec<(Part, &'static str)> = crate::payload::kinds::parts(m)
            .into_iter()
            .map(|p| (p.part, p.kind.patch_kind))
            .collect();
        for (a, patch_kind) in parts {
            let Some(b) = bm.entry(&a) else {
                continue; // A payload the base release does not have: nothing to patch from.
            };
            let base_path = base.dir.join(&b.path);
            let (size, sha) = super::sha256_file(&base_path).map_err(io_err(&base_path))?;
            if (size, &sha) != (b.size, &b.sha256) {
                return Err(ReleaseError::PatchBase {
                    path: base_path,
                    what: format!(
                        "{size} bytes with sha256 {sha}, its manifest says {} bytes with sha256 {}",
                        b.size, b.sha256
                    ),
                });
            }
            let r = one(out_dir, m, (&a, patch_kind), base, &base_path)?;
            built.push(r);
        }
    }
    Ok(built)
}

/// The patch of part `a` (its kind's patch kind) from `base`'s copy at `base_path`.
fn one(
    out_dir: &Path,
    m: &mut Manifest,
    (a, patch_kind): (&Part, &str),
    base: &Base,
    base_path: &Path,
) -> Result<PatchBuilt, ReleaseError> {
    let entry = m.entry(a).expect("a part of the release").clone();
    let b = base.manifest.entry(a).expect("a part of the base");
    let target = out_dir.join(&entry.path);
    let name = format!("{}.from-{}.patch", entry.path, &b.sha256[..16]);
    let chunk_fetch = chunk_fetch(out_dir, &entry, base_path)?;
    let started = Instant::now();
    // Each build's blocks recompressed on the node (the planner's apply estimate) and not
    // reproduced by this build's compressor.
    let build = |kind: PatchKind| {
        let mut blocks = (0, 0);
        write_atomic_from(out_dir, &name, |w| {
            crate::patch::build(kind, base_path, &target, w)
                .map(|st| blocks = (st.blocks_recompressed, st.blocks_not_reproducible))
                .map_err(|e| e.to_string())
        })
        .map(|r| r.map(|()| blocks))
    };
    let (kind, note, blocks) = match patch_kind {
        "squashfs" => match build(PatchKind::Squashfs)? {
            Ok(n) => ("squashfs", None, n),
            Err(why) => {
                let n = build(PatchKind::Plain)?.map_err(|what| patch_failed(a, b, &what))?;
                ("plain", Some(why), n)
            }
        },
        _ => {
            let n = build(PatchKind::Plain)?.map_err(|what| patch_failed(a, b, &what))?;
            ("plain", None, n)
        }
    };
    let took = started.elapsed();
    let path = out_dir.join(&name);
    let (size, sha256) = super::sha256_file(&path).map_err(io_err(&path))?;
    let kept = size < chunk_fetch;
    if kept {
        let e = m.entry_mut(a).expect("a part of the release");
        e.patches.push(PatchRef {
            base: PatchBase {
                version: base.manifest.version.clone(),
                size: b.size,
                sha256: b.sha256.clone(),
            },
            kind: kind.into(),
            path: name.clone(),
            size,
            sha256,
            blocks: Some(blocks.0),
        });
    } else {
        std::fs::remove_file(&path).map_err(io_err(&path))?;
    }
    Ok(PatchBuilt {
        artifact: a.clone(),
        from: base.manifest.version.clone(),
        kind: kind.into(),
        size,
        chunk_fetch,
        kept,
        path: kept.then_some(name),
        took,
        note,
        blocks,
    })
}

fn patch_failed(a: &Part, b: &crate::manifest::FileEntry, what: &str) -> ReleaseError {
    ReleaseError::PatchBase {
        path: PathBuf::from(&b.path),
        what: format!("building the {a} patch failed: {what}"),
    }
}

/// Bytes a node running the base would fetch for `entry` by chunks: its chunk plan against
/// the base file (every chunk found there copied), or the whole artifact without an index.
fn chunk_fetch(
    out_dir: &Path,
    entry: &crate::manifest::FileEntry,
    base_path: &Path,
) -> Result<u64, ReleaseError> {
    let Some(r) = &entry.chunks else {
        return Ok(entry.size);
    };
    let ip = out_dir.join(&r.path);
    let bytes = std::fs::read(&ip).map_err(io_err(&ip))?;
    let index = ChunkIndex::parse(&bytes).map_err(|e| ReleaseError::ChunkIndex {
        path: ip.clone(),
        what: e.to_string(),
    })?;
    let local = [LocalFile::open(base_path).map_err(io_err(base_path))?];
    let n = index.chunks.len();
    let found =
        find_local(&index, &vec![true; n], &local).map_err(|e| ReleaseError::ChunkIndex {
            path: base_path.to_path_buf(),
            what: e.to_string(),
        })?;
    Ok(crate::chunk::plan::plan(&index, &vec![false; n], &found).fetch_bytes)
}
