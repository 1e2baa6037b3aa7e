//! The controller's per-node flow end to end, against the small stateful fake API server of
//! `fake_api` (shared with the fleet test) behind tower-test's mock service and a recording simulated node
//! (`SimNode::recording`, the `NodeOps` trait). One log records both the
//! API writes and the node calls in order, so the tests check the ordering guarantees:
//! fence (CAS of our slot's phase) before cordon, before the bootloader flip, before reboot;
//! uncordon only of our own cordon; release after confirm; failures pause the channel.

use k3os_ops::agent;
use k3os_ops::agent::testing::Polls;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent::testing::crd::UpdateChannel;
use agent::testing::{Agent, ConfirmResult, Inactive, Next, NodeError};
use fake_api::{Log, World};
use k3os_ops_testing::sim_node::SimNode;
use serde_json::{json, Value};

use k3os_ops_testing::fake_api;

fn setup(
    confirm: ConfirmResult,
    unschedulable: bool,
) -> (Agent, Arc<Mutex<World>>, Arc<SimNode>, Log) {
    let log: Log = Arc::default();
    let mut n1 = fake_api::ready_node("n1", json!({"pool": "edge"}));
    n1["metadata"]["uid"] = json!("node-uid");
    n1["spec"]["unschedulable"] = json!(unschedulable);
    // n2 exists (for reclaim's Node-deleted check).
    let n2 = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}});
    let channel = UpdateChannel::test()
        .url("https://releases.example/")
        .spec_with(|s| s.node_selector = [("pool".into(), "edge".into())].into())
        .build();
    let world = Arc::new(Mutex::new(World::new(
        [n1, n2],
        fake_api::channel_object(&channel),
    )));
    let node = Arc::new(
        SimNode::recording("v1", log.clone())
            .with_latest("v2")
            .with_confirm(confirm),
    );
    let agent = pod_agent(&world, &log, node.clone());
    (agent, world, node, log)
}

/// The agent of node `n1` as the DaemonSet's pod `k3os-system/agent-x` (it never evicts
/// itself), over the fake API and `node`, pausing 10 ms between drain rounds.
pub(crate) fn pod_agent(world: &Arc<Mutex<World>>, log: &Log, node: Arc<SimNode>) -> Agent {
    let mut agent = Agent::new(
        fake_api::client(world, log),
        "k3os-system",
        "n1",
        Some("k3os-system/agent-x".into()),
        node,
    );
    agent.settings.drain_retry = Duration::from_millis(10);
    agent
}

/// Reconcile until the agent waits (bounded).
pub(crate) async fn settle(agent: &Agent) {
    for _ in 0..20 {
        if agent.reconcile().await.expect("reconcile") == Next::Wait {
            return;
        }
    }
    panic!("agent did not settle in 20 steps");
}

pub(crate) fn pos(log: &[String], what: &str) -> usize {
    log.iter()
        .position(|l| l.contains(what))
        .unwrap_or_else(|| panic!("'{what}' not in log:\n{}", log.join("\n")))
}

pub(crate) fn annotation(world: &Arc<Mutex<World>>, key: &str) -> Option<String> {
    world.lock().unwrap().node("n1")["metadata"]["annotations"][key]
        .as_str()
        .map(String::from)
}

#[tokio::test]
async fn happy_path_stages_claims_fences_cordons_flips_reboots_confirms_releases() {
    let (agent, world, node, log) = setup(ConfirmResult::Healthy, false);
    settle(&agent).await;
    {
        let l = log.lock().unwrap().clone();
        fake_api::no_unexpected(&log);
        let stage = pos(&l, "node: stage v2");
        let claim = pos(&l, "slots=[n1:Claimed]");
        let fence1 = pos(&l, "slots=[n1:Draining]");
        let cordon = pos(&l, "unschedulable=true");
        let fence2 = pos(&l, "slots=[n1:Rebooting]");
        let flip = pos(&l, "node: activate");
        let reboot = pos(&l, "node: reboot");
        assert!(
            stage < claim
                && claim < fence1
                && fence1 < cordon
                && cordon < fence2
                && fence2 < flip
                && flip < reboot,
            "{l:#?}"
        );
        for ev in [
            "Staging",
            "Staged",
            "SlotClaimed",
            "Cordoned",
            "Draining",
            "Drained",
            "Activated",
            "Rebooting",
        ] {
            pos(&l, &format!("event: {ev}"));
        }
    }
    assert_eq!(
        annotation(&world, "k3os.io/update-phase").as_deref(),
        Some("Rebooting")
    );
    assert_eq!(
        annotation(&world, "k3os.io/update-cordoned").as_deref(),
        Some("true")
    );
    // The node comes back on v2, on trial.
    node.boot();
    log.lock().unwrap().clear();
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    let confirm = pos(&l, "node: confirm with node-ready ok");
    let uncordon = pos(&l, "unschedulable=false");
    let release = pos(&l, "slots=[]");
    assert!(confirm < uncordon && uncordon < release, "{l:#?}");
    pos(&l, "event: UpdateSucceeded");
    assert_eq!(
        annotation(&world, "k3os.io/update-phase").as_deref(),
        Some("UpToDate")
    );
    assert_eq!(annotation(&world, "k3os.io/update-cordoned"), None);
    assert_eq!(
        world.lock().unwrap().node("n1")["spec"]["unschedulable"],
        false
    );
}

#[tokio::test]
async fn a_node_cordoned_by_its_admin_stays_cordoned() {
    let (agent, world, node, log) = setup(ConfirmResult::Healthy, true);
    settle(&agent).await;
    node.boot();
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    assert!(
        !l.iter().any(|x| x.contains("unschedulable=")),
        "touched an admin's cordon: {l:#?}"
    );
    assert_eq!(
        world.lock().unwrap().node("n1")["spec"]["unschedulable"],
        true
    );
    let ch = world.lock().unwrap().channel.clone();
    assert_eq!(ch["status"]["slots"], json!([]));
}

#[tokio::test]
async fn a_stolen_slot_aborts_before_cordon_and_flip() {
    let (agent, world, _node, log) = setup(ConfirmResult::Healthy, false);
    // Right after our claim lands, another agent instance takes the slot over (new token).
    world.lock().unwrap().hook = Some(Box::new(|req: &str, ch: &mut Value| {
        if req.starts_with("GET") && req.ends_with("/updatechannels/stable") {
            if let Some(s) = ch["status"]["slots"]
                .as_array_mut()
                .and_then(|a| a.first_mut())
            {
                if s["phase"] == "Claimed" {
                    s["token"] = json!("someone-else");
                }
            }
        }
    }));
    let _ = agent.reconcile().await.unwrap(); // stage
    let _ = agent.reconcile().await.unwrap(); // claim
    let _ = agent.reconcile().await.unwrap(); // fence fails or foreign slot
    let l = log.lock().unwrap().clone();
    assert!(
        !l.iter().any(|x| x.contains("unschedulable=true")),
        "cordoned without the slot: {l:#?}"
    );
    assert!(
        !l.iter()
            .any(|x| x.contains("node: activate") || x.contains("node: reboot")),
        "{l:#?}"
    );
    pos(&l, "event: SlotLost");
}

#[tokio::test]
async fn failed_health_check_records_failure_reboots_back_and_pauses() {
    let (agent, world, node, log) = setup(
        ConfirmResult::RolledBack("kubelet did not start".into()),
        false,
    );
    settle(&agent).await;
    node.boot();
    log.lock().unwrap().clear();
    settle(&agent).await;
    {
        let l = log.lock().unwrap().clone();
        let confirm = pos(&l, "node: confirm with node-ready ok");
        let recorded = pos(&l, "slots=[n1:RollingBack] failures=1");
        let reboot = pos(&l, "node: reboot");
        assert!(confirm < recorded && recorded < reboot, "{l:#?}");
        pos(&l, "event: HealthCheckFailed");
    }
    // Back on v1 (the slot was marked bad by the rollback).
    node.edit_status(|s| {
        s.booted_version = Some("v1".into());
        s.booted_on_trial = false;
        s.inactive = Inactive::Failed("v2".into());
    });
    log.lock().unwrap().clear();
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    let uncordon = pos(&l, "unschedulable=false");
    let release = pos(&l, "slots=[] failures=1");
    assert!(uncordon < release, "{l:#?}");
    let ch = world.lock().unwrap().channel.clone();
    let paused = ch["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "Paused" && c["status"] == "True");
    assert!(
        paused,
        "maxFailures 1 reached but not Paused: {}",
        ch["status"]
    );
    // And the node does not try v2 again.
    log.lock().unwrap().clear();
    settle(&agent).await;
    assert!(!log
        .lock()
        .unwrap()
        .iter()
        .any(|x| x.contains("node: stage") || x.contains("slots=[n1")));
    // The failure and the rollback are counted in the metrics.
    let text = agent.clients.metrics.encode();
    for c in ["k3os_ops_update_failures_total", "k3os_ops_rollbacks_total"] {
        assert_eq!(
            sample(&text, c, &["node=\"n1\""]),
            Some(1.0),
            "{c}:\n{text}"
        );
    }
}

#[tokio::test]
async fn bootloader_fallback_is_recorded_as_a_failure() {
    let (agent, world, node, log) = setup(ConfirmResult::Healthy, false);
    settle(&agent).await;
    node.fall_back(); // the loader fell back to v1
    log.lock().unwrap().clear();
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    pos(&l, "event: RolledBack");
    pos(&l, "slots=[] failures=1");
    pos(&l, "unschedulable=false");
    let ch = world.lock().unwrap().channel.clone();
    assert_eq!(ch["status"]["failures"][0]["node"], "n1");
    assert_eq!(ch["status"]["failures"][0]["version"], "v2");
}

#[tokio::test]
async fn a_claim_held_through_a_long_silence_is_replaced_by_a_fresh_one() {
    let (agent, world, node, log) = setup(ConfirmResult::Healthy, false);
    node.edit_status(|s| s.inactive = Inactive::Staged("v2".into()));
    {
        let mut w = world.lock().unwrap();
        w.channel["status"]["slots"] = json!([{"node": "n1", "token": "old", "claimedAt": "2026-12-01T00:00:00Z",
                                               "phase": "Claimed", "version": "v2"}]);
        w.node_mut("n1")["metadata"]["annotations"]["k3os.io/update-token"] = json!("old");
    }
    // The agent (re)started after its Lease had been silent for 20 minutes (rebootTimeout 15m).
    agent.set_startup_silence(Some(Duration::from_secs(1200)));
    assert_eq!(agent.reconcile().await.unwrap(), Next::Again);
    let l = log.lock().unwrap().clone();
    pos(&l, "event: ClaimForfeit");
    assert!(
        !l.iter().any(|x| x.contains("unschedulable=true")),
        "{l:#?}"
    );
    let w = world.lock().unwrap();
    let token = w.channel["status"]["slots"][0]["token"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(token, "old", "the old claim must be replaced");
    assert_eq!(w.channel["status"]["slots"].as_array().unwrap().len(), 1);
    assert_eq!(
        w.node("n1")["metadata"]["annotations"]["k3os.io/update-token"],
        json!(token)
    );
}

#[tokio::test]
async fn a_refused_drain_uncordons_releases_and_backs_off() {
    let (agent, world, _node, log) = setup(ConfirmResult::Healthy, false);
    world.lock().unwrap().pods.push(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "bare", "namespace": "apps", "uid": "u1"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running"}
    }));
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    // The drain is announced before it starts; what it caused is published after the tick
    // carried it out (the give-back's uncordon), in the order it happened.
    let cordon = pos(&l, "unschedulable=true");
    let draining = pos(&l, "event: Draining");
    let uncordon = pos(&l, "unschedulable=false");
    let failed = pos(&l, "event: DrainFailed");
    let uncordoned = pos(&l, "event: Uncordoned");
    assert!(cordon < draining && draining < uncordon, "{l:#?}");
    assert!(failed < uncordoned, "{l:#?}");
    assert!(!l.iter().any(|x| x.contains("node: activate")), "{l:#?}");
    assert_eq!(world.lock().unwrap().channel["status"]["slots"], json!([]));
    // The next pass does not cordon again at once.
    log.lock().unwrap().clear();
    settle(&agent).await;
    assert!(!log
        .lock()
        .unwrap()
        .iter()
        .any(|x| x.contains("unschedulable=true") || x.contains("slots=[n1")));
    assert_eq!(
        annotation(&world, "k3os.io/update-phase").as_deref(),
        Some("BackingOff")
    );
}

#[tokio::test]
async fn a_cordon_left_by_an_interrupted_update_is_undone() {
    let (agent, world, node, log) = setup(
        ConfirmResult::RolledBack("kubelet did not start".into()),
        false,
    );
    settle(&agent).await;
    // The reboot took longer than rebootTimeout: another agent reclaimed the slot.
    world.lock().unwrap().channel["status"]["slots"] = json!([]);
    node.boot();
    settle(&agent).await;
    // Health check failed without a slot: failure recorded, rebooted back.
    {
        let l = log.lock().unwrap().clone();
        pos(&l, "slots=[] failures=1");
        pos(&l, "node: reboot");
    }
    node.edit_status(|s| {
        s.booted_version = Some("v1".into());
        s.booted_on_trial = false;
        s.inactive = Inactive::Failed("v2".into());
    });
    log.lock().unwrap().clear();
    settle(&agent).await;
    pos(&log.lock().unwrap(), "unschedulable=false");
    assert_eq!(
        world.lock().unwrap().node("n1")["spec"]["unschedulable"],
        false
    );
    assert_eq!(annotation(&world, "k3os.io/update-cordoned"), None);
}

#[tokio::test]
async fn a_slot_of_this_node_under_another_token_is_taken_over_in_place() {
    let (agent, world, node, log) = setup(ConfirmResult::Healthy, false);
    node.edit_status(|s| s.inactive = Inactive::Staged("v2".into()));
    {
        let mut w = world.lock().unwrap();
        w.channel["status"]["slots"] = json!([{"node": "n1", "token": "earlier-instance",
            "claimedAt": "2026-12-01T00:00:00Z", "phase": "Claimed", "version": "v2"}]);
        w.node_mut("n1")["metadata"]["annotations"]["k3os.io/update-token"] = json!("mine");
    }
    assert_eq!(agent.reconcile().await.unwrap(), Next::Again);
    pos(&log.lock().unwrap(), "event: SlotTakenOver");
    let w = world.lock().unwrap();
    let slots = w.channel["status"]["slots"].as_array().unwrap().clone();
    assert_eq!(slots.len(), 1, "{slots:?}");
    assert_ne!(slots[0]["token"], "earlier-instance");
    assert_eq!(
        slots[0]["token"],
        w.node("n1")["metadata"]["annotations"]["k3os.io/update-token"]
    );
}

/// A node whose slot was reclaimed while it was cordoned (by us) must not
/// stay cordoned while it waits for a new slot (at concurrency 1 another node holds it).
#[tokio::test]
async fn a_node_waiting_for_a_slot_is_not_left_cordoned() {
    let (agent, world, node, log) = setup(ConfirmResult::Healthy, false);
    node.edit_status(|s| s.inactive = Inactive::Staged("v2".into()));
    {
        let mut w = world.lock().unwrap();
        w.channel["status"]["slots"] = json!([{"node": "n2", "token": "t2",
            "claimedAt": "2026-12-01T00:00:00Z", "phase": "Draining", "version": "v2"}]);
        w.node_mut("n1")["spec"]["unschedulable"] = json!(true);
        w.node_mut("n1")["metadata"]["annotations"]["k3os.io/update-cordoned"] = json!("true");
    }
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    pos(&l, "unschedulable=false");
    assert_eq!(
        world.lock().unwrap().node("n1")["spec"]["unschedulable"],
        false
    );
    assert_eq!(annotation(&world, "k3os.io/update-cordoned"), None);
}

/// Reclaim's looks follow `rebootTimeout` from the moment a channel exists.
/// A holder silent since before the channel appeared, with `rebootTimeout: 30s`, is reclaimed
/// within the timeout plus one look period (today's first look came 120 s ±25 % after start,
/// whatever the timeout: 140–150 s measured).
#[tokio::test(start_paused = true)]
async fn a_dead_holder_is_reclaimed_soon_after_reboot_timeout() {
    let (agent, world, _node, log) = setup(ConfirmResult::Healthy, false);
    let channel = {
        let mut w = world.lock().unwrap();
        w.leases.insert(
            "k3os-upgrade-node-n2".into(),
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                   "metadata": {"name": "k3os-upgrade-node-n2", "resourceVersion": "7"},
                   "spec": {"holderIdentity": "n2", "renewTime": "2026-12-01T00:00:00.000000Z"}}),
        );
        w.channel["spec"]["rebootTimeout"] = json!("30s");
        w.channel["status"]["slots"] = json!([{"node": "n2", "token": "t2",
            "claimedAt": "2026-12-01T00:00:00Z", "phase": "Draining", "version": "v2"}]);
        std::mem::replace(&mut w.channel, Value::Null)
    };
    let agent = Arc::new(agent);
    let task = tokio::spawn(agent::testing::reclaim_loop(agent.clone()));
    // The agent started before the channel was created.
    tokio::time::sleep(Duration::from_secs(5)).await;
    world.lock().unwrap().channel = channel;
    let appeared = tokio::time::Instant::now();
    let mut reclaimed = None;
    for _ in 0..400 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if world.lock().unwrap().channel["status"]["slots"]
            .as_array()
            .unwrap()
            .is_empty()
        {
            reclaimed = Some(appeared.elapsed());
            break;
        }
    }
    task.abort();
    let took = reclaimed.expect("the dead holder's slot was never reclaimed");
    // First look within one period (<= 12.5 s), silence judged from there: 30 s + 2 periods.
    assert!(
        took <= Duration::from_secs(56),
        "reclaimed {took:?} after the channel appeared (rebootTimeout 30s)"
    );
    pos(&log.lock().unwrap(), "event: SlotReclaimed");
}

/// `version: latest` is resolved as soon as a channel appears, not on the
/// next poll tick (default 900 s; the channel sat idle up to 15 minutes).
#[tokio::test(start_paused = true)]
async fn latest_is_resolved_soon_after_a_channel_appears() {
    let (agent, world, _node, _log) = setup(ConfirmResult::Healthy, false);
    let channel = {
        let mut w = world.lock().unwrap();
        w.channel["spec"]["version"] = json!("latest");
        std::mem::replace(&mut w.channel, Value::Null)
    };
    let agent = Arc::new(agent);
    let task = tokio::spawn(agent::testing::poll_loop(
        agent.clone(),
        Polls {
            every: Duration::from_secs(900),
            waiting: Duration::from_secs(3600),
        },
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    world.lock().unwrap().channel = channel;
    let appeared = tokio::time::Instant::now();
    let mut resolved = None;
    for _ in 0..1000 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if world.lock().unwrap().channel["status"]["latestVersion"] == "v2" {
            resolved = Some(appeared.elapsed());
            break;
        }
    }
    task.abort();
    let took = resolved.expect("latest was never resolved");
    assert!(
        took <= Duration::from_secs(15),
        "latest resolved {took:?} after the channel appeared (poll period 900 s)"
    );
}

/// A second event with the same reason but new text is a new Event with that
/// text (the recorder merged it into the first and kept the stale text), and events about a
/// channel are also published regarding the UpdateChannel (`kubectl describe upchan`).
#[tokio::test]
async fn events_carry_fresh_text_and_land_on_the_channel_too() {
    let (agent, world, _node, log) = setup(ConfirmResult::Healthy, false);
    let ch: agent::testing::crd::UpdateChannel =
        serde_json::from_value(world.lock().unwrap().channel.clone()).unwrap();
    agent
        .event(
            Some(&ch),
            false,
            "WaitingForSlot",
            "all slots taken by n2".into(),
        )
        .await;
    agent
        .event(
            Some(&ch),
            false,
            "WaitingForSlot",
            "all slots taken by n3".into(),
        )
        .await;
    let l = log.lock().unwrap().clone();
    fake_api::no_unexpected(&log);
    for who in ["n2", "n3"] {
        pos(
            &l,
            &format!("event-on: Node -/n1: all slots taken by {who}"),
        );
        pos(
            &l,
            &format!("event-on: UpdateChannel k3os-system/stable: all slots taken by {who}"),
        );
    }
}

/// ReconcileError events carry the error chain as text, no Rust debug dump
/// of kube's ErrorResponse.
#[tokio::test]
async fn reconcile_errors_are_reported_without_debug_dumps() {
    let (agent, world, _node, log) = setup(ConfirmResult::Healthy, false);
    // The own Node vanished: the API answers 404 with a Status.
    world.lock().unwrap().nodes.remove("n1");
    world.lock().unwrap().hook = Some(Box::new(|_, _| {}));
    let e = agent.reconcile().await.expect_err("own Node is missing");
    agent.report_error(&e).await;
    let l = log.lock().unwrap().clone();
    let line = l
        .iter()
        .find(|x| x.starts_with("event-on: Node -/n1: "))
        .unwrap_or_else(|| panic!("no ReconcileError event: {l:#?}"));
    assert!(line.contains("read own Node n1"), "{line}");
    assert!(
        !line.contains("ErrorResponse") && !line.contains("Status {") && !line.contains("{ "),
        "debug dump in the event: {line}"
    );
}

/// The Updating printer column (`.status.updating`) lists every holder, not
/// only the first (`.status.slots[*].node` shows one).
#[tokio::test]
async fn status_updating_lists_every_holder() {
    let (agent, world, node, _log) = setup(ConfirmResult::Healthy, false);
    node.edit_status(|s| s.inactive = Inactive::Staged("v2".into()));
    {
        let mut w = world.lock().unwrap();
        w.channel["spec"]["concurrency"] = json!(2);
        w.channel["status"]["slots"] = json!([{"node": "n2", "token": "t2",
            "claimedAt": "2026-12-01T00:00:00Z", "phase": "Draining", "version": "v2"}]);
    }
    assert_eq!(agent.reconcile().await.unwrap(), Next::Again);
    assert_eq!(
        world.lock().unwrap().channel["status"]["updating"],
        json!("n2,n1")
    );
}

fn extra_channel(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "k3os.io/v1", "kind": "UpdateChannel",
        "metadata": {"name": name, "namespace": "k3os-system", "uid": format!("{name}-uid"),
                     "generation": 1, "resourceVersion": "5"},
        "spec": spec,
        "status": {"slots": [], "failures": [], "conditions": []}
    })
}

/// A channel that does not decode (`concurrency: 5000000000`, stored before
/// the schema had a maximum) is reported on that channel (condition Invalid + Event) and the
/// node goes on with the valid channel; before, every list failed for every agent.
#[tokio::test]
async fn a_malformed_channel_is_reported_and_the_others_go_on() {
    let (agent, world, _node, log) = setup(ConfirmResult::Healthy, false);
    world.lock().unwrap().extra_channels.push(extra_channel(
        "zzz-huge",
        json!({"url": "https://x/", "concurrency": 5_000_000_000u64, "nodeSelector": {"pool": "edge"}}),
    ));
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    fake_api::no_unexpected(&log);
    pos(&l, "node: stage v2");
    pos(
        &l,
        "api: condition zzz-huge Invalid=True UpdateChannel zzz-huge: does not decode",
    );
    pos(
        &l,
        "event-on: UpdateChannel k3os-system/zzz-huge: UpdateChannel zzz-huge",
    );
    // Reported once: the condition is in place, the next reconciles do not rewrite it.
    let writes = l
        .iter()
        .filter(|x| x.contains("condition zzz-huge"))
        .count();
    assert_eq!(writes, 1, "{l:#?}");
}

/// An invalid channel that sorts first by name does not shadow a valid one
/// selecting the same node; the conflict is reported and the invalid channel gets its
/// condition.
#[tokio::test]
async fn an_invalid_channel_does_not_shadow_a_valid_one() {
    let (agent, world, _node, log) = setup(ConfirmResult::Healthy, false);
    // Listed first by name, selects the node, window start 25:00.
    {
        let mut w = world.lock().unwrap();
        let bad = extra_channel(
            "aaa-broken",
            json!({"url": "https://x/", "version": "v9", "nodeSelector": {"pool": "edge"},
                   "window": {"start": "25:00", "length": "2h"}}),
        );
        w.extra_channels.push(bad);
    }
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    fake_api::no_unexpected(&log);
    pos(&l, "node: stage v2");
    pos(&l, "event: ChannelConflict");
    pos(&l, "api: condition aaa-broken Invalid=True");
    let conflict = l
        .iter()
        .find(|x| x.starts_with("event-on: Node -/n1: several UpdateChannels"))
        .unwrap();
    assert!(
        conflict.contains("stable wins") && conflict.contains("aaa-broken (invalid"),
        "{conflict}"
    );
}

/// `rebootTimeout: 0s` is refused by the agent too (the CRD's CEL rule
/// refuses it at the server): the channel is marked Invalid and nothing is disrupted.
#[tokio::test]
async fn a_zero_reboot_timeout_is_invalid() {
    let (agent, world, _node, log) = setup(ConfirmResult::Healthy, false);
    world.lock().unwrap().channel["spec"]["rebootTimeout"] = json!("0s");
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    pos(
        &l,
        "api: condition stable Invalid=True UpdateChannel stable: spec.rebootTimeout",
    );
    assert!(!l.iter().any(|x| x.contains("slots=[n1")), "{l:#?}");
}

/// GET `path` from `addr` over a real loopback socket: (status, body).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").unwrap().1.to_string();
    (status, body)
}

/// The sample of `name` whose labels include all of `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.split(['{', ' ']).next() == Some(name) && labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// /metrics (Prometheus text), /healthz and /readyz over a loopback socket, after the happy
/// path up to the reboot.
#[tokio::test]
async fn metrics_and_probes_over_a_real_socket() {
    let (agent, _world, _node, _log) = setup(ConfirmResult::Healthy, false);
    let addr = agent::testing::spawn_metrics(
        "127.0.0.1:0".parse().unwrap(),
        agent.clients.metrics.clone(),
    )
    .await
    .unwrap();
    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    assert_eq!(
        http_get(addr, "/readyz").await.0,
        503,
        "ready before any reconcile"
    );
    settle(&agent).await;
    assert_eq!(http_get(addr, "/readyz").await.0, 200);
    let (status, text) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    let node = "node=\"n1\"";
    let get = |name: &str, labels: &[&str]| {
        let mut all = labels.to_vec();
        all.push(node);
        sample(&text, name, &all).unwrap_or_else(|| panic!("{name} {labels:?} missing:\n{text}"))
    };
    assert_eq!(get("k3os_ops_update_phase", &["phase=\"Rebooting\""]), 1.0);
    assert_eq!(get("k3os_ops_update_phase", &["phase=\"Claimed\""]), 0.0);
    assert_eq!(
        get(
            "k3os_ops_version_info",
            &["slot=\"booted\"", "version=\"v1\""]
        ),
        1.0
    );
    assert_eq!(
        get(
            "k3os_ops_version_info",
            &["slot=\"staged\"", "version=\"v2\""]
        ),
        1.0
    );
    assert_eq!(get("k3os_ops_downloaded_bytes_total", &[]), 100.0);
    assert_eq!(get("k3os_ops_drain_duration_seconds_count", &[]), 1.0);
    assert!(get("k3os_ops_slot_held_seconds", &[]) >= 0.0);
    for c in [
        "k3os_ops_update_failures_total",
        "k3os_ops_rollbacks_total",
        "k3os_ops_reclaims_total",
        "k3os_ops_reconcile_errors_total",
        "k3os_ops_stage_failures_total",
    ] {
        assert_eq!(get(c, &[]), 0.0, "{c}");
    }
    assert_eq!(http_get(addr, "/nope").await.0, 404);
}

/// A DaemonSet is applied before its first UpdateChannel: its pods are Ready once the agent
/// has read its Node and found no channel, and the agent does nothing else.
#[tokio::test]
async fn ready_without_any_update_channel() {
    let (agent, world, _node, log) = setup(ConfirmResult::Healthy, false);
    world.lock().unwrap().channel = Value::Null;
    let addr = agent::testing::spawn_metrics(
        "127.0.0.1:0".parse().unwrap(),
        agent.clients.metrics.clone(),
    )
    .await
    .unwrap();
    assert_eq!(http_get(addr, "/readyz").await.0, 503, "before any read");
    settle(&agent).await;
    let (status, body) = http_get(addr, "/readyz").await;
    assert_eq!(
        status, 200,
        "no channel yet must not keep the pod unready: {body}"
    );
    let l = log.lock().unwrap().clone();
    assert!(!l.iter().any(|x| x.starts_with("node:")), "{l:#?}");
}

#[tokio::test]
async fn the_channels_max_rate_caps_the_stage() {
    let (agent, world, _node, log) = setup(ConfirmResult::Healthy, false);
    world.lock().unwrap().channel["spec"]["maxRate"] = json!("2M");
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    assert!(
        l.iter()
            .any(|x| x == "node: stage v2 capped at 2097152 B/s"),
        "spec.maxRate did not reach the stage: {l:#?}"
    );
}

/// Events regarding the channel, as `(reason, note)`, in order.
pub(crate) fn channel_events(log: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for w in log.windows(2) {
        if let (Some(reason), Some(rest)) = (
            w[0].strip_prefix("event: "),
            w[1].strip_prefix("event-on: UpdateChannel k3os-system/stable: "),
        ) {
            out.push((reason.to_string(), rest.to_string()));
        }
    }
    out
}

/// A trial whose health checks failed at boot (the boot-time confirm rolled
/// back) is reported as what the boot-assessment core recorded — `health-failed` with the
/// check's output — not as a bootloader fallback guessed from the slot that booted.
#[tokio::test]
async fn a_boot_time_health_failure_is_reported_with_the_cores_reason() {
    let (agent, world, node, log) = setup(ConfirmResult::Healthy, false);
    settle(&agent).await;
    node.edit_status(|s| {
        s.inactive = Inactive::Failed("v2".into());
        s.failed_trial = Some(agent::testing::TrialFailure {
            event: "health-failed".into(),
            reason: "health checks failed (10-etcd: etcd quorum lost on v2); rolled back to slot A"
                .into(),
        });
    });
    log.lock().unwrap().clear();
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    pos(&l, "event: HealthCheckFailed");
    assert!(!l.iter().any(|x| x == "event: RolledBack"), "{l:#?}");
    let ch = world.lock().unwrap().channel.clone();
    let reason = ch["status"]["failures"][0]["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(reason.contains("etcd quorum lost on v2"), "{reason}");
    assert!(!reason.contains("bootloader fell back"), "{reason}");
    let ev = channel_events(&l);
    assert!(
        ev.iter()
            .any(|(r, n)| r == "HealthCheckFailed" && n.contains("etcd quorum lost on v2")),
        "{ev:#?}"
    );
}

/// The channel carries an Event for every claim, release, failure and pause
/// (`kubectl describe upchan`), not only some of them.
#[tokio::test]
async fn the_channel_gets_an_event_per_claim_release_failure_and_pause() {
    let (agent, _world, node, log) = setup(ConfirmResult::Healthy, false);
    settle(&agent).await;
    node.fall_back(); // the loader fell back: a failure at maxFailures 1
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    let ev = channel_events(&l);
    let reasons: Vec<&str> = ev.iter().map(|(r, _)| r.as_str()).collect();
    for want in ["SlotClaimed", "RolledBack", "SlotReleased", "ChannelPaused"] {
        assert_eq!(
            reasons.iter().filter(|r| **r == want).count(),
            1,
            "{want} regarding the channel: {reasons:?}"
        );
    }
    let claimed = reasons.iter().position(|r| *r == "SlotClaimed").unwrap();
    let released = reasons.iter().position(|r| *r == "SlotReleased").unwrap();
    assert!(claimed < released, "{reasons:?}");
}

/// A boot not assessed yet (init's `slot confirm` did not run) is reported
/// once, as a Node condition and an Event naming the command to run; the agent then waits
/// without errors, and clears the condition once the boot is assessed.
#[tokio::test]
async fn a_boot_not_assessed_yet_is_reported_once_and_waited_for() {
    let (agent, world, node, log) = setup(ConfirmResult::Healthy, false);
    node.fail_status(Some(NodeError::new(
        agent::testing::NOT_ASSESSED,
        agent::testing::NOT_ASSESSED_HELP,
    )));
    for _ in 0..3 {
        assert_eq!(agent.reconcile().await.expect("not an error"), Next::Wait);
    }
    let l = log.lock().unwrap().clone();
    assert!(!l.iter().any(|x| x.contains("ReconcileError")), "{l:#?}");
    let conds: Vec<&String> = l
        .iter()
        .filter(|x| x.contains("condition K3osBootAssessed"))
        .collect();
    assert_eq!(conds.len(), 1, "{l:#?}");
    assert!(
        conds[0].contains("K3osBootAssessed=False") && conds[0].contains("k3os-ops slot confirm"),
        "{}",
        conds[0]
    );
    let events: Vec<&String> = l
        .iter()
        .filter(|x| *x == "event: BootNotAssessed")
        .collect();
    assert_eq!(
        events.len(),
        2,
        "one on the Node, one on the channel: {l:#?}"
    );
    assert!(
        l.iter()
            .any(|x| x.starts_with("event-on: Node -/n1: ") && x.contains("k3os-ops slot confirm")),
        "{l:#?}"
    );
    assert_eq!(
        annotation(&world, "k3os.io/update-phase").as_deref(),
        Some("NotAssessed")
    );
    // Assessed: the condition turns True once, and the update goes on.
    node.fail_status(None);
    log.lock().unwrap().clear();
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    let conds: Vec<&String> = l
        .iter()
        .filter(|x| x.contains("condition K3osBootAssessed"))
        .collect();
    assert_eq!(conds.len(), 1, "{l:#?}");
    assert!(conds[0].contains("K3osBootAssessed=True"), "{}", conds[0]);
    pos(&l, "node: stage v2");
}

/// A channel whose status is in a newer format than this agent knows is
/// refused — reported once (naming both formats), never used, nothing written to it.
#[tokio::test]
async fn a_channel_status_of_a_newer_format_is_refused_and_not_written() {
    let (agent, world, _node, log) = setup(ConfirmResult::Healthy, false);
    {
        let mut w = world.lock().unwrap();
        w.channel["status"] = json!({
            "formatVersion": 3,
            "slots": [{"node": "n2", "token": "t", "claimedAt": "2026-12-03T10:00:00Z",
                       "phase": "Verifying", "version": "v2", "lease": {"renewals": 4}}],
            "failures": [], "conditions": []
        });
    }
    let before = world.lock().unwrap().channel.clone();
    for _ in 0..3 {
        assert_eq!(agent.reconcile().await.unwrap(), Next::Wait);
    }
    let l = log.lock().unwrap().clone();
    assert!(
        !l.iter()
            .any(|x| x.starts_with("api: slots=") || x.starts_with("api: condition")),
        "wrote to a newer-format channel: {l:#?}"
    );
    assert!(!l.iter().any(|x| x.contains("node: stage")), "{l:#?}");
    assert_eq!(world.lock().unwrap().channel, before);
    let notes: Vec<&String> = l
        .iter()
        .filter(|x| x.starts_with("event-on: UpdateChannel k3os-system/stable: "))
        .collect();
    assert_eq!(notes.len(), 1, "reported once: {l:#?}");
    assert!(
        notes[0].contains("format 3") && notes[0].contains("format 2"),
        "{}",
        notes[0]
    );
    assert!(!l.iter().any(|x| x.contains("ReconcileError")), "{l:#?}");
}

/// Node annotations written by a newer agent are refused: nothing is
/// written to the Node or the channel, and it is reported once.
#[tokio::test]
async fn node_annotations_of_a_newer_format_are_refused_and_not_written() {
    let (agent, world, _node, log) = setup(ConfirmResult::Healthy, false);
    world.lock().unwrap().node_mut("n1")["metadata"]["annotations"] =
        json!({"k3os.io/update-format": "3", "k3os.io/update-phase": "Verifying"});
    let before = world.lock().unwrap().node("n1").clone();
    let channel_before = world.lock().unwrap().channel.clone();
    for _ in 0..3 {
        assert_eq!(agent.reconcile().await.unwrap(), Next::Wait);
    }
    let l = log.lock().unwrap().clone();
    assert_eq!(world.lock().unwrap().node("n1"), &before);
    assert_eq!(world.lock().unwrap().channel, channel_before);
    assert!(!l.iter().any(|x| x.contains("node: stage")), "{l:#?}");
    let notes: Vec<&String> = l
        .iter()
        .filter(|x| x.starts_with("event-on: Node -/n1: "))
        .collect();
    assert_eq!(notes.len(), 1, "{l:#?}");
    assert!(
        notes[0].contains("format 3") && notes[0].contains("format 2"),
        "{}",
        notes[0]
    );
}

/// Every annotation patch states its format; a status written over v0.1.0's (no marker) is
/// stamped with format 2.
#[tokio::test]
async fn writes_carry_the_current_formats() {
    let (agent, world, _node, _log) = setup(ConfirmResult::Healthy, false);
    settle(&agent).await;
    assert_eq!(
        annotation(&world, "k3os.io/update-format").as_deref(),
        Some("2")
    );
    let ch = world.lock().unwrap().channel.clone();
    assert_eq!(ch["status"]["formatVersion"], 2, "{}", ch["status"]);
}

/// `spec.paused: true` stops new claims at once: the node stages, reports `Paused`, writes
/// no slot; the channel's `Paused` condition says why. Unpausing lets it claim and update.
#[tokio::test]
async fn spec_paused_stops_claims_until_unpaused() {
    let (agent, world, _node, log) = setup(ConfirmResult::Healthy, false);
    world.lock().unwrap().channel["spec"]["paused"] = json!(true);
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    fake_api::no_unexpected(&log);
    pos(&l, "node: stage v2");
    pos(&l, "spec.paused is true");
    assert!(!l.iter().any(|x| x.contains("slots=[n1")), "{l:#?}");
    let phase =
        world.lock().unwrap().node("n1")["metadata"]["annotations"]["k3os.io/update-phase"].clone();
    assert_eq!(phase, json!("Paused"));
    world.lock().unwrap().channel["spec"]["paused"] = json!(false);
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    pos(&l, "slots=[n1:Claimed]");
}

/// Several maintenance windows over the fake API: with `window` and `windows` all closed the
/// staged node waits (no slot written); a second entry of `windows` open now lets it claim.
#[tokio::test]
async fn several_windows_claim_in_any_open_one() {
    let (agent, world, _node, log) = setup(ConfirmResult::Healthy, false);
    let hhmm = |t: chrono::DateTime<chrono::Utc>| t.format("%H:%M").to_string();
    let now = chrono::Utc::now();
    let closed = |h: i64| json!({"start": hhmm(now + chrono::Duration::hours(h)), "length": "1h"});
    {
        let mut w = world.lock().unwrap();
        w.channel["spec"]["window"] = closed(6);
        w.channel["spec"]["windows"] = json!([closed(12)]);
    }
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    fake_api::no_unexpected(&log);
    pos(&l, "node: stage v2");
    pos(&l, "waiting for the window starting");
    assert!(!l.iter().any(|x| x.contains("slots=[n1")), "{l:#?}");
    let open = json!({"start": hhmm(now - chrono::Duration::minutes(5)), "length": "6h"});
    world.lock().unwrap().channel["spec"]["windows"] = json!([closed(12), open]);
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    pos(&l, "slots=[n1:Claimed]");
}

/// A release that failed on this node (the state file's record: its bad slot was overwritten
/// since, the channel lists no failure) is not staged again: the agent stays idle, its Node's
/// phase message and an Event regarding the channel say why, with the recorded reason.
#[tokio::test]
async fn a_release_that_failed_here_is_not_staged_again_and_the_agent_says_why() {
    let (agent, world, node, log) = setup(ConfirmResult::Healthy, false);
    node.edit_status(|s| {
        s.failed = vec![libupgrade::state::FailedRelease {
            version: "v2".into(),
            generation: Some(2),
            attempts: 1,
            at: 1_800_000_000,
            why: "50-app: app is down".into(),
        }];
    });
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    assert!(!l.iter().any(|x| x.contains("node: stage")), "{l:#?}");
    assert!(!l.iter().any(|x| x.contains("slots=[n1")), "{l:#?}");
    let message = annotation(&world, "k3os.io/update-message").unwrap_or_default();
    assert!(
        message.starts_with("failed here: v2 (generation 2) failed 1 time(s)")
            && message.contains("50-app: app is down"),
        "{message}"
    );
    assert_eq!(
        annotation(&world, "k3os.io/update-phase").as_deref(),
        Some("Failed")
    );
    let ev = channel_events(&l);
    assert!(
        ev.iter()
            .any(|(r, n)| r == "NotRetrying" && n.contains("failed here: v2")),
        "{ev:#?}"
    );
}
