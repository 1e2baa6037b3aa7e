//! A throw-away Kubernetes control plane for tests, started from a `KUBEBUILDER_ASSETS`
//! directory (controller-runtime's setup-envtest layout: `etcd`, `kube-apiserver`, and for
//! [`Options::controllers`] `kube-controller-manager` and `kube-scheduler`): etcd and the API
//! server on 127.0.0.1 with RBAC on, an admin authenticated by a static token of group
//! `system:masters`, logs and data in a temp dir that goes with the [`TestEnv`].
//!
//! The one launcher of the workspace: k3os-ops' cluster tests use it with the defaults (the API
//! server's self-signed certificate); the `kube-node-joins` VM scenario with
//! [`Options::tls_ips`] (its own CA, a serving certificate for the address a guest dials,
//! client certificates for kubelets), the Node authorizer and the controllers.
//!
//! Run on the build machine against kube-apiserver v1.36 built from source and Debian's etcd
//! 3.4 (../shared/notes/environment.md); the flags are the documented ones of 1.3x.

mod pki;
mod process;

use std::path::{Path, PathBuf};

pub use pki::{Ca, CertPair};
pub use process::{free_port, spawn, KillOnDrop};

/// What to start beyond etcd and the API server, and how it serves.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// When not empty: make a CA ([`TestEnv::ca`]), serve with a certificate of it valid for
    /// these IP addresses and `localhost` (e.g. `10.0.2.2`, the host as a QEMU guest sees it,
    /// and `127.0.0.1`), and accept client certificates it issues. Empty: the API server's
    /// self-signed certificate, tokens only.
    pub tls_ips: Vec<String>,
    /// Authorize with `Node,RBAC` and admit with `NodeRestriction`, as a cluster with real
    /// kubelets does (RBAC alone grants a kubelet's `system:nodes` identity nothing).
    pub node_authorizer: bool,
    /// Also start kube-controller-manager and kube-scheduler (Deployments get pods, pods get
    /// nodes, namespaces get their `default` ServiceAccount).
    pub controllers: bool,
    /// Write an audit log ([`TestEnv::audit_log`]): every request at level `Metadata` (who,
    /// what, the answer's code), one JSON event a line, for tests that check what a client
    /// was refused.
    pub audit: bool,
}

/// The audit policy of [`Options::audit`]: every request's metadata, once it is answered.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\n\
    omitStages: [RequestReceived]\nrules:\n- level: Metadata\n";

/// A running control plane; everything is killed and deleted when it is dropped.
pub struct TestEnv {
    /// The API server (None while [`TestEnv::stop_apiserver`] has it stopped).
    api: Option<KillOnDrop>,
    /// Its binary and arguments, to start it again on the same port, data and audit log.
    api_cmd: (PathBuf, Vec<String>),
    /// How often it was started.
    api_starts: u32,
    /// etcd, then the controller manager and the scheduler when started.
    children: Vec<KillOnDrop>,
    dir: tempfile::TempDir,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// The API server's port.
    pub port: u16,
    /// The admin's bearer token (group `system:masters`) in a file.
    pub token_file: PathBuf,
    /// The CA of [`Options::tls_ips`].
    pub ca: Option<Ca>,
}

/// The admin's static token.
const ADMIN_TOKEN: &str = "k3os-ops-test-admin-token";

impl TestEnv {
    /// Start etcd and the API server (and with [`Options::controllers`] the controller manager
    /// and the scheduler) from `assets`. Does not wait for readiness: see
    /// [`TestEnv::wait_ready`] or the caller's client. Panics naming what is missing or failed.
    pub fn start(assets: &Path, opts: &Options) -> TestEnv {
        let need = |b: &str| {
            let p = assets.join(b);
            assert!(
                p.is_file(),
                "KUBEBUILDER_ASSETS={} has no {b} (scripts/setup.sh installs the Kubernetes \
                 binaries into .cache/kube/<version>/linux-amd64)",
                assets.display()
            );
            p
        };
        let dir = tempfile::Builder::new()
            .prefix("kube-testenv.")
            .tempdir()
            .expect("create the test env's temp dir");
        let d = dir.path().to_path_buf();
        let etcd_url = format!("http://127.0.0.1:{}", free_port());
        let etcd = spawn(
            &need("etcd"),
            &etcd_args(&d, &etcd_url),
            &d.join("etcd.log"),
        );
        let ca = (!opts.tls_ips.is_empty()).then(|| Ca::new(&d.join("pki"), "kube-testenv-ca"));
        let token_file = d.join("token");
        std::fs::write(&token_file, ADMIN_TOKEN).expect("write the admin token");
        std::fs::write(
            d.join("tokens.csv"),
            format!("{ADMIN_TOKEN},k3os-ops-test-admin,1,\"system:masters\"\n"),
        )
        .expect("write tokens.csv");
        let sa_key = d.join("sa.key");
        let st = std::process::Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&sa_key)
            .arg("2048")
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl (scripts/setup.sh installs it)");
        assert!(st.success(), "openssl genrsa failed");
        let port = free_port();
        let args = apiserver_args(&d, &etcd_url, port, ca.as_ref(), opts);
        let bin = need("kube-apiserver");
        let api = spawn(&bin, &args, &d.join("kube-apiserver.log"));
        let mut env = TestEnv {
            api: Some(api),
            api_cmd: (bin, args),
            api_starts: 1,
            children: vec![etcd],
            url: format!("https://127.0.0.1:{port}"),
            port,
            token_file,
            ca,
            dir,
        };
        std::fs::write(env.admin_kubeconfig(), env.kubeconfig_text())
            .expect("write the admin kubeconfig");
        if opts.controllers {
            env.start_controllers(&need("kube-controller-manager"), &need("kube-scheduler"));
        }
        env
    }

    /// The temp dir holding the logs (`<binary>.log`), the data and the PKI.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The API server's audit log (JSON lines) when started with [`Options::audit`].
    pub fn audit_log(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    /// A kubeconfig of the admin (bearer token; the CA, or no TLS check without one).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    fn kubeconfig_text(&self) -> String {
        let trust = match &self.ca {
            Some(ca) => format!("certificate-authority: {}", ca.pair.cert.display()),
            None => "insecure-skip-tls-verify: true".to_string(),
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: testenv\n  cluster:\n    \
             server: {}\n    {trust}\nusers:\n- name: admin\n  user:\n    tokenFile: {}\n\
             contexts:\n- name: testenv\n  context:\n    cluster: testenv\n    user: admin\n\
             current-context: testenv\n",
            self.url,
            self.token_file.display()
        )
    }

    fn start_controllers(&mut self, cm: &Path, sched: &Path) {
        let d = self.dir.path().to_path_buf();
        let kc = format!("--kubeconfig={}", self.admin_kubeconfig().display());
        let mut cm_args = vec![
            kc.clone(),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()),
            format!(
                "--service-account-private-key-file={}",
                d.join("sa.key").display()
            ),
            "--use-service-account-credentials=false".into(),
        ];
        if let Some(ca) = &self.ca {
            cm_args.push(format!("--root-ca-file={}", ca.pair.cert.display()));
        }
        let sched_args = vec![
            kc,
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()),
        ];
        let log = |n: &str| d.join(format!("{n}.log"));
        self.children
            .push(spawn(cm, &cm_args, &log("kube-controller-manager")));
        self.children
            .push(spawn(sched, &sched_args, &log("kube-scheduler")));
    }

    /// Run the assets' `kubectl` as the admin; its stdout, or its stderr as the error.
    pub fn kubectl(&self, kubectl: &Path, args: &[&str]) -> Result<String, String> {
        let out = std::process::Command::new(kubectl)
            .arg(format!(
                "--kubeconfig={}",
                self.admin_kubeconfig().display()
            ))
            .args(args)
            .output()
            .map_err(|e| format!("run {}: {e}", kubectl.display()))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// Wait until the API server's `/readyz` answers `ok` (asked with `kubectl get --raw`),
    /// at most `timeout`; the error names what it answered last, or the process that exited.
    pub fn wait_ready(
        &mut self,
        kubectl: &Path,
        timeout: std::time::Duration,
    ) -> Result<(), String> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(gone) = self.exited() {
                return Err(format!("{gone}: {}", self.log_tail("kube-apiserver", 5)));
            }
            let last = match self.kubectl(kubectl, &["get", "--raw", "/readyz"]) {
                Ok(t) if t.trim() == "ok" => return Ok(()),
                Ok(t) => t,
                Err(e) => e,
            };
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "kube-apiserver at {} not ready within {timeout:?}: {last}",
                    self.url
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }

    /// Which started process has exited, with its status (a crashed API server is named at
    /// once instead of timing out a test). An API server stopped by
    /// [`TestEnv::stop_apiserver`] is not counted.
    pub fn exited(&mut self) -> Option<String> {
        const NAMES: [&str; 3] = ["etcd", "kube-controller-manager", "kube-scheduler"];
        let api = self.api.as_mut().and_then(|a| a.exited());
        if let Some(st) = api {
            return Some(format!("kube-apiserver exited ({st})"));
        }
        self.children
            .iter_mut()
            .zip(NAMES)
            .find_map(|(c, n)| c.exited().map(|st| format!("{n} exited ({st})")))
    }

    /// Stop the API server (SIGKILL: an outage, not a shutdown); etcd and the controllers
    /// keep running. Nothing happens when it is stopped already.
    pub fn stop_apiserver(&mut self) {
        self.api = None;
    }

    /// Start the API server again after [`TestEnv::stop_apiserver`]: same port, certificates,
    /// etcd and audit log (appended to); its earlier log is kept as
    /// `kube-apiserver.<n>.log`. Does not wait for readiness ([`TestEnv::wait_ready`]).
    pub fn start_apiserver(&mut self) {
        if self.api.is_some() {
            return;
        }
        let d = self.dir.path();
        let log = d.join("kube-apiserver.log");
        let kept = d.join(format!("kube-apiserver.{}.log", self.api_starts));
        let _ = std::fs::rename(&log, kept);
        self.api_starts += 1;
        let (bin, args) = &self.api_cmd;
        self.api = Some(spawn(bin, args, &log));
    }

    /// The last `lines` lines of a process's log (`kube-apiserver`, `etcd`, …).
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(format!("{name}.log")))
            .unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

fn etcd_args(d: &Path, url: &str) -> Vec<String> {
    let peer = format!("http://127.0.0.1:{}", free_port());
    vec![
        format!("--data-dir={}", d.join("etcd").display()),
        format!("--listen-client-urls={url}"),
        format!("--advertise-client-urls={url}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=default={peer}"),
    ]
}

fn apiserver_args(
    d: &Path,
    etcd_url: &str,
    port: u16,
    ca: Option<&Ca>,
    opts: &Options,
) -> Vec<String> {
    let key = d.join("sa.key");
    let mut args = vec![
        format!("--etcd-servers={etcd_url}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", d.join("certs").display()),
        format!("--token-auth-file={}", d.join("tokens.csv").display()),
        "--authorization-mode=RBAC".into(),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-account-key-file={}", key.display()),
        format!("--service-account-signing-key-file={}", key.display()),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--allow-privileged=true".into(),
    ];
    if let Some(ca) = ca {
        let serving = ca.serving("apiserver", "kube-apiserver", &opts.tls_ips);
        args.push(format!("--tls-cert-file={}", serving.cert.display()));
        args.push(format!("--tls-private-key-file={}", serving.key.display()));
        args.push(format!("--client-ca-file={}", ca.pair.cert.display()));
    }
    if opts.node_authorizer {
        args[5] = "--authorization-mode=Node,RBAC".into();
        args.push("--enable-admission-plugins=NodeRestriction".into());
    }
    if opts.audit {
        let policy = d.join("audit-policy.yaml");
        std::fs::write(&policy, AUDIT_POLICY).expect("write the audit policy");
        args.push(format!("--audit-policy-file={}", policy.display()));
        args.push(format!(
            "--audit-log-path={}",
            d.join("audit.log").display()
        ));
    }
    args
}
