//! The updater's own record of both slots: what is in each, what state it is in, and the log of
//! every boot decision with the generation it concerned, so `slot status` can say *why* a slot
//! booted (tries left, fallback taken, checks failed).
//!
//! The bootloader's files say what boots next; this file says what each slot holds. It lives
//! on the state partition as JSON and is replaced atomically (temp, fsync, rename, fsync dir).
//! Slot lifecycle:
//!
//! ```text
//!  Empty ──stage──▶ Invalid ──verified──▶ Staged ──activate──▶ Trying ──confirm ok──▶ Good
//!                     ▲  (write failed: stays Invalid)            │
//!                     └──────── next stage ◀── Bad ◀─ checks fail / tries run out / rollback
//! ```

use bootconfig::{Damage, Slot};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// File name of the state file inside the state directory.
pub const STATE_FILE: &str = "state.json";
/// The state file's format. Format 1 is what v0.1.0 wrote, and both slots of a node may run
/// different releases that read and write the same file (a v0.2.0 trial falls back to a v0.1.0
/// slot), so format 1 only grows in ways every format-1 reader accepts: new fields are
/// optional (serde defaults; older readers skip unknown fields) and no enum gains a variant
/// (an older reader would refuse the whole file). `tests/integration/state_formats.rs` holds
/// the current types to that against v0.1.0's own output. A change that cannot follow these rules bumps
/// the number and is rolled out in two releases (the first reads both and writes the old).
const FORMAT: u32 = 1;
/// Decisions kept in the log (oldest dropped first).
pub(crate) const HISTORY: usize = 64;
/// Releases that failed here kept in [`State::failed`] (the oldest failure dropped first).
pub const FAILED_KEPT: usize = 16;
/// Bytes of a failure's reason kept in [`FailedRelease::why`].
const WHY_MAX: usize = 512;

/// What a slot holds, as far as the updater knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SlotState {
    /// Never written by us.
    Empty,
    /// Being written, or a write failed: its content must not be trusted.
    Invalid,
    /// Completely written and verified; not yet tried.
    Staged,
    /// Activated: the bootloader is trying it.
    Trying,
    /// Booted and passed its health checks.
    Good,
    /// Failed to boot, failed its checks, or was rolled back from.
    Bad,
}

impl fmt::Display for SlotState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SlotState::Empty => "empty",
            SlotState::Invalid => "invalid",
            SlotState::Staged => "staged",
            SlotState::Trying => "trying",
            SlotState::Good => "good",
            SlotState::Bad => "bad",
        })
    }
}

/// One slot's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRecord {
    /// Where the slot is in its lifecycle.
    pub state: SlotState,
    /// Version of the release the slot holds or is being written with (its manifest's; at
    /// bootstrap, the installed release file's); None for an empty slot or when unknown.
    pub version: Option<String>,
    /// That release's generation (its manifest's monotonic id); None as for `version`.
    pub generation: Option<u64>,
    /// sha256 of the manifest that was staged (identifies the exact release).
    pub manifest_sha256: Option<String>,
    /// Unix seconds of the last state change.
    pub since: u64,
    /// How the bytes of the release staged into this slot were obtained, set when its stage
    /// completes; None before then, for bootstrapped slots, and in state written before v0.2.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<TransferStats>,
    /// The http(s) URL of the manifest this slot's release was staged from (the reachability
    /// check's default endpoint, [`crate::boot::reach`]); None for local sources and bundles, and in
    /// state written before v0.2.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged_from: Option<String>,
}

/// Bytes of one update by origin: `fetched` over the network (all attempts that recorded it),
/// `reused` copied from what the node already held (the running slot; chunks an interrupted
/// attempt left in the target count as fetched by that attempt), out of `total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TransferStats {
    /// Bytes fetched over the network.
    pub fetched: u64,
    /// Bytes copied from what the node already held.
    pub reused: u64,
    /// Bytes of the whole update.
    pub total: u64,
}

impl SlotRecord {
    /// The record of a slot never written by us (the record of both slots on a fresh node).
    pub fn empty() -> SlotRecord {
        SlotRecord {
            state: SlotState::Empty,
            version: None,
            generation: None,
            manifest_sha256: None,
            since: 0,
            transfer: None,
            staged_from: None,
        }
    }
}

/// What kind of decision was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Event {
    /// First run: the booted slot recorded as the installed, good system (from its release file).
    Bootstrap,
    /// A stage began writing into the slot, which is invalid until verified.
    StageStarted,
    /// The slot's release is completely written and verified.
    Staged,
    /// A stage into the slot failed (the error in `why`); only logged, the slot stays invalid.
    StageFailed,
    /// The slot was handed to the bootloader for a trial.
    Activated,
    /// The booted slot passed its health checks and was blessed.
    Confirmed,
    /// The booted slot failed a health check (logged once per distinct failure in a boot).
    HealthFailed,
    /// The bootloader booted the other slot while this one was on trial: its trial failed.
    FallbackTaken,
    /// The slot's activation never reached the bootloader: back to staged.
    ActivationLost,
    /// The booted slot was rolled back from; the other slot boots next.
    RolledBack,
    /// The slot was marked bad on request (not the booted slot: that one is rolled back).
    MarkedBad,
    /// The first `confirm` of a boot: which slot booted and how; only logged.
    Booted,
}

impl Event {
    /// The edge of the slot lifecycle this event is: the state it moves a slot to and the
    /// states it may leave. `None` for events that only log ([`Event::StageFailed`],
    /// [`Event::Booted`]): they never change a slot's state.
    pub fn edge(self) -> Option<(SlotState, &'static [SlotState])> {
        use SlotState::*;
        const ANY: &[SlotState] = &[Empty, Invalid, Staged, Trying, Good, Bad];
        const NOT_GOOD: &[SlotState] = &[Empty, Invalid, Staged, Trying, Bad];
        Some(match self {
            Event::Bootstrap => (Good, &[Empty]),
            Event::StageStarted => (Invalid, ANY),
            Event::Staged => (Staged, &[Invalid]),
            Event::Activated => (Trying, &[Staged, Good]),
            Event::Confirmed => (Good, NOT_GOOD),
            Event::HealthFailed => (Bad, NOT_GOOD),
            Event::FallbackTaken => (Bad, &[Trying]),
            Event::ActivationLost => (Staged, &[Trying]),
            Event::RolledBack | Event::MarkedBad => (Bad, ANY),
            Event::StageFailed | Event::Booted => return None,
        })
    }
}

/// A transition the slot lifecycle has no edge for: `event` may not leave the slot's state.
/// Nothing was changed; the caller's bookkeeping is wrong and its operation stops here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("slot {slot}: {event:?} cannot leave {from:?} (allowed from {allowed:?})")]
pub struct TransitionError {
    /// The slot whose record was asked to move.
    pub slot: Slot,
    /// The event that was asked for.
    pub event: Event,
    /// The slot's state, which the event may not leave.
    pub from: SlotState,
    /// The states the event may leave ([`Event::edge`]).
    pub allowed: &'static [SlotState],
}

/// A logged decision: when, about which slot and generation, what and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Unix seconds when it was taken.
    pub at: u64,
    /// The slot it concerned.
    pub slot: Slot,
    /// What was decided.
    pub event: Event,
    /// The version of the slot's release it concerned; None when the slot held none known.
    pub version: Option<String>,
    /// That release's generation; None as for `version`.
    pub generation: Option<u64>,
    /// Why, in one sentence for people (shown by `slot status`).
    pub why: String,
}

/// The whole state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// The file's format number (1 since v0.1.0); `load` refuses any other.
    pub format: u32,
    /// Each slot's record; both slots are always present (`load` refuses a file without one).
    pub slots: BTreeMap<Slot, SlotRecord>,
    /// The decision log, oldest first; only the newest 64 are kept.
    pub history: Vec<Decision>,
    /// A slot handed to the bootloader for trial and not yet settled; None when no trial is
    /// pending.
    #[serde(default)]
    pub activation: Option<Activation>,
    /// The boot in which `confirm` last ran (one `booted` decision per boot); None before the
    /// first `confirm`.
    #[serde(default)]
    pub last_boot_id: Option<String>,
    /// The last boot assessment's verdict (see [`crate::assess`]); None before the first
    /// assessment and in state written before v0.2.0.
    #[serde(default)]
    pub verdict: Option<Verdict>,
    /// Each release that failed on this node and has not run here since (oldest first, at
    /// most [`FAILED_KEPT`]): what [`crate::rollout::decide_retry`] holds back. Kept apart
    /// from the slots because the next stage overwrites the bad slot's record. Absent in state
    /// written before v0.2.0 and by a v0.1.0 slot (which drops fields it does not know):
    /// [`State::adopt_failed_slots`] rebuilds it from the bad slots then.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<FailedRelease>,
}

/// A release that failed on this node: a trial boot whose checks failed, a fallback the
/// loader took, or a rollback (not a slot marked bad by hand or for a withdrawal).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedRelease {
    /// The release's version.
    pub version: String,
    /// Its generation (None: unknown); a release of the same version and another generation
    /// is another release.
    pub generation: Option<u64>,
    /// Attempts that failed here (1 after the first failure).
    pub attempts: u32,
    /// Unix seconds of the last failure.
    pub at: u64,
    /// Why the last attempt failed, as the decision log says it (at most 512 bytes).
    pub why: String,
}

impl FailedRelease {
    /// Whether this record is about the release `version` of `generation` (an unknown
    /// generation on either side matches any).
    pub fn is(&self, version: &str, generation: Option<u64>) -> bool {
        self.version == version
            && match (self.generation, generation) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

/// The newest record in `failed` of the release `version` of `generation` failing on this
/// node ([`FailedRelease::is`]: an unknown generation on either side matches any): the one
/// matching of a node's failure records, which the CLI's `upgrade` and the agent both hold
/// a release back by, so a release republished under the same version with another
/// generation is never held back by the old one's failure.
pub fn failure_of<'a>(
    failed: &'a [FailedRelease],
    version: &str,
    generation: Option<u64>,
) -> Option<&'a FailedRelease> {
    failed.iter().rev().find(|f| f.is(version, generation))
}

/// `why` cut at a character boundary to at most [`WHY_MAX`] bytes.
fn cut(why: &str) -> String {
    let mut end = why.len().min(WHY_MAX);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    why[..end].to_string()
}

impl Event {
    /// Whether moving a slot to bad by this event is a failure of the release it holds (a
    /// trial or a run that failed), as opposed to a slot marked bad on request.
    fn is_failure(self) -> bool {
        matches!(
            self,
            Event::HealthFailed | Event::FallbackTaken | Event::RolledBack
        )
    }
}

impl Default for State {
    fn default() -> Self {
        let mut slots = BTreeMap::new();
        for s in Slot::ALL {
            slots.insert(s, SlotRecord::empty());
        }
        State {
            format: FORMAT,
            slots,
            history: Vec::new(),
            activation: None,
            last_boot_id: None,
            verdict: None,
            failed: Vec::new(),
        }
    }
}

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl State {
    /// The record of slot `s`.
    pub fn slot(&self, s: Slot) -> &SlotRecord {
        self.slots.get(&s).expect("both slots always present")
    }

    /// The record of slot `s`, to change (an empty one is added if it was missing).
    pub fn slot_mut(&mut self, s: Slot) -> &mut SlotRecord {
        self.slots.entry(s).or_insert_with(SlotRecord::empty)
    }

    /// Set a slot's state and log why. An event that only logs ([`Event::edge`] is `None`)
    /// leaves the state as it is and is logged with the slot's version. An event that may not
    /// leave the slot's current state changes nothing and is refused with the edge it lacks.
    pub fn transition(
        &mut self,
        s: Slot,
        event: Event,
        why: impl Into<String>,
    ) -> Result<(), TransitionError> {
        let rec = self.slot_mut(s);
        if let Some((state, from)) = event.edge() {
            if !from.contains(&rec.state) {
                return Err(TransitionError {
                    slot: s,
                    event,
                    from: rec.state,
                    allowed: from,
                });
            }
            let was = rec.state;
            rec.state = state;
            rec.since = now();
            let (version, generation) = (rec.version.clone(), rec.generation);
            let why = why.into();
            match &version {
                Some(v) if event.is_failure() && was != SlotState::Bad => {
                    self.record_failure(v, generation, now(), &why);
                }
                Some(v) if event == Event::Confirmed => {
                    self.failed.retain(|f| !f.is(v, generation));
                }
                _ => {}
            }
            self.log(s, event, version, generation, why);
            return Ok(());
        }
        let (version, generation) = (rec.version.clone(), rec.generation);
        self.log(s, event, version, generation, why);
        Ok(())
    }

    /// The record of the release `version` of `generation` failing here, if it did
    /// ([`failure_of`]).
    pub fn failed_for(&self, version: &str, generation: Option<u64>) -> Option<&FailedRelease> {
        failure_of(&self.failed, version, generation)
    }

    /// Count one more failed attempt of `version` at `at`, for `why`.
    fn record_failure(&mut self, version: &str, generation: Option<u64>, at: u64, why: &str) {
        match self
            .failed
            .iter_mut()
            .rev()
            .find(|f| f.is(version, generation))
        {
            Some(f) => {
                f.attempts = f.attempts.saturating_add(1);
                f.at = at;
                f.why = cut(why);
                f.generation = f.generation.or(generation);
            }
            None => self.failed.push(FailedRelease {
                version: version.to_string(),
                generation,
                attempts: 1,
                at,
                why: cut(why),
            }),
        }
        self.failed.sort_by_key(|f| f.at);
        if self.failed.len() > FAILED_KEPT {
            let drop = self.failed.len() - FAILED_KEPT;
            self.failed.drain(..drop);
        }
    }

    /// The migration of state written without [`State::failed`] (before v0.2.0, or rewritten
    /// by a v0.1.0 slot after a fallback, which drops the field): a bad slot whose newest
    /// decision is a failure of its release ([`Event::HealthFailed`], `FallbackTaken`,
    /// `RolledBack`) and that no record names yet gets one, with one attempt, that
    /// decision's time and reason. Applied by every load; kept at the next save.
    pub fn adopt_failed_slots(&mut self) {
        for s in Slot::ALL {
            let rec = self.slot(s);
            let Some(version) = rec.version.clone().filter(|_| rec.state == SlotState::Bad) else {
                continue;
            };
            let generation = rec.generation;
            let Some(d) = self.last_decision(s).filter(|d| d.event.is_failure()) else {
                continue;
            };
            if self.failed_for(&version, generation).is_none() {
                let (at, why) = (d.at, d.why.clone());
                self.record_failure(&version, generation, at, &why);
            }
        }
    }

    /// Append a decision to the log.
    pub fn log(
        &mut self,
        slot: Slot,
        event: Event,
        version: Option<String>,
        generation: Option<u64>,
        why: impl Into<String>,
    ) {
        let why = why.into();
        log::info!("slot {slot} {event:?} (version {version:?}, generation {generation:?}): {why}");
        self.history.push(Decision {
            at: now(),
            slot,
            event,
            version,
            generation,
            why,
        });
        if self.history.len() > HISTORY {
            let drop = self.history.len() - HISTORY;
            self.history.drain(..drop);
        }
    }

    /// The newest decision about `slot`.
    pub fn last_decision(&self, slot: Slot) -> Option<&Decision> {
        self.history.iter().rev().find(|d| d.slot == slot)
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    /// The check's name (a check script's file name, or a built-in's such as `reachable`).
    pub name: String,
    /// Whether it passed.
    pub ok: bool,
    /// What it said: the last lines of its output, and the exit status or why it failed.
    pub detail: String,
}

/// A pending activation: which slot, and in which boot it was activated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activation {
    /// The slot on trial.
    pub slot: Slot,
    /// The kernel boot id of the boot in which it was activated (empty if unreadable).
    pub boot_id: String,
    /// Boot tries the bootloader was given (the configured tries, capped at the loader's maximum).
    pub tries: u8,
    /// Unix seconds of the activation.
    pub at: u64,
    /// Checks the activating caller will report on the trial boot, before which the slot is
    /// not blessed (see [`AwaitedChecks`]). None: the boot-time `confirm` blesses on its own;
    /// always None in state written before v0.2.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaits: Option<AwaitedChecks>,
}

/// Health checks that only the activating caller can run on the trial boot — the agent's
/// Node-Ready, which needs the cluster — and that must pass before the single bless point,
/// like a systemd unit ordered before `boot-complete.target`. Until they are reported, the
/// boot-time `confirm` leaves the slot on trial ([`crate::boot::assess::Outcome::Pending`]): a reboot
/// then costs a try, and `slot await-bless` rolls back when they are not reported within
/// `within_secs` of the boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwaitedChecks {
    /// Check names, as the caller's health checks report them (e.g. `node-ready`).
    pub names: Vec<String>,
    /// How long after the trial boot they may take before they count as failed.
    pub within_secs: u64,
}

/// What was decided about the other slot's pending trial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum OtherSlot {
    /// The loader fell back from `slot` after `used` of `tries` tries.
    FallbackTaken {
        /// The slot that was on trial.
        slot: Slot,
        /// Tries the loader used.
        used: u8,
        /// Tries it was given.
        tries: u8,
    },
    /// The activation of `slot` never reached the loader; it stays staged.
    ActivationLost {
        /// The slot that was activated.
        slot: Slot,
    },
}

impl OtherSlot {
    /// The slot whose trial was settled.
    pub fn slot(&self) -> Slot {
        match self {
            OtherSlot::FallbackTaken { slot, .. } | OtherSlot::ActivationLost { slot } => *slot,
        }
    }
}

/// What became of the booted slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Outcome {
    /// All checks passed: newly marked good (the single bless point).
    Blessed,
    /// All checks passed; it already was good.
    Good,
    /// A check failed before the bless; the loader boots `to` next.
    RolledBack {
        /// The slot the loader boots next.
        to: Slot,
    },
    /// A check failed and nothing changes (the slot was already blessed, or the other slot is
    /// not good to roll back to).
    Unhealthy,
    /// The slot's content is not known to be complete (empty or invalid): not assessed.
    NotAssessable {
        /// The booted slot's recorded state.
        state: SlotState,
    },
    /// Every check run so far passed, but checks its activation awaits (see
    /// [`crate::updater::AwaitedChecks`]) were not reported: still on trial, not blessed.
    Pending {
        /// Names of the awaited checks not yet reported.
        waiting_for: Vec<String>,
        /// Seconds after the trial boot they may take ([`AwaitedChecks::within_secs`]).
        within_secs: u64,
    },
}

/// The verdict on one boot: consumed by `confirm`'s caller and by the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The kernel boot id of the boot assessed.
    pub boot_id: String,
    /// The booted slot.
    pub slot: Slot,
    /// The booted slot's recorded version; None when unknown.
    pub version: Option<String>,
    /// What became of the booted slot.
    pub outcome: Outcome,
    /// Why, in one sentence (also logged in the state file's history).
    pub reason: String,
    /// The other slot's trial, settled in this boot; None when there was none to settle.
    pub other_slot: Option<OtherSlot>,
    /// Every health check's result in this assessment, in the order they ran.
    pub checks: Vec<CheckResult>,
    /// Damaged loader records seen in this boot (repaired by a loader write of the assessment
    /// when the slot is good and no trial is pending).
    pub loader_damage: Vec<Damage>,
}

pub mod ledger;
pub mod store;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_that_moves_a_slot_names_its_edge() {
        for e in [
            Event::Bootstrap,
            Event::StageStarted,
            Event::Staged,
            Event::Activated,
            Event::Confirmed,
            Event::HealthFailed,
            Event::FallbackTaken,
            Event::ActivationLost,
            Event::RolledBack,
            Event::MarkedBad,
        ] {
            let (to, from) = e.edge().unwrap();
            assert!(!from.is_empty(), "{e:?}");
            assert_ne!(
                to,
                SlotState::Empty,
                "{e:?}: nothing moves a slot back to empty"
            );
        }
        assert!(Event::Booted.edge().is_none() && Event::StageFailed.edge().is_none());
    }

    #[test]
    fn a_transition_from_a_state_it_may_not_leave_is_caught() {
        let mut st = State::default();
        let before = st.clone();
        let e = st
            .transition(Slot::B, Event::Staged, "staged without a write")
            .unwrap_err();
        assert!(e.to_string().contains("cannot leave Empty"), "{e}");
        assert_eq!(
            e,
            TransitionError {
                slot: Slot::B,
                event: Event::Staged,
                from: SlotState::Empty,
                allowed: &[SlotState::Invalid],
            }
        );
        assert_eq!(st, before, "a refused transition changes nothing");
    }

    const STATES: [SlotState; 6] = [
        SlotState::Empty,
        SlotState::Invalid,
        SlotState::Staged,
        SlotState::Trying,
        SlotState::Good,
        SlotState::Bad,
    ];

    /// The lifecycle, written out independently of [`Event::edge`]: event, the state it moves
    /// a slot to (None: it only logs) and the states it may leave.
    fn table() -> Vec<(Event, Option<SlotState>, Vec<SlotState>)> {
        use SlotState::*;
        let not_good = vec![Empty, Invalid, Staged, Trying, Bad];
        vec![
            (Event::Bootstrap, Some(Good), vec![Empty]),
            (Event::StageStarted, Some(Invalid), STATES.to_vec()),
            (Event::Staged, Some(Staged), vec![Invalid]),
            (Event::StageFailed, None, STATES.to_vec()),
            (Event::Activated, Some(Trying), vec![Staged, Good]),
            (Event::Confirmed, Some(Good), not_good.clone()),
            (Event::HealthFailed, Some(Bad), not_good),
            (Event::FallbackTaken, Some(Bad), vec![Trying]),
            (Event::ActivationLost, Some(Staged), vec![Trying]),
            (Event::RolledBack, Some(Bad), STATES.to_vec()),
            (Event::MarkedBad, Some(Bad), STATES.to_vec()),
            (Event::Booted, None, STATES.to_vec()),
        ]
    }

    /// Every (event, state) pair: an edge of the table is taken and logged; any other pair is
    /// refused as a value and leaves the state file as it was; a log-only event logs and keeps
    /// the state. Checked through return values only, as a release build sees them.
    #[test]
    fn every_edge_is_taken_and_every_other_pair_refused() {
        for (event, to, allowed) in table() {
            for from in STATES {
                let mut st = State::default();
                let rec = st.slot_mut(Slot::A);
                rec.state = from;
                rec.version = Some("v2".into());
                let before = st.clone();
                let got = st.transition(Slot::A, event, "table");
                if allowed.contains(&from) {
                    assert_eq!(got, Ok(()), "{event:?} from {from:?}");
                    assert_eq!(st.slot(Slot::A).state, to.unwrap_or(from), "{event:?}");
                    let d = st.last_decision(Slot::A).expect("logged");
                    assert_eq!(
                        (d.event, d.version.as_deref(), st.history.len()),
                        (event, Some("v2"), 1),
                        "{event:?} from {from:?}"
                    );
                } else {
                    let e = got.expect_err("an edge the table lacks is refused");
                    assert_eq!((e.slot, e.event, e.from), (Slot::A, event, from));
                    assert_eq!(e.allowed, allowed.as_slice(), "{event:?}");
                    assert_eq!(st, before, "{event:?} from {from:?} changed the state");
                }
            }
            assert_eq!(
                event.edge().map(|(t, f)| (t, f.to_vec())),
                to.map(|t| (t, allowed.clone())),
                "{event:?}: Event::edge and the table differ"
            );
        }
    }
}
