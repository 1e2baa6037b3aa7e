//! One record per part of a release ([`PartPlan`], like RAUC's install plan per image):
//! which part, its signed entry, its kind (where it goes: a slot file or the payload store,
//! and the rules its bytes are under), how it is fetched ([`Fetch`]) and what that costs.
//! The conductor ([`super::Stager`]) makes one per part before the first write and hands
//! each to its executor; the functions here are what every executor shares: where a part is
//! written ([`target`]) and the check of a written part by its kind ([`check`]).

use std::path::PathBuf;

use std::os::unix::fs::FileExt;

use super::plan::{ArtifactCost, How};
use super::run::{Env, Run};
use crate::chunk::local::LocalFile;
use crate::chunk::plan::Plan as ChunkPlan;
use crate::chunk::ChunkIndex;
use crate::error::{Error, Result};
use crate::layout::Target;
use crate::manifest::{FileEntry, Manifest, Part, PatchRef};
use crate::payload::kinds::{Kind, Place};

/// One part of a release, planned: what it is, where it goes, how it is fetched, its price.
pub(crate) struct PartPlan {
    /// Which part.
    pub part: Part,
    /// Its signed entry (path, size, sha256, chunk index, patches).
    pub entry: FileEntry,
    /// Its kind: where it goes ([`Kind::place`]) and what its bytes must pass.
    pub kind: &'static Kind,
    /// How it is fetched.
    pub fetch: Fetch,
    /// What that costs, known before the first byte.
    pub cost: ArtifactCost,
}

/// How one part is fetched, with what its executor needs.
pub(crate) enum Fetch {
    /// Nothing: an interrupted run of this release finished it, or the store holds it.
    Done,
    /// Chunk by chunk by its planned chunk work ([`super::chunked`]).
    Chunked(ChunkWork),
    /// Rebuilt by a patch, the chunk work taking what it does not deliver ([`super::patched`]).
    Patched(ChunkWork, Box<PatchWork>),
    /// Streamed whole from byte `resume_at` ([`super::stream`]).
    Stream { resume_at: u64 },
}

impl Fetch {
    /// Its shape, as priced and reported.
    pub fn how(&self) -> How {
        match self {
            Fetch::Done => How::Done,
            Fetch::Chunked(_) => How::Chunked,
            Fetch::Patched(_, pw) => How::Patched {
                patch: pw.number,
                fetch: pw.fetch,
            },
            Fetch::Stream { resume_at } => How::Stream {
                resume_at: *resume_at,
            },
        }
    }

    /// The chunk plan it follows, when it is chunked or patched.
    pub fn chunk_plan(&self) -> Option<&ChunkPlan> {
        match self {
            Fetch::Chunked(w) | Fetch::Patched(w, _) => Some(&w.plan),
            Fetch::Done | Fetch::Stream { .. } => None,
        }
    }
}

/// One chunked part's chunk work.
pub(crate) struct ChunkWork {
    pub index: ChunkIndex,
    pub plan: ChunkPlan,
    /// The files `plan`'s copies refer to (running slot, extra directories), in order.
    pub locals: Vec<LocalFile>,
}

/// Where part `a` (signed entry `e`) of release `version` is written for `slot`: a slot file
/// through the layout, or a payload's object in the store (`resume`: keep what an
/// interrupted attempt wrote).
pub(super) fn target(
    env: &Env,
    slot: bootconfig::Slot,
    version: &str,
    a: &Part,
    e: &FileEntry,
    resume: bool,
) -> Result<Target> {
    match a {
        Part::Slot(x) => env.layout.target(slot, version, *x, e.size, resume),
        Part::Payload(_) => crate::layout::object_target(
            &crate::payload::objects_dir(&env.cfg.state_dir),
            &e.sha256,
            e.size,
            resume,
            a.clone(),
        ),
    }
}

/// The written part `p` of `m` must pass its kind's check ([`Kind::check`]: the rootfs a
/// squashfs whose used bytes fit the signed size, an image archive a tar).
pub(super) fn check(run: &Run, m: &Manifest, p: &PartPlan) -> Result<()> {
    let Some(check) = p.kind.check else {
        return Ok(());
    };
    let (f, offset, len) = match p.kind.place {
        Place::Slot(a) => run.env.layout.open_artifact(run.slot, &m.version, a)?,
        Place::Store => {
            let path = crate::payload::object_path(&run.env.cfg.state_dir, &p.entry.sha256);
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

/// A patch chosen for one artifact.
pub(crate) struct PatchWork {
    /// The patch as the signed manifest lists it.
    pub patch: PatchRef,
    /// Its number in the part's manifest entry.
    pub number: usize,
    /// The bytes of it still to fetch (what an interrupted attempt staged is not).
    pub fetch: u64,
    /// Where it is staged.
    pub staged: PathBuf,
    /// The running slot's copy of the artifact: the patch's base.
    pub base: LocalFile,
    /// The base was proven by hashing the running slot's range (no kept manifest names the
    /// running build), not by the kept manifest.
    pub base_hashed: bool,
}
