//! Pure: what the failed nodes of one release have in common. Each failed node counts once,
//! with its evidence: the first line of its reported why and, when its failure bundle arrived,
//! the bundle's why and the output of its health checks (sections `health/…`; logs are left
//! out, their boilerplate is shared by healthy and failed nodes alike). The line most of them
//! share, when at least two and at least half of them share it, is the common cause the
//! guard's halt, `rollout-status` and the dashboard name: "9 of 10 failed node(s): kubelet:
//! failed to load config".

use std::collections::{BTreeMap, BTreeSet};

use fleet_report::Bundle;
use serde::Serialize;

use crate::history::{self, NodeState};
use crate::store::{BundleRow, Row};

/// Longest line compared, in characters (longer ones are cut; the why keeps its first 100
/// characters in the grouped counts, a check's line its first 200).
pub const MAX_LINE_CHARS: usize = 200;

/// One failed node's evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// The node id.
    pub node: String,
    /// Its reason, as reported (the first line counts).
    pub why: String,
    /// The output of its health checks, from its bundle (empty without one).
    pub checks: Vec<String>,
}

/// The line most failed nodes share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Common {
    /// The line (as sent: escape it to show it).
    pub line: String,
    /// Failed nodes whose evidence holds it.
    pub nodes: u64,
    /// Failed nodes.
    pub of: u64,
}

impl std::fmt::Display for Common {
    /// `9 of 10 failed node(s): kubelet: failed to load config` (the line escaped).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} failed node(s): {}",
            self.nodes,
            self.of,
            self.line.escape_debug()
        )
    }
}

/// Shortest line compared, in characters: a bare `FAIL`, `failed` or `exit 1` says nothing
/// about a shared cause.
pub const MIN_LINE_CHARS: usize = 8;

/// A line as compared: trimmed, cut to [`MAX_LINE_CHARS`]; None for one shorter than
/// [`MIN_LINE_CHARS`].
fn norm(line: &str) -> Option<String> {
    let t = line.trim();
    (t.chars().count() >= MIN_LINE_CHARS).then(|| t.chars().take(MAX_LINE_CHARS).collect())
}

/// The line shared by the most of `failed` (each node counted once), when at least two and at
/// least half of them share it. Ties go to a line of a check's output over the why's (the
/// evidence is nearer the cause than the summary), then to the longer line, then to the first
/// in byte order, so the answer does not depend on the order of `failed`.
pub fn common_line(failed: &[Evidence]) -> Option<Common> {
    let mut holders: BTreeMap<String, (BTreeSet<&str>, bool)> = BTreeMap::new();
    for e in failed {
        let why = e.why.lines().next().and_then(norm).map(|l| (l, false));
        let checks = e
            .checks
            .iter()
            .flat_map(|c| c.lines())
            .filter_map(norm)
            .map(|l| (l, true));
        for (line, from_check) in why.into_iter().chain(checks) {
            let h = holders.entry(line).or_default();
            h.0.insert(&e.node);
            h.1 |= from_check;
        }
    }
    let of = failed
        .iter()
        .map(|e| e.node.as_str())
        .collect::<BTreeSet<_>>()
        .len() as u64;
    let (line, (nodes, _)) = holders.into_iter().max_by(|a, b| {
        let key = |(line, (n, check)): &(String, (BTreeSet<&str>, bool))| {
            (n.len(), *check, line.chars().count())
        };
        key(a).cmp(&key(b)).then_with(|| b.0.cmp(&a.0))
    })?;
    let nodes = nodes.len() as u64;
    (nodes >= 2 && nodes * 2 >= of).then_some(Common { line, nodes, of })
}

/// One failed node of a release, with its bundle when one arrived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failed {
    /// The node id.
    pub node: String,
    /// Its site.
    pub site: String,
    /// Its state (stage failed, rolled back, fell back).
    pub state: NodeState,
    /// The state as shown, with a wait reported since: `rolled back, waiting (paused)`.
    pub label: String,
    /// Its reason, as reported.
    pub why: String,
    /// When the report of the failure was received (Unix seconds).
    pub received: u64,
    /// Its newest bundle about the release (the highest attempt), if any arrived.
    pub bundle: Option<Bundle>,
}

/// What the failed nodes of one release left behind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReleaseFailures {
    /// The release's version.
    pub version: String,
    /// Its generation.
    pub generation: u64,
    /// Its failed nodes, by node id.
    pub failed: Vec<Failed>,
    /// The line most of them share, if they share one.
    pub common: Option<Common>,
}

/// Per release with at least one failed node (newest generation first): the nodes whose
/// outcome ([`crate::history`]) is a failure, decided by a report received after `after`
/// (None: any), each with its newest bundle about the release from `bundles`, and their
/// common line.
pub fn failures(rows: &[Row], bundles: &[Bundle], after: Option<u64>) -> Vec<ReleaseFailures> {
    history::outcomes(rows)
        .into_iter()
        .rev()
        .filter_map(|((generation, version), nodes)| {
            let failed: Vec<Failed> = nodes
                .into_iter()
                .filter(|(_, o)| o.state.failed())
                .filter(|(_, o)| after.is_none_or(|t| o.decided_by.received > t))
                .map(|(node, o)| Failed {
                    node: node.to_string(),
                    site: o.decided_by.site.clone(),
                    state: o.state,
                    label: o.label(),
                    why: o.decided_by.outcome.why().unwrap_or_default().to_string(),
                    received: o.decided_by.received,
                    bundle: bundles
                        .iter()
                        .filter(|b| b.node.to_string() == node && b.version == version)
                        .max_by_key(|b| b.attempt)
                        .cloned(),
                })
                .collect();
            if failed.is_empty() {
                return None;
            }
            let evidence: Vec<Evidence> = failed.iter().map(evidence).collect();
            Some(ReleaseFailures {
                version: version.to_string(),
                generation,
                common: common_line(&evidence),
                failed,
            })
        })
        .collect()
}

/// Of the stored `bundles`, the ones [`failures`] pairs with a failed node: for each node whose
/// outcome about a release is a failure (any time), its bundle of the highest attempt at it.
pub fn shown<'a>(rows: &[Row], bundles: &'a [BundleRow]) -> Vec<&'a BundleRow> {
    let failed: BTreeSet<(&str, &str)> = history::outcomes(rows)
        .into_iter()
        .flat_map(|((_, version), nodes)| {
            nodes
                .into_iter()
                .filter(|(_, o)| o.state.failed())
                .map(move |(node, _)| (node, version))
        })
        .collect();
    let mut newest: BTreeMap<(&str, &str), &BundleRow> = BTreeMap::new();
    for b in bundles {
        let key = (b.node.as_str(), b.version.as_str());
        if failed.contains(&key) {
            let e = newest.entry(key).or_insert(b);
            if b.attempt > e.attempt {
                *e = b;
            }
        }
    }
    newest.into_values().collect()
}

/// A failed node's evidence: its reported why, and its bundle's check outputs.
fn evidence(f: &Failed) -> Evidence {
    let checks = f.bundle.iter().flat_map(|b| {
        b.sections
            .iter()
            .filter(|s| s.name.starts_with("health/"))
            .map(|s| s.text.clone())
    });
    Evidence {
        node: f.node.clone(),
        why: f.why.clone(),
        checks: checks.collect(),
    }
}

#[cfg(test)]
mod tests;
