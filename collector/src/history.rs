//! Pure: a node's outcome for one release, read from all its reports about it, not only the
//! newest. The one rule that fleet status (`release rollout-status --reports`), the guard and
//! the dashboard apply.
//!
//! Reports carry no attempt number, so attempts are read from their order (the node's `seq`):
//! **a node's outcome for a release is its newest report about it that is not a wait**. A
//! later `staged`, `trial_boot`, `blessed` or `withdrawn_dropped` (a drop means it had staged
//! the release again) is a later attempt and replaces a failure; a later failure replaces
//! anything. A `waiting` report replaces only a wait: after any other state it is kept beside
//! it ("rolled back, waiting (paused)"), because a canary that failed and then waits for the
//! halt has not tried again. A node that only ever waited is waiting. A node that holds back a
//! release that failed on it says so with a wait for a retry: "rolled back, waiting (retry
//! after DATE)", or "rolled back, not retried" when no retry is to come; the failure still
//! counts, until the node tries again.
//!
//! [`step`] is the rule, one report at a time (the dashboard's chart replays it over time);
//! [`outcome`] folds one node's reports, [`outcomes`] every node's.

use std::collections::BTreeMap;

use fleet_report::{Outcome, WaitFor};
use serde::{Deserialize, Serialize};

use crate::store::Row;

/// A node's state for one release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Waiting for its wave or a pause.
    Waiting,
    /// Staged, not yet tried.
    Staged,
    /// Handed to the loader for a trial boot.
    TrialBoot,
    /// Runs it, blessed.
    Blessed,
    /// Staging failed.
    StageFailed,
    /// Rolled back after a failed health check.
    RolledBack,
    /// The loader fell back: the trial never confirmed.
    FellBack,
    /// Dropped it staged, as withdrawn.
    WithdrawnDropped,
}

impl NodeState {
    /// The state a report's outcome puts a node in.
    pub fn of(o: &Outcome) -> NodeState {
        match o {
            Outcome::Waiting { .. } => NodeState::Waiting,
            Outcome::Staged { .. } => NodeState::Staged,
            Outcome::TrialBoot => NodeState::TrialBoot,
            Outcome::Blessed => NodeState::Blessed,
            Outcome::StageFailed { .. } => NodeState::StageFailed,
            Outcome::RolledBack { .. } => NodeState::RolledBack,
            Outcome::FellBack { .. } => NodeState::FellBack,
            Outcome::WithdrawnDropped => NodeState::WithdrawnDropped,
        }
    }

    /// Whether the state is a failure of the release (counted by reason).
    pub fn failed(self) -> bool {
        matches!(
            self,
            NodeState::StageFailed | NodeState::RolledBack | NodeState::FellBack
        )
    }

    /// Its name for people: `rolled back`, `trial boot`, …
    pub fn label(self) -> &'static str {
        match self {
            NodeState::Waiting => "waiting",
            NodeState::Staged => "staged",
            NodeState::TrialBoot => "trial boot",
            NodeState::Blessed => "blessed",
            NodeState::StageFailed => "stage failed",
            NodeState::RolledBack => "rolled back",
            NodeState::FellBack => "fell back",
            NodeState::WithdrawnDropped => "dropped (withdrawn)",
        }
    }
}

/// `waiting (paused)`, `waiting (wave)` or `waiting (retry)`.
pub fn waiting_label(w: WaitFor) -> &'static str {
    match w {
        WaitFor::Pause => "waiting (paused)",
        WaitFor::Wave => "waiting (wave)",
        WaitFor::Retry => "waiting (retry)",
    }
}

/// A wait as one node's newest report says it: a wait for a retry names when the retry is
/// allowed (`waiting (retry after 2026-12-07T04:12:00Z)`) or that none comes (`not retried`);
/// the others as [`waiting_label`].
pub fn wait_label(outcome: &Outcome) -> Option<String> {
    match outcome {
        Outcome::Waiting {
            wait_for: WaitFor::Retry,
            until: Some(t),
        } => Some(format!("waiting (retry after {})", crate::time::utc(*t))),
        Outcome::Waiting {
            wait_for: WaitFor::Retry,
            until: None,
        } => Some("not retried".to_string()),
        Outcome::Waiting { wait_for, .. } => Some(waiting_label(*wait_for).to_string()),
        _ => None,
    }
}

/// What one node's reports about one release add up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeOutcome<'a> {
    /// The state that counts for the node.
    pub state: NodeState,
    /// The report that put it there (for a failure, the failure's report with its reason).
    pub decided_by: &'a Row,
    /// The node reported a wait after reaching `state` (which is then not waiting): what for.
    pub then_waiting: Option<WaitFor>,
    /// The node's newest report about the release.
    pub newest: &'a Row,
}

impl NodeOutcome<'_> {
    /// `rolled back`, `rolled back, waiting (paused)`, `rolled back, waiting (retry after
    /// 2026-12-07T04:12:00Z)`, `rolled back, not retried`, `blessed`, …
    pub fn label(&self) -> String {
        match self.then_waiting.and(wait_label(&self.newest.outcome)) {
            Some(w) => format!("{}, {w}", self.state.label()),
            None => self.state.label().to_string(),
        }
    }

    /// Whether the node is done with the release (blessed, failed or dropped it): it is not
    /// counted as silent.
    pub fn done(&self) -> bool {
        self.state == NodeState::Blessed
            || self.state.failed()
            || self.state == NodeState::WithdrawnDropped
    }
}

/// The rule: the outcome after `r`, the node's next report about the release, given its
/// outcome before (None: `r` is its first).
pub fn step<'a>(before: Option<NodeOutcome<'a>>, r: &'a Row) -> NodeOutcome<'a> {
    let state = NodeState::of(&r.outcome);
    match (before, &r.outcome) {
        (Some(b), Outcome::Waiting { wait_for, .. }) if b.state != NodeState::Waiting => {
            NodeOutcome {
                then_waiting: Some(*wait_for),
                newest: r,
                ..b
            }
        }
        _ => NodeOutcome {
            state,
            decided_by: r,
            then_waiting: None,
            newest: r,
        },
    }
}

/// One node's outcome from its reports about one release, in any order (they are taken by
/// `seq`); None for no reports.
pub fn outcome<'a>(reports: impl IntoIterator<Item = &'a Row>) -> Option<NodeOutcome<'a>> {
    let mut sorted: Vec<&Row> = reports.into_iter().collect();
    sorted.sort_by_key(|r| r.seq);
    sorted.into_iter().fold(None, |b, r| Some(step(b, r)))
}

/// A release as reports name it: (generation, version).
pub type ReleaseKey<'a> = (u64, &'a str);

/// Every node's outcome per release, from every stored report.
pub fn outcomes(rows: &[Row]) -> BTreeMap<ReleaseKey<'_>, BTreeMap<&str, NodeOutcome<'_>>> {
    outcomes_by_release(rows.iter())
}

/// Every node's outcome from the reports about one release, by node.
pub fn outcomes_of<'a>(rows: impl Iterator<Item = &'a Row>) -> BTreeMap<&'a str, NodeOutcome<'a>> {
    outcomes_by_release(rows).into_values().flatten().collect()
}

fn outcomes_by_release<'a>(
    rows: impl Iterator<Item = &'a Row>,
) -> BTreeMap<ReleaseKey<'a>, BTreeMap<&'a str, NodeOutcome<'a>>> {
    let mut grouped: BTreeMap<(ReleaseKey, &str), Vec<&Row>> = BTreeMap::new();
    for r in rows {
        grouped
            .entry(((r.generation, r.version.as_str()), r.node.as_str()))
            .or_default()
            .push(r);
    }
    let mut out: BTreeMap<ReleaseKey, BTreeMap<&str, NodeOutcome>> = BTreeMap::new();
    for ((release, node), reports) in grouped {
        if let Some(o) = outcome(reports) {
            out.entry(release).or_default().insert(node, o);
        }
    }
    out
}

#[cfg(test)]
mod tests;
