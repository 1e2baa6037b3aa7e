//! Cordon and drain a node through the Eviction API, like `kubectl drain`.
//!
//! Evictions (not deletions) honour PodDisruptionBudgets: the API answers 429 while a budget
//! would be violated, and the drain retries until its timeout. Never evicted: the agent's own
//! pod, mirror (static) pods, DaemonSet pods (with `ignoreDaemonSets`), finished pods. Pods the
//! drain may not remove (unmanaged without `force`, emptyDir data without
//! `deleteEmptyDirData`, DaemonSet pods without `ignoreDaemonSets`) stop the drain *before*
//! anything is evicted, with every offending pod named.

use crate::agent::channel::selector::Selector;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::time::Instant;

use crate::agent::channel::crd::DrainSpec;

/// Why a drain stopped.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("drain of node {node} refused before evicting anything: {problems}")]
    Refused { node: String, problems: String },
    #[error(
        "spec.drain.podSelector: '{0}' is not a label selector (k=v, k!=v, k, !k joined by commas)"
    )]
    Selector(String),
    #[error(
        "drain of node {node} timed out after {}s ({budget_retries} evictions refused by a disruption budget); still present: {pods}",
        timeout.as_secs()
    )]
    Timeout {
        node: String,
        timeout: Duration,
        pods: String,
        /// 429 answers of the Eviction API seen before giving up.
        budget_retries: u32,
    },
    #[error(
        "drain of node {node}: {what}: {}",
        super::client::kube_message(source)
    )]
    Api {
        node: String,
        what: String,
        #[source]
        source: kube::Error,
    },
}

fn pod_name(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or(""),
        p.metadata.name.as_deref().unwrap_or("")
    )
}

/// The pods to evict from `pods` (all on the node), or every reason the drain must not start.
/// `self_pod` is `namespace/name` of the agent.
pub fn select_pods(
    pods: &[Pod],
    spec: &DrainSpec,
    self_pod: Option<&str>,
    node: &str,
) -> Result<Vec<Pod>, DrainError> {
    let selector = match &spec.pod_selector {
        Some(s) => Selector::parse(s).map_err(|_| DrainError::Selector(s.to_string()))?,
        None => Selector::default(),
    };
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for p in pods {
        let name = pod_name(p);
        if Some(name.as_str()) == self_pod {
            continue;
        }
        let annotations = p.metadata.annotations.clone().unwrap_or_default();
        if annotations.contains_key("kubernetes.io/config.mirror") {
            continue;
        }
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("");
        if phase == "Succeeded" || phase == "Failed" {
            continue;
        }
        if !selector.matches(&p.metadata.labels.clone().unwrap_or_default()) {
            continue;
        }
        let controller = p
            .metadata
            .owner_references
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|o| o.controller == Some(true));
        if controller.is_some_and(|o| o.kind == "DaemonSet") {
            if !spec.ignore_daemon_sets {
                problems.push(format!(
                    "{name} is managed by a DaemonSet (set drain.ignoreDaemonSets)"
                ));
            }
            continue;
        }
        if controller.is_none() && !spec.force {
            problems.push(format!(
                "{name} is not managed by a controller (set drain.force to delete it)"
            ));
        }
        let empty_dir = p
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .is_some_and(|v| v.iter().any(|v| v.empty_dir.is_some()));
        if empty_dir && !spec.delete_empty_dir_data {
            problems.push(format!(
                "{name} has emptyDir data (set drain.deleteEmptyDirData)"
            ));
        }
        out.push(p.clone());
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(DrainError::Refused {
            node: node.to_string(),
            problems: problems.join("; "),
        })
    }
}

/// Set `spec.unschedulable` of `node` (a merge patch of one field of the Node: there is no
/// list to race on here).
pub async fn set_unschedulable(
    nodes: &Api<Node>,
    node: &str,
    unschedulable: bool,
) -> Result<(), DrainError> {
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": unschedulable}})),
        )
        .await
        .map(|_| ())
        .map_err(|source| DrainError::Api {
            node: node.to_string(),
            what: format!("set spec.unschedulable={unschedulable}"),
            source,
        })
}

/// POST a `policy/v1` Eviction for `namespace/name`.
///
/// Built by hand rather than with `Api::evict`: kube 5 serialises the delete options as
/// `delete_options`, which the API server ignores, so a configured grace period would be lost.
pub async fn evict(
    client: &Client,
    namespace: &str,
    name: &str,
    grace_period: Option<i64>,
) -> Result<(), kube::Error> {
    let mut body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    });
    if let Some(g) = grace_period {
        body["deleteOptions"] = json!({"gracePeriodSeconds": g});
    }
    let req = kube::core::Request::new(format!(
        "/api/v1/namespaces/{namespace}/pods/{name}/eviction"
    ))
    .create(
        &PostParams::default(),
        serde_json::to_vec(&body).expect("json"),
    )
    .map_err(kube::Error::BuildRequest)?;
    client.request::<kube::core::Status>(req).await.map(|_| ())
}

/// Summary of a finished drain.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrainReport {
    pub evicted: Vec<String>,
    /// How many 429 answers (disruption budget) were retried.
    pub budget_retries: u32,
}

/// A pod by (namespace, name, uid): the uid tells a replacement of the same name apart.
type PodKey = (String, String, Option<String>);

fn pod_key(p: &Pod) -> PodKey {
    (
        p.metadata.namespace.clone().unwrap_or_default(),
        p.metadata.name.clone().unwrap_or_default(),
        p.metadata.uid.clone(),
    )
}

/// Evict every pod [`select_pods`] picks from `node` and wait until they are gone, within
/// `timeout`. `retry` is the pause between rounds (PDB retries and deletion polls).
pub async fn drain(
    client: &Client,
    node: &str,
    spec: &DrainSpec,
    self_pod: Option<&str>,
    timeout: Duration,
    retry: Duration,
) -> Result<DrainReport, DrainError> {
    let all: Api<Pod> = Api::all(client.clone());
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let pods = all
        .list(&lp)
        .await
        .map_err(api_err(node, "list pods on the node".into()))?;
    let targets = select_pods(&pods.items, spec, self_pod, node)?;
    let deadline = Instant::now() + timeout;
    let mut report = DrainReport::default();
    let mut to_evict: Vec<PodKey> = targets.iter().map(pod_key).collect();
    let mut to_vanish = Vec::new();
    loop {
        let (still, evicted) =
            evict_round(client, node, spec, deadline, to_evict, &mut report).await?;
        to_evict = still;
        to_vanish.extend(evicted);
        to_vanish = still_present(client, node, to_vanish).await?;
        if to_evict.is_empty() && to_vanish.is_empty() {
            return Ok(report);
        }
        if Instant::now() + retry > deadline {
            let pods: Vec<String> = to_evict
                .iter()
                .chain(to_vanish.iter())
                .map(|(ns, n, _)| format!("{ns}/{n}"))
                .collect();
            return Err(DrainError::Timeout {
                node: node.to_string(),
                timeout,
                pods: pods.join(", "),
                budget_retries: report.budget_retries,
            });
        }
        tokio::time::sleep(retry).await;
    }
}

/// The error of a failed request of the drain of `node`.
fn api_err(node: &str, what: String) -> impl FnOnce(kube::Error) -> DrainError {
    let node = node.to_string();
    move |source| DrainError::Api { node, what, source }
}

/// Ask once for the eviction of each pod of `to_evict`: returns the pods to ask again (a
/// budget refused, or the deadline cut the request) and those whose eviction was accepted.
async fn evict_round(
    client: &Client,
    node: &str,
    spec: &DrainSpec,
    deadline: Instant,
    to_evict: Vec<PodKey>,
    report: &mut DrainReport,
) -> Result<(Vec<PodKey>, Vec<PodKey>), DrainError> {
    let mut still = Vec::new();
    let mut accepted = Vec::new();
    for (ns, name, uid) in to_evict {
        // One request never outlives the drain's deadline (a stuck or retried request would
        // otherwise hold the node cordoned past `drain.timeout`).
        let answer =
            tokio::time::timeout_at(deadline, evict(client, &ns, &name, spec.grace_period)).await;
        let Ok(answer) = answer else {
            still.push((ns, name, uid));
            continue;
        };
        match answer {
            Ok(_) => {
                report.evicted.push(format!("{ns}/{name}"));
                accepted.push((ns, name, uid));
            }
            Err(kube::Error::Api(s)) if s.code == 429 => {
                report.budget_retries += 1;
                still.push((ns, name, uid));
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(api_err(node, format!("evict {ns}/{name}"))(e)),
        }
    }
    Ok((still, accepted))
}

/// The evicted pods of `pods` that still exist (same uid: not a replacement).
async fn still_present(
    client: &Client,
    node: &str,
    pods: Vec<PodKey>,
) -> Result<Vec<PodKey>, DrainError> {
    let mut remaining = Vec::new();
    for (ns, name, uid) in pods {
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        match api.get_opt(&name).await {
            Ok(Some(p)) if p.metadata.uid == uid => remaining.push((ns, name, uid)),
            Ok(_) => {}
            Err(e) => return Err(api_err(node, format!("check pod {ns}/{name}"))(e)),
        }
    }
    Ok(remaining)
}
