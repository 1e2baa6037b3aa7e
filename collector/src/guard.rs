//! Pure: abort criteria over what the sites reported, like AWS IoT Jobs' (which failures
//! count, a minimum number of nodes that ran the release, a threshold percentage), per release
//! and optionally per wave ([`judge`]), and what the guard does about a release at one run
//! given what it did before ([`step`]). `k3os-ops collector guard` does the effects: it signs
//! the halt with the stop-only key (`libupgrade::trust::halt`) and records every
//! [`GuardAction`](crate::GuardAction).

use serde::Serialize;

use crate::fleet::ReleaseStatus;
use crate::history::NodeState;

/// When a release should be halted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Criteria {
    /// The states that count as failures.
    pub failures: Vec<NodeState>,
    /// Nodes that must have run the release (any state but waiting) before it is judged.
    pub min_nodes: u64,
    /// Failed share of those nodes, in percent, at or above which the release is halted.
    pub threshold_percent: f64,
    /// Judge only this wave's nodes (1-based); None: every node.
    pub wave: Option<usize>,
}

impl Default for Criteria {
    /// Stage failures, rollbacks and fallbacks count; at least 10 nodes; 10 %.
    fn default() -> Self {
        Criteria {
            failures: vec![
                NodeState::StageFailed,
                NodeState::RolledBack,
                NodeState::FellBack,
            ],
            min_nodes: 10,
            threshold_percent: 10.0,
            wave: None,
        }
    }
}

/// The judgement of one release.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// The criteria are met: halt the rollout.
    Halt {
        /// Nodes in a counted failure state.
        failed: u64,
        /// Nodes that ran the release.
        ran: u64,
        /// `failed` of `ran`, in percent.
        percent: f64,
    },
    /// Fewer nodes ran it than the minimum: no judgement yet.
    TooFew {
        /// Nodes that ran the release.
        ran: u64,
    },
    /// Below the threshold: go on.
    GoOn {
        /// Nodes in a counted failure state.
        failed: u64,
        /// Nodes that ran the release.
        ran: u64,
        /// `failed` of `ran`, in percent.
        percent: f64,
    },
}

/// Judge `r` by `c`.
pub fn judge(r: &ReleaseStatus, c: &Criteria) -> Verdict {
    let (mut failed, mut ran) = (0u64, 0u64);
    for w in r
        .waves
        .iter()
        .filter(|w| c.wave.is_none() || w.wave == c.wave)
    {
        for (state, n) in &w.states {
            if *state != NodeState::Waiting {
                ran += n;
            }
            if c.failures.contains(state) {
                failed += n;
            }
        }
    }
    if ran < c.min_nodes.max(1) {
        return Verdict::TooFew { ran };
    }
    let percent = failed as f64 * 100.0 / ran as f64;
    if percent >= c.threshold_percent {
        Verdict::Halt {
            failed,
            ran,
            percent,
        }
    } else {
        Verdict::GoOn {
            failed,
            ran,
            percent,
        }
    }
}

/// What the guard does about one release at one run.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Sign a halt of it (the criteria are met and nothing holds it).
    Halt,
    /// Record that the publisher lifted the guard's halt (it halted it, and no halt holds it
    /// any more): from now on only reports received after this run are judged, so the same
    /// failures do not halt it again.
    Lifted,
    /// Nothing (a halt already holds it, or the criteria are not met).
    Nothing,
}

/// The guard's last `halt` or `lifted` action about `version` in `channel`.
fn last_of<'a>(
    actions: &'a [crate::GuardAction],
    channel: &str,
    version: &str,
) -> Option<&'a crate::GuardAction> {
    actions
        .iter()
        .rev()
        .find(|a| a.channel == channel && a.version == version && a.action != "refresh")
}

/// Reports received after this time (Unix seconds) are judged for `version`: 0, or the time
/// the guard saw the publisher lift its last halt of it.
pub fn judged_from(actions: &[crate::GuardAction], channel: &str, version: &str) -> u64 {
    actions
        .iter()
        .filter(|a| a.channel == channel && a.version == version && a.action == "lifted")
        .map(|a| a.at)
        .max()
        .unwrap_or(0)
}

/// What to do about `version` of `channel` given the guard's `actions` so far, whether a halt
/// holds it now (`held`: the served halt names it and the publisher has not lifted it) and
/// the verdict on the reports received since [`judged_from`].
pub fn step(
    actions: &[crate::GuardAction],
    channel: &str,
    version: &str,
    held: bool,
    verdict: &Verdict,
) -> Step {
    let halted_last = last_of(actions, channel, version).is_some_and(|a| a.action == "halt");
    match (held, halted_last, verdict) {
        (false, true, _) => Step::Lifted,
        (true, _, _) => Step::Nothing,
        (false, false, Verdict::Halt { .. }) => Step::Halt,
        _ => Step::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::WaveStatus;

    fn release(waves: &[(usize, &[(NodeState, u64)])]) -> ReleaseStatus {
        ReleaseStatus {
            version: "v2".into(),
            generation: 2,
            waves: waves
                .iter()
                .map(|(w, states)| WaveStatus {
                    wave: Some(*w),
                    nodes: states.iter().map(|s| s.1).sum(),
                    offered: states
                        .iter()
                        .filter(|s| s.0 != NodeState::Waiting)
                        .map(|s| s.1)
                        .sum(),
                    states: states.iter().copied().collect(),
                    failures: Default::default(),
                    failed_waiting: Default::default(),
                })
                .collect(),
            silent: 0,
            last_report: 0,
        }
    }

    #[test]
    fn halts_at_the_threshold_once_enough_nodes_ran_it() {
        use NodeState::*;
        let c = Criteria {
            min_nodes: 10,
            threshold_percent: 20.0,
            ..Criteria::default()
        };
        // 9 ran (waiting ones do not count): too few, whatever failed.
        let r = release(&[(1, &[(RolledBack, 9), (Waiting, 100)])]);
        assert_eq!(judge(&r, &c), Verdict::TooFew { ran: 9 });
        // 2 of 10 failed: 20 % halts.
        let r = release(&[(1, &[(RolledBack, 1), (FellBack, 1), (Blessed, 8)])]);
        assert!(matches!(
            judge(&r, &c),
            Verdict::Halt {
                failed: 2,
                ran: 10,
                ..
            }
        ));
        // 1 of 10: goes on.
        let r = release(&[(1, &[(StageFailed, 1), (TrialBoot, 9)])]);
        assert!(matches!(
            judge(&r, &c),
            Verdict::GoOn {
                failed: 1,
                ran: 10,
                ..
            }
        ));
        // Only what counts counts: rollbacks not counted here.
        let only_stage = Criteria {
            failures: vec![StageFailed],
            ..c.clone()
        };
        let r = release(&[(1, &[(RolledBack, 5), (Blessed, 5)])]);
        assert!(matches!(
            judge(&r, &only_stage),
            Verdict::GoOn { failed: 0, .. }
        ));
        // Per wave: wave 1 fails, wave 2 does not.
        let r = release(&[(1, &[(RolledBack, 10)]), (2, &[(Blessed, 100)])]);
        let wave = |w| Criteria {
            wave: Some(w),
            ..c.clone()
        };
        assert!(matches!(judge(&r, &wave(1)), Verdict::Halt { .. }));
        assert!(matches!(judge(&r, &wave(2)), Verdict::GoOn { .. }));
        assert!(matches!(
            judge(&r, &c),
            Verdict::GoOn {
                failed: 10,
                ran: 110,
                ..
            }
        ));
    }

    fn action(at: u64, version: &str, what: &str) -> crate::GuardAction {
        crate::GuardAction {
            at,
            channel: "c".into(),
            version: version.into(),
            action: what.into(),
            detail: String::new(),
            halt_version: 1,
        }
    }

    #[test]
    fn the_guard_halts_once_sees_a_lift_and_then_judges_only_newer_reports() {
        let halt = Verdict::Halt {
            failed: 5,
            ran: 10,
            percent: 50.0,
        };
        let fine = Verdict::TooFew { ran: 0 };
        // Nothing done yet: the verdict decides.
        assert_eq!(step(&[], "c", "v2", false, &halt), Step::Halt);
        assert_eq!(step(&[], "c", "v2", false, &fine), Step::Nothing);
        // Held (by its halt or anyone's): nothing more.
        let done = [action(10, "v2", "halt")];
        assert_eq!(step(&done, "c", "v2", true, &halt), Step::Nothing);
        // Its halt no longer holds: the publisher lifted it. Recorded, not re-halted.
        assert_eq!(step(&done, "c", "v2", false, &halt), Step::Lifted);
        let lifted = [action(10, "v2", "halt"), action(20, "v2", "lifted")];
        assert_eq!(judged_from(&lifted, "c", "v2"), 20);
        assert_eq!(judged_from(&lifted, "c", "v3"), 0);
        assert_eq!(judged_from(&lifted, "other", "v2"), 0);
        // After the lift, the verdict on newer reports decides again.
        assert_eq!(step(&lifted, "c", "v2", false, &fine), Step::Nothing);
        assert_eq!(step(&lifted, "c", "v2", false, &halt), Step::Halt);
        // Refreshes do not count as halts; other releases and channels are apart.
        let refresh = [action(10, "", "refresh"), action(11, "v3", "halt")];
        assert_eq!(step(&refresh, "c", "v2", false, &fine), Step::Nothing);
    }
}
