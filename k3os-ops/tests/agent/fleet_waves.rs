//! The agent honours the channel's fleet rollouts (issue 24): the waves, pause and withdrawal
//! in the channel's signed metadata, which place a whole cluster by one seed derived from the
//! UpdateChannel's UID. The agent runs as `k3os-ops agent` runs it (watches, the poller, the
//! reconcile loop) against the fake API server on tokio's paused clock, over a `SimNode`
//! whose channel is resolved by libupgrade's own pure rollout decision at a time the test
//! moves (what `K3OS_OPS_TEST_NOW` does for the binary).
//!
//! - A cluster whose wave has not started: `latestVersion` stays the offered v1, the
//!   condition `WaitingForWave` names v2 and the start time (RFC 3339), the status shows the
//!   cluster's seed, nobody stages or claims; after the start the cluster rolls out inside
//!   (stages v2, claims a slot), and the condition is gone. Every resolution and the stage
//!   carry the cluster's seed.
//! - A withdrawn target: the condition `ReleaseWithdrawn` and one Event on the channel, no
//!   claim, the staged v2 dropped (slot marked bad), the node up to date on v1.

use k3os_ops_testing::fake_api;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use fake_api::{no_unexpected, Log, World, NS};
use k3os_ops::agent;
use k3os_ops::agent::testing::crd::UpdateChannel;
use k3os_ops_testing::sim_node::{SimChannel, SimNode};
use libupgrade::rollout::{admits_from, Listed, Rollout, Seed, Wave, Withdrawal};

use agent::testing::{Agent, Inactive, NodeOps, Periods, Polls, WriteCounter};
use serde_json::{json, Value};

pub(crate) const UID: &str = "0c9f6a52-5d1e-4c1b-9a53-2f1d7e1f0a11";

pub(crate) fn t(h: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + h * 3600, 0).unwrap()
}

pub(crate) fn listed(version: &str, generation: u64, rollout: Option<Rollout>) -> Listed {
    Listed {
        version: version.into(),
        generation,
        rollout,
    }
}

/// The four waves: 1 % at T, 10 % at T+24h, 50 % at T+48h, all at T+72h (T = t(0)).
pub(crate) fn four_waves() -> Vec<Wave> {
    [(100, 0), (1000, 24), (5000, 48), (10_000, 72)]
        .into_iter()
        .map(|(share_bp, h)| Wave {
            share_bp,
            start: t(h),
        })
        .collect()
}

/// The cluster's place (seed from [`UID`]) in v2's [`four_waves`], the instant v2 is admitted
/// for it, and node `n1` on v1 whose channel (v1, and v2 under those waves) reads `lead` before
/// that instant.
pub(crate) fn waiting_for_v2(lead: chrono::Duration) -> (Seed, DateTime<Utc>, SimNode) {
    let seed = Seed::derived_from(UID);
    let waves = four_waves();
    let starts = admits_from(&waves, seed.get()).expect("every seed is admitted at last");
    assert!(starts > t(0), "the derived seed is past the first point");
    let v2 = Rollout {
        waves,
        ..Rollout::default()
    };
    let node = SimNode::new("v1").with_channel(SimChannel {
        releases: vec![listed("v1", 1, None), listed("v2", 2, Some(v2))],
        now: starts - lead,
    });
    (seed, starts, node)
}

/// One node `n1` and the channel `stable` following `latest`, with `status`.
fn world(status: Value) -> Arc<Mutex<World>> {
    world_with(json!({"version": "latest"}), status)
}

/// One node `n1` and the test channel `stable` (`UpdateChannel::test()`: its URL,
/// concurrency 1, maxFailures 1; rebootTimeout 2m, no version) with `spec` merged over its
/// spec, and `status`.
pub(crate) fn world_with(spec: Value, status: Value) -> Arc<Mutex<World>> {
    let node = fake_api::ready_node("n1", json!({"role": "worker"}));
    let mut channel = fake_api::channel_object(
        &UpdateChannel::test()
            .version(None)
            .reboot_timeout("2m")
            .build(),
    );
    for (k, v) in spec.as_object().expect("a spec object") {
        channel["spec"][k] = v.clone();
    }
    channel["metadata"]["uid"] = json!(UID);
    channel["status"] = status;
    Arc::new(Mutex::new(World::new([node], channel)))
}

/// Run the agent of `n1` over `ops`, polling the channel every minute, until the returned
/// task is aborted.
pub(crate) fn start(
    world: &Arc<Mutex<World>>,
    log: &Log,
    ops: Arc<SimNode>,
) -> tokio::task::JoinHandle<()> {
    let minute = Duration::from_secs(60);
    start_polling(
        world,
        log,
        ops,
        Polls {
            every: minute,
            waiting: minute,
        },
    )
}

/// Run the agent of `n1` over `ops`, polling the channel as `polls` says.
fn start_polling(
    world: &Arc<Mutex<World>>,
    log: &Log,
    ops: Arc<SimNode>,
    polls: Polls,
) -> tokio::task::JoinHandle<()> {
    let writes = WriteCounter::new("n1");
    let client = fake_api::counted_client(world, log, &writes);
    let agent = Arc::new(Agent::new(client, NS, "n1", None, ops).with_watches(writes));
    let periods = Periods {
        resync: Duration::from_secs(30),
        poll: polls,
        count: Duration::from_secs(30),
    };
    tokio::spawn(async move {
        let _ = agent::testing::run_agent(agent, periods).await;
    })
}

/// How many Events of `reason` were published regarding the channel (each Event about the
/// channel is published twice: regarding the Node and regarding the channel).
pub(crate) fn events(log: &Log, reason: &str) -> usize {
    let l = log.lock().unwrap();
    l.windows(2)
        .filter(|w| {
            w[0] == format!("event: {reason}")
                && w[1].starts_with(&format!("event-on: UpdateChannel {NS}/stable: "))
        })
        .count()
}

pub(crate) fn channel_notes(log: &Log, starting: &str) -> usize {
    let prefix = format!("event-on: UpdateChannel {NS}/stable: {starting}");
    log.lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with(&prefix))
        .count()
}

#[tokio::test(start_paused = true)]
async fn a_cluster_waits_for_its_wave_then_rolls_out_inside() {
    let (seed, starts, node) = waiting_for_v2(chrono::Duration::hours(1));
    let ops = Arc::new(node);
    let world = world(json!({"slots": [], "failures": [], "conditions": []}));
    let log = Log::default();
    let task = start(&world, &log, ops.clone());
    tokio::time::sleep(Duration::from_secs(180)).await;
    {
        let w = world.lock().unwrap();
        let st = &w.channel["status"];
        assert_eq!(st["latestVersion"], "v1", "{st:#}");
        assert_eq!(st["fleetRollout"]["clusterSeed"], seed.get(), "{st:#}");
        let c = w.condition("WaitingForWave").expect("condition set");
        assert_eq!(c["status"], "True");
        assert_eq!(c["reason"], "WaveNotStarted");
        let msg = c["message"].as_str().unwrap();
        let rfc3339 = libupgrade::trust::meta::time_str(&starts);
        assert!(
            msg.contains(&format!(
                "v2 waits: this cluster's wave starts at {rfc3339}"
            )) && msg.contains(&format!("cluster seed {seed}")),
            "{msg}"
        );
        assert_eq!(st["slots"], json!([]));
        let phase = &w.node("n1")["metadata"]["annotations"]["k3os.io/update-phase"];
        assert_eq!(phase, "UpToDate");
    }
    assert_eq!(
        (events(&log, "Staging"), events(&log, "SlotClaimed")),
        (0, 0)
    );
    assert_eq!(ops.status().unwrap().inactive, Inactive::Empty);

    // The wave reaches the cluster: the next poll offers v2, the node stages and claims.
    ops.edit_channel(|c| c.now = starts + chrono::Duration::seconds(1));
    tokio::time::sleep(Duration::from_secs(180)).await;
    {
        let w = world.lock().unwrap();
        assert_eq!(w.channel["status"]["latestVersion"], "v2");
        assert_eq!(w.condition("WaitingForWave"), None, "removed once started");
    }
    assert_eq!(events(&log, "Staging"), 1, "{:#?}", log.lock().unwrap());
    assert_eq!(events(&log, "SlotClaimed"), 1, "{:#?}", log.lock().unwrap());
    // Every resolution and the stage placed the node by the cluster's seed.
    let seeds = ops.seeds();
    assert!(seeds.len() >= 3, "{seeds:?}");
    assert!(seeds.iter().all(|s| *s == Some(seed)), "{seeds:?}");
    task.abort();
    let _ = task.await;
    no_unexpected(&log);
}

/// The agent's defaults on a site with a thin link: polls every 15 minutes, every hour while a
/// release waits for the cluster's wave, and once more at the instant the wave reaches the
/// cluster (from the resolution's own clock): waiting costs a poll an hour, and the cluster's
/// turn is taken within seconds, not up to an hour late.
#[tokio::test(start_paused = true)]
async fn a_waiting_cluster_polls_hourly_and_again_when_its_wave_reaches_it() {
    let lead = chrono::Duration::minutes(150);
    let (_, _, node) = waiting_for_v2(lead);
    let ops = Arc::new(node.with_running_clock());
    let world = world(json!({"slots": [], "failures": [], "conditions": []}));
    let log = Log::default();
    let polls = Polls {
        every: Duration::from_secs(900),
        waiting: Duration::from_secs(3600),
    };
    let task = start_polling(&world, &log, ops.clone(), polls);
    // Up to 30 s before the wave reaches the cluster: polls at 0, 1 h and 2 h only.
    tokio::time::sleep((lead - chrono::Duration::seconds(30)).to_std().unwrap()).await;
    {
        let w = world.lock().unwrap();
        assert_eq!(w.channel["status"]["latestVersion"], "v1");
        assert!(w.condition("WaitingForWave").is_some());
    }
    let polled = ops.seeds().len();
    assert_eq!(polled, 3, "hourly while waiting, not every 15 min");
    assert_eq!(events(&log, "Staging"), 0);
    // The poll at the admission instant (+1 s) offers v2; the node stages it within the next
    // reconcile, long before the next hourly poll would have.
    tokio::time::sleep(Duration::from_secs(90)).await;
    {
        let w = world.lock().unwrap();
        assert_eq!(w.channel["status"]["latestVersion"], "v2");
        assert_eq!(w.condition("WaitingForWave"), None);
    }
    assert_eq!(events(&log, "Staging"), 1, "{:#?}", log.lock().unwrap());
    task.abort();
    let _ = task.await;
    no_unexpected(&log);
}

#[tokio::test(start_paused = true)]
async fn a_withdrawn_target_is_reported_once_never_claimed_and_dropped() {
    let gone = Rollout {
        withdrawn: Some(Withdrawal { at: t(0) }),
        ..Rollout::default()
    };
    // The poller resolved v2 before it was withdrawn; the node staged it.
    let ops = Arc::new(
        SimNode::new("v1")
            .with_staged("v2")
            .with_channel(SimChannel {
                releases: vec![listed("v1", 1, None), listed("v2", 2, Some(gone))],
                now: t(1),
            }),
    );
    let world = world(json!({"latestVersion": "v2", "slots": [], "failures": [],
                             "conditions": []}));
    let log = Log::default();
    let task = start(&world, &log, ops.clone());
    tokio::time::sleep(Duration::from_secs(600)).await;
    {
        let w = world.lock().unwrap();
        let st = &w.channel["status"];
        assert_eq!(st["latestVersion"], "v1", "{st:#}");
        assert_eq!(st["fleetRollout"]["withdrawn"], json!(["v2"]));
        assert_eq!(st["fleetRollout"]["withdrawnTarget"], "v2");
        let c = w.condition("ReleaseWithdrawn").expect("condition set");
        assert_eq!(
            (&c["status"], &c["reason"]),
            (&json!("True"), &json!("TargetWithdrawn"))
        );
        assert!(c["message"].as_str().unwrap().contains("is v1"), "{c}");
        assert_eq!(st["slots"], json!([]));
        let phase = &w.node("n1")["metadata"]["annotations"]["k3os.io/update-phase"];
        assert_eq!(phase, "UpToDate");
    }
    // One Event on the channel over ten polls, no claim, the staged v2 dropped.
    assert_eq!(
        channel_notes(&log, "v2 was withdrawn by the channel's signed metadata"),
        1,
        "{:#?}",
        log.lock().unwrap()
    );
    assert_eq!(
        (events(&log, "SlotClaimed"), events(&log, "Staging")),
        (0, 0)
    );
    assert_eq!(events(&log, "WithdrawnDropped"), 1);
    assert_eq!(
        events(&log, "ReleaseWithdrawn"),
        1,
        "{:#?}",
        log.lock().unwrap()
    );
    assert_eq!(
        ops.status().unwrap().inactive,
        Inactive::Failed("v2".into())
    );
    task.abort();
    let _ = task.await;
    no_unexpected(&log);
}
