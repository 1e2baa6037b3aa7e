//! The fleet at a glance: the selected nodes counted by version and phase, the `Complete`
//! condition and the waves' progress, derived from what every agent writes on its own Node
//! (`k3os.io/update-phase` and `k3os.io/update-version`). Pure: the counter
//! ([`crate::agent::fleet::counter`]) lists the Nodes and writes the result through [`crate::agent::cluster::slots`].

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use kube::api::ObjectMeta;

use super::crd::{NodeCounts, UpdateChannel, UpdateChannelStatus, COND_COMPLETE};
use super::format::{ANN_PHASE, ANN_VERSION};
use super::rollout::{self, Member, Rollout};
use crate::agent::phase::Phase;

/// One Node as the counter reads it (labels and two annotations: its metadata only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `k3os.io/update-phase`.
    pub phase: Option<String>,
    /// `k3os.io/update-version`: the version the node booted.
    pub version: Option<String>,
}

impl NodeFacts {
    pub fn from_meta(meta: &ObjectMeta) -> NodeFacts {
        let ann = |k: &str| meta.annotations.as_ref().and_then(|a| a.get(k)).cloned();
        NodeFacts {
            name: meta.name.clone().unwrap_or_default(),
            labels: meta.labels.clone().unwrap_or_default(),
            phase: ann(ANN_PHASE),
            version: ann(ANN_VERSION),
        }
    }

    /// Runs `target` with its update finished (blessed: phase `UpToDate`).
    pub fn updated(&self, target: &str) -> bool {
        self.version.as_deref() == Some(target)
            && self.phase.as_deref() == Some(Phase::UpToDate.as_str())
    }
}

/// Count `nodes` (all selected by the channel) against `target`.
pub fn count(target: Option<&str>, nodes: &[NodeFacts]) -> NodeCounts {
    let mut by_version: BTreeMap<String, u32> = BTreeMap::new();
    let mut by_phase: BTreeMap<String, u32> = BTreeMap::new();
    let mut updated = 0u32;
    for n in nodes {
        let v = n.version.clone().unwrap_or_else(|| "unknown".into());
        *by_version.entry(v).or_default() += 1;
        let p = n.phase.clone().unwrap_or_else(|| "Unknown".into());
        *by_phase.entry(p).or_default() += 1;
        if target.is_some_and(|t| n.updated(t)) {
            updated += 1;
        }
    }
    let total = nodes.len() as u32;
    NodeCounts {
        total,
        updated,
        progress: format!("{updated}/{total}"),
        target: target.map(String::from),
        by_version,
        by_phase,
    }
}

/// What a count changed that deserves an Event on the channel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetChange {
    /// The rollout moved to wave `.0` of `.1`.
    pub wave_started: Option<(u32, u32)>,
    /// `Complete` turned true.
    pub completed: bool,
}

/// Recompute the fleet part of `st` (counts, `Complete`, the waves) for `ch` from `nodes`
/// (the Nodes the channel selects); `rollout` is the channel's parsed `spec.rollout`.
pub fn refresh(
    ch: &UpdateChannel,
    st: &mut UpdateChannelStatus,
    nodes: &[NodeFacts],
    rollout: Option<&Rollout>,
    now: DateTime<Utc>,
) -> FleetChange {
    let target = ch.target_version();
    let counts = count(target.as_deref(), nodes);
    let was_complete = st
        .conditions
        .iter()
        .any(|c| c.type_ == COND_COMPLETE && c.status == "True");
    let (complete, reason, message) = match &target {
        None => (false, "NoTarget", "no target version yet".to_string()),
        Some(t) if counts.total > 0 && counts.updated == counts.total => (
            true,
            "AllUpdated",
            format!("all {} selected node(s) run {t}", counts.total),
        ),
        Some(t) => (
            false,
            "InProgress",
            format!(
                "{} of {} selected node(s) run {t}",
                counts.updated, counts.total
            ),
        ),
    };
    st.set_condition(COND_COMPLETE, complete, reason, message, now);
    st.nodes = Some(counts);
    let mut change = FleetChange {
        completed: complete && !was_complete,
        ..FleetChange::default()
    };
    let (Some(r), Some(t)) = (rollout, target.as_deref()) else {
        st.rollout = None;
        return change;
    };
    let failed = |n: &str| st.failures.iter().any(|f| f.node == n && f.version == t);
    let members: Vec<Member> = nodes
        .iter()
        .map(|n| Member {
            name: n.name.clone(),
            labels: n.labels.clone(),
            done: n.updated(t) || failed(&n.name),
        })
        .collect();
    let prev = st.rollout.clone().filter(|p| p.target == t);
    let next = rollout::advance(r, &members, t, prev.as_ref(), now);
    if next.waves > 0 && prev.as_ref().is_none_or(|p| p.wave != next.wave) {
        change.wave_started = Some((next.wave, next.waves));
    }
    st.rollout = Some(next);
    change
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::channel::crd::FailureRecord;

    fn node(name: &str, phase: &str, version: &str) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            labels: BTreeMap::new(),
            phase: Some(phase.into()),
            version: Some(version.into()),
        }
    }

    fn channel(target: &str) -> UpdateChannel {
        // The fixture's concurrency, rebootTimeout and maxFailures do not enter the counts.
        UpdateChannel::test()
            .url("https://releases.example/")
            .version(Some(target))
            .status(None)
            .build()
    }

    #[test]
    fn counts_by_version_and_phase_and_complete_when_all_run_the_target() {
        let ch = channel("v2");
        let mut st = UpdateChannelStatus::default();
        let mut nodes = vec![
            node("a", "UpToDate", "v2"),
            node("b", "Staged", "v1"),
            NodeFacts {
                name: "c".into(),
                labels: BTreeMap::new(),
                phase: None,
                version: None,
            },
        ];
        let now = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let change = refresh(&ch, &mut st, &nodes, None, now);
        let c = st.nodes.clone().unwrap();
        assert_eq!((c.total, c.updated, c.progress.as_str()), (3, 1, "1/3"));
        assert_eq!(c.by_version["v1"], 1);
        assert_eq!(c.by_version["unknown"], 1);
        assert_eq!(c.by_phase["Unknown"], 1);
        assert!(!change.completed);
        let cond = |st: &UpdateChannelStatus| {
            st.conditions
                .iter()
                .find(|c| c.type_ == COND_COMPLETE)
                .map(|c| (c.status.clone(), c.reason.clone()))
        };
        assert_eq!(cond(&st), Some(("False".into(), "InProgress".into())));
        nodes[1] = node("b", "UpToDate", "v2");
        nodes[2] = node("c", "UpToDate", "v2");
        let change = refresh(&ch, &mut st, &nodes, None, now);
        assert!(change.completed);
        assert_eq!(cond(&st), Some(("True".into(), "AllUpdated".into())));
        // Counted again: no new completion.
        assert!(!refresh(&ch, &mut st, &nodes, None, now).completed);
        // A node on the target but still confirming is not updated yet.
        nodes[2] = node("c", "Confirming", "v2");
        refresh(&ch, &mut st, &nodes, None, now);
        assert_eq!(st.nodes.as_ref().unwrap().updated, 2);
    }

    #[test]
    fn a_failed_node_does_not_hold_its_wave_back() {
        let mut ch = channel("v2");
        ch.spec.rollout = Some(crate::agent::channel::crd::RolloutSpec {
            canary: Some(crate::agent::channel::crd::CanarySpec {
                nodes: vec!["a".into()],
                ..Default::default()
            }),
            batches: vec![],
            settle_time: None,
        });
        let r = Rollout::from_spec(ch.spec.rollout.as_ref().unwrap()).unwrap();
        let now = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let mut st = UpdateChannelStatus::default();
        let nodes = vec![node("a", "Failed", "v1"), node("b", "Staged", "v1")];
        let change = refresh(&ch, &mut st, &nodes, Some(&r), now);
        assert_eq!(change.wave_started, Some((1, 2)));
        st.failures.push(FailureRecord {
            node: "a".into(),
            version: "v2".into(),
            at: now,
            reason: "x".into(),
        });
        let change = refresh(&ch, &mut st, &nodes, Some(&r), now);
        assert_eq!(change.wave_started, Some((2, 2)));
    }
}
