//! Tests against a real Kubernetes API server (none can be installed on the build machine, so
//! they are `#[ignore]`d). Run them against a disposable cluster (k3s, kind, k3d):
//!
//! ```sh
//! KUBECONFIG=~/.kube/config cargo test -p k3os-ops --test agent_cluster -- --ignored --test-threads=1
//! ```
//!
//! They install the UpdateChannel CRD (server-side apply), work in a fresh namespace
//! `k3os-agent-test-<random>` that they delete afterwards, and need cluster-admin. Without
//! KUBECONFIG they fail saying so.

use k3os_ops::agent;

use std::collections::BTreeMap;
use std::time::Duration;

use agent::crd::*;
use agent::kube_store::KubeChannelStore;
use agent::slots::{self, ChannelStore, ClaimOutcome, LivenessObserver, StoreError};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResourceExt};
use rand::Rng;

async fn client() -> Client {
    if std::env::var_os("KUBECONFIG").is_none() {
        panic!("these tests need a disposable cluster: set KUBECONFIG (see the module docs)");
    }
    libupgrade::http::install_crypto_provider();
    Client::try_default()
        .await
        .expect("connect with KUBECONFIG")
}

/// Install the CRD, create a namespace and a channel; returns the namespace.
async fn setup(client: &Client, concurrency: u32) -> String {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        "updatechannels.k3os.io",
        &PatchParams::apply("k3os-ops-test").force(),
        &Patch::Apply(UpdateChannel::crd()),
    )
    .await
    .expect("apply CRD");
    for _ in 0..60 {
        let c = crds.get("updatechannels.k3os.io").await.unwrap();
        let established = c
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ns = format!("k3os-agent-test-{:08x}", rand::thread_rng().gen::<u32>());
    let nss: Api<Namespace> = Api::all(client.clone());
    let mut n = Namespace::default();
    n.metadata.name = Some(ns.clone());
    nss.create(&PostParams::default(), &n)
        .await
        .expect("create namespace");
    let chans: Api<UpdateChannel> = Api::namespaced(client.clone(), &ns);
    let ch = UpdateChannel::new(
        "stable",
        UpdateChannelSpec {
            url: "https://releases.example/".into(),
            version: Some("v2".into()),
            concurrency,
            node_selector: BTreeMap::new(),
            window: None,
            drain: DrainSpec::default(),
            reboot_timeout: "1m".into(),
            max_failures: 1,
        },
    );
    chans
        .create(&PostParams::default(), &ch)
        .await
        .expect("create channel");
    ns
}

async fn teardown(client: &Client, ns: &str) {
    let nss: Api<Namespace> = Api::all(client.clone());
    let _ = nss.delete(ns, &DeleteParams::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a real cluster: KUBECONFIG"]
async fn cluster_twenty_concurrent_claims_respect_concurrency() {
    let client = client().await;
    let ns = setup(&client, 2).await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let store = KubeChannelStore::new(client.clone(), &ns, "stable");
        tasks.push(tokio::spawn(async move {
            slots::claim(
                &store,
                &format!("sim-node-{i}"),
                &format!("tok-{i}"),
                "v2",
                chrono::Utc::now(),
            )
            .await
        }));
    }
    let mut claimed = 0;
    for t in tasks {
        if t.await.unwrap().expect("claim") == ClaimOutcome::Claimed {
            claimed += 1;
        }
    }
    let store = KubeChannelStore::new(client.clone(), &ns, "stable");
    let st = store.read().await.unwrap().status.unwrap_or_default();
    teardown(&client, &ns).await;
    assert_eq!(claimed, 2, "exactly `concurrency` claims may succeed");
    assert_eq!(st.slots.len(), 2, "{:?}", st.slots);
}

#[tokio::test]
#[ignore = "needs a real cluster: KUBECONFIG"]
async fn cluster_stale_resource_version_is_a_conflict() {
    let client = client().await;
    let ns = setup(&client, 1).await;
    let store = KubeChannelStore::new(client.clone(), &ns, "stable");
    let stale = store.read().await.unwrap();
    slots::claim(&store, "a", "ta", "v2", chrono::Utc::now())
        .await
        .unwrap();
    let mut write = stale.clone();
    write.status = Some(UpdateChannelStatus::default());
    let res = store.replace_status(&write).await;
    teardown(&client, &ns).await;
    assert_eq!(res.unwrap_err(), StoreError::Conflict);
}

#[tokio::test]
#[ignore = "needs a real cluster: KUBECONFIG"]
async fn cluster_slot_of_a_missing_node_is_reclaimed() {
    let client = client().await;
    let ns = setup(&client, 1).await;
    let store = KubeChannelStore::new(client.clone(), &ns, "stable");
    let ghost = format!("no-such-node-{:08x}", rand::thread_rng().gen::<u32>());
    assert_eq!(
        slots::claim(&store, &ghost, "tg", "v2", chrono::Utc::now())
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    let mut obs = LivenessObserver::default();
    let done = slots::reclaim_dead(
        &store,
        "me",
        &mut obs,
        Duration::from_secs(60),
        tokio::time::Instant::now(),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    let st = store.read().await.unwrap().status.unwrap_or_default();
    teardown(&client, &ns).await;
    assert_eq!(done.len(), 1);
    assert!(st.slots.is_empty());
}

/// The CRD's schema makes the server refuse what the agent would refuse (issue 11 bugs 3 and
/// 10: bounds, duration patterns and the CEL rules, which only a real server evaluates), and
/// accepts a full valid spec.
#[tokio::test]
#[ignore = "needs a real cluster: KUBECONFIG"]
async fn cluster_schema_refuses_invalid_specs() {
    use kube::api::{ApiResource, DynamicObject};
    let client = client().await;
    let ns = setup(&client, 1).await;
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::erase::<UpdateChannel>(&()),
    );
    let channel = |name: &str, spec: serde_json::Value| -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "k3os.io/v1", "kind": "UpdateChannel",
            "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap()
    };
    let base = serde_json::json!({"url": "https://releases.example/"});
    let with = |k: &str, v: serde_json::Value| {
        let mut s = base.clone();
        s[k] = v;
        s
    };
    let window = |w: serde_json::Value| with("window", w);
    let bad = [
        (
            "huge",
            with("concurrency", serde_json::json!(5_000_000_000u64)),
        ),
        (
            "zero-concurrency",
            with("concurrency", serde_json::json!(0)),
        ),
        (
            "zero-reboot",
            with("rebootTimeout", serde_json::json!("0s")),
        ),
        (
            "bad-reboot",
            with("rebootTimeout", serde_json::json!("soon")),
        ),
        (
            "zero-drain",
            with("drain", serde_json::json!({"timeout": "0m"})),
        ),
        (
            "start-25",
            window(serde_json::json!({"start": "25:00", "length": "2h"})),
        ),
        (
            "zero-length",
            window(serde_json::json!({"start": "01:00", "length": "0h"})),
        ),
        (
            "bad-zone",
            window(
                serde_json::json!({"start": "01:00", "length": "2h", "timeZone": "Not a zone!"}),
            ),
        ),
        (
            "bad-day",
            window(serde_json::json!({"start": "01:00", "length": "2h", "days": ["funday"]})),
        ),
    ];
    let mut accepted = Vec::new();
    for (name, spec) in bad {
        match api
            .create(&PostParams::default(), &channel(name, spec))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 422 => {}
            other => accepted.push(format!("{name}: {other:?}")),
        }
    }
    let good = window(serde_json::json!({"start": "23:30", "length": "1h30m",
        "timeZone": "Europe/Berlin", "days": ["Sat", "sunday"]}));
    let ok = api
        .create(&PostParams::default(), &channel("good", good))
        .await;
    teardown(&client, &ns).await;
    assert!(accepted.is_empty(), "the server accepted: {accepted:#?}");
    ok.expect("a valid channel is accepted");
}
