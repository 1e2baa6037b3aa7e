//! The agent's pure decision: given the channel, this node and the time, what to do next.
//!
//! Everything the agent does goes through [`decide`], which reads no clock and no network, so
//! it is property-tested directly. The controller executes the returned [`Action`]; each action
//! is idempotent, and because the decision is recomputed from persisted state (channel status,
//! node annotations, the slots on disk) after every step, an agent that restarts anywhere
//! resumes where it stopped.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::crd::{SlotPhase, UpdateChannel, UpdateChannelSpec};
use super::duration;
use super::window::Window;

/// The channel's spec, parsed and checked.
#[derive(Debug, Clone)]
pub struct Policy {
    pub window: Option<Window>,
    pub reboot_timeout: Duration,
    pub drain_timeout: Duration,
    /// `spec.maxRate` in bytes per second.
    pub max_rate: Option<u64>,
}

impl Policy {
    /// Parse the durations and the window; the error names the field.
    pub fn from_spec(spec: &UpdateChannelSpec) -> Result<Policy, String> {
        let window = match &spec.window {
            Some(w) => Some(Window::parse(w).map_err(|e| e.to_string())?),
            None => None,
        };
        let reboot_timeout = duration::parse("spec.rebootTimeout", &spec.reboot_timeout)
            .map_err(|e| e.to_string())?;
        let drain_timeout = duration::parse("spec.drain.timeout", &spec.drain.timeout)
            .map_err(|e| e.to_string())?;
        if reboot_timeout.is_zero() {
            return Err(format!(
                "spec.rebootTimeout: '{}' must be greater than 0 (a zero timeout would reclaim every slot at once)",
                spec.reboot_timeout
            ));
        }
        if drain_timeout.is_zero() {
            return Err(format!(
                "spec.drain.timeout: '{}' must be greater than 0",
                spec.drain.timeout
            ));
        }
        if spec.concurrency == 0 {
            return Err("spec.concurrency: must be at least 1".into());
        }
        let max_rate = spec
            .max_rate
            .as_deref()
            .map(crate::upgrade::parse_rate)
            .transpose()
            .map_err(|e| format!("spec.maxRate: {e}"))?;
        Ok(Policy {
            window,
            reboot_timeout,
            drain_timeout,
            max_rate,
        })
    }

    /// How long a claimed update may take from claim to the node being back: the drain
    /// timeout plus the reboot timeout. A claim must leave this much of the window.
    pub fn needed(&self) -> Duration {
        self.drain_timeout + self.reboot_timeout
    }
}

/// State of the slot the node is *not* running from, as libupgrade reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Inactive {
    /// Nothing usable in it (empty, or being written).
    #[default]
    Empty,
    /// A verified release is staged there, not yet handed to the bootloader.
    Staged(String),
    /// Handed to the bootloader: the next boot tries it.
    Activated(String),
    /// Tried and failed (the bootloader fell back, or health checks rolled it back).
    Failed(String),
}

/// What the node-side (libupgrade) reports.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeUpdateStatus {
    /// Version of the slot the node booted from (`None` if unknown, e.g. first install).
    pub booted_version: Option<String>,
    /// The booted slot is on trial (not yet confirmed good).
    pub booted_on_trial: bool,
    pub inactive: Inactive,
    /// With [`Inactive::Failed`]: what the boot-assessment core recorded about that failure
    /// (its decision log), which the agent reports as is instead of guessing from which slot
    /// booted.
    pub failed_trial: Option<TrialFailure>,
}

/// The boot-assessment core's record of why the inactive slot's trial failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrialFailure {
    /// The core's event, as its decision log names it: `health-failed` (the health checks
    /// failed and the core rolled back), `fallback-taken` (the bootloader fell back),
    /// `marked-bad`, ….
    pub event: String,
    /// The core's reason, with the failed checks' output.
    pub reason: String,
}

/// The core's event for a trial whose health checks failed.
pub const HEALTH_FAILED: &str = "health-failed";
/// The core's event for a trial the bootloader fell back from.
pub const FALLBACK_TAKEN: &str = "fallback-taken";

/// This node, as the decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `spec.unschedulable` right now.
    pub unschedulable: bool,
    /// The token this node's agent claimed with (persisted on the Node), if any.
    pub token: Option<String>,
    pub update: NodeUpdateStatus,
}

/// Why nothing is to be done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdleReason {
    NotSelected,
    NoTarget,
    UpToDate,
    /// This node already failed with the target version; it will not retry it.
    FailedHere(String),
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
    },
    /// Claims are paused by failures of `version`.
    Paused {
        version: String,
    },
    /// Outside the window, or too late in it to finish; `next` is the next window start.
    WaitForWindow {
        next: Option<DateTime<Utc>>,
    },
    /// Claim an update slot to install the staged `version`.
    Claim {
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

/// Decide the next step for `node` under `channel` at `now`.
pub fn decide(channel: &UpdateChannel, node: &NodeView, now: DateTime<Utc>) -> Action {
    let status = channel.status.clone().unwrap_or_default();
    let target = channel.target_version();
    let booted = node.update.booted_version.as_deref();

    if let Some(slot) = status.slot_of(&node.name) {
        if node.token.as_deref() != Some(slot.token.as_str()) {
            return Action::Idle(IdleReason::ForeignSlot);
        }
        let version = slot
            .version
            .clone()
            .or_else(|| target.clone())
            .unwrap_or_default();
        return match slot.phase {
            SlotPhase::Claimed | SlotPhase::Draining => {
                if target.as_deref() != Some(version.as_str()) {
                    Action::Release {
                        reason: format!(
                            "target changed from {version} to {}",
                            target.as_deref().unwrap_or("none")
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
                } else if slot.phase == SlotPhase::Claimed && !fits_window(channel, now) {
                    // Nothing disrupted yet (e.g. the agent restarted late): do not start an
                    // update the rest of the window cannot hold.
                    Action::Release {
                        reason: "the window closed before the update started".into(),
                    }
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
        };
    }

    if !channel.selects(&node.labels) {
        return Action::Idle(IdleReason::NotSelected);
    }
    let policy = match Policy::from_spec(&channel.spec) {
        Ok(p) => p,
        Err(e) => return Action::Invalid(e),
    };
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
    let failed_here = status
        .failures
        .iter()
        .any(|f| f.node == node.name && f.version == target)
        || node.update.inactive == Inactive::Failed(target.clone());
    if failed_here {
        return Action::Idle(IdleReason::FailedHere(target));
    }
    match &node.update.inactive {
        Inactive::Staged(v) | Inactive::Activated(v) if *v == target => {}
        _ => return Action::Stage { version: target },
    }
    if channel.paused_for(&target) {
        return Action::Paused { version: target };
    }
    if let Some(window) = &policy.window {
        if !window_fits(window, &policy, now) {
            return Action::WaitForWindow {
                next: window.next_start(now),
            };
        }
    }
    Action::Claim { version: target }
}

/// Whether an update started at `now` ends inside the window (drain + reboot timeouts).
fn window_fits(window: &Window, policy: &Policy, now: DateTime<Utc>) -> bool {
    let needed = chrono::Duration::from_std(policy.needed()).unwrap_or(chrono::Duration::MAX);
    window
        .open_until(now)
        .is_some_and(|end| end - now >= needed)
}

/// [`window_fits`] for a channel; no window, or a spec that does not parse, holds nothing
/// back here (an invalid spec stops claims before they happen).
fn fits_window(channel: &UpdateChannel, now: DateTime<Utc>) -> bool {
    match Policy::from_spec(&channel.spec) {
        Ok(policy) => match &policy.window {
            Some(w) => window_fits(w, &policy, now),
            None => true,
        },
        Err(_) => true,
    }
}
