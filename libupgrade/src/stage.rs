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
//! runs a [`Stager`] borrowing the updater's parts.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use bootconfig::{Bootloader, Slot};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::checkpoint::{self, Partial};
use crate::chunk::apply::{self, ApplyOptions, ApplyProgress, ChunkTarget, RangeSource};
use crate::chunk::local::{find_local, verify_in_place, LocalFile};
use crate::chunk::rate::{Limited, RateLimit};
use crate::chunk::ChunkIndex;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::fetch::Source;
use crate::layout::Layout;
use crate::layout::Target;
use crate::manifest::{Arch, Artifact, Manifest, MANIFEST_FILE, SIGNATURE_FILE};
use crate::state::TransferStats;
use crate::state::{Event, SlotState, State, StateStore};

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
}

impl Default for StageOptions {
    fn default() -> Self {
        StageOptions {
            allow_downgrade: false,
            trust_dir: None,
            retry_delay: Duration::from_secs(1),
            max_rate: None,
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
}

impl Stager<'_> {
    /// Fetch, verify and write the release at `source` into the slot that is not `booted`;
    /// `st` is the state as loaded for this boot.
    pub fn stage(
        &self,
        booted: Slot,
        mut st: State,
        source: &Source,
        opts: &StageOptions,
        progress: &dyn Progress,
    ) -> Result<StageReport> {
        let target = booted.other();
        // Everything about the release is checked before a byte is written.
        let mloc = source.location(MANIFEST_FILE);
        let mbytes = source.read_small(MANIFEST_FILE)?;
        let sig = source
            .read_small(SIGNATURE_FILE)
            .map_err(|e| Error::Signature {
                location: mloc.clone(),
                what: format!("release is not signed ({SIGNATURE_FILE} cannot be read: {e})"),
            })?;
        let trust = opts.trust_dir.as_deref().unwrap_or(&self.cfg.trust_dir);
        let key = crate::signing::verify(&mbytes, &sig, trust).map_err(|e| Error::Signature {
            location: mloc.clone(),
            what: e.to_string(),
        })?;
        let manifest = Manifest::parse(&mbytes).map_err(|source| Error::Manifest {
            location: mloc.clone(),
            source,
        })?;
        manifest
            .check_arch(Arch::host())
            .map_err(|source| Error::Manifest {
                location: mloc.clone(),
                source,
            })?;
        if let Some(installed) = st.slot(booted).generation {
            if manifest.generation < installed && !opts.allow_downgrade {
                return Err(Error::Downgrade {
                    version: manifest.version.clone(),
                    found: manifest.generation,
                    installed,
                });
            }
        }
        // Refuse what cannot fit before the slot is touched (a full disk is not a reason to
        // invalidate it). Artifacts sharing one filesystem must fit together.
        let mut shared_need = 0u64;
        for a in Artifact::ALL {
            let need = manifest.files.get(a).size;
            let cap = self.layout.capacity(target, a)?;
            let need_here = if a == Artifact::Rootfs {
                need
            } else {
                shared_need + need
            };
            if a != Artifact::Rootfs {
                shared_need += need;
            }
            if need_here > cap {
                return Err(Error::NoSpace {
                    artifact: a,
                    target: format!("slot {target}: {}", self.layout.place(target, a)),
                    needed: need_here,
                    available: cap,
                });
            }
        }
        let msha = sha256_hex(&mbytes);
        let rec = st.slot(target);
        if matches!(rec.state, SlotState::Staged | SlotState::Trying)
            && rec.manifest_sha256.as_deref() == Some(msha.as_str())
        {
            return Ok(StageReport {
                slot: target,
                version: manifest.version,
                generation: manifest.generation,
                signed_by: key.to_string(),
                already_staged: true,
                resumed: false,
                bytes_written: 0,
                bytes_fetched: 0,
                bytes_reused: 0,
            });
        }
        // Every file exists with the right size, every chunk index and boot script matches:
        // before any write.
        let indexes = self.preflight(source, &manifest, opts)?;
        let scripts = self.fetch_scripts(source, &manifest, opts)?;

        let resumable = Partial::load(&self.cfg.state_dir).filter(|p| {
            p.slot == target
                && p.manifest_sha256 == msha
                && st.slot(target).state == SlotState::Invalid
        });
        let resumed = resumable.is_some();
        let mut partial = match resumable {
            Some(p) => p,
            None => {
                self.boot.mark_bad(target)?;
                crate::barrier::hit("stage:bootloader-marked-bad");
                crate::slotfiles::clear(&self.cfg.state_dir, target)?;
                let rec = st.slot_mut(target);
                rec.version = Some(manifest.version.clone());
                rec.generation = Some(manifest.generation);
                rec.manifest_sha256 = Some(msha.clone());
                st.transition(
                    target,
                    SlotState::Invalid,
                    Event::StageStarted,
                    format!(
                        "writing {} (generation {}) from {}, signed by {key}",
                        manifest.version, manifest.generation, mloc
                    ),
                );
                self.store.save(&st, "stage:slot-invalid")?;
                let p = Partial {
                    slot: target,
                    manifest_sha256: msha.clone(),
                    done: Vec::new(),
                    current: None,
                    fetched: 0,
                    reused: 0,
                };
                p.save(&self.cfg.state_dir)?;
                p
            }
        };

        let limit = opts.max_rate.map(RateLimit::new);
        let run = Run {
            source,
            m: &manifest,
            slot: target,
            running: (booted, st.slot(booted).version.clone()),
            resumed,
            opts,
            progress,
            limit: limit.as_ref(),
            fetched: Default::default(),
            reused: Default::default(),
        };
        let result = self.write_all(&run, &indexes, &mut partial);
        let written = match result {
            Ok(n) => n,
            Err(e) => {
                // A bad checksum or size means the bytes held are wrong: start over next time.
                if matches!(
                    e,
                    Error::Checksum { .. } | Error::Size { .. } | Error::BadImage { .. }
                ) {
                    Partial::clear(&self.cfg.state_dir)?;
                }
                st.log(
                    target,
                    Event::StageFailed,
                    Some(manifest.version.clone()),
                    Some(manifest.generation),
                    e.to_string(),
                );
                self.store.save(&st, "stage:failed-recorded")?;
                return Err(e);
            }
        };
        self.layout.commit(target, &manifest.version)?;
        let total: u64 = Artifact::ALL
            .iter()
            .map(|a| manifest.files.get(*a).size)
            .sum();
        let stats = TransferStats {
            fetched: partial.fetched,
            reused: partial.reused,
            total,
        };
        crate::slotfiles::save(&self.cfg.state_dir, target, &mbytes, &scripts)?;
        st.slot_mut(target).transfer = Some(stats);
        st.transition(
            target,
            SlotState::Staged,
            Event::Staged,
            format!(
                "{} (generation {}) written and verified{}; {} fetched, {} reused of {}",
                manifest.version,
                manifest.generation,
                if resumed { ", resumed" } else { "" },
                crate::error::Size(stats.fetched),
                crate::error::Size(stats.reused),
                crate::error::Size(total),
            ),
        );
        self.store.save(&st, "stage:slot-staged")?;
        Partial::clear(&self.cfg.state_dir)?;
        let (bytes_fetched, bytes_reused) = (run.fetched.get(), run.reused.get());
        drop(run);
        Ok(StageReport {
            slot: target,
            version: manifest.version,
            generation: manifest.generation,
            signed_by: key.to_string(),
            already_staged: false,
            resumed,
            bytes_written: written,
            bytes_fetched,
            bytes_reused,
        })
    }

    /// Probe every artifact (exists, right size) and fetch and check every chunk index.
    fn preflight(
        &self,
        source: &Source,
        m: &Manifest,
        opts: &StageOptions,
    ) -> Result<Vec<Option<ChunkIndex>>> {
        let mut out = Vec::new();
        for a in Artifact::ALL {
            let e = m.files.get(a);
            let probe = self.retrying(opts, || source.probe(&e.path))?;
            if probe.size != e.size {
                return Err(Error::Size {
                    artifact: a,
                    location: source.location(&e.path),
                    expected: e.size,
                    found: probe.size,
                });
            }
            let Some(r) = &e.chunks else {
                out.push(None);
                continue;
            };
            if !probe.ranges {
                log::warn!(
                    "{}: the server ignores Range requests; {a} is downloaded whole",
                    source.location(&e.path)
                );
                out.push(None);
                continue;
            }
            let loc = source.location(&r.path);
            let bad = |what: String| Error::ChunkIndex {
                artifact: a,
                location: loc.clone(),
                what,
            };
            let bytes = self.retrying(opts, || source.read_capped(&r.path, r.size))?;
            let sha = sha256_hex(&bytes);
            if bytes.len() as u64 > r.size {
                return Err(bad(format!(
                    "larger than the {} bytes the signed manifest says",
                    r.size
                )));
            }
            if bytes.len() as u64 != r.size || sha != r.sha256 {
                return Err(bad(format!(
                    "{} bytes with sha256 {sha}, the signed manifest says {} bytes with sha256 {}",
                    bytes.len(),
                    r.size,
                    r.sha256
                )));
            }
            let index = ChunkIndex::parse(&bytes).map_err(|e| bad(e.to_string()))?;
            if index.size() != e.size {
                return Err(bad(format!(
                    "describes {} bytes, the manifest says {} ({}) has {}",
                    index.size(),
                    a,
                    e.path,
                    e.size
                )));
            }
            out.push(Some(index));
        }
        Ok(out)
    }

    /// Fetch every boot script the manifest names and check it against its signed size and
    /// sha256 (they are small: read whole, capped at the signed size).
    fn fetch_scripts(
        &self,
        source: &Source,
        m: &Manifest,
        opts: &StageOptions,
    ) -> Result<Vec<(crate::manifest::ScriptFile, Vec<u8>)>> {
        let mut out = Vec::new();
        for sc in m.boot.iter().flat_map(|b| &b.scripts) {
            let bytes = self.retrying(opts, || source.read_capped(&sc.path, sc.size))?;
            let sha = sha256_hex(&bytes);
            if bytes.len() as u64 != sc.size || sha != sc.sha256 {
                return Err(Error::Fetch {
                    location: source.location(&sc.path),
                    what: format!(
                        "boot script ({}): {} bytes with sha256 {sha}, the signed manifest says {} bytes with sha256 {}",
                        sc.kind,
                        bytes.len(),
                        sc.size,
                        sc.sha256
                    ),
                    retryable: false,
                });
            }
            out.push((sc.clone(), bytes));
        }
        Ok(out)
    }

    /// Run `f`, retrying transient fetch errors like the downloads do.
    fn retrying<T>(&self, opts: &StageOptions, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        let mut delay = opts.retry_delay;
        let mut failures = 0;
        loop {
            match f() {
                Err(Error::Fetch {
                    retryable: true,
                    location,
                    what,
                }) if failures < self.cfg.download_retries => {
                    failures += 1;
                    log::warn!(
                        "{location}: {what}; attempt {failures}/{} in {delay:?}",
                        self.cfg.download_retries
                    );
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
                r => return r,
            }
        }
    }

    fn write_all(
        &self,
        run: &Run,
        indexes: &[Option<ChunkIndex>],
        partial: &mut Partial,
    ) -> Result<u64> {
        let (source, m, slot, opts, progress) =
            (run.source, run.m, run.slot, run.opts, run.progress);
        let mut written = 0;
        for (k, a) in Artifact::ALL.into_iter().enumerate() {
            if partial.done.contains(&a) {
                continue;
            }
            // The update's totals count what an interrupted attempt fetched (kept now) as
            // fetched; this run's report counts only its own network bytes.
            if let Some(index) = &indexes[k] {
                let t = self.write_chunked(run, a, index)?;
                written += t.fetched + t.copied;
                partial.fetched += t.fetched + t.kept;
                partial.reused += t.copied;
                run.fetched.set(run.fetched.get() + t.fetched);
                run.reused.set(run.reused.get() + t.copied + t.kept);
            } else {
                let resume_at = match partial.current {
                    Some((ca, pos)) if ca == a => pos,
                    _ => 0,
                };
                let n = self.write_artifact(
                    source, m, slot, a, resume_at, partial, opts, progress, run.limit,
                )?;
                written += n;
                partial.fetched += m.files.get(a).size;
                run.fetched.set(run.fetched.get() + n);
                run.reused.set(run.reused.get() + (m.files.get(a).size - n));
            }
            partial.done.push(a);
            partial.current = None;
            partial.save(&self.cfg.state_dir)?;
        }
        self.check_rootfs(slot, &m.version, m.files.rootfs.size)?;
        Ok(written)
    }

    #[allow(clippy::too_many_arguments)]
    fn write_artifact(
        &self,
        source: &Source,
        m: &Manifest,
        slot: Slot,
        a: Artifact,
        resume_at: u64,
        partial: &mut Partial,
        opts: &StageOptions,
        progress: &dyn Progress,
        limit: Option<&RateLimit>,
    ) -> Result<u64> {
        let entry = m.files.get(a);
        let size = entry.size;
        let target = self
            .layout
            .target(slot, &m.version, a, size, resume_at > 0)?;
        let mut hasher = Sha256::new();
        // Resume: trust only what the checkpoint says was synced, and re-hash it from disk.
        let mut pos = resume_at.min(size);
        if target.is_file() {
            // A cut after the rename but before the checkpoint leaves no temp file (length 0):
            // resuming at the checkpoint would extend it with zeros (sha256 mismatch on every
            // later run; found by vm-tests powercut at `artifact-renamed`). Start over instead.
            pos = pos.min(target.existing_len()?);
        }
        target.truncate(pos)?;
        if pos > 0 {
            let mut r = target.reader(pos)?;
            let mut buf = vec![0u8; BUF];
            let mut n_total = 0;
            loop {
                let n = r
                    .read(&mut buf)
                    .map_err(|e| Error::io("re-read for resume", target.display(), e))?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                n_total += n as u64;
            }
            if n_total != pos {
                return Err(Error::Layout(format!(
                    "{}: could re-read only {n_total} of {pos} bytes to resume",
                    target.display()
                )));
            }
        }
        progress.begin(&format!("{a} ({})", entry.path), size, pos);
        let is_local = matches!(source, Source::Path(_));
        let mut buf = vec![0u8; BUF];
        let mut failures = 0u32;
        let mut delay = opts.retry_delay;
        let mut last_ckpt = pos;
        let mut last_ckpt_at = std::time::Instant::now();
        let start = pos;
        let mut last_err = String::new();
        while pos < size {
            let opened = source.open(&entry.path, pos);
            let (mut r, loc) = match opened {
                Ok(x) => x,
                Err(Error::Fetch {
                    retryable: true,
                    what,
                    ..
                }) if failures < self.cfg.download_retries => {
                    failures += 1;
                    log::warn!(
                        "{}: {what}; attempt {failures}/{} in {delay:?}",
                        source.location(&entry.path),
                        self.cfg.download_retries
                    );
                    last_err = what;
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(30));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut r = Limited::new(&mut r, limit);
            let before = pos;
            loop {
                let want = ((size - pos) as usize).min(BUF);
                if want == 0 {
                    break;
                }
                match r.read(&mut buf[..want]) {
                    Ok(0) => break,
                    Ok(n) => {
                        hasher.update(&buf[..n]);
                        target.write_at(pos, &buf[..n])?;
                        pos += n as u64;
                        progress.advance(n as u64);
                        let since = last_ckpt_at.elapsed();
                        if checkpoint::due(pos - last_ckpt, since) {
                            target.sync()?;
                            partial.current = Some((a, pos));
                            partial.save(&self.cfg.state_dir)?;
                            last_ckpt = pos;
                            last_ckpt_at = std::time::Instant::now();
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        last_err = format!("connection dropped at byte {pos} of {size}: {e}");
                        break;
                    }
                }
            }
            if pos < size {
                if is_local {
                    return Err(Error::Size {
                        artifact: a,
                        location: loc,
                        expected: size,
                        found: pos,
                    });
                }
                if pos > before {
                    failures = 0;
                    delay = opts.retry_delay;
                }
                if last_err.is_empty() {
                    last_err = format!("stream ended at byte {pos} of {size}");
                }
                failures += 1;
                if failures > self.cfg.download_retries {
                    // Keep what was synced: the next run resumes from the checkpoint.
                    target.sync()?;
                    partial.current = Some((a, pos));
                    partial.save(&self.cfg.state_dir)?;
                    return Err(Error::Fetch {
                        location: loc,
                        what: format!("{last_err}; gave up after {failures} attempts (progress kept, a later run resumes at byte {pos})"),
                        retryable: true,
                    });
                }
                log::warn!("{loc}: {last_err}; resuming at byte {pos} in {delay:?}");
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_secs(30));
                last_err.clear();
            }
        }
        progress.end();
        let found = hex::encode(hasher.finalize());
        if found != entry.sha256 {
            return Err(Error::Checksum {
                artifact: a,
                location: source.location(&entry.path),
                expected: entry.sha256.clone(),
                found,
            });
        }
        target.finish()?;
        crate::barrier::hit("stage:artifact-complete");
        Ok(pos - start)
    }

    /// Write artifact `a` chunk by chunk (see the module docs); returns what came from where.
    fn write_chunked(&self, run: &Run, a: Artifact, index: &ChunkIndex) -> Result<apply::Transfer> {
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
