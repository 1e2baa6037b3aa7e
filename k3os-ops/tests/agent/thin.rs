//! The agent on a thin link, end to end: the real node side (`LibupgradeNode` over a testkit
//! `SimNode`) stages a signed release served by a metered 127.0.0.1 server (`TestServer`,
//! which counts every byte it sends), driven through the fake API server of `fake_api`, in
//! virtual time (`VirtualClock`, the agent's `Settings::clock`, which the library's schedule
//! and rate limit follow too).
//!
//! - `spec.stage.windows[]`: outside them not a byte is served (the channel is not even
//!   resolved); inside, at most the window's rate; at the window's end the stage stops as
//!   `StageWaiting` naming the next window, never `StageFailed`, never counted as a failure,
//!   and the next window finishes it without re-fetching.
//! - `spec.stage.maxBytesPerDay`: a clean stop at the quota; an agent restart the same day
//!   fetches nothing (the ledger on the node); the next day fetches exactly what is left.
//! - `spec.sources[]`: a host directory holding the release serves it, the origin only the
//!   metadata.
//! - offline bundles in the agent's bundle directory: staged with the channel unreachable.
//! - the preview (annotation, gauge, `stage-preview.json`) before the first byte, and the
//!   condition `StageWillMissWindow` while the bytes left cannot arrive before the next
//!   maintenance window, cleared once staged.
//! - a v0.1.0 channel (fixture) has no thin-link settings and stages as before.
//!
//! Every release here carries an image archive payload beside its slot files (issue 33), so
//! each of the above covers payloads too: the preview prices it, windows, quota, sources and
//! bundles bring it, and it ends in the node's payload store.

use k3os_ops::agent;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agent::testing::crd::UpdateChannel;
use agent::testing::{Agent, Inactive, LibupgradeNode, NodeOps};
use chrono::{DateTime, Utc};
use fake_api::{Log, World};
use libupgrade::manifest::Arch;
use libupgrade::Clock;
use serde_json::{json, Value};
use testkit::clock::VirtualClock;
use testkit::sim::SimNode;
use testkit::TestServer;

use k3os_ops_testing::fake_api;

/// Slack for what the server sends besides artifact bytes: the channel index, manifests,
/// signatures, chunk indexes and HTTP headers of every resolve and request.
const OVERHEAD: u64 = 256 << 10;

fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

/// The image archive payload every v2 here carries, and the bytes of its one layer.
const IMAGES: &str = "site-images";
const LAYER: usize = 512 << 10;

/// A channel with release v2 (`payload` bytes of noise in its rootfs, and an image archive
/// payload [`IMAGES`]) served over HTTP, a node on v1.
struct Site {
    _keys: testkit::Keys,
    chan: tempfile::TempDir,
    server: TestServer,
    sim: SimNode,
}

impl Site {
    fn new(payload: usize) -> Site {
        let keys = testkit::keys();
        let chan = tempfile::tempdir().unwrap();
        let noise = testkit::pseudo_random(payload, 2);
        let inputs = testkit::ReleaseInputs::of_generation("v2", 2, &noise, Arch::host()).image(
            IMAGES,
            testkit::image_archive(
                "registry.local/site/app:2",
                &[testkit::pseudo_random(LAYER, 3)],
            ),
        );
        testkit::signed_release(&keys, chan.path(), &inputs);
        libupgrade::channel::write_index(chan.path()).unwrap();
        let server = TestServer::start(chan.path().to_path_buf(), 0);
        let sim = SimNode::new(&keys.trust, 3, 1);
        Site {
            _keys: keys,
            chan,
            server,
            sim,
        }
    }

    fn release(&self) -> PathBuf {
        self.chan.path().join("v2")
    }

    /// The fake API with channel `stable` (`extra` merged into its spec) and an agent on n1
    /// whose node looks for bundles in `bundles`.
    fn agent(
        &self,
        url: &str,
        extra: Value,
        clock: &Arc<VirtualClock>,
        bundles: Option<&Path>,
    ) -> (Arc<Mutex<World>>, Log, Agent) {
        let mut channel = fake_api::channel_object(&UpdateChannel::test().url(url).build());
        fake_api::merge(&mut channel["spec"], &extra);
        let log: Log = Arc::default();
        let world = Arc::new(Mutex::new(World::new(
            [fake_api::ready_node("n1", json!({}))],
            channel,
        )));
        let agent = self.restart(&world, &log, clock, bundles);
        (world, log, agent)
    }

    /// A new agent process over the same API and node (nothing remembered).
    fn restart(
        &self,
        world: &Arc<Mutex<World>>,
        log: &Log,
        clock: &Arc<VirtualClock>,
        bundles: Option<&Path>,
    ) -> Agent {
        let mut node = LibupgradeNode::new(self.sim.updater(), vec!["false".into()]);
        if let Some(d) = bundles {
            node = node.with_bundle_dir(d.to_path_buf());
        }
        let mut agent = Agent::new(
            fake_api::client(world, log),
            "k3os-system",
            "n1",
            None,
            Arc::new(node),
        );
        agent.settings.clock = clock.clone();
        agent
    }

    fn inactive(&self) -> Inactive {
        LibupgradeNode::new(self.sim.updater(), vec!["false".into()])
            .status()
            .unwrap()
            .inactive
    }

    /// v2's image archive payload (its only one) is in the node's payload store, complete.
    fn assert_payload_stored(&self) {
        let m = testkit::release_manifest(&self.release());
        let p = m.payload(IMAGES).expect("v2 names its payload");
        assert!(p.file.size > LAYER as u64, "{p:?}");
        let state = self.sim.updater().config().state_dir.clone();
        assert_eq!(testkit::assert_payloads_stored(&state, &self.release()), 1);
    }

    fn state_file(&self, name: &str) -> Value {
        let p = self.sim.updater().config().state_dir.join(name);
        serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
    }
}

/// Move the virtual clock on to `t` (never back).
fn advance_to(clock: &Arc<VirtualClock>, t: &str) {
    let d = utc(t) - clock.now();
    clock.sleep(d.to_std().expect("the clock is past that time"));
}

fn annotation(world: &Arc<Mutex<World>>, key: &str) -> Option<String> {
    world.lock().unwrap().node("n1")["metadata"]["annotations"][key]
        .as_str()
        .map(String::from)
}

fn phase(world: &Arc<Mutex<World>>) -> (String, String) {
    (
        annotation(world, "k3os.io/update-phase").unwrap_or_default(),
        annotation(world, "k3os.io/update-message").unwrap_or_default(),
    )
}

/// The value of the series `name` whose labels include every one of `labels`.
fn metric(agent: &Agent, name: &str, labels: &[&str]) -> Option<f64> {
    agent
        .clients
        .metrics
        .encode()
        .lines()
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
                && labels.iter().all(|x| l.contains(x))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The failure counters and records a stop must never touch.
fn assert_no_failure(world: &Arc<Mutex<World>>, agent: &Agent) {
    assert_eq!(
        metric(agent, "k3os_ops_stage_failures_total", &[]),
        Some(0.0)
    );
    let w = world.lock().unwrap();
    assert_eq!(w.channel["status"]["failures"], json!([]));
}

fn preview(world: &Arc<Mutex<World>>) -> Value {
    let key = k3os_ops::agent::testing::ANN_STAGE_PREVIEW;
    assert_eq!(key, "k3os.io/update-stage-preview");
    assert_eq!(
        annotation(world, "k3os.io/stage-preview"),
        None,
        "the old key"
    );
    serde_json::from_str(&annotation(world, key).expect("no preview")).unwrap()
}

#[tokio::test]
async fn stage_windows_fetch_nothing_outside_cap_the_rate_inside_and_a_window_end_is_no_failure() {
    let site = Site::new(4 << 20);
    let clock = VirtualClock::new(utc("2026-12-04T00:00:00Z"), site.server.sent_counter());
    let rate = 16u64 << 10;
    let stage = json!({"stage": {"windows": [
        {"start": "01:00", "length": "1h", "maxRate": "16K"},
        {"days": ["sat"], "start": "01:00", "length": "1h", "maxRate": "0"}
    ]}});
    let (world, _log, agent) = site.agent(&site.server.base, stage, &clock, None);
    // An agent of the previous release left its preview under the old key: the next preview
    // replaces it (`preview` asserts the old key is gone).
    world.lock().unwrap().node_mut("n1")["metadata"]["annotations"]["k3os.io/stage-preview"] =
        json!(r#"{"format":1,"version":"v1","fetch":1,"reuse":1}"#);

    agent.reconcile().await.expect("reconcile");
    let (ph, msg) = phase(&world);
    assert_eq!(ph, "StageWaiting", "{msg}");
    assert!(
        msg.contains("the next opens at 2026-12-04T01:00:00Z"),
        "{msg}"
    );
    assert_eq!(site.server.sent(), 0, "outside the windows not a byte");
    assert_eq!(
        metric(&agent, "k3os_ops_update_phase", &["phase=\"StageWaiting\""]),
        Some(1.0)
    );

    // 01:59: one minute of the window left.
    advance_to(&clock, "2026-12-04T01:59:00Z");
    agent.reconcile().await.expect("reconcile");
    let sent = site.server.sent();
    let (ph, msg) = phase(&world);
    assert_eq!(ph, "StageWaiting", "{msg}");
    // Saturday's window has rate 0: the next one that downloads is Sunday's.
    assert!(
        msg.contains("the next opens at 2026-12-06T01:00:00Z"),
        "{msg}"
    );
    assert!(sent > 0, "nothing fetched in the window");
    assert!(
        sent <= rate * 60 + OVERHEAD,
        "{sent} bytes in 60 s at {rate} B/s"
    );
    assert_no_failure(&world, &agent);
    let need = preview(&world)["fetch"].as_u64().unwrap();
    assert!(need > (4 << 20) + LAYER as u64, "preview {need}");
    assert_eq!(preview(&world)["version"], "v2");
    // The preview prices every part, the payload included: what it fetches and reuses is
    // the whole release.
    let reuse = preview(&world)["reuse"].as_u64().unwrap();
    assert_eq!(need + reuse, testkit::release_size(&site.release()));
    assert_eq!(
        metric(
            &agent,
            "k3os_ops_stage_preview_bytes",
            &["channel=\"stable\"", "kind=\"fetch\""]
        ),
        Some(need as f64)
    );
    assert_eq!(site.state_file("stage-preview.json")["fetch"], need);

    // Saturday 01:30: rate 0, nothing.
    advance_to(&clock, "2026-12-05T01:30:00Z");
    agent.reconcile().await.expect("reconcile");
    assert_eq!(site.server.sent(), sent, "a rate-0 window fetches nothing");

    let (ph, msg) = phase(&world);
    assert_eq!(ph, "StageWaiting", "{msg}");
    assert!(
        msg.contains("the next opens at 2026-12-06T01:00:00Z"),
        "{msg}"
    );
    // Sunday's window finishes it, re-fetching nothing.
    advance_to(&clock, "2026-12-06T01:00:00Z");
    agent.reconcile().await.expect("reconcile");
    assert_eq!(site.inactive(), Inactive::Staged("v2".into()));
    assert_eq!(phase(&world).0, "Staged");
    site.assert_payload_stored();
    let total = site.server.sent();
    assert!(
        total >= need && total <= need + 2 * OVERHEAD,
        "served {total} for a need of {need}"
    );
    assert_no_failure(&world, &agent);
}

#[tokio::test]
async fn the_daily_quota_stops_cleanly_survives_a_restart_and_resumes_the_next_day() {
    // 2.5 MiB of rootfs noise, the kernel, initrd and image archive: under two days' quota.
    let site = Site::new(5 << 19);
    let clock = VirtualClock::new(utc("2026-12-04T10:00:00Z"), site.server.sent_counter());
    let quota = 2u64 << 20;
    let spec = json!({"stage": {"maxBytesPerDay": "2M"}});
    let (world, log, agent) = site.agent(&site.server.base, spec, &clock, None);

    agent.reconcile().await.expect("reconcile");
    let (ph, msg) = phase(&world);
    assert_eq!(ph, "StageWaiting", "{msg}");
    assert!(msg.contains("today's download quota of 2.0 MiB"), "{msg}");
    assert!(msg.contains("goes on at 2026-12-05T00:00:00Z"), "{msg}");
    let ledger = site.state_file("stage-ledger.json");
    assert_eq!(ledger["format"], 1);
    assert_eq!(ledger["day"], "2026-12-04");
    let day1 = ledger["fetched"].as_u64().unwrap();
    assert!(
        day1 <= quota && day1 > quota - (256 << 10),
        "day 1 fetched {day1}"
    );
    assert_no_failure(&world, &agent);
    let need = preview(&world)["fetch"].as_u64().unwrap();
    assert!(need > quota, "need {need}");

    // A restarted agent the same day: the ledger on the node says the quota is spent.
    let before = site.server.sent();
    let agent = site.restart(&world, &log, &clock, None);
    agent.reconcile().await.expect("reconcile");
    assert_eq!(phase(&world).0, "StageWaiting");
    assert_eq!(
        site.server.sent(),
        before,
        "nothing fetched after the restart"
    );

    // The next day: exactly what is left.
    advance_to(&clock, "2026-12-05T00:00:00Z");
    agent.reconcile().await.expect("reconcile");
    assert_eq!(site.inactive(), Inactive::Staged("v2".into()));
    site.assert_payload_stored();
    let day2 = site.server.sent() - before;
    assert!(
        day2 >= need - day1 && day2 <= need - day1 + OVERHEAD,
        "day 2 served {day2}, need {need} - day 1 {day1} = {}",
        need - day1
    );
    let ledger = site.state_file("stage-ledger.json");
    assert_eq!(ledger["day"], "2026-12-05");
    assert_eq!(ledger["fetched"].as_u64().unwrap(), need - day1);
    assert_no_failure(&world, &agent);
}

#[tokio::test]
async fn a_source_directory_serves_the_chunks_and_the_origin_only_the_metadata() {
    let site = Site::new(3 << 20);
    let clock = VirtualClock::new(utc("2026-12-04T10:00:00Z"), site.server.sent_counter());
    let local = tempfile::tempdir().unwrap();
    for f in [
        "rootfs.squashfs",
        "vmlinuz",
        "initrd",
        &format!("{IMAGES}.tar"),
    ] {
        std::fs::copy(site.release().join(f), local.path().join(f)).unwrap();
    }
    let spec = json!({"sources": [local.path().display().to_string()]});
    let (world, _log, agent) = site.agent(&site.server.base, spec, &clock, None);
    agent.reconcile().await.expect("reconcile");
    assert_eq!(
        site.inactive(),
        Inactive::Staged("v2".into()),
        "{:?}",
        phase(&world)
    );
    let size = testkit::release_size(&site.release());
    let sent = site.server.sent();
    assert!(
        sent < OVERHEAD,
        "origin served {sent} of a {size}-byte release"
    );
    site.assert_payload_stored();
}

#[tokio::test]
async fn a_bundle_in_the_bundle_directory_stages_with_the_channel_unreachable() {
    let site = Site::new(1 << 20);
    let clock = VirtualClock::new(utc("2026-12-04T10:00:00Z"), site.server.sent_counter());
    let bundles = tempfile::tempdir().unwrap();
    std::fs::write(bundles.path().join("notes.txt"), "not a bundle").unwrap();
    libupgrade::bundle::write(&site.release(), &bundles.path().join("v2.k3b")).unwrap();
    // Port 9 on loopback: nothing listens, the channel cannot be read.
    let (world, _log, agent) = site.agent(
        "http://127.0.0.1:9/",
        json!({}),
        &clock,
        Some(bundles.path()),
    );
    agent.reconcile().await.expect("reconcile");
    assert_eq!(
        site.inactive(),
        Inactive::Staged("v2".into()),
        "{:?}",
        phase(&world)
    );
    let p = preview(&world);
    assert!(p["bundle"].as_str().unwrap().ends_with("v2.k3b"), "{p}");
    assert_eq!(site.server.sent(), 0, "the origin was never asked");
    site.assert_payload_stored();

    // A tampered bundle is refused as `upgrade --bundle` refuses it: a failed stage.
    let site = Site::new(1 << 20);
    let bundles = tempfile::tempdir().unwrap();
    let b = bundles.path().join("v2.k3b");
    libupgrade::bundle::write(&site.release(), &b).unwrap();
    let mut bytes = std::fs::read(&b).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    std::fs::write(&b, bytes).unwrap();
    let (world, _log, agent) = site.agent(
        "http://127.0.0.1:9/",
        json!({}),
        &clock,
        Some(bundles.path()),
    );
    agent.reconcile().await.expect("reconcile");
    assert_eq!(site.inactive(), Inactive::Empty);
    let (ph, msg) = phase(&world);
    assert_eq!(ph, "StageFailed", "{msg}");
}

#[tokio::test]
async fn stage_will_miss_window_is_set_while_the_bytes_left_cannot_arrive_and_cleared_once_staged()
{
    let site = Site::new(4 << 20);
    let clock = VirtualClock::new(utc("2026-12-04T01:00:00Z"), site.server.sent_counter());
    // 1 h a night at 1 KiB/s (3.5 MiB) cannot bring 4 MiB before the 03:00 maintenance window;
    // two nights can, before the one after.
    let spec = json!({
        "window": {"start": "03:00", "length": "1h"},
        "stage": {"windows": [{"start": "01:00", "length": "1h", "maxRate": "1K"}]}
    });
    let (world, log, agent) = site.agent(&site.server.base, spec, &clock, None);
    agent.reconcile().await.expect("reconcile");
    let c = world
        .lock()
        .unwrap()
        .condition("StageWillMissWindow")
        .expect("condition set");
    assert_eq!(c["status"], "True", "{c}");
    let msg = c["message"].as_str().unwrap();
    assert!(
        msg.starts_with("node n1: ") && msg.contains("2026-12-04T03:00:00Z"),
        "{msg}"
    );
    let warned = log
        .lock()
        .unwrap()
        .windows(2)
        .filter(|w| {
            w[0] == "event: StageWillMissWindow"
                && w[1].starts_with("event-on: UpdateChannel k3os-system/stable: ")
        })
        .count();
    assert_eq!(warned, 1, "one warning on the channel");
    assert_eq!(phase(&world).0, "StageWaiting");
    assert_no_failure(&world, &agent);

    // The next night: the rest arrives, the condition clears.
    advance_to(&clock, "2026-12-05T01:00:00Z");
    agent.reconcile().await.expect("reconcile");
    assert_eq!(site.inactive(), Inactive::Staged("v2".into()));
    let c = world
        .lock()
        .unwrap()
        .condition("StageWillMissWindow")
        .unwrap();
    assert_eq!(c["status"], "False", "{c}");
    assert_eq!(c["reason"], "StageOnTime", "{c}");
}
