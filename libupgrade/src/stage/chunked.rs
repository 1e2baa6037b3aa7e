//! The chunked executor: one artifact written chunk by chunk from its index — chunks already
//! correct in the target (a resumed attempt) kept, chunks the running slot holds copied, the
//! rest fetched with coalesced `Range` requests ([`crate::chunk::apply`]), each verified
//! before it is written.

use std::io::Read;
use std::os::unix::fs::FileExt;

use super::{Progress, Run, Stager};
use crate::chunk::apply::{self, ApplyOptions, ApplyProgress, ChunkTarget, RangeSource};
use crate::chunk::local::{find_local, verify_in_place, LocalFile};
use crate::chunk::ChunkIndex;
use crate::error::{Error, Result};
use crate::fetch::Source;
use crate::layout::Target;
use crate::manifest::Artifact;

impl Stager<'_> {
    /// Write artifact `a` chunk by chunk (see the module docs); returns what came from where.
    pub(super) fn write_chunked(
        &self,
        run: &Run,
        a: Artifact,
        index: &ChunkIndex,
    ) -> Result<apply::Transfer> {
        let entry = run.m.files.get(a);
        let size = entry.size;
        let n = index.chunks.len();
        let target = self
            .layout
            .target(run.slot, &run.m.version, a, size, run.resumed)?;
        let present = if run.resumed {
            let avail = if target.is_file() {
                target.existing_len()?.min(size)
            } else {
                size
            };
            let r = target.reader(avail)?;
            verify_in_place(index, r, avail)
                .map_err(|e| Error::io("re-verify chunks to resume", target.display(), e))?
        } else {
            vec![false; n]
        };
        // A file target ends up exactly `size` long (holes are filled by their chunks).
        target.truncate(size)?;
        let wanted: Vec<bool> = present.iter().map(|p| !p).collect();
        let locals = self.local_copies(run, a);
        let found = if locals.is_empty() || !wanted.iter().any(|w| *w) {
            vec![None; n]
        } else {
            find_local(index, &wanted, &locals).unwrap_or_else(|e| {
                log::warn!("{a}: reading the running slot for reusable chunks failed ({e}); fetching instead");
                vec![None; n]
            })
        };
        let plan = crate::chunk::plan::plan(index, &present, &found);
        let loc = run.source.location(&entry.path);
        log::info!(
            "{a} ({loc}): {n} chunks; {} kept from an earlier attempt, {} copied from slot {}, {} to fetch in {} request(s){}",
            crate::error::Size(plan.keep_bytes),
            crate::error::Size(plan.copy_bytes),
            run.running.0,
            crate::error::Size(plan.fetch_bytes),
            plan.ranges.len(),
            if plan.stream { " (reuse too low to be worth splitting: one stream)" } else { "" }
        );
        run.progress
            .begin(&format!("{a} ({})", entry.path), size, 0);
        let remote = Remote {
            source: run.source,
            name: &entry.path,
        };
        let result = apply::apply(
            index,
            &plan,
            &target,
            &remote,
            &locals,
            &ApplyOptions {
                artifact: a,
                sha256: entry.sha256.clone(),
                retries: self.cfg.download_retries,
                retry_delay: run.opts.retry_delay,
                limit: run.limit,
                deadline: self.deadline,
                min_rate: run.opts.min_rate_rule(),
            },
            &Counted(run.progress),
        );
        run.progress.end();
        let t = result?;
        target.finish()?;
        crate::barrier::hit("stage:artifact-complete");
        Ok(t)
    }

    /// The running slot's copy of artifact `a` (the rootfs only up to its squashfs size), if it
    /// can be read; reuse is an optimisation, so a failure only logs.
    fn local_copies(&self, run: &Run, a: Artifact) -> Vec<LocalFile> {
        let (slot, Some(version)) = (run.running.0, run.running.1.as_deref()) else {
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
