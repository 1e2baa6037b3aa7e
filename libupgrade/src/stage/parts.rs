//! The stage pipeline over a release's parts (the three slot files, then its payloads): what
//! the plan knows of each before deciding ([`Stager::facts`]), each chunked part's chunk plan
//! and patch choice ([`Stager::plan_parts`]), and the check of each written part by its kind
//! ([`Stager::check_part`]).

use std::os::unix::fs::FileExt;

use super::patched::PatchWork;
use super::plan::{How, PartFacts, WritePlan};
use super::verify::Preflight;
use super::{ChunkWork, Placing, Run, StageOptions, Stager};
use crate::error::{Error, Result};
use crate::manifest::{Manifest, Part};
use crate::net::fetch::Source;
use crate::payload::kinds::PartRef;
use crate::payload::kinds::Place;

/// Per part of a plan: its chunk work, its chosen patch, why (see [`Stager::plan_parts`]).
type PartWork = (
    Vec<Option<ChunkWork>>,
    Vec<Option<PatchWork>>,
    Vec<Option<String>>,
);

impl Stager<'_> {
    /// What the plan knows of each of `parts`: its chunk index (`pre`), and whether the
    /// store already holds it (a payload).
    pub(super) fn facts(&self, parts: &[PartRef], pre: &Preflight) -> Vec<PartFacts> {
        parts
            .iter()
            .enumerate()
            .map(|(k, p)| PartFacts {
                part: p.part.clone(),
                has_index: pre.indexes[k].is_some(),
                stored: p.kind.place == Place::Store
                    && crate::payload::holds(&self.cfg.state_dir, &p.entry.sha256, p.entry.size),
            })
            .collect()
    }

    /// Each chunked step of `plan`: its chunk plan (taking its index from `pre`), then the
    /// patch it is rebuilt by when one wins (the step becomes [`How::Patched`]).
    pub(super) fn plan_parts(
        &self,
        at: &Placing,
        source: &Source,
        plan: &mut WritePlan,
        pre: &mut Preflight,
        opts: &StageOptions,
    ) -> Result<PartWork> {
        let n = plan.steps.len();
        let mut chunks: Vec<Option<ChunkWork>> = (0..n).map(|_| None).collect();
        let mut patches: Vec<Option<PatchWork>> = (0..n).map(|_| None).collect();
        let mut choices: Vec<Option<String>> = vec![None; n];
        for k in 0..n {
            let (a, how) = plan.steps[k].clone();
            if how != How::Chunked {
                continue;
            }
            let index = pre.indexes[k]
                .take()
                .expect("planned chunked: has an index");
            let work = self.plan_chunked(at, &a, index)?;
            let chosen = self.plan_patched(at, source, &a, &work, opts);
            choices[k] = chosen.why;
            if let Some((how, pw)) = chosen.patch {
                plan.steps[k].1 = how;
                patches[k] = Some(pw);
            }
            chunks[k] = Some(work);
        }
        Ok((chunks, patches, choices))
    }

    /// The written part must pass its kind's check ([`crate::payload::kinds::Kind::check`]:
    /// the rootfs a squashfs whose used bytes fit the signed size, an image archive a tar).
    pub(super) fn check_part(&self, run: &Run, p: &PartRef) -> Result<()> {
        let Some(check) = p.kind.check else {
            return Ok(());
        };
        let (f, offset, len) = match p.kind.place {
            Place::Slot(a) => self.layout.open_artifact(run.slot, &run.m.version, a)?,
            Place::Store => {
                let path = crate::payload::object_path(&self.cfg.state_dir, &p.entry.sha256);
                let f = std::fs::File::open(&path).map_err(|e| Error::io("open", &path, e))?;
                (f, 0, p.entry.size)
            }
        };
        let read = |pos: u64, buf: &mut [u8]| {
            if pos + buf.len() as u64 > len {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("read at {pos} past the {len} bytes written"),
                ));
            }
            f.read_exact_at(buf, offset + pos)
        };
        check(&read, p.entry.size).map_err(|what| Error::BadImage {
            slot: run.slot,
            what: match &p.part {
                Part::Slot(_) => what,
                other => format!("{other}: {what}"),
            },
        })
    }
}

/// The signed entry of `part` of `m` (a part the plan took from `m`).
pub(crate) fn entry<'m>(m: &'m Manifest, part: &Part) -> &'m crate::manifest::FileEntry {
    m.entry(part).expect("a planned part is in its manifest")
}
