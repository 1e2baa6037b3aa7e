//! The update state machine: stage, activate, confirm, roll back, and the status that explains
//! every decision. [`Updater`] is a thin executor over the node's parts (layout, bootloader,
//! state store); the work lives in [`crate::stage`] (fetch/verify/write), [`crate::net::checkpoint`]
//! (resumable downloads) and [`crate::boot::confirm`] (boot assessment).
//!
//! Ordering rules that make every step power-cut safe (each durable step ends in a write
//! barrier, see [`crate::barrier`]):
//! - **stage**: see [`crate::stage`]: the target slot is marked bad and invalid before it is
//!   written, staged only when complete.
//! - **activate**: state says `trying` (with this boot's id) before the bootloader is flipped.
//!   A cut between the two is detected on the next boot ("activation lost") and the slot goes
//!   back to staged.
//! - **confirm** (every boot): first settles the other slot's trial — if it was activated in an
//!   earlier boot and we are not running it, the bootloader fell back: it is marked bad with
//!   the tries it used. Then the booted slot's health checks run: pass → bootloader and state
//!   mark it good; fail → roll back to the other slot if that one is good.

use crate::manifest::{Manifest, ScriptKind};
use std::path::Path;

use bootconfig::{BootEnv, Bootloader, Slot, SlotBoot};
use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::boot::health;
use crate::config::{BootloaderKind, Config, LayoutConfig};
use crate::error::{Error, Result};
use crate::layout::{DirLayout, GptLayout, Layout};
use crate::stage::Release;
use crate::stage::Stager;
use crate::state::store::StateStore;
use crate::state::{now, Decision, Event, SlotState, State};

pub use crate::stage::{NoProgress, Progress, StageOptions, StagePreview, StageReport};

/// Status of one slot, for `slot status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SlotStatus {
    /// Which slot this is.
    pub slot: Slot,
    /// Its state in the node's state file.
    pub state: SlotState,
    /// Version of the release it holds (None: unknown, e.g. never staged by this node).
    pub version: Option<String>,
    /// Generation of the release it holds (None: unknown).
    pub generation: Option<u64>,
    /// What the bootloader will do with it.
    pub boot: SlotBoot,
    /// Boots the loader still grants it while on trial (None: not on trial).
    pub tries_left: Option<u8>,
    /// The running system booted from it.
    pub booted: bool,
    /// The loader will boot it next.
    pub next_boot: bool,
    /// It is the loader's primary slot.
    pub primary: bool,
    /// The newest decision the node recorded about it (None: none yet).
    pub last_decision: Option<Decision>,
    /// Bytes fetched vs reused by the update that staged this slot (None: staged before
    /// chunked updates, or never staged by this node).
    pub transfer: Option<crate::state::TransferStats>,
    /// The payloads its kept manifest names (issue 33), each with whether the payload store
    /// holds it; empty for a release without payloads or a slot with no kept manifest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub payloads: Vec<crate::payload::PayloadStatus>,
}

/// Status of the node, for `slot status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    /// The slot the running system booted from (None: the kernel command line does not say).
    pub booted: Option<Slot>,
    /// The slot the loader will boot next.
    pub next_boot: Slot,
    /// The loader's name (`grub`, `syslinux`).
    pub bootloader: String,
    /// The slot layout, described for an operator (disk and partitions, or directories).
    pub layout: String,
    /// Each slot's status, A then B.
    pub slots: Vec<SlotStatus>,
    /// The loader's records: the one it will use at the next boot and every damaged one
    /// (e.g. `copy 1` of GRUB's env, naming the file and what is wrong).
    pub loader_integrity: bootconfig::Integrity,
    /// The loader's installed boot script and its version, and the newest this build knows.
    pub boot_script: bootconfig::ScriptInfo,
    /// The boot assessment of the running boot, once `confirm` ran in it (see
    /// [`crate::assess`]): outcome, reason, and whether a fallback was taken.
    pub verdict: Option<crate::boot::assess::Verdict>,
    /// Payload store objects moved aside because their bytes were not their name (oldest
    /// first; [`crate::payload::quarantined`]); each was fetched again, never used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<crate::payload::QuarantineEntry>,
    /// The releases that failed on this node and have not run here since (oldest first):
    /// each is held back by [`crate::rollout::decide_retry`] unless its rollout allows retries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<crate::state::FailedRelease>,
}

pub use crate::state::{Activation, AwaitedChecks};

/// The updater of one node.
pub struct Updater {
    pub(crate) cfg: Config,
    pub(crate) layout: Box<dyn Layout>,
    pub(crate) boot: Box<dyn Bootloader>,
    pub(crate) store: StateStore,
}

/// The loader `cfg` names, on its directory under the boot partition (`grub/`, `syslinux/`).
pub fn loader_for(cfg: &Config) -> Box<dyn Bootloader> {
    let boot_dir = cfg.layout.boot_dir();
    match cfg.bootloader {
        BootloaderKind::Grub => Box::new(bootconfig::GrubBootloader::new(
            boot_dir.join("grub"),
            cfg.tries,
        )),
        BootloaderKind::Syslinux => Box::new(bootconfig::SyslinuxBootloader::new(
            boot_dir.join("syslinux"),
        )),
    }
}

impl Updater {
    /// Open the node described by `cfg`: read the GPT (or the dir layout) and pick the loader.
    pub fn open(cfg: Config) -> Result<Updater> {
        let layout: Box<dyn Layout> = match &cfg.layout {
            LayoutConfig::Gpt { disk, boot_dir } => Box::new(GptLayout::open(disk, boot_dir)?),
            LayoutConfig::Dir { root, boot_dir } => Box::new(DirLayout::new(root, boot_dir)),
        };
        let boot = loader_for(&cfg);
        Ok(Self::with_parts(cfg, layout, boot))
    }

    /// Assemble from explicit parts (tests, other layouts).
    pub fn with_parts(cfg: Config, layout: Box<dyn Layout>, boot: Box<dyn Bootloader>) -> Updater {
        let store = StateStore::new(&cfg.state_dir);
        Updater {
            cfg,
            layout,
            boot,
            store,
        }
    }

    /// The node configuration this updater was opened with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The node's bootloader.
    pub fn bootloader(&self) -> &dyn Bootloader {
        self.boot.as_ref()
    }

    /// The slot this system booted from (`k3os.slot=` on the kernel command line).
    pub fn booted_slot(&self) -> Result<Slot> {
        let p = &self.cfg.proc_cmdline;
        let cmdline =
            std::fs::read_to_string(p).map_err(|e| Error::io("read kernel command line", p, e))?;
        let v = cmdline
            .split_whitespace()
            .find_map(|w| w.strip_prefix("k3os.slot="))
            .ok_or_else(|| {
                Error::UnknownBootedSlot(format!("{} has no k3os.slot= parameter", p.display()))
            })?;
        v.parse()
            .map_err(|e| Error::UnknownBootedSlot(format!("{}: {e}", p.display())))
    }

    pub(crate) fn boot_id(&self) -> String {
        std::fs::read_to_string(&self.cfg.boot_id_file)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// Load the state; on a node's first run, record the booted slot from its release file.
    pub(crate) fn load(&self, booted: Option<Slot>) -> Result<State> {
        let mut st = self.store.load()?;
        if let Some(b) = booted {
            if st.slot(b).state == SlotState::Empty {
                let text = std::fs::read_to_string(&self.cfg.release_file).unwrap_or_default();
                let (version, generation) = health::parse_release_file(&text);
                // The installed release's manifest, when the image builder kept it: which
                // build this generation is, so another build of it is refused from the first
                // update on. A kept manifest of another release is not this slot's.
                let build = crate::slotfiles::manifest_with_sha256(&self.cfg.state_dir, b)
                    .ok()
                    .flatten()
                    .filter(|(m, _)| {
                        Some(&m.version) == version.as_ref() && Some(m.generation) == generation
                    })
                    .map(|(_, sha)| sha);
                let rec = st.slot_mut(b);
                rec.version = version;
                rec.generation = generation;
                rec.manifest_sha256 = build;
                st.transition(
                    b,
                    Event::Bootstrap,
                    format!(
                        "first run: slot {b} is the installed system (from {})",
                        self.cfg.release_file.display()
                    ),
                )?;
            }
        }
        Ok(st)
    }

    /// Record which build the booted slot runs: `manifest` is its release's `manifest.json`
    /// (`bootloader install --running-manifest`, for a slot written by an image builder that
    /// kept none). It must name the version and generation the slot runs; it is kept beside
    /// the state file and its sha256 recorded, so another build of the running generation is
    /// refused from then on. Returns the slot and the manifest's sha256.
    pub fn record_running_manifest(&self, manifest: &[u8]) -> Result<(Slot, String)> {
        let m = Manifest::parse(manifest).map_err(|source| Error::Manifest {
            location: "--running-manifest".into(),
            source,
        })?;
        let booted = self.booted_slot()?;
        let mut st = self.load(Some(booted))?;
        let rec = st.slot(booted);
        if rec.version.as_deref() != Some(m.version.as_str())
            || rec.generation != Some(m.generation)
        {
            return Err(Error::Usage(format!(
                "the manifest is release {} (generation {}), but slot {booted} runs {} (generation {})",
                m.version.escape_debug(),
                m.generation,
                rec.version.as_deref().unwrap_or("?"),
                rec.generation.map_or("?".into(), |g| g.to_string())
            )));
        }
        crate::slotfiles::save(&self.cfg.state_dir, booted, manifest, &[])?;
        let sha = hex::encode(sha2::Sha256::digest(manifest));
        st.slot_mut(booted).manifest_sha256 = Some(sha.clone());
        self.store.save(&st, "running-manifest:recorded")?;
        Ok((booted, sha))
    }

    /// Both slots as the state file and the bootloader see them.
    pub fn status(&self) -> Result<Status> {
        let booted = self.booted_slot().ok();
        let st = self.load(booted)?;
        let env = self.boot.read()?;
        let next = env.next_boot();
        let slots = Slot::ALL
            .iter()
            .map(|&s| {
                let r = st.slot(s);
                let b = env.get(s);
                SlotStatus {
                    slot: s,
                    state: r.state,
                    version: r.version.clone(),
                    generation: r.generation,
                    boot: b,
                    tries_left: match b {
                        SlotBoot::Trying { tries_left } => Some(tries_left),
                        _ => None,
                    },
                    booted: booted == Some(s),
                    next_boot: next == s,
                    primary: env.primary == s,
                    last_decision: st.last_decision(s).cloned(),
                    transfer: r.transfer,
                    payloads: crate::payload::slot_payloads(&self.cfg.state_dir, s),
                }
            })
            .collect();
        let bid = self.boot_id();
        Ok(Status {
            booted,
            next_boot: next,
            bootloader: self.boot.name().to_string(),
            layout: self.layout.describe(),
            slots,
            loader_integrity: self.boot.integrity()?,
            boot_script: self.boot.script()?,
            verdict: st.verdict.clone().filter(|v| v.boot_id == bid),
            quarantined: crate::payload::quarantined(&self.cfg.state_dir),
            failed: st.failed.clone(),
        })
    }

    /// Fetch, verify and write the release `rel` (from [`Updater::resolve`], or
    /// [`Release::at`] a location) into the inactive slot.
    pub fn stage(
        &self,
        rel: &Release,
        opts: &StageOptions,
        progress: &dyn Progress,
    ) -> Result<StageReport> {
        let booted = self.booted_slot()?;
        let st = self.load(Some(booted))?;
        let res = self.stager(opts).stage(booted, st, rel, opts, progress);
        self.report_stage(rel, &res);
        res
    }

    /// What [`Updater::stage`] with the same release and options would fetch and reuse, per
    /// artifact, before its first byte; writes nothing (it reads the release's metadata, the
    /// running slot and what an interrupted attempt left).
    pub fn preview(&self, rel: &Release, opts: &StageOptions) -> Result<StagePreview> {
        let booted = self.booted_slot()?;
        let st = self.load(Some(booted))?;
        self.stager(opts).preview(booted, &st, rel, opts)
    }

    fn stager(&self, opts: &StageOptions) -> Stager<'_> {
        Stager {
            cfg: &self.cfg,
            layout: self.layout.as_ref(),
            boot: self.boot.as_ref(),
            store: &self.store,
            deadline: opts.retry_for.map(|d| std::time::Instant::now() + d),
        }
    }

    /// Refuse to activate `slot` when it holds a release the node's last verified channel
    /// metadata withdraws ([`crate::trust::withdrawn`]); nothing is written either way.
    fn refuse_withdrawn(&self, slot: Slot, r: &crate::state::SlotRecord) -> Result<()> {
        let Some(version) = r.version.as_deref() else {
            return Ok(());
        };
        let held = crate::trust::withdrawn::Held {
            version,
            generation: r.generation.unwrap_or(0),
            manifest_sha256: r.manifest_sha256.as_deref(),
        };
        let store = self.cfg.state_dir.join(crate::trust::STORE_FILE);
        match crate::trust::withdrawn::withdrawn_by(&store, &held) {
            Some(by) => Err(Error::Withdrawn {
                slot,
                version: version.to_string(),
                generation: held.generation,
                by,
            }),
            None => Ok(()),
        }
    }

    /// Tell the bootloader to try the staged inactive slot on the next boot.
    pub fn activate(&self) -> Result<Slot> {
        self.activate_awaiting(None, None)
    }

    /// Try `slot` (staged, or a good fallback switched to by hand) on the next boot.
    pub fn activate_slot(&self, slot: Slot) -> Result<()> {
        self.activate_awaiting(Some(slot), None).map(|_| ())
    }

    /// Try `slot` (None: the inactive one) on the next boot, and with `awaits` do not bless
    /// the trial boot before the caller reports them through [`Self::confirm_with`] (see
    /// [`AwaitedChecks`]). Returns the slot activated.
    pub fn activate_awaiting(
        &self,
        slot: Option<Slot>,
        awaits: Option<AwaitedChecks>,
    ) -> Result<Slot> {
        let awaits = crate::boot::reach::awaits_with(awaits, self.cfg.reachability.as_ref());
        if let Some(a) = &awaits {
            if a.names.is_empty() || a.within_secs == 0 {
                return Err(Error::Usage(format!(
                    "awaited checks need at least one name and a time limit above 0 s (got {:?} within {} s)",
                    a.names, a.within_secs
                )));
            }
        }
        let booted = self.booted_slot()?;
        let slot = slot.unwrap_or(booted.other());
        if slot == booted {
            return Err(Error::SlotBusy { slot });
        }
        let mut st = self.load(Some(booted))?;
        let state = st.slot(slot).state;
        if !matches!(state, SlotState::Staged | SlotState::Good) {
            return Err(Error::SlotState {
                slot,
                state,
                expected: "staged or good",
            });
        }
        self.refuse_withdrawn(slot, st.slot(slot))?;
        if let Some(r) = &self.cfg.reachability {
            // The trial boot must be able to probe something: refuse now, not roll back later.
            crate::boot::reach::endpoints(r, st.slot(slot).staged_from.as_deref())
                .map_err(Error::Usage)?;
        }
        let script = self.script_for(slot)?;
        let tries = self.cfg.tries.min(self.boot.max_tries());
        let note = script
            .as_ref()
            .map(|(kind, v, _)| format!("; installs its {kind} version {v}"))
            .unwrap_or_default();
        st.transition(slot, Event::Activated,
            format!("{} will try slot {slot} {tries} time(s) from the next boot; slot {booted} is the fallback{note}", self.boot.name()),
        )?;
        st.activation = Some(Activation {
            slot,
            boot_id: self.boot_id(),
            tries,
            at: now(),
            awaits,
        });
        self.store.save(&st, "activate:state-trying")?;
        if let Some((_, _, text)) = script {
            self.boot.install_script(&text)?;
            crate::barrier::hit("activate:script-installed");
        }
        self.pass_verity(slot)?;
        self.boot.try_slot(slot, tries)?;
        crate::barrier::hit("activate:bootloader-flipped");
        let trial =
            crate::report::outcome::note_of(fleet_report::Outcome::TrialBoot, st.slot(slot));
        self.report_notes(vec![trial]);
        Ok(slot)
    }

    /// Tell the loader which dm-verity root hash `slot`'s kernel gets (or none), before it is
    /// told to try the slot ([`crate::boot::verity_check::boot_value`]); a warning when the
    /// loader cannot pass one, as the slot then boots without dm-verity.
    fn pass_verity(&self, slot: Slot) -> Result<()> {
        let m = crate::slotfiles::manifest(&self.cfg.state_dir, slot)?;
        let signed = m.as_ref().and_then(|m| m.verity.as_ref());
        let written = crate::slotfiles::verity_written(&self.cfg.state_dir, slot)?;
        let value = crate::boot::verity_check::boot_value(signed, written.as_deref());
        if !self.boot.set_verity(slot, value.as_deref())? {
            log::warn!(
                "slot {slot}: the {} loader cannot pass its dm-verity root hash; it boots without dm-verity",
                self.boot.name()
            );
        }
        crate::barrier::hit("activate:verity-passed");
        Ok(())
    }

    /// The boot script to install when activating `slot` ([`crate::boot::bootscript::decide`] on
    /// the loader's installed script and the release kept for `slot`), with its version; an
    /// error, before anything is written, when the release cannot run under any script.
    fn script_for(&self, slot: Slot) -> Result<Option<(ScriptKind, u32, String)>> {
        let info = self.boot.script()?;
        let m = crate::slotfiles::manifest(&self.cfg.state_dir, slot)?;
        let reads = m.as_ref().map_or(1, |m| m.reads(info.kind));
        let carried = m.as_ref().and_then(|m| m.script(info.kind));
        let step = crate::boot::bootscript::decide(
            info.kind,
            info.installed,
            info.newest_known,
            reads,
            carried.map(|c| c.version),
        )
        .map_err(|source| Error::BootScript { slot, source })?;
        match (step, carried) {
            (crate::boot::bootscript::ScriptStep::Install(v), Some(sc)) => Ok(Some((
                info.kind,
                v,
                crate::slotfiles::script(&self.cfg.state_dir, slot, sc)?,
            ))),
            _ => Ok(None),
        }
    }

    /// Leave the booted slot for the other one, which must be good; the booted slot is marked
    /// bad. Takes effect on the next boot.
    pub fn rollback(&self, reason: &str) -> Result<Slot> {
        let booted = self.booted_slot()?;
        let other = booted.other();
        let mut st = self.load(Some(booted))?;
        let state = st.slot(other).state;
        if state != SlotState::Good {
            return Err(Error::SlotState {
                slot: other,
                state,
                expected: "good (the slot to roll back to)",
            });
        }
        self.boot.mark_good(other)?;
        crate::barrier::hit("rollback:other-good");
        self.boot.mark_bad(booted)?;
        crate::barrier::hit("rollback:booted-bad");
        st.transition(
            booted,
            Event::RolledBack,
            format!("rolled back to slot {other}: {reason}"),
        )?;
        st.activation = None;
        self.store.save(&st, "rollback:state")?;
        let why = fleet_report::Outcome::RolledBack {
            why: reason.to_string(),
        };
        self.report_notes(vec![crate::report::outcome::note_of(why, st.slot(booted))]);
        Ok(other)
    }

    /// Mark `slot` bad. The booted slot can only be left by [`Self::rollback`].
    pub fn mark_bad(&self, slot: Slot, reason: &str) -> Result<()> {
        let booted = self.booted_slot()?;
        if slot == booted {
            return self.rollback(reason).map(|_| ());
        }
        let mut st = self.load(Some(booted))?;
        self.boot.mark_bad(slot)?;
        crate::barrier::hit("mark-bad:bootloader");
        st.transition(slot, Event::MarkedBad, reason.to_string())?;
        if st.activation.as_ref().is_some_and(|a| a.slot == slot) {
            st.activation = None;
        }
        self.store.save(&st, "mark-bad:state")?;
        Ok(())
    }

    /// The bootloader environment as read now.
    pub fn boot_env(&self) -> Result<BootEnv> {
        Ok(self.boot.read()?)
    }

    /// The state directory (state file, download checkpoint).
    pub fn state_dir(&self) -> &Path {
        &self.cfg.state_dir
    }
}
