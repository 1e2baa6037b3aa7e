//! The shapes of the fake's answers (JSON bodies, status objects, streamed watch bodies) and
//! of the requests it reads (query parameters), shared by the world, the answers and the
//! request loop.

use bytes::Bytes;
use http::{Method, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{FakeBody, Log};

pub(crate) fn respond(status: u16, body: &Value) -> Response<FakeBody> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())).boxed_unsync())
        .unwrap()
}

/// A streamed answer: the lines `rx` receives until `deadline` (tokio time).
pub(crate) fn stream(
    rx: mpsc::UnboundedReceiver<Bytes>,
    deadline: tokio::time::Instant,
) -> Response<FakeBody> {
    let lines = futures::stream::unfold(rx, move |mut rx| async move {
        tokio::select! {
            line = rx.recv() => line.map(|l| (Ok(Frame::data(l)), rx)),
            _ = tokio::time::sleep_until(deadline) => None,
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(StreamBody::new(lines).boxed_unsync())
        .unwrap()
}

pub(crate) fn failure(code: u16, reason: &str, message: &str) -> Response<FakeBody> {
    respond(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "reason": reason, "code": code, "message": message}),
    )
}

pub(crate) fn not_found(what: &str) -> Response<FakeBody> {
    failure(404, "NotFound", &format!("{what} not found"))
}

pub(crate) fn conflict(what: &str) -> Response<FakeBody> {
    failure(
        409,
        "Conflict",
        &format!("Operation cannot be fulfilled on {what}: the object has been modified; please apply your changes to the latest version and try again"),
    )
}

/// The value of query parameter `key`.
pub(crate) fn param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

pub(crate) fn unexpected(log: &Log, method: &Method, path: &str) -> Response<FakeBody> {
    log.lock()
        .unwrap()
        .push(format!("UNEXPECTED {method} {path}"));
    not_found(path)
}
