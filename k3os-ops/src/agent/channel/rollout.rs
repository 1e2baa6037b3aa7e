//! Waves (`spec.rollout`): which nodes may update now, decided the same way by every agent
//! without coordination. Pure: no clock, no network.
//!
//! **Who is in which wave.** Canaries first (`rollout.canary`: a label selector and/or node
//! names) as one wave; then the other selected nodes in batches of `rollout.batches` percent
//! each (what the listed batches leave is one more batch), in the order of a stable hash of the
//! node name ([`rank_key`]: the first 8 bytes of its SHA-256). A batch of `p` percent of `m`
//! nodes ends at rank `ceil(cumulative% × m / 100)`; empty waves (a small fleet) are dropped.
//! Every agent and the counter compute the same partition from the same names.
//!
//! **Who may claim.** An agent knows only itself, so the agent that counts the fleet
//! ([`crate::agent::fleet::counter`], one per channel by Lease) publishes how far the rollout is in
//! `status.rollout`: the admitted wave and the rank key of the last node of the admitted batches
//! (`admitKey`). A node may claim when it is a canary, or its own key is at most `admitKey`:
//! one comparison, no list of nodes in the status (a 1000-node fleet writes 16 hex digits, not
//! 1000 names). Canaries are always admitted; without a published status only they are.
//!
//! **When the next wave starts** ([`advance`]): when every node of the admitted waves is done
//! (runs the target and is blessed — phase `UpToDate` — or failed with it: failures are
//! `maxFailures`' business, which pauses the channel as without waves) and `settleTime` has
//! passed since the counter first saw that (`settlingSince`, on the counter's clock). A new
//! target starts over at the first wave. When all waves are done every node is admitted
//! (`admitKey` is the largest key), so a node that joins later is not held back.
//!
//! Two nodes with the same key (a 1 in 2⁶⁴ chance for a pair) fall into the same batch.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use super::crd::{RolloutSpec, RolloutStatus};
use super::duration;

/// `spec.rollout`, parsed and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    canary_labels: BTreeMap<String, String>,
    canary_nodes: BTreeSet<String>,
    /// Cumulative percentages of the batches; the last is 100.
    cumulative: Vec<u32>,
    pub settle: Duration,
}

impl Rollout {
    /// Parse `spec.rollout`; the error names the field.
    pub fn from_spec(spec: &RolloutSpec) -> Result<Rollout, String> {
        let mut cumulative = Vec::new();
        let mut sum = 0u32;
        for (i, p) in spec.batches.iter().enumerate() {
            if *p == 0 || *p > 100 {
                return Err(format!(
                    "spec.rollout.batches[{i}]: {p} is not a percentage from 1 to 100"
                ));
            }
            sum += p;
            if sum > 100 {
                return Err(format!(
                    "spec.rollout.batches: the batches add up to {sum}%, more than 100%"
                ));
            }
            cumulative.push(sum);
        }
        if sum < 100 {
            cumulative.push(100);
        }
        let settle = match &spec.settle_time {
            Some(s) => duration::parse("spec.rollout.settleTime", s).map_err(|e| e.to_string())?,
            None => Duration::ZERO,
        };
        let canary = spec.canary.clone().unwrap_or_default();
        Ok(Rollout {
            canary_labels: canary.node_selector,
            canary_nodes: canary.nodes.into_iter().collect(),
            cumulative,
            settle,
        })
    }

    /// Whether the node is a canary (named, or matching a non-empty canary selector).
    pub fn is_canary(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        self.canary_nodes.contains(name)
            || (!self.canary_labels.is_empty()
                && self
                    .canary_labels
                    .iter()
                    .all(|(k, v)| labels.get(k) == Some(v)))
    }
}

/// The stable rank of a node among the non-canaries: the first 8 bytes of SHA-256 of its name.
pub fn rank_key(name: &str) -> u64 {
    let d = Sha256::digest(name.as_bytes());
    u64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

/// `admitKey`'s text: 16 hex digits.
pub fn key_text(key: u64) -> String {
    format!("{key:016x}")
}

/// One selected node as the counter sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Runs the target and is blessed, or failed with it.
    pub done: bool,
}

/// The non-empty waves of `members` (indices into it): canaries first, then the batches.
pub fn waves(r: &Rollout, members: &[Member]) -> Vec<Vec<usize>> {
    let (canaries, mut rest): (Vec<usize>, Vec<usize>) =
        (0..members.len()).partition(|&i| r.is_canary(&members[i].name, &members[i].labels));
    rest.sort_by_key(|&i| (rank_key(&members[i].name), members[i].name.clone()));
    let m = rest.len() as u64;
    let mut out = vec![canaries];
    let mut start = 0usize;
    for c in &r.cumulative {
        let end = (u64::from(*c) * m).div_ceil(100) as usize;
        out.push(rest[start..end.max(start)].to_vec());
        start = end.max(start);
    }
    out.retain(|w| !w.is_empty());
    out
}

/// Whether this node may claim now, and if not, what it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// Waves up to `admitted` of `waves` may update (0: only canaries, nothing published yet).
    NotYet {
        admitted: u32,
        waves: u32,
    },
}

/// Whether node `name` may claim for `target` under `status` (see the module docs).
pub fn admission(
    r: &Rollout,
    status: Option<&RolloutStatus>,
    target: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Admission {
    if r.is_canary(name, labels) {
        return Admission::Admitted;
    }
    let Some(st) = status.filter(|s| s.target == target) else {
        return Admission::NotYet {
            admitted: 0,
            waves: 0,
        };
    };
    let admitted = st
        .admit_key
        .as_deref()
        .and_then(|k| u64::from_str_radix(k, 16).ok())
        .is_some_and(|k| rank_key(name) <= k);
    if admitted {
        Admission::Admitted
    } else {
        Admission::NotYet {
            admitted: st.wave,
            waves: st.waves,
        }
    }
}

/// The rollout's next status for `target`, from the members' progress and the previous status
/// (see the module docs).
pub fn advance(
    r: &Rollout,
    members: &[Member],
    target: &str,
    prev: Option<&RolloutStatus>,
    now: DateTime<Utc>,
) -> RolloutStatus {
    let waves = waves(r, members);
    let n = waves.len() as u32;
    // 0-based index of the first wave with a node not done; n when all are done.
    let first_open = waves
        .iter()
        .position(|w| w.iter().any(|&i| !members[i].done))
        .map_or(n, |p| p as u32);
    let prev = prev.filter(|p| p.target == target);
    let mut wave = prev.map_or(1, |p| p.wave).clamp(1, n.max(1));
    let mut settling = prev.and_then(|p| p.settling_since);
    let settle = chrono::Duration::from_std(r.settle).unwrap_or(chrono::Duration::MAX);
    loop {
        if first_open < wave || wave >= n {
            settling = None;
            break;
        }
        // Waves 1..=wave are done: the next starts once they have settled.
        let since = *settling.get_or_insert(now);
        if now - since >= settle {
            wave += 1;
            settling = None;
        } else {
            break;
        }
    }
    let admit_key = if first_open >= n {
        Some(u64::MAX)
    } else {
        waves
            .iter()
            .take(wave as usize)
            .flatten()
            .filter(|&&i| !r.is_canary(&members[i].name, &members[i].labels))
            .map(|&i| rank_key(&members[i].name))
            .max()
    };
    RolloutStatus {
        target: target.to_string(),
        waves: n,
        wave: wave.min(n),
        admit_key: admit_key.map(key_text),
        settling_since: settling,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::channel::crd::CanarySpec;
    use proptest::prelude::*;

    fn rollout(canaries: &[&str], batches: &[u32], settle: &str) -> Rollout {
        Rollout::from_spec(&RolloutSpec {
            canary: Some(CanarySpec {
                node_selector: BTreeMap::new(),
                nodes: canaries.iter().map(|s| s.to_string()).collect(),
            }),
            batches: batches.to_vec(),
            settle_time: Some(settle.into()),
        })
        .unwrap()
    }

    fn members(n: usize, done: &[usize]) -> Vec<Member> {
        (0..n)
            .map(|i| Member {
                name: format!("node-{i}"),
                labels: BTreeMap::new(),
                done: done.contains(&i),
            })
            .collect()
    }

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    #[test]
    fn bad_batches_and_settle_times_name_the_field() {
        let spec = |batches: Vec<u32>, settle: &str| RolloutSpec {
            canary: None,
            batches,
            settle_time: Some(settle.into()),
        };
        let e = Rollout::from_spec(&spec(vec![0], "1m")).unwrap_err();
        assert!(e.contains("spec.rollout.batches[0]"), "{e}");
        let e = Rollout::from_spec(&spec(vec![60, 50], "1m")).unwrap_err();
        assert!(e.contains("110%"), "{e}");
        let e = Rollout::from_spec(&spec(vec![10], "soon")).unwrap_err();
        assert!(e.contains("spec.rollout.settleTime"), "{e}");
    }

    #[test]
    fn canaries_first_then_batches_by_rank() {
        let r = rollout(&["node-2"], &[50], "0s");
        let m = members(5, &[]);
        let w = waves(&r, &m);
        assert_eq!(w.len(), 3, "{w:?}");
        assert_eq!(w[0], vec![2]);
        assert_eq!(w[1].len(), 2);
        assert_eq!(w[2].len(), 2);
        let keys: Vec<u64> = w[1..]
            .iter()
            .flatten()
            .map(|&i| rank_key(&m[i].name))
            .collect();
        assert!(keys.windows(2).all(|k| k[0] <= k[1]), "ranked by key");
    }

    /// Three nodes, a canary and `batches: [50]`: three waves of one node each (what the
    /// agent fleet test's rollout relies on).
    #[test]
    fn three_nodes_with_a_canary_and_half_batches_go_one_at_a_time() {
        let r = rollout(&["node-1"], &[50], "1s");
        let w = waves(&r, &members(3, &[]));
        assert_eq!(w.len(), 3, "{w:?}");
        assert_eq!(w[0], vec![1]);
        assert!(w.iter().all(|wave| wave.len() == 1), "{w:?}");
        let mut all: Vec<usize> = w.into_iter().flatten().collect();
        all.sort();
        assert_eq!(all, [0, 1, 2], "every node in one wave");
    }

    #[test]
    fn the_next_wave_waits_for_the_last_one_to_settle() {
        let r = rollout(&["node-0"], &[50], "10m");
        let m0 = members(3, &[]);
        let s = advance(&r, &m0, "v2", None, t(0));
        assert_eq!((s.wave, s.waves, s.admit_key.as_deref()), (1, 3, None));
        // The canary is done: the clock of the settle starts, nobody else yet.
        let m1 = members(3, &[0]);
        let s = advance(&r, &m1, "v2", Some(&s), t(60));
        assert_eq!((s.wave, s.settling_since), (1, Some(t(60))));
        let s = advance(&r, &m1, "v2", Some(&s), t(60 + 599));
        assert_eq!(s.wave, 1);
        let s = advance(&r, &m1, "v2", Some(&s), t(60 + 600));
        assert_eq!((s.wave, s.settling_since), (2, None));
        let key = s.admit_key.clone().unwrap();
        let admitted: Vec<bool> = (1..3)
            .map(|i| {
                let name = format!("node-{i}");
                admission(&r, Some(&s), "v2", &name, &BTreeMap::new()) == Admission::Admitted
            })
            .collect();
        assert_eq!(admitted.iter().filter(|a| **a).count(), 1, "{key}");
        // A new target starts over.
        let s2 = advance(&r, &m1, "v3", Some(&s), t(700));
        assert_eq!(s2.wave, 1);
    }

    proptest! {
        /// Every node is in exactly one wave; canaries alone in the first; batch sizes follow
        /// the percentages; and the admitted set only grows as nodes finish, reaching all.
        #[test]
        fn waves_partition_and_admission_grows(
            n in 1usize..40,
            canaries in proptest::collection::btree_set(0usize..40, 0..4),
            batches in proptest::collection::vec(1u32..60, 0..4),
            order in proptest::collection::vec(any::<u16>(), 40),
        ) {
            let total: u32 = batches.iter().sum();
            prop_assume!(total <= 100);
            let names: Vec<String> = canaries.iter().filter(|c| **c < n).map(|c| format!("node-{c}")).collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let r = rollout(&refs, &batches, "0s");
            let mut m = members(n, &[]);
            let w = waves(&r, &m);
            let mut seen: Vec<usize> = w.iter().flatten().copied().collect();
            seen.sort();
            prop_assert_eq!(seen, (0..n).collect::<Vec<_>>());
            if !names.is_empty() {
                prop_assert_eq!(w[0].len(), names.len());
            }
            // Finish nodes one at a time in any order, only admitted ones: the admitted set
            // never shrinks and ends with everybody.
            let mut status: Option<RolloutStatus> = None;
            let mut admitted_before = 0usize;
            let mut k = 0i64;
            loop {
                let s = advance(&r, &m, "v2", status.as_ref(), t(k));
                let admitted: Vec<usize> = (0..n)
                    .filter(|&i| admission(&r, Some(&s), "v2", &m[i].name, &m[i].labels) == Admission::Admitted)
                    .collect();
                prop_assert!(admitted.len() >= admitted_before);
                admitted_before = admitted.len();
                let next = admitted.iter().copied().filter(|&i| !m[i].done)
                    .min_by_key(|&i| order[i]);
                status = Some(s);
                match next {
                    Some(i) => m[i].done = true,
                    None => break,
                }
                k += 1;
            }
            let s = advance(&r, &m, "v2", status.as_ref(), t(k + 1));
            prop_assert_eq!(s.admit_key.as_deref(), Some("ffffffffffffffff"));
            prop_assert_eq!(admitted_before, n);
        }
    }
}
