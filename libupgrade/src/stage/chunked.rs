//! The chunked executor: one part written chunk by chunk from its index — chunks already
//! correct in the target (a resumed attempt) kept, chunks the running slot or an extra local
//! directory holds copied, the rest fetched with coalesced `Range` requests from the extra
//! mirrors and then the origin ([`crate::chunk::apply`]), each verified before it is written.
//! The chunk plan is made before the slot is touched ([`plan`]), so the stage's preview and
//! its run agree.

use std::io::Read;
use std::os::unix::fs::FileExt;

use super::parts::{self, ChunkWork, PartPlan};
use super::run::{Placing, Run};
use super::Progress;
use crate::chunk::apply::{self, ApplyOptions, ApplyProgress, ChunkTarget, RangeSource};
use crate::chunk::local::{find_local, verify_in_place, LocalFile};
use crate::chunk::ChunkIndex;
use crate::error::{Error, Result};
use crate::layout::Target;
use crate::manifest::{FileEntry, Part};
use crate::net::fetch::{ExtraSource, Source};
use crate::payload::kinds::{NotContent, PartRef};

/// Decide how part `p` is written from its `index`: which chunks the target already holds
/// (a resumed attempt: re-verified in place), which a local file holds (the running slot,
/// then each extra directory), the rest fetched. Reads only.
pub(super) fn plan(at: &Placing, p: &PartRef, index: ChunkIndex) -> Result<ChunkWork> {
    let (a, size) = (&p.part, p.entry.size);
    let n = index.chunks.len();
    let present = if at.resumed {
        let target = parts::target(&at.env, at.slot, &at.m.version, a, p.entry, true)?;
        let avail = if target.is_file() {
            target.existing_len()?.min(size)
        } else {
            size
        };
        let r = target.reader(avail)?;
        verify_in_place(&index, r, avail)
            .map_err(|e| Error::io("re-verify chunks to resume", target.display(), e))?
    } else {
        vec![false; n]
    };
    let wanted: Vec<bool> = present.iter().map(|p| !p).collect();
    let mut locals = local_copies(at, p);
    locals.extend(extra_dirs(at, a, p.entry));
    let found = if locals.is_empty() || !wanted.iter().any(|w| *w) {
        vec![None; n]
    } else {
        find_local(&index, &wanted, &locals).unwrap_or_else(|e| {
            log::warn!(
                "{a}: reading local copies for reusable chunks failed ({e}); fetching instead"
            );
            vec![None; n]
        })
    };
    let plan = crate::chunk::plan::plan(&index, &present, &found);
    Ok(ChunkWork {
        index,
        plan,
        locals,
    })
}

/// Write part `p` chunk by chunk following its planned `work`; returns what came from where.
pub(super) fn write(run: &Run, p: &PartPlan, work: &ChunkWork) -> Result<apply::Transfer> {
    let target = open_target(run, p)?;
    let t = apply_plan(run, p, work, &work.plan, &target)?;
    target.finish()?;
    crate::barrier::hit("stage:artifact-complete");
    Ok(t)
}

/// The place part `p` is written to, exactly its size long (a file target's holes are
/// filled by their chunks); what an interrupted attempt wrote is kept when `run` resumes.
pub(super) fn open_target(run: &Run, p: &PartPlan) -> Result<Target> {
    let target = parts::target(
        &run.env,
        run.slot,
        &run.m.version,
        &p.part,
        &p.entry,
        run.resumed,
    )?;
    target.truncate(p.entry.size)?;
    Ok(target)
}

/// Make `target` hold part `p` following `plan` over `work`'s index and local files, every
/// chunk verified before it is written and the whole file's sha256 at the end.
pub(super) fn apply_plan(
    run: &Run,
    p: &PartPlan,
    work: &ChunkWork,
    plan: &crate::chunk::plan::Plan,
    target: &Target,
) -> Result<apply::Transfer> {
    let (a, entry) = (&p.part, &p.entry);
    let size = entry.size;
    let index = &work.index;
    let loc = run.source.location(&entry.path);
    log::info!(
        "{a} ({loc}): {} chunks; {} kept from an earlier attempt, {} copied locally, {} to fetch in {} request(s){}",
        index.chunks.len(),
        crate::units::Size(plan.keep_bytes),
        crate::units::Size(plan.copy_bytes),
        crate::units::Size(plan.fetch_bytes),
        plan.ranges.len(),
        if plan.stream { " (reuse too low to be worth splitting: one stream)" } else { "" }
    );
    run.progress
        .begin(&format!("{a} ({})", entry.path), size, 0);
    let mirrors = mirrors(run, a, entry, plan.fetch_bytes > 0);
    let origin = Remote {
        source: run.source,
        name: &entry.path,
    };
    let mut remotes: Vec<&dyn RangeSource> =
        mirrors.iter().map(|m| m as &dyn RangeSource).collect();
    remotes.push(&origin);
    let result = apply::apply(
        index,
        plan,
        target,
        &remotes,
        &work.locals,
        &ApplyOptions {
            artifact: a.clone(),
            sha256: entry.sha256.clone(),
            retries: run.env.cfg.download_retries,
            retry_delay: run.opts.retry_delay,
            throttle: run.throttle,
            deadline: run.env.deadline,
            min_rate: run.opts.min_rate_rule(),
        },
        &Counted(run.progress),
    );
    run.progress.end();
    result
}

/// The extra mirrors that hold part `a` (`entry`) at the size the manifest says (probed
/// when anything is to be fetched); one that does not is skipped with a warning, never an
/// error.
fn mirrors<'s>(run: &Run<'s>, a: &Part, entry: &'s FileEntry, needed: bool) -> Vec<Remote<'s>> {
    let mut out = Vec::new();
    for x in run.opts.extra_sources.iter().filter(|_| needed) {
        let ExtraSource::Mirror(source) = x else {
            continue;
        };
        match source.probe(&entry.path) {
            Ok(p) if p.size == entry.size && p.ranges => out.push(Remote {
                source,
                name: &entry.path,
            }),
            Ok(p) => log::warn!(
                "{}: {} bytes{}, the signed manifest says {}; not used for the {a}",
                source.location(&entry.path),
                p.size,
                if p.ranges {
                    ""
                } else {
                    " and no Range support"
                },
                entry.size
            ),
            Err(e) => log::warn!("extra source: {e}; not used for the {a}"),
        }
    }
    out
}

/// The running slot's copy of part `p` (only its content, as its kind reads it: the rootfs
/// up to its squashfs size; for a payload, the running release's objects of its kind, the
/// one of the same name first), if it can be read; reuse is an optimisation, so a failure
/// only logs.
fn local_copies(at: &Placing, p: &PartRef) -> Vec<LocalFile> {
    let a = match &p.part {
        Part::Slot(x) => *x,
        Part::Payload(name) => return running_objects(at, name),
    };
    let (slot, Some(version)) = (at.running.0, at.running.1.as_deref()) else {
        return Vec::new();
    };
    let opened = at
        .env
        .layout
        .open_artifact(slot, version, a)
        .and_then(|(file, offset, len)| {
            let len = match p.kind.content_len {
                Some(content_len) => {
                    let read = |pos: u64, buf: &mut [u8]| file.read_exact_at(buf, offset + pos);
                    content_len(&read, len).map_err(|e| match e {
                        NotContent::Read(op, e) => Error::io(op, format!("slot {slot} {a}"), e),
                        NotContent::Not(what) => Error::Layout(format!("slot {slot} {a} {what}")),
                    })?
                }
                None => len,
            };
            Ok(LocalFile {
                file,
                offset,
                len,
                name: format!("slot {slot} {a}"),
            })
        });
    match opened {
        Ok(f) => vec![f],
        Err(e) => {
            log::warn!("{a}: cannot read the running slot's copy ({e}); fetching every chunk");
            Vec::new()
        }
    }
}

/// The objects the running release keeps in the store that may hold chunks of payload
/// `name` of the new release: its payload of that name first, then the others of the same
/// kind (an image moved from one archive to another is found by content).
fn running_objects(at: &Placing, name: &str) -> Vec<LocalFile> {
    let (Some(kept), Some(new)) = (at.kept.as_ref(), at.m.payload(name)) else {
        return Vec::new();
    };
    let mut theirs: Vec<_> = crate::payload::kinds::stored_payloads(kept)
        .filter(|p| p.kind == new.kind)
        .collect();
    theirs.sort_by_key(|p| p.name != name);
    let mut out = Vec::new();
    for p in theirs {
        let path = crate::payload::object_path(&at.env.cfg.state_dir, &p.file.sha256);
        if out
            .iter()
            .any(|l: &LocalFile| l.name == path.display().to_string())
        {
            continue;
        }
        match LocalFile::open(&path) {
            Ok(f) if f.len == p.file.size => out.push(f),
            Ok(f) => log::warn!(
                "{}: {} bytes, the running release's manifest says {}; not reused",
                path.display(),
                f.len,
                p.file.size
            ),
            Err(e) => log::warn!("{}: {e}; not reused", path.display()),
        }
    }
    out
}

impl ChunkTarget for Target {
    fn write_at(&self, pos: u64, buf: &[u8]) -> Result<()> {
        Target::write_at(self, pos, buf)
    }
    fn read_at(&self, pos: u64, buf: &mut [u8]) -> Result<()> {
        Target::read_at(self, pos, buf)
    }
    fn sync(&self) -> Result<()> {
        Target::sync(self)
    }
}

/// Part `a` (`e`) in each extra local directory that holds a file of its name
/// (`<dir>/<path>` as the manifest names it): any release's copy helps, its chunks are found
/// by content.
fn extra_dirs(at: &Placing, a: &Part, e: &FileEntry) -> Vec<LocalFile> {
    let name = &e.path;
    let mut out = Vec::new();
    for x in &at.opts.extra_sources {
        let ExtraSource::Dir(dir) = x else { continue };
        let p = dir.join(name);
        match LocalFile::open(&p) {
            Ok(f) => out.push(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                log::debug!("{}: not there; not used for the {a}", p.display())
            }
            Err(e) => log::warn!("{}: {e}; not used for the {a}", p.display()),
        }
    }
    out
}

/// One artifact of the release's source, read by range.
struct Remote<'a> {
    source: &'a Source,
    name: &'a str,
}

impl RangeSource for Remote<'_> {
    fn open_range(&self, start: u64, stop: u64) -> Result<Box<dyn Read + Send>> {
        self.source.open_range(self.name, start, stop)
    }
    fn location(&self) -> String {
        self.source.location(self.name)
    }
}

/// Chunk progress onto the caller's [`Progress`].
struct Counted<'a>(&'a dyn Progress);

impl ApplyProgress for Counted<'_> {
    fn fetched(&self, bytes: u64) {
        self.0.advance(bytes);
        self.0.fetched(bytes);
    }
    fn reused(&self, bytes: u64) {
        self.0.advance(bytes);
        self.0.reused(bytes);
    }
}
