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
//!
//! Files: this one (the executor: fetch, rebuild, hand the rest to the chunk plan), `choose`
//! (which listed patch, if any: reads only, before the first write), `staging` (the staging
//! area, the patch's resumable fetch). The base is read in place ([`crate::patch::Base`]).

use std::fs::File;
use std::path::PathBuf;

use super::{ChunkWork, Run, Stager, BUF};
use crate::chunk::apply::Transfer;
use crate::chunk::local::LocalFile;
use crate::chunk::plan::{Action, Plan};
use crate::error::{Error, Result};
use crate::layout::Target;
use crate::manifest::{Artifact, PatchRef};

mod choose;
mod staging;

pub(crate) use staging::clear_staging;

/// A patch chosen for one artifact.
pub(crate) struct PatchWork {
    /// The patch as the signed manifest lists it.
    pub patch: PatchRef,
    /// Where it is staged.
    pub staged: PathBuf,
    /// The running slot's copy of the artifact: the patch's base.
    pub base: LocalFile,
    /// The base was proven by hashing the running slot's range (no kept manifest names the
    /// running build), not by the kept manifest.
    pub base_hashed: bool,
}
impl Stager<'_> {
    /// Write artifact `a` by its patch `pw`, then the chunks the patch did not deliver by
    /// `work`'s chunk plan; returns what came from where.
    pub(in crate::stage) fn write_patched(
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
            base_hashed: pw.base_hashed,
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
        let base = crate::patch::Base {
            file: &pw.base.file,
            offset: pw.base.offset,
            len: pw.base.len,
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
        let applied = crate::patch::apply(&mut reader, base, &mut |bytes| {
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
