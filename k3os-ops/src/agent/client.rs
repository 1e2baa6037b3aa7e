//! The agent's Kubernetes client: kube's client **without** its default retry layer.
//!
//! kube-client's default layer retries 429/503/504 invisibly (15 times, exponential up to
//! 1000 s). For the Eviction API a 429 is not a transient failure but the answer of a
//! PodDisruptionBudget, which the drain itself must see: it counts the refusals, paces its
//! rounds and enforces `drain.timeout` (issue 11, bug 2: with the layer, `Drained` reported 0
//! retries where the server answered 10–28, and a 30 s drain was still running after 150 s).
//! Every other request of the agent already sits in a loop that retries with back-off
//! (reconcile resync, reclaim and poll loops, watchers), so one client without the layer keeps
//! a single, visible retry policy.

use kube::{Client, Config};

/// A client for `config` with kube's default retry layer switched off.
pub fn client_from_config(mut config: Config) -> Result<Client, kube::Error> {
    config.default_retry = false;
    Client::try_from(config)
}

/// The in-cluster (or KUBECONFIG) client of `k3os-ops agent`, see [`client_from_config`].
pub async fn infer() -> Result<Client, kube::Error> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    client_from_config(config)
}
