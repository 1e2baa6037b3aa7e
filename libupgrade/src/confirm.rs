//! Boot assessment: run on every boot, settle the other slot's trial (a fallback the bootloader
//! took, or an activation that never reached it), record why this slot booted, run the health
//! checks and mark the booted slot good or roll back.

use std::time::Duration;

use bootconfig::{Slot, SlotBoot};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::health::{self, CheckResult};
use crate::state::{Decision, Event, SlotState, State};
use crate::updater::Updater;

/// What [`Updater::confirm`] found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConfirmReport {
    pub slot: Slot,
    pub version: Option<String>,
    /// Newly marked good by this call (false: it already was).
    pub newly_good: bool,
    pub checks: Vec<CheckResult>,
    /// What was decided about the other slot's pending trial, if anything.
    pub other_slot: Option<Decision>,
}

impl Updater {
    /// Run on every boot: settle the other slot's trial, then check the booted slot's health
    /// and mark it good, or roll back when it fails and the other slot is good.
    pub fn confirm(&self) -> Result<ConfirmReport> {
        let booted = self.booted_slot()?;
        let other = booted.other();
        let bid = self.boot_id();
        let mut st = self.load(Some(booted))?;
        let env = self.boot.read()?;
        let mut other_decision = None;
        let mut dirty = st.slot(booted).since != 0
            && st
                .history
                .last()
                .is_some_and(|d| d.event == Event::Bootstrap);

        if let Some(act) = st.activation.clone() {
            if act.slot == other && act.boot_id != bid {
                if st.slot(other).state == SlotState::Trying {
                    match env.get(other) {
                        SlotBoot::Trying { tries_left } => {
                            let used = act.tries.saturating_sub(tries_left);
                            st.transition(
                                other,
                                SlotState::Bad,
                                Event::FallbackTaken,
                                format!(
                                    "slot {other} did not confirm: {} booted {booted} after {used} of {} tries of {other} ({tries_left} left)",
                                    self.boot.name(),
                                    act.tries
                                ),
                            );
                            self.boot.mark_bad(other)?;
                            crate::barrier::hit("confirm:fallback-marked-bad");
                        }
                        _ => {
                            st.transition(
                                other,
                                SlotState::Staged,
                                Event::ActivationLost,
                                format!("activation of slot {other} never reached {} (interrupted?); it stays staged", self.boot.name()),
                            );
                        }
                    }
                    other_decision = st.last_decision(other).cloned();
                }
                st.activation = None;
                dirty = true;
            }
        }
        if st.last_boot_id.as_deref() != Some(bid.as_str()) {
            let rec = st.slot(booted);
            let why = match env.get(booted) {
                SlotBoot::Trying { tries_left } => format!(
                    "booted slot {booted} ({}) on trial, {tries_left} tries left",
                    rec.state
                ),
                b => format!(
                    "booted slot {booted} ({}, bootloader: {})",
                    rec.state,
                    boot_word(b)
                ),
            };
            let (v, g) = (rec.version.clone(), rec.generation);
            st.log(booted, Event::Booted, v, g, why);
            st.last_boot_id = Some(bid.clone());
            dirty = true;
        }
        if dirty {
            self.store.save(&st, "confirm:boot-recorded")?;
        }

        let state = st.slot(booted).state;
        if matches!(state, SlotState::Empty | SlotState::Invalid) {
            return Err(Error::SlotState {
                slot: booted,
                state,
                expected: "staged, trying or good (its content is not known to be complete)",
            });
        }
        let checks = self.health(booted, &st)?;
        let failed: Vec<String> = checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect();
        if failed.is_empty() {
            let newly_good = state != SlotState::Good;
            // Re-assert a good slot in the loader (e.g. after a fallback left the exhausted slot
            // primary), but never over a trial that was activated in this boot and waits for
            // its reboot.
            let trial_pending = st.activation.as_ref().is_some_and(|a| a.slot == other);
            if newly_good
                || (!trial_pending && (env.primary != booted || env.get(booted) != SlotBoot::Good))
            {
                self.boot.mark_good(booted)?;
                crate::barrier::hit("confirm:bootloader-good");
                self.layout.confirmed(booted)?;
            }
            if newly_good {
                st.transition(
                    booted,
                    SlotState::Good,
                    Event::Confirmed,
                    format!(
                        "{} health check(s) passed; slot {booted} is good",
                        checks.len()
                    ),
                );
                if st.activation.as_ref().is_some_and(|a| a.slot == booted) {
                    st.activation = None;
                }
                self.store.save(&st, "confirm:state-good")?;
            }
            return Ok(ConfirmReport {
                slot: booted,
                version: st.slot(booted).version.clone(),
                newly_good,
                checks,
                other_slot: other_decision.clone(),
            });
        }
        let failures = failed.join("; ");
        if state != SlotState::Good && st.slot(other).state == SlotState::Good {
            self.boot.mark_good(other)?;
            crate::barrier::hit("confirm:rollback-other-good");
            self.boot.mark_bad(booted)?;
            crate::barrier::hit("confirm:rollback-booted-bad");
            st.transition(
                booted,
                SlotState::Bad,
                Event::HealthFailed,
                format!("health checks failed ({failures}); rolled back to slot {other}"),
            );
            st.activation = None;
            self.store.save(&st, "confirm:rolled-back")?;
            return Err(Error::HealthCheck {
                slot: booted,
                failures,
                rolled_back: true,
            });
        }
        let why = if state == SlotState::Good {
            format!("health checks failed ({failures}); slot {booted} was already good, not rolling back")
        } else {
            format!("health checks failed ({failures}); slot {other} is not good, nothing to roll back to")
        };
        let (v, g) = (st.slot(booted).version.clone(), st.slot(booted).generation);
        st.log(booted, Event::HealthFailed, v, g, why);
        self.store.save(&st, "confirm:failure-recorded")?;
        Err(Error::HealthCheck {
            slot: booted,
            failures,
            rolled_back: false,
        })
    }

    fn health(&self, slot: Slot, st: &State) -> Result<Vec<CheckResult>> {
        let mut out = Vec::new();
        let version = st.slot(slot).version.clone();
        if self.cfg.builtin_health_check {
            out.push(self.rootfs_check(slot, version.as_deref()));
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
            match self.layout.is_rootfs_of(slot, m.dev, &m.source) {
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

fn boot_word(b: SlotBoot) -> &'static str {
    match b {
        SlotBoot::Good => "good",
        SlotBoot::Trying { .. } => "trying",
        SlotBoot::Bad => "bad",
    }
}
