//! The control plane starts from real binaries (`KUBEBUILDER_ASSETS`, else the path
//! scripts/setup.sh installs them to) with every option on, a node's client certificate
//! authenticates as that node, and the audit log names what it was refused.
//! `#[ignore]`d: it needs the Kubernetes binaries.

use std::path::PathBuf;
use std::time::Duration;

use kube_testenv::{Options, TestEnv};

fn assets() -> PathBuf {
    std::env::var_os("KUBEBUILDER_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/kube/v1.36.2/linux-amd64")
        })
}

#[test]
#[ignore = "needs the Kubernetes binaries (KUBEBUILDER_ASSETS or .cache/kube)"]
fn a_tls_control_plane_with_controllers_accepts_a_node_certificate() {
    let assets = assets();
    let kubectl = assets.join("kubectl");
    let mut env = TestEnv::start(
        &assets,
        &Options {
            tls_ips: vec!["127.0.0.1".into()],
            node_authorizer: true,
            controllers: true,
            audit: true,
        },
    );
    env.wait_ready(&kubectl, Duration::from_secs(120)).unwrap();
    let ca = env.ca.clone().unwrap();
    let node = ca.client("n1", "system:node:n1", &["system:nodes"]);
    let as_node = |args: &[&str]| {
        std::process::Command::new(&kubectl)
            .arg(format!("--server={}", env.url))
            .arg(format!(
                "--certificate-authority={}",
                ca.pair.cert.display()
            ))
            .arg(format!("--client-certificate={}", node.cert.display()))
            .arg(format!("--client-key={}", node.key.display()))
            .args(args)
            .output()
            .unwrap()
    };
    let out = as_node(&[
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "system:node:n1",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The controller manager runs: it gives the default namespace its ServiceAccount.
    let mut found = false;
    for _ in 0..120 {
        if env
            .kubectl(
                &kubectl,
                &["get", "serviceaccount", "default", "-o", "name"],
            )
            .is_ok()
        {
            found = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        found,
        "no default ServiceAccount: {}",
        env.log_tail("kube-controller-manager", 10)
    );
    // A node may not list Secrets: the audit log records the 403 with the user.
    assert!(!as_node(&["get", "secrets", "-A"]).status.success());
    let mut refused = false;
    for _ in 0..20 {
        let log = std::fs::read_to_string(env.audit_log()).unwrap_or_default();
        refused = log.lines().any(|l| {
            let e: serde_json::Value = serde_json::from_str(l).unwrap();
            e["user"]["username"] == "system:node:n1"
                && e["objectRef"]["resource"] == "secrets"
                && e["responseStatus"]["code"] == 403
        });
        if refused {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        refused,
        "no 403 for system:node:n1 in {}",
        env.audit_log().display()
    );
    assert_eq!(env.exited(), None);
}

/// The API server stopped (an outage) and started again: the same address answers, what was
/// stored is still there (etcd kept running), and a stopped API server is no crash.
#[test]
#[ignore = "needs the Kubernetes binaries (KUBEBUILDER_ASSETS or .cache/kube)"]
fn an_api_server_stopped_and_started_again_keeps_its_address_and_data() {
    let assets = assets();
    let kubectl = assets.join("kubectl");
    let mut env = TestEnv::start(&assets, &Options::default());
    env.wait_ready(&kubectl, Duration::from_secs(120)).unwrap();
    env.kubectl(
        &kubectl,
        &["create", "configmap", "kept", "--from-literal=a=1"],
    )
    .unwrap();
    env.stop_apiserver();
    assert_eq!(env.exited(), None, "a stopped API server is not an exit");
    let down = env.kubectl(
        &kubectl,
        &["get", "configmap", "kept", "--request-timeout=5s"],
    );
    assert!(down.is_err(), "answered while stopped: {down:?}");
    env.start_apiserver();
    env.wait_ready(&kubectl, Duration::from_secs(120)).unwrap();
    let back = env
        .kubectl(
            &kubectl,
            &["get", "configmap", "kept", "-o", "jsonpath={.data.a}"],
        )
        .unwrap();
    assert_eq!(back, "1");
    assert!(env.dir().join("kube-apiserver.1.log").is_file());
}
