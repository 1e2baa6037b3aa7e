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

// The drain against an API server: tower-test's mock (`super::mock_api`, exact requests) and
// a fake server on a loopback socket behind the agent's real client (kube's default retry
// layer must not hide PodDisruptionBudget 429s from the drain, which counts them and enforces
// `drain.timeout`).
#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use http::{Method, Response};
    use kube::client::Body;
    use serde_json::{json, Value};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::{drain, DrainError};
    use crate::agent::channel::crd::DrainSpec;
    use crate::agent::cluster::mock_api::{answer, mock, status_body};

    fn pod(name: &str, owner_kind: Option<&str>, extra: Value) -> Value {
        let mut p = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "apps", "uid": format!("uid-{name}"), "labels": {"app": name}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Running"}
        });
        if let Some(kind) = owner_kind {
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u", "controller": true}]);
        }
        if let Value::Object(m) = extra {
            for (k, v) in m {
                p["metadata"][k] = v;
            }
        }
        p
    }

    fn pod_list() -> Value {
        let mut me = pod("agent", Some("DaemonSet"), json!({}));
        me["metadata"]["namespace"] = json!("k3os-system");
        let items = vec![
            pod("web", Some("ReplicaSet"), json!({})),
            pod("ds", Some("DaemonSet"), json!({})),
            pod(
                "static",
                None,
                json!({"annotations": {"kubernetes.io/config.mirror": "x"}}),
            ),
            me,
        ];
        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items})
    }

    #[tokio::test]
    async fn eviction_429_is_retried_until_the_budget_allows() {
        let (client, mut h) = mock();
        let server = tokio::spawn(async move {
            let (uri, _) = answer(&mut h, Method::GET, "/api/v1/pods", 200, pod_list()).await;
            assert!(uri.contains("fieldSelector=spec.nodeName%3Dn1"), "{uri}");
            let evict = "/api/v1/namespaces/apps/pods/web/eviction";
            let (_, body) = answer(
                &mut h,
                Method::POST,
                evict,
                429,
                status_body(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                ),
            )
            .await;
            assert_eq!(body["kind"], "Eviction");
            assert_eq!(body["apiVersion"], "policy/v1");
            assert_eq!(body["metadata"]["name"], "web");
            assert_eq!(
                body["deleteOptions"]["gracePeriodSeconds"], 30,
                "grace period lost: {body}"
            );
            answer(&mut h, Method::POST, evict, 201, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})).await;
            answer(
                &mut h,
                Method::GET,
                "/api/v1/namespaces/apps/pods/web",
                404,
                status_body(404, "NotFound", "pods \"web\" not found"),
            )
            .await;
        });
        let spec = DrainSpec {
            grace_period: Some(30),
            ..DrainSpec::default()
        };
        let report = drain(
            &client,
            "n1",
            &spec,
            Some("k3os-system/agent"),
            Duration::from_secs(30),
            Duration::from_millis(10),
        )
        .await
        .unwrap();
        assert_eq!(report.evicted, vec!["apps/web".to_string()]);
        assert_eq!(report.budget_retries, 1);
        server.await.unwrap();
    }

    #[tokio::test]
    async fn eviction_blocked_by_a_budget_times_out_naming_the_pod() {
        let (client, mut h) = mock();
        let server = tokio::spawn(async move {
            answer(&mut h, Method::GET, "/api/v1/pods", 200, pod_list()).await;
            // Answer 429 for as long as the drain keeps asking.
            while let Ok(Some((req, send))) =
                tokio::time::timeout(Duration::from_secs(2), h.next_request()).await
            {
                assert_eq!(
                    req.uri().path(),
                    "/api/v1/namespaces/apps/pods/web/eviction"
                );
                send.send_response(
                    Response::builder()
                        .status(429)
                        .body(Body::from(
                            serde_json::to_vec(&status_body(429, "TooManyRequests", "pdb"))
                                .unwrap(),
                        ))
                        .unwrap(),
                );
            }
        });
        let err = drain(
            &client,
            "n1",
            &DrainSpec::default(),
            Some("k3os-system/agent"),
            Duration::from_millis(200),
            Duration::from_millis(20),
        )
        .await
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("timed out") && msg.contains("apps/web"),
            "{msg}"
        );
        server.await.unwrap();
    }

    #[tokio::test]
    async fn drain_refuses_unmanaged_and_emptydir_pods_before_evicting() {
        let (client, mut h) = mock();
        let server = tokio::spawn(async move {
            let mut list = pod_list();
            list["items"]
                .as_array_mut()
                .unwrap()
                .push(pod("bare", None, json!({})));
            let mut cache = pod("cache", Some("ReplicaSet"), json!({}));
            cache["spec"]["volumes"] = json!([{"name": "tmp", "emptyDir": {}}]);
            list["items"].as_array_mut().unwrap().push(cache);
            answer(&mut h, Method::GET, "/api/v1/pods", 200, list).await;
            // No eviction may follow.
            assert!(
                tokio::time::timeout(Duration::from_millis(300), h.next_request())
                    .await
                    .map(|r| r.is_none())
                    .unwrap_or(true)
            );
        });
        let err = drain(
            &client,
            "n1",
            &DrainSpec::default(),
            None,
            Duration::from_secs(5),
            Duration::from_millis(10),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("apps/bare is not managed by a controller"),
            "{err}"
        );
        assert!(err.contains("apps/cache has emptyDir data"), "{err}");
        server.await.unwrap();
    }

    /// Read one HTTP/1.1 request: (method, path, body).
    async fn read_request(s: &mut TcpStream) -> Option<(String, String)> {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            let n = s.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        while buf.len() < head_end + len {
            let n = s.read(&mut chunk).await.ok()?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let mut first = head.lines().next()?.split(' ');
        Some((first.next()?.to_string(), first.next()?.to_string()))
    }

    async fn respond(s: &mut TcpStream, code: u16, body: serde_json::Value) {
        let body = serde_json::to_vec(&body).unwrap();
        let head = format!(
            "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = s.write_all(head.as_bytes()).await;
        let _ = s.write_all(&body).await;
        let _ = s.shutdown().await;
    }

    /// A fake API with one ReplicaSet pod `default/web` on node `n1`. Its Eviction is answered
    /// 429 (`refusals` times, forever when `None`), then 201; the pod is gone once evicted.
    /// Returns the base URL and the number of eviction requests seen.
    async fn fake_api(refusals: Option<u32>) -> (String, Arc<AtomicU32>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(AtomicU32::new(0));
        let count = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let count = count.clone();
                tokio::spawn(async move {
                    let Some((method, path)) = read_request(&mut s).await else {
                        return;
                    };
                    let path = path.split('?').next().unwrap_or_default().to_string();
                    if method == "GET" && path.starts_with("/api/v1/pods") {
                        let pod = json!({"metadata": {"name": "web", "namespace": "default", "uid": "u1",
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1",
                                                 "uid": "rs", "controller": true}]},
                            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
                            "status": {"phase": "Running"}});
                        respond(&mut s, 200, json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [pod]})).await;
                    } else if method == "POST" && path.ends_with("/pods/web/eviction") {
                        let n = count.fetch_add(1, Ordering::SeqCst);
                        if refusals.is_none_or(|r| n < r) {
                            respond(&mut s, 429, json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                "status": "Failure", "reason": "TooManyRequests", "code": 429,
                                "message": "Cannot evict pod as it would violate the pod's disruption budget."})).await;
                        } else {
                            respond(&mut s, 201, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})).await;
                        }
                    } else if method == "GET"
                        && path.starts_with("/api/v1/namespaces/default/pods/web")
                    {
                        respond(
                            &mut s,
                            404,
                            json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "reason": "NotFound", "code": 404, "message": "gone"}),
                        )
                        .await;
                    } else {
                        respond(&mut s, 404, json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "reason": "NotFound", "code": 404, "message": format!("unexpected {method} {path}")})).await;
                    }
                });
            }
        });
        (url, seen)
    }

    fn client(url: &str) -> kube::Client {
        let config = kube::Config::new(url.parse().unwrap());
        crate::agent::cluster::client::client_from_config(config).expect("client")
    }

    #[tokio::test]
    async fn budget_refusals_are_counted_by_the_drain() {
        let (url, seen) = fake_api(Some(3)).await;
        let report = tokio::time::timeout(
            Duration::from_secs(20),
            drain(
                &client(&url),
                "n1",
                &DrainSpec::default(),
                None,
                Duration::from_secs(10),
                Duration::from_millis(50),
            ),
        )
        .await
        .expect("the drain must not hang in a hidden retry loop")
        .expect("drain");
        assert_eq!(report.evicted, vec!["default/web".to_string()]);
        assert_eq!(
            seen.load(Ordering::SeqCst),
            4,
            "one eviction request per round"
        );
        assert_eq!(
            report.budget_retries, 3,
            "the drain reports the 429s the server sent"
        );
    }

    #[tokio::test]
    async fn drain_timeout_is_enforced_while_a_budget_refuses() {
        let (url, seen) = fake_api(None).await;
        let started = Instant::now();
        let err = tokio::time::timeout(
            Duration::from_secs(30),
            drain(
                &client(&url),
                "n1",
                &DrainSpec::default(),
                None,
                Duration::from_secs(2),
                Duration::from_millis(100),
            ),
        )
        .await
        .expect("drain.timeout (2 s) not enforced: still draining after 30 s")
        .expect_err("a budget that never allows must time out");
        let took = started.elapsed();
        assert!(took < Duration::from_secs(4), "timed out after {took:?}");
        match err {
            DrainError::Timeout { budget_retries, .. } => {
                assert_eq!(budget_retries, seen.load(Ordering::SeqCst));
                assert!(budget_retries >= 5, "{budget_retries} rounds in 2 s");
            }
            other => panic!("expected a timeout, got {other}"),
        }
    }
}
