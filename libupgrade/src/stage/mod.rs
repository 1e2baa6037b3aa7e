//! The stage pipeline: fetch, verify and write a signed release into the inactive slot.
//!
//! Ordering (each durable step ends in a write barrier, see [`crate::barrier`]): everything
//! about the release (signature, manifest, architecture, downgrade, space) is checked before a
//! byte is written; the target slot is then marked bad in the bootloader, invalid in the state
//! file, and only then written; it is recorded as staged after every byte was hashed, synced and
//! the squashfs checked. A cut anywhere leaves it invalid (never booted) or staged-and-complete.
//! Downloads checkpoint their progress ([`crate::checkpoint`]) so a later run resumes.
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
//! resuming from the checkpointed position as before.
//!
//! [`Updater::stage`](crate::Updater::stage) finds the booted slot and loads the state, then
//! runs a `Stager` borrowing the updater's parts. One way through it: `verify` (the
//! release, then the server) → `plan` (pure: what to write, how) → the executors
//! (`chunked`, `stream`) → commit. Retries everywhere follow [`crate::retry`].

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use bootconfig::{Bootloader, Slot};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::checkpoint::Partial;
pub use crate::chunk::rate::MinRate;
use crate::chunk::rate::RateLimit;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::fetch::Source;
use crate::layout::Layout;
use crate::manifest::{Artifact, Manifest};
use crate::state::store::StateStore;
use crate::state::TransferStats;
use crate::state::{Event, State};

mod chunked;
mod plan;
mod stream;
mod verify;

use plan::{How, WritePlan};
use verify::{Preflight, Verified};

/// Copy buffer: large enough for full-speed sequential I/O, small enough for the RSS budget.
const BUF: usize = 1 << 20;

/// Reports download/write progress (a progress bar in the CLI, Node annotations in the agent).
pub trait Progress {
    /// Starting `what` of `total` bytes, `already` of which are held from an earlier attempt.
    fn begin(&self, what: &str, total: u64, already: u64);
    fn advance(&self, bytes: u64);
    fn end(&self);
    /// Of the bytes advanced, `bytes` came over the network (default: ignored).
    fn fetched(&self, _bytes: u64) {}
    /// Of the bytes advanced, `bytes` were already on the node (running slot, earlier attempt).
    fn reused(&self, _bytes: u64) {}
}

/// Progress that goes nowhere.
pub struct NoProgress;

impl Progress for NoProgress {
    fn begin(&self, _: &str, _: u64, _: u64) {}
    fn advance(&self, _: u64) {}
    fn end(&self) {}
}

/// Options of [`Updater::stage`].
#[derive(Debug, Clone)]
pub struct StageOptions {
    /// Install a release older (by generation) than the running one.
    pub allow_downgrade: bool,
    /// Trust directory instead of the configured one.
    pub trust_dir: Option<PathBuf>,
    /// First delay between download attempts (doubles per failed attempt, up to 30 s).
    pub retry_delay: Duration,
    /// Cap on download bandwidth, bytes per second (None: as fast as the link allows).
    pub max_rate: Option<u64>,
    /// The version asked for (a channel's entry, `upgrade --version`): the signed manifest
    /// must name exactly it, so a channel or mirror cannot hand over another signed release.
    pub expect_version: Option<String>,
    /// The manifest the channel's signed metadata names (length and sha256): any other
    /// manifest is refused before its signature is even read (arbitrary software,
    /// mix-and-match). Set from [`crate::channel::ResolvedRelease::pin`].
    pub expect_manifest: Option<crate::trust::ManifestPin>,
    /// How long one stage attempt keeps retrying transient failures (None: for ever, only
    /// when asked); the final error names the URL, the last error, the attempts and the time.
    pub retry_for: Option<Duration>,
    /// Responses slower than this over a whole window are cut and retried (None: no floor;
    /// lowered to half of `max_rate` when a cap is set).
    pub min_rate: Option<MinRate>,
}

/// `StageOptions::retry_for`'s default: a few hours, what a thin link may need to come back.
pub const DEFAULT_RETRY_FOR: Duration = Duration::from_secs(6 * 3600);

impl StageOptions {
    /// The minimum-rate rule in force: never above half the bandwidth cap.
    pub fn min_rate_rule(&self) -> Option<MinRate> {
        self.min_rate.map(|r| match self.max_rate {
            Some(cap) => MinRate {
                bytes_per_sec: r.bytes_per_sec.min(cap / 2),
                ..r
            },
            None => r,
        })
    }
}

impl Default for StageOptions {
    fn default() -> Self {
        StageOptions {
            allow_downgrade: false,
            trust_dir: None,
            retry_delay: Duration::from_secs(1),
            max_rate: None,
            expect_version: None,
            expect_manifest: None,
            retry_for: Some(DEFAULT_RETRY_FOR),
            min_rate: Some(MinRate::DEFAULT),
        }
    }
}

/// What [`Updater::stage`] did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageReport {
    pub slot: Slot,
    pub version: String,
    pub generation: u64,
    /// Key id that signed the manifest.
    pub signed_by: String,
    /// True when the slot already held exactly this release.
    pub already_staged: bool,
    /// True when an earlier interrupted download was continued.
    pub resumed: bool,
    pub bytes_written: u64,
    /// Bytes fetched over the network by this run.
    pub bytes_fetched: u64,
    /// Bytes this run did not fetch: copied from the running slot or kept from an earlier
    /// attempt.
    pub bytes_reused: u64,
}

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
    /// Fetch, verify and write the release at `source` into the slot that is not `booted`;
    /// `st` is the state as loaded for this boot. Verify, plan, execute, commit: everything
    /// about the release is checked before a byte is written (`verify`), the writes are
    /// decided once (`plan`) and carried out per artifact by its executor.
    pub fn stage(
        &self,
        booted: Slot,
        mut st: State,
        source: &Source,
        opts: &StageOptions,
        progress: &dyn Progress,
    ) -> Result<StageReport> {
        let target = booted.other();
        let v = self.verify(booted, &st, source, opts)?;
        if plan::staged_already(st.slot(target), &v.sha256) {
            return Ok(report(target, v, true, false, 0, (0, 0)));
        }
        let pre = self.preflight(source, &v.manifest, opts)?;
        let checkpoint = Partial::load(&self.cfg.state_dir);
        let plan = plan::plan_writes(
            target,
            st.slot(target).state,
            &v.sha256,
            checkpoint.as_ref(),
            pre.has_index(),
        );
        let mut partial = match checkpoint.filter(|_| plan.resume) {
            Some(p) => p,
            None => self.invalidate(target, &mut st, &v)?,
        };
        let limit = opts.max_rate.map(RateLimit::new);
        let run = Run {
            source,
            m: &v.manifest,
            slot: target,
            running: (booted, st.slot(booted).version.clone()),
            resumed: plan.resume,
            opts,
            progress,
            limit: limit.as_ref(),
            fetched: Default::default(),
            reused: Default::default(),
        };
        let written = match self.execute(&run, &plan, &pre, &mut partial) {
            Ok(n) => n,
            Err(e) => return Err(self.record_failure(target, &mut st, &v.manifest, e)?),
        };
        let moved = (run.fetched.get(), run.reused.get());
        drop(run);
        self.commit(target, &mut st, &v, &pre, &partial, plan.resume)?;
        Ok(report(target, v, false, plan.resume, written, moved))
    }

    /// Before the first write of a new attempt: the loader never boots the slot, the state
    /// says invalid, the slot's kept release files are gone, and a fresh checkpoint exists.
    fn invalidate(&self, target: Slot, st: &mut State, v: &Verified) -> Result<Partial> {
        self.boot.mark_bad(target)?;
        crate::barrier::hit("stage:bootloader-marked-bad");
        crate::slotfiles::clear(&self.cfg.state_dir, target)?;
        let rec = st.slot_mut(target);
        rec.version = Some(v.manifest.version.clone());
        rec.generation = Some(v.manifest.generation);
        rec.manifest_sha256 = Some(v.sha256.clone());
        st.transition(
            target,
            Event::StageStarted,
            format!(
                "writing {} (generation {}) from {}, signed by {}",
                v.manifest.version, v.manifest.generation, v.location, v.key
            ),
        );
        self.store.save(st, "stage:slot-invalid")?;
        let p = Partial {
            slot: target,
            manifest_sha256: v.sha256.clone(),
            done: Vec::new(),
            current: None,
            fetched: 0,
            reused: 0,
        };
        p.save(&self.cfg.state_dir)?;
        Ok(p)
    }

    /// Carry out `plan`: each artifact by its executor, the checkpoint saved after each one,
    /// then the squashfs check. Returns the bytes written.
    fn execute(
        &self,
        run: &Run,
        plan: &WritePlan,
        pre: &Preflight,
        partial: &mut Partial,
    ) -> Result<u64> {
        let mut written = 0;
        for (k, (a, how)) in plan.steps.into_iter().enumerate() {
            let size = run.m.files.get(a).size;
            // The update's totals count what an interrupted attempt fetched (kept now) as
            // fetched; this run's report counts only its own network bytes.
            match how {
                How::Done => continue,
                How::Chunked => {
                    let index = pre.indexes[k]
                        .as_ref()
                        .expect("planned chunked: has an index");
                    let t = self.write_chunked(run, a, index)?;
                    written += t.fetched + t.copied;
                    // Saturating: the totals come from a checkpoint file that may be damaged.
                    partial.fetched = partial.fetched.saturating_add(t.fetched + t.kept);
                    partial.reused = partial.reused.saturating_add(t.copied);
                    run.fetched.set(run.fetched.get() + t.fetched);
                    run.reused.set(run.reused.get() + t.copied + t.kept);
                }
                How::Stream { resume_at } => {
                    let n = self.write_stream(run, a, resume_at, partial)?;
                    written += n;
                    partial.fetched = partial.fetched.saturating_add(size);
                    run.fetched.set(run.fetched.get() + n);
                    run.reused.set(run.reused.get() + (size - n));
                }
            }
            partial.done.push(a);
            partial.current = None;
            partial.save(&self.cfg.state_dir)?;
        }
        self.check_rootfs(run.slot, &run.m.version, run.m.files.rootfs.size)?;
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
        v: &Verified,
        pre: &Preflight,
        partial: &Partial,
        resumed: bool,
    ) -> Result<()> {
        let m = &v.manifest;
        self.layout.commit(target, &m.version)?;
        let total: u64 = Artifact::ALL.iter().map(|a| m.files.get(*a).size).sum();
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
                "{} (generation {}) written and verified{}; {} fetched, {} reused of {}",
                m.version,
                m.generation,
                if resumed { ", resumed" } else { "" },
                crate::error::Size(stats.fetched),
                crate::error::Size(stats.reused),
                crate::error::Size(total),
            ),
        );
        self.store.save(st, "stage:slot-staged")?;
        Partial::clear(&self.cfg.state_dir)
    }

    /// The written rootfs must be a squashfs whose used bytes fit what the manifest declared
    /// ([`crate::sqcheck`]: structural, constant memory).
    fn check_rootfs(&self, slot: Slot, version: &str, size: u64) -> Result<()> {
        let (f, offset, len) = self.layout.open_rootfs(slot, version)?;
        crate::sqcheck::check(
            |pos, buf| {
                if pos + buf.len() as u64 > len {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("read at {pos} past the slot's {len} bytes"),
                    ));
                }
                f.read_exact_at(buf, offset + pos)
            },
            size,
        )
        .map(|_| ())
        .map_err(|what| Error::BadImage { slot, what })
    }
}

/// The report of a stage run into `slot` of release `v`; `moved`: bytes (fetched, reused).
fn report(
    slot: Slot,
    v: Verified,
    already_staged: bool,
    resumed: bool,
    bytes_written: u64,
    moved: (u64, u64),
) -> StageReport {
    StageReport {
        slot,
        version: v.manifest.version,
        generation: v.manifest.generation,
        signed_by: v.key,
        already_staged,
        resumed,
        bytes_written,
        bytes_fetched: moved.0,
        bytes_reused: moved.1,
    }
}

/// What one stage run works with (shared by the per-artifact writers).
struct Run<'a> {
    source: &'a Source,
    m: &'a Manifest,
    slot: Slot,
    /// The running slot and its version (where reusable chunks are looked for).
    running: (Slot, Option<String>),
    /// A checkpoint of this release into this slot existed: re-verify what the target holds.
    resumed: bool,
    opts: &'a StageOptions,
    progress: &'a dyn Progress,
    limit: Option<&'a RateLimit>,
    /// Bytes fetched and not fetched (reused, kept) by this run.
    fetched: std::cell::Cell<u64>,
    reused: std::cell::Cell<u64>,
}
