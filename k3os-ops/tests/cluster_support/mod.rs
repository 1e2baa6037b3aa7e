//! A real Kubernetes API server for the `#[ignore]`d cluster tests (`agent_cluster`,
//! `cluster_fleet`): KUBECONFIG's cluster, or etcd + kube-apiserver started on 127.0.0.1 from
//! `$KUBEBUILDER_ASSETS` (controller-runtime's setup-envtest layout), RBAC on, as
//! `system:masters`; with neither variable the tests fail saying what to set. Also: the CRD
//! installed by server-side apply, and deploy/ manifests applied the way `kubectl apply
//! --server-side` would.
#![allow(dead_code)]

use std::time::Duration;

use k3os_ops::agent::channel::crd::UpdateChannel;
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
/// Run on the build machine against kube-apiserver v1.36 built from source and etcd 3.4
/// (../shared/notes/environment.md says how); the flags are the documented ones of 1.3x.
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
