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
//! Data flows one way through one reconcile (`run` → `controller` → `decide` → the action's
//! function → the stores), and every module below a line uses only modules below it:
//!
//! ```text
//! run            process wiring: client, metrics listener, background tasks, watchers, loop
//!  │              + cache (the watches of the channels and of the own Node, read-your-writes)
//!  │              + background (node Lease, reclaim of dead holders, `latest` poller)
//!  │              + counter (the fleet counts and waves: list Nodes → fleet → slots)
//! controller     read: own Node, channels (channels), this node's slots (node) → NodeView
//!  │             decide: decide::step(channel, policy, view, now) → Step (pure, no I/O)
//!  │             dispatch: one match, one function per Action
//! actions, steps tick_* (wait, claim, forfeit, release, record a failure) | stage, cordon +
//!  │             drain, flip + reboot, confirm — each fences on its token first
//!  │              + invalid (the Invalid condition), assessment (boot not assessed yet)
//! context        Agent = Settings + Clients + Memory; annotate_phase, events, blocking calls
//! slots, drain,  the effects: CAS of the channel status (slots over kube_store), cordon and
//! node, events   Eviction API (drain), libupgrade (node), Events (events)
//! decide, spec,  pure: the decision table, the parsed spec (Policy), windows, durations,
//! window, ...    waves (rollout), fleet counts (fleet), the gates' judgement (gates)
//! crd, format,   types and wire formats: the resource, format versions and migrations,
//! phase, client  the Phase enum, the kube client and how its errors read
//! ```
//!
//! Module map: [`crd`] (the resource types), [`spec`] (a channel's spec parsed once into a
//! [`spec::Policy`]), [`window`] and [`duration`] (spec parsing), [`decide`] (pure next-step
//! logic), [`slots`] (the CAS slot protocol over the [`slots::ChannelStore`] trait),
//! [`kube_store`] (that trait over kube-rs), [`drain`] (cordon/evict), [`node`] (the
//! node-side trait over libupgrade), [`rollout`] (waves: who is in which, who may claim, when
//! the next starts), [`fleet`] (counts and `Complete` from the Nodes' annotations), [`counter`]
//! (the fleet Lease holder's loop that lists Nodes and writes them), [`gates`] (pre-reboot
//! gates: blocking pods, Prometheus alerts), [`channels`] (decoding channels one by one with their
//! policy, which channel wins), [`controller`] (one reconcile: read, decide, dispatch),
//! [`context`] (the [`context::Agent`] handed to every step), [`actions`] (the waiting and
//! bookkeeping actions), [`steps`] (stage, drain, flip + reboot, confirm), [`invalid`]
//! (reporting unusable channels), [`assessment`] (a boot not assessed yet), [`background`]
//! (Lease renewal, reclaim, `latest` poller), [`cache`] (what the agent watches, the caches
//! its loops read), [`run`] (process wiring and the error policy),
//! [`client`] (kube client without the hidden retry layer, kube error text), [`events`],
//! [`format`] (versions and migrations of everything the agent stores, the annotation keys),
//! [`phase`] (the update phases of annotations and metrics), [`errors`] (Display text of
//! errors), [`metrics`] (/metrics, /healthz, /readyz), [`progress`] (stage progress
//! annotation), [`staging`] (the stage step), [`thin`] (stage windows, daily quota and
//! sources: the pure decisions), [`thin_report`] (stage preview annotation and gauge,
//! condition `StageWillMissWindow`), [`ledger`] (the quota ledger and preview record on the
//! node).
//!
//! Error policy: the steps return typed errors (`SlotError`, `DrainError`, `NodeError`,
//! `WindowError`, `DurationError`) wrapped with context; every error ends in
//! [`run`]'s loop, which logs it and publishes it once per text as a `ReconcileError` Event
//! ([`errors::message`] renders the chain as Display text), backs off and retries. Nothing
//! below `run` exits the process. Two states are not errors and are reported once, then
//! waited out quietly: a boot not assessed yet (`k3os-ops slot confirm` did not run; Node
//! condition `K3osBootAssessed=False` and a `BootNotAssessed` Event naming the command), and
//! an object in a newer format than this agent knows ([`format`]; an `UnknownFormat` Event,
//! nothing written to it).
//!
//! Integration tests reach it as `k3os_ops::agent` (the library target).

pub mod actions;
pub mod assessment;
pub mod background;
pub mod cache;
pub mod channels;
pub mod client;
pub mod context;
pub mod controller;
pub mod counter;
pub mod crd;
pub mod decide;
pub mod drain;
pub mod duration;
pub mod errors;
pub mod events;
pub mod fleet;
pub mod format;
pub mod gates;
pub mod invalid;
pub mod kube_store;
pub mod ledger;
pub mod metrics;
pub mod node;
pub mod phase;
pub mod progress;
pub mod rollout;
pub mod run;
pub mod slots;
pub mod spec;
pub mod staging;
pub mod stale;
pub mod steps;
pub mod thin;
pub mod thin_report;
pub mod token_scope;
pub mod window;

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
    /// Seconds between counts of the fleet (`status.nodes`, waves; fleet Lease holder only).
    #[arg(long, default_value_t = 30)]
    pub count_secs: u64,
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
        print!("{}", crd::crd_yaml());
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run::run(args))
}
