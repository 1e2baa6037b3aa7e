//! `just bench-fleet`: the agent at fleet scale, simulated in one process.
//!
//! N agents, one per simulated node, run exactly the agent's code (reconcile loop, node Lease
//! renewal, reclaim loop, `latest` poller, fleet counter) against the shared fake API server of
//! the agent tests (`tests/fake_api`: resourceVersion compare-and-swap, Leases, Events), each
//! over its own kube client. Each agent wakes like the real one: on a change of any channel
//! (its watch of the channels), of its own Node (its watch with a name field selector), or
//! after `--resync-secs` (30 s). The node side is a simulation (`SimOps`): staging is instant,
//! a reboot takes [`REBOOT`] (the Node NotReady meanwhile, the agent gone with it) and the
//! trial boot is healthy.
//!
//! Time is tokio's paused clock: every sleep and timeout of the agents advances virtual time
//! when nothing else can run, so an hour of a 1000-node fleet takes seconds; the figures are
//! virtual time. Measured: idle, API requests per node per minute by verb and resource, against
//! the goal of ≤ 1 (`FLEET_NODES`, default 1000).
//!
//! Not yet: the rollouts at concurrency 1, 10 and 100 (makespan against nodes / concurrency ×
//! one node's update time, peak slot holders, CAS conflict rate). A first version of them over
//! this same rig did not finish a 10-node rollout within 15 minutes of real time and was taken
//! out; the simulated node (`SimOps`) and the power-cycle driver below are what it needs.

#[path = "../tests/fake_api/mod.rs"]
mod fake_api;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fake_api::{Log, World, NS};
use k3os_ops::agent;

use agent::controller::{Agent, Next};
use agent::decide::{Inactive, NodeUpdateStatus};
use agent::node::{ConfirmResult, NodeError, NodeOps, StageProgress};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// The agent's default `--resync-secs`.
const RESYNC: Duration = Duration::from_secs(30);
/// The agent's default `--count-secs`.
const COUNT: Duration = Duration::from_secs(30);
/// The agent's default `--poll-secs`.
const POLL: Duration = Duration::from_secs(900);
/// The idle window measured (after a warm-up of 5 minutes).
const IDLE: Duration = Duration::from_secs(3600);

/// One simulated node's slots.
struct Sim {
    booted: String,
    on_trial: bool,
    inactive: Inactive,
}

/// The node side: instant staging, a healthy trial, reboots handed to the driver.
struct SimOps {
    index: usize,
    sim: Mutex<Sim>,
    power: mpsc::UnboundedSender<(usize, std::sync::mpsc::Sender<()>)>,
}

impl NodeOps for SimOps {
    fn status(&self) -> Result<NodeUpdateStatus, NodeError> {
        let s = self.sim.lock().unwrap();
        Ok(NodeUpdateStatus {
            booted_version: Some(s.booted.clone()),
            booted_on_trial: s.on_trial,
            inactive: s.inactive.clone(),
            failed_trial: None,
        })
    }
    fn resolve_latest(&self, _: &str) -> Result<String, NodeError> {
        Err(NodeError::new("resolve", "the bench pins its versions"))
    }
    fn stage(
        &self,
        _: &str,
        version: &str,
        _: bool,
        _: Option<u64>,
        _: &dyn StageProgress,
    ) -> Result<(), NodeError> {
        self.sim.lock().unwrap().inactive = Inactive::Staged(version.into());
        Ok(())
    }
    fn activate(&self, _: Duration) -> Result<(), NodeError> {
        let mut s = self.sim.lock().unwrap();
        if let Inactive::Staged(v) = &s.inactive {
            s.inactive = Inactive::Activated(v.clone());
        }
        Ok(())
    }
    fn confirm(&self, _: libupgrade::health::CheckResult) -> Result<ConfirmResult, NodeError> {
        self.sim.lock().unwrap().on_trial = false;
        Ok(ConfirmResult::Healthy)
    }
    fn reboot(&self) -> Result<(), NodeError> {
        let (done, ended) = std::sync::mpsc::channel();
        self.power.send((self.index, done)).expect("driver runs");
        let _ = ended.recv();
        Err(NodeError::new(
            "reboot",
            "the simulated power cycle ended this agent",
        ))
    }
}

fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

/// The simulated fleet: the world, the agents' tasks and the nodes.
struct Fleet {
    world: Arc<Mutex<World>>,
    log: Log,
    sims: Vec<Arc<SimOps>>,
    agents: Vec<Option<Vec<JoinHandle<()>>>>,
}

/// run.rs's loop: again at once after progress, else wait for a watch event or the resync.
async fn agent_loop(
    agent: Arc<Agent>,
    mut channels: watch::Receiver<u64>,
    mut node: watch::Receiver<u64>,
) {
    loop {
        let pause = match agent.reconcile().await {
            Ok(Next::Again) => continue,
            Ok(Next::Wait) => RESYNC,
            Err(e) => {
                agent.report_error(&e).await;
                RESYNC
            }
        };
        tokio::select! {
            _ = channels.changed() => {}
            _ = node.changed() => {}
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

impl Fleet {
    fn new(
        nodes: usize,
        concurrency: u32,
    ) -> (
        Fleet,
        mpsc::UnboundedReceiver<(usize, std::sync::mpsc::Sender<()>)>,
    ) {
        let node_objs =
            (0..nodes).map(|i| fake_api::ready_node(&node_name(i), json!({"role": "worker"})));
        let channel = json!({
            "apiVersion": "k3os.io/v1", "kind": "UpdateChannel",
            "metadata": {"name": "stable", "namespace": NS, "uid": "ch-uid", "generation": 1},
            "spec": {"url": "https://releases.example/", "version": "v1",
                     "concurrency": concurrency, "maxFailures": 1, "rebootTimeout": "15m"},
            "status": {"slots": [], "failures": [], "conditions": []}
        });
        let world = World::new(node_objs, channel);
        let (power, requests) = mpsc::unbounded_channel();
        let sims = (0..nodes)
            .map(|i| {
                Arc::new(SimOps {
                    index: i,
                    sim: Mutex::new(Sim {
                        booted: "v1".into(),
                        on_trial: false,
                        inactive: Inactive::Empty,
                    }),
                    power: power.clone(),
                })
            })
            .collect();
        let fleet = Fleet {
            world: Arc::new(Mutex::new(world)),
            log: Log::default(),
            sims,
            agents: (0..nodes).map(|_| None).collect(),
        };
        (fleet, requests)
    }

    /// Start node `i`'s agent with everything run.rs starts beside the loop.
    fn start_agent(&mut self, i: usize) {
        let name = node_name(i);
        let client = fake_api::client(&self.world, &self.log);
        let ops: Arc<dyn NodeOps> = self.sims[i].clone();
        let mut agent = Agent::new(client.clone(), NS, &name, None, ops);
        agent.settings.node_ready_poll = Duration::from_secs(5);
        let agent = Arc::new(agent);
        let (channels, node) = {
            let mut w = self.world.lock().unwrap();
            (w.subscribe_channels(), w.subscribe_node(&name))
        };
        self.agents[i] = Some(vec![
            tokio::spawn(agent_loop(agent.clone(), channels, node)),
            tokio::spawn(agent::background::renew_node_lease(client, NS.into(), name)),
            tokio::spawn(agent::controller::reclaim_loop(agent.clone())),
            tokio::spawn(agent::controller::poll_loop(agent.clone(), POLL)),
            tokio::spawn(agent::counter::count_loop(agent, COUNT)),
        ]);
    }

    fn requests(&self) -> BTreeMap<String, u64> {
        self.world.lock().unwrap().requests.clone()
    }

    async fn stop(&mut self) {
        for tasks in self.agents.iter_mut() {
            for t in tasks.take().unwrap_or_default() {
                t.abort();
                let _ = t.await;
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
    let (mut fleet, _power) = Fleet::new(nodes, 1);
    let started = std::time::Instant::now();
    for i in 0..nodes {
        fleet.start_agent(i);
    }
    tokio::time::sleep(Duration::from_secs(300)).await;
    let before = fleet.requests();
    tokio::time::sleep(IDLE).await;
    let spent = diff(&before, &fleet.requests());
    fleet.stop().await;
    let total: u64 = spent.values().sum();
    let minutes = IDLE.as_secs_f64() / 60.0;
    let per = total as f64 / nodes as f64 / minutes;
    println!(
        "idle, {nodes} nodes, {} min virtual ({:.1} s real): {per:.2} requests per node per minute (goal <= 1: ratio {:.1}x)",
        minutes,
        started.elapsed().as_secs_f64(),
        per
    );
    for (k, v) in &spent {
        println!(
            "  {k:<40} {:>8.3} per node per minute",
            *v as f64 / nodes as f64 / minutes
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
    rt.block_on(async {
        let idle_nodes = env_usize("FLEET_NODES", 1000);
        idle(idle_nodes).await;
    });
}
