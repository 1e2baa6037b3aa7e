//! What the agent says: the `k3os.io/update-*` annotations of its Node and the Events about
//! the Node and its channel. Every report of a step goes through here: `Agent::publish` (a
//! `Report`: a phase and its Event), the `Done` a tick returns (its Events, then its report),
//! `Agent::announce` (a report published before a long step), Events once per text for
//! waiting states (`Agent::event_once`), and format refusals once per agent process.
//!
//! An annotation is written only when it changes: the Node's annotations as last read or
//! written are remembered, and a patch that would change none of them is not sent (an idle
//! agent re-deciding `UpToDate` every resync writes nothing).
//!
//! Per-node progress lives on the Node as `k3os.io/update-*` annotations (never on the shared
//! channel): `update-phase` ([`Phase`]), `update-target`, `update-progress`, `update-message`,
//! `update-token` (the claim token, written before the claim so a restarted agent finds its
//! slot) and `update-cordoned` (set just before this agent cordons, so only a cordon of ours is
//! undone), with their format in `update-format` ([`crate::agent::channel::format`]).

use super::slots;
use crate::agent::channel::crd::UpdateChannel;
use crate::agent::phase::Phase;

/// An Event a step publishes with its report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) struct Say {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
    /// Published only when the text differs from the last Event of this agent.
    pub once: bool,
    /// About the Node alone (not also regarding the channel).
    pub node_only: bool,
}

impl Say {
    pub fn info(reason: &'static str, note: String) -> Say {
        Say {
            warning: false,
            reason,
            note,
            once: false,
            node_only: false,
        }
    }

    pub fn warn(reason: &'static str, note: String) -> Say {
        Say {
            warning: true,
            ..Say::info(reason, note)
        }
    }

    /// For a waiting state: only when the text changed (see `Agent::say`).
    pub fn once(self) -> Say {
        Say { once: true, ..self }
    }

    /// About the Node alone: published regarding the Node, not the channel.
    pub fn about_node(self) -> Say {
        Say {
            node_only: true,
            ..self
        }
    }
}

/// What a tick did, for the controller to publish once: the phase entered with its message
/// and the Event that says so, if one does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) struct Report {
    pub phase: Phase,
    pub message: String,
    pub event: Option<Say>,
}

impl Report {
    /// Wait in `phase`, saying why (`message`, also the note of a `reason` Event published
    /// once per text).
    pub fn waiting(phase: Phase, reason: &'static str, message: String) -> Report {
        Report {
            phase,
            event: Some(Say::info(reason, message.clone()).once()),
            message,
        }
    }
}

/// A channel condition or Node annotation that a tick's outcome sets or clears, published by
/// the controller with the tick's Events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) enum Mark {
    /// This node's line of `StageWillMissWindow` (None: on time, the line goes).
    StageDeadline(Option<crate::agent::channel::thin::Miss>),
    /// `ChannelStale`: the role whose metadata expired (None: the channel is fresh again).
    Stale(Option<crate::agent::host::ops::StaleMetadata>),
    /// A Node annotation set (Some) or removed (None).
    Annotation(&'static str, Option<String>),
}

/// What a tick did, for the controller to publish once and in this order: the conditions and
/// annotations its outcome sets (`marks`), the Events of the steps it carried out (`said`),
/// then the phase it entered (`report`); then `then`. A tick publishes nothing itself, except
/// write-ahead records, progress, and an announcement before a step that takes long or does
/// not return ([`Agent::announce`]).
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) struct Done {
    pub marks: Vec<Mark>,
    pub said: Vec<Say>,
    pub report: Option<Report>,
    pub then: Then,
}

/// What follows a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::agent) enum Then {
    /// Decide again at once.
    Again,
    /// Wait for a change or the resync period.
    Wait,
    /// Reboot the node (after publishing: the reboot does not return).
    Reboot,
}

impl Done {
    /// Nothing to publish; go on as `then` says.
    pub fn then(then: Then) -> Done {
        Done {
            marks: Vec::new(),
            said: Vec::new(),
            report: None,
            then,
        }
    }

    /// `report` published, then `then`.
    pub fn report(report: Report, then: Then) -> Done {
        Done {
            report: Some(report),
            ..Done::then(then)
        }
    }

    /// The same, also setting `marks` (published before its Events).
    pub fn marked(mut self, mut marks: Vec<Mark>) -> Done {
        self.marks.append(&mut marks);
        self
    }

    /// The Events `before` go first (steps carried out before this outcome).
    pub fn after(mut self, mut before: Vec<Say>) -> Done {
        before.append(&mut self.said);
        self.said = before;
        self
    }
}

impl Report {
    /// Enter `phase` with `message`, saying so with `event`.
    pub fn new(phase: Phase, message: impl Into<String>, event: Say) -> Report {
        Report {
            phase,
            message: message.into(),
            event: Some(event),
        }
    }

    /// Enter `phase` with `message`, no Event.
    pub fn quiet(phase: Phase, message: impl Into<String>) -> Report {
        Report {
            phase,
            message: message.into(),
            event: None,
        }
    }
}

/// The `SlotReleased` Event when our slot was released.
pub(in crate::agent) fn released(released: bool, why: &str) -> Option<Say> {
    released.then(|| Say::info("SlotReleased", format!("released the update slot: {why}")))
}

/// The Events of a recorded failure's effects on the channel: the slot released with it
/// (`SlotReleased`) and the pause it caused (`ChannelPaused`).
pub(in crate::agent) fn failure_recorded(
    ch: &UpdateChannel,
    version: &str,
    out: slots::FailureOutcome,
    why: &str,
) -> Vec<Say> {
    let mut said: Vec<Say> = released(out.released, why).into_iter().collect();
    if out.paused {
        said.push(Say::warn(
            "ChannelPaused",
            format!(
                "{version} failed on {} node(s), reaching maxFailures {}: new claims are paused. {}",
                ch.spec.max_failures,
                ch.spec.max_failures,
                super::slots::resume_hint(ch.metadata.name.as_deref().unwrap_or_default())
            ),
        ));
    }
    said
}
