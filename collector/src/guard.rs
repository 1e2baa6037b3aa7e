//! Pure: abort criteria over what the sites reported, like AWS IoT Jobs' (which failures
//! count, a minimum number of nodes that ran the release, a threshold percentage), per release
//! and optionally per wave. This decides only; the signed halt that nodes would honour is not
//! built yet (README: "Fleet status and automatic halt").

use serde::Serialize;

use crate::fleet::{NodeState, ReleaseStatus};

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
}
