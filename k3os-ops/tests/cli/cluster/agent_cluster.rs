//! Tests against a real Kubernetes API server: the kube-apiserver and etcd that
//! `scripts/setup.sh` installs (started on 127.0.0.1, RBAC on, by `support`), or another
//! envtest directory in KUBEBUILDER_ASSETS, or KUBECONFIG's disposable cluster (k3s, kind, k3d):
//!
//! ```sh
//! cargo test -p k3os-ops --test cli cluster::agent_cluster::
//! KUBECONFIG=~/.kube/config cargo test -p k3os-ops --test cli cluster::agent_cluster::
//! ```
//!
//! They install the UpdateChannel CRD (server-side apply), work in a fresh namespace
//! `k3os-agent-test-<random>` that they delete afterwards, and need cluster-admin. Without
//! any of them they fail saying what to run. `cluster_agent_service_account_is_enough` runs
//! every kind of request the agent makes under a token of deploy/rbac.yaml's ServiceAccount.
//! The fleet of three agents with simulated reboots and a PDB runs against the fake API in CI
//! (tests/agent_fleet.rs); three agent *processes* against the real server are
//! cluster_fleet.rs. The server itself is started by `support`.

use super::support as cluster_support;

use cluster_support::{apply_manifest, client, install_crd};
use k3os_ops::agent;

use std::collections::BTreeMap;
use std::time::Duration;

use agent::testing::crd::*;
use agent::testing::slots::{self, ChannelStore, ClaimOutcome, LivenessObserver, StoreError};
use agent::testing::KubeChannelStore;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rand::Rng;

/// Install the CRD, create a namespace and a channel; returns the namespace.
async fn setup(client: &Client, concurrency: u32) -> String {
    install_crd(client).await;
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
            ignore_rollout: false,
            concurrency,
            node_selector: BTreeMap::new(),
            window: None,
            windows: Vec::new(),
            drain: DrainSpec::default(),
            reboot_timeout: "1m".into(),
            max_failures: 1,
            max_rate: None,
            paused: false,
            resumed_at: None,
            rollout: None,
            blocking_pod_selector: None,
            prometheus: None,
            stage: None,
            sources: Vec::new(),
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

/// Issue 24's fields survive the real API server's schema (it prunes what the schema lacks):
/// `spec.ignoreRollout`, and the poller's `status.fleetRollout` (seed, withdrawn releases,
/// withdrawn and held targets) with the conditions `WaitingForWave` and `ReleaseWithdrawn`,
/// written through the status subresource as the poller writes them.
#[tokio::test]
async fn cluster_keeps_the_fleet_rollout_fields() {
    let _turn = cluster_support::exclusive().await;
    let client = client().await;
    let ns = setup(&client, 1).await;
    let chans: Api<UpdateChannel> = Api::namespaced(client.clone(), &ns);
    let pp = PatchParams::default();
    chans
        .patch(
            "stable",
            &pp,
            &Patch::Merge(serde_json::json!({"spec": {"ignoreRollout": true}})),
        )
        .await
        .expect("patch spec");
    let status = serde_json::json!({"status": {
        "fleetRollout": {"clusterSeed": 999_999, "withdrawn": ["v1", "v3"],
                         "withdrawnTarget": "v3", "heldTarget": "v2"},
        "conditions": [
            {"type": COND_WAITING_FOR_WAVE, "status": "True", "reason": "WaveNotStarted",
             "message": "v2 waits: this cluster's wave starts at 2026-12-05T00:00:00Z",
             "lastTransitionTime": "2026-12-04T00:00:00Z"},
            {"type": COND_RELEASE_WITHDRAWN, "status": "True", "reason": "Withdrawn",
             "message": "v3 was withdrawn", "lastTransitionTime": "2026-12-04T00:00:00Z"}
        ]
    }});
    chans
        .patch_status("stable", &pp, &Patch::Merge(status))
        .await
        .expect("patch status");
    let back = chans.get("stable").await.expect("read back");
    let seed_too_big = chans
        .patch_status(
            "stable",
            &pp,
            &Patch::Merge(
                serde_json::json!({"status": {"fleetRollout": {"clusterSeed": 1_000_000}}}),
            ),
        )
        .await;
    teardown(&client, &ns).await;
    assert!(back.spec.ignore_rollout, "spec.ignoreRollout pruned");
    let st = back.status.expect("status");
    assert_eq!(
        st.fleet_rollout,
        Some(FleetRolloutStatus {
            cluster_seed: 999_999,
            withdrawn: vec!["v1".into(), "v3".into()],
            withdrawn_target: Some("v3".into()),
            held_target: Some("v2".into()),
        })
    );
    let kinds: Vec<&str> = st.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(kinds, [COND_WAITING_FOR_WAVE, COND_RELEASE_WITHDRAWN]);
    assert!(
        matches!(seed_too_big, Err(kube::Error::Api(ref e)) if e.code == 422),
        "a seed outside 0..=999999 is refused: {seed_too_big:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_twenty_concurrent_claims_respect_concurrency() {
    let _turn = cluster_support::exclusive().await;
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
async fn cluster_stale_resource_version_is_a_conflict() {
    let _turn = cluster_support::exclusive().await;
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
async fn cluster_slot_of_a_missing_node_is_reclaimed() {
    let _turn = cluster_support::exclusive().await;
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
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    let st = store.read().await.unwrap().status.unwrap_or_default();
    teardown(&client, &ns).await;
    assert_eq!(done.len(), 1);
    assert!(st.slots.is_empty());
}

/// The CRD's schema makes the server refuse what the agent would refuse (bounds, duration patterns and the CEL rules, which only a real server evaluates), and
/// accepts a full valid spec.
#[tokio::test]
async fn cluster_schema_refuses_invalid_specs() {
    let _turn = cluster_support::exclusive().await;
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
    let stage = |st: serde_json::Value| with("stage", st);
    let stage_window = |w: serde_json::Value| stage(serde_json::json!({"windows": [w]}));
    // Thin-link fields: (name, spec, what the refusal must say).
    let bad_thin = [
        (
            "bad-stage-rate",
            stage_window(serde_json::json!({"start": "01:00", "length": "2h", "maxRate": "fast"})),
            "stage.windows[].maxRate must be a rate",
        ),
        (
            "stage-start-25",
            stage_window(serde_json::json!({"start": "25:00", "length": "2h"})),
            "window.start must be HH:MM",
        ),
        (
            "zero-quota",
            stage(serde_json::json!({"maxBytesPerDay": "0"})),
            "stage.maxBytesPerDay must be greater than 0",
        ),
        (
            "bad-quota",
            stage(serde_json::json!({"maxBytesPerDay": "lots"})),
            "stage.maxBytesPerDay must be a byte count",
        ),
        (
            "bad-source",
            with("sources", serde_json::json!(["ftp://mirror/"])),
            "sources[]: an absolute host directory",
        ),
        // What the agent refuses as Invalid is refused by the schema too (issue 25).
        (
            "long-window",
            window(serde_json::json!({"start": "01:00", "length": "8d"})),
            "window.length must be at most 7d",
        ),
        (
            "long-window-hours",
            window(serde_json::json!({"start": "01:00", "length": "6d25h"})),
            "window.length must be at most 7d",
        ),
        (
            "mars-zone",
            window(
                serde_json::json!({"start": "01:00", "length": "2h", "timeZone": "Mars/Olympus"}),
            ),
            "timeZone",
        ),
        (
            "not-a-url",
            with("url", serde_json::json!("releases.example/stable")),
            "url must be an http(s) URL with a host",
        ),
        (
            "hostless-url",
            with("url", serde_json::json!("https://")),
            "url must be an http(s) URL with a host",
        ),
        (
            "set-drain-selector",
            with("drain", serde_json::json!({"podSelector": "app in (web)"})),
            "drain.podSelector must be an equality-based selector",
        ),
        (
            "set-blocking-selector",
            with("blockingPodSelector", serde_json::json!("app notin (a,b)")),
            "blockingPodSelector must be an equality-based selector",
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
    for (name, spec, says) in bad_thin {
        match api
            .create(&PostParams::default(), &channel(name, spec))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains(says) => {}
            other => accepted.push(format!("{name} (expected 422 saying {says:?}): {other:?}")),
        }
    }
    let good = window(serde_json::json!({"start": "23:30", "length": "1h30m",
        "timeZone": "Europe/Berlin", "days": ["Sat", "sunday"]}));
    let ok = api
        .create(&PostParams::default(), &channel("good", good))
        .await;
    // The bounds themselves, and every form of channel URL libupgrade reads.
    let mut edges = Vec::new();
    for (i, (length, url)) in [
        ("7d", "github-releases://acme/nodeos"),
        ("1d12h", "/srv/channel"),
        ("168h", "file:///srv/channel"),
        ("30m", "http://10.0.0.1:8080/stable/index.json"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut spec = window(serde_json::json!({"start": "00:00", "length": length}));
        spec["url"] = serde_json::json!(url);
        spec["drain"] = serde_json::json!({"podSelector": "app=web,tier!=db,!canary"});
        let r = api
            .create(&PostParams::default(), &channel(&format!("edge-{i}"), spec))
            .await;
        edges.push((length, url, r.map(|_| ())));
    }
    let mut thin = stage(serde_json::json!({
        "windows": [
            {"start": "00:00", "length": "6h", "timeZone": "Europe/Berlin", "maxRate": "1M"},
            {"days": ["sat"], "start": "02:00", "length": "2h", "maxRate": "0"},
            {"start": "12:00", "length": "1h"}
        ],
        "maxBytesPerDay": "1.5GiB"
    }));
    thin["sources"] = serde_json::json!(["/media/usb", "https://mirror.site/stable/v2/"]);
    let thin_ok = api
        .create(&PostParams::default(), &channel("good-thin", thin))
        .await;
    // A channel written for v0.1.0 (the fixture's spec) is still accepted.
    let v010: serde_json::Value = serde_json::from_slice(
        &std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/v0.1.0/updatechannel.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let v010_ok = api
        .create(
            &PostParams::default(),
            &channel("v010", v010["spec"].clone()),
        )
        .await;
    teardown(&client, &ns).await;
    assert!(accepted.is_empty(), "the server accepted: {accepted:#?}");
    ok.expect("a valid channel is accepted");
    for (length, url, r) in edges {
        r.unwrap_or_else(|e| panic!("length {length} with url {url} refused: {e:?}"));
    }
    thin_ok.expect("a valid channel with thin-link settings is accepted");
    v010_ok.expect("a v0.1.0 channel is accepted");
}

/// Every kind of request the agent makes, made with a token of deploy/rbac.yaml's
/// ServiceAccount bound to a Pod on the agent's Node, deploy/node-scope.yaml applied: none may
/// be forbidden. And the least privilege holds: the
/// same token cannot write a channel's spec.
#[tokio::test]
async fn cluster_agent_service_account_is_enough() {
    let _turn = cluster_support::exclusive().await;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, ServiceAccount};
    const NS: &str = "k3os-system";
    let admin = client().await;
    apply_manifest(&admin, "namespace.yaml").await;
    apply_manifest(&admin, "rbac.yaml").await;
    install_crd(&admin).await;
    let tag = format!("{:08x}", rand::thread_rng().gen::<u32>());
    let channel = format!("sa-test-{tag}");
    let node = format!("sa-test-node-{tag}");
    // The objects an agent finds: its channel, its Node, a pod on it.
    let chans: Api<UpdateChannel> = Api::namespaced(admin.clone(), NS);
    let mut spec: UpdateChannelSpec = serde_json::from_value(
        serde_json::json!({"url": "https://releases.example/", "version": "v2"}),
    )
    .unwrap();
    spec.concurrency = 1;
    chans
        .create(&PostParams::default(), &UpdateChannel::new(&channel, spec))
        .await
        .expect("create channel");
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": node}})).unwrap(),
        )
        .await
        .expect("create node");
    let pod_ns = format!("k3os-agent-test-{tag}");
    let nss: Api<Namespace> = Api::all(admin.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": pod_ns}})).unwrap(),
    )
    .await
    .expect("create namespace");
    // The ServiceAccount admission plugin needs the namespace's `default` ServiceAccount, which
    // only a controller manager creates (an envtest server has none; a cluster has made it).
    let pod_sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), &pod_ns);
    match pod_sas
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}})).unwrap(),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create the default service account: {e}"),
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &pod_ns);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({
            "metadata": {"name": "app"},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app"}]}
        }))
        .unwrap(),
    )
    .await
    .expect("create pod");

    // The agent's credentials: the token the kubelet projects into the agent pod on `node`,
    // judged by deploy/node-scope.yaml's policies.
    cluster_support::apply_node_scope(&admin).await;
    let token = cluster_support::agent_pod_token(&admin, &node).await;
    let agent = cluster_support::client_with_token(&token).await;

    let mut forbidden = Vec::new();
    let mut check = |what: &str, r: Result<(), String>| {
        if let Err(e) = r {
            forbidden.push(format!("{what}: {e}"));
        }
    };
    // Slot claim, fence and release: status CAS through updatechannels/status.
    let store = KubeChannelStore::new(agent.clone(), NS, &channel);
    check(
        "claim",
        slots::claim(&store, &node, "tok", "v2", chrono::Utc::now())
            .await
            .map(|_| ())
            .map_err(|e| format!("{e:?}")),
    );
    check(
        "release",
        slots::release(&store, &node, "tok", chrono::Utc::now())
            .await
            .map(|_| ())
            .map_err(|e| format!("{e:?}")),
    );
    // The fleet counter (counter.rs): a metadata list of the selected Nodes, a status CAS.
    let listed = Api::<Node>::all(agent.clone())
        .list_metadata(&kube::api::ListParams::default().labels("kubernetes.io/os=linux"))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
    check("list node metadata (fleet counter)", listed);
    check(
        "write fleet counts",
        slots::write_fleet(&store, &[], None, chrono::Utc::now())
            .await
            .map(|_| ())
            .map_err(|e| format!("{e:?}")),
    );
    // The Invalid condition (invalid.rs): a PUT of updatechannels/status too, never a patch.
    let dynamic = agent::testing::dynamic_api(agent.clone(), NS);
    let invalid = match dynamic.get(&channel).await {
        Ok(obj) => match serde_json::to_value(&obj) {
            Ok(raw) => agent::testing::write_invalid(
                &dynamic,
                &raw,
                Some("service account test"),
                chrono::Utc::now(),
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
        Err(e) => Err(e.to_string()),
    };
    check("invalid condition", invalid);
    // Its Node: read, annotate, cordon and uncordon.
    let agent_nodes: Api<Node> = Api::all(agent.clone());
    check(
        "get node",
        agent_nodes
            .get(&node)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
    );
    check(
        "list nodes",
        agent_nodes
            .list(&Default::default())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
    );
    check(
        "annotate node",
        agent_nodes
            .patch(
                &node,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"k3os.io/update-phase": "Test"}}})),
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
    );
    for on in [true, false] {
        check(
            "cordon",
            agent::testing::set_unschedulable(&agent_nodes, &node, on)
                .await
                .map_err(|e| e.to_string()),
        );
    }
    // Leases: the node liveness Lease and the poller Lease.
    let leases: Api<Lease> = Api::namespaced(agent.clone(), NS);
    for _ in 0..2 {
        check(
            "lease",
            agent::testing::acquire_lease(
                &leases,
                &agent::testing::node_lease_name(&node),
                &node,
                60,
            )
            .await
            .map(|_| ())
            .map_err(|e| format!("{e:?}")),
        );
    }
    // An Event regarding its Node.
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.clone()),
        ..Default::default()
    };
    check(
        "event",
        agent::testing::Publisher::new(agent.clone(), &node)
            .publish(
                &regarding,
                None,
                &agent::testing::Note {
                    warning: false,
                    reason: "Test",
                    note: "service account test",
                },
            )
            .await
            .map_err(|e| e.to_string()),
    );
    // Drain: pods on the node, then the Eviction API.
    let agent_pods: Api<Pod> = Api::all(agent.clone());
    check(
        "list pods",
        agent_pods
            .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
    );
    check(
        "evict",
        agent::testing::evict(&agent, &pod_ns, "app", Some(0))
            .await
            .map_err(|e| e.to_string()),
    );
    // Least privilege: no writes to a channel's spec.
    let agent_chans: Api<UpdateChannel> = Api::namespaced(agent.clone(), NS);
    let spec_write = agent_chans
        .patch(
            &channel,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"concurrency": 5}})),
        )
        .await;

    let _ = chans.delete(&channel, &DeleteParams::default()).await;
    let _ = nodes.delete(&node, &DeleteParams::default()).await;
    let _ = nss.delete(&pod_ns, &DeleteParams::default()).await;
    assert!(
        forbidden.is_empty(),
        "under the ServiceAccount: {forbidden:#?}"
    );
    assert!(
        matches!(&spec_write, Err(kube::Error::Api(s)) if s.code == 403),
        "the agent's token must not write a channel's spec: {spec_write:?}"
    );
}
