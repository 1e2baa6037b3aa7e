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
/// (an older reader would refuse the whole file). `tests/state_formats.rs` holds the current
/// types to that against v0.1.0's own output. A change that cannot follow these rules bumps
/// the number and is rolled out in two releases (the first reads both and writes the old).
const FORMAT: u32 = 1;
/// Decisions kept in the log (oldest dropped first).
pub(crate) const HISTORY: usize = 64;

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
    pub state: SlotState,
    pub version: Option<String>,
    pub generation: Option<u64>,
    /// sha256 of the manifest that was staged (identifies the exact release).
    pub manifest_sha256: Option<String>,
    /// Unix seconds of the last state change.
    pub since: u64,
    /// How the bytes of the release staged into this slot were obtained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<TransferStats>,
    /// The http(s) URL of the manifest this slot's release was staged from (the reachability
    /// check's default endpoint, [`crate::reach`]); None for local sources and bundles, and in
    /// state written before v0.2.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged_from: Option<String>,
}

/// Bytes of one update by origin: `fetched` over the network (all attempts that recorded it),
/// `reused` copied from what the node already held (the running slot; chunks an interrupted
/// attempt left in the target count as fetched by that attempt), out of `total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TransferStats {
    pub fetched: u64,
    pub reused: u64,
    pub total: u64,
}

impl SlotRecord {
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
    Bootstrap,
    StageStarted,
    Staged,
    StageFailed,
    Activated,
    Confirmed,
    HealthFailed,
    FallbackTaken,
    ActivationLost,
    RolledBack,
    MarkedBad,
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

/// A logged decision: when, about which slot and generation, what and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub at: u64,
    pub slot: Slot,
    pub event: Event,
    pub version: Option<String>,
    pub generation: Option<u64>,
    pub why: String,
}

/// The whole state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub format: u32,
    pub slots: BTreeMap<Slot, SlotRecord>,
    pub history: Vec<Decision>,
    /// A slot handed to the bootloader for trial and not yet settled.
    #[serde(default)]
    pub activation: Option<Activation>,
    /// The boot in which `confirm` last ran (one `booted` decision per boot).
    #[serde(default)]
    pub last_boot_id: Option<String>,
    /// The last boot assessment's verdict (see [`crate::assess`]).
    #[serde(default)]
    pub verdict: Option<Verdict>,
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
    pub fn slot(&self, s: Slot) -> &SlotRecord {
        self.slots.get(&s).expect("both slots always present")
    }

    pub fn slot_mut(&mut self, s: Slot) -> &mut SlotRecord {
        self.slots.entry(s).or_insert_with(SlotRecord::empty)
    }

    /// Set a slot's state and log why.
    pub fn transition(&mut self, s: Slot, event: Event, why: impl Into<String>) {
        let rec = self.slot_mut(s);
        let Some((state, from)) = event.edge() else {
            unreachable!("{event:?} only logs; use State::log");
        };
        // A bookkeeping slip must not strand a node: caught by the tests (debug builds), logged
        // in a release build, where the transition still happens.
        debug_assert!(
            from.contains(&rec.state),
            "slot {s}: {event:?} cannot leave {:?} (allowed from {from:?})",
            rec.state
        );
        if !from.contains(&rec.state) {
            log::error!(
                "slot {s}: {event:?} from {:?}, which it should not leave (allowed from {from:?})",
                rec.state
            );
        }
        rec.state = state;
        rec.since = now();
        let (version, generation) = (rec.version.clone(), rec.generation);
        self.log(s, event, version, generation, why);
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
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

/// A pending activation: which slot, and in which boot it was activated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activation {
    pub slot: Slot,
    pub boot_id: String,
    pub tries: u8,
    pub at: u64,
    /// Checks the activating caller will report on the trial boot, before which the slot is
    /// not blessed (see [`AwaitedChecks`]). None: the boot-time `confirm` blesses on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaits: Option<AwaitedChecks>,
}

/// Health checks that only the activating caller can run on the trial boot — the agent's
/// Node-Ready, which needs the cluster — and that must pass before the single bless point,
/// like a systemd unit ordered before `boot-complete.target`. Until they are reported, the
/// boot-time `confirm` leaves the slot on trial ([`crate::assess::Outcome::Pending`]): a reboot
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
    FallbackTaken { slot: Slot, used: u8, tries: u8 },
    /// The activation of `slot` never reached the loader; it stays staged.
    ActivationLost { slot: Slot },
}

impl OtherSlot {
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
    RolledBack { to: Slot },
    /// A check failed and nothing changes (the slot was already blessed, or the other slot is
    /// not good to roll back to).
    Unhealthy,
    /// The slot's content is not known to be complete (empty or invalid): not assessed.
    NotAssessable { state: SlotState },
    /// Every check run so far passed, but checks its activation awaits (see
    /// [`crate::updater::AwaitedChecks`]) were not reported: still on trial, not blessed.
    Pending {
        waiting_for: Vec<String>,
        within_secs: u64,
    },
}

/// The verdict on one boot: consumed by `confirm`'s caller and by the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub boot_id: String,
    pub slot: Slot,
    pub version: Option<String>,
    pub outcome: Outcome,
    /// Why, in one sentence (also logged in the state file's history).
    pub reason: String,
    /// The other slot's trial, settled in this boot.
    pub other_slot: Option<OtherSlot>,
    pub checks: Vec<CheckResult>,
    /// Damaged loader records seen in this boot (repaired by a loader write of the assessment
    /// when the slot is good and no trial is pending).
    pub loader_damage: Vec<Damage>,
}

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
    #[should_panic(expected = "cannot leave Empty")]
    fn a_transition_from_a_state_it_may_not_leave_is_caught() {
        let mut st = State::default();
        st.transition(Slot::B, Event::Staged, "staged without a write");
    }
}
