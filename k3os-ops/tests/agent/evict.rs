//! PodDisruptionBudget 429s of the Eviction API must reach drain.rs (which
//! counts them and enforces `drain.timeout`) instead of being retried invisibly by kube's
//! default retry layer. The agent's real client ([`agent::cluster::client::client_from_config`]) talks
//! to a fake API server on a loopback socket (HTTP/1.1, one request per connection).

use k3os_ops::agent;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent::channel::crd::DrainSpec;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
                } else if method == "GET" && path.starts_with("/api/v1/namespaces/default/pods/web")
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
    agent::cluster::client::client_from_config(config).expect("client")
}

#[tokio::test]
async fn budget_refusals_are_counted_by_the_drain() {
    let (url, seen) = fake_api(Some(3)).await;
    let report = tokio::time::timeout(
        Duration::from_secs(20),
        agent::cluster::drain::drain(
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
        agent::cluster::drain::drain(
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
        agent::cluster::drain::DrainError::Timeout { budget_retries, .. } => {
            assert_eq!(budget_retries, seen.load(Ordering::SeqCst));
            assert!(budget_retries >= 5, "{budget_retries} rounds in 2 s");
        }
        other => panic!("expected a timeout, got {other}"),
    }
}
