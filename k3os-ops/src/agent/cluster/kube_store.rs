//! [`ChannelStore`] over the Kubernetes API (kube-rs), and the node liveness Lease.
//!
//! Status writes are `replace_status` (PUT on the status subresource) carrying the
//! `resourceVersion` that was read, so the API server rejects a stale write with 409.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use super::slots::{ChannelStore, StoreError};
use crate::agent::channel::crd::UpdateChannel;

/// Name of the liveness Lease of `node` (in the agent namespace).
pub fn node_lease_name(node: &str) -> String {
    format!("k3os-upgrade-node-{node}")
}

/// Name of the poller Lease of channel `channel`.
pub fn poller_lease_name(channel: &str) -> String {
    format!("k3os-upgrade-poller-{channel}")
}

/// Map a kube error to the store's three cases.
pub fn store_error(e: kube::Error) -> StoreError {
    match &e {
        kube::Error::Api(s) if s.is_conflict() => StoreError::Conflict,
        kube::Error::Api(s) if s.is_not_found() => StoreError::NotFound(s.message.clone()),
        _ => StoreError::Other(super::client::kube_message(&e)),
    }
}

/// One channel, its namespace's Leases and the cluster's Nodes.
#[derive(Clone)]
pub struct KubeChannelStore {
    pub channels: Api<UpdateChannel>,
    pub nodes: Api<Node>,
    pub leases: Api<Lease>,
    pub namespace: String,
    pub name: String,
}

impl KubeChannelStore {
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        KubeChannelStore {
            channels: Api::namespaced(client.clone(), namespace),
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

impl ChannelStore for KubeChannelStore {
    fn channel_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    async fn read(&self) -> Result<UpdateChannel, StoreError> {
        self.channels.get(&self.name).await.map_err(store_error)
    }

    async fn replace_status(&self, obj: &UpdateChannel) -> Result<UpdateChannel, StoreError> {
        if obj.metadata.resource_version.is_none() {
            return Err(StoreError::Other(
                "refusing a status write without resourceVersion (it would not be a compare-and-swap)".into(),
            ));
        }
        self.channels
            .replace_status(&self.name, &PostParams::default(), obj)
            .await
            .map_err(store_error)
    }

    async fn node_exists(&self, node: &str) -> Result<bool, StoreError> {
        match self.nodes.get_metadata_opt(node).await {
            Ok(m) => Ok(m.is_some()),
            Err(e) => Err(store_error(e)),
        }
    }

    async fn undo_cordon(&self, node: &str) -> Result<bool, StoreError> {
        let Some(n) = self.nodes.get_opt(node).await.map_err(store_error)? else {
            return Ok(false);
        };
        let annotations = n.metadata.annotations.unwrap_or_default();
        let what = format!("the k3os.io/update-* annotations of Node {node}");
        if let Err(e) = crate::agent::channel::format::node_format(&what, &annotations) {
            // Written by a newer agent: not ours to rewrite (see agent/format.rs).
            tracing::warn!("not undoing the cordon of a dead holder: {e}");
            return Ok(false);
        }
        let ours = annotations
            .get(crate::agent::channel::format::ANN_CORDONED)
            .is_some_and(|v| v == "true");
        if !ours {
            return Ok(false);
        }
        let pp = kube::api::PatchParams::default();
        self.nodes
            .patch(
                node,
                &pp,
                &kube::api::Patch::Merge(serde_json::json!({"spec": {"unschedulable": false}})),
            )
            .await
            .map_err(store_error)?;
        let annotations = serde_json::json!({
            crate::agent::channel::format::ANN_CORDONED: null,
            crate::agent::channel::format::ANN_FORMAT: crate::agent::channel::format::NODE_FORMAT.to_string(),
        });
        self.nodes
            .patch(
                node,
                &pp,
                &kube::api::Patch::Merge(
                    serde_json::json!({"metadata": {"annotations": annotations}}),
                ),
            )
            .await
            .map_err(store_error)?;
        Ok(true)
    }

    async fn lease_marker(&self, node: &str) -> Result<Option<String>, StoreError> {
        match self.leases.get_opt(&node_lease_name(node)).await {
            Ok(Some(l)) => Ok(Some(format!(
                "{}/{}",
                l.metadata.resource_version.unwrap_or_default(),
                l.spec
                    .and_then(|s| s.renew_time)
                    .map(|t| t.0.to_string())
                    .unwrap_or_default()
            ))),
            Ok(None) => Ok(None),
            Err(e) => Err(store_error(e)),
        }
    }
}

/// Renew this node's own liveness Lease `name`: a PUT of `last` (the Lease as last written)
/// with a new `renewTime`, one request; without `last`, or when it is stale (409) or gone
/// (404), read it first ([`acquire_lease`]'s path: the Lease is always ours). Returns the Lease
/// as written, for the next renewal.
pub async fn renew_own_lease(
    leases: &Api<Lease>,
    name: &str,
    holder: &str,
    duration_secs: i32,
    last: Option<Lease>,
) -> Result<Lease, StoreError> {
    if let Some(mut lease) = last {
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        spec.lease_duration_seconds = Some(duration_secs);
        match leases.replace(name, &PostParams::default(), &lease).await {
            Ok(l) => return Ok(l),
            Err(e) => match store_error(e) {
                StoreError::Conflict | StoreError::NotFound(_) => {}
                other => return Err(other),
            },
        }
    }
    acquire_lease(leases, name, holder, duration_secs).await?;
    leases.get(name).await.map_err(store_error)
}

/// Outcome of one Lease acquire/renew attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// We hold it (created, renewed or taken over).
    Held,
    /// Someone else holds it and it is not expired.
    HeldBy(String),
}

/// Acquire or renew Lease `name` for `holder`, taking it over when its holder has not renewed
/// for `duration_secs` by our clock's reading of `renewTime`. Used for the poller Lease
/// (a lost race only means two resolves of the same channel, which are idempotent) and, with
/// a unique name per node, for the node liveness Lease (always ours).
pub async fn acquire_lease(
    leases: &Api<Lease>,
    name: &str,
    holder: &str,
    duration_secs: i32,
) -> Result<LeaseOutcome, StoreError> {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    match leases.get_opt(name).await.map_err(store_error)? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(holder.to_string()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            leases
                .create(&PostParams::default(), &lease)
                .await
                .map_err(store_error)?;
            Ok(LeaseOutcome::Held)
        }
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            let current = spec.holder_identity.clone().unwrap_or_default();
            let expired = spec.renew_time.as_ref().is_none_or(|t| {
                let age = now.0.duration_since(t.0);
                age.as_secs_f64() > f64::from(spec.lease_duration_seconds.unwrap_or(duration_secs))
            });
            if current != holder && !current.is_empty() && !expired {
                return Ok(LeaseOutcome::HeldBy(current));
            }
            if current != holder {
                spec.holder_identity = Some(holder.to_string());
                spec.acquire_time = Some(now.clone());
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.renew_time = Some(now);
            spec.lease_duration_seconds = Some(duration_secs);
            // replace carries the resourceVersion we read: a concurrent taker gets 409.
            leases
                .replace(name, &PostParams::default(), &lease)
                .await
                .map_err(store_error)?;
            Ok(LeaseOutcome::Held)
        }
    }
}

// Request-level tests against tower-test's mock API (`super::mock_api`): each test scripts
// the API server's answers and checks the exact requests (method, path, resourceVersion,
// bodies). 409 on `replace_status`: the claim re-reads and decides again, never PATCH; a
// deleted holder's slot is reclaimed; the poller writes status, never spec.
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use http::Method;
    use serde_json::json;

    use super::KubeChannelStore;
    use crate::agent::channel::counts::NodeFacts;
    use crate::agent::channel::crd::SlotPhase;
    use crate::agent::cluster::mock_api::{answer, channel_json, mock, slot, status_body, CH_PATH};
    use crate::agent::cluster::slots::{self, ClaimOutcome, DeadReason, LivenessObserver};

    #[tokio::test]
    async fn conflict_on_replace_status_rereads_and_finds_the_slot_taken() {
        let (client, mut h) = mock();
        let store = KubeChannelStore::new(client, "k3os-system", "stable");
        let server = tokio::spawn(async move {
            answer(
                &mut h,
                Method::GET,
                CH_PATH,
                200,
                channel_json("10", json!([])),
            )
            .await;
            let (_, sent) = answer(
                &mut h,
                Method::PUT,
                &format!("{CH_PATH}/status"),
                409,
                status_body(409, "Conflict", "the object has been modified"),
            )
            .await;
            // The write is a compare-and-swap on what was read.
            assert_eq!(sent["metadata"]["resourceVersion"], "10");
            assert_eq!(sent["status"]["slots"][0]["node"], "n1");
            // Someone else took the only slot meanwhile.
            answer(
                &mut h,
                Method::GET,
                CH_PATH,
                200,
                channel_json("11", json!([slot("n2", "t2", "Claimed")])),
            )
            .await;
        });
        let out = slots::claim(&store, "n1", "t1", "v2", chrono::Utc::now())
            .await
            .unwrap();
        assert_eq!(out, ClaimOutcome::Full(vec!["n2".into()]));
        server.await.unwrap();
    }

    #[tokio::test]
    async fn conflict_then_success_claims_with_the_new_resource_version() {
        let (client, mut h) = mock();
        let store = KubeChannelStore::new(client, "k3os-system", "stable");
        let server = tokio::spawn(async move {
            answer(
                &mut h,
                Method::GET,
                CH_PATH,
                200,
                channel_json("10", json!([])),
            )
            .await;
            answer(
                &mut h,
                Method::PUT,
                &format!("{CH_PATH}/status"),
                409,
                status_body(409, "Conflict", "modified"),
            )
            .await;
            answer(
                &mut h,
                Method::GET,
                CH_PATH,
                200,
                channel_json("12", json!([])),
            )
            .await;
            let (_, sent) = answer(
                &mut h,
                Method::PUT,
                &format!("{CH_PATH}/status"),
                200,
                channel_json("13", json!([slot("n1", "t1", "Claimed")])),
            )
            .await;
            assert_eq!(sent["metadata"]["resourceVersion"], "12");
            assert_eq!(sent["status"]["slots"].as_array().unwrap().len(), 1);
            assert_eq!(sent["status"]["slots"][0]["token"], "t1");
            assert_eq!(sent["status"]["observedGeneration"], 3);
        });
        let out = slots::claim(&store, "n1", "t1", "v2", chrono::Utc::now())
            .await
            .unwrap();
        assert_eq!(out, ClaimOutcome::Claimed);
        server.await.unwrap();
    }

    #[tokio::test]
    async fn fence_with_a_foreign_token_is_lost_without_writing() {
        let (client, mut h) = mock();
        let store = KubeChannelStore::new(client, "k3os-system", "stable");
        let server = tokio::spawn(async move {
            answer(
                &mut h,
                Method::GET,
                CH_PATH,
                200,
                channel_json("5", json!([slot("n1", "newer", "Claimed")])),
            )
            .await;
        });
        let out = slots::fence(
            &store,
            "n1",
            "older",
            SlotPhase::Draining,
            Some(false),
            chrono::Utc::now(),
        )
        .await
        .unwrap();
        assert_eq!(out, slots::FenceOutcome::Lost);
        server.await.unwrap();
    }

    #[tokio::test]
    async fn deleted_node_slot_is_reclaimed_by_cas() {
        let (client, mut h) = mock();
        let store = KubeChannelStore::new(client, "k3os-system", "stable");
        let server = tokio::spawn(async move {
            let held = json!([slot("gone", "tg", "Draining")]);
            answer(&mut h, Method::GET, CH_PATH, 200, channel_json("20", held)).await;
            answer(
                &mut h,
                Method::GET,
                "/api/v1/nodes/gone",
                404,
                status_body(404, "NotFound", "nodes \"gone\" not found"),
            )
            .await;
            // The write is conditional on the read the judgement was made from: no re-read.
            let (_, sent) = answer(
                &mut h,
                Method::PUT,
                &format!("{CH_PATH}/status"),
                200,
                channel_json("21", json!([])),
            )
            .await;
            assert_eq!(sent["metadata"]["resourceVersion"], "20");
            assert_eq!(sent["status"]["slots"], json!([]));
            // A deleted node is not a failure of the release.
            assert_eq!(sent["status"]["failures"], json!([]));
        });
        let mut obs = LivenessObserver::default();
        let done = slots::reclaim_dead(
            &store,
            "n1",
            &mut obs,
            Duration::from_secs(600),
            chrono::Utc::now(),
        )
        .await
        .unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].slot.node, "gone");
        assert_eq!(done[0].reason, DeadReason::NodeDeleted);
        server.await.unwrap();
    }

    #[tokio::test]
    async fn poller_writes_latest_into_status_never_spec() {
        let (client, mut h) = mock();
        let store = KubeChannelStore::new(client, "k3os-system", "stable");
        let server = tokio::spawn(async move {
            let mut ch = channel_json("7", json!([]));
            ch["spec"]["version"] = json!("latest");
            answer(&mut h, Method::GET, CH_PATH, 200, ch.clone()).await;
            let (_, sent) =
                answer(&mut h, Method::PUT, &format!("{CH_PATH}/status"), 200, ch).await;
            assert_eq!(sent["status"]["latestVersion"], "v9");
            assert_eq!(
                sent["spec"]["version"], "latest",
                "the spec must be sent back unchanged"
            );
            let conds: BTreeMap<String, String> = sent["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    (
                        c["type"].as_str().unwrap().to_string(),
                        c["status"].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            assert_eq!(
                conds.get("LatestResolved").map(String::as_str),
                Some("True")
            );
            assert_eq!(conds.get("Paused").map(String::as_str), Some("False"));
        });
        slots::set_latest(&store, Ok("v9"), chrono::Utc::now())
            .await
            .unwrap();
        server.await.unwrap();
    }

    /// A v0.1.0 fixture (tests/fixtures/v0.1.0) as JSON.
    fn v010(name: &str) -> serde_json::Value {
        let path = format!(
            "{}/tests/fixtures/v0.1.0/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    }

    /// A status written by v0.1.0 (no format marker, no counts) decodes, and the counter's
    /// write migrates it in one PUT on the resourceVersion read: `formatVersion: 2`, the counts
    /// added, v0.1.0's slot and failure kept as they were. Node annotations of v0.1.0 carry no
    /// `update-version`: counted as `unknown`.
    #[tokio::test]
    async fn the_counter_migrates_a_status_written_by_v010() {
        let old = v010("updatechannel.json");
        let decoded: crate::agent::channel::crd::UpdateChannel =
            serde_json::from_value(old.clone()).unwrap();
        assert_eq!(decoded.status.as_ref().unwrap().nodes, None);
        let facts: Vec<NodeFacts> = (1..=3)
            .map(|i| {
                let node = v010(&format!("node-{i}.json"));
                NodeFacts::from_meta(&serde_json::from_value(node["metadata"].clone()).unwrap())
            })
            .collect();
        let (client, mut h) = mock();
        let store = KubeChannelStore::new(client, "k3os-system", "stable");
        let server = tokio::spawn(async move {
            answer(&mut h, Method::GET, CH_PATH, 200, old.clone()).await;
            let (_, sent) = answer(
                &mut h,
                Method::PUT,
                &format!("{CH_PATH}/status"),
                200,
                old.clone(),
            )
            .await;
            (old, sent)
        });
        slots::write_fleet(&store, &facts, None, chrono::Utc::now())
            .await
            .unwrap();
        let (old, sent) = server.await.unwrap();
        let st = &sent["status"];
        assert_eq!(sent["metadata"]["resourceVersion"], "8");
        assert_eq!(st["formatVersion"], 2, "{st}");
        assert_eq!(st["slots"], old["status"]["slots"]);
        assert_eq!(st["failures"], old["status"]["failures"]);
        assert_eq!(st["nodes"]["total"], 3);
        assert_eq!(st["nodes"]["byVersion"], json!({"unknown": 3}));
        let complete = st["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Complete")
            .expect("a Complete condition");
        assert_eq!(complete["status"], "False", "{st}");
    }
}
