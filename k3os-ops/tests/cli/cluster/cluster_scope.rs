//! deploy/node-scope.yaml on a real kube-apiserver (>= 1.30; the server of agent_cluster.rs):
//!
//! ```sh
//! cargo test -p k3os-ops --test cli cluster::cluster_scope::
//! ```
//!
//! What a root user on node A can do with the token the kubelet projects into the agent pod
//! there (deploy/rbac.yaml's ServiceAccount, bound to a Pod on A): every write of issue 25's
//! "Allowed" table is refused against node B's objects by the policy (its message, not RBAC's)
//! and the agent's own writes to A's objects go through; an admin's writes are untouched; a
//! token without a node name is refused. Evictions are not scoped (an Eviction names no node;
//! README "Node-scoped authority").

use super::support as cluster_support;

use chrono::Utc;
use k3os_ops::agent;
use k3os_ops::agent::testing::crd::*;
use k3os_ops::agent::testing::slots::{self, ChannelStore};
use k3os_ops::agent::testing::{acquire_lease, node_lease_name, KubeChannelStore};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rand::Rng;
use serde_json::{json, Value};

const NS: &str = "k3os-system";

/// The outcome of one write: `Ok`, refused by the node-scope policy, or anything else.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Allowed,
    RefusedByPolicy,
    Other(String),
}

fn verdict<T>(r: Result<T, kube::Error>) -> Verdict {
    match r {
        Ok(_) => Verdict::Allowed,
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("k3os-ops agent") => {
            Verdict::RefusedByPolicy
        }
        Err(e) => Verdict::Other(e.to_string()),
    }
}

/// [`verdict`] of the agent's own functions, whose errors carry the API server's message.
fn store_verdict<T, E: std::fmt::Display>(r: Result<T, E>) -> Verdict {
    match r {
        Ok(_) => Verdict::Allowed,
        Err(e) if format!("{e}").contains("k3os-ops agent") => Verdict::RefusedByPolicy,
        Err(e) => Verdict::Other(format!("{e}")),
    }
}

/// Two Nodes, a channel, the policies; the clients of A's agent and of the admin.
struct World {
    admin: Client,
    a: String,
    b: String,
    agent_a: Client,
    channel: String,
}

async fn world() -> World {
    let admin = cluster_support::client().await;
    cluster_support::apply_manifest(&admin, "namespace.yaml").await;
    cluster_support::apply_manifest(&admin, "rbac.yaml").await;
    cluster_support::install_crd(&admin).await;
    cluster_support::apply_node_scope(&admin).await;
    let tag = format!("{:08x}", rand::thread_rng().gen::<u32>());
    let (a, b) = (format!("scope-{tag}-a"), format!("scope-{tag}-b"));
    let nodes: Api<Node> = Api::all(admin.clone());
    for n in [&a, &b] {
        let node: Node = serde_json::from_value(json!({"metadata": {
            "name": n,
            "labels": {"scope": tag},
            "annotations": {"k3os.io/update-phase": "Idle", "k3os.io/update-format": "2"},
        }}))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let now = Utc::now().to_rfc3339();
        nodes
            .patch_status(
                n,
                &PatchParams::default(),
                &Patch::Strategic(json!({"status": {
                    "addresses": [{"type": "InternalIP", "address": "10.0.0.10"}],
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
                }})),
            )
            .await
            .unwrap();
    }
    let channel = format!("scope-{tag}");
    let spec: UpdateChannelSpec = serde_json::from_value(json!({
        "url": "https://releases.example/", "version": "v2", "concurrency": 2,
        "nodeSelector": {"scope": tag},
    }))
    .unwrap();
    Api::<UpdateChannel>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &UpdateChannel::new(&channel, spec))
        .await
        .unwrap();
    let token = cluster_support::agent_pod_token(&admin, &a).await;
    let agent_a = cluster_support::client_with_token(&token).await;
    World {
        admin,
        a,
        b,
        agent_a,
        channel,
    }
}

/// Node writes of issue 25's table: (what, patch, status subresource?).
fn node_writes() -> Vec<(&'static str, Value, bool)> {
    vec![
        ("cordon", json!({"spec": {"unschedulable": true}}), false),
        (
            "label control-plane",
            json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": "true"}}}),
            false,
        ),
        (
            "taint NoExecute",
            json!({"spec": {"taints": [{"key": "evil", "effect": "NoExecute"}]}}),
            false,
        ),
        (
            "k3os.io annotation",
            json!({"metadata": {"annotations": {"k3os.io/update-phase": "Rebooting"}}}),
            false,
        ),
        (
            "Ready=False",
            json!({"status": {"conditions": [{"type": "Ready", "status": "False",
                "reason": "Forged", "lastHeartbeatTime": Utc::now().to_rfc3339(),
                "lastTransitionTime": Utc::now().to_rfc3339()}]}}),
            true,
        ),
        (
            "addresses",
            json!({"status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.66"}]}}),
            true,
        ),
        (
            "K3osBootAssessed",
            json!({"status": {"conditions": [{"type": "K3osBootAssessed", "status": "True",
                "reason": "Assessed", "lastHeartbeatTime": Utc::now().to_rfc3339(),
                "lastTransitionTime": Utc::now().to_rfc3339()}]}}),
            true,
        ),
    ]
}

async fn patch_node(c: &Client, node: &str, patch: &Value, status: bool) -> Verdict {
    let nodes: Api<Node> = Api::all(c.clone());
    let pp = PatchParams::default();
    if status {
        verdict(
            nodes
                .patch_status(node, &pp, &Patch::Strategic(patch))
                .await,
        )
    } else {
        verdict(nodes.patch(node, &pp, &Patch::Strategic(patch)).await)
    }
}

#[tokio::test]
async fn a_node_writes_only_its_own_node() {
    let _turn = cluster_support::exclusive().await;
    let w = world().await;
    // What the agent writes to its own Node (annotations, cordon, its condition) goes through;
    // labels, taints, addresses and the kubelet's conditions stay the kubelet's and the
    // admin's, on its own Node too (the agent never writes them).
    let own_allowed = ["cordon", "k3os.io annotation", "K3osBootAssessed"];
    for (what, patch, status) in node_writes() {
        let theirs = patch_node(&w.agent_a, &w.b, &patch, status).await;
        assert_eq!(theirs, Verdict::RefusedByPolicy, "{what} on node B");
        let own = patch_node(&w.agent_a, &w.a, &patch, status).await;
        let expected = if own_allowed.contains(&what) {
            Verdict::Allowed
        } else {
            Verdict::RefusedByPolicy
        };
        assert_eq!(own, expected, "{what} on its own node A");
        let admin = patch_node(&w.admin, &w.b, &patch, status).await;
        assert_eq!(admin, Verdict::Allowed, "{what} on node B by the admin");
    }
    // Another annotation than k3os.io/update-*, on its own Node.
    let other = json!({"metadata": {"annotations": {"example.com/owner": "me"}}});
    assert_eq!(
        patch_node(&w.agent_a, &w.a, &other, false).await,
        Verdict::RefusedByPolicy
    );
    // The stage preview (issue 34): the new key is the agent's; the old key, written by an
    // agent of the previous release, may only be removed.
    let preview = r#"{"format":1,"version":"v2","fetch":1,"reuse":2}"#;
    let new = json!({"metadata": {"annotations": {"k3os.io/update-stage-preview": preview}}});
    assert_eq!(
        patch_node(&w.agent_a, &w.a, &new, false).await,
        Verdict::Allowed
    );
    let old = json!({"metadata": {"annotations": {"k3os.io/stage-preview": preview}}});
    assert_eq!(
        patch_node(&w.agent_a, &w.a, &old, false).await,
        Verdict::RefusedByPolicy
    );
    assert_eq!(
        patch_node(&w.admin, &w.a, &old, false).await,
        Verdict::Allowed
    );
    let drop_old = json!({"metadata": {"annotations": {"k3os.io/stage-preview": null,
        "k3os.io/update-stage-preview": preview}}});
    assert_eq!(
        patch_node(&w.agent_a, &w.a, &drop_old, false).await,
        Verdict::Allowed,
        "the migration's patch"
    );
    // The agent's own functions on its own Node.
    let nodes: Api<Node> = Api::all(w.agent_a.clone());
    for on in [true, false] {
        agent::testing::set_unschedulable(&nodes, &w.a, on)
            .await
            .unwrap_or_else(|e| panic!("the agent's own cordon={on}: {e}"));
    }
}

#[tokio::test]
async fn a_reclaim_only_undoes_the_cordon_the_dead_holders_agent_made() {
    let _turn = cluster_support::exclusive().await;
    let w = world().await;
    let store = KubeChannelStore::new(w.agent_a.clone(), NS, &w.channel);
    // B cordoned by an admin (no mark of its agent): not A's to undo.
    let admin_nodes: Api<Node> = Api::all(w.admin.clone());
    let cordon = json!({"spec": {"unschedulable": true}});
    admin_nodes
        .patch(&w.b, &PatchParams::default(), &Patch::Merge(&cordon))
        .await
        .unwrap();
    assert_eq!(store.undo_cordon(&w.b).await, Ok(false));
    let uncordon = json!({"spec": {"unschedulable": false}});
    assert_eq!(
        patch_node(&w.agent_a, &w.b, &uncordon, false).await,
        Verdict::RefusedByPolicy,
        "uncordon of an admin's cordon"
    );
    // B cordoned by its own agent (the mark): the reclaim undoes it, and only that.
    let mark = json!({"metadata": {"annotations": {"k3os.io/update-cordoned": "true"}}});
    admin_nodes
        .patch(&w.b, &PatchParams::default(), &Patch::Merge(&mark))
        .await
        .unwrap();
    // Issue 34 item 3: the mark alone, while B stays cordoned: B's agent would never
    // uncordon it.
    let unmark = json!({"metadata": {"annotations": {"k3os.io/update-cordoned": null}}});
    assert_eq!(
        patch_node(&w.agent_a, &w.b, &unmark, false).await,
        Verdict::RefusedByPolicy,
        "removing the cordon mark while B stays cordoned"
    );
    let steal = json!({"spec": {"unschedulable": false},
        "metadata": {"labels": {"node-role.kubernetes.io/control-plane": "true"}}});
    assert_eq!(
        patch_node(&w.agent_a, &w.b, &steal, false).await,
        Verdict::RefusedByPolicy,
        "an uncordon that also labels"
    );
    assert_eq!(store.undo_cordon(&w.b).await, Ok(true));
    let b = admin_nodes.get(&w.b).await.unwrap();
    assert!(
        !b.spec.unwrap().unschedulable.unwrap_or(false),
        "B still cordoned after the reclaim"
    );
    let ann = b.metadata.annotations.unwrap();
    assert!(!ann.contains_key("k3os.io/update-cordoned"), "{ann:?}");
    // Uncordoned already (by an admin), the mark alone may go.
    let both = json!({"spec": {"unschedulable": false},
        "metadata": {"annotations": {"k3os.io/update-cordoned": "true"}}});
    admin_nodes
        .patch(&w.b, &PatchParams::default(), &Patch::Merge(&both))
        .await
        .unwrap();
    assert_eq!(
        patch_node(&w.agent_a, &w.b, &unmark, false).await,
        Verdict::Allowed,
        "removing the mark of an uncordoned node"
    );
    // Without the mark, cordoning B again is refused.
    assert_eq!(
        patch_node(&w.agent_a, &w.b, &cordon, false).await,
        Verdict::RefusedByPolicy
    );
}

/// Put `status` on the channel as the admin; returns the stored channel.
async fn admin_status(w: &World, status: Value) -> UpdateChannel {
    let chans: Api<UpdateChannel> = Api::namespaced(w.admin.clone(), NS);
    let mut ch = chans.get(&w.channel).await.unwrap();
    ch.status = Some(serde_json::from_value(status).unwrap());
    chans
        .replace_status(&w.channel, &PostParams::default(), &ch)
        .await
        .unwrap()
}

/// A's agent PUTs the channel's status changed by `f` (a forged compare-and-swap).
async fn agent_put(w: &World, f: impl FnOnce(&mut UpdateChannelStatus)) -> Verdict {
    let chans: Api<UpdateChannel> = Api::namespaced(w.agent_a.clone(), NS);
    let mut ch = chans.get(&w.channel).await.unwrap();
    f(ch.status.get_or_insert_with(Default::default));
    verdict(
        chans
            .replace_status(&w.channel, &PostParams::default(), &ch)
            .await,
    )
}

fn slot(node: &str, phase: &str) -> Value {
    json!({"node": node, "token": format!("tok-{node}"), "claimedAt": Utc::now().to_rfc3339(),
        "phase": phase, "version": "v2"})
}

#[tokio::test]
async fn a_node_writes_only_its_own_slot() {
    let _turn = cluster_support::exclusive().await;
    let w = world().await;
    let store = KubeChannelStore::new(w.agent_a.clone(), NS, &w.channel);
    let (a, b) = (w.a.clone(), w.b.clone());
    // Its own slot: claim, fence, record a failure, release (agent/slots).
    let claimed = slots::claim(&store, &a, "tok-a", "v2", Utc::now()).await;
    assert_eq!(store_verdict(claimed), Verdict::Allowed);
    // Forge a slot for B.
    let forged = slot(&b, "Claimed");
    let v = agent_put(&w, |st| {
        st.slots.push(serde_json::from_value(forged).unwrap())
    })
    .await;
    assert_eq!(v, Verdict::RefusedByPolicy, "forge a slot for B");
    // Claiming for B through the agent's own code.
    let v = store_verdict(slots::claim(&store, &b, "tok-b", "v2", Utc::now()).await);
    assert_eq!(v, Verdict::RefusedByPolicy, "claim for B");
    assert_eq!(
        store_verdict(slots::release(&store, &a, "tok-a", Utc::now()).await),
        Verdict::Allowed
    );
    // B holds a slot (its own agent claimed it; written here by the admin).
    admin_status(&w, json!({"slots": [slot(&b, "Rebooting")]})).await;
    let v = agent_put(&w, |st| st.slots[0].phase = SlotPhase::Claimed).await;
    assert_eq!(v, Verdict::RefusedByPolicy, "change B's slot");
    // Forge failures of B (the channel would pause) without reclaiming its slot.
    let failure: FailureRecord = serde_json::from_value(json!({
        "node": b, "version": "v2", "at": Utc::now().to_rfc3339(), "reason": "forged"}))
    .unwrap();
    let f2 = failure.clone();
    let v = agent_put(&w, move |st| st.failures.push(f2)).await;
    assert_eq!(v, Verdict::RefusedByPolicy, "record a failure of B");
    // More slots than spec.concurrency (2), own slot included.
    let v = agent_put(&w, |st| {
        for n in [&a, &a] {
            st.slots
                .push(serde_json::from_value(slot(n, "Claimed")).unwrap());
        }
    })
    .await;
    assert_ne!(v, Verdict::Allowed, "exceed concurrency");
    // The reclaim of a dead holder after its flip: B's slot taken away whole, its silence
    // recorded as a failure of B (agent/slots/reclaim.rs).
    let f3 = failure.clone();
    let v = agent_put(&w, move |st| {
        st.slots.clear();
        st.failures.push(f3);
    })
    .await;
    assert_eq!(
        v,
        Verdict::Allowed,
        "reclaim B's slot and record its failure"
    );
    // Removing a failure (lifting a pause) is the admin's.
    let v = agent_put(&w, |st| st.failures.clear()).await;
    assert_eq!(v, Verdict::RefusedByPolicy, "remove a failure");
    admin_status(&w, json!({"slots": []})).await;
    // The role writes stay possible (README: what the policy allows and why).
    let v = store_verdict(slots::set_latest(&store, Ok("v2"), Utc::now()).await);
    assert_eq!(v, Verdict::Allowed, "poller's latestVersion");
    let v = store_verdict(slots::write_fleet(&store, &[], None, Utc::now()).await);
    assert_eq!(v, Verdict::Allowed, "counter's fleet counts");
}

#[tokio::test]
async fn a_node_writes_only_its_own_lease_and_the_role_leases_as_itself() {
    let _turn = cluster_support::exclusive().await;
    let w = world().await;
    let leases: Api<Lease> = Api::namespaced(w.agent_a.clone(), NS);
    let admin_leases: Api<Lease> = Api::namespaced(w.admin.clone(), NS);
    // Create B's Lease as A; as B (holder B) too.
    let v = store_verdict(acquire_lease(&leases, &node_lease_name(&w.b), &w.a, 60).await);
    assert_eq!(v, Verdict::RefusedByPolicy, "create B's Lease");
    let lease_b: Lease = serde_json::from_value(json!({
        "metadata": {"name": node_lease_name(&w.b)},
        "spec": {"holderIdentity": w.b, "leaseDurationSeconds": 60,
                 "renewTime": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)}
    }))
    .unwrap();
    assert_eq!(
        verdict(leases.create(&PostParams::default(), &lease_b).await),
        Verdict::RefusedByPolicy,
        "create B's Lease with B as holder"
    );
    // Renew B's Lease (an admin created it: B's agent did).
    admin_leases
        .create(&PostParams::default(), &lease_b)
        .await
        .unwrap();
    let mut renewed = leases.get(&node_lease_name(&w.b)).await.unwrap();
    renewed.spec.as_mut().unwrap().renew_time =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        ));
    assert_eq!(
        verdict(
            leases
                .replace(&node_lease_name(&w.b), &PostParams::default(), &renewed)
                .await
        ),
        Verdict::RefusedByPolicy,
        "renew B's Lease"
    );
    // Its own Lease; the role Leases with itself as holder, not in B's name.
    for name in [
        node_lease_name(&w.a),
        format!("k3os-upgrade-reclaim-{}", w.channel),
        format!("k3os-upgrade-poller-{}", w.channel),
        format!("k3os-upgrade-fleet-{}", w.channel),
    ] {
        for _ in 0..2 {
            acquire_lease(&leases, &name, &w.a, 60)
                .await
                .unwrap_or_else(|e| panic!("Lease {name} as A: {e}"));
        }
    }
    let mut role = leases
        .get(&format!("k3os-upgrade-reclaim-{}", w.channel))
        .await
        .unwrap();
    role.spec.as_mut().unwrap().holder_identity = Some(w.b.clone());
    assert_eq!(
        verdict(
            leases
                .replace(
                    &format!("k3os-upgrade-reclaim-{}", w.channel),
                    &PostParams::default(),
                    &role
                )
                .await
        ),
        Verdict::RefusedByPolicy,
        "hand the reclaimer Lease to B"
    );
}

fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_node_reports_events_only_about_itself() {
    let _turn = cluster_support::exclusive().await;
    let w = world().await;
    let publisher = agent::testing::Publisher::new(w.agent_a.clone(), &w.a);
    let note = agent::testing::Note {
        warning: true,
        reason: "Test",
        note: "node scope test",
    };
    assert_eq!(
        verdict(publisher.publish(&node_ref(&w.b), None, &note).await),
        Verdict::RefusedByPolicy,
        "an Event about B"
    );
    assert_eq!(
        verdict(publisher.publish(&node_ref(&w.a), None, &note).await),
        Verdict::Allowed,
        "an Event about A"
    );
    let channel_ref = ObjectReference {
        api_version: Some("k3os.io/v1".into()),
        kind: Some("UpdateChannel".into()),
        name: Some(w.channel.clone()),
        namespace: Some(NS.into()),
        ..Default::default()
    };
    assert_eq!(
        verdict(
            publisher
                .publish(&channel_ref, Some(&node_ref(&w.a)), &note)
                .await
        ),
        Verdict::Allowed,
        "an Event about the channel, related to A"
    );
    assert_eq!(
        verdict(
            publisher
                .publish(&channel_ref, Some(&node_ref(&w.b)), &note)
                .await
        ),
        Verdict::RefusedByPolicy,
        "an Event about the channel, related to B"
    );
}

#[tokio::test]
async fn a_token_without_a_node_name_is_refused_and_said_so() {
    let _turn = cluster_support::exclusive().await;
    let w = world().await;
    let plain = cluster_support::agent_token(&w.admin).await;
    let c = cluster_support::client_with_token(&plain).await;
    let ann = json!({"metadata": {"annotations": {"k3os.io/update-phase": "Idle"}}});
    assert_eq!(
        patch_node(&c, &w.a, &ann, false).await,
        Verdict::RefusedByPolicy
    );
    // The agent's start-up check tells the two tokens apart.
    use agent::testing::{check_token_scope as check, TokenScope};
    assert_eq!(check(&c, &w.a).await, TokenScope::Unbound);
    assert_eq!(check(&w.agent_a, &w.a).await, TokenScope::Node);
    assert_eq!(
        check(&w.agent_a, &w.b).await,
        TokenScope::OtherNode(w.a.clone())
    );
}
