//! A real Kubernetes API server for the cluster tests (`agent_cluster`, `cluster_fleet`,
//! `cluster_scope`): KUBECONFIG's cluster, or etcd + kube-apiserver started on 127.0.0.1 from
//! `$KUBEBUILDER_ASSETS` (controller-runtime's setup-envtest layout), else from where
//! `scripts/setup.sh` installs them ([`SETUP_ASSETS`]); RBAC on, as `system:masters`. With none
//! of them the tests fail saying what to run. Also: the CRD installed by server-side apply, and
//! deploy/ manifests applied the way `kubectl apply --server-side` would.
//!
//! The tests share one API server and deploy/'s fixed namespace, so each holds [`exclusive`]
//! for its whole run: they take turns while the rest of the test binary runs beside them.
use std::time::Duration;

use k3os_ops::agent::testing::crd::UpdateChannel;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, CustomResourceExt};

/// The cluster of these tests: KUBECONFIG's, or one started here from KUBEBUILDER_ASSETS.
pub async fn client() -> Client {
    Client::try_from(admin_config().await).expect("client of the test cluster")
}

/// How to reach the test cluster as its admin (the ServiceAccount test swaps the credentials).
pub async fn admin_config() -> kube::Config {
    libupgrade::http::install_crypto_provider();
    if std::env::var_os("KUBECONFIG").is_some() {
        return kube::Config::infer()
            .await
            .expect("connect with KUBECONFIG");
    }
    if let Some(assets) = bare_server_assets() {
        return envtest::config(&assets).await;
    }
    let installed = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(SETUP_ASSETS);
    panic!(
        "these tests need an API server, and {} has no kube-apiserver: run `bash \
         scripts/setup.sh` (it installs Kubernetes there with etcd), or set KUBEBUILDER_ASSETS to \
         a directory holding kube-apiserver and etcd (controller-runtime's setup-envtest layout; \
         the tests start them on 127.0.0.1 with RBAC on), or KUBECONFIG to a disposable cluster \
         with cluster-admin",
        installed.display()
    );
}

/// Where `scripts/setup.sh` installs the Kubernetes test binaries and links etcd, relative to
/// this crate (envtest's layout).
pub const SETUP_ASSETS: &str = "../.cache/kube/v1.36.2/linux-amd64";

/// The binaries of a bare API server this process starts itself: `$KUBEBUILDER_ASSETS`, else
/// [`SETUP_ASSETS`] when setup.sh installed them; `None` when neither is there.
pub fn bare_server_assets() -> Option<std::path::PathBuf> {
    if let Some(assets) = std::env::var_os("KUBEBUILDER_ASSETS") {
        return Some(assets.into());
    }
    let installed = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(SETUP_ASSETS);
    installed
        .join("kube-apiserver")
        .is_file()
        .then_some(installed)
}

/// Held by every cluster test for its whole run (see the module docs). A test that fails
/// releases it as it unwinds: tokio's mutex is not poisoned.
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}

/// A throw-away etcd + kube-apiserver on 127.0.0.1 from `$KUBEBUILDER_ASSETS` (the
/// workspace's launcher, crate `kube-testenv`, with its defaults), started once per test
/// process from a thread that lives as long as it (the servers die with that thread). RBAC is
/// on; the tests authenticate with a static token of group `system:masters`.
mod envtest {
    use std::path::Path;
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    use kube::Client;
    use kube_testenv::{Options, TestEnv};

    /// What the tests need of the started env (the env itself stays in its thread).
    struct Server {
        url: String,
        token_file: String,
    }

    static SERVER: OnceLock<Server> = OnceLock::new();

    /// How to reach the (started once) local API server, as `system:masters`, once `/readyz`
    /// answers.
    pub async fn config(assets: &Path) -> kube::Config {
        let assets = assets.to_path_buf();
        let s = SERVER.get_or_init(move || {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let env = TestEnv::start(&assets, &Options::default());
                let _ = tx.send(Server {
                    url: env.url.clone(),
                    token_file: env.token_file.display().to_string(),
                });
                let _keep = env;
                loop {
                    std::thread::park();
                }
            });
            rx.recv().expect("the envtest thread panicked (see above)")
        });
        let mut config = kube::Config::new(s.url.parse().unwrap());
        config.accept_invalid_certs = true;
        config.auth_info.token_file = Some(s.token_file.clone());
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
pub async fn install_crd(client: &Client) {
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

/// Apply every document of a manifest file of deploy/ (server-side apply, as `kubectl apply
/// --server-side` would), resolving each kind through discovery.
pub async fn apply_manifest(client: &Client, file: &str) {
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

/// A one-hour token of deploy/rbac.yaml's ServiceAccount `k3os-system/k3os-ops-agent`
/// (TokenRequest API): what the agent's pod would be given.
pub async fn agent_token(admin: &Client) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "k3os-system");
    let tr = sas
        .create_token_request(
            "k3os-ops-agent",
            &kube::api::PostParams::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    expiration_seconds: Some(3600),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("TokenRequest for k3os-system/k3os-ops-agent");
    tr.status.expect("token in the TokenRequest status").token
}

/// The agent's ServiceAccount token as the kubelet projects it into the agent pod on `node`:
/// a TokenRequest bound to a Pod of deploy/rbac.yaml's ServiceAccount scheduled on `node`
/// (created here, `k3os-system/k3os-ops-agent-<node>`, owned by the DaemonSet; no kubelet
/// runs it). The API server
/// then names `node` in the token's user info (`authentication.kubernetes.io/node-name`,
/// Kubernetes >= 1.30), which deploy/node-scope.yaml's policies judge.
pub async fn agent_pod_token(admin: &Client, node: &str) -> String {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
    let ns = "k3os-system";
    // The ServiceAccount admission plugin wants the namespace's `default` ServiceAccount,
    // which only a controller manager creates.
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    let default: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}})).unwrap();
    match sas
        .create(&kube::api::PostParams::default(), &default)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create ServiceAccount {ns}/default: {e}"),
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let name = format!("k3os-ops-agent-{node}");
    // Owned by the agent's DaemonSet, as the real pod is (drains leave DaemonSet pods; no
    // garbage collector runs on a bare API server to miss the owner).
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "k3os-ops-agent",
            "uid": "00000000-0000-0000-0000-00000000a9e7", "controller": true,
        }]},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "k3os-ops-agent",
            "automountServiceAccountToken": false,
            "containers": [{"name": "agent", "image": "k3os-ops"}],
        }
    }))
    .unwrap();
    let pod = match pods.create(&kube::api::PostParams::default(), &pod).await {
        Ok(p) => p,
        Err(kube::Error::Api(e)) if e.code == 409 => pods.get(&name).await.unwrap(),
        Err(e) => panic!("create Pod {ns}/{name} on node {node}: {e}"),
    };
    let tr = sas
        .create_token_request(
            "k3os-ops-agent",
            &kube::api::PostParams::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    expiration_seconds: Some(3600),
                    bound_object_ref: Some(BoundObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        name: Some(name.clone()),
                        uid: pod.metadata.uid.clone(),
                    }),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for k3os-ops-agent bound to Pod {name}: {e}"));
    tr.status.expect("token in the TokenRequest status").token
}

/// A client of the API server with `token` instead of the admin's credentials.
pub async fn client_with_token(token: &str) -> Client {
    let mut cfg = admin_config().await;
    cfg.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..Default::default()
    };
    Client::try_from(cfg).unwrap()
}

/// Apply deploy/node-scope.yaml (the agent's node-scoped admission policies) and wait until
/// the API server enforces them: the agent of Node `scope-probe-a` (a pod-bound token) is
/// refused by the policy when it annotates Node `scope-probe-b` (both created here, for this
/// probe only).
pub async fn apply_node_scope(admin: &Client) {
    use k8s_openapi::api::core::v1::Node;
    apply_manifest(admin, "node-scope.yaml").await;
    let nodes: Api<Node> = Api::all(admin.clone());
    for n in ["scope-probe-a", "scope-probe-b"] {
        let node: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": n}})).unwrap();
        match nodes.create(&kube::api::PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("create Node {n}: {e}"),
        }
    }
    let token = agent_pod_token(admin, "scope-probe-a").await;
    let probe: Api<Node> = Api::all(client_with_token(&token).await);
    let patch =
        serde_json::json!({"metadata": {"annotations": {"k3os.io/update-message": "probe"}}});
    for _ in 0..120 {
        match probe
            .patch(
                "scope-probe-b",
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Err(kube::Error::Api(e)) if e.message.contains("k3os-ops agent") => return,
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    panic!("deploy/node-scope.yaml was not enforced within 30 s (probe on Node scope-probe-b)");
}
