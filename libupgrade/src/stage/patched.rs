//! The patched executor: one artifact rebuilt from the running slot's copy by a per-pair patch
//! the signed manifest lists ([`crate::patch`]), chosen by the planner when it fetches fewer
//! bytes than the artifact's chunk plan ([`super::plan::patch_candidates`]).
//!
//! In order, each step falling back to the chunk plan for what it did not deliver:
//! 1. the patch is fetched into the staging area (`<state_dir>/patches/<sha256>.patch`), by
//!    range from what an interrupted attempt left, under the stage's rate limit, budget,
//!    minimum rate, deadline and retries; its size and sha256 are checked against the signed
//!    manifest before it is read;
//! 2. it is applied to the running slot's copy (opened read-only: the running slot is never
//!    written), its output cut at the signed chunk index's boundaries, and each chunk written
//!    only when its sha256 is the index's (chunks an interrupted attempt already wrote and
//!    verified are skipped);
//! 3. the chunks it did not deliver — none when the patch is good; some when its output
//!    differs (another compressor, a base that differs where the manifest says it does not),
//!    or all after it when it fails to fetch, verify or apply — are taken by the chunk plan
//!    (copied from the running slot or fetched by range), said once with their count, and the
//!    whole file's sha256 is checked at the end as for every chunked artifact.
//!
//! Resume after `kill -9` or a power cut: the chunks written are re-verified in place by the
//! next run's plan and kept, the staged patch is kept and continued (at most the piece in
//! flight is fetched again) and re-applied. The staging area is emptied when a new attempt
//! starts and when the slot is staged.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::plan::{patch_candidates, How};
use super::{ChunkWork, Placing, Run, Stager, BUF};
use crate::chunk::apply::Transfer;
use crate::chunk::local::LocalFile;
use crate::chunk::plan::{Action, Plan};
use crate::chunk::rate::Limited;
use crate::error::{Error, Result};
use crate::layout::Target;
use crate::manifest::{Artifact, PatchRef};
use crate::net::fetch::Source;
use crate::net::retry::retrying;
use crate::patch::{PatchHeader, PatchKind};

/// Bytes read from the start of a patch to check its header before choosing it (a header is
/// at most 229 bytes).
const HEADER_READ: u64 = 512;

/// The staging area for patches under `state_dir`.
pub(crate) fn staging_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("patches")
}

/// Remove the staging area (a new attempt starts, or the slot is staged).
pub(crate) fn clear_staging(state_dir: &Path) -> Result<()> {
    let d = staging_dir(state_dir);
    match std::fs::remove_dir_all(&d) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove", &d, e)),
    }
}

/// A patch chosen for one artifact.
pub(crate) struct PatchWork {
    /// The patch as the signed manifest lists it.
    pub patch: PatchRef,
    /// Where it is staged.
    pub staged: PathBuf,
    /// The running slot's copy of the artifact: the patch's base.
    pub base: LocalFile,
}

impl Stager<'_> {
    /// A patch of artifact `a` that rebuilds it from the running slot's copy for fewer bytes
    /// than `work`'s chunk plan fetches, with the step that applies it; `None`: chunks. Reads
    /// only (the header of each candidate, from the staging area or by one small range).
    pub(super) fn plan_patched(
        &self,
        at: &Placing,
        source: &Source,
        a: Artifact,
        work: &ChunkWork,
        opts: &super::StageOptions,
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
        opts: &super::StageOptions,
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
    /// patch's base size; when the applier needs it copied ([`base_file`]), only if the
    /// staging area has room for the copy and the patch.
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
                if needs_copy(&base) {
                    let need = p.base.size.saturating_add(p.size);
                    let free = crate::layout::free_bytes(&self.cfg.state_dir).unwrap_or(0);
                    if free < need {
                        log::warn!(
                            "{a}: the patch needs {} free in {} for itself and a copy of its base, {} are; no patch is used",
                            crate::units::Size(need),
                            self.cfg.state_dir.display(),
                            crate::units::Size(free)
                        );
                        return None;
                    }
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

    /// Write artifact `a` by its patch `pw`, then the chunks the patch did not deliver by
    /// `work`'s chunk plan; returns what came from where.
    pub(super) fn write_patched(
        &self,
        run: &Run,
        a: Artifact,
        work: &ChunkWork,
        pw: &PatchWork,
    ) -> Result<Transfer> {
        let target = self.open_target(run, a)?;
        let mut present: Vec<bool> = work
            .plan
            .actions
            .iter()
            .map(|x| *x == Action::Keep)
            .collect();
        let mut fetched = 0;
        let rebuilt = match self.fetch_patch(run, a, pw, &mut fetched) {
            Ok(patch) => self.rebuild(run, a, work, pw, patch, &target, &mut present)?,
            Err(e @ Error::Stopped { .. }) => return Err(e),
            Err(e) => {
                log::warn!(
                    "{a}: the patch from {} failed ({e}); the {a} comes by chunks",
                    pw.patch.base.version.escape_debug()
                );
                Rebuilt {
                    fell_back: Some(e.to_string()),
                    ..Rebuilt::default()
                }
            }
        };
        // The chunks the patch did not deliver, as the chunk path would have taken them.
        let local: Vec<_> = work
            .plan
            .actions
            .iter()
            .map(|x| match x {
                Action::Copy(l) => Some(*l),
                _ => None,
            })
            .collect();
        let fixup: Plan = crate::chunk::plan::plan(&work.index, &present, &local);
        if rebuilt.mismatched > 0 {
            log::warn!(
                "{a}: {} chunk(s) of the patch's output ({}) do not match the signed chunk index; not written, taken by range instead",
                rebuilt.mismatched,
                crate::units::Size(rebuilt.mismatched_bytes)
            );
        }
        let t = self.apply_chunks(run, a, work, &fixup, &target)?;
        target.finish()?;
        crate::barrier::hit("stage:artifact-complete");
        run.patched.borrow_mut().push(super::PatchOutcome {
            artifact: a,
            from: pw.patch.base.version.clone(),
            patch_fetched: fetched,
            rebuilt: rebuilt.written,
            mismatched_chunks: rebuilt.mismatched,
            fell_back: rebuilt.fell_back,
        });
        // The patch's bytes stand for the part of the artifact it rebuilt: what the run did not
        // fetch is the rest (as the preview counts it), unless the patch fell short of its size.
        Ok(Transfer {
            kept: t.kept - rebuilt.written,
            copied: (t.copied + rebuilt.written).saturating_sub(fetched),
            fetched: t.fetched + fetched,
            requests: t.requests + u64::from(fetched > 0),
            ..t
        })
    }

    /// Fetch patch `pw` into the staging area from what it holds, then check its size and
    /// sha256; `fetched` counts this run's network bytes. A staged copy that does not verify
    /// is removed (the next attempt fetches it again).
    fn fetch_patch(
        &self,
        run: &Run,
        a: Artifact,
        pw: &PatchWork,
        fetched: &mut u64,
    ) -> Result<File> {
        let p = &pw.patch;
        let dir = staging_dir(&self.cfg.state_dir);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
        let mut f = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&pw.staged)
            .map_err(|e| Error::io("open", &pw.staged, e))?;
        let mut have = f
            .metadata()
            .map_err(|e| Error::io("stat", &pw.staged, e))?
            .len();
        if have > p.size {
            f.set_len(0)
                .map_err(|e| Error::io("truncate", &pw.staged, e))?;
            have = 0;
        }
        let loc = run.source.location(&p.path);
        run.progress
            .begin(&format!("{a} patch ({})", p.path), p.size, have);
        let mut backoff = self.backoff(run.opts);
        let mut buf = vec![0u8; BUF];
        while have < p.size {
            let left = run.throttle.grant(1).map_err(|why| Error::Stopped {
                why,
                fetched: run.throttle.budget.map_or(0, |b| b.used()),
                left: 0,
            })?;
            let stop = p.size.min(have.saturating_add(left));
            let body = match run.source.open_range(&p.path, have, stop) {
                Ok(b) => b,
                Err(e) => {
                    backoff.attempt_failed(&loc, e)?;
                    continue;
                }
            };
            let mut r = Limited::new(self.watch(run.opts).reader(body), run.throttle);
            let before = have;
            let failed = loop {
                match r.read(&mut buf) {
                    Ok(0) => break None,
                    Ok(n) => {
                        f.write_all(&buf[..n])
                            .map_err(|e| Error::io("write", &pw.staged, e))?;
                        have += n as u64;
                        *fetched += n as u64;
                        run.progress.advance(n as u64);
                        run.progress.fetched(n as u64);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => break Some(crate::net::fetch::body_failed(&e)),
                }
            };
            f.sync_data()
                .map_err(|e| Error::io("fsync", &pw.staged, e))?;
            if have == stop {
                backoff.progressed();
                continue;
            }
            if have > before {
                backoff.progressed();
            }
            let what =
                failed.unwrap_or_else(|| format!("stream ended at byte {have} of {}", p.size));
            if !backoff.wait(&loc, &what) {
                run.progress.end();
                return Err(Error::Fetch {
                    location: loc,
                    what: format!(
                        "{} (the {have} bytes staged are kept for the next attempt)",
                        backoff.gave_up(&what)
                    ),
                    retryable: true,
                });
            }
        }
        run.progress.end();
        let found = sha256_file(&pw.staged)?;
        if found != p.sha256 {
            std::fs::remove_file(&pw.staged).map_err(|e| Error::io("remove", &pw.staged, e))?;
            return Err(Error::Checksum {
                artifact: a,
                location: loc,
                expected: p.sha256.clone(),
                found,
            });
        }
        File::open(&pw.staged).map_err(|e| Error::io("open", &pw.staged, e))
    }

    /// Apply the staged `patch` to the base and write each chunk of its output whose sha256
    /// is the signed index's and that `present` lacks (then marked present). A failure of the
    /// patch itself is logged here and ends the rebuild: what it wrote stays, the rest is
    /// left to the chunk plan. Errors are the target's only.
    #[allow(clippy::too_many_arguments)]
    fn rebuild(
        &self,
        run: &Run,
        a: Artifact,
        work: &ChunkWork,
        pw: &PatchWork,
        patch: File,
        target: &Target,
        present: &mut [bool],
    ) -> Result<Rebuilt> {
        let base = match base_file(&pw.base, &self.cfg.state_dir, &pw.patch) {
            Ok(b) => b,
            Err(e) => {
                log::warn!("{a}: {e}; the {a} comes by chunks");
                return Ok(Rebuilt {
                    fell_back: Some(e.to_string()),
                    ..Rebuilt::default()
                });
            }
        };
        let chunks = &work.index.chunks;
        let mut cut = Cutter {
            buf: Vec::with_capacity(work.index.params.max as usize),
            next: 0,
            out: Rebuilt::default(),
            failed: None,
        };
        run.progress.begin(
            &format!("{a} from patch {}", pw.patch.path),
            run.m.files.get(a).size,
            0,
        );
        let mut reader = std::io::BufReader::with_capacity(BUF, patch);
        let applied = crate::patch::apply(&mut reader, &base, &mut |bytes| {
            cut.feed(bytes, chunks, present, target, run)
        });
        run.progress.end();
        if let Some(e) = cut.failed {
            return Err(e);
        }
        match applied {
            Err(e) if cut.next < chunks.len() => {
                log::warn!(
                    "{a}: applying the patch from {} stopped at chunk {} of {} ({e}); the rest of the {a} comes by chunks",
                    pw.patch.base.version.escape_debug(),
                    cut.next,
                    chunks.len()
                );
                cut.out.fell_back = Some(format!(
                    "applying it stopped at chunk {} of {}: {e}",
                    cut.next,
                    chunks.len()
                ));
            }
            // Every chunk was checked; those that did not match are counted and fetched.
            Err(e) => log::debug!("{a}: the patch's own check: {e}"),
            Ok(_) => {}
        }
        target.sync()?;
        Ok(cut.out)
    }
}

/// What a patch wrote: bytes of verified chunks, the chunks whose output did not match, and
/// why it was given up before the end, if it was.
#[derive(Debug, Default, Clone)]
struct Rebuilt {
    written: u64,
    mismatched: u64,
    mismatched_bytes: u64,
    fell_back: Option<String>,
}

/// Cuts a patch's output at the chunk index's boundaries and writes the chunks that verify.
struct Cutter {
    buf: Vec<u8>,
    /// The chunk being filled.
    next: usize,
    out: Rebuilt,
    /// A write to the target failed (ends the apply; reported as the stage's error).
    failed: Option<Error>,
}

impl Cutter {
    fn feed(
        &mut self,
        mut bytes: &[u8],
        chunks: &[crate::chunk::ChunkEntry],
        present: &mut [bool],
        target: &Target,
        run: &Run,
    ) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let Some(c) = chunks.get(self.next) else {
                return Err(std::io::Error::other("output past the signed chunk index"));
            };
            let want = c.len as usize - self.buf.len();
            let n = want.min(bytes.len());
            self.buf.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.buf.len() < c.len as usize {
                continue;
            }
            let len = u64::from(c.len);
            if !present[self.next] {
                if crate::chunk::digest(&self.buf) == c.digest {
                    if let Err(e) = target.write_at(c.offset, &self.buf) {
                        let msg = e.to_string();
                        self.failed = Some(e);
                        return Err(std::io::Error::other(msg));
                    }
                    present[self.next] = true;
                    self.out.written += len;
                    // Counted as reused by the chunk plan that keeps it (not twice).
                    run.progress.advance(len);
                } else {
                    self.out.mismatched += 1;
                    self.out.mismatched_bytes += len;
                }
            }
            self.buf.clear();
            self.next += 1;
        }
        Ok(())
    }
}

/// Whether `base` is not a whole file of exactly its length (see [`base_file`]).
fn needs_copy(base: &LocalFile) -> bool {
    let exact = base.offset == 0
        && base
            .file
            .metadata()
            .is_ok_and(|m| m.is_file() && m.len() == base.len);
    !exact
}

/// sha256 of a whole file, hex.
fn sha256_file(p: &Path) -> Result<String> {
    let mut f = File::open(p).map_err(|e| Error::io("open", p, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; BUF];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io("read", p, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// The base as the patch applier takes it: a file holding exactly the base's bytes from byte
/// 0. The running slot's kernel and initrd (and a directory layout's rootfs) are such files;
/// a rootfs partition is larger than its squashfs (and a block device reports no length), so
/// its base range is copied read-only into the staging area first. Never writes the slot.
///
/// (The applier reads its base as a whole file. Taking a byte range of a file instead would
/// save this copy: a change of `crate::patch`'s API, owned there.)
fn base_file(base: &LocalFile, state_dir: &Path, p: &PatchRef) -> Result<File> {
    if !needs_copy(base) {
        return base
            .file
            .try_clone()
            .map_err(|e| Error::io("duplicate", &base.name, e));
    }
    let dir = staging_dir(state_dir);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
    let copy = dir.join(format!("{}.base", p.base.sha256));
    let mut out = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&copy)
        .map_err(|e| Error::io("create", &copy, e))?;
    std::io::copy(&mut base.reader(), &mut out)
        .map_err(|e| Error::io("copy the base to", &copy, e))?;
    // Unlinked while open: nothing is left behind, whatever happens next.
    std::fs::remove_file(&copy).map_err(|e| Error::io("remove", &copy, e))?;
    Ok(out)
}
