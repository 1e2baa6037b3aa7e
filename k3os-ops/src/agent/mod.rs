//! `k3os-ops agent`: the per-node Kubernetes controller for `UpdateChannel`s.
//!
//! One agent runs on every node (a DaemonSet). It watches its own Node and the
//! `UpdateChannel`s of its namespace and walks the node through an update:
//! 1. stage the target release into the inactive slot (libupgrade; no disruption);
//! 2. inside the window, claim an update slot by compare-and-swap on the channel status;
//! 3. fence (CAS its slot's phase with its token) before each disruptive step;
//! 4. cordon, drain through the Eviction API, activate, sync, reboot;
//! 5. after boot, confirm health, uncordon, release the slot (or record a failure);
//! 6. renew its node Lease; reclaim slots of deleted or silent nodes;
//! 7. one agent (poller Lease holder) resolves `latest` into `status.latestVersion`;
//! 8. one agent (fleet Lease holder) counts the selected nodes by version and phase into
//!    `status.nodes`, sets `Complete`, and moves the waves of `spec.rollout` on.
//!
//! ## Architecture
//!
//! The agent is seven layers, one concern each, and four shared modules. Data flows one way
//! through one reconcile (`run` → `reconcile::controller` → `reconcile::decide` → the action's
//! function → the agent's own effects → the cluster and the host), and a layer uses only the
//! layers below it and the shared modules:
//!
//! ```text
//! run            process wiring: client, metrics listener, the loops (the dm-verity scrub's
//!  │             too), the watches
//! fleet/         the loops a Lease grants: node Lease renewal, reclaim of dead holders, the
//!  │             `latest` poller (poller), the fleet counts and waves (counter)
//! reconcile/     one reconcile: read → NodeView, gather the Inputs (back-offs, gates'
//!  │             verdict, bytes fetched today), decide (pure) → Step, dispatch: what a
//!  │             waiting step says (waits), the bookkeeping ticks (actions), stage and the
//!  │             disruptive steps (staging, steps), the Invalid condition, the boot not
//!  │             assessed yet, the stage preview and its deadline condition (thin_report)
//! context/       the Agent (Settings + Clients + Memory) and, in one `impl Agent`
//!  │             (context/agent.rs), all it does as itself: its memory and reads, what it
//!  │             says (annotations, Events), the give-back effects several steps share, the
//!  │             poller's reports (ChannelStale, fleet rollouts)
//! cluster/       the Kubernetes side, never the Agent: the CAS slot protocol (slots over
//!  │             kube_store), cordon and Eviction (drain), the values the agent says
//!  │             (publish) and the Event sender (events), the gate probes, the ChannelStale
//!  │             and fleet rollout writes, watch caches, kube client
//! host/          the node side over libupgrade: libupgrade's verbs (ops: resolve once, then
//!  │             preview and stage that release; node: the real node), the looking-only
//!  │             resolutions (requests), status, the stage progress annotation
//!  │             (stage_progress), what a scrub found (scrub); the quota ledger and preview
//!  │             record are libupgrade's
//! channel/       what a channel says, parsed once, pure: the resource (crd), the spec
//!                (spec: Policy; window, duration, rollout, thin, gates, selector), the
//!                channels listed and picked (listing), fleet counts (counts), what a
//!                resolution found (latest, pinned), formats
//! shared         errors, metrics, phase, cooldown (the back-offs' arithmetic)
//! ```
//!
//! The one `impl Agent` outside context/agent.rs is the entry point `Agent::reconcile`
//! (reconcile/controller.rs), which `run` and the tests call: it calls the reconcile layer,
//! which context, below it, may not name.
//!
//! Effects at the edges: `decide` is pure and sees every input; the function of the action
//! it picks carries the action out and returns what it did (`cluster::publish::Done`: the
//! Events of the steps carried out, the phase entered, then decide again, wait, or reboot),
//! and the controller publishes that once. A tick publishes nothing itself but the
//! announcement of a step that takes long (the drain, the health checks' wait); the stage's
//! announcement, preview and deadline are published by the controller before its first byte.
//!
//! Module map: `channel` (pure: `channel::crd`, `channel::spec`, `channel::window`,
//! `channel::duration`, `channel::rollout`, `channel::fleet_waves`,
//! `channel::fleet_pinned`, `channel::latest`, `channel::pinned`, `channel::thin`,
//! `channel::gates`, `channel::selector`, `channel::listing`, `channel::counts`,
//! `channel::format`), `reconcile` (`reconcile::controller`, `reconcile::decide`,
//! `reconcile::waits`, `reconcile::actions`,
//! `reconcile::staging`, `reconcile::steps`, `reconcile::withdrawn`,
//! `reconcile::invalid`, `reconcile::assessment`, `reconcile::thin_report`),
//! `cluster` (`cluster::slots`, `cluster::kube_store`, `cluster::drain`,
//! `cluster::publish`, `cluster::events`, `cluster::gate_probe`,
//! `cluster::stale`, `cluster::rollout_status`, `cluster::cache`, `cluster::client`,
//! `cluster::token_scope`), `fleet` (`fleet::background`, `fleet::poller`, `fleet::counter`), `host`
//! (`host::ops`, `host::node`, `host::requests`, `host::scrub`, `host::status`,
//! `host::stage_progress`), `context` (`context::agent`), and the shared `errors`,
//! `metrics`, `phase`, `cooldown`; `run` on top.
//!
//! Error policy: the steps return typed errors (`SlotError`, `DrainError`, `NodeError`,
//! `WindowError`, `DurationError`) wrapped with context; every error ends in
//! `run`'s loop, which logs it and publishes it once per text as a `ReconcileError` Event
//! (`errors::message` renders the chain as Display text), backs off and retries. Nothing
//! below `run` exits the process. Two states are not errors and are reported once, then
//! waited out quietly: a boot not assessed yet (`k3os-ops slot confirm` did not run; Node
//! condition `K3osBootAssessed=False` and a `BootNotAssessed` Event naming the command), and
//! an object in a newer format than this agent knows (`channel::format`; an `UnknownFormat` Event,
//! nothing written to it).
//!
//! The modules are private to the crate. Integration tests, the real-cluster tests and the
//! fleet bench reach the agent through one facade, `testing` (feature `testing`, which
//! `k3os-ops-testing` turns on; never in a release build); internals are unit-tested beside
//! their code.

pub(crate) mod channel;
pub(crate) mod cluster;
pub(crate) mod context;
pub(crate) mod cooldown;
pub(crate) mod errors;
pub(crate) mod fleet;
pub(crate) mod host;
pub(crate) mod metrics;
pub(crate) mod phase;
pub(crate) mod reconcile;
pub(crate) mod run;
#[cfg(feature = "testing")]
pub mod testing;

// The deploy manifests (`deploy/`) against what the agent uses and mounts.
#[cfg(test)]
mod deploy_tests;

use std::path::PathBuf;

use clap::{Args, Subcommand};

/// `k3os-ops agent` arguments.
#[derive(Debug, Args)]
pub struct AgentArgs {
    #[command(subcommand)]
    pub cmd: Option<AgentCmd>,
    /// This node's name (DaemonSet: from `spec.nodeName` via the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Namespace holding the UpdateChannels, Leases and the agent pods.
    #[arg(long, env = "POD_NAMESPACE", default_value = "k3os-system")]
    pub namespace: String,
    /// This agent's pod name (never evicted by its own drain).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// libupgrade configuration file (default: K3OS_OPS_CONFIG or /etc/k3os-ops/config.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Seconds between reconciliations when nothing changes.
    #[arg(long, default_value_t = 30)]
    pub resync_secs: u64,
    /// Seconds between polls of the channel's newest release (poller Lease holder only).
    #[arg(long, default_value_t = 900)]
    pub poll_secs: u64,
    /// Seconds between those polls while a newer release waits for this cluster's wave of
    /// the channel's rollout (never less than --poll-secs). The poller also looks at the
    /// instant the wave reaches the cluster, so waiting longer between polls does not delay
    /// the cluster's turn; it delays only noticing a release published meanwhile.
    #[arg(long, default_value_t = 3600)]
    pub wait_poll_secs: u64,
    /// Seconds between counts of the fleet (`status.nodes`, waves; fleet Lease holder only).
    #[arg(long, default_value_t = 30)]
    pub count_secs: u64,
    /// Hours between dm-verity scrubs of this node's slots (`slot verify`: repair what FEC can
    /// on the slot that is not booted, mark it bad when FEC cannot); 0: never.
    #[arg(long, default_value_t = 24)]
    pub scrub_hours: u64,
    /// Address of the `/metrics`, `/healthz` and `/readyz` listener.
    #[arg(long, env = "K3OS_OPS_METRICS_ADDR", default_value = "0.0.0.0:9479")]
    pub metrics_addr: std::net::SocketAddr,
}

#[derive(Debug, Subcommand)]
pub enum AgentCmd {
    /// Print the UpdateChannel CRD (YAML) generated from the types.
    #[command(hide = true)]
    Crd,
}

/// Entry point of `k3os-ops agent`.
pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    if let Some(AgentCmd::Crd) = args.cmd {
        print!("{}", channel::crd::crd_yaml());
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run::run(args))
}
