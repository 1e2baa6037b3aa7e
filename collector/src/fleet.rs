//! Pure: what the sites reported, per release and wave, for `release rollout-status
//! --reports`, the guard and the dashboard. Each node counts once per release, in the outcome
//! [`crate::history`] decides from all its reports about it (a failure stands through later
//! waits until the node tries the release again).

use std::collections::BTreeMap;

use fleet_report::{Outcome, WaitFor};
use serde::Serialize;

use crate::history::NodeState;
use crate::history::{self, NodeOutcome};
use crate::store::Row;

/// What the nodes of one wave (or of no known wave) reported about one release.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WaveStatus {
    /// The wave's number from 1 (None: the nodes' seeds are unknown, or the release has no
    /// waves).
    pub wave: Option<usize>,
    /// Nodes that reported about the release.
    pub nodes: u64,
    /// Of those, nodes it was offered to (any state but waiting: their wave came and they
    /// took it up).
    pub offered: u64,
    /// Nodes per state.
    pub states: BTreeMap<NodeState, u64>,
    /// Failed nodes that reported a wait since (and have not tried again), per what they
    /// wait for: "failed, waiting (paused)". They are counted in their failure's state too.
    pub failed_waiting: BTreeMap<WaitFor, u64>,
    /// Failed nodes per state and reason (the reason's first line, at most 100 characters).
    pub failures: BTreeMap<String, u64>,
}

/// What the nodes reported about one release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReleaseStatus {
    /// The release's version.
    pub version: String,
    /// Its generation.
    pub generation: u64,
    /// Per wave, in order (the unknown wave last).
    pub waves: Vec<WaveStatus>,
    /// Nodes whose newest report about the release is older than the silence limit, and
    /// which are not done with it (blessed, failed or dropped are done).
    pub silent: u64,
    /// When the newest report about it was received (Unix seconds).
    pub last_report: u64,
}

/// The fleet's reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FleetStatus {
    /// Nodes that ever reported.
    pub nodes: u64,
    /// Sites they belong to.
    pub sites: u64,
    /// Reports read.
    pub reports: u64,
    /// Reports the nodes dropped unsent (the sum of each node's running total).
    pub dropped: u64,
    /// "Silent" means no report received since this time (Unix seconds).
    pub silent_since: u64,
    /// Per release, newest generation first.
    pub releases: Vec<ReleaseStatus>,
}

/// A failure's reason as grouped: `kind: first line` (at most 100 characters, escaped).
pub fn reason(o: &Outcome) -> String {
    let why = o.why().unwrap_or_default();
    let line: String = why
        .lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(100)
        .collect();
    format!("{}: {}", o.kind(), line.escape_debug())
}

/// Summarize `rows` (every stored report); `wave_of(version, seed)` places a node in a wave of
/// that release's rollout (1-based); nodes silent since `silent_since` are counted as silent.
pub fn summarize(
    rows: &[Row],
    wave_of: &dyn Fn(&str, Option<u32>) -> Option<usize>,
    silent_since: u64,
) -> FleetStatus {
    summarize_decided_after(rows, wave_of, silent_since, None)
}

/// [`summarize`], counting only the nodes whose outcome was decided by a report received
/// after `after` (Unix seconds; None: every node): the guard judges a release only on what
/// happened since the publisher lifted its halt.
pub fn summarize_decided_after(
    rows: &[Row],
    wave_of: &dyn Fn(&str, Option<u32>) -> Option<usize>,
    silent_since: u64,
    after: Option<u64>,
) -> FleetStatus {
    let mut dropped: BTreeMap<&str, u64> = BTreeMap::new();
    let mut sites: std::collections::BTreeSet<&str> = Default::default();
    for r in rows {
        sites.insert(&r.site);
        let d = dropped.entry(&r.node).or_default();
        *d = (*d).max(r.dropped);
    }
    let mut releases: Vec<ReleaseStatus> = history::outcomes(rows)
        .into_iter()
        .rev()
        .map(|((generation, version), nodes)| {
            let counted = nodes
                .values()
                .filter(|o| after.is_none_or(|t| o.decided_by.received > t));
            release(generation, version, counted, wave_of, silent_since)
        })
        .filter(|r| !r.waves.is_empty())
        .collect();
    for r in &mut releases {
        r.waves.sort_by_key(|w| (w.wave.is_none(), w.wave));
    }
    FleetStatus {
        nodes: dropped.len() as u64,
        sites: sites.len() as u64,
        reports: rows.len() as u64,
        dropped: dropped.values().sum(),
        silent_since,
        releases,
    }
}

/// One release's status from its nodes' outcomes.
fn release<'a>(
    generation: u64,
    version: &str,
    nodes: impl Iterator<Item = &'a NodeOutcome<'a>>,
    wave_of: &dyn Fn(&str, Option<u32>) -> Option<usize>,
    silent_since: u64,
) -> ReleaseStatus {
    let mut rel = ReleaseStatus {
        version: version.to_string(),
        generation,
        waves: Vec::new(),
        silent: 0,
        last_report: 0,
    };
    for o in nodes {
        rel.last_report = rel.last_report.max(o.newest.received);
        if o.newest.received < silent_since && !o.done() {
            rel.silent += 1;
        }
        let wave = wave_of(version, o.newest.seed);
        let w = match rel.waves.iter().position(|w| w.wave == wave) {
            Some(i) => &mut rel.waves[i],
            None => {
                rel.waves.push(WaveStatus {
                    wave,
                    ..WaveStatus::default()
                });
                rel.waves.last_mut().expect("just pushed")
            }
        };
        w.nodes += 1;
        if o.state != NodeState::Waiting {
            w.offered += 1;
        }
        *w.states.entry(o.state).or_default() += 1;
        if o.state.failed() {
            *w.failures.entry(reason(&o.decided_by.outcome)).or_default() += 1;
            if let Some(wait) = o.then_waiting {
                *w.failed_waiting.entry(wait).or_default() += 1;
            }
        }
    }
    rel
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_report::Transfer;

    fn row(node: &str, seq: u64, version: &str, outcome: Outcome, seed: u32) -> Row {
        Row {
            node: node.into(),
            site: format!("site-{node}"),
            seq,
            at: seq,
            received: 1000 + seq,
            channel: "c".into(),
            version: version.into(),
            generation: version[1..].parse().unwrap(),
            outcome,
            seed: Some(seed),
            dropped: 0,
        }
    }

    #[test]
    fn each_node_counts_once_per_release_in_its_newest_state_and_wave() {
        let staged = Outcome::Staged {
            bytes: 1,
            by: Transfer::Chunks,
        };
        let rows = vec![
            row("a", 1, "v2", staged.clone(), 5_000),
            row("a", 2, "v2", Outcome::TrialBoot, 5_000),
            row("a", 3, "v2", Outcome::Blessed, 5_000),
            row("b", 1, "v2", staged.clone(), 50_000),
            row(
                "b",
                2,
                "v2",
                Outcome::RolledBack {
                    why: "check node-ready failed\nmore".into(),
                },
                50_000,
            ),
            row(
                "c",
                1,
                "v2",
                Outcome::RolledBack {
                    why: "check node-ready failed".into(),
                },
                60_000,
            ),
            row(
                "d",
                1,
                "v2",
                Outcome::Waiting {
                    wait_for: fleet_report::WaitFor::Wave,
                    until: Some(9),
                },
                900_000,
            ),
            row("d", 2, "v3", staged, 900_000),
        ];
        // Waves: 1 % (seeds below 10,000), 10 %, 100 %.
        let wave_of = |_: &str, seed: Option<u32>| {
            seed.map(|s| {
                if s < 10_000 {
                    1
                } else if s < 100_000 {
                    2
                } else {
                    3
                }
            })
        };
        let f = summarize(&rows, &wave_of, 1002);
        assert_eq!((f.nodes, f.sites, f.reports), (4, 4, 8));
        assert_eq!(f.releases[0].version, "v3", "newest first");
        let v2 = &f.releases[1];
        let waves: Vec<_> = v2.waves.iter().map(|w| (w.wave, w.nodes)).collect();
        assert_eq!(waves, vec![(Some(1), 1), (Some(2), 2), (Some(3), 1)]);
        assert_eq!(v2.waves[0].states.get(&NodeState::Blessed), Some(&1));
        assert_eq!(
            (v2.waves[2].nodes, v2.waves[2].offered),
            (1, 0),
            "d waits in wave 3"
        );
        assert_eq!(v2.waves[1].offered, 2);
        assert_eq!(v2.waves[1].states.get(&NodeState::RolledBack), Some(&2));
        assert_eq!(
            v2.waves[1]
                .failures
                .get("rolled_back: check node-ready failed"),
            Some(&2),
            "{:?}",
            v2.waves[1].failures
        );
        // d waits (received 1001, before 1002): silent; a's bless and b, c's failures are done.
        assert_eq!(v2.silent, 1);
        assert_eq!(v2.last_report, 1003);
    }

    #[test]
    fn halted_canaries_that_wait_stay_failed_and_the_guard_judges_only_newer_outcomes() {
        let staged = Outcome::Staged {
            bytes: 1,
            by: Transfer::Full,
        };
        let failed = Outcome::RolledBack {
            why: "check node-ready failed".into(),
        };
        let paused = Outcome::Waiting {
            wait_for: fleet_report::WaitFor::Pause,
            until: None,
        };
        // Three canaries fail and then wait for the halt; a fourth stages again after it.
        let mut rows = Vec::new();
        for n in ["a", "b", "c", "d"] {
            rows.push(row(n, 1, "v2", staged.clone(), 5_000));
            rows.push(row(n, 2, "v2", failed.clone(), 5_000));
            rows.push(row(n, 3, "v2", paused.clone(), 5_000));
        }
        rows.push(row("d", 4, "v2", staged.clone(), 5_000));
        let wave_of = |_: &str, _: Option<u32>| Some(1);
        let f = summarize(&rows, &wave_of, 0);
        let w = &f.releases[0].waves[0];
        assert_eq!((w.nodes, w.offered), (4, 4), "{w:?}");
        assert_eq!(w.states.get(&NodeState::RolledBack), Some(&3), "{w:?}");
        assert_eq!(w.states.get(&NodeState::Staged), Some(&1), "{w:?}");
        assert_eq!(w.states.get(&NodeState::Waiting), None, "{w:?}");
        assert_eq!(
            w.failed_waiting.get(&fleet_report::WaitFor::Pause),
            Some(&3),
            "{w:?}"
        );
        assert_eq!(
            w.failures.get("rolled_back: check node-ready failed"),
            Some(&3)
        );
        // The guard after a lift at 1003 (received 1000 + seq): only d's new attempt counts.
        let since = summarize_decided_after(&rows, &wave_of, 0, Some(1003));
        let w = &since.releases[0].waves[0];
        assert_eq!((w.nodes, w.offered), (1, 1), "{w:?}");
        assert_eq!(w.states.get(&NodeState::Staged), Some(&1), "{w:?}");
        assert!(summarize_decided_after(&rows, &wave_of, 0, Some(2000))
            .releases
            .is_empty());
    }
}
