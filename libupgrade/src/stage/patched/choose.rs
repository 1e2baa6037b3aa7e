//! Which listed patch an artifact is staged by, if any: the candidates the pure rule allows
//! ([`patch_candidates`]), then, best first, the first whose header agrees with the signed
//! manifest and this build's compressor and whose base the node can read. Reads only.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::staging::staging_dir;
use super::PatchWork;
use crate::chunk::local::LocalFile;
use crate::error::Error;
use crate::manifest::{Artifact, PatchRef};
use crate::net::fetch::Source;
use crate::net::retry::retrying;
use crate::patch::{PatchHeader, PatchKind};
use crate::stage::plan::{patch_candidates, How};
use crate::stage::{ChunkWork, Placing, Stager};

/// Bytes read from the start of a patch to check its header before choosing it (a header is
/// at most 229 bytes).
const HEADER_READ: u64 = 512;
impl Stager<'_> {
    /// A patch of artifact `a` that rebuilds it from the running slot's copy for fewer bytes
    /// than `work`'s chunk plan fetches, with the step that applies it; `None`: chunks. Reads
    /// only (the header of each candidate, from the staging area or by one small range).
    pub(in crate::stage) fn plan_patched(
        &self,
        at: &Placing,
        source: &Source,
        a: Artifact,
        work: &ChunkWork,
        opts: &crate::stage::StageOptions,
    ) -> Option<(How, PatchWork)> {
        let entry = at.m.files.get(a);
        if entry.patches.is_empty() {
            return None;
        }
        let running = self.running_entry(at, a)?;
        let dir = staging_dir(&self.cfg.state_dir);
        let staged: Vec<PathBuf> = entry
            .patches
            .iter()
            .map(|p| dir.join(format!("{}.patch", p.sha256)))
            .collect();
        // Only a continued attempt keeps the staging area (a new one empties it first).
        let held: Vec<u64> = staged
            .iter()
            .map(|p| match at.resumed {
                true => std::fs::metadata(p).map_or(0, |m| m.len()),
                false => 0,
            })
            .collect();
        let candidates =
            patch_candidates(&entry.patches, Some(&running), &held, work.plan.fetch_bytes);
        for (i, fetch) in candidates {
            let p = &entry.patches[i];
            let checked = self
                .patch_header(source, p, &staged[i], held[i], opts)
                .and_then(|h| self.check_header(at, a, p, &h).map(|()| h));
            match checked {
                Ok(_) => {}
                Err(why) => {
                    log::warn!(
                        "{a}: patch {} from {} not used ({why}); trying the next way",
                        source.location(&p.path),
                        p.base.version.escape_debug()
                    );
                    continue;
                }
            }
            let base = self.patch_base(at, a, p)?;
            return Some((
                How::Patched { patch: i, fetch },
                PatchWork {
                    patch: p.clone(),
                    staged: staged[i].clone(),
                    base,
                },
            ));
        }
        None
    }

    /// Artifact `a`'s entry in the running release's signed manifest, as the node kept it
    /// (`slots/<slot>/manifest.json`), when that manifest is the running build's.
    fn running_entry(&self, at: &Placing, a: Artifact) -> Option<crate::manifest::FileEntry> {
        let (slot, want) = (at.running.0, at.running_sha256.as_deref()?);
        match crate::slotfiles::manifest_with_sha256(&self.cfg.state_dir, slot) {
            Ok(Some((m, sha))) if sha == want => Some(m.files.get(a).clone()),
            Ok(Some((_, sha))) => {
                log::warn!(
                    "{a}: the manifest kept for slot {slot} has sha256 {sha}, the slot runs {want}; no patch is used"
                );
                None
            }
            Ok(None) => None,
            Err(e) => {
                log::warn!("{a}: {e}; no patch is used");
                None
            }
        }
    }

    /// The header of patch `p`: from its staged copy when that holds it, else from the first
    /// bytes of the release's file (one small range request, under the stage's rules).
    fn patch_header(
        &self,
        source: &Source,
        p: &PatchRef,
        staged: &Path,
        held: u64,
        opts: &crate::stage::StageOptions,
    ) -> std::result::Result<PatchHeader, String> {
        let want = p.size.min(HEADER_READ);
        let bytes = if held >= want {
            let mut b = vec![0u8; want as usize];
            File::open(staged)
                .and_then(|mut f| f.read_exact(&mut b))
                .map_err(|e| format!("{}: {e}", staged.display()))?;
            b
        } else {
            retrying(self.backoff(opts), || {
                let r = source.open_range(&p.path, 0, want)?;
                let mut b = Vec::new();
                self.watch(opts)
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
        &self,
        at: &Placing,
        a: Artifact,
        p: &PatchRef,
        h: &PatchHeader,
    ) -> std::result::Result<(), String> {
        let entry = at.m.files.get(a);
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
    fn patch_base(&self, at: &Placing, a: Artifact, p: &PatchRef) -> Option<LocalFile> {
        let (slot, version) = (at.running.0, at.running.1.as_deref()?);
        match self.layout.open_artifact(slot, version, a) {
            Ok((file, offset, len)) if len >= p.base.size => {
                let base = LocalFile {
                    file,
                    offset,
                    len: p.base.size,
                    name: format!("slot {slot} {a}"),
                };
                let free = crate::layout::free_bytes(&self.cfg.state_dir).unwrap_or(0);
                if free < p.size {
                    log::warn!(
                        "{a}: the patch needs {} free in {}, {} are; no patch is used",
                        crate::units::Size(p.size),
                        self.cfg.state_dir.display(),
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
}
