//! `just bench-fleet`: the agent at fleet scale, simulated in one process.
//!
//! N agents, one per simulated node, run exactly the agent's code ([`run_agent`]: the
//! watches of the channels and of the own Node, the reconcile loop on its watch caches, node
//! Lease renewal, reclaim loop, `latest` poller, fleet counter) against the shared fake API
//! server of the agent tests (`k3os_ops_testing::fake_api`: resourceVersion compare-and-swap, Leases,
//! Events, watches streamed and resumed from a resourceVersion), each over its own kube client
//! that counts its writes like the agent's real one. The node side is a simulation
//! ([`SimNode`], shared with the idle-agent test): staging is instant, a reboot takes [`REBOOT`] (the Node NotReady meanwhile,
//! the agent gone with it: its tasks are aborted and a fresh agent starts after the boot), the
//! trial boot is healthy and the Node Ready at once.
//!
//! Time is tokio's paused clock: every sleep and timeout advances virtual time when nothing
//! else can run, so hours of a 1000-node fleet take seconds to minutes; the figures are
//! virtual time, requests are counted by the fake server (a watch (re)start is one request:
//! `WATCH`; lists are `LIST`).
//!
//! Also a fleet of one-node sites under a channel's waves (issue 24 item 8, `sites.rs`), run
//! first; `FLEET_ONLY=sites` runs only that row.
//!
//! Measured, against the goals of issue 18 item 7:
//! - idle: API requests per node per minute by verb and resource (goal ≤ 1), `FLEET_NODES`
//!   nodes (default 1000);
//! - rollouts from v1 to v2 at concurrency 1, 10 and 100: the makespan against the ideal
//!   (nodes / concurrency × one node's update time, measured in the same run by a rollout of
//!   a single node; goal ≤ 1.1), the peak number of slot holders sampled after every request
//!   the fake answers (so on every status write), concurrency violations (goal 0), the CAS
//!   conflict rate (409s per status write), and requests per node per hour by verb and
//!   resource. `FLEET_ROLLOUT_NODES` (default 200) nodes at concurrency 10 and 100,
//!   `FLEET_SERIAL_NODES` (default 50) at concurrency 1. 1000 nodes are out of reach for a
//!   default run: every status write wakes every agent (its channel watch), so the real time
//!   of a rollout grows with nodes × status writes, i.e. with the square of the fleet (200
//!   nodes: about 1 and 2 minutes; 1000 nodes: over 25 times that). Set the variables to
//!   1000 for a long run.
//!
//! Why the first version of the rollouts never finished a 10-node rollout: a simulated reboot
//! blocks in `reboot()` (a `spawn_blocking` thread of the agent) until the driver ends that
//! agent, and tokio does not auto-advance its paused clock while a `spawn_blocking` task runs;
//! that driver waited for virtual time (the reboot's duration) before letting `reboot()`
//! return, so the clock never moved again. Here the driver ends the agent and lets `reboot()`
//! return at once, then waits out the reboot.
// A scenario test or benchmark reads top to bottom as one story: the 80-line function rule
// (clippy.toml) is for the code it exercises.
#![allow(clippy::too_many_lines)]

mod sites;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k3os_ops::agent;
use k3os_ops_testing::fake_api::{self, Log, World, NS};
use k3os_ops_testing::sim_node::{PowerRequest, SimNode};

use agent::testing::{run_agent, Agent, NodeOps, Periods, Polls, WriteCounter};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The agent's default periods (`--resync-secs`, `--poll-secs`, `--count-secs`).
const PERIODS: Periods = Periods {
    resync: Duration::from_secs(30),
    poll: Polls {
        every: Duration::from_secs(900),
        waiting: Duration::from_secs(3600),
    },
    count: Duration::from_secs(30),
};
/// The idle window measured, after [`WARM_UP`].
const IDLE: Duration = Duration::from_secs(3600);
const WARM_UP: Duration = Duration::from_secs(900);
/// How long a simulated node is down for its reboot.
const REBOOT: Duration = Duration::from_secs(60);
/// The channel's `rebootTimeout` (the default).
const REBOOT_TIMEOUT: &str = "15m";
/// How often the driver looks whether the rollout is done.
const LOOK: Duration = Duration::from_secs(1);

fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

/// What the observer sees of the slots, after every answered request.
#[derive(Default)]
struct Monitor {
    concurrency: usize,
    peak: usize,
    violations: u64,
    samples: u64,
}

impl Monitor {
    fn sample(&mut self, w: &World) {
        let held = w.channel["status"]["slots"].as_array().map_or(0, Vec::len);
        self.samples += 1;
        self.peak = self.peak.max(held);
        if held > self.concurrency {
            self.violations += 1;
        }
    }
}

/// The simulated fleet: the world, the agents and the nodes.
struct Fleet {
    world: Arc<Mutex<World>>,
    log: Log,
    sims: Vec<Arc<SimNode>>,
    agents: Vec<Option<JoinHandle<()>>>,
    power: mpsc::UnboundedReceiver<PowerRequest>,
    monitor: Arc<Mutex<Monitor>>,
}

impl Fleet {
    fn new(nodes: usize, concurrency: u32) -> Fleet {
        let node_objs = (0..nodes).map(|i| {
            let mut n = fake_api::ready_node(&node_name(i), json!({"role": "worker"}));
            n["metadata"]["annotations"] = json!({"k3os.io/update-version": "v1"});
            n
        });
        let channel = fake_api::channel_object(
            &agent::testing::crd::UpdateChannel::test()
                .url("https://releases.example/")
                .version(Some("v1"))
                .concurrency(concurrency)
                .reboot_timeout(REBOOT_TIMEOUT)
                .build(),
        );
        let mut world = World::new(node_objs, channel);
        let monitor = Arc::new(Mutex::new(Monitor {
            concurrency: concurrency as usize,
            ..Monitor::default()
        }));
        let m = monitor.clone();
        world.observer = Some(Box::new(move |w: &World| m.lock().unwrap().sample(w)));
        let (tx, power) = mpsc::unbounded_channel();
        let sims = (0..nodes)
            .map(|i| Arc::new(SimNode::powered(i, "v1", tx.clone())))
            .collect();
        let world = Arc::new(Mutex::new(world));
        if std::env::var("FLEET_DEBUG").is_ok() {
            let w = world.clone();
            std::thread::spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_secs(5));
                let w = w.lock().unwrap();
                eprintln!("{:?} slots={}", w.requests, w.channel["status"]["slots"]);
                for (n, v) in w.nodes.iter().take(3) {
                    eprintln!("  {n} {}", v["metadata"]["annotations"]);
                }
            });
        }
        let mut fleet = Fleet {
            world,
            log: Log::default(),
            sims,
            agents: (0..nodes).map(|_| None).collect(),
            power,
            monitor,
        };
        for i in 0..nodes {
            fleet.start_agent(i, None);
        }
        fleet
    }

    /// Start node `i`'s agent as the DaemonSet does (run.rs's [`run_agent`]).
    fn start_agent(&mut self, i: usize, silence: Option<Duration>) {
        let name = node_name(i);
        let writes = WriteCounter::new(&name);
        let client = fake_api::counted_client(&self.world, &self.log, &writes);
        let ops: Arc<dyn NodeOps> = self.sims[i].clone();
        let agent = Agent::new(client, NS, &name, None, ops).with_watches(writes);
        agent.set_startup_silence(silence);
        let agent = Arc::new(agent);
        self.agents[i] = Some(tokio::spawn(async move {
            let _ = run_agent(agent, PERIODS).await;
        }));
    }

    async fn stop_agent(&mut self, i: usize) {
        if let Some(t) = self.agents[i].take() {
            t.abort();
            let _ = t.await;
        }
    }

    fn requests(&self) -> BTreeMap<String, u64> {
        self.world.lock().unwrap().requests.clone()
    }

    async fn stop(&mut self) {
        for i in 0..self.agents.len() {
            self.stop_agent(i).await;
        }
    }

    /// Every node runs `target`, blessed, and no slot is held.
    fn done(&self, target: &str) -> bool {
        let w = self.world.lock().unwrap();
        let no_slots = w.channel["status"]["slots"]
            .as_array()
            .is_none_or(Vec::is_empty);
        no_slots
            && w.nodes.values().all(|n| {
                let a = &n["metadata"]["annotations"];
                a["k3os.io/update-phase"] == "UpToDate" && a["k3os.io/update-version"] == target
            })
    }

    /// Set the channel's target to `target` and drive the reboots until every node runs it;
    /// the makespan.
    async fn roll_out(&mut self, target: &str, limit: Duration) -> Duration {
        let start = Instant::now();
        self.world
            .lock()
            .unwrap()
            .edit_channel_spec(|s| s["version"] = json!(target));
        let mut booting: Vec<(Instant, usize)> = Vec::new();
        let mut look = tokio::time::interval(LOOK);
        loop {
            tokio::select! {
                Some((i, done)) = self.power.recv() => {
                    // The node goes down with its agent; let its reboot() return at once.
                    self.stop_agent(i).await;
                    drop(done);
                    self.world.lock().unwrap().set_node_ready(&node_name(i), false);
                    booting.push((Instant::now() + REBOOT, i));
                }
                _ = look.tick() => {
                    let now = Instant::now();
                    let (up, down): (Vec<_>, Vec<_>) =
                        booting.drain(..).partition(|(at, _)| *at <= now);
                    booting = down;
                    for (_, i) in up {
                        self.sims[i].boot();
                        self.world.lock().unwrap().set_node_ready(&node_name(i), true);
                        self.start_agent(i, Some(REBOOT));
                    }
                    if booting.is_empty() && self.done(target) {
                        return now - start;
                    }
                    assert!(now - start < limit, "the rollout to {target} did not finish within {limit:?}");
                }
            }
        }
    }
}

/// Requests in `after` that were not in `before`, by verb and resource.
fn diff(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// Idle: every node already runs the target; what does the fleet cost the API server?
async fn idle(nodes: usize) {
    let started = std::time::Instant::now();
    let mut fleet = Fleet::new(nodes, 1);
    tokio::time::sleep(WARM_UP).await;
    let before = fleet.requests();
    tokio::time::sleep(IDLE).await;
    let spent = diff(&before, &fleet.requests());
    fleet.stop().await;
    let total: u64 = spent.values().sum();
    let minutes = IDLE.as_secs_f64() / 60.0;
    let per = total as f64 / nodes as f64 / minutes;
    println!(
        "idle, {nodes} nodes, {minutes} min virtual after {} min warm-up ({:.1} s real): {per:.3} requests per node per minute (goal <= 1: {:.2} of it)",
        WARM_UP.as_secs() / 60,
        started.elapsed().as_secs_f64(),
        per
    );
    for (k, v) in &spent {
        println!(
            "  {k:<36} {:>8.3} per node per minute",
            *v as f64 / nodes as f64 / minutes
        );
    }
}

/// One rollout of `nodes` at `concurrency` from v1 to v2: its figures.
struct Rolled {
    nodes: usize,
    concurrency: u32,
    makespan: Duration,
    peak: usize,
    violations: u64,
    status_writes: u64,
    conflicts: u32,
    requests: BTreeMap<String, u64>,
    real: Duration,
}

async fn rollout(nodes: usize, concurrency: u32) -> Rolled {
    let real = std::time::Instant::now();
    let mut fleet = Fleet::new(nodes, concurrency);
    // Settle first (watches, Leases, the first count) so only the rollout is measured.
    tokio::time::sleep(Duration::from_secs(120)).await;
    let before = fleet.requests();
    let conflicts_before = fleet.world.lock().unwrap().conflicts;
    let limit = REBOOT * 10 * (nodes as u32).div_ceil(concurrency) + Duration::from_secs(3600);
    let makespan = fleet.roll_out("v2", limit).await;
    let requests = diff(&before, &fleet.requests());
    let conflicts = fleet.world.lock().unwrap().conflicts - conflicts_before;
    fleet.stop().await;
    let m = fleet.monitor.lock().unwrap();
    let log = fleet.log.lock().unwrap();
    let unexpected: Vec<&String> = log.iter().filter(|l| l.starts_with("UNEXPECTED")).collect();
    assert!(unexpected.is_empty(), "{unexpected:#?}");
    Rolled {
        nodes,
        concurrency,
        makespan,
        peak: m.peak,
        violations: m.violations,
        status_writes: requests
            .get("PUT updatechannels/status")
            .copied()
            .unwrap_or(0),
        conflicts,
        requests,
        real: real.elapsed(),
    }
}

fn print_rollout(r: &Rolled, one_node: Duration) {
    let rounds = (r.nodes as u32).div_ceil(r.concurrency);
    let ideal = one_node * rounds;
    let ratio = r.makespan.as_secs_f64() / ideal.as_secs_f64();
    let hours = r.makespan.as_secs_f64() / 3600.0;
    let total: u64 = r.requests.values().sum();
    println!(
        "rollout, {} nodes, concurrency {}: makespan {:.0} s, ideal {:.0} s (ceil({} / {}) x {:.1} s): ratio {ratio:.3} (goal <= 1.1); peak slot holders {} (bound {}), concurrency violations {} (goal 0); CAS conflicts {} of {} status writes ({:.1} %); {:.0} requests per node per hour ({:.1} s real)",
        r.nodes,
        r.concurrency,
        r.makespan.as_secs_f64(),
        ideal.as_secs_f64(),
        r.nodes,
        r.concurrency,
        one_node.as_secs_f64(),
        r.peak,
        r.concurrency,
        r.violations,
        r.conflicts,
        r.status_writes,
        100.0 * f64::from(r.conflicts) / (r.status_writes.max(1) as f64),
        total as f64 / r.nodes as f64 / hours,
        r.real.as_secs_f64(),
    );
    for (k, v) in &r.requests {
        println!(
            "  {k:<36} {:>10.1} per node per hour",
            *v as f64 / r.nodes as f64 / hours
        );
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    let cost = sites::poll_cost();
    sites::simulate(env_usize("FLEET_SITES", 1000), &cost);
    if std::env::var("FLEET_ONLY").is_ok_and(|v| v == "sites") {
        return;
    }
    rt.block_on(async {
        idle(env_usize("FLEET_NODES", 1000)).await;
        let one = rollout(1, 1).await;
        println!(
            "one node's update (claim to blessed and released, reboot {} s): {:.1} s",
            REBOOT.as_secs(),
            one.makespan.as_secs_f64()
        );
        let serial = env_usize("FLEET_SERIAL_NODES", 50);
        let wide = env_usize("FLEET_ROLLOUT_NODES", 200);
        let mut failed = Vec::new();
        for (nodes, c) in [(serial, 1), (wide, 10), (wide, 100)] {
            let r = rollout(nodes, c).await;
            print_rollout(&r, one.makespan);
            if r.violations > 0 {
                failed.push(format!(
                    "{} concurrency violations at concurrency {c}",
                    r.violations
                ));
            }
        }
        assert!(failed.is_empty(), "{failed:?}");
    });
}
