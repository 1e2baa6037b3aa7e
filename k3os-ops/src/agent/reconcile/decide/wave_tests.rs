//! Property tests of `decide` under `spec.rollout` (waves): whatever the fleet, the batches and
//! how far the rollout is, a staged node gets `Claim` exactly when it is a canary or its wave
//! is admitted by the published `status.rollout`, and `WaitForWave` otherwise; nothing but
//! the claim is held back (staging goes on, a pause still wins).

use crate::agent;

use std::collections::BTreeMap;

use agent::channel::crd::*;
use agent::channel::rollout::{advance, waves, Member, Rollout};
use agent::host::status::{Inactive, NodeUpdateStatus};
use agent::reconcile::decide::{decide, Action, NodeView};
use chrono::{DateTime, Utc};
use proptest::prelude::*;

fn at(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
}

fn channel(rollout: RolloutSpec, status: Option<RolloutStatus>) -> UpdateChannel {
    UpdateChannel::test()
        .rollout(rollout)
        .status(Some(UpdateChannelStatus {
            rollout: status,
            ..Default::default()
        }))
        .build()
}

fn node(name: &str, inactive: Inactive) -> NodeView {
    NodeView {
        name: name.into(),
        labels: BTreeMap::from([("role".to_string(), "worker".to_string())]),
        unschedulable: false,
        token: None,
        cordoned_by_us: false,
        silent_at_start: None,
        not_ready: None,
        update: NodeUpdateStatus {
            booted_version: Some("v1".into()),
            booted_on_trial: false,
            inactive,
            failed_trial: None,
            failed: Vec::new(),
        },
    }
}

proptest! {
    #[test]
    fn a_node_claims_only_in_an_admitted_wave(
        n in 1usize..30,
        canaries in proptest::collection::btree_set(0usize..30, 0..3),
        batches in proptest::collection::vec(1u32..50, 0..3),
        done in proptest::collection::vec(any::<bool>(), 30),
        published in any::<bool>(),
    ) {
        let names: Vec<String> = (0..n).map(|i| format!("worker-{i}")).collect();
        let spec = RolloutSpec {
            canary: Some(CanarySpec {
                node_selector: BTreeMap::new(),
                nodes: canaries.iter().filter(|c| **c < n).map(|c| names[*c].clone()).collect(),
            }),
            batches,
            settle_time: Some("0s".into()),
        };
        prop_assume!(spec.batches.iter().sum::<u32>() <= 100);
        let r = Rollout::from_spec(&spec).unwrap();
        let members: Vec<Member> = (0..n)
            .map(|i| Member { name: names[i].clone(), labels: BTreeMap::new(), done: done[i] })
            .collect();
        let status = published.then(|| advance(&r, &members, "v2", None, at(0)));
        let ch = channel(spec.clone(), status.clone());
        let w = waves(&r, &members);
        let wave_of = |i: usize| w.iter().position(|wave| wave.contains(&i)).unwrap() as u32 + 1;
        let canary = |i: usize| spec.canary.as_ref().unwrap().nodes.contains(&names[i]);
        for (i, name) in names.iter().enumerate() {
            let view = node(name, Inactive::Staged("v2".into()));
            let action = decide(&ch, &view, at(1));
            let admitted_wave = status.as_ref().map_or(0, |s| s.wave);
            let should = canary(i) || wave_of(i) <= admitted_wave;
            match &action {
                Action::Claim { version } => {
                    prop_assert_eq!(version, "v2");
                    prop_assert!(should, "{} (wave {}) claimed with {:?}", name, wave_of(i), status);
                }
                Action::WaitForWave { .. } => {
                    prop_assert!(!should, "{} (wave {}) held back with {:?}", name, wave_of(i), status);
                }
                other => prop_assert!(false, "unexpected {other:?}"),
            }
            // Staging is never held back by the waves.
            let empty = node(name, Inactive::Empty);
            prop_assert_eq!(decide(&ch, &empty, at(1)), Action::Stage { version: "v2".into(), release: None, retry: None });
        }
        // A pause wins over the waves.
        let mut paused = ch.clone();
        paused.spec.paused = true;
        let view = node(&names[0], Inactive::Staged("v2".into()));
        prop_assert_eq!(decide(&paused, &view, at(1)), Action::PausedBySpec { version: "v2".into() });
    }
}

#[test]
fn without_a_published_status_only_canaries_claim() {
    let spec = RolloutSpec {
        canary: Some(CanarySpec {
            node_selector: BTreeMap::from([("role".to_string(), "canary".to_string())]),
            nodes: vec!["named".into()],
        }),
        batches: vec![50],
        settle_time: None,
    };
    let ch = channel(spec, None);
    let staged = |name: &str| node(name, Inactive::Staged("v2".into()));
    assert_eq!(
        decide(&ch, &staged("named"), at(0)),
        Action::Claim {
            version: "v2".into()
        }
    );
    let mut labelled = staged("other");
    labelled.labels.insert("role".into(), "canary".into());
    assert_eq!(
        decide(&ch, &labelled, at(0)),
        Action::Claim {
            version: "v2".into()
        }
    );
    assert_eq!(
        decide(&ch, &staged("worker"), at(0)),
        Action::WaitForWave {
            version: "v2".into(),
            admitted: 0,
            waves: 0
        }
    );
}
