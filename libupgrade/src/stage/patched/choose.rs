//! Which listed patch an artifact is staged by, if any: the candidates the pure rule allows
//! ([`patch_candidates`]), then, best first, the first whose header agrees with the signed
//! manifest and this build's compressor and whose base the node can read. Reads only.
//!
//! The rule needs a proof of what the running slot holds. The running release's kept manifest
//! (`slots/<slot>/manifest.json`, when it is the build the state says runs) names the whole
//! artifact's sha256 and size. A node without one (imaged by `dd` or another image builder, a
//! re-made state partition) hashes the slot's copy instead, once, up to each base size a
//! listed patch could be chosen for ([`sizes_to_prove`]): the sha256 of those bytes is the
//! base's exactly when the patch applies, so the choice is the same as with a kept manifest,
//! at the cost of one sequential read of the slot (the chunk plan reads it too; the two reads
//! stay apart because a base is a prefix of the slot of the patch's size, not the chunk
//! plan's range). The preview runs the same code, so `--plan-only` names the same choice and
//! bytes; the generation floor (`verify`) does not depend on it.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::staging::staging_dir;
use super::PatchWork;
use crate::chunk::local::LocalFile;
use crate::error::Error;
use crate::manifest::{FileEntry, Part, PatchRef};
use crate::net::retry::retrying;
use crate::patch::{PatchHeader, PatchKind};
use crate::payload::kinds::PartRef;
use crate::stage::parts::ChunkWork;
use crate::stage::plan::{patch_candidates, sizes_to_prove, Proven};
use crate::stage::run::Placing;
use crate::stage::weigh::{apply_secs, weigh, ApplyWork, Verdict, Ways};

/// Bytes read from the start of a patch to check its header before choosing it (a header is
/// at most 229 bytes).
const HEADER_READ: u64 = 512;
/// What [`choose`] chose for one part: a patch (`None`: chunks), and why, when a patch was
/// weighed against the chunks.
#[derive(Default)]
pub(crate) struct Chosen {
    /// The patch (None: chunks).
    pub patch: Option<PatchWork>,
    /// Why, when a patch was weighed against the chunks (`ArtifactCost::choice`).
    pub why: Option<String>,
}

/// A patch of artifact `a` that rebuilds it from the running slot's copy for fewer bytes
/// than `work`'s chunk plan fetches and, weighed by `opts.prefer`, no later
/// ([`crate::stage::weigh`]), with the step that applies it; else chunks. Reads only (the
/// header of each candidate, from the staging area or by one small range; the running
/// slot when a base must be proven by hashing).
pub(crate) fn choose(at: &Placing, p: &PartRef, work: &ChunkWork) -> Chosen {
    let (a, entry, source, opts) = (&p.part, p.entry, at.source, at.opts);
    if entry.patches.is_empty() {
        return Chosen::default();
    }
    let (staged, held) = staged(at, &entry.patches);
    let chunk_fetch = work.plan.fetch_bytes;
    let (proven, hashed) = proven(at, a, entry, &held, chunk_fetch);
    let mut chosen = Chosen::default();
    for (i, fetch) in patch_candidates(&entry.patches, &proven, &held, chunk_fetch) {
        let p = &entry.patches[i];
        let verdict = match patch_header(at, p, &staged[i], held[i]) {
            Ok(h) => check_header(entry, p, &h)
                .map(|()| weigh_patch(at, &h, p, fetch, chunk_fetch, opts)),
            Err(why) => Err(why),
        };
        let verdict = match verdict {
            Ok(v) => v,
            Err(why) => {
                log::warn!(
                    "{a}: patch {} from {} not used ({why}); trying the next way",
                    source.location(&p.path),
                    p.base.version.escape_debug()
                );
                continue;
            }
        };
        log::info!(
            "{a}: {} from {}: {}",
            if verdict.patch { "patch" } else { "no patch" },
            p.base.version.escape_debug(),
            verdict.why
        );
        chosen.why = Some(match hashed {
            true => format!("{}; base proven by hashing the running slot", verdict.why),
            false => verdict.why,
        });
        if !verdict.patch {
            continue;
        }
        let Some(base) = patch_base(at, a, p) else {
            chosen.why = None;
            return chosen;
        };
        chosen.patch = Some(PatchWork {
            patch: p.clone(),
            number: i,
            fetch,
            staged: staged[i].clone(),
            base,
            base_hashed: hashed,
        });
        return chosen;
    }
    chosen
}

/// Where each of `patches` is staged, and how many of its bytes the staging area holds
/// (only a continued attempt keeps it: a new one empties it first).
fn staged(at: &Placing, patches: &[PatchRef]) -> (Vec<PathBuf>, Vec<u64>) {
    let dir = staging_dir(&at.env.cfg.state_dir);
    let staged: Vec<PathBuf> = patches
        .iter()
        .map(|p| dir.join(format!("{}.patch", p.sha256)))
        .collect();
    let held = staged
        .iter()
        .map(|p| match at.resumed {
            true => std::fs::metadata(p).map_or(0, |m| m.len()),
            false => 0,
        })
        .collect();
    (staged, held)
}

/// What the node can prove its running slot's copy of `a` is: the kept manifest's entry,
/// else the hashes of its prefixes (true: proven by hashing).
fn proven(
    at: &Placing,
    a: &Part,
    entry: &FileEntry,
    held: &[u64],
    chunk_fetch: u64,
) -> (Vec<Proven>, bool) {
    match running_entry(at, a) {
        Some(e) => (
            vec![Proven {
                size: e.size,
                sha256: e.sha256,
            }],
            false,
        ),
        None => (prove_by_hash(at, a, entry, held, chunk_fetch), true),
    }
}

/// Artifact `a`'s entry in the running release's signed manifest, as the node kept it
/// (`slots/<slot>/manifest.json`), when that manifest is the running build's.
fn running_entry(at: &Placing, a: &Part) -> Option<FileEntry> {
    let slot = at.running.0;
    if let Part::Payload(name) = a {
        // A payload's base is an object of the store: its name is its verified sha256.
        let e = at.kept.as_ref()?.payload(name)?.file.clone();
        return crate::payload::holds(&at.env.cfg.state_dir, &e.sha256, e.size).then_some(e);
    }
    let Some(want) = at.running_sha256.as_deref() else {
        log::info!("{a}: the state names no build for slot {slot}; a patch's base is proven by hashing the slot");
        return None;
    };
    match crate::slotfiles::manifest_with_sha256(&at.env.cfg.state_dir, slot) {
        Ok(Some((m, sha))) if sha == want => m.entry(a).cloned(),
        Ok(Some((_, sha))) => {
            log::warn!(
                "{a}: the manifest kept for slot {slot} has sha256 {sha}, the slot runs {want}; a patch's base is proven by hashing the slot instead"
            );
            None
        }
        Ok(None) => {
            log::info!("{a}: no manifest is kept for slot {slot}; a patch's base is proven by hashing the slot");
            None
        }
        Err(e) => {
            log::warn!("{a}: {e}; a patch's base is proven by hashing the slot instead");
            None
        }
    }
}

/// What hashing the running slot's copy of `a` proves (no kept manifest names the
/// running build: an image written by `dd`, a re-made state partition): the sha256 of its
/// first bytes up to each base size a listed patch could be chosen for, in one pass.
/// Nothing when no patch could win or the slot cannot be read. Reads only.
fn prove_by_hash(
    at: &Placing,
    a: &Part,
    entry: &FileEntry,
    held: &[u64],
    chunk_fetch: u64,
) -> Vec<Proven> {
    let patches = &entry.patches;
    let (slot, Some(version)) = (at.running.0, at.running.1.as_deref()) else {
        return Vec::new();
    };
    let (file, offset, len) = match open_running(at, a, version) {
        Ok(f) => f,
        Err(e) => {
            log::warn!("{a}: cannot read the running slot's copy to prove a patch's base ({e}); no patch is used");
            return Vec::new();
        }
    };
    let sizes = sizes_to_prove(patches, held, chunk_fetch, len);
    if sizes.is_empty() {
        return Vec::new();
    }
    let started = std::time::Instant::now();
    match hash_prefixes(&file, offset, &sizes) {
        Ok(proven) => {
            log::info!(
                "{a}: no kept manifest names slot {slot}'s build: hashed its first {} for the listed patches' bases in {:.1} s",
                crate::units::Size(sizes[sizes.len() - 1]),
                started.elapsed().as_secs_f64()
            );
            proven
        }
        Err(e) => {
            log::warn!("{a}: reading slot {slot}'s copy to prove a patch's base failed ({e}); no patch is used");
            Vec::new()
        }
    }
}

/// The header of patch `p`: from its staged copy when that holds it, else from the first
/// bytes of the release's file (one small range request, under the stage's rules).
fn patch_header(
    at: &Placing,
    p: &PatchRef,
    staged: &Path,
    held: u64,
) -> std::result::Result<PatchHeader, String> {
    let (source, opts) = (at.source, at.opts);
    let want = p.size.min(HEADER_READ);
    let bytes = if held >= want {
        let mut b = vec![0u8; want as usize];
        File::open(staged)
            .and_then(|mut f| f.read_exact(&mut b))
            .map_err(|e| format!("{}: {e}", staged.display()))?;
        b
    } else {
        retrying(at.env.backoff(opts), || {
            let r = source.open_range(&p.path, 0, want)?;
            let mut b = Vec::new();
            at.env
                .watch(opts)
                .reader(r)
                .read_to_end(&mut b)
                .map_err(|e| Error::Fetch {
                    location: source.location(&p.path),
                    what: crate::net::fetch::body_failed(&e),
                    retryable: true,
                })?;
            Ok(b)
        })
        .map_err(|e| e.to_string())?
    };
    crate::patch::read_header(&mut bytes.as_slice()).map_err(|e| format!("its header: {e}"))
}

/// The header must say what the signed manifest says (kind, base, target), and this build
/// must reproduce its compressor.
fn check_header(
    entry: &FileEntry,
    p: &PatchRef,
    h: &PatchHeader,
) -> std::result::Result<(), String> {
    let kind = match h.kind {
        PatchKind::Plain => "plain",
        PatchKind::Squashfs => "squashfs",
    };
    let said = |what: &str, header: String, manifest: String| {
        Err(format!(
            "its header says {what} {header}, the signed manifest {manifest}"
        ))
    };
    if kind != p.kind {
        return said("kind", kind.into(), p.kind.escape_debug().to_string());
    }
    let (bsha, tsha) = (hex::encode(h.base_sha256), hex::encode(h.target_sha256));
    if (h.base_size, &bsha) != (p.base.size, &p.base.sha256) {
        return said(
            "base",
            format!("{} bytes sha256 {bsha}", h.base_size),
            format!("{} bytes sha256 {}", p.base.size, p.base.sha256),
        );
    }
    if (h.target_size, &tsha) != (entry.size, &entry.sha256) {
        return said(
            "target",
            format!("{} bytes sha256 {tsha}", h.target_size),
            format!("{} bytes sha256 {}", entry.size, entry.sha256),
        );
    }
    crate::patch::can_apply(h).map_err(|e| e.to_string())
}

/// The running slot's copy of artifact `a`, opened read-only, holding at least the
/// patch's base size (the applier reads that range in place, a slot partition too), if
/// the staging area has room for the patch.
fn patch_base(at: &Placing, a: &Part, p: &PatchRef) -> Option<LocalFile> {
    let (slot, version) = (at.running.0, at.running.1.as_deref()?);
    match open_running(at, a, version) {
        Ok((file, offset, len)) if len >= p.base.size => {
            let base = LocalFile {
                file,
                offset,
                len: p.base.size,
                name: format!("slot {slot} {a}"),
            };
            let free = crate::layout::free_bytes(&at.env.cfg.state_dir).unwrap_or(0);
            if free < p.size {
                log::warn!(
                    "{a}: the patch needs {} free in {}, {} are; no patch is used",
                    crate::units::Size(p.size),
                    at.env.cfg.state_dir.display(),
                    crate::units::Size(free)
                );
                return None;
            }
            Some(base)
        }
        Ok((_, _, len)) => {
            log::warn!(
                "{a}: slot {slot} holds {len} bytes, the patch's base {}; no patch is used",
                p.base.size
            );
            None
        }
        Err(e) => {
            log::warn!("{a}: cannot read the running slot's copy ({e}); no patch is used");
            None
        }
    }
}

/// The running slot's copy of part `a` for reading (a slot file through the layout, a
/// payload's object of the running release's kept manifest): (file, offset, length).
fn open_running(at: &Placing, a: &Part, version: &str) -> crate::error::Result<(File, u64, u64)> {
    match a {
        Part::Slot(x) => at.env.layout.open_artifact(at.running.0, version, *x),
        Part::Payload(name) => {
            let missing = || {
                Error::Layout(format!(
                    "the running release keeps no payload {}",
                    name.escape_debug()
                ))
            };
            let e = at
                .kept
                .as_ref()
                .and_then(|m| m.payload(name))
                .ok_or_else(missing)?;
            let path = crate::payload::object_path(&at.env.cfg.state_dir, &e.file.sha256);
            let f = File::open(&path).map_err(|err| Error::io("open", &path, err))?;
            Ok((f, 0, e.file.size))
        }
    }
}

/// Patch `p` (header `h`, fetching `fetch` bytes) against the chunk plan's `chunk_fetch`
/// bytes, under `opts.prefer` ([`weigh`]).
fn weigh_patch(
    at: &Placing,
    h: &PatchHeader,
    p: &PatchRef,
    fetch: u64,
    chunk_fetch: u64,
    opts: &crate::stage::StageOptions,
) -> Verdict {
    let work = ApplyWork {
        blocks: p.blocks,
        block_size: h.block_size,
        level: h.level,
        target_size: h.target_size,
        workers: crate::patch::workers(),
    };
    let ways = Ways {
        chunk_fetch,
        patch_fetch: fetch,
        apply_secs: apply_secs(&work),
    };
    weigh(opts.prefer, opts.max_bytes.is_some(), at.link, ways)
}

/// sha256 of the first `size` bytes of `file` from `offset`, for each of `sizes` (ascending),
/// in one pass (the hasher's state is copied at each size).
fn hash_prefixes(file: &File, offset: u64, sizes: &[u64]) -> std::io::Result<Vec<Proven>> {
    use sha2::{Digest as _, Sha256};
    use std::os::unix::fs::FileExt;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; crate::stage::BUF];
    let mut pos = 0u64;
    let mut out = Vec::with_capacity(sizes.len());
    for &size in sizes {
        while pos < size {
            let n = (size - pos).min(buf.len() as u64) as usize;
            file.read_exact_at(&mut buf[..n], offset + pos)?;
            h.update(&buf[..n]);
            pos += n as u64;
        }
        out.push(Proven {
            size,
            sha256: hex::encode(h.clone().finalize()),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest as _, Sha256};
    use std::io::Write as _;

    #[test]
    fn prefixes_hash_as_the_bytes_they_cover_from_the_offset() {
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&bytes).unwrap();
        let got = hash_prefixes(&f, 100, &[0, 5, 1 << 20, 2_999_900]).unwrap();
        let want: Vec<Proven> = [0usize, 5, 1 << 20, 2_999_900]
            .iter()
            .map(|&n| Proven {
                size: n as u64,
                sha256: hex::encode(Sha256::digest(&bytes[100..100 + n])),
            })
            .collect();
        assert_eq!(got, want);
        assert!(
            hash_prefixes(&f, 100, &[3_000_000]).is_err(),
            "past the end is an error, not a short hash"
        );
    }
}
