//! Reporting unusable channels on the channel itself: condition `Invalid` (written once, by
//! the agent whose resourceVersion-guarded merge patch lands) and an Event; the condition is
//! cleared when the spec is valid again.

use chrono::Utc;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::controller::Agent;
use super::crd::COND_INVALID;
use super::decide::Policy;

impl Agent {
    /// Write the `Invalid` condition of channel `name` (`Some(problem)`: True, `None`:
    /// False) unless it already says so; a merge patch of the status carrying the
    /// resourceVersion read, so concurrent agents write it once. Returns whether this agent
    /// wrote it (and so reports it as an Event).
    async fn set_invalid(
        &self,
        name: &str,
        resource_version: Option<&str>,
        conditions: &serde_json::Value,
        problem: Option<&str>,
    ) -> bool {
        let current: Vec<serde_json::Value> = conditions.as_array().cloned().unwrap_or_default();
        let old = current.iter().find(|c| c["type"] == COND_INVALID);
        let status = if problem.is_some() { "True" } else { "False" };
        let message = problem.unwrap_or_default();
        match old {
            Some(c) if c["status"] == status && c["message"] == message => return false,
            None if problem.is_none() => return false,
            _ => {}
        }
        let mut next: Vec<serde_json::Value> = current
            .iter()
            .filter(|c| c["type"] != COND_INVALID)
            .cloned()
            .collect();
        next.push(json!({
            "type": COND_INVALID,
            "status": status,
            "reason": if problem.is_some() { "InvalidSpec" } else { "ValidSpec" },
            "message": message,
            "lastTransitionTime": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        }));
        let patch = json!({
            "metadata": {"resourceVersion": resource_version},
            "status": {"conditions": next},
        });
        let api = super::channels::dynamic_api(self.client.clone(), &self.namespace);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(
                    "set condition Invalid of UpdateChannel {}/{name}: {}",
                    self.namespace,
                    super::errors::kube_message(&e)
                );
                false
            }
        }
    }

    /// Report channels that do not decode or do not validate on the channel itself
    /// (condition `Invalid` + an Event, by the one agent whose write lands), and clear the
    /// condition of channels that are valid again.
    pub(super) async fn report_channels(&self, listed: &super::channels::Listed) {
        for bad in &listed.bad {
            let problem = format!("UpdateChannel {}: {}", bad.name, bad.error);
            if self
                .set_invalid(
                    &bad.name,
                    bad.resource_version.as_deref(),
                    &bad.conditions,
                    Some(&problem),
                )
                .await
            {
                let regarding = ObjectReference {
                    api_version: Some("k3os.io/v1".into()),
                    kind: Some("UpdateChannel".into()),
                    name: Some(bad.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..Default::default()
                };
                tracing::warn!(reason = "InvalidChannel", "{problem}");
                let n = super::events::Note {
                    warning: true,
                    reason: "InvalidChannel",
                    note: &problem,
                };
                if let Err(e) = self.events.publish(&regarding, None, &n).await {
                    tracing::warn!(
                        "could not publish event InvalidChannel on UpdateChannel {}: {}",
                        bad.name,
                        super::errors::kube_message(&e)
                    );
                }
            }
        }
        for ch in &listed.channels {
            let name = ch.metadata.name.clone().unwrap_or_default();
            let problem = Policy::from_spec(&ch.spec)
                .err()
                .map(|e| format!("UpdateChannel {name}: {e}"));
            let conditions = serde_json::to_value(
                ch.status
                    .as_ref()
                    .map(|s| s.conditions.clone())
                    .unwrap_or_default(),
            )
            .unwrap_or_default();
            if self
                .set_invalid(
                    &name,
                    ch.metadata.resource_version.as_deref(),
                    &conditions,
                    problem.as_deref(),
                )
                .await
            {
                if let Some(p) = problem {
                    self.event(Some(ch), true, "InvalidChannel", p).await;
                }
            }
        }
    }
}
