//! Reporting unusable channels on the channel itself: condition `Invalid` and an Event; the
//! condition is cleared when the spec is valid again.
//!
//! The condition is written like every other status write of the agent (see [`crate::agent::cluster::slots`]):
//! a PUT of the status subresource carrying the whole status as read and the resourceVersion
//! it was read at, so the API server refuses it (409) when another agent wrote first. The
//! loser does not retry: the winner wrote the same condition, and the next reconcile reads
//! it. `deploy/rbac.yaml` grants `updatechannels/status` get and update only; a merge patch
//! would be forbidden there. A channel that does not decode is written as the untyped object
//! it was read as, so nothing of its status is lost.

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{DynamicObject, PostParams};
use kube::Api;
use serde_json::{json, Value};

use crate::agent::channel::crd::COND_INVALID;
use crate::agent::cluster::client::kube_message;
use crate::agent::context::Agent;

/// Why the `Invalid` condition could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ConditionError {
    #[error("set condition Invalid of UpdateChannel {channel}: the object as read has no resourceVersion, so the write would not be a compare-and-swap")]
    NoResourceVersion { channel: String },
    #[error(
        "set condition Invalid of UpdateChannel {channel}: the object does not encode: {source}"
    )]
    Encode {
        channel: String,
        source: serde_json::Error,
    },
    #[error("set condition Invalid of UpdateChannel {channel}: {}", kube_message(.source))]
    Api {
        channel: String,
        source: kube::Error,
    },
}

/// `object` (a channel as read) with its `Invalid` condition saying `problem` (`Some`: True
/// with that message, `None`: False), or `None` when it already says so (or there is no
/// condition to clear). Every other part of the status is kept as read.
pub fn with_invalid(object: &Value, problem: Option<&str>, now: DateTime<Utc>) -> Option<Value> {
    let current: Vec<Value> = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let old = current.iter().find(|c| c["type"] == COND_INVALID);
    let status = if problem.is_some() { "True" } else { "False" };
    let message = problem.unwrap_or_default();
    match old {
        Some(c) if c["status"] == status && c["message"] == message => return None,
        None if problem.is_none() => return None,
        _ => {}
    }
    let mut next: Vec<Value> = current
        .iter()
        .filter(|c| c["type"] != COND_INVALID)
        .cloned()
        .collect();
    next.push(json!({
        "type": COND_INVALID,
        "status": status,
        "reason": if problem.is_some() { "InvalidSpec" } else { "ValidSpec" },
        "message": message,
        "lastTransitionTime": now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    }));
    let mut out = object.clone();
    if !out["status"].is_object() {
        out["status"] = json!({});
    }
    out["status"]["conditions"] = Value::Array(next);
    Some(out)
}

/// Write the `Invalid` condition of the channel `object` (as read) by compare-and-swap: a
/// PUT of its status with the resourceVersion it was read at. `Ok(true)`: this write landed
/// (so this agent reports it as an Event); `Ok(false)`: nothing to change, or another agent
/// wrote first (409).
pub async fn write_invalid(
    api: &Api<DynamicObject>,
    object: &Value,
    problem: Option<&str>,
    now: DateTime<Utc>,
) -> Result<bool, ConditionError> {
    let channel = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let Some(next) = with_invalid(object, problem, now) else {
        return Ok(false);
    };
    if !next["metadata"]["resourceVersion"].is_string() {
        return Err(ConditionError::NoResourceVersion { channel });
    }
    let next: DynamicObject =
        serde_json::from_value(next).map_err(|source| ConditionError::Encode {
            channel: channel.clone(),
            source,
        })?;
    match api
        .replace_status(&channel, &PostParams::default(), &next)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(source) => Err(ConditionError::Api { channel, source }),
    }
}

/// [`write_invalid`], a failure logged (the next reconcile tries again).
async fn set_invalid(cx: &Agent, object: &Value, problem: Option<&str>) -> bool {
    let api = crate::agent::channel::listing::dynamic_api(
        cx.clients.client.clone(),
        &cx.settings.namespace,
    );
    match write_invalid(&api, object, problem, Utc::now()).await {
        Ok(wrote) => wrote,
        Err(e) => {
            tracing::warn!("{e}");
            false
        }
    }
}

/// Report channels that do not decode or do not validate on the channel itself
/// (condition `Invalid` + an Event, by the one agent whose write lands), and clear the
/// condition of channels that are valid again.
pub(in crate::agent) async fn report_channels(
    cx: &Agent,
    listed: &crate::agent::channel::listing::Listed,
) {
    for bad in &listed.bad {
        let problem = format!("UpdateChannel {}: {}", bad.name, bad.error);
        if set_invalid(cx, &bad.object, Some(&problem)).await {
            let regarding = ObjectReference {
                api_version: Some("k3os.io/v1".into()),
                kind: Some("UpdateChannel".into()),
                name: Some(bad.name.clone()),
                namespace: Some(cx.settings.namespace.clone()),
                ..Default::default()
            };
            tracing::warn!(reason = "InvalidChannel", "{problem}");
            let n = crate::agent::cluster::events::Note {
                warning: true,
                reason: "InvalidChannel",
                note: &problem,
            };
            if let Err(e) = cx.clients.events.publish(&regarding, None, &n).await {
                tracing::warn!(
                    "could not publish event InvalidChannel on UpdateChannel {}: {}",
                    bad.name,
                    kube_message(&e)
                );
            }
        }
    }
    for ch in &listed.channels {
        let name = ch.metadata.name.clone().unwrap_or_default();
        let problem = ch
            .policy
            .as_ref()
            .err()
            .map(|e| format!("UpdateChannel {name}: {e}"));
        let object = match serde_json::to_value(&ch.resource) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!("set condition Invalid of UpdateChannel {name}: {e}");
                continue;
            }
        };
        if set_invalid(cx, &object, problem.as_deref()).await {
            if let Some(p) = problem {
                cx.event(Some(ch), true, "InvalidChannel", p).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use http::Method;
    use serde_json::json;

    use super::write_invalid;
    use crate::agent::channel::listing::{decode, dynamic_api};
    use crate::agent::cluster::mock_api::{answer, channel_json, mock, slot, status_body, CH_PATH};

    /// The `Invalid` condition of a channel that does not decode is written as a PUT of the
    /// status subresource carrying the resourceVersion read and the whole status as read (its
    /// slot stays): `deploy/rbac.yaml` grants `updatechannels/status` get and update, no patch,
    /// so the merge PATCH written before was forbidden on a real server. A 409 (another agent
    /// wrote first) is not an error and not reported as this agent's write.
    #[tokio::test]
    async fn invalid_condition_is_a_put_with_resource_version() {
        let (client, mut h) = mock();
        let api = dynamic_api(client, "k3os-system");
        let mut raw = channel_json("41", json!([slot("n2", "t2", "Draining")]));
        raw["spec"]["concurrency"] = json!(5_000_000_000u64);
        let bad = decode(serde_json::from_value(raw.clone()).unwrap()).unwrap_err();
        let now = chrono::Utc::now();
        let write = tokio::spawn(async move {
            let first = write_invalid(&api, &bad.object, Some("bad concurrency"), now)
                .await
                .unwrap();
            let second = write_invalid(&api, &bad.object, Some("bad concurrency"), now)
                .await
                .unwrap();
            (first, second)
        });
        let path = format!("{CH_PATH}/status");
        let mut stored = raw.clone();
        stored["metadata"]["resourceVersion"] = json!("42");
        let (_, sent) = answer(&mut h, Method::PUT, &path, 200, stored).await;
        assert_eq!(sent["metadata"]["resourceVersion"], "41");
        assert_eq!(sent["status"]["slots"], raw["status"]["slots"]);
        let cond = &sent["status"]["conditions"][0];
        assert_eq!(cond["type"], "Invalid");
        assert_eq!(cond["status"], "True");
        assert_eq!(cond["message"], "bad concurrency");
        answer(
            &mut h,
            Method::PUT,
            &path,
            409,
            status_body(409, "Conflict", "the object has been modified"),
        )
        .await;
        assert_eq!(write.await.unwrap(), (true, false));
    }
}
