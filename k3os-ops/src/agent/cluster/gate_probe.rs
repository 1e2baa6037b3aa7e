//! The pre-reboot gates' facts, fetched at the edge: the pods on the node and the Prometheus
//! alerts, judged by the pure functions of [`crate::agent::channel::gates`].

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::Api;

use crate::agent::channel::gates::{alerts_blocking, blocking_pods, Gates};

/// Why node `node` may not claim now under `gates`, or `None` when nothing blocks it.
pub async fn check(client: &kube::Client, node: &str, gates: &Gates) -> Option<String> {
    let mut why = Vec::new();
    if let Some(selector) = &gates.blocking_pods {
        let pods: Api<Pod> = Api::all(client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        match pods.list(&lp).await {
            Ok(list) => {
                let blocking = blocking_pods(&list.items, selector);
                if !blocking.is_empty() {
                    why.push(format!(
                        "pods matching spec.blockingPodSelector run on the node: {}",
                        blocking.join(", ")
                    ));
                }
            }
            Err(e) => why.push(format!(
                "could not list the pods on the node for spec.blockingPodSelector: {}",
                super::client::kube_message(&e)
            )),
        }
    }
    if let Some(p) = &gates.prometheus {
        let url = format!("{}/api/v1/alerts", p.url);
        match fetch(&url).await.and_then(|a| alerts_blocking(p, &a)) {
            Ok(names) if names.is_empty() => {}
            Ok(names) => why.push(format!(
                "Prometheus alerts active ({url}): {}",
                names.join(", ")
            )),
            Err(e) => why.push(format!("Prometheus alert query {url} failed: {e}")),
        }
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// GET `url` as JSON within 10 s, with libupgrade's HTTP client (one TLS setup per process;
/// it works for plain `http://` even on a node without CA certificates).
async fn fetch(url: &str) -> Result<serde_json::Value, String> {
    let url = url.to_string();
    let chain = |e: &(dyn std::error::Error + 'static)| libupgrade::chain_line(e);
    tokio::task::spawn_blocking(move || {
        let client = libupgrade::http::client().map_err(|e| chain(&e))?;
        let resp = client
            .get(&url)
            .timeout(Duration::from_secs(10))
            .send()
            .map_err(|e| chain(&e))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(format!("HTTP {status}"));
        }
        resp.json()
            .map_err(|e| format!("the answer is not JSON: {}", chain(&e)))
    })
    .await
    .map_err(|e| e.to_string())?
}
