//! The agent follows a release's rollout `retries` (`release rollout --retries N
//! --retry-backoff D`), by the one decision the CLI takes (`libupgrade::rollout::decide_retry`)
//! over the node's own failure record and the retries its own resolution of the channel reads:
//! a release that failed on the node is held (its Node says why and until when, an Event
//! `NotRetrying`), tried again once the backoff has passed (an Event `Retrying`, the stage over
//! the bad slot, the update as usual), and held for good once the retries are used up.

use std::sync::{Arc, Mutex};

use chrono::Utc;
use k3os_ops::agent::testing::crd::UpdateChannel;
use k3os_ops::agent::testing::{Agent, Inactive};
use k3os_ops_testing::fake_api::{self, Log, World};
use k3os_ops_testing::sim_node::{SimChannel, SimNode};
use libupgrade::rollout::{Retries, Rollout, Wave};
use libupgrade::state::FailedRelease;
use serde_json::json;

use crate::fleet_waves::{listed, t};
use crate::flow::{annotation, channel_events, pod_agent, pos, settle};

/// Node `n1` on v1 whose signed channel offers v2 to the whole fleet with one retry an hour
/// after a failure, followed as `version` says (`v2` pinned, or `latest`, which the poller
/// resolved to v2), and v2's record on the node: failed once, `ago` seconds before now.
fn setup(version: &str, ago: i64) -> (Agent, Arc<Mutex<World>>, Arc<SimNode>, Log) {
    let log: Log = Arc::default();
    let n1 = fake_api::ready_node("n1", json!({"pool": "edge"}));
    let channel = UpdateChannel::test()
        .url("https://releases.example/")
        .version(Some(version))
        .spec_with(|s| s.node_selector = [("pool".into(), "edge".into())].into())
        .build();
    let mut object = fake_api::channel_object(&channel);
    // Following `latest`: the poller has resolved it to v2.
    object["status"]["latestVersion"] = json!("v2");
    let world = Arc::new(Mutex::new(World::new([n1], object)));
    let v2 = Rollout {
        waves: vec![Wave {
            share_bp: 10_000,
            start: t(0),
        }],
        retries: Some(Retries {
            count: 1,
            backoff_secs: 3600,
        }),
        ..Rollout::default()
    };
    let node = Arc::new(
        SimNode::recording("v1", log.clone()).with_channel(SimChannel {
            releases: vec![listed("v1", 1, None), listed("v2", 2, Some(v2))],
            now: t(1),
        }),
    );
    failed_at(&node, 1, ago);
    let agent = pod_agent(&world, &log, node.clone());
    (agent, world, node, log)
}

/// The node's record of v2 (as its state file keeps it): failed `attempts` times, the last
/// `ago` seconds before now; its inactive slot the bad v2.
fn failed_at(node: &SimNode, attempts: u32, ago: i64) {
    let at = u64::try_from(Utc::now().timestamp() - ago).unwrap();
    node.edit_status(|s| {
        s.inactive = Inactive::Failed("v2".into());
        s.failed = vec![FailedRelease {
            version: "v2".into(),
            generation: Some(2),
            attempts,
            at,
            why: "50-app: app is down".into(),
        }];
    });
}

/// What the agent said last on its Node, and the `NotRetrying` Events regarding the channel.
fn held(world: &Arc<Mutex<World>>, log: &Log) -> (String, Vec<String>) {
    let message = annotation(world, "k3os.io/update-message").unwrap_or_default();
    assert_eq!(
        annotation(world, "k3os.io/update-phase").as_deref(),
        Some("Failed"),
        "{message}"
    );
    let l = log.lock().unwrap().clone();
    assert!(!l.iter().any(|x| x.contains("node: stage")), "{l:#?}");
    let notes = channel_events(&l)
        .into_iter()
        .filter(|(r, _)| r == "NotRetrying")
        .map(|(_, n)| n)
        .collect();
    (message, notes)
}

#[tokio::test]
async fn a_failed_latest_release_is_held_retried_after_its_backoff_then_held_when_spent() {
    held_retried_held("latest").await;
}

#[tokio::test]
async fn a_failed_pinned_release_is_held_retried_after_its_backoff_then_held_when_spent() {
    held_retried_held("v2").await;
}

/// The scenario on a channel that follows `version`: the retries are read from this node's
/// own resolution of `latest`, or of the pinned release.
async fn held_retried_held(version: &str) {
    // Failed 10 minutes ago: the one retry comes 1 h after the failure, not before.
    let (agent, world, node, log) = setup(version, 600);
    settle(&agent).await;
    let (message, notes) = held(&world, &log);
    assert!(
        message.starts_with("failed here: v2 (generation 2) failed 1 time(s) on this node")
            && message.contains("50-app: app is down")
            && message.contains("; retry 1 of 1 the rollout allows, not before "),
        "{message}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("not retrying v2: failed here")
                && n.contains("retry 1 of 1 the rollout allows")),
        "{notes:#?}"
    );

    // Two hours after the failure the backoff has passed: v2 is staged again over the bad
    // slot, announced as the retry, and the update goes on as usual.
    failed_at(&node, 1, 7200);
    log.lock().unwrap().clear();
    settle(&agent).await;
    let l = log.lock().unwrap().clone();
    fake_api::no_unexpected(&log);
    let stage = pos(&l, "node: stage v2");
    let claim = pos(&l, "slots=[n1:Claimed]");
    let reboot = pos(&l, "node: reboot");
    assert!(stage < claim && claim < reboot, "{l:#?}");
    let ev = channel_events(&l);
    assert!(
        ev.iter().any(|(r, n)| r == "Retrying"
            && n == "retrying v2: it failed 1 time(s) on this node (last: 50-app: app is down); \
                     retry 1 of 1 its rollout allows"),
        "{ev:#?}"
    );

    // The retried trial fails too (the loader falls back; the node's record counts it): the
    // rollback is handled, and v2 is held for good.
    node.fall_back();
    failed_at(&node, 2, 0);
    log.lock().unwrap().clear();
    settle(&agent).await;
    let (message, notes) = held(&world, &log);
    pos(&log.lock().unwrap(), "event: RolledBack");
    assert!(
        message.starts_with("failed here: v2 (generation 2) failed 2 time(s) on this node")
            && message.ends_with(
                "; not tried again until a newer release is published or its rollout allows \
                 more than the 1 retries it allows"
            ),
        "{message}"
    );
    assert!(
        notes.iter().any(|n| n.contains("failed 2 time(s)")),
        "{notes:#?}"
    );
    // Later polls change nothing.
    log.lock().unwrap().clear();
    settle(&agent).await;
    held(&world, &log);
}
