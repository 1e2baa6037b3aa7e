//! The decision's inputs: what holds a claim or a stage back.

use super::*;
use crate::agent::channel::crd::{
    FleetRolloutStatus, SlotEntry, StageSpec, UpdateChannelSpec, UpdateChannelStatus,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn at(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
}

/// A channel of `concurrency` targeting v2, its slots held by `holders`.
fn channel(concurrency: u32, holders: &[&str], spec: UpdateChannelSpec) -> UpdateChannel {
    let mut ch = UpdateChannel::new(
        "stable",
        UpdateChannelSpec {
            url: "https://releases.example/stable/".into(),
            version: Some("v2".into()),
            concurrency,
            reboot_timeout: "15m".into(),
            ..spec
        },
    );
    ch.status = Some(UpdateChannelStatus {
        slots: holders
            .iter()
            .map(|n| SlotEntry {
                node: n.to_string(),
                token: "t".into(),
                claimed_at: at(0),
                phase: SlotPhase::Claimed,
                was_unschedulable: None,
                version: Some("v2".into()),
            })
            .collect(),
        ..Default::default()
    });
    ch
}

fn node(inactive: Inactive) -> NodeView {
    NodeView {
        name: "n1".into(),
        labels: BTreeMap::new(),
        unschedulable: false,
        token: None,
        cordoned_by_us: false,
        silent_at_start: None,
        not_ready: None,
        update: NodeUpdateStatus {
            booted_version: Some("v1".into()),
            inactive,
            ..Default::default()
        },
    }
}

fn run(ch: &UpdateChannel, node: &NodeView, inputs: &Inputs) -> Step {
    step(ch, &Policy::from_spec(&ch.spec), node, inputs)
}

fn staged() -> NodeView {
    node(Inactive::Staged("v2".into()))
}

proptest! {
    /// With every slot taken the claim waits, naming the holders, before any gate query.
    #[test]
    fn full_slots_wait_without_asking_the_gates(concurrency in 1u32..5, extra in 0usize..3) {
        let holders: Vec<String> = (0..concurrency as usize + extra).map(|i| format!("h{i}")).collect();
        let names: Vec<&str> = holders.iter().map(String::as_str).collect();
        let ch = channel(concurrency, &names, UpdateChannelSpec {
            blocking_pod_selector: Some("app=db".into()),
            ..Default::default()
        });
        let inputs = Inputs { gates: Verdict::Unknown, ..Inputs::open_at(at(0)) };
        prop_assert_eq!(run(&ch, &staged(), &inputs).action, Action::WaitForSlot { holders: holders.clone() });
        let free = channel(concurrency, &names[..concurrency as usize - 1], ch.spec.clone());
        prop_assert_eq!(run(&free, &staged(), &inputs).action, Action::Gather(Need::Gates));
    }

    /// A claim back-off holds claims until its end and no longer.
    #[test]
    fn a_claim_back_off_waits_until_its_end(left in 1i64..7200) {
        let ch = channel(1, &[], UpdateChannelSpec::default());
        let inputs = Inputs { claim_not_before: Some(at(left)), ..Inputs::open_at(at(0)) };
        prop_assert_eq!(run(&ch, &staged(), &inputs).action, Action::ClaimBackingOff { until: at(left) });
        let later = Inputs { now: at(left), ..inputs };
        prop_assert_eq!(run(&ch, &staged(), &later).action, Action::Claim { version: "v2".into() });
    }

    /// A stage back-off (on the stage clock) holds the stage quietly until its end.
    #[test]
    fn a_stage_back_off_waits_until_its_end(left in 1i64..7200) {
        let ch = channel(1, &[], UpdateChannelSpec::default());
        let inputs = Inputs { stage_not_before: Some(at(left)), ..Inputs::open_at(at(0)) };
        let empty = node(Inactive::Empty);
        prop_assert_eq!(run(&ch, &empty, &inputs).action, Action::StageBackingOff { until: at(left) });
        let later = Inputs { stage_now: at(left), ..inputs };
        prop_assert_eq!(run(&ch, &empty, &later).action, Action::Stage { version: "v2".into(), release: None, retry: None });
    }
}

#[test]
fn a_closed_gate_holds_the_claim_and_is_named() {
    let ch = channel(
        1,
        &[],
        UpdateChannelSpec {
            blocking_pod_selector: Some("app=db".into()),
            ..Default::default()
        },
    );
    let closed = Inputs {
        gates: Verdict::Closed("pod db-0 blocks".into()),
        ..Inputs::open_at(at(0))
    };
    assert_eq!(
        run(&ch, &staged(), &closed).action,
        Action::WaitForGate {
            version: "v2".into(),
            why: "pod db-0 blocks".into()
        }
    );
    // A gate is asked before the back-off is looked at, as the claim did.
    let both = Inputs {
        claim_not_before: Some(at(10)),
        ..closed
    };
    assert!(matches!(
        run(&ch, &staged(), &both).action,
        Action::WaitForGate { .. }
    ));
}

#[test]
fn a_spent_quota_waits_for_the_next_day_and_the_ledger_is_read_only_for_a_quota() {
    let quota = UpdateChannelSpec {
        stage: Some(StageSpec {
            windows: vec![],
            max_bytes_per_day: Some("1M".into()),
            prefer: None,
        }),
        ..Default::default()
    };
    let ch = channel(1, &[], quota);
    let empty = node(Inactive::Empty);
    let unread = Inputs {
        fetched_today: None,
        ..Inputs::open_at(at(0))
    };
    let day = Policy::from_spec(&ch.spec).unwrap().thin.day(at(0));
    assert_eq!(
        run(&ch, &empty, &unread).action,
        Action::Gather(Need::FetchedOn(day))
    );
    let spent = Inputs {
        fetched_today: Some(1 << 20),
        ..unread.clone()
    };
    let s = run(&ch, &empty, &spent);
    assert!(
        matches!(&s.action, Action::StageWaiting { version, why: Waiting::QuotaSpent { .. }, until } if version == "v2" && *until > at(0)),
        "{s:?}"
    );
    assert_eq!(s.stage, None);
    let some_left = Inputs {
        fetched_today: Some(1000),
        ..unread.clone()
    };
    let s = run(&ch, &empty, &some_left);
    assert_eq!(
        s.action,
        Action::Stage {
            version: "v2".into(),
            release: None,
            retry: None
        }
    );
    let plan = s.stage.unwrap();
    assert_eq!(
        (plan.max_bytes, plan.day, plan.fetched_today),
        (Some((1 << 20) - 1000), Some(day), 1000)
    );
    // Without a quota the ledger is not read.
    let free = channel(1, &[], UpdateChannelSpec::default());
    assert!(matches!(
        run(&free, &empty, &unread).action,
        Action::Stage { .. }
    ));
}

/// A channel that follows `latest`: its status says v2 (written by whichever agent holds the
/// poller Lease).
fn following_latest() -> UpdateChannel {
    let mut ch = channel(1, &[], UpdateChannelSpec::default());
    ch.spec.version = Some("latest".into());
    ch.status.as_mut().unwrap().latest_version = Some("v2".into());
    ch
}

/// A forged `status.latestVersion` (issue 25) does not start a rollout: before a claim, the
/// node asks its own signed channel, and claims only when both agree; a pinned channel needs
/// no such look.
#[test]
fn a_claim_for_latest_waits_until_the_nodes_own_signed_channel_agrees() {
    let ch = following_latest();
    let ask = Inputs::open_at(at(0));
    assert_eq!(
        run(&ch, &staged(), &ask).action,
        Action::Gather(Need::OwnLatest)
    );
    let differs = Inputs {
        own_latest: Some(Ok(Latest::plain("v1"))),
        ..Inputs::open_at(at(0))
    };
    match run(&ch, &staged(), &differs).action {
        Action::WaitForGate { version, why } => {
            assert_eq!(version, "v2");
            assert!(
                why.contains("latestVersion names v2") && why.contains("offers v1"),
                "{why}"
            );
        }
        other => panic!("claimed against its own channel: {other:?}"),
    }
    let failed = Inputs {
        own_latest: Some(Err("channel unreachable".into())),
        ..Inputs::open_at(at(0))
    };
    assert!(matches!(
        run(&ch, &staged(), &failed).action,
        Action::WaitForGate { ref why, .. } if why.contains("channel unreachable")
    ));
    let agrees = Inputs {
        own_latest: Some(Ok(Latest::plain("v2"))),
        ..Inputs::open_at(at(0))
    };
    assert_eq!(
        run(&ch, &staged(), &agrees).action,
        Action::Claim {
            version: "v2".into()
        }
    );
    // Pinned: the spec names the version, no latestVersion to check (the node's own verdict
    // on the pin is, see `a_claim_of_a_pin_asks_the_nodes_own_resolution_first`).
    let pinned = channel(1, &[], UpdateChannelSpec::default());
    assert!(matches!(
        run(&pinned, &staged(), &ask).action,
        Action::Claim { .. }
    ));
}

/// The channel withdrew v2 (issue 24): no node claims it, whether the poller already
/// published the withdrawal (`status.fleetRollout`) or only the node's own signed metadata
/// at the claim says so; a node that staged it drops it, whatever the target; a node that
/// runs it is not rolled back.
#[test]
fn a_withdrawn_release_is_never_claimed_and_a_staged_one_is_dropped() {
    let mut ch = following_latest();
    // Only the node's own resolution knows yet.
    let own = Inputs {
        own_latest: Some(Ok(Latest {
            version: "v1".into(),
            generation: None,
            waiting: None,
            withdrawn: vec!["v2".into()],
            retries: None,
        })),
        ..Inputs::open_at(at(0))
    };
    assert_eq!(
        run(&ch, &staged(), &own).action,
        Action::Withdrawn {
            version: "v2".into()
        }
    );
    // The poller published it, still naming v2 as the target (it has not moved yet).
    ch.status.as_mut().unwrap().fleet_rollout = Some(FleetRolloutStatus {
        cluster_seed: 7,
        withdrawn: vec!["v2".into()],
        withdrawn_target: Some("v2".into()),
        held_target: None,
    });
    let open = Inputs::open_at(at(0));
    assert_eq!(
        run(&ch, &staged(), &open).action,
        Action::DropWithdrawn {
            version: "v2".into()
        }
    );
    assert_eq!(
        run(&ch, &node(Inactive::Empty), &open).action,
        Action::Withdrawn {
            version: "v2".into()
        },
        "not staged either"
    );
    // The target moved back to v1, which the node runs: the staged v2 is still dropped.
    ch.status.as_mut().unwrap().latest_version = Some("v1".into());
    assert_eq!(
        run(&ch, &staged(), &open).action,
        Action::DropWithdrawn {
            version: "v2".into()
        }
    );
    // Once dropped (the slot marked bad), the node is up to date on v1.
    assert_eq!(
        run(&ch, &node(Inactive::Failed("v2".into())), &open).action,
        Action::Idle(IdleReason::UpToDate)
    );
    // A node that runs v2 keeps it (no rollback), and one that activated it goes on.
    let mut runs = node(Inactive::Empty);
    runs.update.booted_version = Some("v2".into());
    ch.status.as_mut().unwrap().latest_version = Some("v2".into());
    assert_eq!(
        run(&ch, &runs, &open).action,
        Action::Idle(IdleReason::UpToDate)
    );
    assert_ne!(
        run(&ch, &node(Inactive::Activated("v2".into())), &open).action,
        Action::DropWithdrawn {
            version: "v2".into()
        }
    );
    // The convenience `decide` sees the published withdrawal too.
    assert_eq!(
        decide(&ch, &staged(), at(0)),
        Action::DropWithdrawn {
            version: "v2".into()
        }
    );
}

/// A channel pinned to v2 whose poller found v2 held back by the channel's rollout (issue 24):
/// `status.fleetRollout.heldTarget` and the `WaitingForWave` condition.
fn pinned_and_held() -> UpdateChannel {
    let mut ch = channel(1, &[], UpdateChannelSpec::default());
    let st = ch.status.as_mut().unwrap();
    st.fleet_rollout = Some(FleetRolloutStatus {
        cluster_seed: 7,
        held_target: Some("v2".into()),
        ..Default::default()
    });
    st.set_condition(
        crate::agent::channel::crd::COND_WAITING_FOR_WAVE,
        true,
        "WaveNotStarted",
        "v2 (spec.version) waits: this cluster's wave starts at 2027-01-01T00:00:00Z".into(),
        at(0),
    );
    ch
}

/// A pinned release the channel's rollout holds back is a wait, never a stage or a claim (and
/// so never a stage failure): published by the poller, or found by the node's own resolution
/// before its first stage; once offered (or with `ignoreRollout`) the node proceeds as before.
#[test]
fn a_held_pinned_release_is_neither_staged_nor_claimed() {
    let open = Inputs::open_at(at(0));
    let held = pinned_and_held();
    let why = "v2 (spec.version) waits: this cluster's wave starts at 2027-01-01T00:00:00Z";
    let waits = Action::WaitForChannelWave {
        version: "v2".into(),
        why: why.into(),
    };
    assert_eq!(run(&held, &node(Inactive::Empty), &open).action, waits);
    // Staged before the hold (e.g. a pause): no claim either.
    assert_eq!(run(&held, &staged(), &open).action, waits);
    // A node holding a slot goes on (the slot table comes first).
    let mut holding = held.clone();
    holding.status.as_mut().unwrap().slots = channel(1, &["n1"], UpdateChannelSpec::default())
        .status
        .unwrap()
        .slots;
    let mut n = staged();
    n.token = Some("t".into());
    assert!(matches!(
        run(&holding, &n, &open).action,
        Action::Continue { .. }
    ));
    // A node already running it is up to date.
    let mut runs = node(Inactive::Empty);
    runs.update.booted_version = Some("v2".into());
    assert_eq!(
        run(&held, &runs, &open).action,
        Action::Idle(IdleReason::UpToDate)
    );
    // The hold is of another pin (the spec moved on): not this one.
    let mut moved = held.clone();
    moved.spec.version = Some("v3".into());
    assert_eq!(
        run(&moved, &node(Inactive::Empty), &open).action,
        Action::Stage {
            version: "v3".into(),
            release: None,
            retry: None
        }
    );
    // `ignoreRollout` takes it anyway, explicitly.
    let mut ignoring = held.clone();
    ignoring.spec.ignore_rollout = true;
    assert_eq!(
        run(&ignoring, &node(Inactive::Empty), &open).action,
        Action::Stage {
            version: "v2".into(),
            release: None,
            retry: None
        }
    );
    // The convenience `decide` sees the published hold too.
    assert_eq!(decide(&held, &node(Inactive::Empty), at(0)), waits);
}

#[test]
fn the_node_asks_its_own_resolution_before_the_first_stage_of_a_pin() {
    let ch = channel(1, &[], UpdateChannelSpec::default());
    let empty = node(Inactive::Empty);
    let ask = Inputs {
        own_pin: PinVerdict::Unknown,
        ..Inputs::open_at(at(0))
    };
    assert_eq!(
        run(&ch, &empty, &ask).action,
        Action::Gather(Need::OwnPinned)
    );
    let with = |own_pin| Inputs {
        own_pin,
        ..ask.clone()
    };
    let s = run(
        &ch,
        &empty,
        &with(PinVerdict::Held("its wave starts at T".into())),
    );
    assert_eq!(
        (s.action, s.stage),
        (
            Action::WaitForChannelWave {
                version: "v2".into(),
                why: "its wave starts at T".into()
            },
            None
        )
    );
    assert_eq!(
        run(&ch, &empty, &with(PinVerdict::Withdrawn)).action,
        Action::Withdrawn {
            version: "v2".into()
        }
    );
    // Offered, or the channel not resolvable (the stage reports what fails, or stages from
    // an offline bundle): the stage goes ahead with its plan.
    for own in [
        PinVerdict::Offered,
        PinVerdict::Unresolved("unreachable".into()),
    ] {
        let s = run(&ch, &empty, &with(own));
        assert_eq!(
            s.action,
            Action::Stage {
                version: "v2".into(),
                release: None,
                retry: None
            }
        );
        assert!(s.stage.is_some());
    }
    // Asked only when the stage would run now: a stage back-off is waited out first.
    let backing_off = Inputs {
        stage_not_before: Some(at(60)),
        ..ask.clone()
    };
    assert_eq!(
        run(&ch, &empty, &backing_off).action,
        Action::StageBackingOff { until: at(60) }
    );
    // A channel following `latest` never asks (the poller's resolution is its target).
    let latest = following_latest();
    assert_eq!(
        run(&latest, &empty, &ask).action,
        Action::Stage {
            version: "v2".into(),
            release: None,
            retry: None
        }
    );
}

/// Before a claim of a pinned release the node asks its own signed channel too: the poller may
/// not have published a withdrawal yet. Not resolvable (an offline site staging from bundles)
/// holds nothing back, as before.
#[test]
fn a_claim_of_a_pin_asks_the_nodes_own_resolution_first() {
    let ch = channel(1, &[], UpdateChannelSpec::default());
    let with = |own_pin| Inputs {
        own_pin,
        ..Inputs::open_at(at(0))
    };
    assert_eq!(
        run(&ch, &staged(), &with(PinVerdict::Unknown)).action,
        Action::Gather(Need::OwnPinned)
    );
    assert_eq!(
        run(&ch, &staged(), &with(PinVerdict::Withdrawn)).action,
        Action::Withdrawn {
            version: "v2".into()
        }
    );
    assert_eq!(
        run(&ch, &staged(), &with(PinVerdict::Held("paused".into()))).action,
        Action::WaitForChannelWave {
            version: "v2".into(),
            why: "paused".into()
        }
    );
    for own in [
        PinVerdict::Offered,
        PinVerdict::Unresolved("unreachable".into()),
    ] {
        assert_eq!(
            run(&ch, &staged(), &with(own)).action,
            Action::Claim {
                version: "v2".into()
            }
        );
    }
}

#[test]
fn a_pin_verdict_is_read_from_the_resolution() {
    use crate::agent::channel::pinned::Pinned;
    use libupgrade::rollout::{Hold, Seed};
    let seed = Seed::new(9).unwrap();
    assert_eq!(
        PinVerdict::of(Ok(&Pinned::offered("v2")), seed),
        PinVerdict::Offered
    );
    let paused = Pinned {
        version: "v2".into(),
        hold: Some(Hold::Paused { since: at(0) }),
        withdrawn: Vec::new(),
    };
    let PinVerdict::Held(why) = PinVerdict::of(Ok(&paused), seed) else {
        panic!("held");
    };
    assert!(
        why.starts_with("v2 (spec.version) waits: its rollout is paused since"),
        "{why}"
    );
    let gone = Pinned {
        hold: Some(Hold::Withdrawn { at: at(0) }),
        ..paused.clone()
    };
    assert_eq!(PinVerdict::of(Ok(&gone), seed), PinVerdict::Withdrawn);
    // Taken with ignoreRollout but listed as withdrawn: still withdrawn.
    let listed = Pinned {
        withdrawn: vec!["v2".into()],
        ..Pinned::offered("v2")
    };
    assert_eq!(PinVerdict::of(Ok(&listed), seed), PinVerdict::Withdrawn);
    assert_eq!(
        PinVerdict::of(Err("no route".into()), seed),
        PinVerdict::Unresolved("no route".into())
    );
}

/// A staged node whose Node is not Ready claims nothing and says why (the kubelet down: no
/// update starts there); Ready again, it claims.
#[test]
fn a_node_that_is_not_ready_does_not_claim_and_says_why() {
    use k8s_openapi::api::core::v1::NodeCondition;
    let ch = channel(1, &[], UpdateChannelSpec::default());
    let cond = |status: &str| NodeCondition {
        type_: "Ready".into(),
        status: status.into(),
        reason: Some("KubeletNotReady".into()),
        message: Some("container runtime network not ready".into()),
        ..Default::default()
    };
    let why = not_ready(&[cond("False")]).unwrap();
    assert!(
        why.contains("not Ready") && why.contains("KubeletNotReady"),
        "{why}"
    );
    assert!(not_ready(&[cond("Unknown")]).unwrap().contains("Unknown"));
    assert!(not_ready(&[]).is_some());
    assert_eq!(not_ready(&[cond("True")]), None);
    let down = NodeView {
        not_ready: Some(why.clone()),
        ..staged()
    };
    let s = run(&ch, &down, &Inputs::open_at(Utc::now()));
    assert_eq!(
        s.action,
        Action::WaitForGate {
            version: "v2".into(),
            why
        }
    );
    let s = run(&ch, &staged(), &Inputs::open_at(Utc::now()));
    assert!(
        !matches!(s.action, Action::WaitForGate { .. }),
        "{:?}",
        s.action
    );
}

/// A node whose inactive slot is the bad v2, with its own record: v2 of generation 2 failed
/// once, at `1_800_000_000`, on `50-app`.
fn failed_v2_here() -> NodeView {
    let mut failed = node(Inactive::Failed("v2".into()));
    failed.update.failed = vec![libupgrade::state::FailedRelease {
        version: "v2".into(),
        generation: Some(2),
        attempts: 1,
        at: 1_800_000_000,
        why: "50-app: app is down".into(),
    }];
    failed
}

/// A target that failed on this node (its own record, failed once at `at(0)`; its inactive slot
/// the bad v2) is judged by `decide_retry` with the retries of this node's own resolution:
/// asked first, then held without retries, held until the backoff has passed with one retry,
/// then staged over the bad slot, announced as the retry.
#[test]
fn a_release_that_failed_here_is_retried_only_as_the_node_s_own_resolution_of_its_rollout_allows() {
    let ch = following_latest();
    let failed = failed_v2_here();
    let own = |retries, now| Inputs {
        own_latest: Some(Ok(Latest {
            retries,
            ..Latest::plain("v2")
        })),
        ..Inputs::open_at(now)
    };
    assert_eq!(
        run(&ch, &failed, &Inputs::open_at(at(10))).action,
        Action::Gather(Need::OwnLatest)
    );
    let why = |a: Action| match a {
        Action::Idle(IdleReason::FailedHere { why, .. }) => why,
        other => panic!("not held: {other:?}"),
    };
    let none = why(run(&ch, &failed, &own(None, at(100_000))).action);
    assert!(none.ends_with("its rollout allows retries"), "{none}");
    let one = Some(libupgrade::rollout::Retries {
        count: 1,
        backoff_secs: 3600,
    });
    let soon = why(run(&ch, &failed, &own(one, at(3599))).action);
    assert!(
        soon.contains("retry 1 of 1 the rollout allows, not before"),
        "{soon}"
    );
    // The status's word is not enough: another release offered by this node's own resolution
    // brings no retries for v2.
    let other = Inputs {
        own_latest: Some(Ok(Latest {
            retries: one,
            ..Latest::plain("v3")
        })),
        ..Inputs::open_at(at(3600))
    };
    why(run(&ch, &failed, &other).action);
    assert_eq!(
        run(&ch, &failed, &own(one, at(3600))).action,
        Action::Stage {
            version: "v2".into(),
            release: None,
            retry: Some(
                "retrying v2: it failed 1 time(s) on this node (last: 50-app: app is down); \
                 retry 1 of 1 its rollout allows"
                    .into()
            )
        }
    );
}

/// The target's version failed here as generation 2 (its record, its bad slot) and the channel
/// republished it as generation 3: this node's own resolution names generation 3, another
/// release, staged as a first attempt over the bad slot, however few retries the rollout
/// allows; while its own resolution still names generation 2, it stays held.
#[test]
fn a_release_republished_under_the_failed_version_is_staged_as_another_release() {
    let ch = following_latest();
    let failed = failed_v2_here();
    let own = |generation| Inputs {
        own_latest: Some(Ok(Latest {
            generation: Some(generation),
            ..Latest::plain("v2")
        })),
        ..Inputs::open_at(at(100_000))
    };
    assert_eq!(
        run(&ch, &failed, &Inputs::open_at(at(10))).action,
        Action::Gather(Need::OwnLatest),
        "the target's generation is this node's own resolution's word"
    );
    assert!(
        matches!(
            run(&ch, &failed, &own(2)).action,
            Action::Idle(IdleReason::FailedHere { .. })
        ),
        "generation 2 failed here"
    );
    assert_eq!(
        run(&ch, &failed, &own(3)).action,
        Action::Stage {
            version: "v2".into(),
            release: None,
            retry: None,
        }
    );
}
