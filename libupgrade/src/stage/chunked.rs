//! The chunked executor: one artifact written chunk by chunk from its index — chunks already
//! correct in the target (a resumed attempt) kept, chunks the running slot or an extra local
//! directory holds copied, the rest fetched with coalesced `Range` requests from the extra
//! mirrors and then the origin ([`crate::chunk::apply`]), each verified before it is written.
//! The chunk plan is made before the slot is touched ([`Stager::plan_chunked`]), so the stage's
//! preview and its run agree.

use std::io::Read;
use std::os::unix::fs::FileExt;

use super::{ChunkWork, Placing, Progress, Run, Stager};
use crate::chunk::apply::{self, ApplyOptions, ApplyProgress, ChunkTarget, RangeSource};
use crate::chunk::local::{find_local, verify_in_place, LocalFile};
use crate::chunk::ChunkIndex;
use crate::error::{Error, Result};
use crate::layout::Target;
use crate::manifest::{Artifact, Part};
use crate::net::fetch::{ExtraSource, Source};

impl Stager<'_> {
    /// Decide how artifact `a` is written from its `index`: which chunks the target already
    /// holds (a resumed attempt: re-verified in place), which a local file holds (the running
    /// slot, then each extra directory), the rest fetched. Reads only.
    pub(super) fn plan_chunked(
        &self,
        at: &Placing,
        a: &Part,
        index: ChunkIndex,
    ) -> Result<ChunkWork> {
        let size = super::entry(at.m, a).size;
        let n = index.chunks.len();
        let present = if at.resumed {
            let target = self.part_target(at.slot, at.m, a, true)?;
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
        let mut locals = self.local_copies(at, a);
        locals.extend(extra_dirs(at, a));
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

    /// Write artifact `a` chunk by chunk following its planned `work`; returns what came
    /// from where.
    pub(super) fn write_chunked(
        &self,
        run: &Run,
        a: &Part,
        work: &ChunkWork,
    ) -> Result<apply::Transfer> {
        let target = self.open_target(run, a)?;
        let t = self.apply_chunks(run, a, work, &work.plan, &target)?;
        target.finish()?;
        crate::barrier::hit("stage:artifact-complete");
        Ok(t)
    }

    /// The place artifact `a` is written to, exactly its size long (a file target's holes are
    /// filled by their chunks); what an interrupted attempt wrote is kept when `run` resumes.
    pub(super) fn open_target(&self, run: &Run, a: &Part) -> Result<Target> {
        let size = super::entry(run.m, a).size;
        let target = self.part_target(run.slot, run.m, a, run.resumed)?;
        target.truncate(size)?;
        Ok(target)
    }

    /// Where part `a` of `m` is written for `slot`: a slot file through the layout, or a
    /// payload's object in the store (`resume`: keep what an interrupted attempt wrote).
    pub(super) fn part_target(
        &self,
        slot: bootconfig::Slot,
        m: &crate::manifest::Manifest,
        a: &Part,
        resume: bool,
    ) -> Result<Target> {
        let e = super::entry(m, a);
        match a {
            Part::Slot(x) => self.layout.target(slot, &m.version, *x, e.size, resume),
            Part::Payload(_) => crate::layout::object_target(
                &crate::payload::objects_dir(&self.cfg.state_dir),
                &e.sha256,
                e.size,
                resume,
                a.clone(),
            ),
        }
    }

    /// Make `target` hold artifact `a` following `plan` over `work`'s index and local files,
    /// every chunk verified before it is written and the whole file's sha256 at the end.
    pub(super) fn apply_chunks(
        &self,
        run: &Run,
        a: &Part,
        work: &ChunkWork,
        plan: &crate::chunk::plan::Plan,
        target: &Target,
    ) -> Result<apply::Transfer> {
        let entry = super::entry(run.m, a);
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
        let mirrors = self.mirrors(run, a, plan.fetch_bytes > 0);
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
                retries: self.cfg.download_retries,
                retry_delay: run.opts.retry_delay,
                throttle: run.throttle,
                deadline: self.deadline,
                min_rate: run.opts.min_rate_rule(),
            },
            &Counted(run.progress),
        );
        run.progress.end();
        result
    }

    /// The extra mirrors that hold artifact `a` at the size the manifest says (probed when
    /// anything is to be fetched); one that does not is skipped with a warning, never an error.
    fn mirrors<'s>(&self, run: &Run<'s>, a: &Part, needed: bool) -> Vec<Remote<'s>> {
        let entry = super::entry(run.m, a);
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

    /// The running slot's copy of part `a` (the rootfs only up to its squashfs size; for a
    /// payload, the running release's objects of its kind, the one of the same name first),
    /// if it can be read; reuse is an optimisation, so a failure only logs.
    fn local_copies(&self, at: &Placing, a: &Part) -> Vec<LocalFile> {
        let a = match a {
            Part::Slot(x) => *x,
            Part::Payload(name) => return self.running_objects(at, name),
        };
        let (slot, Some(version)) = (at.running.0, at.running.1.as_deref()) else {
            return Vec::new();
        };
        let opened = self
            .layout
            .open_artifact(slot, version, a)
            .and_then(|(file, offset, len)| {
                let len = if a == Artifact::Rootfs {
                    let mut sb = [0u8; 48];
                    file.read_exact_at(&mut sb, offset).map_err(|e| {
                        Error::io("read superblock", format!("slot {slot} rootfs"), e)
                    })?;
                    if &sb[0..4] != b"hsqs" {
                        return Err(Error::Layout(format!(
                            "slot {slot} rootfs holds no squashfs"
                        )));
                    }
                    // mksquashfs pads the image to 4 KiB.
                    let used = u64::from_le_bytes(sb[40..48].try_into().expect("8 bytes"));
                    used.div_ceil(4096).saturating_mul(4096).min(len)
                } else {
                    len
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
}

impl Stager<'_> {
    /// The objects the running release keeps in the store that may hold chunks of payload
    /// `name` of the new release: its payload of that name first, then the others of the
    /// same kind (an image moved from one archive to another is found by content).
    pub(super) fn running_objects(&self, at: &Placing, name: &str) -> Vec<LocalFile> {
        let (Some(kept), Some(new)) = (at.kept.as_ref(), at.m.payload(name)) else {
            return Vec::new();
        };
        let mut theirs: Vec<_> = crate::payload::kinds::stored_payloads(kept)
            .filter(|p| p.kind == new.kind)
            .collect();
        theirs.sort_by_key(|p| p.name != name);
        let mut out = Vec::new();
        for p in theirs {
            let path = crate::payload::object_path(&self.cfg.state_dir, &p.file.sha256);
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

/// Part `a` in each extra local directory that holds a file of its name (`<dir>/<path>`
/// as the manifest names it): any release's copy helps, its chunks are found by content.
fn extra_dirs(at: &Placing, a: &Part) -> Vec<LocalFile> {
    let name = &super::entry(at.m, a).path;
    let mut out = Vec::new();
    for x in at.extra {
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
