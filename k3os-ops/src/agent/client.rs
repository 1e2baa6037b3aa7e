//! The agent's Kubernetes client: kube's client **without** its default retry layer.
//!
//! kube-client's default layer retries 429/503/504 invisibly (15 times, exponential up to
//! 1000 s). For the Eviction API a 429 is not a transient failure but the answer of a
//! PodDisruptionBudget, which the drain itself must see: it counts the refusals, paces its
//! rounds and enforces `drain.timeout` (with the layer, a drain's report counted no refusals
//! where the server answered dozens, and a 30 s drain timeout was overrun fivefold).
//! Every other request of the agent already sits in a loop that retries with back-off
//! (reconcile resync, reclaim and poll loops, watchers), so one client without the layer keeps
//! a single, visible retry policy.
//!
//! Also how a kube error reads in logs and Events ([`kube_message`]), for every module.

use kube::{Client, Config};

/// One kube error as text without debug output.
pub fn kube_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            let reason = if s.reason.is_empty() {
                "Failure"
            } else {
                s.reason.as_str()
            };
            format!("{} ({reason}, HTTP {})", s.message, s.code)
        }
        other => other.to_string(),
    }
}

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
