//! Serving requests of a mock kube client from the shared world: the clients, the request
//! loop, the cluster ticker, watches opened, the resource a path names.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Method, Request, Response};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};

use super::answer::answer;
use super::reply::{param, unexpected};
use super::world::World;
use super::{FakeBody, Log, CHANNELS};

/// The `%XX` escapes of a query string decoded (`+` is not used by kube's encoder).
pub(crate) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

/// Tick the simulated cluster every `period`, forever.
pub async fn run_cluster(world: Arc<Mutex<World>>, period: Duration) {
    loop {
        {
            let mut w = world.lock().unwrap();
            if w.tick(Instant::now()) {
                w.observe();
            }
        }
        tokio::time::sleep(period).await;
    }
}

/// A kube client of its own over the shared world (its own serving task).
pub fn client(world: &Arc<Mutex<World>>, log: &Log) -> Client {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<FakeBody>>();
    tokio::spawn(serve(handle, world.clone(), log.clone()));
    Client::new(svc, "default")
}

/// Answer the requests of one mock client from `world` until the client is dropped.
pub async fn serve(
    mut h: tower_test::mock::Handle<Request<Body>, Response<FakeBody>>,
    world: Arc<Mutex<World>>,
    log: Log,
) {
    while let Some((req, send)) = h.next_request().await {
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let query = percent_decode(req.uri().query().unwrap_or(""));
        let bytes = req.into_body().collect_bytes().await.unwrap();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        if method == Method::PUT && path.starts_with(CHANNELS) && path.ends_with("/status") {
            let held = world.lock().unwrap().hold();
            if let Some(barrier) = held {
                barrier.wait().await;
            }
        }
        let mut guard = world.lock().unwrap();
        let w = &mut *guard;
        w.stamp_channels();
        if let Some(hook) = w.hook.as_mut() {
            let mut ch = w.channel.clone();
            hook(&format!("{method} {path}"), &mut ch);
            if ch != w.channel {
                ch["metadata"]["resourceVersion"] = json!(w.next_rv());
                w.channel = ch;
                w.notify_channels();
            }
        }
        let resource = resource_of(&path);
        let verb = match (&method, is_collection(&path)) {
            (&Method::GET, true) if query.contains("watch=true") => "WATCH".to_string(),
            (&Method::GET, true) => "LIST".to_string(),
            _ => method.to_string(),
        };
        *w.requests.entry(format!("{verb} {resource}")).or_default() += 1;
        let resp = if verb == "WATCH" {
            watch_request(w, &log, &path, &query)
        } else {
            answer(w, &log, &method, &path, &query, &body)
        };
        w.observe();
        drop(guard);
        send.send_response(resp);
    }
}

/// Whether `path` names a collection (a list or watch when read) rather than one object.
pub(crate) fn is_collection(path: &str) -> bool {
    path == "/api/v1/nodes"
        || path == "/api/v1/pods"
        || path.trim_end_matches('/') == CHANNELS.trim_end_matches('/')
}

/// `GET …?watch=true` of the Nodes or the channels.
pub(crate) fn watch_request(
    w: &mut World,
    log: &Log,
    path: &str,
    query: &str,
) -> Response<FakeBody> {
    let secs: u64 = param(query, "timeoutSeconds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1800);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    let from = param(query, "resourceVersion").unwrap_or("");
    let name = param(query, "fieldSelector")
        .and_then(|f| f.strip_prefix("metadata.name="))
        .map(String::from);
    if path == "/api/v1/nodes" {
        w.open_watch("nodes", name, from, deadline)
    } else if path.trim_end_matches('/') == CHANNELS.trim_end_matches('/') {
        w.open_watch("updatechannels", name, from, deadline)
    } else {
        unexpected(log, &Method::GET, &format!("{path}?{query}"))
    }
}

/// The resource a request path names (`nodes`, `pods/eviction`, `updatechannels/status`, …):
/// the path without its API prefix, namespace and object names.
pub fn resource_of(path: &str) -> String {
    let seg: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let rest = match seg.as_slice() {
        ["api", _, rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        other => other,
    };
    let rest = match rest {
        ["namespaces", _, rest @ ..] => rest,
        other => other,
    };
    match rest {
        [kind] | [kind, _] => kind.to_string(),
        [kind, _, sub, ..] => format!("{kind}/{sub}"),
        [] => "?".into(),
    }
}

/// A kube client over the shared world whose writes `writes` counts, as the agent's own
/// client does (its `cluster::client::infer`): for agents with watch caches.
pub fn counted_client(
    world: &Arc<Mutex<World>>,
    log: &Log,
    writes: &k3os_ops::agent::testing::WriteCounter,
) -> Client {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<FakeBody>>();
    tokio::spawn(serve(handle, world.clone(), log.clone()));
    kube::client::ClientBuilder::new(svc, "default")
        .with_layer(&writes.layer())
        .build()
}
