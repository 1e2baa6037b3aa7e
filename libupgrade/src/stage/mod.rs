//! The stage pipeline: fetch, verify and write a signed release into the inactive slot.
//!
//! Ordering (each durable step ends in a write barrier, see [`crate::barrier`]): everything
//! about the release (signature, manifest, architecture, downgrade, space) is checked before a
//! byte is written; the target slot is then marked bad in the bootloader, invalid in the state
//! file, and only then written; it is recorded as staged after every byte was hashed, synced and
//! the squashfs checked. A cut anywhere leaves it invalid (never booted) or staged-and-complete.
//! Downloads checkpoint their progress ([`crate::net::checkpoint`]) so a later run resumes.
//!
//! Before the slot is touched, every artifact is probed on the server (exists, has the size
//! the manifest says: a 404 fails in seconds and writes nothing) and each chunk index the
//! manifest names is fetched and checked against its signed sha256 and the artifact's size.
//! An artifact with an index is then written chunk by chunk ([`crate::chunk`]): chunks already
//! correct in the target (a resumed attempt) are kept, chunks the running slot holds are copied,
//! the rest fetched with coalesced `Range` requests, each chunk verified before it is written.
//! Because every byte in the target is re-verified by digest on resume, no checkpoint of a
//! position is needed: a killed or power-cut run loses at most the chunks in flight. An
//! artifact without an index (older releases, servers without `Range`) is streamed whole,
//! resuming from the checkpointed position as before. A chunked artifact whose signed
//! manifest lists a patch from exactly what the running slot holds is rebuilt from it when
//! that fetches fewer bytes (`patched`): its output is checked chunk by chunk against the
//! index, and the chunk plan takes whatever it does not deliver.
//!
//! The pipeline works over a release's parts ([`crate::payload::kinds::parts`], `parts`):
//! the three slot files, written into the target slot through the layout, then its payloads,
//! written into the payload store ([`crate::payload`]): a payload the store already holds is
//! done before the first byte (it costs nothing), a changed one is chunked or patched from
//! the running release's objects exactly like a slot file, and each written part passes its
//! kind's check ([`crate::payload::kinds`]). The store's budget and room are checked with the
//! slot's space, before anything is written.
//!
//! [`Updater::stage`](crate::Updater::stage) finds the booted slot and loads the state, then
//! runs a `Stager` borrowing the updater's parts. One way through it: `verify` (the
//! release, then the server) → `plan` (pure: what to write, how; with each chunked
//! artifact's chunk plan and patch, what it costs) → the executors (`chunked`, `patched`,
//! `stream`) → commit.
//! Retries everywhere follow [`crate::net::retry`].
//!
//! The cost is known before the first byte: [`Updater::preview`](crate::Updater::preview)
//! runs everything up to the plan (reads only: the server's metadata, the running slot, what an
//! interrupted attempt left) and returns a [`StagePreview`]; a stage moves exactly the bytes
//! its preview names. Chunks come from the target itself (an earlier attempt), the running
//! slot, the extra local directories, then the extra mirrors, then the origin
//! ([`ExtraSource`]); every one is checked against the signed chunk index. A byte budget
//! ([`StageOptions::max_bytes`]) stops an attempt cleanly ([`Error::Stopped`]) with
//! everything written kept for the next one.
//!
//! When a stage may fetch is a [`Schedule`] ([`StageOptions::schedule`]: absolute UTC windows,
//! each with its rate) followed on an injectable clock ([`StageOptions::clock`]) by the one
//! limiter every network read goes through ([`crate::net::rate`] says how a boundary is
//! kept to the byte): before its first request the stage waits for a window to open; between
//! windows it waits; after the last one it stops like a spent budget ([`Error::Stopped`]),
//! resumable. A stage started after the last window still reads the release's metadata
//! (a few KiB: manifest, signature, probes, chunk indexes) so its stop can say what is left.

use bootconfig::{Bootloader, Slot};
use sha2::{Digest, Sha256};

use crate::chunk::local::LocalFile;
use crate::chunk::plan::Plan as ChunkPlan;
use crate::chunk::ChunkIndex;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::manifest::{Artifact, Manifest, Part};
use crate::net::checkpoint::Partial;
pub use crate::net::fetch::ExtraSource;
use crate::net::fetch::Source;
pub use crate::net::rate::MinRate;
use crate::net::rate::{Budget, RateLimit, Throttle};
pub use crate::net::rate::{Clock, SystemClock};
pub use crate::net::schedule::Schedule;
use crate::state::store::StateStore;
use crate::state::TransferStats;
use crate::state::{Event, State};

mod api;
mod chunked;
mod parts;
mod patched;
mod plan;
mod stream;
mod verify;
mod verity;
mod weigh;

pub use api::{
    NoProgress, Origin, PatchOutcome, Progress, Release, StageOptions, StagePreview, StageReport,
    DEFAULT_RETRY_FOR,
};
pub(crate) use parts::entry;
use patched::PatchWork;
pub use plan::ArtifactCost;
use plan::{How, WritePlan};
use verify::{Preflight, Verified};
pub use weigh::Prefer;

/// Copy buffer: large enough for full-speed sequential I/O, small enough for the RSS budget.
const BUF: usize = 1 << 20;

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// One run of the stage pipeline over the updater's parts.
pub(crate) struct Stager<'a> {
    pub cfg: &'a Config,
    pub layout: &'a dyn Layout,
    pub boot: &'a dyn Bootloader,
    pub store: &'a StateStore,
    /// When this stage attempt stops retrying (`StageOptions::retry_for` from its start).
    pub deadline: Option<std::time::Instant>,
}

impl Stager<'_> {
    /// Fetch, verify and write the release `rel` into the slot that is not `booted`;
    /// `st` is the state as loaded for this boot. Verify, plan, execute, commit: everything
    /// about the release is checked before a byte is written (`verify`), the writes are
    /// decided once (`prepare`) and carried out per artifact by its executor.
    pub fn stage(
        &self,
        booted: Slot,
        mut st: State,
        rel: &Release,
        opts: &StageOptions,
        progress: &dyn Progress,
    ) -> Result<StageReport> {
        let source = &rel.source;
        let target = booted.other();
        let limit = (opts.max_rate.is_some() || opts.schedule.is_some())
            .then(|| RateLimit::with(opts.max_rate, opts.schedule.clone(), opts.clock.clone()));
        if let Some(l) = &limit {
            // Nothing is fetched before a window opens (after the last one: see the docs).
            l.grant(0).ok();
        }
        let w = match self.prepare(booted, &st, rel, opts)? {
            Prepared::Already(v) => {
                return Ok(report(target, *v, true, false, 0, Moved::default()))
            }
            Prepared::Work(w) => w,
        };
        let mut partial = match w.checkpoint.clone().filter(|_| w.plan.resume) {
            Some(p) => p,
            None => self.invalidate(target, &mut st, &w.v)?,
        };
        // Always counted: a stop says what this attempt fetched.
        let budget = Budget::new(opts.max_bytes.unwrap_or(u64::MAX));
        let run = Run {
            source,
            m: &w.v.manifest,
            slot: target,
            resumed: w.plan.resume,
            opts,
            progress,
            throttle: Throttle {
                rate: limit.as_ref(),
                budget: Some(&budget),
            },
            moved: Default::default(),
            patched: Default::default(),
        };
        let written = match self.execute(&run, &w, &mut partial) {
            Ok(n) => n,
            Err(e) => {
                let e = w.left_after(e, &budget);
                return Err(self.record_failure(target, &mut st, &w.v.manifest, e)?);
            }
        };
        let moved = run.moved.get();
        let patched = run.patched.take();
        self.commit(target, &mut st, &w, &partial, &patched)?;
        let mut r = report(target, w.v, false, w.plan.resume, written, moved);
        r.patched = patched;
        Ok(r)
    }

    /// What [`Stager::stage`] would do and cost, without writing anything.
    pub fn preview(
        &self,
        booted: Slot,
        st: &State,
        rel: &Release,
        opts: &StageOptions,
    ) -> Result<StagePreview> {
        let target = booted.other();
        Ok(match self.prepare(booted, st, rel, opts)? {
            Prepared::Already(v) => StagePreview {
                slot: target,
                version: v.manifest.version,
                generation: v.manifest.generation,
                already_staged: true,
                resume: false,
                artifacts: Vec::new(),
            },
            Prepared::Work(w) => StagePreview {
                slot: target,
                version: w.v.manifest.version.clone(),
                generation: w.v.manifest.generation,
                already_staged: false,
                resume: w.plan.resume,
                artifacts: w.cost.clone(),
            },
        })
    }

    /// Everything before the first write: verify the release, preflight the server, plan the
    /// writes and each chunked artifact's chunks, and price the plan. Reads only.
    fn prepare(
        &self,
        booted: Slot,
        st: &State,
        rel: &Release,
        opts: &StageOptions,
    ) -> Result<Prepared> {
        let target = booted.other();
        let source = &rel.source;
        let v = self.verify(booted, st, rel, opts)?;
        if plan::staged_already(st.slot(target), &v.sha256) {
            return Ok(Prepared::Already(Box::new(v)));
        }
        let mut pre = self.preflight(source, &v.manifest, opts)?;
        let checkpoint = Partial::load(&self.cfg.state_dir);
        let parts = crate::payload::kinds::parts(&v.manifest);
        let facts = self.facts(&parts, &pre);
        let mut plan = plan::plan_writes(
            target,
            st.slot(target).state,
            &v.sha256,
            checkpoint.as_ref(),
            &facts,
        );
        let at = Placing {
            m: &v.manifest,
            slot: target,
            running: (booted, st.slot(booted).version.clone()),
            running_sha256: st.slot(booted).manifest_sha256.clone(),
            kept: crate::slotfiles::manifest(&self.cfg.state_dir, booted).unwrap_or_else(|e| {
                log::warn!("slot {booted}: {e}; its payloads are not reused");
                None
            }),
            resumed: plan.resume,
            extra: &opts.extra_sources,
            link: link_rate(opts, pre.measured),
        };
        let (chunks, patches, mut choices) =
            self.plan_parts(&at, source, &mut plan, &mut pre, opts)?;
        let sizes: Vec<u64> = parts.iter().map(|p| p.entry.size).collect();
        let plans: Vec<_> = chunks.iter().map(|c| c.as_ref().map(|c| &c.plan)).collect();
        let mut cost = plan::cost(&plan, &sizes, &plans);
        for (k, c) in cost.iter_mut().enumerate() {
            c.patch_from = patches[k].as_ref().map(|p| p.patch.base.version.clone());
            c.choice = choices[k].take();
        }
        Ok(Prepared::Work(Box::new(Work {
            v,
            pre,
            checkpoint,
            plan,
            chunks,
            patches,
            cost,
        })))
    }

    /// Before the first write of a new attempt: the loader never boots the slot, the state
    /// says invalid, the slot's kept release files are gone, and a fresh checkpoint exists.
    fn invalidate(&self, target: Slot, st: &mut State, v: &Verified) -> Result<Partial> {
        self.boot.mark_bad(target)?;
        crate::barrier::hit("stage:bootloader-marked-bad");
        crate::slotfiles::clear(&self.cfg.state_dir, target)?;
        patched::clear_staging(&self.cfg.state_dir)?;
        let rec = st.slot_mut(target);
        rec.version = Some(v.manifest.version.clone());
        rec.generation = Some(v.manifest.generation);
        rec.manifest_sha256 = Some(v.sha256.clone());
        rec.staged_from = Some(v.location.clone()).filter(|l| l.starts_with("http"));
        st.transition(
            target,
            Event::StageStarted,
            format!(
                "writing {} (generation {}) from {}, signed by {}",
                v.manifest.version, v.manifest.generation, v.location, v.key
            ),
        )?;
        self.store.save(st, "stage:slot-invalid")?;
        let p = Partial {
            slot: target,
            manifest_sha256: v.sha256.clone(),
            done: Vec::new(),
            current: None,
            fetched: 0,
            reused: 0,
            objects: crate::payload::objects_of(&v.manifest)
                .into_iter()
                .collect(),
        };
        p.save(&self.cfg.state_dir)?;
        // The target's earlier release no longer references its payloads: make room. When
        // the references cannot be read (a damaged kept manifest) nothing is removed: the
        // stage goes on, and a store that is too full fails its writes by name.
        if let Err(e) = crate::payload::prune(&self.cfg.state_dir) {
            log::warn!("payload store: not pruned ({e})");
        }
        Ok(p)
    }

    /// Carry out the plan: each artifact by its executor, the checkpoint saved after each
    /// one, then the squashfs check. Returns the bytes written.
    /// After `a` failed with `e` (not a stop, which keeps everything for the next attempt):
    /// remove what was written of it where it takes room others need (a partial kernel or
    /// initrd on the boot filesystem), and its place in the checkpoint. Returns `e`.
    /// A payload's partial object stays like a partition's bytes (the state partition holds
    /// no loader files; the next prune removes it if no stage continues it).
    fn discard(&self, run: &Run, a: &Part, partial: &mut Partial, e: Error) -> Result<Error> {
        let Some(artifact) = a.artifact().filter(|x| *x != Artifact::Rootfs) else {
            return Ok(e);
        };
        if matches!(e, Error::Stopped { .. }) {
            return Ok(e);
        }
        self.layout.discard(run.slot, &run.m.version, artifact)?;
        if partial.current.as_ref().is_some_and(|(c, _)| c == a) {
            partial.current = None;
            partial.save(&self.cfg.state_dir)?;
        }
        Ok(e)
    }

    fn execute(&self, run: &Run, w: &Work, partial: &mut Partial) -> Result<u64> {
        let mut written = 0;
        for (k, (a, how)) in w.plan.steps.iter().enumerate() {
            let a = &a.clone();
            let how = *how;
            let size = entry(run.m, a).size;
            // The update's totals count what an interrupted attempt fetched (kept now) as
            // fetched; this run's report counts only its own network bytes.
            let mut moved = run.moved.get();
            match how {
                How::Done => {
                    moved.reused += size;
                    run.moved.set(moved);
                    if !partial.done.contains(a) {
                        // A payload the store already held: reused by this update.
                        partial.reused = partial.reused.saturating_add(size);
                        partial.done.push(a.clone());
                    }
                    continue;
                }
                How::Chunked | How::Patched { .. } => {
                    let work = w.chunks[k]
                        .as_ref()
                        .expect("planned chunked: has a chunk plan");
                    let t = match &w.patches[k] {
                        Some(pw) => self.write_patched(run, a, work, pw),
                        None => self.write_chunked(run, a, work),
                    }
                    .or_else(|e| Err(self.discard(run, a, partial, e)?))?;
                    written += t.fetched + t.copied;
                    // Saturating: the totals come from a checkpoint file that may be damaged.
                    partial.fetched = partial.fetched.saturating_add(t.fetched + t.kept);
                    partial.reused = partial.reused.saturating_add(t.copied);
                    moved.fetched += t.fetched;
                    moved.reused += t.copied + t.kept;
                    moved.from_mirrors += t.from_mirrors;
                    moved.refused += t.refused;
                }
                How::Stream { resume_at } => {
                    let n = self
                        .write_stream(run, a, resume_at, partial)
                        .or_else(|e| Err(self.discard(run, a, partial, e)?))?;
                    written += n;
                    partial.fetched = partial.fetched.saturating_add(size);
                    moved.fetched += n;
                    moved.reused += size - n;
                }
            }
            run.moved.set(moved);
            partial.done.push(a.clone());
            partial.current = None;
            partial.save(&self.cfg.state_dir)?;
        }
        for p in crate::payload::kinds::parts(run.m) {
            self.check_part(run, &p)?;
        }
        self.check_verity(run.slot, run.m)?;
        Ok(written)
    }

    /// Record a failed attempt in the state's history; a bad checksum or size means the bytes
    /// held are wrong, so the next attempt starts over. Returns `e` to fail with.
    fn record_failure(
        &self,
        target: Slot,
        st: &mut State,
        m: &Manifest,
        e: Error,
    ) -> Result<Error> {
        if matches!(
            e,
            Error::Checksum { .. } | Error::Size { .. } | Error::BadImage { .. }
        ) {
            Partial::clear(&self.cfg.state_dir)?;
        }
        if matches!(e, Error::Stopped { .. }) {
            // Not a failure: the attempt stopped where it was told to.
            return Ok(e);
        }
        st.log(
            target,
            Event::StageFailed,
            Some(m.version.clone()),
            Some(m.generation),
            e.to_string(),
        );
        self.store.save(st, "stage:failed-recorded")?;
        Ok(e)
    }

    /// Every byte is written and verified: make the slot's content current in the layout,
    /// keep its release files, record it staged, drop the checkpoint.
    fn commit(
        &self,
        target: Slot,
        st: &mut State,
        w: &Work,
        partial: &Partial,
        patched: &[PatchOutcome],
    ) -> Result<()> {
        let (v, pre, resumed) = (&w.v, &w.pre, w.plan.resume);
        let m = &v.manifest;
        self.layout.commit(target, &m.version)?;
        let total: u64 = crate::payload::kinds::parts(m)
            .iter()
            .map(|p| p.entry.size)
            .sum();
        let stats = TransferStats {
            fetched: partial.fetched,
            reused: partial.reused,
            total,
        };
        crate::slotfiles::save(&self.cfg.state_dir, target, &v.bytes, &pre.scripts)?;
        st.slot_mut(target).transfer = Some(stats);
        st.transition(
            target,
            Event::Staged,
            format!(
                "{} (generation {}) written and verified{}; {} fetched, {} reused of {}{}",
                m.version,
                m.generation,
                if resumed { ", resumed" } else { "" },
                crate::units::Size(stats.fetched),
                crate::units::Size(stats.reused),
                crate::units::Size(total),
                patched.iter().map(|p| format!("; {p}")).collect::<String>(),
            ),
        )?;
        self.store.save(st, "stage:slot-staged")?;
        patched::clear_staging(&self.cfg.state_dir)?;
        Partial::clear(&self.cfg.state_dir)
    }
}

/// The report of a stage run into `slot` of release `v`.
fn report(
    slot: Slot,
    v: Verified,
    already_staged: bool,
    resumed: bool,
    bytes_written: u64,
    moved: Moved,
) -> StageReport {
    StageReport {
        slot,
        version: v.manifest.version,
        generation: v.manifest.generation,
        signed_by: v.key,
        already_staged,
        resumed,
        bytes_written,
        bytes_fetched: moved.fetched,
        bytes_reused: moved.reused,
        bytes_from_mirrors: moved.from_mirrors,
        chunks_refused: moved.refused,
        patched: Vec::new(),
    }
}

/// Bytes a run moved, by where they came from.
#[derive(Debug, Clone, Copy, Default)]
struct Moved {
    fetched: u64,
    reused: u64,
    from_mirrors: u64,
    refused: u64,
}

/// What [`Stager::prepare`] found: nothing to do, or the work.
enum Prepared {
    Already(Box<Verified>),
    Work(Box<Work>),
}

/// A stage run decided before its first write.
struct Work {
    v: Verified,
    pre: Preflight,
    checkpoint: Option<Partial>,
    plan: WritePlan,
    /// Per chunked part: its index, chunk plan and the local files the plan copies from.
    chunks: Vec<Option<ChunkWork>>,
    /// Per patched part: the patch and its base (its chunk work is the fallback).
    patches: Vec<Option<PatchWork>>,
    cost: Vec<ArtifactCost>,
}

impl Work {
    /// A stop names what is left: the plan's bytes less what this attempt fetched.
    fn left_after(&self, e: Error, b: &Budget) -> Error {
        match e {
            Error::Stopped { why, .. } => Error::Stopped {
                why,
                fetched: b.used(),
                left: self
                    .cost
                    .iter()
                    .map(|c| c.fetch)
                    .sum::<u64>()
                    .saturating_sub(b.used()),
            },
            e => e,
        }
    }
}

/// One chunked artifact's part of the plan.
pub(crate) struct ChunkWork {
    index: ChunkIndex,
    plan: ChunkPlan,
    /// The files `plan`'s copies refer to (running slot, extra directories), in order.
    locals: Vec<LocalFile>,
}

/// Where a release is being placed, for planning its chunks.
struct Placing<'a> {
    m: &'a Manifest,
    slot: Slot,
    /// The running slot and its version (where reusable chunks are looked for).
    running: (Slot, Option<String>),
    /// The sha256 of the running release's manifest (which build runs), when known.
    running_sha256: Option<String>,
    /// The running slot's kept manifest, when there is one: its payloads are in the store.
    kept: Option<Manifest>,
    /// An interrupted attempt is continued: what the target holds is re-verified.
    resumed: bool,
    extra: &'a [ExtraSource],
    /// The link rate a patch's apply time is weighed against ([`weigh`]), if known.
    link: Option<weigh::LinkRate>,
}

/// The link rate the planner weighs with: the one told (`max_rate`, the slowest rate a stage
/// window names), else the one `measured` on the stage's metadata (see [`weigh`]).
fn link_rate(opts: &StageOptions, measured: Option<u64>) -> Option<weigh::LinkRate> {
    let windows = opts
        .schedule
        .iter()
        .flat_map(|s| s.windows().iter().filter_map(|w| w.rate));
    match opts.max_rate.into_iter().chain(windows).min() {
        Some(told) => Some(weigh::LinkRate {
            bytes_per_sec: told,
            told: true,
        }),
        None => measured.map(|m| weigh::LinkRate {
            bytes_per_sec: m,
            told: false,
        }),
    }
}

/// What one stage run works with (shared by the per-artifact writers).
struct Run<'a> {
    source: &'a Source,
    m: &'a Manifest,
    slot: Slot,
    /// A checkpoint of this release into this slot existed: re-verify what the target holds.
    resumed: bool,
    opts: &'a StageOptions,
    progress: &'a dyn Progress,
    throttle: Throttle<'a>,
    /// Bytes moved by this run so far.
    moved: std::cell::Cell<Moved>,
    /// The artifacts rebuilt by a patch so far.
    patched: std::cell::RefCell<Vec<PatchOutcome>>,
}
