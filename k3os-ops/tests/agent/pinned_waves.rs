//! A channel that pins `spec.version` honours the channel's fleet rollouts as `latest` does
//! (issue 24): the poller resolves the pinned release for the cluster's seed and publishes the
//! verdict; a release the channel withholds is a wait, never a stage attempt or a failure. The
//! agent runs as `k3os-ops agent` runs it against the fake API server on tokio's paused clock,
//! over a `SimNode` resolving with libupgrade's own pure rollout decision (see `fleet_waves`).
//!
//! - Pinned to a release whose wave has not reached the cluster: the condition
//!   `WaitingForWave` names it and the wave's start (RFC 3339), `status.fleetRollout.heldTarget`
//!   names it, the node's phase is `WaitingForWave`; no stage attempt, no `StageFailed`, nothing
//!   in `status.failures`, `latestVersion` not written. After the start: staged and claimed,
//!   the condition gone.
//! - Pinned to a withdrawn release: the condition `ReleaseWithdrawn` and one Event, no claim, no
//!   stage, the staged copy dropped.
//! - `spec.ignoreRollout: true`: the pinned release is staged through its wave, on purpose.

use std::sync::Arc;
use std::time::Duration;

use fake_api::{no_unexpected, Log};
use k3os_ops::agent::testing::{Inactive, NodeOps};
use k3os_ops_testing::fake_api;
use k3os_ops_testing::sim_node::{SimChannel, SimNode};
use libupgrade::rollout::{Rollout, Withdrawal};
use serde_json::json;

use super::fleet_waves::{channel_notes, events, listed, start, t, waiting_for_v2, world_with};

fn empty_status() -> serde_json::Value {
    json!({"slots": [], "failures": [], "conditions": []})
}

#[tokio::test(start_paused = true)]
async fn a_pinned_release_waits_for_the_clusters_wave_without_a_failure_then_stages() {
    let (seed, starts, node) = waiting_for_v2(chrono::Duration::hours(1));
    let ops = Arc::new(node);
    let world = world_with(json!({"version": "v2"}), empty_status());
    let log = Log::default();
    let task = start(&world, &log, ops.clone());
    tokio::time::sleep(Duration::from_secs(180)).await;
    {
        let w = world.lock().unwrap();
        let st = &w.channel["status"];
        assert_eq!(st["fleetRollout"]["clusterSeed"], seed.get(), "{st:#}");
        assert_eq!(st["fleetRollout"]["heldTarget"], "v2", "{st:#}");
        let c = w.condition("WaitingForWave").expect("condition set");
        assert_eq!(
            (&c["status"], &c["reason"]),
            (&json!("True"), &json!("WaveNotStarted"))
        );
        let msg = c["message"].as_str().unwrap();
        let rfc3339 = libupgrade::trust::meta::time_str(&starts);
        assert!(
            msg.contains(&format!(
                "v2 (spec.version) waits: this cluster's wave starts at {rfc3339}"
            )) && msg.contains(&format!("cluster seed {seed}")),
            "{msg}"
        );
        // A wait, not a failure: nothing recorded, no slot, latestVersion left alone.
        assert_eq!(st["failures"], json!([]), "{st:#}");
        assert_eq!(st["slots"], json!([]));
        assert_eq!(st.get("latestVersion"), None, "{st:#}");
        let phase = &w.node("n1")["metadata"]["annotations"]["k3os.io/update-phase"];
        assert_eq!(phase, "WaitingForWave");
    }
    assert_eq!(
        (
            events(&log, "Staging"),
            events(&log, "StageFailed"),
            events(&log, "SlotClaimed")
        ),
        (0, 0, 0),
        "{:#?}",
        log.lock().unwrap()
    );
    let failed = log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("event: StageFailed"))
        .count();
    assert_eq!(failed, 0, "no stage failure on the Node either");
    assert_eq!(ops.status().unwrap().inactive, Inactive::Empty);

    // The wave reaches the cluster: the next poll lifts the hold, the node stages and claims.
    ops.edit_channel(|c| c.now = starts + chrono::Duration::seconds(1));
    tokio::time::sleep(Duration::from_secs(180)).await;
    {
        let w = world.lock().unwrap();
        assert_eq!(w.condition("WaitingForWave"), None, "removed once started");
        let st = &w.channel["status"];
        assert_eq!(st["fleetRollout"].get("heldTarget"), None, "{st:#}");
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

#[tokio::test(start_paused = true)]
async fn a_withdrawn_pinned_release_is_reported_once_never_claimed_and_dropped() {
    let gone = Rollout {
        withdrawn: Some(Withdrawal { at: t(0) }),
        ..Rollout::default()
    };
    // The node staged v2 before the channel withdrew it.
    let ops = Arc::new(
        SimNode::new("v1")
            .with_staged("v2")
            .with_channel(SimChannel {
                releases: vec![listed("v1", 1, None), listed("v2", 2, Some(gone))],
                now: t(1),
            }),
    );
    let world = world_with(json!({"version": "v2"}), empty_status());
    let log = Log::default();
    let task = start(&world, &log, ops.clone());
    tokio::time::sleep(Duration::from_secs(600)).await;
    {
        let w = world.lock().unwrap();
        let st = &w.channel["status"];
        assert_eq!(st["fleetRollout"]["withdrawn"], json!(["v2"]), "{st:#}");
        assert_eq!(st["fleetRollout"]["withdrawnTarget"], "v2");
        assert_eq!(st["fleetRollout"].get("heldTarget"), None, "{st:#}");
        let c = w.condition("ReleaseWithdrawn").expect("condition set");
        assert_eq!(
            (&c["status"], &c["reason"]),
            (&json!("True"), &json!("TargetWithdrawn"))
        );
        assert_eq!(w.condition("WaitingForWave"), None);
        assert_eq!(st["slots"], json!([]));
        assert_eq!(st["failures"], json!([]), "{st:#}");
        let phase = &w.node("n1")["metadata"]["annotations"]["k3os.io/update-phase"];
        assert_eq!(phase, "Paused", "withdrawn: neither staged nor claimed");
    }
    // One Event on the channel over ten polls, no claim, no stage, the staged v2 dropped.
    assert_eq!(
        channel_notes(
            &log,
            "v2 (spec.version) was withdrawn by the channel's signed metadata"
        ),
        1,
        "{:#?}",
        log.lock().unwrap()
    );
    assert_eq!(events(&log, "ReleaseWithdrawn"), 1);
    assert_eq!(
        (
            events(&log, "SlotClaimed"),
            events(&log, "Staging"),
            events(&log, "StageFailed")
        ),
        (0, 0, 0)
    );
    assert_eq!(events(&log, "WithdrawnDropped"), 1);
    assert_eq!(
        ops.status().unwrap().inactive,
        Inactive::Failed("v2".into())
    );
    task.abort();
    let _ = task.await;
    no_unexpected(&log);
}

#[tokio::test(start_paused = true)]
async fn ignore_rollout_stages_a_pinned_release_through_its_wave_on_purpose() {
    let (_, _, node) = waiting_for_v2(chrono::Duration::hours(1));
    let ops = Arc::new(node);
    let world = world_with(
        json!({"version": "v2", "ignoreRollout": true}),
        empty_status(),
    );
    let log = Log::default();
    let task = start(&world, &log, ops.clone());
    tokio::time::sleep(Duration::from_secs(180)).await;
    {
        let w = world.lock().unwrap();
        assert_eq!(w.condition("WaitingForWave"), None);
        let st = &w.channel["status"];
        assert_eq!(st["fleetRollout"].get("heldTarget"), None, "{st:#}");
    }
    assert_eq!(events(&log, "Staging"), 1, "{:#?}", log.lock().unwrap());
    assert_eq!(events(&log, "SlotClaimed"), 1, "{:#?}", log.lock().unwrap());
    task.abort();
    let _ = task.await;
    no_unexpected(&log);
}
