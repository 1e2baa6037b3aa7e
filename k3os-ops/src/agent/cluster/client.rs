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
//! The client also counts this agent's own writes to its Node and to the channels
//! ([`WriteCounter`], a request-mapping layer): the reconcile reads its watch caches only once
//! they have caught up with the agent's own writes (see [`super::cache`]).
//!
//! Also how a kube error reads in logs and Events ([`kube_message`]), for every module.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http::{Method, Request};
use kube::client::{Body, ClientBuilder};
use kube::{Client, Config};
use tower::util::MapRequestLayer;

/// Counts the requests of one agent that change its own Node (`/api/v1/nodes/<node>…`) or
/// an UpdateChannel (`…/updatechannels/…`): anything but GET.
#[derive(Debug, Clone)]
pub struct WriteCounter {
    count: Arc<AtomicU64>,
    node_path: String,
}

impl WriteCounter {
    pub fn new(node: &str) -> WriteCounter {
        WriteCounter {
            count: Arc::new(AtomicU64::new(0)),
            node_path: format!("/api/v1/nodes/{node}"),
        }
    }

    /// Writes counted so far.
    pub fn get(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Count `req` if it is such a write.
    pub fn note(&self, method: &Method, path: &str) {
        let own_node = path == self.node_path
            || path
                .strip_prefix(&self.node_path)
                .is_some_and(|rest| rest.starts_with('/'));
        if method != Method::GET && (own_node || path.contains("/updatechannels/")) {
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The layer that counts (put on the client's service stack).
    pub fn layer(
        &self,
    ) -> MapRequestLayer<impl Fn(Request<Body>) -> Request<Body> + Clone + Send + Sync + 'static>
    {
        let me = self.clone();
        MapRequestLayer::new(move |req: Request<Body>| {
            me.note(req.method(), req.uri().path());
            req
        })
    }
}

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
#[cfg(test)]
pub fn client_from_config(mut config: Config) -> Result<Client, kube::Error> {
    config.default_retry = false;
    Client::try_from(config)
}

/// The in-cluster (or KUBECONFIG) client of `k3os-ops agent`, see [`client_from_config`],
/// counting the agent's writes into `writes`.
pub async fn infer(writes: &WriteCounter) -> Result<Client, kube::Error> {
    let mut config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    config.default_retry = false;
    let builder = ClientBuilder::try_from(config)?;
    Ok(builder.with_layer(&writes.layer()).build())
}
