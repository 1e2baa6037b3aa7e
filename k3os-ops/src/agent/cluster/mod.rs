//! The Kubernetes side of the agent: the compare-and-swap slot protocol on the channel status
//! ([`slots`] over [`kube_store`]), cordon and eviction ([`drain`]), the Node's annotations and
//! the Events ([`publish`]: the values; the agent sends them, [`events`]), the pre-reboot gates' probes ([`gate_probe`]), the `ChannelStale` condition
//! ([`stale`]), the poller's write of the channel's fleet rollouts ([`rollout_status`]), the watch caches ([`cache`]), the kube client and its error text ([`client`]) and what identity the agent's token carries ([`token_scope`]).

pub mod cache;
pub mod client;
pub mod drain;
pub mod events;
pub mod gate_probe;
pub mod kube_store;
pub mod rollout_status;
// The mock API server of the request-level unit tests (and, through `agent::testing`, of the
// integration tests' one request-level reconcile test).
#[cfg(any(test, feature = "testing"))]
pub(crate) mod mock_api;
pub mod publish;
pub mod slots;
pub mod stale;
pub mod token_scope;
