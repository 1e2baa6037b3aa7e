//! The agent fleet: three agents, one per node, update the nodes from v1 to v2
//! through one shared fake API server, each over a real `LibupgradeNode`, reboots simulated by
//! the driver, invariants checked on every state the world passes through (see `fleet_rig` for
//! the rig, the invariants and how a reboot is played).
//!
//! Scenarios: the happy rollout at concurrency 1 and 2, a v2 whose Node never becomes Ready
//! (rolled back, recorded, the channel paused, nobody else moves), a holder whose agent dies for
//! good while Draining, and the DaemonSet rolled from the v0.1.0 agent mid-rollout (the v0.1.0
//! holder coming back and finishing, or never coming back).

use k3os_ops_testing::fake_api;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::fleet_rig::*;
use agent::testing::ANN_CORDONED;
use bootconfig::Slot;
use fake_api::NS;
use k3os_ops::agent;
use serde_json::json;
async fn rollout(concurrency: u32) {
    let started = Instant::now();
    let mut fleet = Fleet::new(Scenario::at(concurrency));
    fleet
        .run_until("every node UpToDate and no slot held", |f| {
            (0..NODES).all(|i| f.phase(i).as_deref() == Some("UpToDate"))
                && holders(&f.world.lock().unwrap()).is_empty()
        })
        .await;
    fleet.stop().await;

    let m = fleet.monitor.lock().unwrap();
    assert_eq!(
        m.peak_holders, concurrency as usize,
        "the slots were contended, so the peak is the bound"
    );
    for (node, tokens) in &m.claims {
        assert_eq!(
            tokens.len(),
            1,
            "{node} held slots under {} tokens: a claim was lost and made again",
            tokens.len()
        );
    }
    assert_eq!(m.claims.len(), NODES);
    assert_eq!(
        m.least_available,
        Some(2),
        "the budget was used to its limit"
    );
    drop(m);
    let w = fleet.world.lock().unwrap();
    assert!(
        w.conflicts as usize >= NODES - 1,
        "the first claims raced on one resourceVersion: all but one must have got 409, got {}",
        w.conflicts
    );
    assert!(
        w.evictions_refused > 0,
        "the PodDisruptionBudget never refused an eviction: the drain's 429 path was not exercised"
    );
    drop(w);
    let log = fleet.log.lock().unwrap().clone();
    assert!(
        log.iter().any(|l| l == "event: WaitingForSlot"),
        "no agent ever waited for a slot"
    );
    let ch = fleet.channel();
    assert_eq!(ch["status"]["slots"], json!([]), "{}", ch["status"]);
    assert_eq!(ch["status"]["failures"], json!([]), "{}", ch["status"]);
    assert_eq!(condition(&ch, "Paused").as_deref(), Some("False"));
    assert_eq!(fleet.reboots, vec![1; NODES], "one reboot per node");
    let reports = fleet.reports.lock().unwrap().clone();
    for i in 0..NODES {
        let name = node_name(i);
        let node = fleet.world.lock().unwrap().node(&name).clone();
        assert_eq!(node["spec"]["unschedulable"], false, "{name}");
        assert_eq!(annotation(&node, ANN_CORDONED), None, "{name}");
        assert!(fake_api::node_ready(&node), "{name}");
        let st = fleet.slots(i);
        let b = slot_of(&st, Slot::B);
        assert_eq!(st.booted, Some(Slot::B), "{name}: {st:#?}");
        assert_eq!(b.version.as_deref(), Some("v2"), "{name}: {st:#?}");
        assert_eq!(
            b.state,
            libupgrade::state::SlotState::Good,
            "{name}: {st:#?}"
        );
        let verdict = st.verdict.as_ref().unwrap();
        assert_eq!(
            verdict.outcome,
            libupgrade::state::Outcome::Blessed,
            "{name}: {verdict:?}"
        );
        assert!(
            verdict
                .checks
                .iter()
                .any(|c| c.name == agent::testing::NODE_READY && c.ok),
            "{name}: {verdict:?}"
        );
        assert!(
            reports
                .iter()
                .any(|r| r.starts_with(&format!("{name}: node-ready ok=true"))
                    && r.ends_with("-> Ok(Healthy)")),
            "{name}: {reports:#?}"
        );
        // The bless is in the loader: the next power-on stays on B.
        assert_eq!(fleet.rigs[i].power_cycle(), Slot::B, "{name}");
        fleet.rigs[i].init_confirm_good("B is good");
    }
    let samples = fleet.monitor.lock().unwrap().samples;
    let refused = fleet.world.lock().unwrap().evictions_refused;
    eprintln!(
        "concurrency {concurrency}: {samples} states sampled, {refused} evictions refused by the budget, {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_update_one_at_a_time_under_a_disruption_budget() {
    rollout(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_update_two_at_a_time_under_a_disruption_budget() {
    rollout(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_that_never_becomes_ready_rolls_back_and_pauses_the_fleet() {
    let started = Instant::now();
    let mut fleet = Fleet::new(Scenario {
        ready_wait: Duration::from_secs(1),
        first_trial_never_ready: true,
        ..Scenario::at(1)
    });
    fleet
        .run_until("the failed node back on v1 and the others paused", |f| {
            let Some(bad) = f.bad else { return false };
            (0..NODES).all(|i| {
                let want = if i == bad { "Failed" } else { "Paused" };
                f.phase(i).as_deref() == Some(want)
            }) && holders(&f.world.lock().unwrap()).is_empty()
        })
        .await;
    fleet.stop().await;
    let bad = fleet.bad.unwrap();
    let bad_name = node_name(bad);

    // The agent reported Node-Ready failed; the core rolled back.
    let reports = fleet.reports.lock().unwrap().clone();
    assert_eq!(reports.len(), 1, "{reports:#?}");
    assert!(
        reports[0].starts_with(&format!("{bad_name}: node-ready ok=false"))
            && reports[0].contains("RolledBack"),
        "{reports:#?}"
    );
    // Back on v1 after the driver's next power cycle, B bad.
    assert_eq!(fleet.reboots[bad], 2, "into v2 and back");
    let st = fleet.slots(bad);
    assert_eq!(st.booted, Some(Slot::A), "{st:#?}");
    assert_eq!(slot_of(&st, Slot::A).version.as_deref(), Some("v1"));
    assert_eq!(
        slot_of(&st, Slot::A).state,
        libupgrade::state::SlotState::Good
    );
    assert_eq!(slot_of(&st, Slot::B).version.as_deref(), Some("v2"));
    assert_eq!(
        slot_of(&st, Slot::B).state,
        libupgrade::state::SlotState::Bad
    );

    // The failure is recorded and the channel paused.
    let ch = fleet.channel();
    let failures = ch["status"]["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{}", ch["status"]);
    assert_eq!(failures[0]["node"], bad_name.as_str());
    assert_eq!(failures[0]["version"], "v2");
    assert!(
        failures[0]["reason"]
            .as_str()
            .unwrap()
            .contains(agent::testing::NODE_READY),
        "{}",
        failures[0]
    );
    assert_eq!(ch["status"]["slots"], json!([]));
    assert_eq!(condition(&ch, "Paused").as_deref(), Some("True"));

    // The others never proceeded: no slot, no cordon, no reboot, still on v1 (v2 staged).
    let m = fleet.monitor.lock().unwrap();
    assert_eq!(
        m.claims.keys().collect::<Vec<_>>(),
        [&bad_name],
        "{:?}",
        m.claims
    );
    assert_eq!(m.claims[&bad_name].len(), 1, "{:?}", m.claims);
    assert_eq!(m.ever_cordoned, BTreeSet::from([bad_name.clone()]));
    drop(m);
    assert!(fleet.world.lock().unwrap().conflicts as usize >= NODES - 1);
    for i in (0..NODES).filter(|i| *i != bad) {
        let name = node_name(i);
        assert_eq!(fleet.reboots[i], 0, "{name}");
        let st = fleet.slots(i);
        assert_eq!(st.booted, Some(Slot::A), "{name}: {st:#?}");
        assert_eq!(slot_of(&st, Slot::A).version.as_deref(), Some("v1"));
        assert_eq!(
            slot_of(&st, Slot::B).state,
            libupgrade::state::SlotState::Staged
        );
    }
    for i in 0..NODES {
        let node = fleet.world.lock().unwrap().node(&node_name(i)).clone();
        assert_eq!(node["spec"]["unschedulable"], false, "{}", node_name(i));
        assert!(fake_api::node_ready(&node), "{}", node_name(i));
    }
    eprintln!("never Ready: {:?}", started.elapsed());
}

/// The DaemonSet is rolled from v0.1.0's agent to this one in the middle of a
/// rollout. The world starts as the v0.1.0 agents left it (fixtures produced by running the
/// v0.1.0 code): node-1 holds the slot at `Rebooting` under a v0.1.0 token and is down,
/// node-2 and node-3 have staged v2 and wait, an earlier failure of node-0 is recorded. The
/// current agents honour node-1's claim (nobody else claims while it is held, its token is
/// never replaced), node-1's current agent finishes it, the others follow one at a time, and
/// every write migrates the status to format 2. A write under the v0.1.0 token after the
/// release is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_started_by_the_v010_agent_is_finished_by_this_one() {
    let old = v010_fixture("updatechannel.json");
    let old_slots = old["status"]["slots"].as_array().unwrap().clone();
    assert_eq!(old_slots.len(), 1, "{old_slots:?}");
    assert_eq!(old_slots[0]["node"], "node-1");
    assert_eq!(old_slots[0]["phase"], "Rebooting");
    assert!(
        old["status"].get("formatVersion").is_none(),
        "v0.1.0 wrote no format marker"
    );
    let old_token = old_slots[0]["token"].as_str().unwrap().to_string();
    let old_failures = old["status"]["failures"].clone();
    assert_eq!(old_failures.as_array().unwrap().len(), 1, "{old_failures}");

    let mut fleet = Fleet::new(Scenario {
        from_v010: true,
        ..Scenario::at(1)
    });
    fleet
        .run_until("every node UpToDate and no slot held", |f| {
            (0..NODES).all(|i| f.phase(i).as_deref() == Some("UpToDate"))
                && holders(&f.world.lock().unwrap()).is_empty()
        })
        .await;
    fleet.stop().await;

    {
        let m = fleet.monitor.lock().unwrap();
        assert_eq!(
            m.claims.get("node-1"),
            Some(&vec![old_token.clone()]),
            "node-1's v0.1.0 claim must be honoured under its own token, not dropped or claimed again"
        );
        for n in ["node-2", "node-3"] {
            assert_eq!(
                m.claims.get(n).map(Vec::len),
                Some(1),
                "{n}: {:?}",
                m.claims
            );
        }
        assert_eq!(m.peak_holders, 1);
    }
    // node-2 and node-3 did not claim before node-1's v0.1.0 slot was released.
    let log = fleet.log.lock().unwrap().clone();
    let first_release = log
        .iter()
        .position(|l| l.starts_with("api: slots=[]"))
        .expect("node-1 released its slot");
    assert!(
        !log[..first_release]
            .iter()
            .any(|l| l.starts_with("api: slots=")
                && (l.contains("node-2:") || l.contains("node-3:"))),
        "a slot was claimed while node-1's v0.1.0 claim was held: {log:#?}"
    );
    assert!(log.iter().any(|l| l == "event: WaitingForSlot"));

    let ch = fleet.channel();
    assert_eq!(ch["status"]["formatVersion"], 2, "{}", ch["status"]);
    assert_eq!(ch["status"]["slots"], json!([]));
    assert_eq!(
        ch["status"]["failures"], old_failures,
        "the v0.1.0 failure record is kept as it was"
    );
    assert_eq!(fleet.reboots, vec![1; NODES], "one reboot per node");
    for i in 0..NODES {
        let name = node_name(i);
        let node = fleet.world.lock().unwrap().node(&name).clone();
        assert_eq!(node["spec"]["unschedulable"], false, "{name}");
        assert_eq!(annotation(&node, ANN_CORDONED), None, "{name}");
        assert_eq!(
            annotation(&node, agent::testing::ANN_FORMAT),
            Some("2"),
            "{name}: the annotations were migrated"
        );
        let st = fleet.slots(i);
        assert_eq!(st.booted, Some(Slot::B), "{name}: {st:#?}");
        assert_eq!(slot_of(&st, Slot::B).version.as_deref(), Some("v2"));
        assert_eq!(
            slot_of(&st, Slot::B).state,
            libupgrade::state::SlotState::Good
        );
    }

    // A zombie v0.1.0 agent of node-1 writing under its old token changes nothing.
    let client = fake_api::client(&fleet.world, &fleet.log);
    let store = agent::testing::KubeChannelStore::new(client, NS, "stable");
    let before = fleet.channel();
    let fenced = agent::testing::slots::fence(
        &store,
        "node-1",
        &old_token,
        agent::testing::crd::SlotPhase::Rebooting,
        None,
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    assert_eq!(fenced, agent::testing::slots::FenceOutcome::Lost);
    let released = agent::testing::slots::release(&store, "node-1", &old_token, chrono::Utc::now())
        .await
        .unwrap();
    assert!(!released);
    assert_eq!(fleet.channel(), before, "a stale-token write was accepted");
}

/// A holder whose agent dies for good while Draining (its Node stays up,
/// cordoned by it) is reclaimed after rebootTimeout, and the reclaimer undoes that cordon
/// before it frees the slot: the node was only cordoned for an update that is now abandoned,
/// and at concurrency 1 the next node cordons only once the first is schedulable again
/// (invariant 5: never more Ready nodes cordoned than `concurrency`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_dies_while_draining_is_uncordoned_by_the_reclaimer() {
    let mut fleet = Fleet::new(Scenario {
        dies_while_draining: true,
        ..Scenario::at(1)
    });
    fleet
        .run_until(
            "the dead holder reclaimed and the next node draining",
            |f| {
                let Some(v) = f.victim else { return false };
                (0..NODES).any(|i| i != v && f.phase(i).as_deref() == Some("Draining"))
            },
        )
        .await;
    let victim = node_name(fleet.victim.unwrap());
    fleet.stop().await;
    let node = fleet.world.lock().unwrap().node(&victim).clone();
    assert_eq!(
        node["spec"]["unschedulable"], false,
        "{victim} left cordoned"
    );
    assert_eq!(annotation(&node, ANN_CORDONED), None, "{victim}");
    let ch = fleet.channel();
    assert!(
        !holders(&fleet.world.lock().unwrap())
            .iter()
            .any(|(n, _, _)| *n == victim),
        "{}",
        ch["status"]
    );
    assert_eq!(
        ch["status"]["failures"],
        json!([]),
        "dying before the flip is no failure of the version"
    );
    let log = fleet.log.lock().unwrap().clone();
    assert!(
        log.iter().any(|l| l.starts_with("event-on: UpdateChannel")
            && l.contains(&format!("reclaimed the slot of node {victim}"))
            && l.contains("uncordoned it")),
        "{log:#?}"
    );
    assert!(fleet.reboots.iter().all(|r| *r == 0), "{:?}", fleet.reboots);
}

/// The other way a v0.1.0 claim ends: node-1, rebooting under the v0.1.0
/// agent, never comes back. Its v0.1.0 Lease (renewTime long past) is judged by the current
/// agents on their own clocks, so the slot is honoured for at least rebootTimeout after they
/// start watching it — nobody claims meanwhile — and then reclaimed as a failure of v2 (it
/// went silent after its flip), node-1 staying down and cordoned; node-2 and node-3 then
/// update one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v010_holder_that_never_returns_is_reclaimed_only_after_reboot_timeout() {
    let old = v010_fixture("updatechannel.json");
    let old_token = old["status"]["slots"][0]["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut fleet = Fleet::new(Scenario {
        from_v010: true,
        v010_holder_never_returns: true,
        ..Scenario::at(1)
    });
    // The current agents have just started (at the end of Fleet::new).
    let started = Instant::now();
    fleet
        .run_until("node-2 and node-3 UpToDate and no slot held", |f| {
            (1..NODES).all(|i| f.phase(i).as_deref() == Some("UpToDate"))
                && holders(&f.world.lock().unwrap()).is_empty()
        })
        .await;
    fleet.stop().await;
    {
        let m = fleet.monitor.lock().unwrap();
        assert_eq!(
            m.claims.get("node-1"),
            Some(&vec![old_token.clone()]),
            "{:?}",
            m.claims
        );
        let held_for = m.released_at["node-1"].duration_since(started);
        assert!(
            held_for >= Duration::from_secs(3),
            "node-1's v0.1.0 slot was reclaimed {held_for:?} after the agents started, before rebootTimeout (3s)"
        );
        for n in ["node-2", "node-3"] {
            assert_eq!(
                m.claims.get(n).map(Vec::len),
                Some(1),
                "{n}: {:?}",
                m.claims
            );
            assert!(
                m.released_at.get("node-1") <= m.released_at.get(n),
                "{n} released before node-1's slot was reclaimed"
            );
        }
        assert_eq!(m.peak_holders, 1);
    }
    let log = fleet.log.lock().unwrap().clone();
    let reclaimed = log
        .iter()
        .position(|l| l.starts_with("api: slots=[]"))
        .expect("node-1's slot reclaimed");
    assert!(
        !log[..reclaimed]
            .iter()
            .any(|l| l.starts_with("api: slots=")
                && (l.contains("node-2:") || l.contains("node-3:"))),
        "a slot was claimed while node-1's v0.1.0 claim was held: {log:#?}"
    );
    let ch = fleet.channel();
    let failures = ch["status"]["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 2, "{}", ch["status"]);
    assert_eq!(failures[1]["node"], "node-1");
    assert_eq!(failures[1]["version"], "v2");
    assert!(
        failures[1]["reason"]
            .as_str()
            .unwrap()
            .contains("rebootTimeout"),
        "{}",
        failures[1]
    );
    assert_eq!(ch["status"]["formatVersion"], 2);
    assert_eq!(fleet.reboots, vec![0, 1, 1]);
    let w = fleet.world.lock().unwrap();
    let n1 = w.node("node-1");
    assert_eq!(
        n1["spec"]["unschedulable"], true,
        "down after its flip: stays cordoned"
    );
    assert!(!fake_api::node_ready(n1));
    for i in 1..NODES {
        let n = w.node(&node_name(i));
        assert_eq!(n["spec"]["unschedulable"], false, "{}", node_name(i));
    }
}

/// How many `reason` Events the channel got.
fn on_channel(log: &[String], reason: &str) -> usize {
    log.windows(2)
        .filter(|l| {
            l[0] == format!("event: {reason}")
                && l[1].starts_with("event-on: UpdateChannel k3os-system/stable")
        })
        .count()
}

/// A canary first, then batches by percentage of the other nodes,
/// each starting only when the one before is blessed (phase UpToDate) and settled (1 s), even
/// though concurrency 3 would let every node go at once; the channel counts the fleet
/// (`status.nodes`: 3/3 on v2 at the end, `Complete`), and carries an Event per wave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waves_go_canary_first_and_each_batch_after_the_last_is_blessed_and_settled() {
    let rollout = json!({"canary": {"nodes": ["node-2"]}, "batches": [50], "settleTime": "1s"});
    let mut fleet = Fleet::new(Scenario {
        rollout: Some(rollout),
        ..Scenario::at(3)
    });
    fleet
        .run_until(
            "every node UpToDate, the channel Complete and said so",
            |f| {
                let ch = f.world.lock().unwrap().channel.clone();
                // The world before the log: the fake API takes the log while it holds the
                // world, so holding the log while asking the world deadlocks.
                let up = (0..NODES).all(|i| f.phase(i).as_deref() == Some("UpToDate"));
                let log = f.log.lock().unwrap();
                up && condition(&ch, "Complete").as_deref() == Some("True")
                    && on_channel(&log, "RolloutComplete") == 1
                    && on_channel(&log, "SlotReleased") == NODES
            },
        )
        .await;
    fleet.stop().await;
    let m = fleet.monitor.lock().unwrap();
    assert_eq!(m.peak_holders, 1, "one wave of one node at a time");
    // One node per wave (the canary, then 50% of the other two, then the rest:
    // `rollout::waves`, unit-tested there), so the order of the claims is the order of the
    // waves.
    let mut order: Vec<String> = m.claimed_at.keys().cloned().collect();
    order.sort_by_key(|n| m.claimed_at[n]);
    assert_eq!(order.len(), NODES, "{order:?}");
    assert_eq!(order[0], "node-2", "the canary first: {order:?}");
    for pair in order.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        let blessed = m.updated_at[before];
        let claimed = m.claimed_at[after];
        assert!(
            claimed >= blessed + Duration::from_secs(1),
            "{after} claimed {:?} after {before} was blessed: before its wave settled",
            claimed.saturating_duration_since(blessed)
        );
    }
    drop(m);
    let ch = fleet.channel();
    let nodes = &ch["status"]["nodes"];
    assert_eq!(nodes["progress"], "3/3", "{}", ch["status"]);
    assert_eq!(nodes["byVersion"], json!({"v2": 3}));
    assert_eq!(nodes["byPhase"], json!({"UpToDate": 3}));
    assert_eq!(ch["status"]["rollout"]["wave"], 3, "{}", ch["status"]);
    assert_eq!(ch["status"]["rollout"]["admitKey"], "ffffffffffffffff");
    let log = fleet.log.lock().unwrap().clone();
    assert_eq!(on_channel(&log, "WaveStarted"), 3, "{log:#?}");
    assert!(on_channel(&log, "WaitingForWave") >= 2, "{log:#?}");
    assert_eq!(on_channel(&log, "SlotClaimed"), NODES);
    assert_eq!(fleet.reboots, vec![1; NODES]);
    assert!(fleet.world.lock().unwrap().node_lists > 0);
}

/// A canary whose v2 never becomes Ready: rolled back, recorded, the channel paused, and the
/// nodes of the later waves never claim, cordon or reboot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_canary_pauses_the_rollout_and_nobody_else_moves() {
    let rollout = json!({"canary": {"nodes": ["node-3"]}, "settleTime": "0s"});
    let mut fleet = Fleet::new(Scenario {
        rollout: Some(rollout),
        ready_wait: Duration::from_secs(1),
        first_trial_never_ready: true,
        ..Scenario::at(3)
    });
    fleet
        .run_until("the canary back on v1 and the others paused", |f| {
            f.bad.is_some()
                && (0..NODES).all(|i| {
                    let want = if i == 2 { "Failed" } else { "Paused" };
                    f.phase(i).as_deref() == Some(want)
                })
        })
        .await;
    fleet.stop().await;
    assert_eq!(fleet.bad, Some(2), "the canary booted v2 first");
    let m = fleet.monitor.lock().unwrap();
    assert_eq!(m.claims.keys().collect::<Vec<_>>(), ["node-3"]);
    assert_eq!(m.ever_cordoned, BTreeSet::from(["node-3".to_string()]));
    drop(m);
    assert_eq!(fleet.reboots, vec![0, 0, 2]);
    let ch = fleet.channel();
    assert_eq!(condition(&ch, "Paused").as_deref(), Some("True"));
    assert_eq!(condition(&ch, "Complete").as_deref(), Some("False"));
    assert_eq!(ch["status"]["failures"][0]["node"], "node-3");
}

/// Pre-reboot gates. While the Prometheus stand-in on 127.0.0.1 reports
/// a firing `DiskFull` alert nobody claims (each agent says why, once); `Watchdog` is ignored
/// by `alertFilter`. Once the alert is resolved node-2 and node-3 update, while node-1 waits
/// for its pod matching `blockingPodSelector`; when that pod is gone node-1 updates too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_reboot_gates_hold_claims_while_alerts_fire_or_blocking_pods_run() {
    let mut fleet = Fleet::new(Scenario {
        gates: true,
        ..Scenario::at(1)
    });
    let phase_is = |f: &Fleet, i: usize, p: &str| f.phase(i).as_deref() == Some(p);
    let blocked = |log: &[String], needle: &str| {
        log.windows(2)
            .filter(|l| l[0] == "event: ClaimBlocked" && l[1].contains(needle))
            .count()
    };
    fleet
        .run_until("every node held back by the alert, and saying so", |f| {
            (0..NODES).all(|i| phase_is(f, i, "WaitingForGate"))
                && blocked(&f.log.lock().unwrap(), "on the node: apps/backup") >= 2
                && blocked(&f.log.lock().unwrap(), "Prometheus alerts active") >= 2 * NODES
        })
        .await;
    assert!(fleet.monitor.lock().unwrap().claims.is_empty());
    let log = fleet.log.lock().unwrap().clone();
    assert!(
        blocked(&log, "Prometheus alerts active") >= NODES,
        "{log:#?}"
    );
    assert_eq!(blocked(&log, "Watchdog"), 0, "the filter ignores Watchdog");
    assert!(blocked(&log, "apps/backup") >= 1, "{log:#?}");

    let (_, dir) = fleet.alerts.as_ref().unwrap();
    set_alerts(dir.path(), &[("Watchdog", "firing")]);
    fleet
        .run_until(
            "node-2 and node-3 updated, node-1 held back by its pod",
            |f| {
                phase_is(f, 1, "UpToDate")
                    && phase_is(f, 2, "UpToDate")
                    && phase_is(f, 0, "WaitingForGate")
                    && holders(&f.world.lock().unwrap()).is_empty()
            },
        )
        .await;
    assert!(!fleet.monitor.lock().unwrap().claims.contains_key("node-1"));
    let message = annotation(
        fleet.world.lock().unwrap().node("node-1"),
        agent::testing::ANN_MESSAGE,
    )
    .map(String::from);
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("blockingPodSelector") && m.contains("apps/backup")),
        "{message:?}"
    );

    fleet
        .world
        .lock()
        .unwrap()
        .pods
        .retain(|p| p["metadata"]["name"] != "backup");
    fleet
        .run_until("every node UpToDate", |f| {
            (0..NODES).all(|i| phase_is(f, i, "UpToDate"))
                && holders(&f.world.lock().unwrap()).is_empty()
        })
        .await;
    fleet.stop().await;
    assert_eq!(fleet.reboots, vec![1; NODES]);
}
