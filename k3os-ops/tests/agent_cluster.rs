//! Tests against a real Kubernetes API server (none can be installed on the build machine, so
//! they are `#[ignore]`d and CI keeps the mock, fake-API and race tests). Either point
//! KUBEBUILDER_ASSETS at a directory with `kube-apiserver` and `etcd` (controller-runtime's
//! setup-envtest layout: the tests start both on 127.0.0.1, RBAC on) or KUBECONFIG at a
//! disposable cluster (k3s, kind, k3d):
//!
//! ```sh
//! KUBEBUILDER_ASSETS=/path/to/bin cargo test -p k3os-ops --test agent_cluster -- --ignored --test-threads=1
//! KUBECONFIG=~/.kube/config cargo test -p k3os-ops --test agent_cluster -- --ignored --test-threads=1
//! ```
//!
//! They install the UpdateChannel CRD (server-side apply), work in a fresh namespace
//! `k3os-agent-test-<random>` that they delete afterwards, and need cluster-admin. With
//! neither variable they fail saying what to set. `cluster_agent_service_account_is_enough` runs
//! every kind of request the agent makes under a token of deploy/rbac.yaml's ServiceAccount.
//! The fleet of three agents with simulated reboots and a PDB runs against the fake API in CI
//! (tests/agent_fleet.rs).

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

/// The cluster of these tests: KUBECONFIG's, or one started here from KUBEBUILDER_ASSETS.
async fn client() -> Client {
    Client::try_from(admin_config().await).expect("client of the test cluster")
}

/// How to reach the test cluster as its admin (the ServiceAccount test swaps the credentials).
async fn admin_config() -> kube::Config {
    libupgrade::http::install_crypto_provider();
    if std::env::var_os("KUBECONFIG").is_some() {
        return kube::Config::infer()
            .await
            .expect("connect with KUBECONFIG");
    }
    if let Some(assets) = std::env::var_os("KUBEBUILDER_ASSETS") {
        return envtest::config(std::path::Path::new(&assets)).await;
    }
    panic!(
        "these tests need an API server: set KUBEBUILDER_ASSETS to a directory holding \
         kube-apiserver and etcd (controller-runtime's setup-envtest layout; the tests start them \
         on 127.0.0.1 with RBAC on), or KUBECONFIG to a disposable cluster with cluster-admin"
    );
}

/// A throw-away etcd + kube-apiserver on 127.0.0.1 from `$KUBEBUILDER_ASSETS` (started once
/// per test process, killed at exit). RBAC is on; the tests authenticate with a static token of
/// group `system:masters`.
///
/// Not run on the build machines (no API server binary is installable there): written to the
/// documented flags of kube-apiserver 1.3x and etcd 3.5, so expect to adjust it the first time
/// it meets real binaries.
mod envtest {
    use std::net::TcpListener;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    use kube::Client;

    struct Server {
        _children: Vec<KillOnDrop>,
        _dir: tempfile::TempDir,
        url: String,
        token_file: PathBuf,
    }

    struct KillOnDrop(Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// Start `bin`; it gets SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG):
    /// [`client`] starts the servers from a thread that lives as long as the test process, so
    /// they never outlive it (statics are not dropped at exit).
    fn spawn(bin: &Path, args: &[String], log: &Path) -> KillOnDrop {
        use std::os::unix::process::CommandExt;
        let out = std::fs::File::create(log).unwrap();
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out));
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        KillOnDrop(child)
    }

    fn start(assets: &Path) -> Server {
        let etcd = assets.join("etcd");
        let apiserver = assets.join("kube-apiserver");
        for b in [&etcd, &apiserver] {
            assert!(
                b.is_file(),
                "KUBEBUILDER_ASSETS={} has no {}",
                assets.display(),
                b.display()
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (etcd_port, peer_port, api_port) = (free_port(), free_port(), free_port());
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let etcd_child = spawn(
            &etcd,
            &[
                format!("--data-dir={}", d.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
            ],
            &d.join("etcd.log"),
        );
        let key = d.join("sa.key");
        let st = Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&key)
            .arg("2048")
            .stderr(Stdio::null())
            .status()
            .expect("openssl (scripts/setup.sh installs it)");
        assert!(st.success(), "openssl genrsa failed");
        let token = "k3os-ops-test-admin-token";
        std::fs::write(
            d.join("tokens.csv"),
            format!("{token},k3os-ops-test-admin,1,\"system:masters\"\n"),
        )
        .unwrap();
        let token_file = d.join("token");
        std::fs::write(&token_file, token).unwrap();
        let api_child = spawn(
            &apiserver,
            &[
                format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={api_port}"),
                format!("--cert-dir={}", d.join("certs").display()),
                format!("--token-auth-file={}", d.join("tokens.csv").display()),
                "--authorization-mode=RBAC".into(),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-account-key-file={}", key.display()),
                format!("--service-account-signing-key-file={}", key.display()),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                "--allow-privileged=true".into(),
            ],
            &d.join("kube-apiserver.log"),
        );
        Server {
            _children: vec![api_child, etcd_child],
            url: format!("https://127.0.0.1:{api_port}"),
            token_file,
            _dir: dir,
        }
    }

    static SERVER: OnceLock<Server> = OnceLock::new();

    /// How to reach the (started once) local API server, as `system:masters`, once `/readyz`
    /// answers.
    pub async fn config(assets: &Path) -> kube::Config {
        let assets = assets.to_path_buf();
        let s = SERVER.get_or_init(move || {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(start(&assets));
                loop {
                    std::thread::park();
                }
            });
            rx.recv().expect("the envtest thread panicked (see above)")
        });
        let mut config = kube::Config::new(s.url.parse().unwrap());
        config.accept_invalid_certs = true;
        config.auth_info.token_file = Some(s.token_file.display().to_string());
        let client = Client::try_from(config.clone()).expect("client of the local API server");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
            match client.request_text(req).await {
                Ok(t) if t.trim() == "ok" => return config,
                other if Instant::now() > deadline => panic!(
                    "kube-apiserver at {} not ready within 60 s (logs in its temp dir): {other:?}",
                    s.url
                ),
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
}

/// Install (server-side apply) the UpdateChannel CRD and wait until it is established.
async fn install_crd(client: &Client) {
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
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("the UpdateChannel CRD was not established within 30 s");
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs an API server: KUBEBUILDER_ASSETS or KUBECONFIG"]
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
#[ignore = "needs an API server: KUBEBUILDER_ASSETS or KUBECONFIG"]
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
#[ignore = "needs an API server: KUBEBUILDER_ASSETS or KUBECONFIG"]
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
#[ignore = "needs an API server: KUBEBUILDER_ASSETS or KUBECONFIG"]
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
    thin_ok.expect("a valid channel with thin-link settings is accepted");
    v010_ok.expect("a v0.1.0 channel is accepted");
}

/// Apply every document of a manifest file of deploy/ (server-side apply, as `kubectl apply
/// --server-side` would), resolving each kind through discovery.
async fn apply_manifest(client: &Client, file: &str) {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    use serde::Deserialize;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let obj = DynamicObject::deserialize(doc).unwrap();
        let Some(types) = obj.types.clone() else {
            continue;
        };
        let gvk = GroupVersionKind::try_from(&types).unwrap();
        let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .unwrap_or_else(|e| panic!("discover {gvk:?}: {e}"));
        let ar: ApiResource = ar;
        let api: Api<DynamicObject> = match (&obj.metadata.namespace, caps.scope) {
            (Some(ns), kube::discovery::Scope::Namespaced) => {
                Api::namespaced_with(client.clone(), ns, &ar)
            }
            _ => Api::all_with(client.clone(), &ar),
        };
        let name = obj.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &PatchParams::apply("k3os-ops-test").force(),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {file} {name}: {e}"));
    }
}

/// Every kind of request the agent makes, made with a token of deploy/rbac.yaml's
/// ServiceAccount (TokenRequest API): none may be forbidden. And the least privilege holds: the
/// same token cannot write a channel's spec.
#[tokio::test]
#[ignore = "needs an API server: KUBEBUILDER_ASSETS or KUBECONFIG"]
async fn cluster_agent_service_account_is_enough() {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
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

    // The agent's credentials.
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), NS);
    let tr = sas
        .create_token_request(
            "k3os-ops-agent",
            &PostParams::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    audiences: vec![],
                    expiration_seconds: Some(3600),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("TokenRequest for k3os-system/k3os-ops-agent");
    let token = tr.status.expect("token in the TokenRequest status").token;
    let mut cfg = admin_config().await;
    cfg.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let agent = Client::try_from(cfg).unwrap();

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
    let dynamic = agent::channels::dynamic_api(agent.clone(), NS);
    let invalid = match dynamic.get(&channel).await {
        Ok(obj) => match serde_json::to_value(&obj) {
            Ok(raw) => agent::invalid::write_invalid(
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
            agent::drain::set_unschedulable(&agent_nodes, &node, on)
                .await
                .map_err(|e| e.to_string()),
        );
    }
    // Leases: the node liveness Lease and the poller Lease.
    let leases: Api<Lease> = Api::namespaced(agent.clone(), NS);
    for _ in 0..2 {
        check(
            "lease",
            agent::kube_store::acquire_lease(
                &leases,
                &format!("k3os-ops-sa-test-{tag}"),
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
        agent::events::Publisher::new(agent.clone(), &node)
            .publish(
                &regarding,
                None,
                &agent::events::Note {
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
        agent::drain::evict(&agent, &pod_ns, "app", Some(0))
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
