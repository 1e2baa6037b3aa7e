//! An idle agent, wired as `k3os-ops agent` runs it ([`agent::testing::run_agent`]: watches of
//! the channels and of its Node, its loops on the watch caches), against the fake API server
//! on tokio's paused clock: once it is up to date it writes nothing and reads nothing over
//! many resyncs (only its Lease renewals and the watch restarts reach the server), and it
//! still wakes at once when the channel's target changes.

use k3os_ops_testing::fake_api;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fake_api::{Log, World, NS};
use k3os_ops::agent;
use k3os_ops_testing::sim_node::SimNode;

use agent::testing::crd::UpdateChannel;
use agent::testing::{Agent, Periods, Polls, WriteCounter};
use serde_json::json;

fn spent(w: &Arc<Mutex<World>>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    w.lock()
        .unwrap()
        .requests
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_idle_agent_makes_no_writes_and_no_reads_over_many_resyncs_and_wakes_on_a_change() {
    let node = fake_api::ready_node("n1", json!({"role": "worker"}));
    let channel = fake_api::channel_object(
        &UpdateChannel::test()
            .url("https://releases.example/")
            .version(Some("v1"))
            .reboot_timeout("2m")
            .build(),
    );
    let world = Arc::new(Mutex::new(World::new([node], channel)));
    let log = Log::default();
    let writes = WriteCounter::new("n1");
    let client = fake_api::counted_client(&world, &log, &writes);
    // Running v1, staging whatever it is asked to; it never reboots here.
    let ops = Arc::new(SimNode::new("v1"));
    let agent = Arc::new(Agent::new(client, NS, "n1", None, ops).with_watches(writes));
    let resync = Duration::from_secs(30);
    let periods = Periods {
        resync,
        poll: Polls {
            every: Duration::from_secs(900),
            waiting: Duration::from_secs(3600),
        },
        count: Duration::from_secs(30),
    };
    let task = tokio::spawn(async move {
        let _ = agent::testing::run_agent(agent, periods).await;
    });
    // Up: watches listed, the node annotated UpToDate once, Leases written.
    tokio::time::sleep(Duration::from_secs(120)).await;
    let phase = |w: &Arc<Mutex<World>>| {
        w.lock().unwrap().node("n1")["metadata"]["annotations"]["k3os.io/update-phase"].clone()
    };
    assert_eq!(phase(&world), "UpToDate");
    let before = world.lock().unwrap().requests.clone();
    // Twenty resyncs.
    tokio::time::sleep(resync * 20).await;
    let idle = spent(&world, &before);
    // The Lease renewals (its own, and the counter Lease this only node holds), the watches,
    // and the counter's list of the Nodes; nothing else.
    let allowed = [
        "PUT leases",
        "GET leases",
        "WATCH nodes",
        "WATCH updatechannels",
        "LIST nodes",
    ];
    let other: Vec<_> = idle
        .iter()
        .filter(|(k, _)| !allowed.contains(&k.as_str()))
        .collect();
    assert!(other.is_empty(), "an idle agent read or wrote: {idle:?}");
    // rebootTimeout 2m: the node Lease is renewed every 30 s (one PUT, no GET), and the
    // counter Lease on each count (30 s, a GET and a PUT): ~20 + 20 in 10 minutes.
    let puts = idle.get("PUT leases").copied().unwrap_or(0);
    let gets = idle.get("GET leases").copied().unwrap_or(0);
    assert!((38..=44).contains(&puts), "{idle:?}");
    assert!((19..=22).contains(&gets), "{idle:?}");
    // A new target wakes it through the channel watch, well before a resync.
    world
        .lock()
        .unwrap()
        .edit_channel_spec(|s| s["version"] = json!("v2"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_ne!(phase(&world), "UpToDate", "{:?}", log.lock().unwrap());
    task.abort();
    let _ = task.await;
    fake_api::no_unexpected(&log);
}
