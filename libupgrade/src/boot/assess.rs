//! The boot-assessment core: one pure function, [`assess`], decides everything `confirm` does
//! on a boot — from the state file, the bootloader's view (state and integrity of its records),
//! the observed boot (slot and boot id) and the health results — and returns the new state,
//! the ordered effects (loader writes and state saves, each with its write barrier) and the
//! [`Verdict`] with its reason. [`Updater::confirm_with`](crate::Updater::confirm_with) only
//! gathers the inputs and executes the effects in order.
//!
//! # The rules
//! 1. **Settle the other slot's trial.** If the other slot was activated in an earlier boot and
//!    we are not running it, the bootloader fell back: with the loader still counting it
//!    (`Trying`), it is marked bad with the tries it used ([`OtherSlot::FallbackTaken`]);
//!    otherwise the activation never reached the loader and the slot goes back to staged
//!    ([`OtherSlot::ActivationLost`]).
//! 2. **Record the boot** once per boot id: which slot, its state and the loader's view.
//! 3. **Assess the booted slot** — only a slot whose content is known complete (staged, trying
//!    or good) — from every health result (built-in, `health.d`, checks registered by the
//!    caller such as the agent's Node-Ready): all run *before* this single bless point.
//!    - all pass: the slot is blessed (state and loader good, [`Outcome::Blessed`]) or stays
//!      good ([`Outcome::Good`]; the loader is re-asserted, repairing damaged loader records,
//!      unless a trial activated in this boot waits for its reboot);
//!    - a check fails on a slot not yet blessed and the other slot is good: roll back
//!      ([`Outcome::RolledBack`]);
//!    - a check fails on a blessed slot, or with nothing to roll back to: recorded, nothing
//!      changes ([`Outcome::Unhealthy`]). **After a bless nothing rolls back silently**: only an
//!      explicit `rollback` leaves a good slot.
//!
//! 4. **Awaited checks.** An activation may name checks only its caller can run on the trial
//!    boot (the agent's Node-Ready; [`crate::updater::AwaitedChecks`]). Until they are reported
//!    the slot is not blessed ([`Outcome::Pending`]): it stays on trial, the loader keeps
//!    counting, and a failure of any check reported meanwhile rolls back as in rule 3.
//!
//! # Where the agent reads the verdict
//! Every assessment stores its [`Verdict`] in the state file (`State::verdict`);
//! [`Status::verdict`](crate::Status::verdict) returns it when it is about the running boot.
//! `verdict.other_slot` says whether a fallback was taken (and with which tries), so nobody
//! re-derives it from slot states.
//!
//! Timestamps in the new state come from the clock (`State::transition`); everything else is a
//! function of the inputs.

use bootconfig::{BootEnv, Integrity, Slot, SlotBoot};
use serde::{Deserialize, Serialize};

use crate::boot::health::CheckResult;
pub use crate::boot::verity_failure::VerityFailure;
use crate::state::{Event, SlotState, State, TransitionError};
pub use crate::state::{OtherSlot, Outcome, Verdict};

/// The boot being assessed, as observed at the edge (kernel command line, boot id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedBoot {
    /// `k3os.slot=` of the running kernel.
    pub slot: Slot,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// A dm-verity failure the initramfs recorded on the state partition before this boot
    /// (`<state_dir>/verity-failure`): named in the why of that slot's fallback.
    pub verity_failure: Option<VerityFailure>,
}

/// The bootloader as read now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderView {
    /// Loader name for the log (`grub`, `syslinux`).
    pub name: String,
    /// The state the loader will act on (from its intact record).
    pub env: BootEnv,
    /// Which records are damaged and which one is in use.
    pub integrity: Integrity,
}

/// A bootloader write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LoaderOp {
    /// Make the slot the loader's confirmed primary (its trial ends).
    MarkGood(Slot),
    /// Tell the loader never to boot the slot again until it is re-activated.
    MarkBad(Slot),
}

/// One effect, in the order it must happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Write the loader, then announce `barrier`.
    Loader {
        /// The write to make.
        op: LoaderOp,
        /// The name announced once it is durable (power-cut tests stop there).
        barrier: &'static str,
    },
    /// Tell the layout the slot is confirmed (e.g. k3OS symlinks).
    LayoutConfirmed(Slot),
    /// Save this state, then announce `barrier`.
    SaveState {
        /// The state to write to the state file.
        state: Box<State>,
        /// The name announced once it is durable (power-cut tests stop there).
        barrier: &'static str,
    },
}

impl Verdict {
    /// The booted slot is good after this assessment.
    pub fn healthy(&self) -> bool {
        matches!(self.outcome, Outcome::Blessed | Outcome::Good)
    }
}

/// The result of [`assess`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    /// The state after every effect (also the state of the last `SaveState`, if any).
    pub state: State,
    /// The effects to carry out, in order (empty: nothing to change).
    pub effects: Vec<Effect>,
    /// What this boot's assessment concluded.
    pub verdict: Verdict,
}

/// Whether the health checks are needed: the booted slot's content is known complete.
pub fn assessable(state: &State, booted: Slot) -> bool {
    !matches!(
        state.slot(booted).state,
        SlotState::Empty | SlotState::Invalid
    )
}

fn boot_word(b: SlotBoot) -> &'static str {
    match b {
        SlotBoot::Good => "good",
        SlotBoot::Trying { .. } => "trying",
        SlotBoot::Bad => "bad",
    }
}

/// What an assessment builds up as it goes: the new state, the effects in order, and whether
/// the state changed since the last save it planned.
struct Work {
    st: State,
    effects: Vec<Effect>,
    dirty: bool,
}

impl Work {
    /// Store the verdict and add the final save when anything changed. A verdict about the
    /// same boot accumulates: a fallback settled or loader damage seen by an earlier run in
    /// this boot, and a bless by it, stay in the verdict of the boot.
    fn finish(self, mut verdict: Verdict, barrier: &'static str) -> Assessment {
        let Work {
            mut st,
            mut effects,
            dirty,
        } = self;
        if let Some(prev) = st
            .verdict
            .as_ref()
            .filter(|p| p.boot_id == verdict.boot_id && p.slot == verdict.slot)
        {
            if verdict.other_slot.is_none() {
                verdict.other_slot = prev.other_slot.clone();
            }
            if verdict.loader_damage.is_empty() {
                verdict.loader_damage = prev.loader_damage.clone();
            }
            if verdict.outcome == Outcome::Good && prev.outcome == Outcome::Blessed {
                verdict.outcome = Outcome::Blessed;
            }
        }
        let changed = st.verdict.as_ref() != Some(&verdict);
        st.verdict = Some(verdict.clone());
        if dirty || changed {
            effects.push(Effect::SaveState {
                state: Box::new(st.clone()),
                barrier,
            });
        }
        Assessment {
            state: st,
            effects,
            verdict,
        }
    }
}

/// Decide one boot's assessment; see the module docs for the rules. Every slot change it
/// decides is an edge of the slot lifecycle; one that is not (a state file no release writes)
/// is refused with the edge it lacks, and nothing is carried out.
pub fn assess(
    state: &State,
    loader: &LoaderView,
    boot: &ObservedBoot,
    checks: &[CheckResult],
) -> Result<Assessment, TransitionError> {
    let booted = boot.slot;
    let st = state.clone();
    // A first run bootstraps the booted slot in memory (Updater::load): save it.
    let dirty = st.slot(booted).since != 0
        && st
            .history
            .last()
            .is_some_and(|d| d.event == Event::Bootstrap);
    let mut w = Work {
        st,
        effects: Vec::new(),
        dirty,
    };
    // 1. The other slot's trial.
    let other_slot = settle_other_trial(&mut w, loader, boot)?;
    // 2. One `booted` record per boot.
    record_boot(&mut w, loader, boot);
    // 3. The booted slot.
    let state_now = w.st.slot(booted).state;
    let mut verdict = Verdict {
        boot_id: boot.boot_id.clone(),
        slot: booted,
        version: w.st.slot(booted).version.clone(),
        outcome: Outcome::Good,
        reason: String::new(),
        other_slot,
        checks: checks.to_vec(),
        loader_damage: loader.integrity.damaged.clone(),
    };
    if !assessable(&w.st, booted) {
        verdict.outcome = Outcome::NotAssessable { state: state_now };
        verdict.reason = format!(
            "slot {booted} is {state_now}: its content is not known to be complete; not assessed"
        );
        return Ok(w.finish(verdict, "confirm:boot-recorded"));
    }
    if w.dirty {
        w.effects.push(Effect::SaveState {
            state: Box::new(w.st.clone()),
            barrier: "confirm:boot-recorded",
        });
        w.dirty = false;
    }
    // A rollback decided earlier in this boot stands: checks reported later (the agent's
    // Node-Ready after `await-bless` gave up on it) do not undo it.
    if let Some(prev) = state.verdict.as_ref().filter(|p| {
        p.boot_id == boot.boot_id
            && p.slot == booted
            && matches!(p.outcome, Outcome::RolledBack { .. })
    }) {
        if state_now == SlotState::Bad {
            verdict.outcome = prev.outcome.clone();
            verdict.reason = prev.reason.clone();
            verdict.checks = prev.checks.clone();
            return Ok(w.finish(verdict, "confirm:rolled-back"));
        }
    }
    judge_checks(w, state, loader, boot, verdict)
}

/// Step 1: settle a trial of the other slot activated in an earlier boot (the loader fell back
/// from it, or the activation never reached the loader).
fn settle_other_trial(
    w: &mut Work,
    loader: &LoaderView,
    boot: &ObservedBoot,
) -> Result<Option<OtherSlot>, TransitionError> {
    let (booted, other) = (boot.slot, boot.slot.other());
    let Some(act) = w.st.activation.clone() else {
        return Ok(None);
    };
    if act.slot != other || act.boot_id == boot.boot_id {
        return Ok(None);
    }
    let mut other_slot = None;
    if w.st.slot(other).state == SlotState::Trying {
        match loader.env.get(other) {
            SlotBoot::Trying { tries_left } => {
                let used = act.tries.saturating_sub(tries_left);
                w.st.transition(other, Event::FallbackTaken,
                    format!(
                        "slot {other} did not confirm: {} booted {booted} after {used} of {} tries of {other} ({tries_left} left){}",
                        loader.name, act.tries,
                        crate::boot::verity_failure::why(boot.verity_failure.as_ref(), other)
                    ),
                )?;
                w.effects.push(Effect::Loader {
                    op: LoaderOp::MarkBad(other),
                    barrier: "confirm:fallback-marked-bad",
                });
                other_slot = Some(OtherSlot::FallbackTaken {
                    slot: other,
                    used,
                    tries: act.tries,
                });
            }
            _ => {
                w.st.transition(other, Event::ActivationLost,
                    format!("activation of slot {other} never reached {} (interrupted?); it stays staged", loader.name),
                )?;
                other_slot = Some(OtherSlot::ActivationLost { slot: other });
            }
        }
    }
    w.st.activation = None;
    w.dirty = true;
    Ok(other_slot)
}

/// Step 2: one `booted` record per boot.
fn record_boot(w: &mut Work, loader: &LoaderView, boot: &ObservedBoot) {
    let booted = boot.slot;
    if w.st.last_boot_id.as_deref() == Some(boot.boot_id.as_str()) {
        return;
    }
    let rec = w.st.slot(booted);
    let why = match loader.env.get(booted) {
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
    w.st.log(booted, Event::Booted, v, g, why);
    w.st.last_boot_id = Some(boot.boot_id.clone());
    w.dirty = true;
}

/// Step 3, the checks: pending while an awaited check is not reported, blessed when all
/// passed, rolled back (or only recorded) when one failed.
fn judge_checks(
    w: Work,
    state: &State,
    loader: &LoaderView,
    boot: &ObservedBoot,
    mut verdict: Verdict,
) -> Result<Assessment, TransitionError> {
    let booted = boot.slot;
    let state_now = w.st.slot(booted).state;
    let checks = &verdict.checks;
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| format!("{}: {}", c.name, c.detail))
        .collect();
    // Checks the activation awaits from its caller (the agent's Node-Ready) that were not
    // reported: no bless yet, whatever else passed. A failure reported by any check is
    // decisive at once (below).
    let awaited =
        w.st.activation
            .as_ref()
            .filter(|a| a.slot == booted && state_now != SlotState::Good)
            .and_then(|a| a.awaits.as_ref());
    let waiting_for: Vec<String> = awaited
        .iter()
        .flat_map(|a| a.names.iter())
        .filter(|n| !checks.iter().any(|c| &c.name == *n))
        .cloned()
        .collect();
    if let Some(a) = awaited.filter(|_| failed.is_empty() && !waiting_for.is_empty()) {
        let within_secs = a.within_secs;
        verdict.reason = format!(
            "{} health check(s) passed; slot {booted} stays on trial until {} is reported (within {within_secs} s of the boot)",
            checks.len(),
            waiting_for.join(", ")
        );
        verdict.outcome = Outcome::Pending {
            waiting_for,
            within_secs,
        };
        return Ok(w.finish(verdict, "confirm:pending-recorded"));
    }
    if failed.is_empty() {
        return bless(w, loader, boot, verdict);
    }
    fail(w, state, loader, boot, verdict, &failed.join("; "))
}

/// A check failed: roll back to the other slot when it is good and the booted one is not yet,
/// else record the failure (once per distinct reason in a boot).
fn fail(
    mut w: Work,
    state: &State,
    loader: &LoaderView,
    boot: &ObservedBoot,
    mut verdict: Verdict,
    failures: &str,
) -> Result<Assessment, TransitionError> {
    let (booted, other) = (boot.slot, boot.slot.other());
    let state_now = w.st.slot(booted).state;
    if state_now != SlotState::Good && w.st.slot(other).state == SlotState::Good {
        let reason = format!("health checks failed ({failures}); rolled back to slot {other}");
        // Already rolled back (by an earlier run in this boot): nothing more to do.
        let done = state_now == SlotState::Bad
            && loader.env.get(booted) == SlotBoot::Bad
            && loader.env.next_boot() == other;
        if !done {
            w.effects.push(Effect::Loader {
                op: LoaderOp::MarkGood(other),
                barrier: "confirm:rollback-other-good",
            });
            w.effects.push(Effect::Loader {
                op: LoaderOp::MarkBad(booted),
                barrier: "confirm:rollback-booted-bad",
            });
            w.st.transition(booted, Event::HealthFailed, reason.clone())?;
            w.st.activation = None;
        }
        verdict.outcome = Outcome::RolledBack { to: other };
        verdict.reason = reason;
        w.dirty = !done;
        return Ok(w.finish(verdict, "confirm:rolled-back"));
    }
    let reason = if state_now == SlotState::Good {
        format!(
            "health checks failed ({failures}); slot {booted} was already good, not rolling back"
        )
    } else {
        format!(
            "health checks failed ({failures}); slot {other} is not good, nothing to roll back to"
        )
    };
    let (v, g) = (
        w.st.slot(booted).version.clone(),
        w.st.slot(booted).generation,
    );
    // Logged once per distinct failure, not on every retry of the same checks in one boot.
    let repeated = state
        .verdict
        .as_ref()
        .is_some_and(|p| p.boot_id == boot.boot_id && p.reason == reason);
    if !repeated {
        w.st.log(booted, Event::HealthFailed, v, g, reason.clone());
    }
    verdict.outcome = Outcome::Unhealthy;
    verdict.reason = reason;
    w.dirty = !repeated;
    Ok(w.finish(verdict, "confirm:failure-recorded"))
}

/// Every check passed: the booted slot is (or stays) good, re-asserted in the loader when its
/// records are stale.
fn bless(
    mut w: Work,
    loader: &LoaderView,
    boot: &ObservedBoot,
    mut verdict: Verdict,
) -> Result<Assessment, TransitionError> {
    let (booted, other) = (boot.slot, boot.slot.other());
    let newly_good = w.st.slot(booted).state != SlotState::Good;
    // Re-assert a good slot in the loader (after a fallback left the exhausted slot primary, or
    // to rewrite damaged records), but never over a trial that was activated in this boot and
    // waits for its reboot.
    let trial_pending = w.st.activation.as_ref().is_some_and(|a| a.slot == other);
    let env = &loader.env;
    let loader_stale = env.primary != booted
        || env.get(booted) != SlotBoot::Good
        || !loader.integrity.damaged.is_empty();
    if newly_good || (!trial_pending && loader_stale) {
        w.effects.push(Effect::Loader {
            op: LoaderOp::MarkGood(booted),
            barrier: "confirm:bootloader-good",
        });
        w.effects.push(Effect::LayoutConfirmed(booted));
    }
    let reason = format!(
        "{} health check(s) passed; slot {booted} is good",
        verdict.checks.len()
    );
    if newly_good {
        w.st.transition(booted, Event::Confirmed, reason.clone())?;
        if w.st.activation.as_ref().is_some_and(|a| a.slot == booted) {
            w.st.activation = None;
        }
        w.dirty = true;
        verdict.outcome = Outcome::Blessed;
    }
    verdict.reason = reason;
    Ok(w.finish(verdict, "confirm:state-good"))
}
