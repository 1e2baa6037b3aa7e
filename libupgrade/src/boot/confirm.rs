//! Boot assessment, the executor side: gather the inputs of [`crate::boot::assess::assess`] (state,
//! bootloader view and integrity, observed boot, health results — built-in, `health.d` and
//! the caller's [`HealthCheck`]s, all before the single bless point) and carry out its effects
//! in order. Every decision is in [`crate::assess`].

use std::path::Path;
use std::time::Duration;

use bootconfig::Slot;
use serde::{Deserialize, Serialize};

use crate::boot::assess::{self, Effect, LoaderOp, LoaderView, ObservedBoot, Outcome, Verdict};
use crate::boot::health::{self, CheckResult, HealthCheck};
use crate::boot::payloads;
use crate::boot::reach;
use crate::error::Result;
use crate::report::evidence::Assessed;
use crate::state::{Decision, State};
use crate::updater::Updater;

/// What [`Updater::confirm`] found: this boot's verdict, whatever its outcome (blessed, good,
/// rolled back, unhealthy, pending, not assessable). Only a failure to tell (I/O, the loader,
/// the state file) is an error; what an outcome means to a caller (an exit status, an event)
/// is the caller's to decide, like bless-boot's `status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConfirmReport {
    /// The booted slot.
    pub slot: Slot,
    /// Version of the release it holds (None: unknown to the state file).
    pub version: Option<String>,
    /// Newly marked good by this call (false: it already was, or it is not good).
    pub newly_good: bool,
    /// The health checks run in this call, in order (empty when none were needed).
    pub checks: Vec<CheckResult>,
    /// What was decided about the other slot's pending trial, if anything.
    pub other_slot: Option<Decision>,
    /// The full verdict (also stored in the state file, see [`crate::assess`]).
    pub verdict: Verdict,
}

impl ConfirmReport {
    /// This boot's outcome.
    pub fn outcome(&self) -> &Outcome {
        &self.verdict.outcome
    }

    /// The booted slot is good after this call (blessed now or before).
    pub fn is_good(&self) -> bool {
        matches!(self.outcome(), Outcome::Blessed | Outcome::Good)
    }

    /// The failed checks, `name: detail` joined with "; " (empty when none failed).
    pub fn failures(&self) -> String {
        self.checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl Updater {
    /// Run on every boot: settle the other slot's trial, then check the booted slot's health
    /// and mark it good, or roll back when it fails and the other slot is good. The report
    /// says which ([`ConfirmReport::outcome`]).
    pub fn confirm(&self) -> Result<ConfirmReport> {
        self.confirm_with(&[])
    }

    /// [`Self::confirm`] with more checks registered by the caller (e.g. the agent's
    /// Node-Ready): they run with the built-in and `health.d` checks, before the bless.
    /// Checks the activation awaits ([`crate::updater::AwaitedChecks`]) and that are not
    /// among them leave the slot on trial: [`Outcome::Pending`].
    pub fn confirm_with(&self, extra: &[&dyn HealthCheck]) -> Result<ConfirmReport> {
        // The boot-time confirm, `slot await-bless` and the agent may assess the same boot at
        // once: one at a time, each from the state the previous one saved.
        let _lock = self.store.lock()?;
        let r = self.assess_locked(extra, Assessed::Checks);
        if let Err(e) = &r {
            // The slot on trial cannot assess itself: its evidence is kept before the loader
            // falls back.
            self.bundle_confirm_failure(e);
        }
        r
    }

    /// If this boot's assessment is still [`Outcome::Pending`], report the awaited checks
    /// as failed (`detail` says why, e.g. the time limit passed) and assess: a rollback
    /// ([`Outcome::RolledBack`]) when the other slot is good. `Ok(None)`: nothing is pending any more (the caller reported
    /// in time, or the boot was assessed otherwise); decided under the same lock as
    /// [`Self::confirm_with`], so a report that just made it is never overruled.
    pub fn fail_awaited(&self, detail: &str) -> Result<Option<ConfirmReport>> {
        let _lock = self.store.lock()?;
        let booted = self.booted_slot()?;
        let bid = self.boot_id();
        let st = self.load(Some(booted))?;
        let waiting = match st.verdict {
            Some(Verdict {
                outcome: Outcome::Pending { waiting_for, .. },
                boot_id,
                slot,
                ..
            }) if boot_id == bid && slot == booted => waiting_for,
            _ => return Ok(None),
        };
        let failed: Vec<CheckResult> = waiting
            .into_iter()
            .map(|name| CheckResult {
                name,
                ok: false,
                detail: detail.to_string(),
            })
            .collect();
        let refs: Vec<&dyn HealthCheck> = failed.iter().map(|c| c as &dyn HealthCheck).collect();
        self.assess_locked(&refs, Assessed::AwaitedTimeout)
            .map(Some)
    }

    fn assess_locked(&self, extra: &[&dyn HealthCheck], how: Assessed) -> Result<ConfirmReport> {
        let booted = self.booted_slot()?;
        let boot = ObservedBoot {
            slot: booted,
            boot_id: self.boot_id(),
            verity_failure: crate::boot::verity_failure::read(&self.cfg.state_dir),
        };
        let st = self.load(Some(booted))?;
        // Before the checks (and before k3s starts): this slot's image archives where k3s
        // imports them, whatever the verdict (a fallback boot links its own again).
        let archives = self.activate_payloads(booted);
        let loader = LoaderView {
            name: self.boot.name().to_string(),
            env: self.boot.read()?,
            integrity: self.boot.integrity()?,
        };
        let checks = if assess::assessable(&st, booted) {
            let mut c = self.health(booted, &st, &archives)?;
            let version = st.slot(booted).version.clone();
            c.extend(extra.iter().map(|h| h.check(booted, version.as_deref())));
            c
        } else {
            Vec::new()
        };
        let st_before = st.slot(booted).state;
        let was_good = st_before == crate::state::SlotState::Good;
        let a = assess::assess(&st, &loader, &boot, &checks)?;
        // The failed attempt's evidence, before the loader writes that make the fallback.
        self.bundle_assessment(&a, booted, how, boot.verity_failure.as_ref());
        self.carry_out(&a.effects)?;
        if boot.verity_failure.is_some() {
            // Named in this assessment's decisions (when its slot fell back): used.
            crate::boot::verity_failure::remove(&self.cfg.state_dir);
        }
        if matches!(a.verdict.outcome, Outcome::Blessed) {
            self.prune_payloads();
        }
        let v = a.verdict;
        let fell_back = v.other_slot.as_ref().map(|o| a.state.slot(o.slot()));
        self.report_notes(crate::report::of_verdict(
            &v,
            fell_back.map(|r| {
                (
                    r.version.as_deref().unwrap_or_default(),
                    r.generation.unwrap_or(0),
                )
            }),
            a.state.slot(booted).generation.unwrap_or(0),
            st_before,
        ));
        Ok(ConfirmReport {
            slot: booted,
            version: v.version.clone(),
            newly_good: matches!(v.outcome, Outcome::Blessed | Outcome::Good) && !was_good,
            checks: v.checks.clone(),
            other_slot: v
                .other_slot
                .as_ref()
                .and_then(|o| a.state.last_decision(o.slot()).cloned()),
            verdict: v,
        })
    }

    /// After a bless: remove the payload store's objects no slot's kept manifest references
    /// ([`crate::payload`]). The bless stands whatever happens here: a failure is logged and
    /// the next prune (a stage's start, the next bless) tries again.
    fn prune_payloads(&self) {
        match crate::payload::prune(&self.cfg.state_dir) {
            Ok(p) if p.files > 0 => log::info!(
                "payload store: {} unreferenced file(s) removed ({})",
                p.files,
                crate::units::Size(p.bytes)
            ),
            Ok(_) => {}
            Err(e) => log::warn!("payload store: prune after the bless failed: {e}"),
        }
    }

    /// The assessment's effects, in its order, each loader write followed by its barrier.
    fn carry_out(&self, effects: &[Effect]) -> Result<()> {
        for effect in effects {
            match effect {
                Effect::Loader { op, barrier } => {
                    match *op {
                        LoaderOp::MarkGood(s) => self.boot.mark_good(s)?,
                        LoaderOp::MarkBad(s) => self.boot.mark_bad(s)?,
                    }
                    crate::barrier::hit(barrier);
                }
                Effect::LayoutConfirmed(s) => self.layout.confirmed(*s)?,
                Effect::SaveState { state, barrier } => self.store.save(state, barrier)?,
            }
        }
        Ok(())
    }

    fn health(
        &self,
        slot: Slot,
        st: &State,
        archives: &payloads::SlotArchives,
    ) -> Result<Vec<CheckResult>> {
        let mut out = Vec::new();
        let version = st.slot(slot).version.clone();
        if self.cfg.builtin_health_check {
            out.push(self.rootfs_check(slot, version.as_deref()));
        }
        out.extend(payloads::images_check(&self.cfg.airgap_dir, archives));
        // Only when the command line names a verity root hash (see `verity_check`); a kept
        // manifest that cannot be read then fails the check, never the confirm itself.
        let cmdline = std::fs::read_to_string(&self.cfg.proc_cmdline).unwrap_or_default();
        if cmdline.contains(crate::boot::verity_check::CMDLINE_PARAM) {
            let staged = crate::slotfiles::manifest(&self.cfg.state_dir, slot).unwrap_or(None);
            out.extend(crate::boot::verity_check::check(
                &cmdline,
                slot,
                staged.as_ref(),
            ));
        }
        let env = [
            ("K3OS_SLOT", slot.to_string()),
            ("K3OS_VERSION", version.unwrap_or_default()),
        ];
        out.extend(health::run_check_dir(
            &self.cfg.health_dir,
            Duration::from_secs(self.cfg.health_timeout_secs),
            &env,
        )?);
        Ok(out)
    }

    fn rootfs_check(&self, slot: Slot, version: Option<&str>) -> CheckResult {
        let name = "rootfs".to_string();
        let fail = |detail: String| CheckResult {
            name: name.clone(),
            ok: false,
            detail,
        };
        let text = match std::fs::read_to_string(&self.cfg.mountinfo) {
            Ok(t) => t,
            Err(e) => return fail(format!("cannot read {}: {e}", self.cfg.mountinfo.display())),
        };
        let mounts = health::parse_mountinfo(&text);
        let mut found = None;
        for m in mounts.iter().filter(|m| m.fstype == "squashfs") {
            // Through dm-verity the root is on /dev/dm-N: compare the device under it.
            let under = crate::layout::mapped::underlying(Path::new("/sys"), m.dev);
            let source = under
                .name
                .map_or_else(|| m.source.clone(), |n| format!("/dev/{n}"));
            match self.layout.is_rootfs_of(slot, under.dev, &source) {
                Ok(true) => found = Some(m.clone()),
                Ok(false) => {}
                Err(e) => return fail(e.to_string()),
            }
        }
        let Some(m) = found else {
            return fail(format!(
                "no squashfs from slot {slot}'s rootfs is mounted ({})",
                self.cfg.mountinfo.display()
            ));
        };
        if !m.read_only {
            return fail(format!(
                "slot {slot}'s rootfs is mounted read-write at {}",
                m.mount_point
            ));
        }
        let rel = std::fs::read_to_string(&self.cfg.release_file).unwrap_or_default();
        let (running, _) = health::parse_release_file(&rel);
        match (version, running.as_deref()) {
            (Some(want), Some(have)) if want != have => fail(format!(
                "{} says version {have}, slot {slot} should hold {want}",
                self.cfg.release_file.display()
            )),
            (Some(_), None) => fail(format!(
                "{} names no VERSION",
                self.cfg.release_file.display()
            )),
            _ => CheckResult {
                name,
                ok: true,
                detail: format!("{} mounted read-only at {}", m.source, m.mount_point),
            },
        }
    }
}

impl Updater {
    /// One reachability probe for `slot await-bless` while this boot's verdict waits for
    /// `waiting_for`: None when it does not wait for [`reach::CHECK`]; else the check's result to
    /// report ([`Updater::confirm_with`]) when an endpoint answered, or not passed (yet) with
    /// why, naming every endpoint. The awaits were decided by the activating slot's config: a
    /// trial release whose own config has no `[reachability]` probes the default endpoint.
    pub fn probe_reachability(&self, waiting_for: &[String]) -> Result<Option<CheckResult>> {
        if !waiting_for.iter().any(|n| n == reach::CHECK) {
            return Ok(None);
        }
        let cfg = self
            .cfg
            .reachability
            .clone()
            .unwrap_or(reach::Reachability {
                endpoints: Vec::new(),
                within_secs: reach::default_within(),
            });
        let booted = self.booted_slot()?;
        let st = self.load(Some(booted))?;
        // Nothing to probe (activation refuses that, but the trial's config may differ):
        // not passed, so the limit rolls back naming why.
        let probed = reach::endpoints(&cfg, st.slot(booted).staged_from.as_deref())
            .and_then(|eps| reach::probe_any(&eps, reach::PROBE_TIMEOUT));
        let (ok, detail) = match probed {
            Ok(what) => (true, what),
            Err(why) => (false, why),
        };
        Ok(Some(CheckResult {
            name: reach::CHECK.to_string(),
            ok,
            detail,
        }))
    }
}
