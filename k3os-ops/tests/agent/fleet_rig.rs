//! The agent fleet: three agents, one per node, update the nodes from v1 to v2
//! through one shared fake API server (`fake_api`), each with a kube client of its own, each
//! over a real [`LibupgradeNode`] (in `SimNode::powered_over`: only its power is simulated):
//! a real `libupgrade::Updater` over a k3OS dir layout in its
//! own temp dir, a real signed v2 release (mksquashfs) in a local channel, and the in-memory
//! bootloader that counts tries like GRUB. The cluster holds a web app of three replicas (one
//! per node) guarded by a PodDisruptionBudget of `minAvailable: 2`; the fake's Eviction API
//! refuses (429) what would break it, and evicted pods come back on another schedulable node.
//!
//! Reboots are simulated by the test's driver. A node's `reboot()` hands a request to the
//! driver and blocks; the driver then ends that node's agent (its reconcile loop, Lease
//! renewal and reclaim loop: the process dies with the node), checks that no workload is left
//! on the node, marks the Node NotReady, power-cycles through the loader (new command line
//! and boot id), runs what init runs at every boot (`slot confirm`: on a trial it must report
//! pending, Node-Ready awaited; on a good slot it passes), and starts a fresh agent for the
//! node, which goes on from the persisted state (slot, annotations, the slots on disk). The
//! agent is a pod, so the kubelet runs before it: back on a good slot the Node is Ready before
//! the agent starts; on a trial of a good version the kubelet reports Ready once the agent
//! waits for it (phase `Confirming`), so the agent's wait is exercised.
//!
//! Invariants, checked by an observer on *every* state the fake world passes through (after
//! every answered request, every simulated cluster step and every change by the driver), not by
//! periodic sampling:
//! 1. at most `spec.concurrency` slot holders, no node twice;
//! 2. a node is cordoned only while it holds a slot past its Draining fence. The agent fences
//!    its slot to `Draining` (a CAS) before it marks `k3os.io/update-cordoned` and cordons, and
//!    on every way out it uncordons, then drops the mark, then releases the slot (or records the
//!    failure that releases it): `unschedulable ⇒ update-cordoned ⇒ slot phase ∈ {Draining,
//!    Rebooting, RollingBack}`, with no exception in this test (the one other way out, another
//!    agent reclaiming the slot of a holder silent for `rebootTimeout`, undoes the dead
//!    holder's cordon and mark before it frees the slot when the holder died before its flip);
//! 3. a node that is down (NotReady: rebooting, or its new version not Ready) holds a slot at
//!    `Rebooting` or `RollingBack`;
//! 4. the PodDisruptionBudget holds: at least 2 of the web pods are available (Ready, not
//!    terminating, on a Ready node);
//! 5. never more Ready nodes cordoned than `spec.concurrency` (a node that is down is not
//!    counted: it is disrupted by being down, see 3);
//!
//! and by the driver when a node reboots: no workload pod is left running on it. At the end
//! every node that updated held one slot under one token throughout (no claim was lost to a
//! stale write and made again).
//!
//! Slots are contended on purpose: the fake holds the first three status writes until all
//! three have arrived, so the three agents' claims race on one resourceVersion (all but one get
//! 409 and decide again; the tests assert the conflicts happened), and the first power cycle
//! waits until every agent has staged and tried to claim, so more nodes want a slot than there
//! are slots while it is held; the tests assert that the peak number of holders reached
//! `concurrency`.
//!
//! Scenarios: the happy rollout at concurrency 1 and 2 (every node ends on v2 blessed by the
//! boot-assessment core, uncordoned, the channel without holders or failures), and a v2 whose
//! Node never becomes Ready on the first node that boots it (that agent reports Node-Ready
//! failed, the core rolls back, the driver's next power cycle brings the node back to v1 with
//! B bad, the failure is recorded, the channel pauses at `maxFailures: 1`, and the other two
//! nodes never claim, cordon or reboot); a holder whose agent dies for good while Draining
//! (reclaimed after rebootTimeout, uncordoned by the reclaimer); and the
//! DaemonSet rolled from the v0.1.0 agent mid-rollout, starting from what v0.1.0 wrote
//! (tests/fixtures/v0.1.0), with the v0.1.0 holder coming back and finishing,
//! or never coming back (reclaimed only after rebootTimeout, as a failure).
//!
//! This module is the rig (the node side, the invariants, the driver); the scenarios are in
//! `fleet.rs`.

#![allow(dead_code)]

use k3os_ops::agent;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent::testing::crd::UpdateChannel;
use agent::testing::{
    Agent, LibupgradeNode, Next, NodeError, NodeOps, StageEnd, StageProgress, ANN_CORDONED,
    ANN_PHASE,
};
use bootconfig::Slot;
use k3os_ops_testing::fake_api::{self, Log, Pdb, World, NS};
use k3os_ops_testing::sim_node::{PowerRequest, SimNode};
use libupgrade::StageRequest;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub const NODES: usize = 3;
/// The agents' resync period (they also wake on every change of a Node or a channel).
pub const RESYNC: Duration = Duration::from_millis(200);
/// The whole rollout must end within this.
pub const DEADLINE: Duration = Duration::from_secs(25);

pub fn node_name(i: usize) -> String {
    format!("node-{}", i + 1)
}

// --- the node side ------------------------------------------------------------------------

/// One node's disk and boot environment (testkit's simulated node), booted on v1 from slot A.
pub type NodeRig = testkit::sim::SimNode;

/// No progress display (the test stages the v0.1.0 starting point directly).
pub struct NoProgress;

impl StageProgress for NoProgress {
    fn begin(&self, _: &str, _: u64, _: u64) {}
    fn advance(&self, _: u64) {}
    fn end(&self) {}
}

/// A JSON fixture written by the v0.1.0 agent (see tests/fixtures/v0.1.0/README.md).
pub fn v010_fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/v0.1.0/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The world as the v0.1.0 agents left it mid-rollout: their channel status, Node annotations
/// and cordon, and Leases, exactly as written; only the release URL points at this test's
/// channel. node-1 is down (rebooting).
pub fn v010_world(channel_url: &str) -> World {
    let mut channel = v010_fixture("updatechannel.json");
    channel["spec"]["url"] = json!(channel_url);
    channel["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let nodes: Vec<Value> = (0..NODES)
        .map(|i| {
            let mut n = v010_fixture(&format!("{}.json", node_name(i)));
            n["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("resourceVersion");
            n
        })
        .collect();
    let mut w = World::new(nodes, channel);
    for i in 0..=NODES {
        // node-0 (the earlier failure) is gone from the cluster; its Lease is left over.
        let name = format!("k3os-upgrade-node-node-{i}");
        w.leases
            .insert(name.clone(), v010_fixture(&format!("lease-{name}.json")));
    }
    w.set_node_ready(&node_name(0), false);
    w
}

// --- the invariants -----------------------------------------------------------------------

/// What the observer saw, over every state of the world.
#[derive(Default)]
pub struct Monitor {
    pub concurrency: usize,
    pub samples: u64,
    pub violations: Vec<String>,
    pub peak_holders: usize,
    /// Per node, the slot tokens it held, in order (a node that held one slot throughout its
    /// update has one).
    pub claims: BTreeMap<String, Vec<String>>,
    pub ever_cordoned: BTreeSet<String>,
    pub least_available: Option<usize>,
    /// Nodes given up for dead after their bootloader flip: once their slot is reclaimed they
    /// stay down and cordoned by design (slots.rs), so invariants 2 and 3 skip them then.
    pub abandoned: BTreeSet<String>,
    /// When each node was first seen without the slot it held.
    pub released_at: BTreeMap<String, Instant>,
    /// When each node was first seen holding a slot.
    pub claimed_at: BTreeMap<String, Instant>,
    /// When each node was first seen with phase `UpToDate` after holding a slot.
    pub updated_at: BTreeMap<String, Instant>,
}

/// Slot holders of the channel: (node, phase, token).
pub fn holders(w: &World) -> Vec<(String, String, String)> {
    let field = |s: &Value, k: &str| s[k].as_str().unwrap_or("?").to_string();
    w.channel["status"]["slots"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| (field(s, "node"), field(s, "phase"), field(s, "token")))
                .collect()
        })
        .unwrap_or_default()
}

pub fn annotation<'a>(node: &'a Value, key: &str) -> Option<&'a str> {
    node["metadata"]["annotations"][key].as_str()
}

/// One line per node and the slots, for failure messages.
pub fn summary(w: &World) -> String {
    let slots: Vec<String> = holders(w)
        .into_iter()
        .map(|(n, p, _)| format!("{n}:{p}"))
        .collect();
    let mut out = format!("slots {slots:?}");
    for (name, n) in &w.nodes {
        out.push_str(&format!(
            "; {name}: ready={} unschedulable={} cordoned-mark={:?} phase={:?} pods={:?}",
            fake_api::node_ready(n),
            n["spec"]["unschedulable"],
            annotation(n, ANN_CORDONED),
            annotation(n, ANN_PHASE),
            w.workload_on(name)
        ));
    }
    out
}

impl Monitor {
    pub fn violation(&mut self, w: &World, what: String) {
        if self.violations.len() < 10 {
            self.violations
                .push(format!("sample {}: {what}\n  {}", self.samples, summary(w)));
        }
    }

    pub fn sample(&mut self, w: &World) {
        self.samples += 1;
        let held = holders(w);
        self.peak_holders = self.peak_holders.max(held.len());
        if held.len() > self.concurrency {
            self.violation(
                w,
                format!(
                    "{} slot holders, concurrency {}",
                    held.len(),
                    self.concurrency
                ),
            );
        }
        let distinct: BTreeSet<&str> = held.iter().map(|(n, _, _)| n.as_str()).collect();
        if distinct.len() != held.len() {
            self.violation(w, "a node holds two slots".into());
        }
        for (node, _, token) in &held {
            self.claimed_at
                .entry(node.clone())
                .or_insert_with(Instant::now);
            let tokens = self.claims.entry(node.clone()).or_default();
            if tokens.last() != Some(token) {
                tokens.push(token.clone());
            }
        }
        for node in self.claims.keys() {
            if !held.iter().any(|(n, _, _)| n == node) && !self.released_at.contains_key(node) {
                self.released_at.insert(node.clone(), Instant::now());
            }
        }
        for (name, node) in &w.nodes {
            if self.claimed_at.contains_key(name) && annotation(node, ANN_PHASE) == Some("UpToDate")
            {
                self.updated_at
                    .entry(name.clone())
                    .or_insert_with(Instant::now);
            }
            let phase = held
                .iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, p, _)| p.as_str());
            let cordoned = node["spec"]["unschedulable"] == true;
            let marked = annotation(node, ANN_CORDONED) == Some("true");
            if cordoned {
                self.ever_cordoned.insert(name.clone());
            }
            if phase.is_none() && self.abandoned.contains(name) {
                continue;
            }
            if cordoned && !marked {
                self.violation(w, format!("{name} is cordoned without update-cordoned"));
            }
            if marked && !matches!(phase, Some("Draining" | "Rebooting" | "RollingBack")) {
                self.violation(
                    w,
                    format!("{name} is marked cordoned by the agent with slot phase {phase:?}"),
                );
            }
            if !fake_api::node_ready(node) && !matches!(phase, Some("Rebooting" | "RollingBack")) {
                self.violation(w, format!("{name} is down with slot phase {phase:?}"));
            }
        }
        let cordoned_up = w
            .nodes
            .values()
            .filter(|n| n["spec"]["unschedulable"] == true && fake_api::node_ready(n))
            .count();
        if cordoned_up > self.concurrency {
            self.violation(
                w,
                format!(
                    "{cordoned_up} Ready nodes cordoned at once, concurrency {}",
                    self.concurrency
                ),
            );
        }
        for pdb in &w.pdbs {
            let available = w.available(pdb);
            self.least_available =
                Some(self.least_available.map_or(available, |l| l.min(available)));
            if available < pdb.min_available {
                self.violation(
                    w,
                    format!(
                        "PodDisruptionBudget {} violated: {available} available, minAvailable {}",
                        pdb.name, pdb.min_available
                    ),
                );
            }
        }
    }
}

/// What the Prometheus stand-in answers to `/api/v1/alerts`: these (name, state) alerts.
pub fn set_alerts(dir: &std::path::Path, alerts: &[(&str, &str)]) {
    let alerts: Vec<Value> = alerts
        .iter()
        .map(|(n, s)| json!({"labels": {"alertname": n}, "state": s}))
        .collect();
    let body = json!({"status": "success", "data": {"alerts": alerts}});
    let path = dir.join("api/v1/alerts");
    let tmp = dir.join("api/v1/.alerts.tmp");
    std::fs::write(&tmp, body.to_string()).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

// --- the fleet and its driver -------------------------------------------------------------

pub struct Scenario {
    /// Ignored with `from_v010` (the fixture's channel says 1).
    pub concurrency: u32,
    /// Start mid-rollout from what the v0.1.0 agent wrote (tests/fixtures/v0.1.0): node-1
    /// holds the slot and is rebooting into v2 (activated by v0.1.0, which awaited no check),
    /// node-2 and node-3 have staged v2 and wait; the DaemonSet has just been rolled to this
    /// agent, so every node runs the current one from now on.
    pub from_v010: bool,
    /// Every node also runs a single-replica `db` pod whose budget never allows its eviction
    /// (drains stall), and the agent of the first node seen `Draining` is ended for good
    /// (its Node stays Ready: only the agent is gone). rebootTimeout 3s.
    pub dies_while_draining: bool,
    /// With `from_v010`: node-1, rebooting under the v0.1.0 agent, never comes back (its
    /// Lease stays as v0.1.0 last wrote it). rebootTimeout 3s, maxFailures 3.
    pub v010_holder_never_returns: bool,
    /// The agents' wait for Node Ready after a trial boot.
    pub ready_wait: Duration,
    /// The Node of the first node that boots v2 never becomes Ready.
    pub first_trial_never_ready: bool,
    /// `spec.rollout` of the channel; with it the agents also run the fleet counter (every
    /// 50 ms). With it or `gates` the first status writes are not held (not every node claims
    /// at first).
    pub rollout: Option<Value>,
    /// Pre-reboot gates: `blockingPodSelector: k3os.io/block-reboot=true` with such a pod
    /// (`apps/backup`) on node-1, and `spec.prometheus` pointing at [`Fleet::alerts`], which
    /// starts answering with a firing `DiskFull` alert (and `Watchdog`, which the filter
    /// ignores).
    pub gates: bool,
}

impl Scenario {
    /// A rollout from v1 to v2 at `concurrency` where nothing goes wrong; the scenarios
    /// change what they test from there (`Scenario { from_v010: true, ..Scenario::at(1) }`).
    pub fn at(concurrency: u32) -> Scenario {
        Scenario {
            concurrency,
            from_v010: false,
            dies_while_draining: false,
            v010_holder_never_returns: false,
            ready_wait: Duration::from_secs(20),
            first_trial_never_ready: false,
            rollout: None,
            gates: false,
        }
    }
}

pub struct Fleet {
    pub scenario: Scenario,
    pub world: Arc<Mutex<World>>,
    pub log: Log,
    /// Node-Ready reports of the agents and the core's verdicts.
    pub reports: Log,
    pub monitor: Arc<Mutex<Monitor>>,
    pub _publisher: testkit::Keys,
    pub _channel_dir: tempfile::TempDir,
    /// With `gates`: the Prometheus stand-in (a file server: `<dir>/api/v1/alerts`).
    pub alerts: Option<(testkit::TestServer, tempfile::TempDir)>,
    pub rigs: Vec<NodeRig>,
    /// The tasks of each node's running agent (`None` while it is down).
    pub agents: Vec<Option<Vec<JoinHandle<()>>>>,
    pub cluster: JoinHandle<()>,
    pub power: mpsc::UnboundedSender<PowerRequest>,
    pub requests: mpsc::UnboundedReceiver<PowerRequest>,
    pub reboots: Vec<u32>,
    /// Nodes booted into a good trial whose kubelet reports Ready once their agent waits.
    pub awaiting_ready: Vec<bool>,
    /// The node whose v2 never became Ready.
    pub bad: Option<usize>,
    /// Every agent has staged and tried to claim (the first power cycle waits for it).
    pub contended: bool,
    /// With `dies_while_draining`: the node whose agent was ended for good.
    pub victim: Option<usize>,
    /// The node whose trial was activated by the v0.1.0 agent (blessed by init's confirm at
    /// boot: that activation awaited no check).
    pub v010_trial: Option<usize>,
}

/// The Nodes and the channel the scenario starts from (and, with `gates`, the Prometheus
/// stand-in the channel points at).
fn initial_world(
    scenario: &Scenario,
    channel_url: &str,
) -> (World, Option<(testkit::TestServer, tempfile::TempDir)>) {
    if scenario.from_v010 {
        let mut w = v010_world(channel_url);
        if scenario.v010_holder_never_returns {
            w.channel["spec"]["rebootTimeout"] = json!("3s");
            w.channel["spec"]["maxFailures"] = json!(3);
        }
        return (w, None);
    }
    let nodes = (0..NODES).map(|i| {
        fake_api::ready_node(
            &node_name(i),
            json!({"kubernetes.io/hostname": node_name(i)}),
        )
    });
    let mut channel = fake_api::channel_object(
        &UpdateChannel::test()
            .url(channel_url)
            .concurrency(scenario.concurrency)
            .reboot_timeout(if scenario.dies_while_draining {
                "3s"
            } else {
                "2m"
            })
            .spec_with(|s| s.drain.timeout = "20s".into())
            .build(),
    );
    if let Some(r) = &scenario.rollout {
        channel["spec"]["rollout"] = r.clone();
    }
    let alerts = scenario.gates.then(|| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("api/v1")).unwrap();
        let server = testkit::TestServer::start(dir.path().to_path_buf(), 0);
        channel["spec"]["blockingPodSelector"] = json!("k3os.io/block-reboot=true");
        channel["spec"]["prometheus"] =
            json!({"url": server.base.clone(), "alertFilter": "^Watchdog$"});
        set_alerts(
            dir.path(),
            &[("DiskFull", "firing"), ("Watchdog", "firing")],
        );
        (server, dir)
    });
    let mut w = World::new(nodes, channel);
    // With waves or gates not every node claims at first: nothing to race.
    if scenario.rollout.is_none() && !scenario.gates {
        w.hold_first_status_writes(NODES);
    }
    (w, alerts)
}

/// The workloads: a web app of one pod per node under a budget of `minAvailable: 2`, the agent
/// pods, and what the scenario adds (the blocking pod, the undrainable `db` pods).
fn add_workloads(world: &mut World, scenario: &Scenario) {
    for i in 0..NODES {
        let node = node_name(i);
        // From v0.1.0, node-1 was drained before its reboot: its web pod was rescheduled
        // onto the node with the fewest pods then (node-2).
        let web_on = if scenario.from_v010 && i == 0 {
            node_name(1)
        } else {
            node.clone()
        };
        world.pods.push(fake_api::running_pod(
            "apps",
            &format!("web-{}", i + 1),
            json!({"app": "web"}),
            "ReplicaSet",
            "web",
            &web_on,
        ));
        world.pods.push(fake_api::running_pod(
            NS,
            &format!("k3os-ops-agent-{node}"),
            json!({"app": "k3os-ops-agent"}),
            "DaemonSet",
            "k3os-ops-agent",
            &node,
        ));
    }
    if scenario.gates {
        world.pods.push(fake_api::running_pod(
            "apps",
            "backup",
            json!({"k3os.io/block-reboot": "true"}),
            "Job",
            "backup",
            &node_name(0),
        ));
    }
    if scenario.dies_while_draining {
        for i in 0..NODES {
            let name = format!("db-{}", i + 1);
            world.pods.push(fake_api::running_pod(
                "apps",
                &name,
                json!({"app": &name}),
                "StatefulSet",
                &name,
                &node_name(i),
            ));
            world.pdbs.push(Pdb {
                name: name.clone(),
                namespace: "apps".into(),
                selector: [("app".to_string(), name)].into(),
                min_available: 1,
            });
        }
    }
    world.pdbs.push(Pdb {
        name: "web".into(),
        namespace: "apps".into(),
        selector: [("app".to_string(), "web".to_string())].into(),
        min_available: 2,
    });
}

/// What run.rs's loop does with one agent, waking on changes instead of watches.
pub async fn agent_loop(agent: Arc<Agent>, mut wake: watch::Receiver<u64>) {
    let mut errors = 0u32;
    loop {
        match agent.reconcile().await {
            Ok(Next::Again) => {
                errors = 0;
                continue;
            }
            Ok(Next::Wait) => errors = 0,
            Err(e) => {
                errors += 1;
                agent.report_error(&e).await;
            }
        }
        let _ = tokio::time::timeout(RESYNC * errors.clamp(1, 10), wake.changed()).await;
    }
}

impl Fleet {
    pub fn new(scenario: Scenario) -> Fleet {
        let publisher = testkit::keys();
        let channel_dir = tempfile::tempdir().unwrap();
        testkit::make_release(
            &publisher,
            channel_dir.path(),
            "v2",
            2,
            4096,
            libupgrade::manifest::Arch::host(),
        );
        libupgrade::channel::write_index(channel_dir.path()).unwrap();
        let channel_url = channel_dir.path().display().to_string();
        let rigs: Vec<NodeRig> = (0..NODES)
            .map(|_| NodeRig::new(&publisher.trust, 3, 1))
            .collect();
        let (mut world, alerts) = initial_world(&scenario, &channel_url);
        add_workloads(&mut world, &scenario);
        let monitor = Arc::new(Mutex::new(Monitor {
            abandoned: if scenario.v010_holder_never_returns {
                BTreeSet::from([node_name(0)])
            } else {
                BTreeSet::new()
            },
            concurrency: if scenario.from_v010 {
                1
            } else {
                scenario.concurrency as usize
            },
            ..Monitor::default()
        }));
        let m = monitor.clone();
        world.observer = Some(Box::new(move |w: &World| m.lock().unwrap().sample(w)));
        world.observe();
        let world = Arc::new(Mutex::new(world));
        let cluster = tokio::spawn(fake_api::run_cluster(
            world.clone(),
            Duration::from_millis(5),
        ));
        let (power, requests) = mpsc::unbounded_channel();
        let mut fleet = Fleet {
            scenario,
            world,
            log: Log::default(),
            reports: Log::default(),
            monitor,
            _publisher: publisher,
            _channel_dir: channel_dir,
            alerts,
            rigs,
            agents: (0..NODES).map(|_| None).collect(),
            cluster,
            power,
            requests,
            reboots: vec![0; NODES],
            awaiting_ready: vec![false; NODES],
            bad: None,
            contended: false,
            victim: None,
            v010_trial: None,
        };
        if fleet.scenario.from_v010 {
            fleet.start_from_v010(&channel_url);
        } else {
            for i in 0..NODES {
                fleet.start_agent(i, None);
            }
        }
        fleet
    }

    /// What the v0.1.0 agents did on the nodes: v2 staged everywhere, activated on node-1
    /// (plain `activate`: v0.1.0 awaited no check), whose reboot is under way; then the
    /// current agents of node-2 and node-3 start (node-1's once it is back).
    fn start_from_v010(&mut self, channel_url: &str) {
        for i in 0..NODES {
            let node = LibupgradeNode::new(self.rigs[i].updater(), vec!["false".into()]);
            stage_as_agent(
                &node,
                &agent_request(channel_url, "v2", false, None),
                None,
                &NoProgress,
            )
            .unwrap();
        }
        self.rigs[0].updater().activate().unwrap();
        self.v010_trial = Some(0);
        self.contended = true;
        for i in 1..NODES {
            self.start_agent(i, None);
        }
        if !self.scenario.v010_holder_never_returns {
            let (done, _ended) = std::sync::mpsc::channel();
            self.power.send((0, done)).unwrap();
        }
    }

    /// Start node `i`'s agent as the DaemonSet would after a boot: its reconcile loop, its
    /// Lease renewal and its reclaim loop, with a kube client of its own.
    pub fn start_agent(&mut self, i: usize, silence: Option<Duration>) {
        let name = node_name(i);
        let client = fake_api::client(&self.world, &self.log);
        let real = LibupgradeNode::new(self.rigs[i].updater(), vec!["false".into()]);
        let ops = Arc::new(
            SimNode::powered_over(i, real, self.power.clone())
                .reporting_confirms(&name, self.reports.clone()),
        );
        let mut agent = Agent::new(
            client.clone(),
            NS,
            &name,
            Some(format!("{NS}/k3os-ops-agent-{name}")),
            ops,
        );
        agent.settings.drain_retry = Duration::from_millis(20);
        agent.settings.node_ready_wait = self.scenario.ready_wait;
        agent.settings.node_ready_poll = Duration::from_millis(20);
        agent.set_startup_silence(silence);
        let agent = Arc::new(agent);
        let wake = self.world.lock().unwrap().subscribe();
        let mut tasks = vec![
            tokio::spawn(agent_loop(agent.clone(), wake)),
            tokio::spawn(agent::testing::renew_node_lease(agent.clone())),
            tokio::spawn(agent::testing::reclaim_loop(agent.clone())),
        ];
        if self.scenario.rollout.is_some() {
            tasks.push(tokio::spawn(agent::testing::count_loop(
                agent,
                Duration::from_millis(50),
            )));
        }
        self.agents[i] = Some(tasks);
    }

    pub async fn stop_agent(&mut self, i: usize) {
        for t in self.agents[i].take().unwrap_or_default() {
            t.abort();
            let _ = t.await;
        }
    }

    /// The channel's `spec.rebootTimeout` in seconds (`3s`, `2m` in these scenarios).
    fn reboot_timeout_secs(&self) -> u64 {
        let w = self.world.lock().unwrap();
        let t = w.channel["spec"]["rebootTimeout"].as_str().unwrap_or("15m");
        let (n, unit) = t.split_at(t.len() - 1);
        let n: u64 = n.parse().unwrap_or_else(|_| panic!("rebootTimeout {t:?}"));
        match unit {
            "s" => n,
            "m" => n * 60,
            "h" => n * 3600,
            _ => panic!("rebootTimeout {t:?}: a number and s, m or h"),
        }
    }

    pub fn phase(&self, i: usize) -> Option<String> {
        annotation(self.world.lock().unwrap().node(&node_name(i)), ANN_PHASE).map(String::from)
    }

    pub fn violation(&self, what: String) {
        let w = self.world.lock().unwrap();
        self.monitor.lock().unwrap().violation(&w, what);
    }

    /// The node asked to reboot: end its agent, power-cycle it, run init's confirm and start
    /// a fresh agent.
    pub async fn power_cycle(&mut self, req: PowerRequest) {
        let (i, done) = req;
        let name = node_name(i);
        let off = Instant::now();
        // The agent dies with the node; then its blocked reboot() may return into nothing.
        self.stop_agent(i).await;
        drop(done);
        let left = self.world.lock().unwrap().workload_on(&name);
        if !left.is_empty() {
            self.violation(format!("{name} rebooted with {left:?} still running on it"));
        }
        self.world.lock().unwrap().set_node_ready(&name, false);
        self.reboots[i] += 1;
        let slot = self.rigs[i].power_cycle();
        let v010 = self.v010_trial == Some(i);
        let limit = self.reboot_timeout_secs();
        let trial = match (slot, self.rigs[i].init_confirm()) {
            // A trial activated by v0.1.0 awaited no check: init's confirm blesses it.
            (Slot::B, Ok(r)) if v010 && r.verdict.outcome == libupgrade::state::Outcome::Blessed => {
                self.v010_trial = None;
                false
            }
            // Nodes start on A: B is the new version, booted on trial, and the node rolls
            // back by itself when Node-Ready is not reported within the channel's
            // rebootTimeout (the limit the agent's activation set).
            (Slot::B, Ok(r))
                if matches!(r.outcome(), libupgrade::state::Outcome::Pending { waiting_for, within_secs }
                    if waiting_for.join(", ") == agent::testing::NODE_READY && *within_secs == limit) =>
            {
                true
            }
            (Slot::A, Ok(r)) if r.is_good() => false,
            (slot, other) => panic!(
                "{name} booted {slot}: init's confirm must wait for node-ready on the trial (within the channel's rebootTimeout, {limit} s) and pass on A: {other:?}"
            ),
        };
        // The agent is a pod: the kubelet runs before it. Back on a good slot the Node is Ready
        // at once; on a trial the kubelet reports Ready once the agent waits for it (or never).
        if !trial {
            self.world.lock().unwrap().set_node_ready(&name, true);
        } else if self.scenario.first_trial_never_ready && self.bad.is_none() {
            self.bad = Some(i);
        } else {
            self.awaiting_ready[i] = true;
        }
        self.start_agent(i, Some(off.elapsed()));
    }

    /// Drive the fleet until `done` holds for the world (checked after every change).
    pub async fn run_until(&mut self, what: &str, done: impl Fn(&Fleet) -> bool) {
        // Reclaiming a dead holder takes two looks of the reclaim loop (10 s apart at least).
        let limit = if self.scenario.dies_while_draining || self.scenario.v010_holder_never_returns
        {
            DEADLINE * 3
        } else {
            DEADLINE
        };
        let deadline = tokio::time::Instant::now() + limit;
        let mut wake = self.world.lock().unwrap().subscribe();
        loop {
            let first = self.monitor.lock().unwrap().violations.first().cloned();
            if let Some(v) = first {
                panic!("{v}\nlog tail:\n{}", self.log_tail());
            }
            for i in 0..NODES {
                if self.awaiting_ready[i] && self.phase(i).as_deref() == Some("Confirming") {
                    self.awaiting_ready[i] = false;
                    self.world
                        .lock()
                        .unwrap()
                        .set_node_ready(&node_name(i), true);
                }
            }
            if self.scenario.dies_while_draining && self.victim.is_none() {
                if let Some(i) = (0..NODES).find(|i| self.phase(*i).as_deref() == Some("Draining"))
                {
                    self.stop_agent(i).await;
                    self.victim = Some(i);
                }
            }
            if !self.contended {
                self.contended = (0..NODES).all(|i| {
                    !matches!(self.phase(i).as_deref(), None | Some("Staging" | "Staged"))
                });
            }
            if done(self) {
                return;
            }
            let contended = self.contended;
            let request = tokio::select! {
                Some(req) = self.requests.recv(), if contended => Some(req),
                _ = wake.changed() => None,
                // Events and other log lines change no object: look again now and then.
                _ = tokio::time::sleep(Duration::from_millis(50)) => None,
                _ = tokio::time::sleep_until(deadline) => {
                    let state = summary(&self.world.lock().unwrap());
                    panic!(
                        "{what}: not reached within {limit:?}\n{state}\nlog tail:\n{}",
                        self.log_tail()
                    )
                }
            };
            if let Some(req) = request {
                self.power_cycle(req).await;
            }
        }
    }

    pub fn log_tail(&self) -> String {
        let l = self.log.lock().unwrap();
        l[l.len().saturating_sub(60)..].join("\n")
    }

    /// Stop every agent and the simulated cluster; the invariants held throughout.
    pub async fn stop(&mut self) {
        for i in 0..NODES {
            self.stop_agent(i).await;
        }
        self.cluster.abort();
        let m = self.monitor.lock().unwrap();
        assert!(m.violations.is_empty(), "{}", m.violations.join("\n"));
        let l = self.log.lock().unwrap();
        let bad: Vec<&String> = l
            .iter()
            .filter(|x| x.starts_with("UNEXPECTED") || x.contains("ReconcileError"))
            .collect();
        assert!(bad.is_empty(), "{bad:#?}");
    }

    /// The real Updater's status of node `i` (both slots, this boot's verdict).
    pub fn slots(&self, i: usize) -> libupgrade::Status {
        self.rigs[i].updater().status().unwrap()
    }

    pub fn channel(&self) -> Value {
        self.world.lock().unwrap().channel.clone()
    }
}

pub fn condition(channel: &Value, kind: &str) -> Option<String> {
    channel["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?["status"]
        .as_str()
        .map(String::from)
}

pub fn slot_of(st: &libupgrade::Status, slot: Slot) -> &libupgrade::SlotStatus {
    st.slots.iter().find(|s| s.slot == slot).unwrap()
}

/// The request the agent's stage tick makes for `version` of `channel` (shared with `node`).
pub(crate) fn agent_request(
    channel: &str,
    version: &str,
    allow_downgrade: bool,
    max_rate: Option<u64>,
) -> libupgrade::StageRequest {
    libupgrade::StageRequest::new(libupgrade::Wanted::channel(channel, Some(version))).with_options(
        libupgrade::StageOptions {
            allow_downgrade,
            max_rate,
            ..libupgrade::StageOptions::default()
        },
    )
}

/// Stage `req` on `node` as the agent's stage tick does: resolve once (the node's offline
/// bundle first), then stage that release (shared with `node`).
pub(crate) fn stage_as_agent(
    node: &dyn NodeOps,
    req: &StageRequest,
    book_on: Option<chrono::NaiveDate>,
    progress: &dyn StageProgress,
) -> Result<StageEnd, NodeError> {
    let rel = agent::testing::for_stage(node, req, None)?;
    node.stage(&rel, &req.options, book_on, progress)
}
