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
//! written into the payload store ([`crate::payload`]): a payload the store already holds,
//! its bytes proven ([`crate::payload::prove`]: the proof the stage wrote after a verified
//! write, or a hash), is done before the first byte (it costs nothing; one that is not its
//! name is moved to the quarantine and fetched again), a changed one is chunked or patched from
//! the running release's objects exactly like a slot file, and each written part passes its
//! kind's check ([`crate::payload::kinds`]). The store's budget and room are checked with the
//! slot's space, before anything is written.
//!
//! [`Updater::stage`](crate::Updater::stage) finds the booted slot and loads the state, then
//! runs a `Stager` borrowing the updater's parts. It is the conductor, and this file reads
//! top-down as its one way through: `verify` (the release, then the server: one probe per
//! part) → one `PartPlan` per part (`parts`: which part, where it goes, how it is fetched —
//! done, chunks, patch or stream, decided by the pure `plan` with each chunked part's chunk
//! plan and patch — and what it costs) → each plan handed to its executor, a function of its
//! own module (`chunked`, `patched`, `stream`) → each written part checked by its kind
//! (`parts::check`; `verity` for the kind that carries the release's dm-verity tree) →
//! commit. The executors sit below the conductor: they take the plan and the run's shared
//! state (`run`), never the conductor.
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

use crate::chunk::apply::Transfer;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::manifest::Manifest;
use crate::net::checkpoint::Partial;
pub use crate::net::fetch::ExtraSource;
pub use crate::net::rate::MinRate;
use crate::net::rate::{Budget, RateLimit, Throttle};
pub use crate::net::rate::{Clock, SystemClock};
pub use crate::net::schedule::Schedule;
use crate::payload::kinds::{Place, Room};
use crate::state::store::StateStore;
use crate::state::TransferStats;
use crate::state::{Event, State};

mod api;
mod chunked;
mod parts;
mod patched;
mod plan;
mod run;
mod stream;
mod verify;
mod verity;
mod weigh;

pub use api::{
    NoProgress, Origin, PatchOutcome, Progress, Release, StageOptions, StagePreview, StageReport,
    DEFAULT_RETRY_FOR,
};
use parts::{Fetch, PartPlan};
pub use plan::ArtifactCost;
use plan::{Decision, PartFacts};
use run::Verified;
use run::{link_rate, report, Env, Moved, Placing, Run};
use verify::{Preflight, Probed};
pub use weigh::Prefer;

/// Copy buffer: large enough for full-speed sequential I/O, small enough for the RSS budget.
const BUF: usize = 1 << 20;

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// One run of the stage pipeline over the updater's parts: the conductor.
pub(crate) struct Stager<'a> {
    pub cfg: &'a Config,
    pub layout: &'a dyn Layout,
    pub boot: &'a dyn Bootloader,
    pub store: &'a StateStore,
    /// When this stage attempt stops retrying (`StageOptions::retry_for` from its start).
    pub deadline: Option<std::time::Instant>,
}

impl Stager<'_> {
    /// What the steps below the conductor read of the node.
    fn env(&self) -> Env<'_> {
        Env {
            cfg: self.cfg,
            layout: self.layout,
            deadline: self.deadline,
        }
    }

    /// Fetch, verify and write the release `rel` into the slot that is not `booted`;
    /// `st` is the state as loaded for this boot. Verify, plan, execute, commit: everything
    /// about the release is checked before a byte is written (`verify`), the writes are
    /// decided once (`prepare`: one [`PartPlan`] per part) and carried out per part by its
    /// executor (`execute`).
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
        let mut partial = match w.checkpoint.clone().filter(|_| w.resume) {
            Some(p) => p,
            None => self.invalidate(target, &mut st, &w.v)?,
        };
        // Always counted: a stop says what this attempt fetched.
        let budget = Budget::new(opts.max_bytes.unwrap_or(u64::MAX));
        let run = Run {
            env: self.env(),
            source,
            m: &w.v.manifest,
            slot: target,
            resumed: w.resume,
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
        let mut r = report(target, w.v, false, w.resume, written, moved);
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
                resume: w.resume,
                artifacts: w.parts.iter().map(|p| p.cost.clone()).collect(),
            },
        })
    }

    /// Everything before the first write: verify the release, preflight the server (one
    /// probe per part), then plan each part. Reads only, but for the payload store's proofs
    /// ([`crate::payload::prove`] records one, or moves aside an object that is not its name).
    fn prepare(
        &self,
        booted: Slot,
        st: &State,
        rel: &Release,
        opts: &StageOptions,
    ) -> Result<Prepared> {
        let target = booted.other();
        let env = self.env();
        let v = verify::release(&env, booted, st, rel, opts)?;
        if plan::staged_already(st.slot(target), &v.sha256) {
            return Ok(Prepared::Already(Box::new(v)));
        }
        let (pre, probed) = verify::preflight(&env, &rel.source, &v.manifest, opts)?;
        let checkpoint = Partial::load(&self.cfg.state_dir);
        let resumed = plan::resumed(
            target,
            st.slot(target).state,
            &v.sha256,
            checkpoint.as_ref(),
        );
        let at = Placing {
            env,
            source: &rel.source,
            opts,
            m: &v.manifest,
            slot: target,
            running: (booted, st.slot(booted).version.clone()),
            running_sha256: st.slot(booted).manifest_sha256.clone(),
            kept: crate::slotfiles::manifest(&self.cfg.state_dir, booted).unwrap_or_else(|e| {
                log::warn!("slot {booted}: {e}; its payloads are not reused");
                None
            }),
            resumed: resumed.is_some(),
            link: link_rate(opts, pre.measured),
        };
        let parts = probed
            .into_iter()
            .map(|p| plan_part(&at, p, resumed))
            .collect::<Result<Vec<_>>>()?;
        let resume = at.resumed;
        Ok(Prepared::Work(Box::new(Work {
            v,
            pre,
            checkpoint,
            resume,
            parts,
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

    /// Carry out the plan: each part by its executor (the checkpoint saved after each one),
    /// then each written part's check by its kind. Returns the bytes written.
    fn execute(&self, run: &Run, w: &Work, partial: &mut Partial) -> Result<u64> {
        let mut written = 0;
        for p in &w.parts {
            written += self.write_part(run, p, partial)?;
        }
        for p in &w.parts {
            parts::check(run, run.m, p)?;
        }
        // Objects written now were checked against their sha256: prove them for later plans.
        for p in w.parts.iter().filter(|p| p.kind.place == Place::Store) {
            if matches!(p.fetch, Fetch::Done) {
                continue;
            }
            if let Err(e) = crate::payload::record_proof(&self.cfg.state_dir, &p.entry.sha256) {
                log::warn!("payload store: {e}; the object is hashed again next time");
            }
        }
        for p in w.parts.iter().filter(|p| p.kind.verity) {
            if let Place::Slot(a) = p.kind.place {
                verity::write(&run.env, run.slot, run.m, a)?;
            }
        }
        Ok(written)
    }

    /// Fetch, verify and write part `p` by its executor, counting what moved from where;
    /// the checkpoint records it done. Returns the bytes written.
    fn write_part(&self, run: &Run, p: &PartPlan, partial: &mut Partial) -> Result<u64> {
        let (a, size) = (&p.part, p.entry.size);
        // The update's totals count what an interrupted attempt fetched (kept now) as
        // fetched; this run's report counts only its own network bytes.
        let mut moved = run.moved.get();
        let written = match &p.fetch {
            Fetch::Done => {
                moved.reused += size;
                run.moved.set(moved);
                if !partial.done.contains(a) {
                    // A payload the store already held: reused by this update.
                    partial.reused = partial.reused.saturating_add(size);
                    partial.done.push(a.clone());
                }
                return Ok(0);
            }
            Fetch::Chunked(work) => {
                chunked::write(run, p, work).map(|t| tally(&t, partial, &mut moved))
            }
            Fetch::Patched(work, pw) => {
                patched::write(run, p, work, pw).map(|t| tally(&t, partial, &mut moved))
            }
            Fetch::Stream { resume_at } => {
                stream::write(run, p, *resume_at, partial).inspect(|&n| {
                    partial.fetched = partial.fetched.saturating_add(size);
                    moved.fetched += n;
                    moved.reused += size - n;
                })
            }
        }
        .or_else(|e| Err(self.discard(run, p, partial, e)?))?;
        run.moved.set(moved);
        partial.done.push(a.clone());
        partial.current = None;
        partial.save(&self.cfg.state_dir)?;
        Ok(written)
    }

    /// After part `p` failed with `e` (not a stop, which keeps everything for the next
    /// attempt): remove what was written of it where it takes room others need (its kind
    /// shares a filesystem: a partial kernel or initrd on the boot filesystem), and its place
    /// in the checkpoint. Returns `e`. A payload's partial object stays like a partition's
    /// bytes (the state partition holds no loader files; the next prune removes it if no
    /// stage continues it).
    fn discard(&self, run: &Run, p: &PartPlan, partial: &mut Partial, e: Error) -> Result<Error> {
        let (Place::Slot(artifact), Room::Shared) = (p.kind.place, p.kind.room) else {
            return Ok(e);
        };
        if matches!(e, Error::Stopped { .. }) {
            return Ok(e);
        }
        self.layout.discard(run.slot, &run.m.version, artifact)?;
        if partial.current.as_ref().is_some_and(|(c, _)| *c == p.part) {
            partial.current = None;
            partial.save(&self.cfg.state_dir)?;
        }
        Ok(e)
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
        let (v, pre, resumed) = (&w.v, &w.pre, w.resume);
        let m = &v.manifest;
        self.layout.commit(target, &m.version)?;
        let total: u64 = w.parts.iter().map(|p| p.entry.size).sum();
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

/// Plan one part found by the preflight: done, chunks or a stream ([`plan::decide`]); for
/// chunks, its chunk plan, then whether a listed patch beats it ([`patched::choose`]); and
/// its price. Reads only.
fn plan_part(at: &Placing, p: Probed, resumed: Option<&Partial>) -> Result<PartPlan> {
    let r = p.part;
    let facts = PartFacts {
        part: r.part.clone(),
        index: p.index,
        stored: (r.kind.place == Place::Store).then_some(p.stored),
    };
    let mut choice = None;
    let fetch = match plan::decide(facts, resumed).1 {
        Decision::Done => Fetch::Done,
        Decision::Stream { resume_at } => Fetch::Stream { resume_at },
        Decision::Chunked(index) => {
            let work = chunked::plan(at, &r, index)?;
            let chosen = patched::choose(at, &r, &work);
            choice = chosen.why;
            match chosen.patch {
                Some(pw) => Fetch::Patched(work, Box::new(pw)),
                None => Fetch::Chunked(work),
            }
        }
    };
    let mut cost = plan::cost(
        r.part.clone(),
        r.entry.size,
        fetch.how(),
        fetch.chunk_plan(),
    );
    if let Fetch::Patched(_, pw) = &fetch {
        cost.patch_from = Some(pw.patch.base.version.clone());
    }
    cost.choice = choice;
    Ok(PartPlan {
        part: r.part,
        entry: r.entry.clone(),
        kind: r.kind,
        fetch,
        cost,
    })
}

/// Count a chunked or patched part's transfer `t` into the checkpoint's totals and the
/// run's; returns the bytes written.
fn tally(t: &Transfer, partial: &mut Partial, moved: &mut Moved) -> u64 {
    // Saturating: the totals come from a checkpoint file that may be damaged.
    partial.fetched = partial.fetched.saturating_add(t.fetched + t.kept);
    partial.reused = partial.reused.saturating_add(t.copied);
    moved.fetched += t.fetched;
    moved.reused += t.copied + t.kept;
    moved.from_mirrors += t.from_mirrors;
    moved.refused += t.refused;
    t.fetched + t.copied
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
    /// An interrupted run of this release into this slot is continued: its checkpoint is
    /// kept and what the target holds is re-verified; otherwise the slot is invalidated first.
    resume: bool,
    /// One plan per part, in the manifest's part order ([`crate::payload::kinds::parts`]).
    parts: Vec<PartPlan>,
}

impl Work {
    /// A stop names what is left: the plan's bytes less what this attempt fetched.
    fn left_after(&self, e: Error, b: &Budget) -> Error {
        match e {
            Error::Stopped { why, .. } => Error::Stopped {
                why,
                fetched: b.used(),
                left: self
                    .parts
                    .iter()
                    .map(|p| p.cost.fetch)
                    .sum::<u64>()
                    .saturating_sub(b.used()),
            },
            e => e,
        }
    }
}
