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
//! flight is fetched again) and applied again with every op whose output only reaches chunks
//! the target holds skipped ([`crate::patch::apply_needed`]): at most the op in flight when the
//! run died is rebuilt again (`PatchOutcome::skipped` counts what was not). The staging area is emptied when a new attempt
//! starts and when the slot is staged.
//!
//! Files: this one (the executor: fetch, rebuild, hand the rest to the chunk plan), `choose`
//! (which listed patch, if any: reads only, before the first write), `staging` (the staging
//! area, the patch's resumable fetch). The base is read in place ([`crate::patch::Base`]).

use std::fs::File;

use super::chunked;
use super::parts::{ChunkWork, PartPlan, PatchWork};
use super::run::Run;
use super::BUF;
use crate::chunk::apply::Transfer;
use crate::chunk::plan::{Action, Plan};
use crate::error::{Error, Result};
use crate::layout::Target;

mod choose;
mod staging;

pub(crate) use choose::choose;
pub(crate) use staging::clear_staging;

/// Write part `p` by its patch `pw`, then the chunks the patch did not deliver by `work`'s
/// chunk plan; returns what came from where.
pub(in crate::stage) fn write(
    run: &Run,
    p: &PartPlan,
    work: &ChunkWork,
    pw: &PatchWork,
) -> Result<Transfer> {
    let a = &p.part;
    let target = chunked::open_target(run, p)?;
    let mut present: Vec<bool> = work
        .plan
        .actions
        .iter()
        .map(|x| *x == Action::Keep)
        .collect();
    let mut fetched = 0;
    let job = Job { p, work, pw };
    let rebuilt = match staging::fetch(run, a, pw, &mut fetched) {
        Ok(patch) => rebuild(run, &job, patch, &target, &mut present)?,
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
    let t = chunked::apply_plan(run, p, work, &fixup, &target)?;
    target.finish()?;
    crate::barrier::hit("stage:artifact-complete");
    run.patched.borrow_mut().push(super::PatchOutcome {
        artifact: a.clone(),
        from: pw.patch.base.version.clone(),
        patch_fetched: fetched,
        rebuilt: rebuilt.written,
        mismatched_chunks: rebuilt.mismatched,
        fell_back: rebuilt.fell_back,
        base_hashed: pw.base_hashed,
        skipped: rebuilt.skipped,
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
/// is the signed index's and that `present` lacks (then marked present); the ops whose
/// output only reaches chunks `present` already holds (a resumed attempt) are skipped. A
/// failure of the patch itself is logged here and ends the rebuild: what it wrote stays,
/// the rest is left to the chunk plan. Errors are the target's only.
fn rebuild(
    run: &Run,
    job: &Job,
    patch: File,
    target: &Target,
    present: &mut [bool],
) -> Result<Rebuilt> {
    let (a, pw) = (&job.p.part, job.pw);
    let base = crate::patch::Base {
        file: &pw.base.file,
        offset: pw.base.offset,
        len: pw.base.len,
    };
    let chunks = &job.work.index.chunks;
    let held = present.to_vec();
    let needed = |r: std::ops::Range<u64>| wanted(chunks, &held, r);
    let mut cut = Cutter::new(job.work.index.params.max as usize);
    run.progress.begin(
        &format!("{a} from patch {}", pw.patch.path),
        job.p.entry.size,
        0,
    );
    let mut reader = std::io::BufReader::with_capacity(BUF, patch);
    let applied = crate::patch::apply_needed(&mut reader, base, &needed, &mut |at, bytes| {
        cut.feed(at, bytes, chunks, present, target, run)
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
        Ok(st) => cut.out.skipped = st.skipped_bytes,
    }
    target.sync()?;
    Ok(cut.out)
}

/// One patched artifact's parts.
struct Job<'j> {
    p: &'j PartPlan,
    work: &'j ChunkWork,
    pw: &'j PatchWork,
}

/// Whether any chunk that `range` of the target reaches is missing from `held`.
fn wanted(chunks: &[crate::chunk::ChunkEntry], held: &[bool], range: std::ops::Range<u64>) -> bool {
    let first = chunks.partition_point(|c| c.offset + u64::from(c.len) <= range.start);
    chunks[first..]
        .iter()
        .zip(&held[first..])
        .take_while(|(c, _)| c.offset < range.end)
        .any(|(_, h)| !h)
}

/// What a patch wrote: bytes of verified chunks, the chunks whose output did not match, the
/// output skipped because the target held it, and why it was given up before the end, if it
/// was.
#[derive(Debug, Default, Clone)]
struct Rebuilt {
    written: u64,
    mismatched: u64,
    mismatched_bytes: u64,
    skipped: u64,
    fell_back: Option<String>,
}

/// Cuts a patch's output at the chunk index's boundaries and writes the chunks that verify.
/// The output may jump forward over skipped ops: a chunk entered part way through is one the
/// target holds already and is not checked.
struct Cutter {
    buf: Vec<u8>,
    /// The chunk being filled.
    next: usize,
    /// The target's offset of the next byte expected.
    pos: u64,
    /// The chunk being filled was entered part way through (its head skipped).
    partial: bool,
    out: Rebuilt,
    /// A write to the target failed (ends the apply; reported as the stage's error).
    failed: Option<Error>,
}

impl Cutter {
    fn new(max_chunk: usize) -> Self {
        Cutter {
            buf: Vec::with_capacity(max_chunk),
            next: 0,
            pos: 0,
            partial: false,
            out: Rebuilt::default(),
            failed: None,
        }
    }

    /// Take `bytes` of the output at offset `at` of the target.
    fn feed(
        &mut self,
        at: u64,
        mut bytes: &[u8],
        chunks: &[crate::chunk::ChunkEntry],
        present: &mut [bool],
        target: &Target,
        run: &Run,
    ) -> std::io::Result<()> {
        if at != self.pos {
            // Ops were skipped: continue in the chunk that holds `at`.
            self.next = chunks.partition_point(|c| c.offset + u64::from(c.len) <= at);
            self.partial = chunks.get(self.next).is_some_and(|c| c.offset < at);
            self.buf.clear();
            self.pos = at;
        }
        while !bytes.is_empty() {
            let Some(c) = chunks.get(self.next) else {
                return Err(std::io::Error::other("output past the signed chunk index"));
            };
            let end = c.offset + u64::from(c.len);
            let n = ((end - self.pos) as usize).min(bytes.len());
            if !self.partial {
                self.buf.extend_from_slice(&bytes[..n]);
            }
            bytes = &bytes[n..];
            self.pos += n as u64;
            if self.pos < end {
                continue;
            }
            if !self.partial && !present[self.next] {
                self.check_and_write(c, present, target, run)?;
            }
            self.partial = false;
            self.buf.clear();
            self.next += 1;
        }
        Ok(())
    }

    /// The chunk `c` in `buf` is complete: write it when its sha256 is the index's.
    fn check_and_write(
        &mut self,
        c: &crate::chunk::ChunkEntry,
        present: &mut [bool],
        target: &Target,
        run: &Run,
    ) -> std::io::Result<()> {
        let len = u64::from(c.len);
        if crate::chunk::digest(&self.buf) != c.digest {
            self.out.mismatched += 1;
            self.out.mismatched_bytes += len;
            return Ok(());
        }
        if let Err(e) = target.write_at(c.offset, &self.buf) {
            let msg = e.to_string();
            self.failed = Some(e);
            return Err(std::io::Error::other(msg));
        }
        present[self.next] = true;
        self.out.written += len;
        // Counted as reused by the chunk plan that keeps it (not twice).
        run.progress.advance(len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::ChunkEntry;

    #[test]
    fn an_op_is_wanted_when_any_chunk_it_reaches_is_missing() {
        let chunks: Vec<ChunkEntry> = [(0, 100), (100, 50), (150, 200)]
            .iter()
            .map(|&(offset, len)| ChunkEntry {
                offset,
                len,
                digest: [0; 32],
            })
            .collect();
        let held = [true, false, true];
        assert!(!wanted(&chunks, &held, 0..100), "inside a held chunk");
        assert!(wanted(&chunks, &held, 90..101), "reaches the missing one");
        assert!(wanted(&chunks, &held, 120..130));
        assert!(!wanted(&chunks, &held, 150..350));
        assert!(!wanted(&chunks, &held, 20..20), "nothing");
        assert!(!wanted(&chunks, &[true; 3], 0..350));
        assert!(wanted(&chunks, &[false; 3], 349..350));
    }
}
