//! The agent's contract as its integration tests, the real-cluster tests and the fleet bench
//! drive it: the one door into the agent for code outside this crate, compiled only with the
//! `testing` feature (`k3os-ops-testing` turns it on; a release build never has it). Every
//! other module of [`crate::agent`] is private to the crate; what is not listed here is an
//! internal and is tested beside its code (`#[cfg(test)] mod tests`, in the lib's unit-test
//! binary), not from outside.
//!
//! What is in it, and why:
//! - **The agent and how it runs** ([`Agent`], [`Next`], [`run_agent`], [`Periods`], the
//!   background loops [`poll_loop`] with [`Polls`], [`count_loop`], [`reclaim_loop`],
//!   [`renew_node_lease`], the metrics listener [`spawn_metrics`] and the write counter
//!   [`WriteCounter`]): what `agent::run` assembles, so a test runs one agent or a fleet of
//!   them in one process, with the periods and clocks it chooses.
//! - **The node side** ([`NodeOps`] and its value types [`NodeError`], [`Withheld`],
//!   [`ConfirmResult`], [`StageEnd`], [`StageProgress`], [`NodeUpdateStatus`], [`Inactive`],
//!   [`TrialFailure`] with the core's events [`HEALTH_FAILED`] and [`FALLBACK_TAKEN`], the
//!   Node-Ready check name [`NODE_READY`], the not-assessed state [`NOT_ASSESSED`] and
//!   [`NOT_ASSESSED_HELP`]): the trait the simulated node (`k3os_ops_testing::sim_node`)
//!   implements, and the real [`LibupgradeNode`] with the two resolutions a node test calls
//!   ([`resolve_latest`] giving a [`Latest`], [`for_stage`]).
//! - **What the agent writes and reads on the wire** ([`crd`]: the UpdateChannel types, the
//!   published CRD; the Node annotations [`ANN_PHASE`], [`ANN_CORDONED`], [`ANN_MESSAGE`],
//!   [`ANN_FORMAT`], [`ANN_STAGE_PREVIEW`]; the Node condition [`COND_BOOT_ASSESSED`]): the
//!   tests assert on these objects as an API server stores them.
//! - **The agent's API calls one at a time** ([`slots`]: the compare-and-swap slot protocol
//!   over a [`KubeChannelStore`]; the Lease calls [`acquire_lease`], [`node_lease_name`]; the
//!   cordon and eviction calls [`set_unschedulable`], [`evict`]; Events [`Publisher`],
//!   [`Note`]; the Invalid condition [`write_invalid`] over [`dynamic_api`]; the start-up
//!   token check [`check_token_scope`], [`TokenScope`]): the real-cluster tests
//!   (`tests/cli/cluster`) make exactly the agent's requests with each identity, to check
//!   what the RBAC rules and admission policies in `deploy/` let through.
//!
//! - **A request-level mock API** ([`mock`], [`answer`], [`status_body`], [`MockHandle`]):
//!   the unit tests' script of the API server's answers, for the one integration test that
//!   checks a whole reconcile's exact requests (`tests/agent/kube_mock.rs`).
//!
//! The fake API server and the simulated node are not here: they live in `k3os-ops-testing`
//! (`fake_api`, `sim_node`), which depends on this crate and is shared with the fleet bench.

// The agent and how it runs.
/// Counts the agent's API writes (a layer of its kube client).
pub use super::cluster::client::WriteCounter;
/// The per-node controller (one reconcile, and its construction with a client and a node).
pub use super::context::Agent;
/// What a step asks the loop to do next.
pub use super::context::Next;
/// The loop that reclaims the slots of dead holders.
pub use super::fleet::background::reclaim_loop;
/// The loop that renews this node's liveness Lease.
pub use super::fleet::background::renew_node_lease;
/// The fleet Lease holder's counting loop (`status.nodes`, waves).
pub use super::fleet::counter::count_loop;
/// The poller Lease holder's loop (`status.latestVersion`, the fleet rollout report).
pub use super::fleet::poller::poll_loop;
/// How often [`poll_loop`] looks at the channel's newest release.
pub use super::fleet::poller::Polls;
/// The agent's `/metrics`, `/healthz` and `/readyz` listener.
pub use super::metrics::spawn as spawn_metrics;
/// The agent's reconcile loop with its loops beside it, as `k3os-ops agent` runs it.
pub use super::run::run_agent;
/// The periods of [`run_agent`]'s loops.
pub use super::run::Periods;

// The node side.
/// A channel's newest release as a node resolves it.
pub use super::channel::latest::Latest;
/// The real node: libupgrade's updater on this host.
pub use super::host::node::LibupgradeNode;
/// The boot-assessment core's verdict on a trial boot.
pub use super::host::ops::ConfirmResult;
/// A node-side failure.
pub use super::host::ops::NodeError;
/// What the agent asks of its node.
pub use super::host::ops::NodeOps;
/// How a stage ended that did not fail.
pub use super::host::ops::StageEnd;
/// Byte progress of a stage.
pub use super::host::ops::StageProgress;
/// Why the channel's rollout withholds a version from a node.
pub use super::host::ops::Withheld;
/// The name of the Node-Ready health check the agent reports.
pub use super::host::ops::NODE_READY;
/// The [`NodeError::op`] of a boot not assessed yet.
pub use super::host::ops::NOT_ASSESSED;
/// What to do about [`NOT_ASSESSED`].
pub use super::host::ops::NOT_ASSESSED_HELP;
/// Resolve a stage request, as the stage tick does.
pub use super::host::requests::for_stage;
/// Resolve `latest` for a node, as the poller and the claim check do.
pub use super::host::requests::resolve_latest;
/// The slot that is not booted.
pub use super::host::status::Inactive;
/// What the node's slots hold.
pub use super::host::status::NodeUpdateStatus;
/// What the core recorded about a failed trial.
pub use super::host::status::TrialFailure;
/// The core's event for a trial the bootloader fell back from.
pub use super::host::status::FALLBACK_TAKEN;
/// The core's event for a trial whose health checks failed.
pub use super::host::status::HEALTH_FAILED;

// What the agent writes and reads on the wire.
/// The UpdateChannel custom resource (`UpdateChannel::test()` builds the test channel).
pub use super::channel::crd;
/// Node annotation: the agent cordoned this node.
pub use super::channel::format::ANN_CORDONED;
/// Node annotation: the format of the agent's annotations.
pub use super::channel::format::ANN_FORMAT;
/// Node annotation: the agent's message to the operator.
pub use super::channel::format::ANN_MESSAGE;
/// Node annotation: the node's update phase.
pub use super::channel::format::ANN_PHASE;
/// Node condition: this boot was assessed.
pub use super::reconcile::assessment::COND_BOOT_ASSESSED;
/// Node annotation: the staged release's preview.
pub use super::reconcile::thin_report::ANN_STAGE_PREVIEW;

// The agent's API calls one at a time (the real-cluster tests).
/// The UpdateChannels as untyped objects (what [`write_invalid`] writes through).
pub use super::channel::listing::dynamic_api;
/// Evict one pod.
pub use super::cluster::drain::evict;
/// Cordon or uncordon a Node.
pub use super::cluster::drain::set_unschedulable;
/// One Event.
pub use super::cluster::events::Note;
/// Publishes Events about a node.
pub use super::cluster::events::Publisher;
/// Take or renew a Lease.
pub use super::cluster::kube_store::acquire_lease;
/// The name of a node's liveness Lease.
pub use super::cluster::kube_store::node_lease_name;
/// The channel status as a compare-and-swap store over the API.
pub use super::cluster::kube_store::KubeChannelStore;
/// What identity the agent's token carries (its start-up check).
pub use super::cluster::token_scope::check as check_token_scope;
/// The outcome of [`check_token_scope`].
pub use super::cluster::token_scope::TokenScope;
/// Write the Invalid condition of a channel that does not decode.
pub use super::reconcile::invalid::write_invalid;

/// The compare-and-swap slot protocol on the channel status (documented in
/// `agent/cluster/slots`): its verbs and outcomes, over any [`slots::ChannelStore`].
pub mod slots {
    /// Take a slot.
    pub use crate::agent::cluster::slots::claim;
    /// Move a held slot to a phase, if still held under the token.
    pub use crate::agent::cluster::slots::fence;
    /// Reclaim the slots of dead holders.
    pub use crate::agent::cluster::slots::reclaim_dead;
    /// Record a node's failure with the release (what pauses a channel at `maxFailures`).
    pub use crate::agent::cluster::slots::record_failure;
    /// Give a slot back.
    pub use crate::agent::cluster::slots::release;
    /// Write the poller's result.
    pub use crate::agent::cluster::slots::set_latest;
    /// Write the fleet counts.
    pub use crate::agent::cluster::slots::write_fleet;
    /// What the protocol reads and writes the channel status through.
    pub use crate::agent::cluster::slots::ChannelStore;
    /// The outcome of [`claim`].
    pub use crate::agent::cluster::slots::ClaimOutcome;
    /// The outcome of [`fence`].
    pub use crate::agent::cluster::slots::FenceOutcome;
    /// What [`reclaim_dead`] remembers between calls.
    pub use crate::agent::cluster::slots::LivenessObserver;
    /// A store's failure.
    pub use crate::agent::cluster::slots::StoreError;
}

// A request-level mock API.
/// Answer the next request after checking its method and path.
pub use super::cluster::mock_api::answer;
/// A kube client whose requests the returned [`MockHandle`] answers.
pub use super::cluster::mock_api::mock;
/// A Kubernetes `Status` failure body.
pub use super::cluster::mock_api::status_body;
/// The test's end of the mock service.
pub use super::cluster::mock_api::MockHandle;
