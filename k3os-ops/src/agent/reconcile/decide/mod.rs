//! The agent's pure decision: given the channel, this node and the time, what to do next.
//!
//! Everything the agent does goes through [`step`], which reads no clock and no network, so
//! it is property-tested directly. Besides the channel and the node it sees the [`Inputs`] the
//! controller gathers: the time, the back-offs of claims and stages, the pre-reboot gates'
//! verdict and the bytes fetched today. The gates and the bytes cost a request or a read, so
//! they are gathered only when the decision needs them: until then it answers
//! [`Action::Gather`], the controller fetches what it names and asks again.
//!
//! The controller executes the returned [`Action`]; each action is idempotent, and because
//! the decision is recomputed from persisted state (channel status, node annotations, the slots
//! on disk) after every step, an agent that restarts anywhere resumes where it stopped.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use libupgrade::Release;

use crate::agent::channel::crd::{SlotEntry, SlotPhase, UpdateChannel, COND_WAITING_FOR_WAVE};
use crate::agent::channel::rollout::{self, Admission};
use crate::agent::channel::spec::Policy;
use crate::agent::channel::thin::Waiting;

#[cfg(test)]
use crate::agent::channel::latest::Latest;
use crate::agent::host::status::{Inactive, NodeUpdateStatus};

mod held;
mod retrying;
use held::{hold_claim, pin_gate, stage_gate};
pub use held::{Inputs, Need, PinVerdict, StagePlan, Verdict};
use retrying::{retrying, Retrying};

/// This node, as the decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `spec.unschedulable` right now.
    pub unschedulable: bool,
    /// The token this node's agent claimed with (persisted on the Node), if any.
    pub token: Option<String>,
    /// The node carries this agent's cordon mark (`k3os.io/update-cordoned: "true"`).
    pub cordoned_by_us: bool,
    /// How long this node's Lease had gone unrenewed when this agent process started, known
    /// only to its first decision (`None` after it, or with no Lease).
    pub silent_at_start: Option<Duration>,
    /// Why the Node is not Ready now (its Ready condition as read), None when it is: such a
    /// node claims nothing, so no update starts on a node whose kubelet is down.
    pub not_ready: Option<String>,
    pub update: NodeUpdateStatus,
}

/// Why nothing is to be done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdleReason {
    NotSelected,
    NoTarget,
    UpToDate,
    /// This node already failed with the target version and does not try it now: its rollout
    /// allows no (more) retries, or not yet (`why`: the retry decision's sentence, or where the
    /// failure was recorded).
    FailedHere {
        version: String,
        why: String,
    },
    /// The inactive slot holding the target is bad but nothing records a failure of it here
    /// (marked bad by hand, or dropped for a withdrawal): not staged again, and not shown as
    /// failed (the Node's phase stays as it is).
    BadSlot(String),
    /// The channel holds a slot for this node under another token (an earlier agent instance
    /// on this node claimed it); the controller takes it over in place, which fences that
    /// instance out.
    ForeignSlot,
}

/// The next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Idle(IdleReason),
    /// The spec cannot be used; the message names the field.
    Invalid(String),
    /// Download and verify `version` into the inactive slot (no slot, no disruption).
    Stage {
        version: String,
        /// The release of `version` this node's own check of a pinned version resolved in
        /// this reconcile (`Inputs::pinned_release`): the stage takes it instead of
        /// resolving the channel again. None: the stage resolves it.
        release: Option<Box<Release>>,
        /// The release failed on this node and its rollout's retries allow this attempt now
        /// ([`libupgrade::rollout::decide_retry`]): what the stage announces (Event
        /// `Retrying`). None: a first attempt.
        retry: Option<String>,
    },
    /// Claims are paused by failures of `version`.
    Paused {
        version: String,
    },
    /// Claims are stopped by `spec.paused` (`version` is staged and waits).
    PausedBySpec {
        version: String,
    },
    /// `spec.rollout`: this node's wave has not started; waves up to `admitted` of `waves`
    /// may update (0: only the canaries, the counter has published nothing yet).
    WaitForWave {
        version: String,
        admitted: u32,
        waves: u32,
    },
    /// Outside the window, or too late in it to finish; `next` is the next window start.
    WaitForWindow {
        next: Option<DateTime<Utc>>,
    },
    /// The channel withdrew the target `version` (its signed metadata; `status.fleetRollout`
    /// or this node's own resolution at the claim): neither staged nor claimed.
    Withdrawn {
        version: String,
    },
    /// The channel's signed rollout holds the pinned `version` (`spec.version`) back from this
    /// cluster (its wave has not started, it is paused, or its rollout data is not usable; `why`
    /// says which and until when): neither staged nor claimed, and not a failure.
    WaitForChannelWave {
        version: String,
        why: String,
    },
    /// The release staged in the inactive slot, `version`, was withdrawn by the channel: drop
    /// it (mark the slot bad, never activate it) after the node's own signed metadata agrees.
    DropWithdrawn {
        version: String,
    },
    /// Claim an update slot to install the staged `version`.
    Claim {
        version: String,
    },
    /// Every slot of the channel is taken (as read) by `holders`: wait for the change that
    /// frees one, without a claim attempt, a new token on the Node or a gate query.
    WaitForSlot {
        holders: Vec<String>,
    },
    /// A pre-reboot gate holds the claim of the staged `version` back; `why` names it.
    WaitForGate {
        version: String,
        why: String,
    },
    /// The last update attempt was aborted: no claim before `until`.
    ClaimBackingOff {
        until: DateTime<Utc>,
    },
    /// The last stage failed: no stage before `until` (waited out quietly).
    StageBackingOff {
        until: DateTime<Utc>,
    },
    /// The thin-link settings hold the stage of `version` back until `until`: outside the
    /// stage windows, or today's quota spent. Not a failure.
    StageWaiting {
        version: String,
        why: Waiting,
        until: DateTime<Utc>,
    },
    /// The decision needs a fact that costs a request: gather it, then decide again.
    Gather(Need),
    /// The slot held when this agent started (before any disruption) is forfeit: the node was
    /// silent for half the reboot timeout, so other agents may be reclaiming it; claim afresh
    /// with a new token.
    Forfeit {
        version: String,
    },
    /// Holding a slot at `phase`: carry on from there (drain / activate+reboot / reboot back).
    Continue {
        phase: SlotPhase,
        version: String,
    },
    /// Booted `version` on trial: run the health checks and confirm; then release the slot if
    /// `held`.
    Confirm {
        version: String,
        held: bool,
    },
    /// The node is back on its old slot after trying `version`: record the failure, uncordon,
    /// release.
    RolledBack {
        version: String,
    },
    /// Back on the old slot after a health-check rollback that was already recorded:
    /// uncordon and release.
    FinishRollback,
    /// Holding a slot with nothing to do (target changed, already current): undo, release.
    Release {
        reason: String,
    },
}

/// The next step and what must happen before it.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Undo this agent's cordon first: it outlives the slot only after an interrupted update
    /// (slot reclaimed while draining or rebooting, health rollback without a slot), and no
    /// step of a held slot needs it. A [`Action::Claim`] is not such a step: a node without a
    /// slot is never left cordoned by us while it waits for one (disruption stays bounded by
    /// `concurrency`); the next claim cordons again after fencing.
    pub undo_cordon: bool,
    pub action: Action,
    /// With [`Action::Stage`]: how it runs.
    pub stage: Option<StagePlan>,
}

/// [`step`]'s action with nothing held back ([`Inputs::open_at`]), parsing the channel's
/// policy itself (for callers without a [`crate::agent::channel::listing::Channel`]).
#[cfg(test)]
pub fn decide(channel: &UpdateChannel, node: &NodeView, now: DateTime<Utc>) -> Action {
    let policy = Policy::from_spec(&channel.spec);
    let withdrawn = channel
        .status
        .as_ref()
        .and_then(|s| s.fleet_rollout.as_ref())
        .map(|f| f.withdrawn.clone())
        .unwrap_or_default();
    let inputs = Inputs {
        // The node's own resolution agrees with the status (what every honest poller wrote).
        own_latest: channel.target_version().map(|version| {
            Ok(Latest {
                version,
                generation: None,
                waiting: None,
                withdrawn,
                retries: None,
            })
        }),
        ..Inputs::open_at(now)
    };
    step(channel, &policy, node, &inputs).action
}

/// Decide the next step for `node` under `channel` (whose spec parsed into `policy`) with
/// `inputs`.
pub fn step(
    channel: &UpdateChannel,
    policy: &Result<Policy, String>,
    node: &NodeView,
    inputs: &Inputs,
) -> Step {
    let action = next_action(channel, policy, node, inputs);
    let slot_action = matches!(
        action,
        Action::Continue { .. }
            | Action::Confirm { .. }
            | Action::RolledBack { .. }
            | Action::FinishRollback
            | Action::Release { .. }
            | Action::Idle(IdleReason::ForeignSlot)
    );
    let undo_cordon = node.cordoned_by_us && !slot_action;
    let (action, stage) = match (action, policy) {
        (Action::Stage { version, retry, .. }, Ok(p)) => {
            pin_gate(channel, stage_gate(p, version, retry, inputs), inputs)
        }
        (action, Ok(p)) => (hold_claim(channel, p, action, inputs), None),
        (action, Err(_)) => (action, None),
    };
    Step {
        undo_cordon,
        action,
        stage,
    }
}

/// The decision table.
fn next_action(
    channel: &UpdateChannel,
    policy: &Result<Policy, String>,
    node: &NodeView,
    inputs: &Inputs,
) -> Action {
    let now = inputs.now;
    let status = channel.status.clone().unwrap_or_default();
    let target = channel.target_version();
    let booted = node.update.booted_version.as_deref();

    if let Some(slot) = status.slot_of(&node.name) {
        return holder_action(slot, policy, node, target.as_deref(), now);
    }

    if !channel.selects(&node.labels) {
        return Action::Idle(IdleReason::NotSelected);
    }
    let policy = match policy {
        Ok(p) => p,
        Err(e) => return Action::Invalid(e.clone()),
    };
    // The channel's fleet rollouts (its signed metadata, as the poller published it): a
    // withdrawn release staged here is dropped, whatever the target; one that is the target
    // is neither staged nor claimed.
    let withdrawn = |v: &str| {
        status
            .fleet_rollout
            .as_ref()
            .is_some_and(|f| f.withdrawn.iter().any(|w| w == v))
    };
    if let Inactive::Staged(v) = &node.update.inactive {
        if withdrawn(v) {
            return Action::DropWithdrawn { version: v.clone() };
        }
    }
    let Some(target) = target else {
        return Action::Idle(IdleReason::NoTarget);
    };
    if booted == Some(target.as_str()) {
        return if node.update.booted_on_trial {
            Action::Confirm {
                version: target,
                held: false,
            }
        } else {
            Action::Idle(IdleReason::UpToDate)
        };
    }
    let (retry, explained) = match retrying(channel, &status, node, &target, inputs) {
        Retrying::Held(why) => {
            return Action::Idle(IdleReason::FailedHere {
                version: target,
                why,
            })
        }
        Retrying::Ask(need) => return Action::Gather(need),
        Retrying::Again(note) => (Some(note), true),
        Retrying::Republished => (None, true),
        Retrying::NeverFailed => (None, false),
    };
    // A bad slot of the target that no failure record explains is not staged again; one the
    // rollout's retries allow to try again, or holding the generation a republished target
    // replaces, is (the stage overwrites it).
    if !explained && node.update.inactive == Inactive::Failed(target.clone()) {
        return Action::Idle(IdleReason::BadSlot(target));
    }
    if withdrawn(&target) {
        return Action::Withdrawn { version: target };
    }
    if let Some(why) = held_pin(channel, &status, &target) {
        return Action::WaitForChannelWave {
            version: target,
            why,
        };
    }
    match &node.update.inactive {
        Inactive::Staged(v) | Inactive::Activated(v) if *v == target => {}
        _ => {
            return Action::Stage {
                version: target,
                release: None,
                retry,
            }
        }
    }
    if channel.spec.paused {
        return Action::PausedBySpec { version: target };
    }
    if channel.paused_for(&target) {
        return Action::Paused { version: target };
    }
    claim_or_wait(policy, &status, node, target, now)
}

/// The last rows of the table: a staged target is claimed once the channel's rollout admits
/// this node and the window holds the update.
fn claim_or_wait(
    policy: &Policy,
    status: &crate::agent::channel::crd::UpdateChannelStatus,
    node: &NodeView,
    target: String,
    now: DateTime<Utc>,
) -> Action {
    if let Some(r) = &policy.rollout {
        let published = status.rollout.as_ref();
        if let Admission::NotYet { admitted, waves } =
            rollout::admission(r, published, &target, &node.name, &node.labels)
        {
            return Action::WaitForWave {
                version: target,
                admitted,
                waves,
            };
        }
    }
    if !policy.fits_window(now) {
        return Action::WaitForWindow {
            next: policy.next_window_start(now),
        };
    }
    if let Some(why) = &node.not_ready {
        return Action::WaitForGate {
            version: target,
            why: why.clone(),
        };
    }
    Action::Claim { version: target }
}

/// Why a Node with these `conditions` is not Ready (None: Ready is `True`), for
/// [`NodeView::not_ready`].
pub fn not_ready(conditions: &[k8s_openapi::api::core::v1::NodeCondition]) -> Option<String> {
    let Some(c) = conditions.iter().find(|c| c.type_ == "Ready") else {
        return Some("the Node has no Ready condition yet".into());
    };
    if c.status == "True" {
        return None;
    }
    let why = [c.reason.as_deref(), c.message.as_deref()]
        .into_iter()
        .flatten()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(": ");
    Some(if why.is_empty() {
        format!("the Node is not Ready (Ready={})", c.status)
    } else {
        format!("the Node is not Ready (Ready={}, {why})", c.status)
    })
}

/// The decision table's part for a node that holds a slot of the channel: go on, confirm,
/// roll back, forfeit or give the slot back.
fn holder_action(
    slot: &SlotEntry,
    policy: &Result<Policy, String>,
    node: &NodeView,
    target: Option<&str>,
    now: DateTime<Utc>,
) -> Action {
    let booted = node.update.booted_version.as_deref();
    if node.token.as_deref() != Some(slot.token.as_str()) {
        return Action::Idle(IdleReason::ForeignSlot);
    }
    let version = slot
        .version
        .clone()
        .or_else(|| target.map(str::to_string))
        .unwrap_or_default();
    match slot.phase {
        SlotPhase::Claimed | SlotPhase::Draining => {
            if target != Some(version.as_str()) {
                Action::Release {
                    reason: format!(
                        "target changed from {version} to {}",
                        target.unwrap_or("none")
                    ),
                }
            } else if booted == Some(version.as_str()) {
                if node.update.booted_on_trial {
                    Action::Confirm {
                        version,
                        held: true,
                    }
                } else {
                    Action::Release {
                        reason: format!("already running {version}"),
                    }
                }
            } else if !matches!(&node.update.inactive, Inactive::Staged(v) | Inactive::Activated(v) if *v == version)
            {
                Action::Release {
                    reason: format!("{version} is no longer staged in the inactive slot"),
                }
            } else if slot.phase == SlotPhase::Claimed
                && policy.as_ref().is_ok_and(|p| !p.fits_window(now))
            {
                // Nothing disrupted yet (e.g. the agent restarted late): do not start an
                // update the rest of the window cannot hold. (An invalid spec holds
                // nothing back here: it stops claims before they happen.)
                Action::Release {
                    reason: "the window closed before the update started".into(),
                }
            } else if policy.as_ref().is_ok_and(|p| {
                node.silent_at_start
                    .is_some_and(|s| s >= p.reboot_timeout / 2)
            }) {
                Action::Forfeit { version }
            } else {
                Action::Continue {
                    phase: slot.phase,
                    version,
                }
            }
        }
        SlotPhase::Rebooting => {
            if booted == Some(version.as_str()) {
                Action::Confirm {
                    version,
                    held: true,
                }
            } else if matches!(&node.update.inactive, Inactive::Staged(v) | Inactive::Activated(v) if *v == version)
            {
                // Fenced for reboot but the reboot has not happened (or not yet been
                // asked for): activate (idempotent) and reboot.
                Action::Continue {
                    phase: SlotPhase::Rebooting,
                    version,
                }
            } else {
                Action::RolledBack { version }
            }
        }
        SlotPhase::RollingBack => {
            if booted == Some(version.as_str()) {
                Action::Continue {
                    phase: SlotPhase::RollingBack,
                    version,
                }
            } else {
                Action::FinishRollback
            }
        }
    }
}

/// Why the poller found the pinned `target` held back by the channel's rollout
/// (`status.fleetRollout.heldTarget`, the `WaitingForWave` condition's message), unless the
/// spec takes it anyway (`ignoreRollout`). A node that staged it before the hold does not claim
/// it either.
fn held_pin(
    channel: &UpdateChannel,
    status: &crate::agent::channel::crd::UpdateChannelStatus,
    target: &str,
) -> Option<String> {
    if channel.spec.pinned_version() != Some(target) || channel.spec.ignores_rollout() {
        return None;
    }
    let held = status.fleet_rollout.as_ref()?.held_target.as_deref() == Some(target);
    held.then(|| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == COND_WAITING_FOR_WAVE && c.status == "True")
            .map(|c| c.message.clone())
            .unwrap_or_else(|| {
                format!("{target} (spec.version) is held back by the channel's rollout (status.fleetRollout.heldTarget)")
            })
    })
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod wave_tests;
#[cfg(test)]
mod window_tests;
